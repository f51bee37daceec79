"""The benchmark suite: each function measures one question and returns a JSON-able dict.

All timings: warm-up first, then repeats; medians with spread; ratios measured in one run.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from devices import DeviceManager
from devices.manager import dtype_name
from devices.parallel import free_port
from pipelines import GenerationRequest, ImagePipeline

from .measure import alternate, summary, timed

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[1]
PROMPTS = [
    "a red circle on a blue background",
    "a yellow triangle on a purple background",
    "a white square on a black background",
    "a green circle on a orange background",
]


def torch_modules(pipeline: ImagePipeline, why: str) -> contextlib.AbstractContextManager:
    """The torch modules run inside, also where the OpenVINO runtime runs the networks (a section that
    measures torch itself: its dtypes, its FLOPs); nothing changes under torch."""
    runtime = pipeline.runtime
    return runtime.torch_only(why) if runtime is not None else contextlib.nullcontext()


def make_request(pipeline: ImagePipeline, images: int, steps: int, seed: int = 0) -> GenerationRequest:
    vocab = pipeline.vocabulary
    return GenerationRequest(
        prompt=[PROMPTS[i % len(PROMPTS)] for i in range(images)],
        num_images=1,
        steps=steps,
        guidance_scale=float(vocab.get("default_guidance_scale", 4.0)),
        seed=seed,
    )


def raw_call(pipeline: ImagePipeline, request: GenerationRequest, output_type: str = "pil") -> Any:
    """The same work as `pipeline.generate(request)`, straight through diffusers."""
    width, height = pipeline.default_size
    return pipeline.diffusers_pipeline(
        prompt=request.prompts,
        num_inference_steps=request.steps,
        guidance_scale=request.guidance_scale,
        width=width,
        height=height,
        generator=[pipeline.dm.create_generator(request.seed + i) for i in range(len(request.prompts))],
        output_type=output_type,
    )


def as_array(images) -> np.ndarray:
    return np.stack([np.asarray(im, dtype=np.float32) / 255.0 for im in images])


# ---------------------------------------------------------------------- 1. wrapper overhead
def wrapper_overhead(pipeline: ImagePipeline, images: int, steps: int, pairs: int) -> dict[str, Any]:
    request = make_request(pipeline, images, steps)
    dm = pipeline.dm
    pipeline.generate(request)  # warm-up
    raw_call(pipeline, request)
    times = alternate(
        dm, {"wrapper": lambda: pipeline.generate(request), "raw": lambda: raw_call(pipeline, request)}, pairs
    )
    ratios = [w / r for w, r in zip(times["wrapper"], times["raw"], strict=True)]
    same = np.abs(as_array(pipeline.generate(request).images) - as_array(raw_call(pipeline, request).images)).max()
    return {
        "images": images,
        "steps": steps,
        "pairs": pairs,
        "wrapper_s": summary(times["wrapper"]),
        "raw_s": summary(times["raw"]),
        "ratio_median_of_pairs": float(np.median(ratios)),
        "max_pixel_diff": float(same),
    }


# ---------------------------------------------------------------------- 2. attention
def attention(pipeline: ImagePipeline, images: int, steps: int, repeats: int) -> dict[str, Any]:
    from devices.attention import apply_attention

    request = make_request(pipeline, images, steps)
    out: dict[str, Any] = {"images": images, "steps": steps}
    outputs = {}
    try:
        for kind in ("vanilla", "sdpa"):
            apply_attention(pipeline.pipe, kind)
            pipeline.generate(request)  # warm-up
            outputs[kind] = as_array(pipeline.generate(request).images)
        times: dict[str, list[float]] = {"vanilla": [], "sdpa": []}
        for _ in range(repeats):
            for kind in times:
                apply_attention(pipeline.pipe, kind)
                times[kind].append(timed(pipeline.dm, lambda: pipeline.generate(request))[0])
    finally:
        apply_attention(pipeline.pipe, pipeline.dm.attention)
    out.update(
        vanilla_s=summary(times["vanilla"]),
        sdpa_s=summary(times["sdpa"]),
        vanilla_over_sdpa=summary(times["vanilla"])["median"] / summary(times["sdpa"])["median"],
        max_pixel_diff=float(np.abs(outputs["vanilla"] - outputs["sdpa"]).max()),
    )
    return out


# ---------------------------------------------------------------------- 3. batch scaling (+ 6. peak memory)
def batch_scaling(pipeline: ImagePipeline, batches: list[int], steps: int, repeats: int) -> dict[str, Any]:
    rows = {}
    for batch in batches:
        request = make_request(pipeline, batch, steps)
        pipeline.generate(request)  # warm-up
        samples, peaks = [], []
        for _ in range(repeats):
            seconds, result = timed(pipeline.dm, lambda r=request: pipeline.generate(r))
            samples.append(seconds / batch)
            peaks.append(result.peak_memory)
        rows[str(batch)] = {"per_image_s": summary(samples), "peak_memory": max(p or 0 for p in peaks) or None}
    base = rows[str(batches[0])]["per_image_s"]["median"]
    for row in rows.values():
        row["ratio_to_first"] = row["per_image_s"]["median"] / base
    return {"steps": steps, "batches": rows}


# ---------------------------------------------------------------------- 4. dtype
def dtypes(pipeline: ImagePipeline, images: int, steps: int, repeats: int) -> dict[str, Any]:
    candidates = [torch.float32, torch.bfloat16]
    if pipeline.dm.backend != "cpu":  # fp16 on CPU is emulated: not a configuration anyone should run
        candidates.append(torch.float16)
    original = pipeline.pipe.unet.dtype if hasattr(pipeline.pipe, "unet") else pipeline.dm.dtype
    request = make_request(pipeline, images, steps)
    results: dict[str, Any] = {}
    # OpenVINO takes float32 modules and picks its own precision: the torch dtypes are torch's to measure
    with torch_modules(pipeline, "the dtype section measures torch's dtypes"):
        _run_dtypes(pipeline, request, candidates, repeats, results, original)
    base = results["float32"]["seconds"]["median"]
    for row in results.values():
        row["speed_vs_float32"] = base / row["seconds"]["median"]
    return {"images": images, "steps": steps, "dtypes": results, "runtime": "torch"}


def _run_dtypes(pipeline: ImagePipeline, request: GenerationRequest, candidates: list[torch.dtype], repeats: int,
                results: dict[str, Any], original: torch.dtype) -> None:  # fmt: skip
    """Each dtype's seconds, peak memory and pixels against the first (float32), into `results`."""
    reference = None
    try:
        for dtype in candidates:
            pipeline.pipe.to(dtype=dtype)
            pipeline.generate(request)  # warm-up
            samples, peaks = [], []
            for _ in range(repeats):
                pipeline.dm.reset_peak_memory()
                seconds, result = timed(pipeline.dm, lambda: pipeline.generate(request))
                samples.append(seconds)
                peaks.append(result.peak_memory)
            pixels = as_array(result.images)
            if reference is None:
                reference = pixels
            name = dtype_name(dtype)
            results[name] = {
                "seconds": summary(samples),
                "peak_memory": max(p or 0 for p in peaks) or None,
                "max_pixel_diff_vs_float32": float(np.abs(pixels - reference).max()),
                "mean_pixel_diff_vs_float32": float(np.abs(pixels - reference).mean()),
            }
    finally:
        pipeline.pipe.to(dtype=original)


