"""Attention policy: make "vanilla" and "sdpa" really change what runs, per component.

Three kinds of components carry attention in a diffusers pipeline:
- UNet/VAE-style models with classic processors (`AttnProcessor2_0` and friends): swapped
  with `set_attn_processor` (vanilla = `AttnProcessor`, the plain matmul-softmax path).
- Transformer models whose processors call diffusers' attention dispatcher (Flux, Wan,
  QwenImage...; their processors carry `_attention_backend`): `set_attention_backend`,
  vanilla = "_native_math", sdpa = "native". `set_attention_backend` does nothing for
  classic processors, which is why both paths exist.
- transformers text encoders: `set_attn_implementation("eager" | "sdpa")`.
Anything that has attention but cannot be switched is logged and reported, never skipped silently.

Processor swaps cannot reach everything: SD3's `JointAttnProcessor2_0`, Sana's processors have
no vanilla twin, and HiDream's transformer or Qwen-Image's VAE call
`F.scaled_dot_product_attention` themselves. So "vanilla" also runs the whole pipeline call
inside `torch.nn.attention.sdpa_kernel(SDPBackend.MATH)` (`math_only()`), the mechanism of
diffusers' own `_native_math` backend: any SDPA call, wherever it is, takes the math kernel.
Those flags are process-wide in torch, so `math_only` is reference-counted across threads.

"npu" (DIFFUSERS_ATTENTION_TYPE=npu) selects Ascend's fused attention: `AttnProcessorNPU`
for classic processors and the dispatcher's `_native_npu` backend (torch_npu.npu_fusion_attention);
text encoders use sdpa. It is an explicit choice: the NPU default stays vanilla.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any

import torch

log = logging.getLogger(__name__)

DISPATCH_BACKENDS = {"vanilla": "_native_math", "sdpa": "native", "npu": "_native_npu"}
TRANSFORMERS_IMPL = {"vanilla": "eager", "sdpa": "sdpa", "npu": "sdpa"}
MATH_NOTE = "SDPA calls limited to the math kernel"


class _MathOnly:
    """`sdpa_kernel(SDPBackend.MATH)` held while at least one vanilla call runs, in any thread.

    torch keeps the SDPA backend flags process-wide: a plain `with sdpa_kernel(...)` per call
    would let the first of two overlapping calls restore the fused kernels under the second.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._stack: contextlib.ExitStack | None = None

    def __enter__(self) -> None:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with self._lock:
            if self._users == 0:
                self._stack = contextlib.ExitStack()
                self._stack.enter_context(sdpa_kernel(SDPBackend.MATH))
            self._users += 1

    def __exit__(self, *_exc: object) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0 and self._stack is not None:
                self._stack.close()
                self._stack = None


_MATH_ONLY = _MathOnly()


def call_context(attention: str) -> contextlib.AbstractContextManager:
    """The context a pipeline call runs in: math-only SDPA for vanilla, nothing otherwise."""
    return _MATH_ONLY if attention == "vanilla" else contextlib.nullcontext()


def check_npu_attention() -> None:
    """Raise a clear error when Ascend's fused attention cannot run (before any model loads)."""
    try:
        import torch_npu
    except ImportError as exc:
        raise RuntimeError(f"DIFFUSERS_ATTENTION_TYPE=npu needs torch_npu: {exc}") from exc
    if not hasattr(torch_npu, "npu_fusion_attention"):
        version = getattr(torch_npu, "__version__", "?")
        raise RuntimeError(
            f"DIFFUSERS_ATTENTION_TYPE=npu: this torch_npu ({version}) has no npu_fusion_attention; "
            "upgrade torch_npu/CANN or use DIFFUSERS_ATTENTION_TYPE=vanilla|sdpa"
        )


