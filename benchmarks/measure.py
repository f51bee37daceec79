"""Timing helpers that are correct on accelerators (synchronize before reading the clock)."""

from __future__ import annotations

import argparse
import platform
import statistics
import threading
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


def wall_of_threads(calls: list[Callable[[], Any]]) -> float:
    """Seconds from starting each call in a thread of its own until the last one ends (calls at once)."""
    threads = [threading.Thread(target=call) for call in calls]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - began


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


def variants_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of a benchmark that alternates variants of one request (`alternate`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default=None)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    return parser


def ratios(times: dict[str, list[float]], base: str, width: int = 9) -> dict[str, dict[str, float]]:
    """Each variant's median and its ratio to `base`'s, printed a line each."""
    reference = statistics.median(times[base])
    report = {
        name: {"median_s": statistics.median(t), "ratio": statistics.median(t) / reference} for name, t in times.items()
    }
    for name, r in report.items():
        print(f"{name:>{width}}: {r['median_s']:.3f} s  {r['ratio']:.3f}x")
    return report
