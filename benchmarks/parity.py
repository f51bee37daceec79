"""Numerical parity: the same seeded images on a chosen device/dtype/attention vs a CPU float32 reference.

    python -m benchmarks parity                          # this machine's default device vs CPU fp32
    python -m benchmarks parity --device npu --dtype bfloat16 --json parity.json

This is the check a porter runs after moving to a new backend ("output quality comparable to
the CUDA version", made measurable). Pixels are compared as floats in [0, 1] straight from the
pipeline (before 8-bit rounding). Exit code 0 = every image within the tolerances of the
candidate's dtype, 1 = not.

Tolerances (per image; PSNR over the [0, 1] range). They allow for kernels that sum in another
order (fp32), and for the rounding of half-precision weights and activations compounded over
the denoising steps, while a wrong kernel, a broken dtype or shifted seeds (PSNR ~10-20 dB)
fails:

| dtype | max abs diff | PSNR |
|---|---|---|
| float32 | 0.02 | >= 40 dB |
| float16 | 0.25 | >= 28 dB |
| bfloat16 | 0.35 | >= 24 dB |

`--parallel ulysses:2` (with `--model` and `--device cuda:0,cuda:1`) compares a parallel group's images
with one device's and prints the group's overhead instead (benchmarks/parallel_parity.py).

`--options compile,group-block,...|all` also compares each option of benchmarks.options with the
same model without it, on the candidate device (PSNR and max difference, the option's tolerance:
see benchmarks.options); an option that fails makes the exit code 1, one that cannot run on the
device is listed as skipped with the reason.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch

TOLERANCES = {
    "float32": {"max_abs": 0.02, "min_psnr": 40.0},
    "float16": {"max_abs": 0.25, "min_psnr": 28.0},
    "bfloat16": {"max_abs": 0.35, "min_psnr": 24.0},
}
PROMPTS = [
    "a red circle on a blue background",
    "a yellow triangle on a purple background",
    "a white square on a black background",
    "a green circle on a orange background",
]


def psnr(a: np.ndarray, b: np.ndarray, peak: float = 1.0) -> float:
    """PSNR in dB of two images whose values reach `peak` (1.0: floats in [0, 1]; 255: 8-bit), inf when equal."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    mse = float(((a - b) ** 2).mean())
    return math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)


def render(pipeline, prompts: list[str], steps: int, guidance: float, seed: int) -> np.ndarray:
    width, height = pipeline.default_size
    dm = pipeline.dm
    out = pipeline.diffusers_pipeline(
        prompt=prompts,
        num_inference_steps=steps,
        guidance_scale=guidance,
        width=width,
        height=height,
        generator=[dm.create_generator(seed + i) for i in range(len(prompts))],
        output_type="np",
    )
    return np.asarray(out.images, dtype=np.float32)


def render_request(pipeline, prompts: list[str], steps: int, guidance: float, seed: int, fields: dict) -> np.ndarray:
    """`render` through `ImagePipeline.generate` with request `fields` (per-request options such as a
    step cache, which only the app's own request path applies); 8-bit images as floats in [0, 1]."""
    from pipelines import GenerationRequest

    request = GenerationRequest(prompt=prompts, steps=steps, guidance_scale=guidance, seed=seed, **fields)
    result = pipeline.generate(request)
    return np.stack([np.asarray(im, dtype=np.float32) / 255.0 for im in result.images])


def perturb_(pipeline, scale: float, seed: int = 0) -> None:
    """Add relative Gaussian noise to the denoiser's weights (a deliberately broken "port")."""
    gen = torch.Generator().manual_seed(seed)
    denoiser = getattr(pipeline.diffusers_pipeline, "unet", None) or pipeline.diffusers_pipeline.transformer
    with torch.no_grad():
        for p in denoiser.parameters():
            noise = torch.randn(p.shape, generator=gen).to(p.device, p.dtype)
            p.add_(noise * p.detach().float().std().nan_to_num(0).to(p.dtype) * scale)


