"""Quantized checkpoints: which quantization runs on which device, and why (issue 36).

A model asks for quantization per component, in its recipe (`"quantization"`) or in the settings
(`QUANTIZATION="transformer=torchao-int8wo,text_encoder_2=gguf:..."`, and `MODEL_ID=<file>.gguf`
with `BASE_MODEL=<diffusers folder or Hub id>` for the rest of the pipeline). This module only
decides: it validates the request, refuses at load what the device cannot run (naming the setting or
recipe field, the device and the reason), and builds diffusers' own objects (`GGUFQuantizationConfig`
+ `from_single_file`, `PipelineQuantizationConfig` with `TorchAoConfig` / `BitsAndBytesConfig`,
`enable_layerwise_casting`). The back-end packages (requirements-quant.txt) are imported only here,
only when a model asks for them.

| method | package | devices | why |
|---|---|---|---|
| gguf | gguf | cpu cuda rocm npu xpu mps | diffusers keeps GGUF blocks as uint8 and dequantizes each layer's weight with plain torch ops before the matmul (CUDA kernels are an optional speed-up), so it needs nothing the device lacks. Checked on CPU; NPU/MPS not run here |
| torchao-int8wo | torchao | cpu cuda rocm npu xpu mps | int8 weights with a per-row scale (torchao Int8Tensor); the matmul falls back to plain torch ops where torchao has no kernel. Checked on CPU; NPU/MPS not run here |
| bnb-nf4, bnb-int8 | bitsandbytes | cuda | bitsandbytes' NF4/LLM.int8 matmuls are CUDA kernels (see REFUSED for the rest) |
| fp8-layerwise | (torch) | cpu cuda rocm xpu | weights stored as float8_e4m3fn, each layer cast up to the compute dtype when it runs: needs only float8 storage and casts. Checked on CPU |
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.schema.errors import ModelLoadError

log = logging.getLogger(__name__)

ALL_DEVICES = frozenset({"cpu", "cuda", "rocm", "npu", "xpu", "mps"})


@dataclass(frozen=True)
class Method:
    name: str
    package: str  # the PyPI package it needs ("" = torch alone)
    devices: frozenset[str]
    why: str
    label: str  # what the model info reports


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("gguf", "gguf", ALL_DEVICES, "GGUF blocks dequantized per layer with torch ops", "gguf"),
        Method("torchao-int8wo", "torchao", ALL_DEVICES, "int8 weights, per-row scale, torch fallback matmul",
               "torchao int8 weight-only"),
        Method("bnb-nf4", "bitsandbytes", frozenset({"cuda"}), "CUDA kernels", "bitsandbytes nf4"),
        Method("bnb-int8", "bitsandbytes", frozenset({"cuda"}), "CUDA kernels", "bitsandbytes int8"),
        Method("fp8-layerwise", "", frozenset({"cpu", "cuda", "rocm", "xpu"}),
               "float8 storage, cast up per layer", "fp8 layerwise casting"),
    )
}  # fmt: skip

# (method family, device) -> why it is refused there; the message a user gets at load.
REFUSED: dict[tuple[str, str], str] = {
    ("bnb", "cpu"): "bitsandbytes' NF4/int8 matmuls are CUDA kernels (its CPU backend is partial and slow); "
    "use gguf or torchao-int8wo on the CPU",
    ("bnb", "rocm"): "the PyPI bitsandbytes wheels are CUDA builds; ROCm needs bitsandbytes' own ROCm build, "
    "not checked here; use gguf or torchao-int8wo",
    ("bnb", "npu"): "bitsandbytes has no Ascend kernels; use gguf or torchao-int8wo",
    ("bnb", "xpu"): "bitsandbytes' Intel XPU backend is experimental and not checked here; use gguf or torchao-int8wo",
    ("bnb", "mps"): "bitsandbytes has no Metal kernels; use gguf or torchao-int8wo",
    ("fp8-layerwise", "mps"): "MPS has no float8 dtype (moving a float8_e4m3fn tensor there raises); "
    "use gguf or torchao-int8wo",
    ("fp8-layerwise", "npu"): "float8 storage under torch_npu is not verified (Ascend 910B has no FP8 units); "
    "use gguf or torchao-int8wo",
}

PACKAGE_HINT = "install the quantization back ends: pip install -r requirements-quant.txt"


@dataclass(frozen=True)
class Request:
    """One component's quantization: `method` and, for gguf, the `file` (path or URL)."""

    component: str
    method: str
    file: str = ""
    where: str = ""  # the setting or recipe field that asked, for messages


@dataclass
class Plan:
    """The checked requests of one model, and after loading what really ran (per component)."""

    requests: tuple[Request, ...] = ()
    applied: dict[str, str] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.requests)


