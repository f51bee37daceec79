"""Timing helpers that are correct on accelerators (synchronize before reading the clock)."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from devices import DeviceManager


def timed(dm: DeviceManager, fn: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds `fn` takes on the device (queued work included), and its result."""
    dm.synchronize()
    start = time.perf_counter()
    result = fn()
    dm.synchronize()
    return time.perf_counter() - start, result


def summary(samples: list[float]) -> dict[str, float]:
    """Median and spread (min, max, relative half-range) of repeated timings."""
    med = statistics.median(samples)
    return {
        "median": med,
        "min": min(samples),
        "max": max(samples),
        "spread": (max(samples) - min(samples)) / (2 * med) if med else 0.0,
        "n": len(samples),
    }


def alternate(dm: DeviceManager, fns: dict[str, Callable[[], Any]], repeats: int) -> dict[str, list[float]]:
    """Run the functions in turn, reversing the order every round (A B, B A, A B ...), so that
    drifts in machine load and "who runs first" effects hit all of them alike."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for round_ in range(repeats):
        for name in order if round_ % 2 == 0 else reversed(order):
            times[name].append(timed(dm, fns[name])[0])
    return times


def report_header(dm: DeviceManager, model: str, steps: int) -> dict:
    """Where the figures were measured: device, dtype, attention, threads, versions, date."""
    return {
        "device": str(dm.device),
        "backend": dm.backend,
        "device_name": dm.device_name,
        "dtype": dm.dtype_name,
        "attention": dm.attention,
        "torch_threads": torch.get_num_threads(),
        "model": model,
        "steps": steps,
        "torch": torch.__version__,
        "platform": platform.platform(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "results": {},
    }
