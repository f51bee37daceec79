"""The registry of speed/memory options that `python -m benchmarks speed` and `parity --options` measure.

An option is a way to run the same model: compiled, offloaded, stored in fp8, ... Each entry says how
it is applied (PipelineOptions fields at load, a function on the loaded pipeline, fields of each
request), on which devices it can run (else why not), and how far its images may drift from the
same model without it (the parity tolerance).

Adding an option (GGUF quantization, a step cache, ...) is one `register(Option(...))` call in the
module that provides it, or one entry below; both commands pick it up by name:

    register(Option(
        name="first-block-cache",
        summary="diffusers FirstBlockCacheConfig on the transformer",
        after_load=lambda pipeline: enable_my_cache(pipeline),   # returns a note, or raises
        refuse=lambda dm, pipeline: None if has_transformer(pipeline) else "UNet models have no cache",
        tolerance=Tolerance(max_abs=0.3, min_psnr=22.0),
    ))

Tolerances: exact-math options (offload moves the same weights) get the dtype's parity tolerance
(benchmarks.parity.TOLERANCES); compile reorders sums and fuses kernels, so it gets the same
fp32/half bounds; fp8 storage loses mantissa bits in every weight and gets a lossy bound that
still fails a broken image (PSNR of unrelated images here: ~10-15 dB).
"""

from __future__ import annotations

import importlib.util
import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class Tolerance:
    """Per image: largest absolute pixel difference (pixels in [0, 1]) and least PSNR in dB."""

    max_abs: float
    min_psnr: float


class Unavailable(Exception):
    """The option cannot run on this model or machine; the message says why (reported as skipped)."""


@dataclass(frozen=True)
class Option:
    """One way to run the loaded model.

    load: PipelineOptions fields for `ImagePipeline.from_pretrained` (memory_mode, compile, ...).
    after_load: called with the loaded ImagePipeline; returns a note for the report (or raises).
    request: GenerationRequest fields set on every request (for per-request options).
    refuse: (DeviceManager, ImagePipeline | None) -> why it cannot run there, or None.
    tolerance: vs the plain run; None: the dtype's parity tolerance.
    load_for: model path -> more load fields that depend on the model (its denoiser's name), or
        `Unavailable` with the reason.
    """

    name: str
    summary: str
    load: dict[str, Any] = field(default_factory=dict)
    after_load: Callable[[Any], str] | None = None
    request: dict[str, Any] = field(default_factory=dict)
    refuse: Callable[[Any, Any], str | None] = lambda dm, pipeline: None
    tolerance: Tolerance | None = None
    load_for: Callable[[str], dict[str, Any]] | None = None

    def fields(self, model: str) -> dict[str, Any]:
        """The PipelineOptions fields to load `model` with this option (raises Unavailable)."""
        return {**self.load, **(self.load_for(model) if self.load_for else {})}


OPTIONS: dict[str, Option] = {}
PLAIN = {"memory_mode": "off", "compile": "off", "runtime": "torch"}  # the reference: torch eager, nothing else


def register(option: Option) -> Option:
    """Add (or replace) an option by name; returns it."""
    OPTIONS[option.name] = option
    return option


def select(names: str) -> list[Option]:
    """Options named in a comma list ("all": every one but plain); ValueError naming unknown ones."""
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    if wanted == ["all"]:
        return [o for n, o in OPTIONS.items() if n != "plain"]
    unknown = [n for n in wanted if n not in OPTIONS]
    if unknown:
        raise ValueError(f"unknown option(s) {', '.join(unknown)}; choose from {', '.join(OPTIONS)} or all")
    return [OPTIONS[n] for n in wanted]


def _not_cpu(what: str) -> Callable[[Any, Any], str | None]:
    return lambda dm, pipeline: f"{what} needs an accelerator (on cpu the weights are already in RAM)" if (
        dm.backend == "cpu"
    ) else None