def compare(reference: np.ndarray, candidate: np.ndarray, dtype: str, tol: dict | None = None) -> dict:
    tol = tol or TOLERANCES[dtype]
    rows = []
    for i, (ref, cand) in enumerate(zip(reference, candidate, strict=True)):
        diff = np.abs(ref - cand)
        quality = psnr(ref, cand)
        row = {
            "image": i,
            "max_abs": float(diff.max()),
            "median_abs": float(np.median(diff)),
            "psnr": None if math.isinf(quality) else quality,
        }  # None: identical (JSON has no infinity)
        row["pass"] = row["max_abs"] <= tol["max_abs"] and quality >= tol["min_psnr"]
        rows.append(row)
    return {"tolerance": tol, "images": rows, "pass": all(r["pass"] for r in rows)}


def build_parser() -> argparse.ArgumentParser:
    from pipelines.run.options import DEFAULT_MODEL

    from . import options

    p = argparse.ArgumentParser(
        prog="python -m benchmarks parity", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--model", default=str(DEFAULT_MODEL))
    p.add_argument("--device", default=None, help="candidate device (default: PREFERRED_DEVICE / auto)")
    p.add_argument("--dtype", default=None, help="candidate dtype (default: the device's)")
    p.add_argument(
        "--attention", default=None, help="candidate attention: vanilla | sdpa | npu (Ascend fused attention)"
    )
    p.add_argument("--images", type=int, default=4)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--perturb", type=float, default=0.0, help="add this relative noise to the candidate's weights")
    p.add_argument(
        "--options",
        default=None,
        help="also compare each option (benchmarks.options: a comma list, or all) against the same model without it",
    )
    p.add_argument("--quantization", default=None, help=options.QUANTIZATION_HELP)
    p.add_argument(
        "--runtime", choices=("openvino",), default=None,
        help="also gate the OpenVINO runtime against torch fp32 at the same seeds (PSNR >= 40 dB): --options openvino",
    )  # fmt: skip
    p.add_argument("--json", default=None)
    return p


def option_parity(args: argparse.Namespace, dm, prompts: list[str], steps: int, guidance: float) -> dict:
    """Each option of `--options` (and `--quantization`'s) on the candidate device against the plain model there (same seeds),
    with the option's tolerance (or the dtype's); an option that cannot run here is skipped with the reason."""
    from pipelines import ImagePipeline
    from pipelines.schema.errors import ModelLoadError

    from .options import OPTIONS, Unavailable, quantization_option, select

    def load(option):
        pipeline = ImagePipeline.from_pretrained(args.model, dm, **option.fields(args.model))
        note = option.after_load(pipeline) if option.after_load else ""
        return pipeline, note

    plain, _ = load(OPTIONS["plain"])
    base = render(plain, prompts, steps, guidance, args.seed)
    plain.close()
    results = {}
    chosen = select(args.options) if args.options else []
    for option in chosen + ([quantization_option(args.quantization)] if args.quantization else []):
        refusal = option.refuse(dm, None)
        if refusal:
            results[option.name] = {"skipped": refusal, "pass": True}
            continue
        try:
            pipeline, note = load(option)
        except Unavailable as exc:
            results[option.name] = {"skipped": str(exc), "pass": True}
            continue
        except (ModelLoadError, ValueError) as exc:  # a refused setting (a QUANTIZATION this device cannot run)
            results[option.name] = {"error": f"{type(exc).__name__}: {exc}", "pass": False}
            continue
        refusal = option.refuse(dm, pipeline)  # what only the loaded model tells (a step cache needs a DiT)
        if refusal:
            pipeline.close()
            results[option.name] = {"skipped": refusal, "pass": True}
            continue
        if option.request:  # a per-request option runs through ImagePipeline.generate, and so does its reference
            pixels = render_request(pipeline, prompts, steps, guidance, args.seed, option.request)
            reference = render_request(pipeline, prompts, steps, guidance, args.seed, {})
        else:
            pixels, reference = render(pipeline, prompts, steps, guidance, args.seed), base
        pipeline.close()
        tol = dataclasses.asdict(option.tolerance) if option.tolerance else None
        results[option.name] = {"note": note, "compile": pipeline.compile, "weights": pipeline.weights,
                                **compare(reference, pixels, dm.dtype_name, tol)}  # fmt: skip
    return results


def print_report(report: dict) -> None:
    print(f"parity: {report['candidate']} ({report['device_name']}) vs {report['reference']}, {report['steps']} steps")
    print(f"{'image':>5} {'max abs':>9} {'median abs':>11} {'PSNR dB':>8}  result")
    for row in report["images"]:
        quality = "inf" if row["psnr"] is None else f"{row['psnr']:.2f}"
        print(
            f"{row['image']:>5} {row['max_abs']:>9.5f} {row['median_abs']:>11.6f} {quality:>8}  "
            f"{'pass' if row['pass'] else 'FAIL'}"
        )
    tol = report["tolerance"]
    print(
        f"tolerance for {report['dtype']}: max abs <= {tol['max_abs']}, PSNR >= {tol['min_psnr']} dB -> "
        f"{'PASS' if report['reference_pass'] else 'FAIL'}"
    )
    for name, r in report.get("options", {}).items():
        if "skipped" in r or "error" in r:
            print(f"option {name:<16} {'skipped: ' + r['skipped'] if 'skipped' in r else 'FAIL: ' + r['error']}")
            continue
        worst = min((row["psnr"] for row in r["images"] if row["psnr"] is not None), default=None)
        largest = max(row["max_abs"] for row in r["images"])
        quality = "identical" if worst is None else f"min PSNR {worst:.2f} dB"
        print(
            f"option {name:<16} vs plain: max abs {largest:.5f}, {quality} "
            f"(tolerance {r['tolerance']['max_abs']}, {r['tolerance']['min_psnr']} dB) -> {'PASS' if r['pass'] else 'FAIL'}"
        )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.runtime:
        args.options = ",".join(filter(None, [args.options, args.runtime]))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from pipelines.weights.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    from devices import DeviceManager
    from pipelines import ImagePipeline

    if args.options:
        from .options import select

        select(args.options)  # unknown names fail before any model loads
    from config import environment
    from devices.options import DeviceSettings  # the candidate's defaults: PREFERRED_DEVICE, TORCH_DTYPE, ...

    devices = DeviceSettings.from_env(environment(os.environ))
    candidate_dm = DeviceManager(options=devices.options_for(args.device, args.dtype, args.attention))
    reference = ImagePipeline.from_pretrained(args.model, DeviceManager("cpu", "float32", "sdpa"))
    candidate = ImagePipeline.from_pretrained(args.model, candidate_dm)
    if args.perturb:
        perturb_(candidate, args.perturb)
    steps = args.steps or int(reference.vocabulary.get("default_steps", 20))
    guidance = float(reference.vocabulary.get("default_guidance_scale", 4.0))
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.images)]
    ref_pixels = render(reference, prompts, steps, guidance, args.seed)
    cand_pixels = render(candidate, prompts, steps, guidance, args.seed)
    dtype = candidate_dm.dtype_name
    report = {
        "reference": "cpu float32 sdpa",
        "candidate": f"{candidate_dm.device} {dtype} {candidate_dm.attention}",
        "device_name": candidate_dm.device_name,
        "dtype": dtype,
        "steps": steps,
        "seed": args.seed,
        "perturb": args.perturb,
        **compare(ref_pixels, cand_pixels, dtype),
    }
    report["reference_pass"] = report["pass"]
    if args.options or args.quantization:
        report["options"] = option_parity(args, candidate_dm, prompts, steps, guidance)
        report["pass"] = report["pass"] and all(r["pass"] for r in report["options"].values())
    print_report(report)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    return 0 if report["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
