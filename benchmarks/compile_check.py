"""`python -m benchmarks compile-check`: is the compiled denoiser right, and what do compiles cost?

    python -m benchmarks compile-check                            # the embedded model, COMPILE=on
    python -m benchmarks compile-check --family sd15 --family flux --json compile.json

For each model: the eager images, then the same model compiled as COMPILE=on does (devices.compile:
regional `compile_repeated_blocks` where the denoiser declares `_repeated_blocks`, else the whole
denoiser; `dynamic=True`). Reported: the first compiled call (the compile), a second call at the
same shape (steady), the first call at twice the batch and at twice the side (a recompile shows up
as a first call much slower than its steady twin), eager times, and the largest pixel difference
compiled vs eager for each shape. `--family` builds the tiny copy of a model family (tests/families.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .measure import report_header

log = logging.getLogger(__name__)
UNCAPPED = {"max_pixels": 4096 * 4096, "max_side": 4096}  # the shapes checked are chosen here, not by the UI's caps


def _shapes(side: int) -> dict[str, tuple[int, int]]:
    """(batch, side) of the first shape, twice the batch, twice the side."""
    return {"first shape": (1, side), "batch x2": (2, side), "side x2": (1, 2 * side)}


def _call(pipeline: Any, batch: int, side: int, steps: int) -> tuple[float, np.ndarray]:
    from pipelines import GenerationRequest

    request = GenerationRequest(
        prompt="a red circle on a blue background", num_images=batch, steps=steps, seed=3, width=side, height=side
    )
    started = time.perf_counter()
    images = pipeline.generate(request).images
    return time.perf_counter() - started, np.stack([np.asarray(im, dtype=np.float32) / 255 for im in images])


def check(model: str, steps: int, side: int | None) -> dict[str, Any]:
    """One model: eager vs compiled at each shape. The compile is done as at load (devices.compile,
    COMPILE=on), but its first call is timed at `side` (default: the model's size), so that a model
    whose native size is large on a CPU (Flux: 1024 px) can be checked at a small one."""
    from devices import DeviceManager
    from devices import compile as graph_compile
    from pipelines import ImagePipeline

    dm = DeviceManager("cpu", "float32", "sdpa")
    eager = ImagePipeline.from_pretrained(model, dm, compile="off", memory_mode="off", **UNCAPPED)
    compiled = ImagePipeline.from_pretrained(model, dm, compile="off", memory_mode="off", **UNCAPPED)
    row: dict[str, Any] = {"compile": graph_compile.compile_denoiser(compiled.pipe, graph_compile.plan("cpu", "on"))}
    row["shapes"] = {}
    for name, (batch, edge) in _shapes(side or compiled.default_size[0]).items():
        _call(eager, batch, edge, steps)  # eager warm-up at this shape
        eager_s, reference = _call(eager, batch, edge, steps)
        first_s, got = _call(compiled, batch, edge, steps)
        steady_s, _ = _call(compiled, batch, edge, steps)
        row["shapes"][name] = {
            "batch": batch, "side": edge, "eager_s": eager_s, "compiled_first_s": first_s,
            "compiled_steady_s": steady_s, "steady_speedup": eager_s / steady_s,
            "max_abs_vs_eager": float(np.abs(got - reference).max()),
        }  # fmt: skip
    return row


def build_parser() -> argparse.ArgumentParser:
    from pipelines.run.options import DEFAULT_MODEL

    p = argparse.ArgumentParser(
        prog="python -m benchmarks compile-check", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--model", action="append", default=None, help=f"a model folder (default: {DEFAULT_MODEL})")
    p.add_argument("--family", action="append", default=[], help="a tiny model family of tests/families.py")
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--side", type=int, default=None, help="image side of the first shape (default: the model's)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    return p


def _models(args: argparse.Namespace, workdir: Path) -> dict[str, str]:
    from pipelines.run.options import DEFAULT_MODEL

    models = {Path(m).name: m for m in args.model or ([] if args.family else [str(DEFAULT_MODEL)])}
    if args.family:
        from tests.families import build

        for family in args.family:
            models[family] = str(build(family, workdir / family))
    return models


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.threads:
        torch.set_num_threads(args.threads)
    from devices import DeviceManager

    report = report_header(DeviceManager("cpu"), ",".join(args.model or args.family or ["default"]), args.steps)
    with tempfile.TemporaryDirectory() as workdir:
        for name, model in _models(args, Path(workdir)).items():
            print(f"... {name}", file=sys.stderr, flush=True)
            row = report["results"][name] = check(model, args.steps, args.side)
            print(f"{name}: {row['compile']}")
            for shape, s in row["shapes"].items():
                print(
                    f"  {shape:<14} (batch {s['batch']}, {s['side']} px): eager {s['eager_s']:.3f} s, compiled first "
                    f"{s['compiled_first_s']:.3f} s, steady {s['compiled_steady_s']:.3f} s "
                    f"({s['steady_speedup']:.2f}x), max abs vs eager {s['max_abs_vs_eager']:.5f}"
                )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0
