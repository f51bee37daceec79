"""`python -m benchmarks parity --parallel MODE:N`: a parallel group's images against one device's, and its cost.

    python -m benchmarks parity --parallel ulysses:2 --model /models/FLUX.1-dev --device cuda:0,cuda:1
    python -m benchmarks parity --parallel tensor:2 --model /tmp/flux --device cpu,cpu --width 64 --height 64

The group (serving/parallel.py, the app's own) and the reference (one replica on the group's first
device, same dtype, torch) make the same seeded requests through the app's request path; printed: each
image's largest 8-bit difference and PSNR, and the wall time per image of each (median of --repeats
runs after one warm-up), with the group's overhead (group / one device: below 1 is a speed-up). Exit
code 0 = every image within --tolerance (8-bit levels, default 1), 1 = not.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import time
from pathlib import Path

import numpy as np

from .parity import PROMPTS, psnr


def build_parser() -> argparse.ArgumentParser:
    from pipelines.run.options import DEFAULT_MODEL

    p = argparse.ArgumentParser(
        prog="python -m benchmarks parity --parallel", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--parallel", required=True, help="the group: ulysses:N, ring:N or tensor:N (as PARALLEL)")
    p.add_argument("--model", default=str(DEFAULT_MODEL), help="a model whose denoiser can (docs/parallel.md)")
    p.add_argument("--device", default=None, help="the devices, as PREFERRED_DEVICE (cuda:0,cuda:1; default: the setting)")
    p.add_argument("--images", type=int, default=2, help="requests of one image each, each its own prompt and seed")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--width", type=int, default=None, help="the image width (default: the model's)")
    p.add_argument("--height", type=int, default=None, help="the image height")
    p.add_argument("--frames", type=int, default=None, help="frames of a clip (a video model)")
    p.add_argument("--repeats", type=int, default=3, help="timed runs per image (median), after one warm-up")
    p.add_argument("--tolerance", type=int, default=1, help="largest 8-bit difference allowed")
    p.add_argument("--json", default=None)
    return p


def pixels(result) -> np.ndarray:
    frames = result.clips[0] if result.clips else result.images
    return np.stack([np.asarray(f.convert("RGB"), dtype=np.int16) for f in frames])


def timed(backend, request, repeats: int):
    """The result and the median wall time of `repeats` runs (after the first, which warms caches)."""
    result = backend.generate(request)
    walls = []
    for _ in range(repeats):
        start = time.perf_counter()
        backend.generate(request)
        walls.append(time.perf_counter() - start)
    return result, statistics.median(walls)


def run(args: argparse.Namespace) -> dict:
    from config import environment
    from devices.options import DeviceSettings
    from devices.parallel import parse_parallel
    from pipelines import GenerationRequest, PipelineOptions
    from serving.parallel import group_specs, parallel_pool
    from serving.pool import DevicePool

    plan = parse_parallel(args.parallel)
    settings = DeviceSettings.from_env(environment(os.environ)).replace(parallel=plan)
    options = PipelineOptions(runtime="torch", compile="off")
    spec = group_specs(args.model, options, settings, args.device)[0]  # the first group: what one replica does
    one = DevicePool.from_pretrained(args.model, spec.devices[0], options, settings.replace(parallel=None))
    group = parallel_pool(args.model, options, settings, ",".join(spec.devices))
    try:
        rows = []
        for i in range(args.images):
            fields = dict(prompt=PROMPTS[i % len(PROMPTS)], seed=args.seed + i, steps=args.steps, width=args.width,
                          height=args.height, num_frames=args.frames)  # fmt: skip
            request = GenerationRequest(**{k: v for k, v in fields.items() if v is not None})
            mine, group_wall = timed(group, request, args.repeats)
            theirs, one_wall = timed(one, request, args.repeats)
            a, b = pixels(mine), pixels(theirs)
            quality = psnr(a, b, 255.0)
            rows.append({"image": i, "max_abs": int(np.abs(a - b).max()), "psnr": None if quality == float("inf") else quality,
                         "group_s": group_wall, "one_s": one_wall, "overhead": group_wall / one_wall})  # fmt: skip
    finally:
        group.close()
        one.close()
    return {"parallel": str(plan), "group": spec.name, "reference": spec.devices[0], "model": args.model,
            "tolerance": args.tolerance, "images": rows,
            "pass": all(r["max_abs"] <= args.tolerance for r in rows)}  # fmt: skip


def print_report(report: dict) -> None:
    print(f"parity: group {report['group']} vs one device ({report['reference']}), {report['model']}")
    print(f"{'image':>5} {'max abs /255':>12} {'PSNR dB':>8} {'group s':>8} {'one s':>8} {'overhead':>8}")
    for r in report["images"]:
        quality = "inf" if r["psnr"] is None else f"{r['psnr']:.2f}"
        print(f"{r['image']:>5} {r['max_abs']:>12} {quality:>8} {r['group_s']:>8.3f} {r['one_s']:>8.3f} {r['overhead']:>7.2f}x")
    print(f"tolerance {report['tolerance']}/255 -> {'PASS' if report['pass'] else 'FAIL'}")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    report = run(args)
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0 if report["pass"] else 1
