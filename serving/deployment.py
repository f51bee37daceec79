"""The Ray Serve deployment: one ImagePipeline per replica on one accelerator, one generation at a time.

Each replica reserves one device through Ray's own resources (`num_gpus` for CUDA/ROCm/XPU,
`resources={"NPU": 1}` for Ascend, which Ray detects itself) or CPUs, and uses what Ray assigned:
Ray makes only that device visible (CUDA_VISIBLE_DEVICES, ASCEND_RT_VISIBLE_DEVICES,
ONEAPI_DEVICE_SELECTOR), so it is index 0 inside the replica. `max_ongoing_requests=1`: a replica
that owns one accelerator takes one request; Serve queues the rest.

`generate` is an async generator streaming ("progress", (done, total, image)) per step,
("preview", (first image, [PNG bytes])) every PREVIEW_EVERY steps when the caller asks for
previews, then ("result", wire result) or ("error", wire error) (serving.wire: plain data, PNG bytes).
It is async on purpose: Ray Serve runs a sync generator to its end in a thread and never closes
it, while an async one gets a CancelledError when the caller cancels or disconnects
(`ray/serve/_private/replica.py: call_user_generator`), which sets the flag the pipeline's
`should_cancel` reads. The normal Stop keeps the finished images: the caller marks the request
in the StatusBoard, which wakes the replica's watcher, and the pipeline stops after the
current step and returns what finished.

The StatusBoard (a small named async actor) also holds each replica's heartbeat with what it is
doing, so the status panel never queues behind a busy replica.

Switching models is a redeploy of the same application with another `model` (Serve replaces
every replica: imperative `serve.run` gives each deploy a new code version, so Serve never
reconfigures these replicas in place). A replica that cannot load the new model loads the
`fallback` (the model that served before) and reports the error on the board before it is
RUNNING, instead of failing its start: a failing start would leave no replica at all. Once the
app has seen every replica load the new model it marks the deploy settled on the board; a replica
Serve restarts later no longer falls back (it fails its start, visibly), so the replicas never
serve two different models.

`serve run --name diffusion-anywhere serving.deployment:build_app model=models/tiny-shapes replicas=2 device=cpu`
deploys it from the command line (the same as `python -m serving`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from typing import Any

import ray
from ray import serve

from devices import DeviceManager
from devices.options import DeviceOptions, parse_attention, parse_device, parse_dtype
from pipelines import ImagePipeline, PipelineOptions

from .wire import error_to_wire, png_bytes, request_from_wire, result_to_wire

log = logging.getLogger(__name__)

APP_NAME = "diffusion-anywhere"
DEPLOYMENT_NAME = "GenerationReplica"
BOARD_NAME = "diffusion-anywhere-status"
NAMESPACE = "serve"
HEARTBEAT_S = 1.0  # the app polls status every 2 s
FORGET_S = 60.0  # a replica silent this long is dropped from the board (Serve has replaced it)
TOKEN_TTL_S = 3600.0

RESOURCES: dict[str, dict[str, Any]] = {  # how a replica reserves one device of each kind
    "cpu": {},
    "cuda": {"num_gpus": 1},  # NVIDIA and AMD (ROCm): Ray's "GPU" resource
    "xpu": {"num_gpus": 1},  # Intel GPUs are Ray "GPU"s too
    "npu": {"resources": {"NPU": 1}},  # Ascend: detected by Ray (ray/_private/accelerators/npu.py)
}


class StatusBoard:
    """What each replica is doing (heartbeats), and which requests the app asked to stop.

    An async actor: `watch` calls wait on an asyncio.Event each, so a replica learns of a Stop
    at once without polling.
    """

    def __init__(self):
        self.rows: dict[str, dict[str, Any]] = {}
        self.tokens: dict[str, tuple[asyncio.Event, list[bool], float]] = {}
        self.settled_deploy = ""  # the deploy whose switch succeeded: its replicas may not fall back

    def _token(self, token: str) -> tuple[asyncio.Event, list[bool], float]:
        now = time.time()
        if token not in self.tokens:
            self.tokens = {k: v for k, v in self.tokens.items() if now - v[2] < TOKEN_TTL_S}
            self.tokens[token] = (asyncio.Event(), [False], now)
        return self.tokens[token]

    async def report(self, replica: str, row: dict[str, Any]) -> None:
        self.rows[replica] = {**row, "seen": time.time()}

    async def settle(self, deploy_id: str) -> None:
        self.settled_deploy = deploy_id

    async def settled(self, deploy_id: str) -> bool:
        return bool(deploy_id) and deploy_id == self.settled_deploy

    async def snapshot(self) -> dict[str, dict[str, Any]]:
        now = time.time()
        self.rows = {k: v for k, v in self.rows.items() if now - v["seen"] < FORGET_S}
        return dict(self.rows)

    async def cancel(self, token: str) -> None:
        event, cancelled, _ = self._token(token)
        cancelled[0] = True
        event.set()

    async def end(self, token: str) -> None:
        if token in self.tokens:  # its watch call came first (same caller, in order)
            self.tokens[token][0].set()

    async def watch(self, token: str) -> bool:
        """Return when the request is cancelled (True) or has ended (False)."""
        event, cancelled, _ = self._token(token)
        await event.wait()
        self.tokens.pop(token, None)
        return cancelled[0]


def status_board() -> Any:
    """The board actor, created by whoever comes first (the app or a replica)."""
    return (
        ray.remote(num_cpus=0, max_restarts=-1)(StatusBoard)  # restarted empty; heartbeats refill it
        .options(name=BOARD_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True)
        .remote()
    )


def replica_device(kind: str) -> str:
    """The device Ray assigned this replica (only it is visible here, so index 0), or the CPU."""
    if kind == "cpu":
        return "cpu"
    # ASCEND_RT_VISIBLE_DEVICES: set by Ray for this replica's process (a platform variable, not a
    # setting; docs/settings.md "Where the environment is read"). Ray has no get_npu_ids().
    assigned = ray.get_gpu_ids() if kind in ("cuda", "xpu") else os.environ.get("ASCEND_RT_VISIBLE_DEVICES", "")
    if not assigned:
        raise RuntimeError(f"Ray assigned this replica no {kind} device (is the resource in the cluster?)")
    return f"{kind}:0"


@serve.deployment(name=DEPLOYMENT_NAME, max_ongoing_requests=1)
class GenerationReplica:
    """One model on one device; streams progress, then the result."""

    def __init__(
        self,
        model: str | None,
        kind: str = "cpu",
        cpus: float = 1.0,
        options: dict | None = None,
        fallback: str | None = None,
        deploy_id: str = "",
        device_options: dict | None = None,
    ):
        if kind == "cpu":
            import torch

            torch.set_num_threads(max(1, int(cpus)))  # the cores Ray reserved for this replica
        self.board = status_board()

        def settled() -> bool:  # asked only if `model` fails to load
            return ray.get(self.board.settled.remote(deploy_id))

        self.pipeline, self.switch_error = self._load(
            model, fallback, _device_manager(replica_device(kind), device_options or {}), options, settled
        )
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.deploy_id = deploy_id  # which deploy started it: the app reads this deploy's errors only
        self._closed = threading.Event()
        ray.get(self.board.report.remote(self.replica, self._row()))  # on the board before Serve says RUNNING
        threading.Thread(target=self._heartbeat, daemon=True, name="status-heartbeat").start()

    @staticmethod
    def _load(model, fallback, dm, options, settled=lambda: False) -> tuple[ImagePipeline, str | None]:
        """(pipeline, why `model` could not be loaded): `fallback` serves when `model` fails, while
        the switch is under way (`settled()` False); a restart after it fails instead. `options`: the
        app's PipelineOptions as plain data (serving.ray_backend), rebuilt and checked here."""
        opts = PipelineOptions(**(options or {}))
        try:
            return ImagePipeline.from_pretrained(model, dm, opts), None
        except Exception as exc:
            if fallback is None or settled():
                raise
            log.error("could not load %s (%s); loading %s, which served before", model, exc, fallback)
            return ImagePipeline.from_pretrained(fallback, dm, opts), f"{type(exc).__name__}: {exc}"

    def __del__(self):
        self._closed.set()

    def _row(self) -> dict[str, Any]:
        row = self.pipeline.status()[0].to_dict()
        extra = {"name": f"ray:{self.replica}", "deploy_id": self.deploy_id, "switch_error": self.switch_error}
        return {**row, **extra}

    def _report(self) -> None:
        self.board.report.remote(self.replica, self._row())

    def _heartbeat(self) -> None:
        while not self._closed.wait(HEARTBEAT_S):
            self._report()

    def model_info(self):
        return self.pipeline.model_info()

    async def _watch(self, token: str, cancel: threading.Event) -> None:
        try:
            if await self.board.watch.remote(token):
                cancel.set()
        except ray.exceptions.RayActorError as exc:  # the board restarted: Stop is lost, a disconnect still stops
            log.warning("status board lost while request %s ran: %s", token, exc)

    async def generate(self, data: dict[str, Any], token: str, previews: bool = False):
        """Events of one request (module docstring); the work runs in a thread, off the event loop."""
        loop = asyncio.get_running_loop()
        events: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()

        def put(event: tuple) -> None:
            loop.call_soon_threadsafe(events.put_nowait, event)

        def progress(done: int, total: int, image: int, note: str = "") -> None:
            put(("progress", (done, total, image, note)))
            if done == 1:
                self._report()  # busy now, not at the next heartbeat

        def preview(first: int, images: list[Any]) -> None:
            put(("preview", (first, [png_bytes(image) for image in images])))

        def work() -> None:
            try:
                request = request_from_wire(data)
                result = self.pipeline.generate(request, progress, cancel.is_set, preview if previews else None)
                result = result_to_wire(result)
                for meta in result["metadata"]:
                    meta["replica"] = self.replica
                put(("result", result))
            except Exception as exc:  # handed to the caller as plain data (serving.wire)
                log.warning("request failed on replica %s: %s", self.replica, exc)
                put(("error", error_to_wire(exc)))

        watcher = asyncio.ensure_future(self._watch(token, cancel))
        threading.Thread(target=work, daemon=True, name=f"generate-{token}").start()
        self._report()
        try:
            while True:
                kind, value = await events.get()
                yield kind, value
                if kind not in ("progress", "preview"):
                    return
        finally:  # also on CancelledError: the caller cancelled or went away, so stop after this step
            cancel.set()
            watcher.cancel()
            self.board.end.remote(token)
            self._report()


