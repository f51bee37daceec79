"""Train the embedded default model from scratch on procedurally drawn shapes.

    python -m models.train.train all          # vae -> unet -> export -> lora, resumes where it stopped
    python -m models.train.train vae|unet|export|lora [--steps N] [--threads N]
    python -m models.train.train edit [--steps N]   # the instruction editor (models/train/edit.py)
    python -m models.train.train edit-from-export [--source DIR]   # then `edit` runs only its last phase
    python -m models.train.train control [--steps N]   # the embedded ControlNet (models/train/control.py)
    python -m models.train.train ip-adapter [--steps N]   # the embedded IP-Adapter (models/train/ip_adapter.py)
    python -m models.train.train detector [--steps N]   # the detailer's embedded detector (models/train/detector.py)
    python -m models.train.train lcm [--steps N]   # the few-step LCM-LoRA of tiny-shapes (models/train/lcm.py)
    python -m models.train.train lcm-refine        # ... refined on the teacher's solved ODE ends (lcm_refine.py)
    python -m models.train.train video|video-export   # the first video model, Wan architecture (models/train/video.py)
    python -m models.train.train video-motion|video-motion-export   # the embedded video model (models/train/video_motion.py)
    python -m models.train.train sizes|sizes-export   # tiny-shapes at 64-128 px, 1:2-2:1 (models/train/sizes.py)

Each stage is seeded and checkpoints to `models/train/runs/<stage>/` (git-ignored) every few
hundred steps; running the same command again resumes from the last checkpoint and, because
every batch is drawn from an RNG seeded by (seed, step), continues exactly as if it had not
stopped. `export` writes the diffusers folder `models/tiny-shapes/`; `lora` writes
`models/loras/outline.safetensors`. Nothing is downloaded.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from . import configs
from .common import (  # shared with the editor's training (models/train/edit.py)
    EMA,
    MODEL_OUT,
    MODELS_DIR,
    RUNS,
    SEED,
    load_checkpoint,
    lr_at,
    min_snr_loss,
    nest_clip_keys,
    noised,
    progress,
    resume_lora,
    save_checkpoint,
    to_tensor,
    tokenize,
)
from .tokenizer import build_tokenizer
from .vocabulary import write_vocabulary
from .world import VAE_SQUARE_MAX_ROTATION, random_scene, render_batch

log = logging.getLogger(__name__)

LORA_OUT = MODELS_DIR / "loras"

DEFAULT_STEPS = {"vae": 2600, "unet": 4000, "lora": 600, "edit": 10400, "control": 800, "ip-adapter": 2500, "detector": 3000, "lcm": 3000, "lcm-refine": 2500, "video": 10000, "video-motion": 1600, "sizes": 2000}
BATCH = {"vae": 32, "unet": 64, "lora": 64}
LR = {"vae": 1e-3, "unet": 6e-4, "lora": 1e-3}
UNET_DATASET = 80_000
LORA_DATASET = 16_000
CFG_DROPOUT = 0.1


# --------------------------------------------------------------------------- helpers
def batch_rng(stage: str, step: int) -> random.Random:
    return random.Random(f"{SEED}-{stage}-{step}")


def train_vae(steps: int) -> None:
    out = RUNS / "vae"
    vae = configs.make_vae()
    opt = torch.optim.AdamW(vae.parameters(), lr=LR["vae"], weight_decay=0.0)
    start = 0
    if ckpt := load_checkpoint(out / "ckpt.pt"):
        vae.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start = ckpt["step"]
        log.info("vae: resuming at step %d", start)
    torch.manual_seed(SEED + start)
    bar = progress(steps, start, "vae")
    for step in range(start, steps):
        rng = batch_rng("vae", step)
        scenes = [
            random_scene(rng, outline=rng.random() < 0.25, square_max_rotation=VAE_SQUARE_MAX_ROTATION)
            for _ in range(BATCH["vae"])
        ]
        x = to_tensor(render_batch(scenes))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, LR["vae"], warmup=50)
        posterior = vae.encode(x).latent_dist
        recon = vae.decode(posterior.sample()).sample
        l1 = (recon - x).abs().mean()
        mse = F.mse_loss(recon, x)
        kl = posterior.kl().mean() / posterior.mean[0].numel()
        loss = l1 + mse + 1e-4 * kl
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(vae.parameters(), 1.0)
        opt.step()
        bar.update(1)
        bar.set_postfix(l1=f"{l1.item():.4f}", mse=f"{mse.item():.5f}")
        if (step + 1) % 100 == 0 or step + 1 == steps:
            save_checkpoint(out / "ckpt.pt", model=vae.state_dict(), opt=opt.state_dict(), step=step + 1)
    bar.close()
    vae.eval()
    with torch.no_grad():  # scaling factor = 1 / std of latents, as in Stable Diffusion
        rng = random.Random(f"{SEED}-vae-scale")
        x = to_tensor(render_batch([random_scene(rng) for _ in range(1024)]))
        std = vae.encode(x).latent_dist.mean.std().item()
        recon = vae.decode(vae.encode(x).latent_dist.mean).sample
        mse = F.mse_loss(recon, x).item()
    vae.register_to_config(scaling_factor=round(1.0 / std, 5))
    vae.save_pretrained(out / "final")
    log.info("vae: held-out reconstruction MSE %.5f, latent std %.4f", mse, std)


# --------------------------------------------------------------------------- latents
def encode_dataset(vae, n: int, tag: str, outline: bool) -> dict:
    """Draw `n` seeded scenes and encode them once; cached in runs/ for resumes."""
    cache = RUNS / f"latents-{tag}-{n}.pt"
    if cache.exists():
        return torch.load(cache)
    rng = random.Random(f"{SEED}-data-{tag}")
    scenes = [random_scene(rng, outline=outline) for _ in range(n)]
    means, stds = [], []
    with torch.no_grad():
        for i in tqdm(range(0, n, 256), desc=f"encode {tag}"):
            dist = vae.encode(to_tensor(render_batch(scenes[i : i + 256]))).latent_dist
            means.append(dist.mean.half())
            stds.append(dist.std.half())
    data = {"mean": torch.cat(means), "std": torch.cat(stds), "prompts": [s.prompt for s in scenes]}
    cache.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, cache)
    return data


def diffusion_loss(unet, text_encoder, scheduler, latents, ids, generator) -> torch.Tensor:
    """v-prediction loss with min-SNR-5 weighting (common.min_snr_loss)."""
    noisy, t, target = noised(scheduler, latents, generator)
    return min_snr_loss(unet(noisy, t, text_encoder(ids)[0]).sample, target, scheduler, t)


def load_vae():
    from diffusers import AutoencoderKL

    return AutoencoderKL.from_pretrained(RUNS / "vae" / "final").eval()


# --------------------------------------------------------------------------- stage 2: UNet + text encoder
def train_unet(steps: int) -> None:
    out = RUNS / "unet"
    vae = load_vae()
    data = encode_dataset(vae, UNET_DATASET, "filled", outline=False)
    scale = vae.config.scaling_factor
    tokenizer = build_tokenizer()
    ids_all = tokenize(tokenizer, data["prompts"])
    empty_ids = tokenize(tokenizer, [""])[0]
    unet = configs.make_unet()
    text_encoder = configs.make_text_encoder(
        len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    )
    params = [*unet.parameters(), *text_encoder.parameters()]
    opt = torch.optim.AdamW(params, lr=LR["unet"], weight_decay=0.01)
    ema = EMA(params)
    scheduler = configs.make_train_scheduler()
    start = 0
    if ckpt := load_checkpoint(out / "ckpt.pt"):
        unet.load_state_dict(ckpt["unet"])
        text_encoder.load_state_dict(ckpt["text_encoder"])
        opt.load_state_dict(ckpt["opt"])
        ema.shadow = ckpt["ema"]
        start = ckpt["step"]
        log.info("unet: resuming at step %d", start)
    unet.train()
    text_encoder.train()
    bar = progress(steps, start, "unet")
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(SEED * 100_000 + step)
        idx = torch.randint(0, UNET_DATASET, (BATCH["unet"],), generator=gen)
        mean, std = data["mean"][idx].float(), data["std"][idx].float()
        latents = (mean + std * torch.randn(mean.shape, generator=gen)) * scale
        ids = ids_all[idx].clone()
        ids[torch.rand(len(idx), generator=gen) < CFG_DROPOUT] = empty_ids
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, LR["unet"], warmup=200)
        loss = diffusion_loss(unet, text_encoder, scheduler, latents, ids, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema.update(params, step)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % 200 == 0 or step + 1 == steps:
            save_checkpoint(
                out / "ckpt.pt",
                unet=unet.state_dict(),
                text_encoder=text_encoder.state_dict(),
                opt=opt.state_dict(),
                ema=ema.shadow,
                step=step + 1,
            )
    bar.close()


# --------------------------------------------------------------------------- export
def export_model(steps: int | None = None) -> Path:
    """Write the EMA weights as a standard StableDiffusionPipeline folder."""
    from diffusers import StableDiffusionPipeline

    ckpt = load_checkpoint(RUNS / "unet" / "ckpt.pt")
    if ckpt is None:
        raise SystemExit("export: no UNet checkpoint; run the unet stage first")
    tokenizer = build_tokenizer()
    unet = configs.make_unet()
    text_encoder = configs.make_text_encoder(
        len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id
    )
    unet.load_state_dict(ckpt["unet"])
    text_encoder.load_state_dict(ckpt["text_encoder"])
    ema = EMA([])
    ema.shadow = ckpt["ema"]
    ema.copy_to([*unet.parameters(), *text_encoder.parameters()])
    pipe = StableDiffusionPipeline(
        vae=load_vae(),
        text_encoder=text_encoder.eval(),
        tokenizer=tokenizer,
        unet=unet.eval(),
        scheduler=configs.make_sample_scheduler(),
        safety_checker=None,
        feature_extractor=None,
        requires_safety_checker=False,
    )
    pipe.save_pretrained(MODEL_OUT, safe_serialization=True)
    nest_clip_keys(MODEL_OUT)
    write_vocabulary(MODEL_OUT)
    log.info("export: wrote %s (trained %d steps)", MODEL_OUT, ckpt["step"])
    return MODEL_OUT


# --------------------------------------------------------------------------- stage 3: LoRA
def train_lora(steps: int) -> None:
    from diffusers import StableDiffusionPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    out = RUNS / "lora"
    pipe = StableDiffusionPipeline.from_pretrained(MODEL_OUT)
    unet, text_encoder, vae = pipe.unet, pipe.text_encoder, pipe.vae
    data = encode_dataset(vae, LORA_DATASET, "outline", outline=True)
    ids_all = tokenize(pipe.tokenizer, data["prompts"])
    for module in (unet, text_encoder, vae):
        module.requires_grad_(False)
    torch.manual_seed(SEED)  # LoRA's random A-matrix init
    unet.add_adapter(
        LoraConfig(
            r=8,
            lora_alpha=8,
            init_lora_weights="gaussian",
            target_modules=["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "conv1", "conv2"],
        )
    )
    params = [p for p in unet.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR["lora"], weight_decay=0.0)
    scheduler = configs.make_train_scheduler()
    scale = vae.config.scaling_factor
    start = resume_lora(out / "ckpt.pt", params, opt, "lora")
    unet.train()
    bar = progress(steps, start, "lora")
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(SEED * 200_000 + step)
        idx = torch.randint(0, LORA_DATASET, (BATCH["lora"],), generator=gen)
        mean, std = data["mean"][idx].float(), data["std"][idx].float()
        latents = (mean + std * torch.randn(mean.shape, generator=gen)) * scale
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, LR["lora"], warmup=50)
        loss = diffusion_loss(unet, text_encoder, scheduler, latents, ids_all[idx], gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % 100 == 0 or step + 1 == steps:
            save_checkpoint(
                out / "ckpt.pt", lora=[p.detach().clone() for p in params], opt=opt.state_dict(), step=step + 1
            )
    bar.close()
    LORA_OUT.mkdir(parents=True, exist_ok=True)
    StableDiffusionPipeline.save_lora_weights(
        LORA_OUT, unet_lora_layers=get_peft_model_state_dict(unet), weight_name="outline.safetensors"
    )
    log.info("lora: wrote %s", LORA_OUT / "outline.safetensors")


def _train_edit(steps: int) -> None:
    from .edit import train_edit  # loaded on demand: it needs tiny-shapes trained first

    train_edit(steps)


def _train_control(steps: int) -> None:
    from .control import train_control  # needs tiny-shapes trained first

    train_control(steps)


def _train_ip_adapter(steps: int) -> None:
    from .ip_adapter import train_ip_adapter  # needs tiny-shapes trained first

    train_ip_adapter(steps)


def _train_detector(steps: int) -> None:
    from .detector import train_detector

    train_detector(steps)


def _train_lcm(steps: int) -> None:
    from .lcm import train_lcm  # needs tiny-shapes trained first

    train_lcm(steps)


def _train_lcm_refine(steps: int) -> None:
    from .lcm_refine import train_lcm_refine  # starts from the lcm stage's checkpoint

    train_lcm_refine(steps)


def _export_lcm(_steps: int | None = None) -> None:
    from .lcm import export_lcm

    export_lcm()


def _train_video(steps: int) -> None:
    from .video import train_video  # needs video-vae trained first

    train_video(steps)


def _export_video(_steps: int | None = None) -> None:
    from .video import export_video

    export_video()


def _train_video_motion(steps: int) -> None:
    from .video_motion import train_video_motion  # over the exported tiny-shapes

    train_video_motion(steps)


def _export_video_motion(_steps: int | None = None) -> None:
    from .video_motion import export_video_motion

    export_video_motion()


def _train_sizes(steps: int) -> None:
    from .sizes import train_sizes  # fine-tunes the exported tiny-shapes

    train_sizes(steps)


def _export_sizes(_steps: int | None = None) -> None:
    from .sizes import export_sizes

    export_sizes()


def _export_edit(_steps: int | None = None) -> None:
    from .edit import export_edit

    export_edit()


def _edit_from_export(source: Path | None = None) -> None:
    from .edit import EDIT_OUT, checkpoint_from_export

    checkpoint_from_export(source or EDIT_OUT)


STAGES = {
    "vae": train_vae, "unet": train_unet, "export": export_model, "lora": train_lora,
    "edit": _train_edit, "control": _train_control, "ip-adapter": _train_ip_adapter, "detector": _train_detector, "lcm": _train_lcm, "lcm-refine": _train_lcm_refine, "lcm-export": _export_lcm, "edit-export": _export_edit, "edit-from-export": _edit_from_export,
    "video": _train_video, "video-export": _export_video, "video-motion": _train_video_motion, "video-motion-export": _export_video_motion, "sizes": _train_sizes, "sizes-export": _export_sizes,
}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("stage", choices=[*STAGES, "all"])
    parser.add_argument("--steps", type=int, help=f"training steps of the stage (default: {DEFAULT_STEPS})")
    parser.add_argument(
        "--threads", type=int, default=2, help="torch CPU threads (default 2: twice as fast as 1 on an idle 2-core CPU)"
    )
    parser.add_argument(
        "--source",
        type=Path,
        help="edit-from-export: the editor folder the last phase starts from (default: the shipped one)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    torch.set_num_threads(args.threads)
    stages = ["vae", "unet", "export", "lora"] if args.stage == "all" else [args.stage]
    for stage in stages:
        t0 = time.time()
        if stage == "edit-from-export":
            STAGES[stage](args.source)
        elif stage in ("export", "edit-export", "lcm-export", "video-export", "video-motion-export", "sizes-export"):
            STAGES[stage]()
        else:
            STAGES[stage](args.steps or DEFAULT_STEPS[stage])
        log.info("%s: done in %.1f min", stage, (time.time() - t0) / 60)


if __name__ == "__main__":
    main()
