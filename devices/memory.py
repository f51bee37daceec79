"""Memory figures per backend, preferring torch's device-neutral `torch.accelerator` API.

Every figure is bytes or None ("this backend cannot tell"). On CPU the device memory *is*
host memory, so `allocated` is the process's resident set and `peak` its high-water mark
(Linux VmHWM, which `reset_peak` clears through /proc/self/clear_refs). Some kernels accept that
write and keep the old mark (seen on the CI machine: a 64 MiB allocation after a reset did not
move the peak); `reset_peak` tells its caller, which then keeps a peak of its own.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import Any

import psutil
import torch

from .backends import torch_namespace

log = logging.getLogger(__name__)

MEMORY_KEYS = ("allocated", "reserved", "peak", "total", "free")
HOST_KEYS = ("host_rss", "host_total", "host_available")
STATS_KEYS = ("backend", "device_name", *MEMORY_KEYS, *HOST_KEYS)  # DeviceManager.memory_stats()


def _accelerator_matches(device: torch.device) -> bool:
    """True when torch.accelerator drives exactly this device type (it raises when none exists)."""
    acc = getattr(torch, "accelerator", None)
    try:
        return bool(acc and acc.is_available() and acc.current_accelerator().type == device.type)
    except Exception:
        return False


def _try(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as exc:
        log.debug("memory query failed: %s", exc)
        return None


def _first(*calls: Callable[[], Any]) -> Any:
    """The first call that answers (not None, no exception)."""
    for call in calls:
        value = _try(call)
        if value is not None:
            return value
    return None


CLEAR_REFS = "/proc/self/clear_refs"  # "5" resets the process's peak RSS (VmHWM); see proc(5)
RESET_SLACK = 16 * 1024 * 1024  # RSS may grow a little between the reset and the check


def _proc_status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def tensor_bytes(t: Any) -> int:
    """Bytes a tensor really stores: a tensor subclass (torchao) by its inner tensors, a GGUF
    parameter by its uint8 blocks, anything else by numel x element size."""
    flatten = getattr(type(t), "__tensor_flatten__", None)
    if flatten is not None and type(t).__name__ not in ("Parameter", "Tensor", "GGUFParameter"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names if getattr(t, n, None) is not None)
    return t.numel() * t.element_size()


def module_bytes(module: torch.nn.Module) -> int:
    """A module's parameters' bytes as stored (quantized ones included: `tensor_bytes`)."""
    return sum(tensor_bytes(p) for p in module.parameters())


def device_memory(backend: str, device: torch.device) -> dict[str, int | None]:
    """allocated/reserved/peak/total/free for one device."""
    if backend == "tpu":
        return _jax_memory(device.index or 0)
    if backend == "cpu":
        vm = psutil.virtual_memory()
        rss = resident_bytes()
        hwm = _proc_status_kb("VmHWM")
        return {
            "allocated": rss,
            "reserved": None,
            "peak": max(hwm, rss) if hwm is not None else None,  # a kernel whose mark lags is never below today's use
            "total": vm.total,
            "free": vm.available,
        }
    index = device.index or 0
    acc = torch.accelerator if _accelerator_matches(device) else None
    mod = torch_namespace(backend)
    if backend == "mps":
        total = _try(lambda: mod.recommended_max_memory())
        reserved = _try(lambda: mod.driver_allocated_memory())
        return {
            "allocated": _try(lambda: mod.current_allocated_memory()),
            "reserved": reserved,
            "peak": None,  # MPS keeps no high-water mark
            "total": total,
            "free": max(0, total - reserved) if total is not None and reserved is not None else None,
        }
    info = _first(lambda: acc.get_memory_info(index), lambda: mod.mem_get_info(index))
    free, total = (int(info[0]), int(info[1])) if info is not None else (None, None)
    if total is None:
        total = _try(lambda: mod.get_device_properties(index).total_memory)
    return {
        "allocated": _first(lambda: acc.memory_allocated(index), lambda: mod.memory_allocated(index)),
        "reserved": _first(lambda: acc.memory_reserved(index), lambda: mod.memory_reserved(index)),
        "peak": _first(lambda: acc.max_memory_allocated(index), lambda: mod.max_memory_allocated(index)),
        "total": total,
        "free": free,
    }


def _jax_memory(index: int) -> dict[str, int | None]:
    """A JAX device's figures (devices/xla.py): in use, peak since start (JAX has no reset), limit."""
    from .xla import xla_memory

    m = _try(lambda: xla_memory(index)) or {}
    used, total = m.get("allocated"), m.get("total")
    free = total - used if total is not None and used is not None else None
    return {"allocated": used, "reserved": None, "peak": m.get("peak"), "total": total, "free": free}


def _jax_synchronize(index: int) -> None:
    """Wait for the JAX device's queued work: a device executes its programs in order, so a tiny one
    enqueued now is done only after everything before it."""
    import jax

    jax.device_put(0.0, jax.devices()[index]).block_until_ready()


def resident_bytes() -> int:
    """The process's resident set (the CPU's `allocated`): one read, cheap enough for every step."""
    return _process(os.getpid()).memory_info().rss


@functools.lru_cache(maxsize=1)
def _process(pid: int) -> psutil.Process:
    """This process's psutil handle, made once per pid (a new one each read costs 3x the read)."""
    return psutil.Process(pid)


def host_memory() -> dict[str, int]:
    vm = psutil.virtual_memory()
    return {"host_rss": resident_bytes(), "host_total": vm.total, "host_available": vm.available}


def _call_backend(backend: str, device: torch.device, name: str, *args: Any) -> None:
    """Call torch.accelerator.<name> or torch.<backend>.<name>; never torch.cuda on another backend."""
    if backend in ("cpu", "tpu"):  # nothing to call: host memory; XLA's allocator frees with its arrays
        return
    if _accelerator_matches(device) and hasattr(torch.accelerator, name):
        getattr(torch.accelerator, name)(*args)
        return
    fn = getattr(torch_namespace(backend), name, None)
    if fn is None:
        log.debug("%s has no %s()", backend, name)
        return
    fn(*args)


def empty_cache(backend: str, device: torch.device) -> None:
    _call_backend(backend, device, "empty_cache")


def synchronize(backend: str, device: torch.device) -> None:
    if backend == "tpu":
        _jax_synchronize(device.index or 0)
    elif backend == "mps":  # torch.mps.synchronize takes no device index
        _call_backend(backend, device, "synchronize")
    else:
        _call_backend(backend, device, "synchronize", *([device.index] if device.index is not None else []))


def reset_peak(backend: str, device: torch.device) -> bool:
    """Start a new peak; False when the backend kept its old one (the caller then tracks its own)."""
    if backend == "cpu":
        return _reset_cpu_peak()
    if backend not in ("mps", "tpu"):  # MPS keeps no peak at all; JAX's peak runs from the start
        _call_backend(backend, device, "reset_peak_memory_stats", device.index or 0)
    return True


def _reset_cpu_peak() -> bool:
    try:
        with open(CLEAR_REFS, "w", encoding="ascii") as f:
            f.write("5")
    except OSError as exc:
        log.info("cannot reset the CPU peak (VmHWM): %s; the peak is sampled at memory reads", exc)
        return False
    peak, rss = _proc_status_kb("VmHWM"), resident_bytes()
    if peak is None or peak > rss + RESET_SLACK:
        log.info("this kernel kept VmHWM after %s; the CPU peak is sampled at memory reads", CLEAR_REFS)
        return False
    return True


def human_bytes(value: int | None) -> str:
    if value is None:
        return "n/a"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
