"""Fine-tune tiny-shapes at every size it offers: bucketed training (NovelAI's aspect-ratio buckets,
as SD 1.x/2.x fine-tunes do), 64 to 128 px a side, 1:2 to 2:1.

    python -m models.train.train sizes [--steps N]     # then: python -m models.train.train sizes-export

Trained from scratch at 64 x 64 only, the UNet (three levels: a 16-cell latent down to 4) sees the
whole picture at its deepest level; on a 32-cell latent (128 px) that level sees a quarter, and the
model drew a shape in each quarter or blobs (adherence 0.56 at 128², 0.48 at 96², 0.54 at 128x64).
Each step here draws one bucket (width, height), renders a batch of scenes at that size (one
shape, its extent a fraction of the shorter side: `world.draw`) and encodes it the way the app
decodes such a picture (the VAE in 64-px tiles above 64², `vocabulary.tiled_vae_pixels`), so the
UNet learns that a bigger latent is the same scene, not more of them.

Why buckets and not SDXL's size conditioning: conditioning needs new embedding inputs, which changes
the UNet's config and the keys every adapter of this base was trained on (the outline LoRA, the
ControlNet copy of the encoder, the IP-Adapter's attention, the LCM-LoRA); buckets keep the
architecture, so the adapters load as before and only their evaluations are re-run. The text
encoder stays frozen for the same reason. A quarter of the batches stay at 64² (and the rate is
low, with EMA), so the size it was best at stays as good.
"""

from __future__ import annotations

import json
import logging
import random

import torch

from .common import (
    EMA,
    MODEL_OUT,
    RUNS,
    SEED,
    load_checkpoint,
    lr_at,
    min_snr_loss,
    noised,
    progress,
    save_checkpoint,
    to_tensor,
    tokenize,
)
from .vocabulary import write_vocabulary
from .world import IMAGE_SIZE, random_scene, render_batch

log = logging.getLogger(__name__)

# (width, height): squares 64, 96, 128 and 2:1, 3:2, 4:3 both ways; every side a multiple of 16 px (the
# UNet halves the 4x smaller latent twice, so each of its levels stays whole)
BUCKETS: tuple[tuple[int, int], ...] = (
    (64, 64), (96, 96), (128, 128), (128, 64), (64, 128), (96, 64), (64, 96), (128, 96), (96, 128),
)  # fmt: skip
SQUARE_SHARE = 0.25  # of the batches at 64 x 64: the size the model was trained at keeps its quality
CELLS = 12_288  # latent cells per batch (48 pictures at 64², 12 at 128²): one step costs about the same at every size
LR, WARMUP = 2e-4, 100
CFG_DROPOUT = 0.1


def bucket_at(rng: random.Random) -> tuple[int, int]:
    """The step's (width, height): 64² a SQUARE_SHARE of the time, else any other bucket alike."""
    return BUCKETS[0] if rng.random() < SQUARE_SHARE else rng.choice(BUCKETS[1:])


def batch_size(size: tuple[int, int], factor: int = 4) -> int:
    return max(4, round(CELLS / ((size[0] // factor) * (size[1] // factor))))


def _load():
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(MODEL_OUT)
    pipe.vae.eval().requires_grad_(False)
    pipe.text_encoder.eval().requires_grad_(False)
    return pipe


@torch.no_grad()
def encode(vae, images: torch.Tensor) -> torch.Tensor:
    """Latents as the app's VAE makes them: whole at 64², in 64-px tiles above (the decoder's way too)."""
    if images.shape[-1] * images.shape[-2] > IMAGE_SIZE * IMAGE_SIZE:
        vae.enable_tiling()
    try:
        dist = vae.encode(images).latent_dist
    finally:
        vae.disable_tiling()
    return dist.mean, dist.std


def _batch(pipe, step: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's (scaled latents, prompt embeddings): scenes drawn from an RNG seeded by the step."""
    rng = random.Random(f"{SEED}-sizes-{step}")
    size = bucket_at(rng)
    scenes = [random_scene(rng) for _ in range(batch_size(size))]
    mean, std = encode(pipe.vae, to_tensor(render_batch(scenes, size)))
    latents = (mean + std * torch.randn(mean.shape, generator=gen)) * pipe.vae.config.scaling_factor
    prompts = [s.prompt if rng.random() >= CFG_DROPOUT else "" for s in scenes]
    with torch.no_grad():
        context = pipe.text_encoder(tokenize(pipe.tokenizer, prompts))[0]
    return latents, context


def train_sizes(steps: int) -> None:
    from .configs import make_train_scheduler

    out = RUNS / "sizes"
    pipe = _load()
    unet = pipe.unet
    params = list(unet.parameters())
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.01)
    ema = EMA(params)
    scheduler = make_train_scheduler()
    start = 0
    if ckpt := load_checkpoint(out / "ckpt.pt"):
        unet.load_state_dict(ckpt["unet"])
        opt.load_state_dict(ckpt["opt"])
        ema.shadow, start = ckpt["ema"], ckpt["step"]
        log.info("sizes: resuming at step %d", start)
    unet.train()
    bar = progress(steps, start, "sizes")
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(SEED * 300_000 + step)
        latents, context = _batch(pipe, step, gen)
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, LR, warmup=WARMUP)
        noisy, t, target = noised(scheduler, latents, gen)
        loss = min_snr_loss(unet(noisy, t, context).sample, target, scheduler, t)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        ema.update(params, step)
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}", size="x".join(map(str, latents.shape[-1:-3:-1])))
        if (step + 1) % 100 == 0 or step + 1 == steps:
            save_checkpoint(out / "ckpt.pt", unet=unet.state_dict(), opt=opt.state_dict(), ema=ema.shadow, step=step + 1)
    bar.close()


def export_sizes() -> None:
    """The fine-tune's EMA UNet into models/tiny-shapes/unet; the vocabulary (the model's card the app
    reads) lists the sizes it was trained at."""
    ckpt = load_checkpoint(RUNS / "sizes" / "ckpt.pt")
    if ckpt is None:
        raise SystemExit("sizes-export: no checkpoint; run the sizes stage first")
    pipe = _load()
    pipe.unet.load_state_dict(ckpt["unet"])
    ema = EMA([])
    ema.shadow = ckpt["ema"]
    ema.copy_to(list(pipe.unet.parameters()))
    pipe.unet.save_pretrained(MODEL_OUT / "unet", safe_serialization=True)
    config = MODEL_OUT / "unet" / "config.json"  # as `export` writes it: no path of this machine
    config.write_text(json.dumps({k: v for k, v in json.loads(config.read_text()).items() if k != "_name_or_path"}, indent=2, sort_keys=True) + "\n")
    write_vocabulary(MODEL_OUT, BUCKETS)
    log.info("sizes-export: wrote %s (fine-tuned %d steps)", MODEL_OUT / "unet", ckpt["step"])
