"""Train the embedded ControlNet for tiny-shapes: a silhouette or canny edge map places the shape.

    python -m models.train.train control [--steps N]     # writes models/controlnets/shapes-silhouette/

The UNet and text encoder stay frozen; the ControlNet starts as a copy of the UNet's encoder
(`ControlNetModel.from_unet`, zero convolutions out), as in Zhang et al. 2023. Its conditioning
embedding has three blocks (16, 32, 96 channels), two downsamplings: tiny-shapes' VAE shrinks by 4,
not SD's 8. Scenes put the shape anywhere (off-centre, smaller than the base model's world), which
the base model alone never does, so the evaluation (`python -m models.eval control`) can tell a
placed shape from a lucky one. Each sample's map is, at random, the scene's silhouette (white on
black) or the canny edges of the scene itself, through the same `pipelines.control.maps.canny` the
app runs, so a user's picture gives the map the model learned.
"""

from __future__ import annotations

import logging
import random
from dataclasses import replace

import numpy as np
import torch

from pipelines.control.maps import canny

from . import configs
from .common import (
    MODEL_OUT,
    MODELS_DIR,
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
from .world import Scene, draw, random_scene

log = logging.getLogger(__name__)

CONTROL_OUT = MODELS_DIR / "controlnets" / "shapes-silhouette"
BATCH, LR, CFG_DROPOUT = 16, 5e-4, 0.1
SIZE_RANGE = (0.26, 0.46)  # smaller than the base world's, so there is room to move
MARGIN = 0.04


def offcentre_scene(rng: random.Random) -> Scene:
    """A base-world scene moved anywhere its shape still fits in the frame."""
    scene = random_scene(rng)
    size = rng.uniform(*SIZE_RANGE)
    low, high = size / 2 + MARGIN, 1 - size / 2 - MARGIN
    return replace(scene, size=size, cx=rng.uniform(low, high), cy=rng.uniform(low, high))


def silhouette(scene: Scene) -> np.ndarray:
    return np.asarray(draw(replace(scene, color="white", background="black", outline=False)))


def control_map(scene: Scene, rng: random.Random) -> np.ndarray:
    """Half silhouettes, half canny edges of the picture: the two maps a user sends."""
    if rng.random() < 0.5:
        return silhouette(scene)
    return np.asarray(canny(draw(scene)))


def make_batch(step: int) -> tuple[list[Scene], np.ndarray, np.ndarray]:
    rng = random.Random(f"{SEED}-control-{step}")
    scenes = [offcentre_scene(rng) for _ in range(BATCH)]
    images = np.stack([np.asarray(draw(s)) for s in scenes])
    maps = np.stack([control_map(s, rng) for s in scenes])
    return scenes, images, maps


def control_loss(controlnet, pipe, scheduler, latents, ids, cond, generator) -> torch.Tensor:
    """The base model's v-prediction loss with min-SNR-5 weighting, the ControlNet's residuals added."""
    noisy, t, target = noised(scheduler, latents, generator)
    with torch.no_grad():
        hidden = pipe.text_encoder(ids)[0]
    down, mid = controlnet(noisy, t, encoder_hidden_states=hidden, controlnet_cond=cond, return_dict=False)
    pred = pipe.unet(noisy, t, hidden, down_block_additional_residuals=down, mid_block_additional_residual=mid).sample
    return min_snr_loss(pred, target, scheduler, t)


def train_control(steps: int) -> None:
    from diffusers import ControlNetModel, StableDiffusionPipeline

    out = RUNS / "control"
    pipe = StableDiffusionPipeline.from_pretrained(MODEL_OUT)
    for module in (pipe.unet, pipe.text_encoder, pipe.vae):
        module.requires_grad_(False)
    controlnet = ControlNetModel.from_unet(pipe.unet, conditioning_embedding_out_channels=(16, 32, 96))
    opt = torch.optim.AdamW(controlnet.parameters(), lr=LR, weight_decay=0.0)
    empty = tokenize(pipe.tokenizer, [""])[0]
    scheduler = configs.make_train_scheduler()
    start = 0
    if ckpt := load_checkpoint(out / "ckpt.pt"):
        controlnet.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        start = ckpt["step"]
        log.info("control: resuming at step %d", start)
    controlnet.train()
    bar = progress(steps, start, "control")
    for step in range(start, steps):
        gen = torch.Generator().manual_seed(SEED * 300_000 + step)
        scenes, images, maps = make_batch(step)
        with torch.no_grad():
            latents = pipe.vae.encode(to_tensor(images)).latent_dist.sample(gen) * pipe.vae.config.scaling_factor
        ids = tokenize(pipe.tokenizer, [s.prompt for s in scenes])
        ids[torch.rand(len(ids), generator=gen) < CFG_DROPOUT] = empty
        cond = torch.from_numpy(maps).permute(0, 3, 1, 2).float() / 255.0  # diffusers feeds maps in [0, 1]
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, LR, warmup=50)
        loss = control_loss(controlnet, pipe, scheduler, latents, ids, cond, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(controlnet.parameters(), 1.0)
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if (step + 1) % 50 == 0 or step + 1 == steps:
            save_checkpoint(out / "ckpt.pt", model=controlnet.state_dict(), opt=opt.state_dict(), step=step + 1)
    bar.close()
    controlnet.eval().save_pretrained(CONTROL_OUT, safe_serialization=True)
    log.info("control: wrote %s", CONTROL_OUT)