def fp8_layerwise(pipeline: Any) -> str:
    """Store the denoiser's weights in float8_e4m3fn and cast each layer up to the model's dtype
    when it runs (diffusers `enable_layerwise_casting`): half the weight memory of bf16, a cast per layer."""
    from devices.compile import denoiser_of

    name, module = denoiser_of(pipeline.pipe)
    compute = module.dtype
    module.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=compute)
    return f"{name} stored in float8_e4m3fn, computed in {str(compute).removeprefix('torch.')}"


def _fp8_refusal(dm: Any, pipeline: Any) -> str | None:
    if dm.backend == "mps":
        return "MPS has no float8 dtype"
    return None


for _option in (
    Option("plain", "no compile, no memory savers, weights on the device", load=dict(PLAIN)),
    Option("compile", "graph compile of the denoiser (devices.compile), paid at load", load={**PLAIN, "compile": "on"}),
    Option("memory-balanced", "MEMORY_MODE=balanced: VAE slicing/tiling (+ attention slicing with vanilla)",
           load={**PLAIN, "memory_mode": "balanced"}),
    Option("memory-max", "MEMORY_MODE=max: balanced + model CPU offload", load={**PLAIN, "memory_mode": "max"},
           refuse=_not_cpu("model CPU offload")),
    Option("group-block", "MEMORY_MODE=group: balanced + group offload by block", load={**PLAIN, "memory_mode": "group"},
           refuse=_not_cpu("group offload")),
    Option("group-leaf", "MEMORY_MODE=group-leaf: balanced + group offload by leaf module",
           load={**PLAIN, "memory_mode": "group-leaf"}, refuse=_not_cpu("group offload")),
    Option("fp8-layerwise", "denoiser weights stored in fp8, cast per layer", load=dict(PLAIN),
           after_load=fp8_layerwise, refuse=_fp8_refusal, tolerance=Tolerance(max_abs=0.5, min_psnr=20.0)),
):  # fmt: skip
    register(_option)


def _no_step_cache(dm: Any, pipeline: Any) -> str | None:
    """Known only once the model is loaded (`speed` asks again then): its denoiser has a cache or not."""
    if pipeline is None or pipeline.model_info().step_cache:
        return None
    return "this family's denoiser has no diffusers step cache (pipelines.sampling.step_cache)"


STEP_CACHE_TOLERANCE = Tolerance(max_abs=0.5, min_psnr=20.0)  # skipped blocks reuse stale residuals: lossy by design
for _option in (
    Option("first-block-cache", "per request: diffusers FirstBlockCache at its default threshold",
           load=dict(PLAIN), request={"step_cache": "FirstBlockCache"}, refuse=_no_step_cache,
           tolerance=STEP_CACHE_TOLERANCE),
    Option("taylorseer-cache", "per request: diffusers TaylorSeer cache (full step every 5, after 3)",
           load=dict(PLAIN), request={"step_cache": "TaylorSeer"}, refuse=_no_step_cache,
           tolerance=STEP_CACHE_TOLERANCE),
    Option("magcache", "per request: diffusers MagCache (its first request calibrates: the warm-up run)",
           load=dict(PLAIN), request={"step_cache": "MagCache"}, refuse=_no_step_cache,
           tolerance=STEP_CACHE_TOLERANCE),
):  # fmt: skip
    register(_option)


def _torchao_denoiser(model: str) -> dict[str, Any]:
    """QUANTIZATION for the model's denoiser (a `transformer` or a `unet`, as its model_index names it)."""
    if importlib.util.find_spec("torchao") is None:
        raise Unavailable("torchao is not installed (pip install -r requirements-quant.txt)")
    index = Path(model) / "model_index.json"
    if not index.is_file():
        raise Unavailable("needs a local diffusers folder, to name its denoiser")
    component = "transformer" if "transformer" in json.loads(index.read_text()) else "unet"
    return {"quantization": f"{component}=torchao-int8wo"}


QUANT_TOLERANCE = Tolerance(max_abs=0.5, min_psnr=20.0)  # weight rounding in every layer: lossy by design

register(Option(
    "torchao-int8wo", "the denoiser's weights in int8 with a per-row scale (torchao, pipelines.weights.quantization)",
    load=dict(PLAIN), load_for=_torchao_denoiser, tolerance=QUANT_TOLERANCE,
))  # fmt: skip


