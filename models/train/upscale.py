"""Train the embedded ×2 upscaler: a Real-ESRGAN "Compact" network (SRVGGNetCompact, as spandrel
loads it) on the shapes world, drawn at 64 px (the input) and at 128 px (the target).

    python -m models.train.upscale [--steps N] [--threads N]     # writes models/upscalers/shapes-compact-x2.safetensors
    python -m models.eval --upscale --n 100                     # PSNR against Lanczos on held-out scenes

Why this network: Compact is the smallest architecture every upscaler host loads (spandrel,
chaiNNer, A1111, ComfyUI, Forge); it predicts a residual over a nearest-neighbour upscale, so a
few thousand steps on CPU learn sharp edges. The saved file is a plain state dict with the original
key names (`body.N.weight`), detected by spandrel like any Real-ESRGAN Compact download.

Inputs are degraded a little at random (a slight blur, noise) so the network also serves the
embedded model's own images, which are softer than the drawn ones (the VAE's decode). Every
batch comes from an RNG seeded by (seed, step): a rerun reproduces the file.
"""

from __future__ import annotations

import argparse
import logging
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image, ImageFilter

from .common import MODELS_DIR, SEED, lr_at, progress, to_tensor
from .world import draw, random_scene

log = logging.getLogger(__name__)

OUT = MODELS_DIR / "upscalers" / "shapes-compact-x2.safetensors"
SIZE = 64  # the input side (the embedded model's native size); the target is 2x
NUM_FEAT, NUM_CONV = 24, 8  # ~45k parameters, under 200 KB in fp32
DEFAULT_STEPS, BATCH, LR = 3000, 16, 1e-3
HELD_OUT_SEED = 10_000  # the evaluation's scenes come from another RNG stream than any batch


def scene_pair(rng: random.Random, degrade: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """One scene drawn at 64 px (input, maybe softened and noisy) and at 128 px (target).
    The centre may move further than the model's training scenes: an upscaler must not care where a shape is."""
    scene = random_scene(rng, outline=rng.random() < 0.3)
    scene = type(scene)(**{**scene.__dict__, "cx": rng.uniform(0.3, 0.7), "cy": rng.uniform(0.3, 0.7)})
    small, big = draw(scene, SIZE), draw(scene, 2 * SIZE)
    if degrade:
        if rng.random() < 0.5:
            small = small.filter(ImageFilter.GaussianBlur(rng.uniform(0.2, 0.8)))
        pixels = np.asarray(small).astype(np.float32)
        if rng.random() < 0.5:
            pixels = pixels + np.random.default_rng(rng.getrandbits(32)).normal(0, rng.uniform(1, 4), pixels.shape)
        small = Image.fromarray(pixels.clip(0, 255).astype(np.uint8))
    return np.asarray(small), np.asarray(big)


def batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    rng = random.Random(f"{SEED}-upscale-{step}")
    pairs = [scene_pair(rng) for _ in range(size)]
    return to_tensor(np.stack([p[0] for p in pairs])), to_tensor(np.stack([p[1] for p in pairs]))


def build() -> torch.nn.Module:
    from spandrel.architectures.Compact import Compact

    torch.manual_seed(SEED)
    return Compact(num_in_ch=3, num_out_ch=3, num_feat=NUM_FEAT, num_conv=NUM_CONV, upscale=2, act_type="prelu")


def train(steps: int, out: Path) -> None:
    from safetensors.torch import save_file

    model = build()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    bar = progress(steps, 0, "upscaler")
    start = time.perf_counter()
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps, LR)
        x, y = batch(step, BATCH)
        # The network works in [0, 1], as spandrel runs it. Mean squared error, not SR's usual L1: on
        # flat colours and anti-aliased edges L1 settled on the nearest-neighbour base (3000 steps:
        # 1.8 dB below Lanczos), while MSE, PSNR's own measure, passed Lanczos within 400 steps.
        loss = F.mse_loss(model((x + 1) / 2), (y + 1) / 2)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        bar.update(1)
        bar.set_postfix(loss=f"{loss.item():.4f}")
    bar.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(out), metadata={"trained": f"models.train.upscale --steps {steps}", "scale": "2"})
    log.info("wrote %s after %d steps in %.0f s", out, steps, time.perf_counter() - start)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    train(args.steps, args.out)


if __name__ == "__main__":
    main()
