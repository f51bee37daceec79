"""Simulated accelerators, at torch's level, for machines that have none.

Each helper patches the functions torch itself exposes (`torch.cuda.is_available`,
`torch.version.hip`, `torch.xpu.*`, `torch.backends.mps.*`, a fake `torch_npu` module and a
`torch.npu` namespace), which is exactly what the DeviceManager reads at construction.
"""

from __future__ import annotations

import sys
import types

import pytest
import torch

GiB = 1024**3

# `torch.device("npu")` needs the PrivateUse1 backend renamed, which is process-wide and
# cannot be undone; afterwards torch.accelerator (called by diffusers at import) looks for a
# `torch.npu` module. So rename once, for the whole session, and keep an "absent" stub there.
if torch._C._get_privateuse1_backend_name() != "npu":
    torch.utils.rename_privateuse1_backend("npu")
NPU_ABSENT = types.SimpleNamespace(
    is_available=lambda: False, device_count=lambda: 0, _is_in_bad_fork=lambda: False, manual_seed_all=lambda seed: None
)
if getattr(torch, "npu", None) is None:
    torch.npu = NPU_ABSENT
UNCACHED_GET_DEVICE_MODULE = getattr(torch.get_device_module, "__wrapped__", torch.get_device_module)


class Calls(list):
    """Records which fake device functions were called."""

    def fn(self, name: str, result=None):
        def call(*args, **kwargs):
            self.append(name)
            return result

        return call


def no_accelerators(mp: pytest.MonkeyPatch) -> None:
    """Start from a machine with nothing but a CPU, whatever this one really has."""
    mp.setattr(torch.cuda, "is_available", lambda: False)
    mp.setattr(torch.cuda, "device_count", lambda: 0)
    mp.setattr(torch.version, "hip", None, raising=False)
    mp.setattr(torch.xpu, "is_available", lambda: False)
    mp.setattr(torch.backends.mps, "is_available", lambda: False)
    mp.setattr(torch, "is_vulkan_available", lambda: False)
    mp.setitem(sys.modules, "torch_npu", None)  # `import torch_npu` raises ImportError
    mp.setattr(torch, "npu", NPU_ABSENT)
    mp.setattr(torch, "get_device_module", UNCACHED_GET_DEVICE_MODULE)  # see _route_accelerator
    for var in ("PREFERRED_DEVICE", "PREFERRED_DEVICE_STRICT", "TORCH_DTYPE", "DIFFUSERS_ATTENTION_TYPE"):
        mp.delenv(var, raising=False)


def device_namespace(calls: Calls, count: int, name: str, bf16: bool, free=20 * GiB, total=64 * GiB):
    """Functions shared by torch.cuda / torch.npu / torch.xpu, returning fixed figures."""
    return dict(
        _is_in_bad_fork=lambda: False,
        manual_seed_all=lambda seed: None,
        is_available=lambda: count > 0,
        device_count=lambda: count,
        get_device_name=lambda i=0: f"{name} #{i}",
        is_bf16_supported=lambda *a, **k: bf16,
        mem_get_info=calls.fn("mem_get_info", (free, total)),
        memory_allocated=calls.fn("memory_allocated", 3 * GiB),
        memory_reserved=calls.fn("memory_reserved", 4 * GiB),
        max_memory_allocated=calls.fn("max_memory_allocated", 5 * GiB),
        empty_cache=calls.fn("empty_cache"),
        synchronize=calls.fn("synchronize"),
        reset_peak_memory_stats=calls.fn("reset_peak_memory_stats"),
    )


def fake_cuda(mp, count=1, bf16=True, hip: str | None = None, name="NVIDIA H100") -> Calls:
    calls = Calls()
    for attr, value in device_namespace(calls, count, name, bf16).items():
        mp.setattr(torch.cuda, attr, value)
    mp.setattr(torch.version, "hip", hip, raising=False)
    return calls


def fake_xpu(mp, count=1, name="Intel Arc A770") -> Calls:
    calls = Calls()
    for attr, value in device_namespace(calls, count, name, True).items():
        mp.setattr(torch.xpu, attr, value)
    return calls


def fake_vulkan(mp) -> None:
    """A torch built with USE_VULKAN=1 on a machine with a Vulkan driver (torch's own probe says yes)."""
    mp.setattr(torch, "is_vulkan_available", lambda: True)


def fake_mps(mp) -> Calls:
    calls = Calls()
    mp.setattr(torch.backends.mps, "is_built", lambda: True)
    mp.setattr(torch.backends.mps, "is_available", lambda: True)
    mp.setattr(torch.mps, "current_allocated_memory", calls.fn("current_allocated_memory", 2 * GiB))
    mp.setattr(torch.mps, "driver_allocated_memory", calls.fn("driver_allocated_memory", 3 * GiB))
    mp.setattr(torch.mps, "recommended_max_memory", calls.fn("recommended_max_memory", 16 * GiB))
    mp.setattr(torch.mps, "empty_cache", calls.fn("empty_cache"))
    mp.setattr(torch.mps, "synchronize", calls.fn("synchronize"))
    return calls


def fake_npu(mp, count=1, bf16=True, name="Ascend910B3", import_error: Exception | None = None) -> Calls:
    """A `torch_npu` module plus a `torch.npu` namespace, as torch_npu provides them."""
    calls = Calls()
    if import_error is not None:
        mp.delitem(sys.modules, "torch_npu", raising=False)
        mp.setattr("importlib.import_module", _failing_import("torch_npu", import_error))
        return calls
    module = types.ModuleType("torch_npu")
    module.__spec__ = types.SimpleNamespace(name="torch_npu", loader=None, origin="fake")
    mp.setitem(sys.modules, "torch_npu", module)
    namespace = device_namespace(calls, count, name, bf16)
    mp.setattr(torch, "npu", types.SimpleNamespace(**namespace), raising=False)
    _route_accelerator(mp, namespace)
    return calls


# torch.accelerator's memory calls go to the allocator torch_npu registers, which a fake cannot
# register (torch raises "Allocator for npu is not a DeviceAllocator"); route them to the fake
# namespace, as the real allocator serves them from the same device.
_ACCELERATOR_CALLS = {
    "empty_cache": "empty_cache",
    "synchronize": "synchronize",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "memory_allocated": "memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_allocated": "max_memory_allocated",
    "get_memory_info": "mem_get_info",
}


def _route_accelerator(mp, namespace: dict) -> None:
    # torch.get_device_module is functools.cache'd: whichever torch.npu the first caller saw
    # (the absent stub or a fake) would answer for the rest of the session. Uncached while faked.
    mp.setattr(torch, "get_device_module", UNCACHED_GET_DEVICE_MODULE)
    for accelerator_name, fake_name in _ACCELERATOR_CALLS.items():
        mp.setattr(torch.accelerator, accelerator_name, namespace[fake_name], raising=False)


def _failing_import(target: str, error: Exception):
    import importlib

    real = importlib.import_module

    def import_module(name, *args, **kwargs):
        if name == target:
            raise error
        return real(name, *args, **kwargs)

    return import_module
