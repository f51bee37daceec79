"""Step caching: denoising-loop time, attention work and PSNR of each cache vs none, in one run.

    python -m benchmarks.cache_bench [--model PATH] [--steps 28] [--size 256] [--repeats 3] [--json PATH]

Without --model it builds the tiny Flux of tests/families.py (random weights). Every variant runs
the same request through ImagePipeline; the caches are alternated with the uncached run (order
reversed every round) and timed by the result's own `timings["denoise"]` (the denoising loop
only: text encoding and VAE decoding excluded). It also counts the attention computations that
really ran (calls of each attention's `to_q`) and checks that the uncached image after the cached
runs is bit-identical to the one before (`disable_cache` leaves nothing behind).

On random tiny weights the PSNR is a check of the mechanism (the cache changes the image a little,
not into noise), not a statement about quality on a real checkpoint.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline
from pipelines.run.traits import denoiser

from . import parity

# name -> (method, threshold): each method at diffusers' default threshold, and FirstBlockCache and
# MagCache also at a looser one (random tiny weights change more from step to step than a trained model).
VARIANTS = {
    "none": ("none", None),
    "FirstBlockCache 0.05": ("FirstBlockCache", 0.05),
    "FirstBlockCache 0.2": ("FirstBlockCache", 0.2),
    "TaylorSeer": ("TaylorSeer", None),
    "MagCache 0.06": ("MagCache", 0.06),
    "MagCache 0.3": ("MagCache", 0.3),
}


psnr = functools.partial(parity.psnr, peak=255.0)  # of two 8-bit images, in dB (inf when identical)


class AttentionCounter:
    """Attention computations that really run: calls of every `to_q` projection in the denoiser (a
    skipped block, or an attention TaylorSeer predicts, never reaches it)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.calls = 0
        self.handles = [m.register_forward_hook(self._count) for n, m in module.named_modules() if n.endswith("to_q")]

    def _count(self, *_: Any) -> None:
        self.calls += 1

    def take(self) -> int:
        calls, self.calls = self.calls, 0
        return calls


def load(model: str | None, device: str | None) -> ImagePipeline:
    if model is None:
        from tests import families

        model = str(families.build("flux", Path(tempfile.gettempdir()) / "diffusion-anywhere-bench" / "flux"))
    return ImagePipeline.from_pretrained(model, DeviceManager(device), memory_mode="off")


def run_variants(pipe: ImagePipeline, base: GenerationRequest, repeats: int) -> dict[str, Any]:
    """Each variant `repeats` times, alternated; MagCache's calibration run comes first, untimed."""
    counter = AttentionCounter(denoiser(pipe.diffusers_pipeline))
    requests = {n: GenerationRequest(**{**base.__dict__, "step_cache": m, "step_cache_threshold": t})
                for n, (m, t) in VARIANTS.items()}  # fmt: skip
    calibration = pipe.generate(requests["MagCache 0.06"])
    counter.take()
    times: dict[str, list[float]] = {n: [] for n in VARIANTS}
    images: dict[str, Any] = {}
    attention: dict[str, int] = {}
    labels: dict[str, str] = {}
    for round_ in range(repeats):
        for name in VARIANTS if round_ % 2 == 0 else reversed(VARIANTS):
            result = pipe.generate(requests[name])
            times[name].append(result.timings["denoise"])
            attention[name] = counter.take()
            images.setdefault(name, result.images[0])
            labels[name] = result.step_cache
    after = pipe.generate(requests["none"]).images[0]
    return {"times": times, "images": images, "attention": attention, "labels": labels, "after": after,
            "calibration": calibration.step_cache}  # fmt: skip


def report(runs: dict[str, Any], args: argparse.Namespace, pipe: ImagePipeline) -> dict[str, Any]:
    none = statistics.median(runs["times"]["none"])
    out: dict[str, Any] = {
        "model": pipe.model_name, "pipeline": pipe.traits.class_name, "device": str(pipe.dm.device),
        "threads": torch.get_num_threads(), "steps": args.steps, "size": args.size, "repeats": args.repeats,
        "magcache_first_run": runs["calibration"],
        "uncached_bit_identical_after": bool(np.array_equal(np.asarray(runs["images"]["none"]),
                                                            np.asarray(runs["after"]))),
        "variants": {},
    }  # fmt: skip
    for name, samples in runs["times"].items():
        median = statistics.median(samples)
        out["variants"][name] = {
            "label": runs["labels"][name] or "none",
            "denoise_s_median": round(median, 4),
            "denoise_s": [round(s, 4) for s in samples],
            "speedup": round(none / median, 3) if median else None,
            "attention_calls": runs["attention"][name],
            "psnr_db_vs_none": round(psnr(runs["images"]["none"], runs["images"][name]), 2),
        }
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a model with a step cache (default: tiny Flux, built)")
    parser.add_argument("--device", default=None, help="as PREFERRED_DEVICE (default: auto)")
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--size", type=int, default=256, help="width and height")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on a shared machine)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    pipe = load(args.model, args.device)
    base = GenerationRequest(prompt="a red circle on a blue background", steps=args.steps, seed=1,
                             width=args.size, height=args.size)  # fmt: skip
    out = report(run_variants(pipe, base, args.repeats), args, pipe)
    print(
        f"{out['pipeline']} on {out['device']}, {args.steps} steps, {args.size}x{args.size}, {args.threads} thread(s)"
    )
    print(f"{'cache':<24} {'denoise s':>10} {'speed-up':>9} {'attention':>10} {'PSNR dB':>8}")
    for v in out["variants"].values():
        print(f"{v['label']:<24} {v['denoise_s_median']:>10.3f} {v['speedup']:>8.2f}x "
              f"{v['attention_calls']:>10} {v['psnr_db_vs_none']:>8}")  # fmt: skip
    print(f"uncached after the cached runs bit-identical: {out['uncached_bit_identical_after']}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