# ---------------------------------------------------------------------- 5. start-up
def startup(model: str, device: str | None, timeout: float = 300) -> dict[str, Any]:
    """Model load seconds in this process, and `python app.py` launch -> page answers (HTTP 200)."""
    import httpx

    seconds = ImagePipeline.from_pretrained(model, DeviceManager(device)).load_seconds
    port = free_port()
    env = {**os.environ, "GRADIO_SERVER_PORT": str(port), "MODEL_ID": model, "GRADIO_ANALYTICS_ENABLED": "False"}
    start = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "app.py"], cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    answered = None
    try:
        while time.perf_counter() - start < timeout and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/", timeout=1).status_code == 200:
                    answered = time.perf_counter() - start
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(30)
    return {"model_load_s": seconds, "app_launch_to_page_s": answered}


# ---------------------------------------------------------------------- 7. roofline
def matmul_rate(dm: DeviceManager, n: int = 2048, repeats: int = 15) -> float:
    """FLOP/s of an n x n x n matmul in the pipeline's dtype on this device.

    Median of `repeats`, the same statistic as the UNet timings it is compared with (a best-of
    would compare a lucky matmul with a typical UNet step on a noisy shared machine).
    """
    dtype = dm.dtype
    a = torch.randn(n, n, device=dm.device, dtype=dtype)
    b = torch.randn(n, n, device=dm.device, dtype=dtype)
    timed(dm, lambda: a @ b)  # warm-up
    return 2 * n**3 / summary([timed(dm, lambda: a @ b)[0] for _ in range(repeats)])["median"]


def roofline(pipeline: ImagePipeline, images: int, steps: int, repeats: int) -> dict[str, Any]:
    from torch.utils.flop_counter import FlopCounterMode

    unet = pipeline.pipe.unet
    width, height = pipeline.default_size
    factor = pipeline.vae_scale_factor
    batch = 2 * images  # classifier-free guidance runs the UNet on [uncond, cond]
    latents = torch.randn(
        batch, unet.config.in_channels, height // factor, width // factor, device=pipeline.dm.device, dtype=unet.dtype
    )
    tokens = pipeline.pipe.tokenizer.model_max_length
    hidden = torch.randn(batch, tokens, unet.config.cross_attention_dim, device=pipeline.dm.device, dtype=unet.dtype)
    t = torch.tensor([500] * batch, device=pipeline.dm.device)
    # OpenVINO's graph has no torch ops to count: the FLOPs are the torch module's
    with torch_modules(pipeline, "FLOPs are counted on the torch module"), torch.no_grad(), FlopCounterMode(display=False) as counter:
        unet(latents, t, hidden)
    flops_per_step = int(counter.get_total_flops())
    with torch.no_grad():
        unet(latents, t, hidden)  # warm-up
        unet_s = summary([timed(pipeline.dm, lambda: unet(latents, t, hidden))[0] for _ in range(max(15, repeats * 3))])
    request = make_request(pipeline, images, steps)
    pipeline.generate(request)
    denoise = summary([pipeline.generate(request).timings["denoise"] for _ in range(repeats)])
    peak = matmul_rate(pipeline.dm)
    achieved_loop = flops_per_step * steps / denoise["median"]
    achieved_unet = flops_per_step / unet_s["median"]
    return {
        "images": images,
        "steps": steps,
        "runtime": "openvino" if pipeline.runtime is not None else "torch",
        "unet_batch": batch,
        "unet_gflop_per_step": flops_per_step / 1e9,
        "matmul_gflops": peak / 1e9,
        "unet_forward_s": unet_s,
        "denoise_s": denoise,
        "unet_gflops": achieved_unet / 1e9,
        "denoise_loop_gflops": achieved_loop / 1e9,
        "unet_fraction_of_matmul": achieved_unet / peak,
        "loop_fraction_of_matmul": achieved_loop / peak,
    }