def _classic_processor(model: Any, attention: str) -> Any:
    from diffusers.models.attention_processor import (
        ADDED_KV_ATTENTION_PROCESSORS,
        CROSS_ATTENTION_PROCESSORS,
        AttnAddedKVProcessor,
        AttnAddedKVProcessor2_0,
        AttnProcessor,
        AttnProcessor2_0,
    )

    kinds = {type(p) for p in model.attn_processors.values()}
    if kinds <= set(CROSS_ATTENTION_PROCESSORS) and attention == "npu":
        from diffusers.models.attention_processor import AttnProcessorNPU

        return AttnProcessorNPU()
    if kinds <= set(CROSS_ATTENTION_PROCESSORS):
        return AttnProcessor() if attention == "vanilla" else AttnProcessor2_0()
    if kinds <= set(ADDED_KV_ATTENTION_PROCESSORS):
        return AttnAddedKVProcessor() if attention == "vanilla" else AttnAddedKVProcessor2_0()
    raise TypeError("custom attention processors " + ", ".join(sorted(k.__name__ for k in kinds)))


def apply_to_module(model: torch.nn.Module, attention: str) -> str | None:
    """Switch one module; returns what was set, None if it has no attention. Raises if it cannot."""
    processors = getattr(model, "attn_processors", None)
    if processors:
        if any(hasattr(p, "_attention_backend") for p in processors.values()):
            backend = DISPATCH_BACKENDS[attention]
            model.set_attention_backend(backend)
            return f"attention backend {backend}"
        processor = _classic_processor(model, attention)
        model.set_attn_processor(processor)
        return type(processor).__name__
    if hasattr(model, "set_attn_implementation") and hasattr(model, "config"):
        impl = TRANSFORMERS_IMPL[attention]
        model.set_attn_implementation(impl)
        return f"attn_implementation {impl}"
    return None


def _has_own_attention(model: torch.nn.Module) -> bool:
    """Attention modules with nothing to switch (they call SDPA themselves, e.g. HiDream's transformer)."""
    return any("Attention" in type(m).__name__ or "Attn" in type(m).__name__ for m in model.modules())


def _switch(name: str, component: torch.nn.Module, attention: str) -> str | None:
    note = f"; {MATH_NOTE}" if attention == "vanilla" else ""
    try:
        result = apply_to_module(component, attention)
    except TypeError as exc:  # its own processor classes: nothing to swap to
        log.warning("attention: %s keeps its %s%s", name, exc, note)
        return f"unchanged: {exc}{note}"
    except (RuntimeError, ValueError, ImportError) as exc:
        if attention == "npu":
            raise RuntimeError(f"DIFFUSERS_ATTENTION_TYPE=npu: {name}: {exc}") from exc
        log.warning("attention: could not switch %s to %s: %s", name, attention, exc)
        current = getattr(getattr(component, "config", None), "_attn_implementation", None)
        if current:  # a transformers model without that implementation (Gemma 2 has no sdpa)
            return f"attn_implementation {current} ({attention} not supported by {type(component).__name__}){note}"
        return f"unchanged ({str(exc).splitlines()[0][:120]}){note}"
    if result is None and _has_own_attention(component):
        log.info("attention: %s has its own attention and no processors to switch%s", name, note)
        return f"own attention, not switchable{note}"
    return result


def apply_attention(pipe: Any, attention: str) -> dict[str, str]:
    """Apply `attention` to every component of a pipeline (or to a single model); returns, per
    component, what it now runs, including those that could not be switched."""
    components = getattr(pipe, "components", None)
    if components is None and isinstance(pipe, torch.nn.Module):
        components = {type(pipe).__name__: pipe}
    applied: dict[str, str] = {}
    for name, component in (components or {}).items():
        if isinstance(component, torch.nn.Module):
            result = _switch(name, component, attention)
            if result is not None:
                applied[name] = result
    log.info("attention %s applied: %s", attention, applied)
    return applied


def describe(pipe: Any, applied: dict[str, str]) -> dict[str, str]:
    """What each component runs now: processors read back (a memory saver may have swapped them
    after `apply_attention`), else what `apply_attention` reported."""
    out = dict(applied)
    for name, component in (getattr(pipe, "components", None) or {}).items():
        processors = getattr(component, "attn_processors", None)
        if not processors or any(hasattr(p, "_attention_backend") for p in processors.values()):
            continue
        kinds = ", ".join(sorted({type(p).__name__ for p in processors.values()}))
        previous = out.get(name, "")
        out[name] = kinds + (f"; {MATH_NOTE}" if MATH_NOTE in previous else "")
    return out
