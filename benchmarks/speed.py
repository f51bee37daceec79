"""`python -m benchmarks speed`: every option of benchmarks.options on the loaded model, against the plain run.

    python -m benchmarks speed                                   # this device, the embedded model
    python -m benchmarks speed --device cuda --options all --json speed.json
    python -m benchmarks speed --options compile,fp8-layerwise --steps 20 --images 4

Per option: load seconds (compile warm-up included), compile seconds (the warm-up alone), seconds
per image (median of --repeats after a warm-up), peak memory, and PSNR / max difference of its
images against the plain run's (same seeds) — speed and memory as ratios to plain, all measured in
this one process, one option after the other (each loaded fresh and closed before the next).
An option that cannot run on the device is listed with the reason; one that fails, with the error.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from .measure import report_header
from .options import OPTIONS, QUANTIZATION_HELP, Option, Unavailable, quantization_option, select

log = logging.getLogger(__name__)
# More warm-up requests while OPENVINO_WEIGHTS=w8a8 calibrates (20 denoiser calls: five 1-image requests of a
# 4-step model without CFG), so that its timed requests run the quantized graph.
CALIBRATION_REQUESTS = 20


def load(model: str, dm: Any, option: Option, micro_batch: int) -> tuple[Any, str]:
    """The model loaded with `option` applied; (pipeline, note)."""
    from pipelines import ImagePipeline

    pipeline = ImagePipeline.from_pretrained(model, dm, micro_batch=micro_batch, **option.fields(model))
    note = option.after_load(pipeline) if option.after_load else ""
    return pipeline, note


def measure(model: str, dm: Any, option: Option, images: int, steps: int, repeats: int) -> dict[str, Any]:
    """One option's figures (no ratios yet); `pixels` are its last images as floats in [0, 1]."""
    from .measure import summary, timed
    from .suite import as_array, make_request

    dm.empty_cache()
    dm.reset_peak_memory()
    started = time.perf_counter()
    pipeline, note = load(model, dm, option, images)
    refusal = option.refuse(dm, pipeline)  # what only the loaded model tells (a step cache needs a DiT)
    if refusal:
        pipeline.close()
        return {"summary": option.summary, "skipped": refusal}
    row: dict[str, Any] = {"summary": option.summary, "load_s": time.perf_counter() - started}
    row.update(compile_s=pipeline.compile_seconds, compile=pipeline.compile, weights=pipeline.weights, note=note)
    row["quantization"] = pipeline.model_info().quantization  # per component, what the loader really made
    request = make_request(pipeline, images, steps).replace(**option.request)
    try:
        pipeline.generate(request)  # warm-up (a compiled model was warmed at load; this covers the batch size)
        for _ in range(CALIBRATION_REQUESTS):  # w8a8's calibrating requests run the f32 graph, then quantize it
            if pipeline.runtime is None or not pipeline.runtime.calibrating:
                break
            pipeline.generate(request)
        samples, peaks = [], []
        for _ in range(repeats):
            dm.reset_peak_memory()
            seconds, result = timed(dm, lambda: pipeline.generate(request))
            samples.append(seconds / images)
            peaks.append(result.peak_memory)
        row.update(per_image_s=summary(samples), peak_memory=max(p or 0 for p in peaks) or None)
        if pipeline.runtime is not None:  # the graphs' weights as OpenVINO holds them (OPENVINO_WEIGHTS)
            graphs, fp32 = pipeline.runtime.weight_bytes()
            row["runtime_weights"] = f"graphs' weights {graphs / 2**20:.1f} MiB ({graphs / fp32:.2f}x fp32)"
            row["runtime"] = pipeline.runtime_description  # what ran the timed requests (w8a8: "activations int8")
        row["pixels"] = as_array(result.images)
    finally:
        pipeline.close()
        gc.collect()
    return row


def run_option(model: str, dm: Any, option: Option, images: int, steps: int, repeats: int) -> dict[str, Any]:
    """`measure`, or the reason it cannot run here / the error it raised."""
    refusal = option.refuse(dm, None)
    if refusal:
        return {"summary": option.summary, "skipped": refusal}
    try:
        return measure(model, dm, option, images, steps, repeats)
    except Unavailable as exc:
        return {"summary": option.summary, "skipped": str(exc)}
    except Exception as exc:  # an option failing on a device is a result, not a crash of the whole run
        log.warning("option %s failed: %s", option.name, exc, exc_info=True)
        return {"summary": option.summary, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}