def _device_manager(device: str, chosen: dict[str, str | None]) -> DeviceManager:
    """The replica's device with the app's dtype and attention settings (TORCH_DTYPE,
    DIFFUSERS_ATTENTION_TYPE as the app read them), not the replica process's environment."""
    options = DeviceOptions(
        parse_device(device), parse_dtype(chosen.get("dtype")), parse_attention(chosen.get("attention")), False
    )
    return DeviceManager(options=options)


def application(
    model: str | None,
    replicas: int = 1,
    kind: str = "cpu",
    cpus: float = 1.0,
    options: dict | None = None,
    fallback: str | None = None,
    deploy_id: str = "",
    device_options: dict | None = None,
) -> Any:
    """The bound Serve application: `replicas` replicas of `kind`, each with `cpus` CPUs, serving
    `model` (or `fallback` where `model` fails to load; module docstring). `device_options`:
    {"dtype", "attention"} names from the app's settings (None: the device's own policy)."""
    if kind not in RESOURCES:
        raise ValueError(f"device: {kind!r} is not valid: expected one of {', '.join(RESOURCES)} or auto")
    actor_options = {"num_cpus": cpus, **RESOURCES[kind]}
    return GenerationReplica.options(num_replicas=replicas, ray_actor_options=actor_options).bind(
        model, kind, cpus, options or {}, fallback, deploy_id, device_options or {}
    )


def detect_kind() -> str:
    """auto: GPUs if the cluster has any, then Ascend NPUs, else CPUs (XPU must be asked for)."""
    cluster = ray.cluster_resources()
    if cluster.get("GPU", 0) >= 1:
        return "cuda"
    if cluster.get("NPU", 0) >= 1:
        return "npu"
    return "cpu"


def build_app(args: dict[str, str]) -> Any:
    """`serve run serving.deployment:build_app model=... replicas=N device=auto|cpu|cuda|xpu|npu cpus=1`."""
    kind = args.get("device", "auto")
    return application(
        args.get("model"),
        int(args.get("replicas", 1)),
        detect_kind() if kind == "auto" else kind,
        float(args.get("cpus", 1.0)),
    )
