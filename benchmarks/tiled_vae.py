"""`python -m benchmarks tiled-vae [--size 1024]`: the VAE decode's memory peak, tiled against whole.

Each variant runs in a fresh process (peak resident memory, `ru_maxrss`, only grows within a
process): load the embedded model's VAE, decode a small latent once (the allocator's and the
kernels' first costs), note the peak, then decode one `size` x `size` image and report what the
decode added to the peak, and its time. The ratio tiled / whole is the figure docs/upscaling.md
quotes; the goal is at most 0.5.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def decode_peak(size: int, tiled: bool, model: str) -> dict[str, float]:
    """In this process: the decode's addition to the peak resident memory (MiB) and its seconds."""
    from diffusers import AutoencoderKL

    vae = AutoencoderKL.from_pretrained(Path(model) / "vae").eval()
    factor = 2 ** (len(vae.config.block_out_channels) - 1)
    channels = vae.config.latent_channels
    with torch.inference_mode():
        vae.decode(torch.randn(1, channels, 16, 16))  # first-call costs outside the measurement
        if tiled:
            vae.enable_tiling()
        latent = torch.randn(1, channels, size // factor, size // factor, generator=torch.Generator().manual_seed(0))
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        image = vae.decode(latent).sample
        seconds = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert image.shape[-1] == size
    return {"peak_added_mib": (after - before) / 1024, "seconds": seconds}  # ru_maxrss is in KiB on Linux


def main(argv: list[str] | None = None) -> int:
    from pipelines.run.options import DEFAULT_MODEL

    parser = argparse.ArgumentParser(prog="python -m benchmarks tiled-vae", description=__doc__)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--json", default=None)
    parser.add_argument("--one", choices=("tiled", "whole"), help=argparse.SUPPRESS)  # a child process's variant
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(decode_peak(args.size, args.one == "tiled", args.model)))
        return 0
    report: dict[str, object] = {"size": args.size, "model": args.model}
    for variant in ("whole", "tiled"):
        command = [
            sys.executable,
            "-m",
            "benchmarks",
            "tiled-vae",
            "--size",
            str(args.size),
            "--model",
            args.model,
            "--one",
            variant,
        ]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=1800, check=True)
        report[variant] = json.loads(done.stdout.strip().splitlines()[-1])
    whole, tiled = report["whole"], report["tiled"]
    report["memory_ratio"] = tiled["peak_added_mib"] / whole["peak_added_mib"]
    report["time_ratio"] = tiled["seconds"] / whole["seconds"]
    print(f"VAE decode of one {args.size}x{args.size} image ({Path(args.model).name}):")
    for variant in ("whole", "tiled"):
        r = report[variant]
        print(f"  {variant:<6} peak +{r['peak_added_mib']:8.1f} MiB   {r['seconds']:6.2f} s")
    print(f"  tiled / whole: memory {report['memory_ratio']:.2f}, time {report['time_ratio']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0
