"""Device options: what the user asked for, read from arguments and the environment once.

Environment variables (all optional):
- PREFERRED_DEVICE: auto | cpu | cuda | cuda:N | rocm | npu | npu:N | xpu | xpu:N | mps
- PREFERRED_DEVICE_STRICT=1: raise instead of falling back when the device is unusable
- TORCH_DTYPE: float32 | float16 | bfloat16 (overrides the per-device dtype table)
- DIFFUSERS_ATTENTION_TYPE: vanilla | sdpa | npu (overrides the per-device attention policy;
  npu = Ascend's fused attention, explicit only)
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

import torch

BACKENDS = ("cuda", "rocm", "npu", "xpu", "mps", "cpu")
ATTENTION_TYPES = ("vanilla", "sdpa", "npu")
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}
VALID_DEVICES = "auto, cpu, cuda, cuda:N, rocm, npu, npu:N, xpu, xpu:N, mps"
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|rocm|npu|xpu|mps)(?::(\d+))?$")
_INDEXABLE = {"cuda", "npu", "xpu"}
_TRUE = {"1", "true", "yes", "on"}


@dataclass(frozen=True)
class DeviceRequest:
    """A parsed device request: `kind` is auto or a backend name, `index` None for "any"."""

    kind: str
    index: int | None = None

    def __str__(self) -> str:
        return self.kind if self.index is None else f"{self.kind}:{self.index}"


def parse_device(value: str | None) -> DeviceRequest:
    """Parse "CUDA:1 " and friends; raise ValueError listing the valid values otherwise."""
    text = (value or "auto").strip().lower()
    match = _DEVICE_RE.match(text)
    if not match or (match.group(2) is not None and match.group(1) not in _INDEXABLE):
        raise ValueError(f"invalid device {value!r}; valid values: {VALID_DEVICES}")
    index = int(match.group(2)) if match.group(2) is not None else None
    return DeviceRequest(match.group(1), index)


def parse_dtype(value: str | torch.dtype | None) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    text = value.strip().lower().removeprefix("torch.")
    if not text:
        return None
    if text not in DTYPES:
        raise ValueError(f"invalid dtype {value!r}; valid values: float32, float16, bfloat16")
    return DTYPES[text]


def parse_attention(value: str | None) -> str | None:
    if value is None or not value.strip():
        return None
    text = value.strip().lower()
    if text not in ATTENTION_TYPES:
        raise ValueError(f"invalid attention type {value!r}; valid values: {', '.join(ATTENTION_TYPES)}")
    return text


@dataclass(frozen=True)
class DeviceOptions:
    """Everything the DeviceManager takes from its caller and the environment."""

    device: DeviceRequest
    dtype: torch.dtype | None
    attention: str | None
    strict: bool

    @classmethod
    def for_device(cls, device: str | None, settings: DeviceSettings) -> DeviceOptions:
        """One device's options from the app's settings (no environment read)."""
        return cls(parse_device(device), settings.dtype, settings.attention, settings.strict)

    @classmethod
    def resolve(
        cls,
        preferred_device: str | None = None,
        dtype: str | torch.dtype | None = None,
        attention: str | None = None,
        environ: dict[str, str] | None = None,
    ) -> DeviceOptions:
        """Arguments win over the environment; the environment wins over the built-in policy."""
        env = os.environ if environ is None else environ
        return cls(
            device=parse_device(preferred_device if preferred_device is not None else env.get("PREFERRED_DEVICE")),
            dtype=parse_dtype(dtype if dtype is not None else env.get("TORCH_DTYPE")),
            attention=parse_attention(attention if attention is not None else env.get("DIFFUSERS_ATTENTION_TYPE")),
            strict=env.get("PREFERRED_DEVICE_STRICT", "").strip().lower() in _TRUE,
        )


@dataclass(frozen=True)
class DeviceSettings:
    """The device variables, read once by the app's settings and passed down (never re-read below).

    `preferred` is PREFERRED_DEVICE as given: one device, a list or `all` (devices.pool expands it,
    probing the hardware, when the backend is built); `cpu_replicas` is CPU_REPLICAS.
    """

    preferred: str = "auto"
    cpu_replicas: int | None = None
    dtype: torch.dtype | None = None  # TORCH_DTYPE; None: the device's dtype table
    attention: str | None = None  # DIFFUSERS_ATTENTION_TYPE; None: the device's policy
    strict: bool = False  # PREFERRED_DEVICE_STRICT

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> DeviceSettings:
        """Parse the variables; ValueError naming the variable and what it accepts."""
        env = os.environ if environ is None else environ
        replicas = env.get("CPU_REPLICAS", "").strip()
        if replicas and (not replicas.isdigit() or not 1 <= int(replicas) <= 64):
            raise ValueError(f"CPU_REPLICAS={replicas!r} is not valid: expected an integer from 1 to 64")
        try:
            dtype = parse_dtype(env.get("TORCH_DTYPE"))
        except ValueError as exc:
            raise ValueError(f"TORCH_DTYPE: {exc}") from None
        try:
            attention = parse_attention(env.get("DIFFUSERS_ATTENTION_TYPE"))
        except ValueError as exc:
            raise ValueError(f"DIFFUSERS_ATTENTION_TYPE: {exc}") from None
        return cls(
            preferred=env.get("PREFERRED_DEVICE", "").strip().lower() or "auto",
            cpu_replicas=int(replicas) if replicas else None,
            dtype=dtype,
            attention=attention,
            strict=env.get("PREFERRED_DEVICE_STRICT", "").strip().lower() in _TRUE,
        )
