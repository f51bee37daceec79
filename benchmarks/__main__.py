"""`python -m benchmarks [options]`: speed, memory and roofline of the app's pipeline on this device.

    python -m benchmarks --json bench.json                 # everything, embedded model, defaults
    python -m benchmarks --only wrapper,batch --steps 20   # a subset
    python -m benchmarks parity --dtype bfloat16           # numerical parity vs a CPU float32 reference
    python -m benchmarks parity --options all              # ... and each option vs the same model without it
    python -m benchmarks parity --parallel ulysses:2 --model M --device cuda:0,cuda:1  # a group vs one device
    python -m benchmarks speed --json speed.json           # compile, memory modes, fp8 vs the plain run
    python -m benchmarks compile-check --family sd15       # compiled vs eager images, compile/recompile times
    python -m benchmarks tiled-vae --size 1024             # the VAE decode's memory peak, tiled against whole

Prints a table of ratios (what to compare across machines) and writes every figure to JSON.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import torch

from .measure import report_header

SECTIONS = ("wrapper", "attention", "batch", "dtype", "roofline", "startup")


def build_parser() -> argparse.ArgumentParser:
    from pipelines.run.options import DEFAULT_MODEL

    p = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--device", default=None, help="as PREFERRED_DEVICE (default: auto)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    p.add_argument("--images", type=int, default=4, help="images per run for wrapper/attention/dtype/roofline")
    p.add_argument("--batches", default="1,2,4,8", help="batch sizes for the scaling test")
    p.add_argument("--repeats", type=int, default=5, help="timed repeats per configuration")
    p.add_argument("--pairs", type=int, default=20, help="alternated wrapper/raw pairs (their ratio is what is noisy)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--only", default=",".join(SECTIONS), help=f"comma list of {', '.join(SECTIONS)}")
    p.add_argument("--json", default=None, help="write all figures here")
    return p


def _parity(argv: list[str]) -> int:
    """`parity`: a device against the CPU reference, or with --parallel a parallel group against one device."""
    if any(a.split("=", 1)[0] == "--parallel" for a in argv):
        from .parallel_parity import main as parallel_main

        return parallel_main(argv)
    from .parity import main as parity_main

    return parity_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["parity"]:
        return _parity(argv[1:])
    if argv[:1] == ["compile-check"]:
        from .compile_check import main as compile_main

        return compile_main(argv[1:])
    if argv[:1] == ["tiled-vae"]:
        from .tiled_vae import main as tiled_main

        return tiled_main(argv[1:])
    if argv[:1] == ["speed"] and any(a == "--runtime" or a.startswith("--runtime=") for a in argv):
        from .openvino_bench import main as openvino_main
        from .speed import build_parser as speed_parser

        return openvino_main(speed_parser().parse_args(argv[1:]))
    if argv[:1] == ["speed"]:
        from .speed import main as speed_main

        return speed_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from pipelines.weights.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    if args.threads:
        torch.set_num_threads(args.threads)
    from devices import DeviceManager
    from pipelines import ImagePipeline

    sections = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        print(
            f"error: unknown section(s) {', '.join(sorted(unknown))}; choose from {', '.join(SECTIONS)}",
            file=sys.stderr,
        )
        return 2
    dm = DeviceManager(args.device)
    batches = [int(b) for b in args.batches.split(",")]
    pipeline = ImagePipeline.from_pretrained(
        args.model, dm, micro_batch=max([*batches, args.images]), max_batch=max(64, *batches)
    )
    steps = args.steps or int(pipeline.vocabulary.get("default_steps", 20))
    report = report_header(dm, args.model, steps)
    runners = _runners(pipeline, args, batches, steps)
    for name in sections:
        print(f"... {name}", file=sys.stderr, flush=True)
        report["results"][name] = runners[name]()
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
        print(f"wrote {args.json}")
    return 0


def _runners(pipeline, args: argparse.Namespace, batches: list[int], steps: int) -> dict:
    """One callable per section, run only for the sections asked for (`--only`)."""
    from . import suite

    return {
        "wrapper": lambda: suite.wrapper_overhead(pipeline, args.images, steps, args.pairs),
        "attention": lambda: suite.attention(pipeline, args.images, steps, args.repeats),
        "batch": lambda: suite.batch_scaling(pipeline, batches, steps, args.repeats),
        "dtype": lambda: suite.dtypes(pipeline, args.images, steps, args.repeats),
        "roofline": lambda: suite.roofline(pipeline, args.images, steps, args.repeats),
        "startup": lambda: suite.startup(args.model, args.device),
    }


_row = "{:<44} {:>12} {:>10}".format  # measurement, value, spread


def format_table(report: dict) -> str:
    """The report as a table of ratios and figures, one block per section measured, in SECTIONS order."""
    r = report["results"]
    lines = [
        f"{report['device_name']} ({report['device']}, {report['dtype']}, {report['attention']}, "
        f"{report['torch_threads']} threads), {report['steps']} steps",
        "",
        _row("measurement", "value", "spread"),
    ]
    for name, rows in _SECTION_ROWS.items():
        if name in r:
            lines += rows(r[name])
    return "\n".join(lines)


def _wrapper_rows(w: dict) -> list[str]:
    return [
        _row(
            f"wrapper / raw diffusers ({w['images']} img, {w['pairs']} pairs)",
            f"{w['ratio_median_of_pairs']:.3f}x",
            f"±{w['wrapper_s']['spread']:.0%}",
        ),
        _row("  raw diffusers call", f"{w['raw_s']['median']:.3f} s", f"±{w['raw_s']['spread']:.0%}"),
    ]


def _attention_rows(a: dict) -> list[str]:
    return [
        _row("vanilla / sdpa attention", f"{a['vanilla_over_sdpa']:.2f}x", f"±{a['sdpa_s']['spread']:.0%}"),
        _row("  max pixel diff vanilla vs sdpa", f"{a['max_pixel_diff']:.4f}", ""),
    ]


def _batch_rows(batch: dict) -> list[str]:
    lines = []
    for size, b in batch["batches"].items():
        peak = b["peak_memory"]
        lines.append(
            _row(
                f"per image at batch {size} (vs batch 1)",
                f"{b['per_image_s']['median']:.3f} s",
                f"{b['ratio_to_first']:.2f}x",
            )
        )
        if peak:
            lines.append(_row(f"  peak memory at batch {size}", f"{peak / 2**20:.0f} MiB", ""))
    return lines


def _dtype_rows(dtype: dict) -> list[str]:
    lines = []
    for name, d in dtype["dtypes"].items():
        lines.append(
            _row(f"{name}: speed vs float32", f"{d['speed_vs_float32']:.2f}x", f"±{d['seconds']['spread']:.0%}")
        )
        lines.append(
            _row(
                f"  {name}: max / mean pixel diff vs float32",
                f"{d['max_pixel_diff_vs_float32']:.4f}",
                f"{d['mean_pixel_diff_vs_float32']:.4f}",
            )
        )
    return lines


def _roofline_rows(f: dict) -> list[str]:
    return [
        _row(f"UNet GFLOP per step (batch {f['unet_batch']})", f"{f['unet_gflop_per_step']:.2f}", ""),
        _row("matmul rate (2048^3, this run)", f"{f['matmul_gflops']:.1f} GF/s", ""),
        _row(
            "UNet forward: fraction of matmul rate",
            f"{f['unet_fraction_of_matmul']:.0%}",
            f"{f['unet_gflops']:.1f} GF/s",
        ),
        _row(
            "denoising loop: fraction of matmul rate",
            f"{f['loop_fraction_of_matmul']:.0%}",
            f"{f['denoise_loop_gflops']:.1f} GF/s",
        ),
    ]


def _startup_rows(s: dict) -> list[str]:
    launch = s["app_launch_to_page_s"]
    return [
        _row("model load", f"{s['model_load_s']:.2f} s", ""),
        _row("python app.py -> page answers", f"{launch:.1f} s" if launch else "no answer", ""),
    ]


_SECTION_ROWS = {
    "wrapper": _wrapper_rows,
    "attention": _attention_rows,
    "batch": _batch_rows,
    "dtype": _dtype_rows,
    "roofline": _roofline_rows,
    "startup": _startup_rows,
}  # in SECTIONS order: the table's order


if __name__ == "__main__":
    sys.exit(main())