def _openvino_refusal(dm: Any, pipeline: Any) -> str | None:
    """What devices.runtime's table says of RUNTIME=openvino on this device (not a CPU, not installed)."""
    from devices.runtime import plan

    return plan(dm.backend, "openvino").error


# One OPENVINO_CACHE per benchmark process: `openvino` converts into it (the first load a user pays),
# `openvino-cached` loads again from it (every later start). Fresh per run, so the first is a real conversion.
OPENVINO_BENCH_CACHE = Path(tempfile.gettempdir()) / f"diffusion-anywhere-bench-openvino-{os.getpid()}"
OPENVINO_TOLERANCE = Tolerance(max_abs=0.05, min_psnr=40.0)  # issue 46's parity bar: same math, other kernels
INT8_TOLERANCE = Tolerance(max_abs=0.25, min_psnr=30.0)  # issue 58's bar for int8 weights against fp32
for _option in (
    Option("openvino", "RUNTIME=openvino: networks as OpenVINO graphs, converted at this load",
           load={**PLAIN, "runtime": "openvino", "openvino_cache": OPENVINO_BENCH_CACHE},
           refuse=_openvino_refusal, tolerance=OPENVINO_TOLERANCE),
    Option("openvino-cached", "RUNTIME=openvino, graphs read from the cache `openvino` wrote (a restart; "
           "OPENVINO_SHAPES=auto, the default)",
           load={**PLAIN, "runtime": "openvino", "openvino_cache": OPENVINO_BENCH_CACHE},
           refuse=_openvino_refusal, tolerance=OPENVINO_TOLERANCE),
    Option("openvino-dynamic", "RUNTIME=openvino OPENVINO_SHAPES=dynamic: one compiled graph for every batch and size "
           "(cached graphs)", load={**PLAIN, "runtime": "openvino", "openvino_cache": OPENVINO_BENCH_CACHE,
           "openvino_shapes": "dynamic"}, refuse=_openvino_refusal, tolerance=OPENVINO_TOLERANCE),
    Option("openvino-static", "RUNTIME=openvino OPENVINO_SHAPES=static: compiled per batch and size (cached graphs)",
           load={**PLAIN, "runtime": "openvino", "openvino_cache": OPENVINO_BENCH_CACHE, "openvino_shapes": "static"},
           refuse=_openvino_refusal, tolerance=OPENVINO_TOLERANCE),
    Option("openvino-int8", "RUNTIME=openvino OPENVINO_WEIGHTS=int8: NNCF int8 weights (converted at the first load)",
           load={**PLAIN, "runtime": "openvino", "openvino_cache": OPENVINO_BENCH_CACHE, "openvino_weights": "int8"},
           refuse=_openvino_refusal, tolerance=INT8_TOLERANCE),
    Option("openvino-w8a8", "RUNTIME=openvino OPENVINO_WEIGHTS=w8a8: the denoiser in int8 weights and activations "
           "(calibrated on the warm-up)", load={**PLAIN, "runtime": "openvino", "openvino_cache": OPENVINO_BENCH_CACHE,
           "openvino_weights": "w8a8"}, refuse=_openvino_refusal, tolerance=INT8_TOLERANCE),
):  # fmt: skip
    register(_option)


QUANTIZATION_HELP = (
    "also measure the model loaded with this QUANTIZATION spec (e.g. transformer=gguf:flux1-dev-Q4_K_S.gguf; "
    "docs/quantization.md) against it without"
)


def quantization_option(spec: str) -> Option:
    """The `--quantization SPEC` of `speed` and `parity`: the model loaded with QUANTIZATION=SPEC, as
    a user runs it (a downloaded GGUF of any type, K-quants included: "transformer=gguf:flux1-dev-Q4_K_S.gguf";
    torchao; bitsandbytes). pipelines.weights.quantization checks the spec and the device; a refusal is
    reported as this option's error. Not registered: the spec is this run's, not a named option."""
    return Option("quantization", f"QUANTIZATION={spec}", load={**PLAIN, "quantization": spec}, tolerance=QUANT_TOLERANCE)
