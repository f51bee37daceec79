"""The Ray Serve deployment: one ImagePipeline per replica, one generation at a time per replica.

Each replica reserves one accelerator through Ray's own resources (`num_gpus` for CUDA/ROCm/XPU,
`resources={"NPU": 1}` for Ascend, which Ray detects itself) or CPUs, and finds its device from what
Ray assigned (Ray sets CUDA_VISIBLE_DEVICES / ASCEND_RT_VISIBLE_DEVICES, so it is always index 0).

`generate` streams events: ("progress", (done, total, image)) per step, then ("result", result) or
("error", exception). Cancel is cooperative, as in-process: the caller marks the request in the
StatusBoard actor and the replica's `should_cancel` sees it at the next step, so what finished is
returned. The replicas report what they do (and a heartbeat) to the StatusBoard, which answers
`/status` without queueing behind a busy replica (max_ongoing_requests=1).
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any

from ray import serve

from devices import DeviceManager
from pipelines import ImagePipeline

log = logging.getLogger(__name__)

APP_NAME = "diffusion-anywhere"
BOARD_NAME = "diffusion-anywhere-status"
HEARTBEAT_S = 2.0


def replica_device() -> str:
    """The device Ray gave this replica: its visible accelerator (index 0), else the CPU."""
    import ray

    if ray.get_gpu_ids():
        return "xpu" if os.environ.get("RAY_DEVICE_KIND") == "xpu" else "cuda"
    if os.environ.get("ASCEND_RT_VISIBLE_DEVICES"):
        return "npu"
    return "cpu"


class StatusBoard:
    """A tiny Ray actor: what each replica is doing, and which requests were cancelled."""

    def __init__(self):
        self.rows: dict[str, dict[str, Any]] = {}
        self.cancelled: dict[str, float] = {}

    def report(self, replica: str, row: dict[str, Any]) -> None:
        self.rows[replica] = {**row, "seen": time.time()}

    def snapshot(self) -> dict[str, dict[str, Any]]:
        return dict(self.rows)

    def cancel(self, token: str) -> None:
        now = time.time()
        self.cancelled = {k: t for k, t in self.cancelled.items() if now - t < 3600}
        self.cancelled[token] = now

    def is_cancelled(self, token: str) -> bool:
        return token in self.cancelled


@serve.deployment(max_ongoing_requests=1)
class GenerationReplica:
    """One model on one device; streams progress, then the result."""

    def __init__(self, model: str | None, options: dict[str, Any], threads: int | None = None):
        import ray
        import torch

        if threads:
            torch.set_num_threads(threads)
        self.dm = DeviceManager(replica_device())
        self.pipeline = ImagePipeline.from_pretrained(model, self.dm, **options)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.board = ray.get_actor(BOARD_NAME, namespace="serve")
        self._stop = threading.Event()
        threading.Thread(target=self._heartbeat, daemon=True, name="heartbeat").start()

    def _row(self) -> dict[str, Any]:
        return self.pipeline.status()[0].to_dict()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            self.board.report.remote(self.replica, self._row())

    def model_info(self):
        return self.pipeline.model_info()

    def generate(self, request, token: str):
        """Events for one request (see the module docstring)."""
        import ray

        events: queue.Queue = queue.Queue()

        def progress(done: int, total: int, image: int) -> None:
            events.put(("progress", (done, total, image)))
            self.board.report.remote(self.replica, self._row())

        def cancelled() -> bool:
            return ray.get(self.board.is_cancelled.remote(token))

        def work() -> None:
            try:
                result = self.pipeline.generate(request, progress=progress, should_cancel=cancelled)
                for meta in result.metadata:
                    meta["replica"] = self.replica
                events.put(("result", result))
            except Exception as exc:  # handed to the caller with its type and message
                events.put(("error", exc))

        threading.Thread(target=work, daemon=True, name="generate").start()
        while True:
            kind, value = events.get()
            yield kind, value
            if kind != "progress":
                self.board.report.remote(self.replica, self._row())
                return
