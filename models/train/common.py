"""What both training scripts share (models/train/train.py for tiny-shapes and its LoRA,
models/train/edit.py for the editor): paths, the seed, checkpoints, the learning-rate schedule,
EMA, progress bars, image and prompt tensors.

Apart from train.py so that edit.py does not import the script that dispatches to it (no import
cycle, and no second copy of train.py when it runs as `python -m models.train.train`).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

MODELS_DIR = Path(__file__).resolve().parents[1]
RUNS = MODELS_DIR / "train" / "runs"
MODEL_OUT = MODELS_DIR / "tiny-shapes"  # the embedded model (train.py exports it; control.py trains on it)
SEED = 1234


def to_tensor(images: np.ndarray) -> torch.Tensor:
    """uint8 (N,H,W,3) -> float (N,3,H,W) in [-1, 1]."""
    return torch.from_numpy(images).permute(0, 3, 1, 2).float().div(127.5).sub(1.0)


def lr_at(step: int, total: int, base: float, warmup: int = 100, floor: float = 0.05) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    progress = (step - warmup) / max(1, total - warmup)
    return base * (floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def save_checkpoint(path: Path, **state) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)  # atomic: an interrupted save never leaves a broken checkpoint


def load_checkpoint(path: Path) -> dict | None:
    # Our own checkpoints only (optimizer state needs full unpickling).
    return torch.load(path, weights_only=False) if path.exists() else None


def resume_lora(path: Path, params: list[torch.nn.Parameter], opt: torch.optim.Optimizer, stage: str) -> int:
    """The step a LoRA stage resumes at: its checkpoint's LoRA tensors (`save_checkpoint(lora=...)`) copied into
    `params` and its optimizer state restored; 0 when there is no checkpoint yet."""
    ckpt = load_checkpoint(path)
    if ckpt is None:
        return 0
    copy_lora(params, ckpt["lora"])
    opt.load_state_dict(ckpt["opt"])
    logging.getLogger(__name__).info("%s: resuming at step %d", stage, ckpt["step"])
    return ckpt["step"]


def copy_lora(params: list[torch.nn.Parameter], saved: list[torch.Tensor]) -> None:
    """A checkpoint's LoRA tensors into the LoRA parameters, in order."""
    for p, tensor in zip(params, saved, strict=True):
        p.data.copy_(tensor)


class EMA:
    """Exponential moving average of parameters, with the usual warm-up of the decay."""

    def __init__(self, params: list[torch.nn.Parameter], decay: float = 0.999):
        self.decay = decay
        self.shadow = [p.detach().clone() for p in params]

    @torch.no_grad()
    def update(self, params: list[torch.nn.Parameter], step: int) -> None:
        d = min(self.decay, (1 + step) / (10 + step))
        for s, p in zip(self.shadow, params, strict=True):
            s.lerp_(p.detach(), 1 - d)

    @torch.no_grad()
    def copy_to(self, params: list[torch.nn.Parameter]) -> None:
        for s, p in zip(self.shadow, params, strict=True):
            p.copy_(s)


def progress(total: int, start: int, desc: str) -> tqdm:
    return tqdm(total=total, initial=start, desc=desc, unit="step", dynamic_ncols=True, smoothing=0.05)


def noised(scheduler, latents: torch.Tensor, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(noisy latents, timesteps, v-prediction target) of a training step; noise drawn before timesteps."""
    noise = torch.randn(latents.shape, generator=generator)
    t = torch.randint(0, scheduler.config.num_train_timesteps, (latents.shape[0],), generator=generator)
    return scheduler.add_noise(latents, noise, t), t, scheduler.get_velocity(latents, noise, t)


def min_snr_loss(pred: torch.Tensor, target: torch.Tensor, scheduler, t: torch.Tensor) -> torch.Tensor:
    """Mean squared error with min-SNR-5 weighting (Hang et al. 2023) for faster convergence."""
    alphas = scheduler.alphas_cumprod[t]
    snr = alphas / (1 - alphas)
    weight = snr.clamp(max=5.0) / (snr + 1)
    return ((pred - target).pow(2).mean(dim=(1, 2, 3)) * weight).mean()


# --------------------------------------------------------------------------- stage 1: VAE


def tokenize(tokenizer, prompts: list[str]) -> torch.Tensor:
    return tokenizer(
        prompts, padding="max_length", max_length=tokenizer.model_max_length, truncation=True, return_tensors="pt"
    ).input_ids


CLIP_PREFIX = "text_model."


def nest_clip_keys(folder: Path) -> list[Path]:
    """Rewrite each `CLIPTextModel` of the diffusers folder `folder` with its weights under `text_model.`,
    the layout of every SD checkpoint on the Hub; returns the files changed.

    transformers >= 5.6 flattened `CLIPTextModel` (huggingface/transformers#46285) and saves its keys
    without the prefix ("embeddings.*"). transformers 5 reads either layout, but older transformers,
    diffusers' single-file conversion and other tools that read diffusers folders find no weight they
    know and start from random ones without an error. `CLIPTextModelWithProjection` kept its prefix.
    """
    from safetensors.torch import load_file, save_file

    changed = []
    for config in sorted(folder.glob("text_encoder*/config.json")):
        if json.loads(config.read_text()).get("architectures") != ["CLIPTextModel"]:
            continue
        for weights in sorted(config.parent.glob("*.safetensors")):
            tensors = load_file(weights)
            if all(key.startswith(CLIP_PREFIX) for key in tensors):
                continue
            nested = {key if key.startswith(CLIP_PREFIX) else CLIP_PREFIX + key: t for key, t in tensors.items()}
            save_file(nested, weights, metadata={"format": "pt"})
            changed.append(weights)
    return changed
