"""Device options: what the user asked for, from arguments or the device settings.

`DeviceSettings` declares the device variables (PREFERRED_DEVICE, PREFERRED_DEVICE_STRICT,
CPU_REPLICAS, PARALLEL, REPLICA_PROCESSES, TORCH_DTYPE, DIFFUSERS_ATTENTION_TYPE, XLA_CPU_DEVICES: docs/settings.md lists them,
generated from it). Nothing here reads the environment: an entry point reads the section once
(`DeviceSettings.from_env(os.environ)`) and passes it down; `DeviceOptions` is one device's share.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated, Literal

import torch
from pydantic import BeforeValidator

from config import Accepts, Flag, Lower, Section, setting

from .parallel import VALID_PARALLEL, ParallelPlan, parse_parallel

BACKENDS = ("cuda", "rocm", "npu", "tpu", "xpu", "mps", "vulkan", "cpu")
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
VALID_DEVICES = "auto, cpu, cuda, cuda:N, rocm, npu, npu:N, tpu, tpu:N, xpu, xpu:N, mps, vulkan"
VALID_LISTS = "a comma-separated list of them (cuda:0,cuda:1), all, cuda:all, npu:all, xpu:all"
_DEVICE_RE = re.compile(r"^(auto|cpu|cuda|rocm|npu|tpu|xpu|mps|vulkan)(?::(\d+))?$")
_INDEXABLE = {"cuda", "npu", "tpu", "xpu"}


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


def parse_preferred(value: str) -> str:
    """PREFERRED_DEVICE's spelling: one device, a list of devices, `all` or `<backend>:all`, lower-cased.
    Whether those devices exist is probed later, when the pool is built (devices.pool.devices_for)."""
    text = value.strip().lower() or "auto"
    if text == "all" or (text.endswith(":all") and text.removesuffix(":all") in BACKENDS):
        return text
    items = [item.strip() for item in text.split(",")]
    requests = [parse_device(item) for item in items]  # ValueError: not a device
    if len(items) > 1 and any(r.kind == "auto" for r in requests):
        raise ValueError("'auto' cannot be part of a list")
    return ",".join(items)


@dataclass(frozen=True)
class DeviceOptions:
    """Everything one DeviceManager takes: one device's request, the dtype and attention overrides."""

    device: DeviceRequest
    dtype: torch.dtype | None
    attention: str | None
    strict: bool
    xla_cpu_devices: int = 0  # XLA_CPU_DEVICES: JAX's CPU stands in for that many TPU chips (0: never)

    @classmethod
    def for_device(cls, device: str | None, settings: DeviceSettings) -> DeviceOptions:
        """One device's options from the device settings (the pool gives each replica its device)."""
        return cls(parse_device(device), settings.dtype, settings.attention, settings.strict, settings.xla_cpu_devices)

    @classmethod
    def resolve(
        cls,
        preferred_device: str | None = None,
        dtype: str | torch.dtype | None = None,
        attention: str | None = None,
        strict: bool = False,
    ) -> DeviceOptions:
        """From arguments alone: None is the built-in policy (auto device, the dtype table, the
        attention policy), never the environment."""
        return cls(parse_device(preferred_device), parse_dtype(dtype), parse_attention(attention), strict)


Dtype = Annotated[
    torch.dtype | None,
    BeforeValidator(parse_dtype),
    Accepts("float32, float16 or bfloat16 (also fp32, fp16, half, bf16)", invalid=("float8", "int")),
]
Preferred = Annotated[
    str,
    BeforeValidator(parse_preferred),
    Accepts(f"{VALID_DEVICES}; or several: {VALID_LISTS}", invalid=("gpu", "cuda:x", "auto,cpu")),
]
Parallel = Annotated[
    ParallelPlan | None,
    BeforeValidator(parse_parallel),
    Accepts(VALID_PARALLEL, invalid=("ulysses:1", "pipeline:2", "tensor:x")),
]


class DeviceSettings(Section, title="Devices"):
    """The device variables, read once by an entry point and passed down (never re-read below).

    `preferred` is PREFERRED_DEVICE as given: one device, a list or `all` (devices.pool expands it,
    probing the hardware, when the backend is built).
    """

    preferred: Preferred = setting(
        "PREFERRED_DEVICE", "auto", "the device, or several devices with one replica each (docs/scale-out.md)"
    )
    strict: Flag = setting(
        "PREFERRED_DEVICE_STRICT", False, "on: stop instead of falling back when the device is unusable"
    )
    cpu_replicas: int | None = setting(
        "CPU_REPLICAS", None,
        "on the CPU (PREFERRED_DEVICE=cpu, or auto without an accelerator): that many replicas, the cores divided",
        shown="1", ge=1, le=64,
    )  # fmt: skip
    parallel: Parallel = setting(
        "PARALLEL", None,
        "one image across several devices: ulysses:N or ring:N (context parallel: the tokens split) or tensor:N "
        "(the weights split), N devices of PREFERRED_DEVICE per group; off = one device per image (docs/parallel.md)",
        shown="off",
    )  # fmt: skip
    replica_processes: Flag = setting(
        "REPLICA_PROCESSES", False,
        "on: each replica of the device pool runs in a process of its own, started and supervised by the app; "
        "CPU replicas then run at once instead of taking turns on Python's GIL (docs/scale-out.md); cpu, cuda, rocm, "
        "npu, xpu (a PARALLEL group runs in processes already)",
    )  # fmt: skip
    dtype: Dtype = setting("TORCH_DTYPE", None, "the dtype, instead of the device's table (below)", shown="per device")
    attention: Annotated[Literal[ATTENTION_TYPES] | None, Lower] = setting(
        "DIFFUSERS_ATTENTION_TYPE", None,
        "vanilla (plain matmul-softmax; any SDPA call limited to the math kernel), sdpa, or npu (Ascend's fused "
        "attention, docs/models.md), instead of the device's policy (below)",
        shown="per device",
    )  # fmt: skip
    xla_cpu_devices: int = setting(
        "XLA_CPU_DEVICES", 0,
        "N > 0: JAX's CPU device stands in for N TPU chips when PREFERRED_DEVICE=tpu (tests and CI, in the TPU "
        "venv: docs/devices.md#tpu-jax-through-torchax); never picked by auto",
        ge=0, le=64,
    )  # fmt: skip

    def options_for(
        self, device: str | None = None, dtype: str | torch.dtype | None = None, attention: str | None = None
    ) -> DeviceOptions:
        """One DeviceManager's options for a command line: its arguments win over these settings
        (`device` None: PREFERRED_DEVICE, which must then name one device)."""
        return DeviceOptions(
            parse_device(device if device is not None else self.preferred),
            parse_dtype(dtype) or self.dtype,
            parse_attention(attention) or self.attention,
            self.strict,
            self.xla_cpu_devices,
        )