def parse_spec(raw: Any, where: str) -> tuple[Request, ...]:
    """Requests from a recipe's `quantization` object: `{component: "method" | {"method", "file"}}`;
    ValueError naming the field."""
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: expected an object {{component: method}}, got {raw!r}")
    out = []
    for component, spec in raw.items():
        key = f"{where}.{component}"
        if isinstance(spec, str):
            spec = {"method": spec}
        if not isinstance(spec, dict) or set(spec) - {"method", "file"}:
            raise ValueError(f'{key}: expected a method name or {{"method", "file"}}, got {spec!r}')
        out.append(_request(component, str(spec.get("method", "")), str(spec.get("file", "")), key))
    return tuple(out)


def parse_setting(text: str, where: str = "QUANTIZATION") -> tuple[Request, ...]:
    """Requests from `component=method[:file],...` (the QUANTIZATION setting); ValueError naming it."""
    out = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        component, sep, method = item.partition("=")
        if not sep or not component.strip():
            raise ValueError(f"{where}={text!r}: {item!r} is not component=method (e.g. transformer=torchao-int8wo)")
        method, _, file = method.strip().partition(":")
        out.append(_request(component.strip(), method, file, f"{where} ({component.strip()})"))
    return tuple(out)


def _request(component: str, method: str, file: str, where: str) -> Request:
    if method not in METHODS:
        raise ValueError(f"{where}: unknown quantization {method!r} (known: {', '.join(METHODS)})")
    if (method == "gguf") != bool(file):
        need = "needs a file (a .gguf path or URL)" if method == "gguf" else "takes no file"
        raise ValueError(f"{where}: {method} {need}")
    if file and not file.endswith(".gguf"):
        raise ValueError(f"{where}: {file!r} is not a .gguf file")
    return Request(component, method, file, where)


def merged(*groups: tuple[Request, ...]) -> tuple[Request, ...]:
    """Later groups (the settings) replace earlier ones (the recipe) component by component."""
    by_component: dict[str, Request] = {}
    for group in groups:
        by_component.update({r.component: r for r in group})
    return tuple(by_component.values())


def refusal(method: str, backend: str) -> str | None:
    """Why `method` cannot run on `backend`, or None when it can."""
    m = METHODS[method]
    if backend in m.devices:
        return None
    family = "bnb" if method.startswith("bnb-") else method
    return REFUSED.get((family, backend), f"{method} is not offered on {backend}")


def check(requests: tuple[Request, ...], backend: str) -> Plan:
    """A Plan for `backend`, or ModelLoadError naming the field, the device and why (before any
    download): device refusals, a missing back-end package, two pipeline-level back ends at once."""
    for r in requests:
        why = refusal(r.method, backend)
        if why:
            raise ModelLoadError(f"{r.where}: {r.method} is refused on this device ({backend}): {why}")
        package = METHODS[r.method].package
        if package and importlib.util.find_spec(package) is None:
            raise ModelLoadError(f"{r.where}: {r.method} needs the {package} package: {PACKAGE_HINT}")
    pipeline_level = {METHODS[r.method].package for r in requests if r.method.startswith(("bnb-", "torchao"))}
    if len(pipeline_level) > 1:
        raise ModelLoadError(
            f"{requests[0].where}: torchao and bitsandbytes in one model are refused: diffusers applies one "
            "pipeline-level back end per load"
        )
    return Plan(requests)


def resolve_files(plan: Plan, resolve) -> Plan:
    """The plan with the recipe's gguf files made absolute by `resolve` (relative to the recipe's folder;
    a file given in the settings stays relative to the working directory)."""
    requests = tuple(
        Request(r.component, r.method, resolve(r.file), r.where)
        if r.file and r.where.startswith("quantization.")
        else r
        for r in plan.requests
    )
    return Plan(requests)


def load_kwargs(plan: Plan, source: str, dtype: Any) -> dict[str, Any]:
    """`from_pretrained` keyword arguments: the GGUF components, loaded, and `quantization_config`."""
    if not plan:
        return {}
    index = _model_index(source, plan)
    kwargs: dict[str, Any] = {}
    mapping: dict[str, Any] = {}
    for r in plan.requests:
        library, class_name = index[r.component]
        if r.method == "gguf":
            kwargs[r.component] = _load_gguf(r, class_name, source, dtype)
            plan.applied[r.component] = describe_gguf(kwargs[r.component])
        elif r.method != "fp8-layerwise":
            mapping[r.component] = _config(r.method, library, dtype)
            plan.applied[r.component] = METHODS[r.method].label
        elif library != "diffusers":
            raise ModelLoadError(
                f"{r.where}: fp8-layerwise is refused for {r.component} ({library}.{class_name}): diffusers' "
                "enable_layerwise_casting exists on diffusers models only"
            )
    if mapping:
        from diffusers import PipelineQuantizationConfig

        kwargs["quantization_config"] = PipelineQuantizationConfig(quant_mapping=mapping)
    return kwargs


