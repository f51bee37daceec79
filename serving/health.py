"""Replica health that recovers: the device self-test as the probe, re-tests with back-off.

Why: a replica that fails with anything but a request error used to be retired for good, so on a
machine or Space with one device one transient error (a CUDA/NPU runtime hiccup, a diffusers edge
case) left the app refusing every request until restart. Now a failure is judged by the device
self-test (`devices.selftest.probe`: matmul, conv, group norm, softmax and attention on the device,
in its dtype, against the CPU in fp32, well under a second):

| situation | what happens | why |
|---|---|---|
| the failed replica is the last healthy one | probed at once; kept when the probe passes | never leave the app with no device on one error the device itself does not reproduce |
| another replica is healthy | retired at once, re-tested in the background | the others serve meanwhile; a replica that errs once may err again |
| a retired replica | re-tested after 2 s, then 4, 8, ... up to 2 min; back when a test passes | a transient error clears; a dead device costs one short test per interval, not a busy loop |
| a model switch | every replica is rebuilt and healthy again | the new weights are a fresh start on each device |

The re-test runs on the replica's own device with the replica held (busy), so it never races a
generation or a model switch; `DevicePool.close` stops it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelines import ImagePipeline

log = logging.getLogger(__name__)

ProbeFn = Callable[["ImagePipeline"], "tuple[bool, str]"]


@dataclass(frozen=True)
class Retest:
    """When a retired replica is tested again: `first` seconds after it failed, then `factor` times
    longer after each failed test, never more than `cap` seconds apart."""

    first: float = 2.0
    factor: float = 2.0
    cap: float = 120.0

    def delay(self, failed_tests: int) -> float:
        return min(self.cap, self.first * self.factor**failed_tests)


def device_probe(pipeline: ImagePipeline) -> tuple[bool, str]:
    """The device self-test of the replica's device and dtype (no model involved)."""
    from devices.selftest import probe

    return probe(pipeline.dm)


def run_probe(probe: ProbeFn, pipeline: ImagePipeline, name: str) -> tuple[bool, str]:
    """`probe`, with an exception of the probe itself counted as a failed test (and logged)."""
    try:
        ok, detail = probe(pipeline)
    except Exception as exc:  # the device failing inside the test is a failed test, not a crash
        log.warning("self-test of %s raised: %s", name, exc, exc_info=exc)
        return False, f"{type(exc).__name__}: {exc}"
    log.info("self-test of %s: %s (%s)", name, "passed" if ok else "FAILED", detail)
    return ok, detail
