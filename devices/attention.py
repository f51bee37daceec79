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
"""

from __future__ import annotations

import logging
from typing import Any

import torch

log = logging.getLogger(__name__)

DISPATCH_BACKENDS = {"vanilla": "_native_math", "sdpa": "native"}
TRANSFORMERS_IMPL = {"vanilla": "eager", "sdpa": "sdpa"}


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


def apply_attention(pipe: Any, attention: str) -> dict[str, str]:
    """Apply `attention` to every component of a pipeline (or to a single model)."""
    components = getattr(pipe, "components", None)
    if components is None and isinstance(pipe, torch.nn.Module):
        components = {type(pipe).__name__: pipe}
    applied: dict[str, str] = {}
    for name, component in (components or {}).items():
        if not isinstance(component, torch.nn.Module):
            continue
        try:
            result = apply_to_module(component, attention)
        except Exception as exc:
            log.warning("attention: could not switch %s to %s: %s; it keeps its own", name, attention, exc)
            applied[name] = f"unchanged ({exc})"
            continue
        if result is not None:
            applied[name] = result
    log.info("attention %s applied: %s", attention, applied)
    return applied