def _model_index(source: str, plan: Plan) -> dict[str, tuple[str, str]]:
    """component -> (library, class) from the base model's model_index.json; ModelLoadError naming
    a requested component the pipeline does not have."""
    from diffusers import DiffusionPipeline

    try:
        config = DiffusionPipeline.load_config(source)
    except Exception as exc:
        raise ModelLoadError(
            f"{plan.requests[0].where}: the base model {source!r} has no readable model_index.json "
            f"(quantization needs a diffusers folder or Hub id): {type(exc).__name__}: {exc}"
        ) from exc
    index = {k: tuple(v) for k, v in config.items() if isinstance(v, (list, tuple)) and len(v) == 2 and v[0]}
    for r in plan.requests:
        if r.component not in index:
            raise ModelLoadError(
                f"{r.where}: the model has no component {r.component!r} (it has: {', '.join(sorted(index))})"
            )
    return index


def _config(method: str, library: str, dtype: Any) -> Any:
    """diffusers' or transformers' config object for a pipeline-level method (by the component's library)."""
    module = importlib.import_module("transformers" if library == "transformers" else "diffusers")
    if method == "torchao-int8wo":
        from torchao.quantization import Int8WeightOnlyConfig

        return module.TorchAoConfig(Int8WeightOnlyConfig())
    if method == "bnb-nf4":
        return module.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_compute_dtype=dtype)
    return module.BitsAndBytesConfig(load_in_8bit=True)


def _load_gguf(r: Request, class_name: str, source: str, dtype: Any) -> Any:
    """`<Class>.from_single_file(file, GGUFQuantizationConfig)` with the base model's config; refused
    for classes diffusers cannot read from a single file."""
    import diffusers
    from diffusers.loaders.single_file_model import SINGLE_FILE_LOADABLE_CLASSES

    if class_name not in SINGLE_FILE_LOADABLE_CLASSES:
        raise ModelLoadError(
            f"{r.where}: gguf is refused for {r.component} ({class_name}): diffusers cannot load that class "
            "from a single file"
        )
    if "://" not in r.file and not Path(r.file).is_file():
        raise ModelLoadError(f"{r.where}: GGUF file not found: {r.file}")
    cls = getattr(diffusers, class_name)
    log.info("loading %s from GGUF %s", r.component, r.file)
    try:
        return cls.from_single_file(
            r.file, quantization_config=diffusers.GGUFQuantizationConfig(compute_dtype=dtype),
            config=source, subfolder=r.component, dtype=dtype,
        )  # fmt: skip
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ModelLoadError(
            f"{r.where}: could not load {r.file} as {class_name}: {type(exc).__name__}: {first}"
        ) from exc


def describe_gguf(module: Any) -> str:
    """What a GGUF-loaded model really holds, by tensor type ("gguf float32 x20, Q8_0 x12"): the file
    decides the types, not the request."""
    counts: dict[str, int] = {}
    for p in module.parameters():
        kind = getattr(getattr(p, "quant_type", None), "name", None) or str(p.dtype).removeprefix("torch.")
        counts[kind] = counts.get(kind, 0) + 1
    return "gguf " + ", ".join(f"{k} x{n}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1]))


def after_load(pipe: Any, plan: Plan, dtype: Any) -> None:
    """Layerwise fp8 casting (it needs the loaded model), then the report kept on the pipeline."""
    import torch

    for r in plan.requests:
        if r.method == "fp8-layerwise":
            getattr(pipe, r.component).enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=dtype)
            plan.applied[r.component] = f"{METHODS[r.method].label} (float8_e4m3fn, compute {str(dtype)[6:]})"
    pipe._quantization = dict(plan.applied)
    if plan.applied:
        log.info("quantization: %s", plan.applied)


def denoiser_file(plan: Plan) -> str | None:
    """The local GGUF file that holds the denoiser, if any: what names the model's weights (its
    A1111 model hash), since the base model's own denoiser is not what runs."""
    for r in plan.requests:
        if r.method == "gguf" and r.component in ("transformer", "unet") and Path(r.file).is_file():
            return r.file
    return None


def applied(pipe: Any) -> dict[str, str]:
    """component -> what quantization ran on it (empty for a plain model)."""
    return dict(getattr(pipe, "_quantization", {}) or {})


def component_bytes(pipe: Any) -> dict[str, int]:
    """component -> bytes of its parameters and buffers, quantized ones by their real storage."""
    import torch

    from devices.memory import tensor_bytes  # torch: imported when asked, as the module's other runtime parts

    out = {}
    for name, component in (getattr(pipe, "components", {}) or {}).items():
        if isinstance(component, torch.nn.Module):
            tensors = list(component.parameters()) + list(component.buffers())
            out[name] = sum(tensor_bytes(t) for t in tensors)
    return out
