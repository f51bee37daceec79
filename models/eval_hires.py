"""Evaluation of hires fix and of the embedded upscaler (docs/upscaling.md has the figures).

    python -m models.eval --upscale --n 100      # the embedded x2 upscaler against Lanczos, PSNR on held-out scenes
    python -m models.eval --hires --n 64         # adherence at 128 px: direct, and hires fix by each upscaler

`--upscale`: scenes drawn at 64 px are enlarged x2 and compared with the same scenes drawn at
128 px (PSNR in dB over all pixels); the scenes come from an RNG stream the training never drew.
`--hires`: random (colour, shape, background) prompts, each at one seed: the embedded model at its
native 64 px, directly at 128 px, and 64 -> 128 by hires fix; each image judged by models.scoring's
classifier (colour, shape and background all right). Hires time is reported against the first
pass's: the expected ratio is 1 + steps2 x strength / steps1 x area ratio (a second pass runs
steps x strength steps on an image `area ratio` times larger).
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import numpy as np
from PIL import Image

from models.scoring import classify
from models.train.upscale import HELD_OUT_SEED, OUT, SIZE, scene_pair
from models.train.world import random_scene


def psnr(a: Image.Image, b: Image.Image) -> float:
    diff = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    mse = float((diff**2).mean())
    return 99.0 if mse == 0 else 10 * math.log10(255.0**2 / mse)


def run_upscale(args: Any) -> dict[str, Any]:
    """PSNR of the embedded upscaler, Lanczos and bicubic on `args.n` held-out scenes (clean inputs)."""
    from devices import DeviceManager
    from pipelines.imaging.upscalers import Upscalers

    upscalers = Upscalers([OUT.parent], DeviceManager("cpu"))
    rng = random.Random(f"{HELD_OUT_SEED}-eval")
    totals: dict[str, list[float]] = {OUT.stem: [], "Lanczos": [], "Bicubic": []}
    start = time.perf_counter()
    for _ in range(args.n):
        small, big = (Image.fromarray(p) for p in scene_pair(rng, degrade=False))
        size = (2 * SIZE, 2 * SIZE)
        totals[OUT.stem].append(psnr(upscalers.upscale(small, OUT.stem, size), big))
        totals["Lanczos"].append(psnr(small.resize(size, Image.Resampling.LANCZOS), big))
        totals["Bicubic"].append(psnr(small.resize(size, Image.Resampling.BICUBIC), big))
    report = {name: sum(v) / len(v) for name, v in totals.items()}
    report["gain_over_lanczos_db"] = report[OUT.stem] - report["Lanczos"]
    report["n"], report["seconds"] = args.n, time.perf_counter() - start
    print(f"x2 on {args.n} held-out scenes (64 -> 128 px), mean PSNR:")
    for name in totals:
        print(f"  {name:<22} {report[name]:6.2f} dB")
    print(f"  embedded - Lanczos     {report['gain_over_lanczos_db']:+6.2f} dB")
    return report


def _adherence(images: list[Image.Image], wanted: list[tuple[str, str, str]]) -> float:
    right = 0
    for image, want in zip(images, wanted, strict=True):
        c = classify(image)
        right += (c.color, c.shape, c.background) == want
    return right / len(wanted)


def run_hires(args: Any) -> dict[str, Any]:
    """Adherence at 128 px, directly and by hires fix (Lanczos, the embedded upscaler, Latent), and
    hires time against the first pass's."""
    from devices import DeviceManager
    from pipelines import GenerationRequest, ImagePipeline
    from pipelines.run.options import DEFAULT_MODEL
    from pipelines.schema.request import nest

    pipeline = ImagePipeline.from_pretrained(DEFAULT_MODEL, DeviceManager("cpu"))
    steps, strength = args.steps or 10, args.strength or 0.3
    rng = random.Random(args.seed)
    scenes = [random_scene(rng) for _ in range(args.n)]  # the world's own (colour, shape, background) draws
    wanted = [(s.color, s.shape, s.background) for s in scenes]
    prompts = [s.prompt for s in scenes]
    seed = args.seed + 1

    def run(**fields: Any) -> tuple[list[Image.Image], float]:
        images, start = [], time.perf_counter()
        for i in range(0, len(prompts), 8):  # 8 prompts per request, image k with seed + k
            flat = {"prompt": prompts[i : i + 8], "steps": steps, "seed": seed + i, **fields}
            images += pipeline.generate(GenerationRequest.parse(nest(flat))).images
        return images, time.perf_counter() - start

    native, native_seconds = run()
    direct, direct_seconds = run(width=128, height=128)
    report: dict[str, Any] = {"n": args.n, "steps": steps, "strength": strength,
                              "native_64": _adherence(native, wanted), "direct_128": _adherence(direct, wanted),
                              "seconds": {"native_64": native_seconds, "direct_128": direct_seconds}}  # fmt: skip
    expected = 1 + (steps * strength / steps) * 4  # a second pass of steps x strength at 4x the area
    for upscaler in args.upscalers.split(","):
        images, seconds = run(hires_fix=True, hires_upscaler=upscaler, hires_strength=strength)
        report[f"hires_{upscaler}"] = _adherence(images, wanted)
        report["seconds"][f"hires_{upscaler}"] = seconds
        report[f"time_ratio_{upscaler}"] = seconds / native_seconds / expected
    print(f"{args.n} prompts, {steps} steps, hires strength {strength}; adherence (colour, shape, background):")
    for key in [k for k in report if k.startswith(("native", "direct", "hires"))]:
        print(f"  {key:<28} {report[key]:.3f}   {report['seconds'][key]:6.1f} s")
    print(f"  hires time / (first pass x {expected:g}, the expected ratio):")
    for key in [k for k in report if k.startswith("time_ratio")]:
        print(f"    {key.removeprefix('time_ratio_'):<26} {report[key]:.2f}")
    return report