def add_ratios(rows: dict[str, dict[str, Any]]) -> None:
    """Speed, memory and image ratios of every measured option against `plain` (in place)."""
    from .parity import psnr

    base = rows["plain"]
    for row in rows.values():
        if "pixels" not in row:
            continue
        row["speedup_vs_plain"] = base["per_image_s"]["median"] / row["per_image_s"]["median"]
        if base.get("peak_memory") and row.get("peak_memory"):
            row["peak_memory_vs_plain"] = row["peak_memory"] / base["peak_memory"]
        quality = psnr(base["pixels"], row["pixels"])
        row["psnr_vs_plain"] = None if quality == float("inf") else quality  # None: identical
        row["max_abs_vs_plain"] = float(np.abs(base["pixels"] - row["pixels"]).max())
    for row in rows.values():
        row.pop("pixels", None)


def build_parser() -> argparse.ArgumentParser:
    from pipelines.run.options import DEFAULT_MODEL

    p = argparse.ArgumentParser(
        prog="python -m benchmarks speed", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--device", default=None, help="as PREFERRED_DEVICE (default: auto)")
    p.add_argument("--dtype", default=None, help="as TORCH_DTYPE (default: the device's)")
    p.add_argument("--options", default="all", help=f"comma list of {', '.join(OPTIONS)}, or all (plain always runs)")
    p.add_argument("--quantization", default=None, help=QUANTIZATION_HELP)
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    p.add_argument("--images", type=int, default=2, help="images per request")
    p.add_argument("--repeats", type=int, default=3, help="timed requests per option")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--json", default=None, help="write all figures here")
    p.add_argument(
        "--runtime", choices=("openvino",), default=None,
        help="OpenVINO against torch eager at 1 and 4 images: first (converting) and cached load, images/s, peak "
        "memory, and optimum-intel's pipeline beside it (benchmarks.openvino_bench)",
    )  # fmt: skip
    p.add_argument("--no-peer", action="store_true", help="with --runtime openvino: leave optimum-intel out")
    p.add_argument("--peer-venv", default=None, help="with --runtime openvino: optimum-intel's venv (built if missing)")
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every asked option, plain first; the report with ratios."""
    from devices import DeviceManager

    dm = DeviceManager(args.device, args.dtype)
    options = [OPTIONS["plain"], *(o for o in select(args.options) if o.name != "plain")]
    if args.quantization:
        options.append(quantization_option(args.quantization))
    steps = args.steps or int(_vocabulary(args.model).get("default_steps", 20))
    report = report_header(dm, args.model, steps)
    report.update(images=args.images, repeats=args.repeats)
    rows = report["results"]
    for option in options:
        print(f"... {option.name}", file=sys.stderr, flush=True)
        rows[option.name] = run_option(args.model, dm, option, args.images, steps, args.repeats)
    if "pixels" not in rows["plain"]:
        raise RuntimeError(f"the plain run failed: {rows['plain'].get('error')}")
    add_ratios(rows)
    return report


def _vocabulary(model: str) -> dict[str, Any]:
    from pipelines.run.model_setup import read_vocabulary

    return read_vocabulary(model)


_row = "{:<16} {:>9} {:>8} {:>9} {:>8} {:>9} {:>9}  {}".format


def format_table(report: dict[str, Any]) -> str:
    lines = [
        f"{report['device_name']} ({report['device']}, {report['dtype']}, {report['torch_threads']} threads), "
        f"{report['images']} image(s) x {report['steps']} steps, median of {report['repeats']}",
        "",
        _row("option", "s/image", "speedup", "peak mem", "load s", "compile s", "PSNR dB", "weights / note"),
    ]
    for name, r in report["results"].items():
        if "per_image_s" not in r:
            lines.append(_row(name, "-", "-", "-", "-", "-", "-", r.get("skipped") or r.get("error", "")))
            continue
        peak = f"{r['peak_memory'] / 2**20:.0f}M" if r.get("peak_memory") else "n/a"
        ratio = f" ({r['peak_memory_vs_plain']:.2f}x)" if "peak_memory_vs_plain" in r else ""
        quality = "identical" if r["psnr_vs_plain"] is None else f"{r['psnr_vs_plain']:.1f}"
        lines.append(
            _row(
                name, f"{r['per_image_s']['median']:.3f}", f"{r['speedup_vs_plain']:.2f}x", peak + ratio,
                f"{r['load_s']:.1f}", f"{r['compile_s']:.1f}", quality, r["note"] or _weights(r),
            )
        )  # fmt: skip
    return "\n".join(lines)


def _weights(row: dict[str, Any]) -> str:
    """Where the weights are, and what each quantized component holds."""
    quantized = "; ".join(f"{c}: {what}" for c, what in (row.get("quantization") or {}).items())
    return f"{row['weights']}, {quantized}" if quantized else row["weights"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from pipelines.weights.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.runtime:  # `python -m benchmarks speed --runtime openvino` goes to benchmarks.openvino_bench
        print("error: --runtime: run it as python -m benchmarks speed --runtime openvino", file=sys.stderr)
        return 2
    try:
        report = run(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
        print(f"wrote {args.json}")
    return 0
