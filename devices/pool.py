"""Which devices a pool of replicas uses: PREFERRED_DEVICE as a list, `all`, `<backend>:all`, CPU_REPLICAS.

    PREFERRED_DEVICE=cuda:0,cuda:1   two GPUs
    PREFERRED_DEVICE=npu:all         every visible Ascend NPU
    PREFERRED_DEVICE=all             every device of the best available backend
    PREFERRED_DEVICE=cpu,cpu         two CPU replicas (or PREFERRED_DEVICE=cpu CPU_REPLICAS=2)

Probed when called (never at import). A single device keeps DeviceManager's own rules (auto,
fallback with a warning); a list names devices exactly, so an unusable one is an error.
"""

from __future__ import annotations

import os

from . import backends
from .options import VALID_DEVICES, VALID_LISTS, parse_device


def _all_of(kind: str) -> list[str]:
    status = backends.probe(kind)
    if not status.available:
        raise ValueError(f"PREFERRED_DEVICE={kind}:all: {status.reason}")
    if status.name not in backends.INDEXED:  # one device, no index (cpu, mps, vulkan)
        return [status.name]
    prefix = "cuda" if status.name == "rocm" else status.name
    return [f"{prefix}:{i}" for i in range(status.device_count)]


def _check_usable(text: str, request) -> None:
    """A list names devices exactly: an unusable one is an error, never a silent CPU fallback."""
    status = backends.probe(request.kind)
    if not status.available:
        raise ValueError(f"PREFERRED_DEVICE={text!r}: {request} is not usable: {status.reason}")
    if request.index is not None and request.index >= status.device_count:
        raise ValueError(f"PREFERRED_DEVICE={text!r}: {request} requested but {status.device_count} device(s) visible")


def _best_backend() -> str:
    """The backend `auto` picks (the ones used only when asked for are passed over)."""
    return next(
        kind for kind in backends.PRIORITY if kind not in backends.ASKED_ONLY and backends.probe(kind).available
    )


def cpu_threads_each(workers: int) -> int:
    """torch's intra-op threads for each of `workers` CPU replicas or group workers sharing this machine: the
    cores divided between them (at least one)."""
    return max(1, (os.cpu_count() or 1) // workers)


def devices_for(preferred: str, cpu_replicas: int | None = None) -> list[str | None]:
    """The devices of the replicas for PREFERRED_DEVICE / CPU_REPLICAS (DeviceSettings' `preferred`
    and `cpu_replicas`, or a --device argument): [None] means one replica on DeviceManager's
    automatic choice."""
    text = preferred.strip().lower()
    if text == "all":
        devices: list[str | None] = list(_all_of(_best_backend()))
    elif text.endswith(":all"):
        devices = list(_all_of(text.removesuffix(":all")))
    elif "," in text:
        devices = _listed(preferred, text)
    else:
        parse_device(text or None)  # raises with the valid values
        devices = [None if text in ("", "auto") else text]  # None: DeviceManager's automatic choice
    if cpu_replicas and devices in (["cpu"], [None]) and (devices == ["cpu"] or _best_backend() == "cpu"):
        devices = ["cpu"] * cpu_replicas
    return devices


def _listed(value: str, text: str) -> list[str | None]:
    """A comma-separated list: every entry parsed first, then each must be usable."""
    devices: list[str | None] = [item.strip() for item in text.split(",")]
    for item in devices:
        try:
            request = parse_device(item)
        except ValueError:
            raise ValueError(
                f"PREFERRED_DEVICE={value or text!r}: {item!r} is not a device; "
                f"valid values: {VALID_DEVICES}, or {VALID_LISTS}"
            ) from None
        if request.kind == "auto":
            raise ValueError(f"PREFERRED_DEVICE={text!r}: 'auto' cannot be part of a list")
    for item in devices:
        _check_usable(text, parse_device(item))
    return devices
