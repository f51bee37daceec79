"""RayBackend: the app's GenerationBackend on a Ray Serve deployment (GENERATION_BACKEND=ray).

    GENERATION_BACKEND=ray python app.py     # a local Ray instance sized to this machine
    GENERATION_BACKEND=ray RAY_ADDRESS=auto RAY_REPLICAS=8 RAY_DEVICE=cuda python app.py   # a cluster

Requests and results travel as plain data (serving.wire: fields, PNG bytes), so seeds, pixels and
metadata are those of an in-process run. Progress streams back step by step; Stop marks the
request in the StatusBoard and the replica returns what finished; a caller that goes away
cancels the Serve call, which stops the replica's work too. A replica that dies mid-request gives
a clear PipelineError while Serve replaces it; the other replicas keep serving. `load_model`
redeploys every replica on another model (serving.deployment) and keeps the old model serving
if the new one fails to load.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from devices.manager import dtype_name
from devices.options import DeviceSettings
from pipelines import (
    CancelFn,
    Capabilities,
    ModelInfo,
    ModelLoadError,
    PipelineError,
    PipelineOptions,
    PreviewFn,
    ProgressFn,
    ReplicaStatus,
    report_progress,
)
from pipelines.schema.request import GenerationRequest, GenerationResult, pin_seed, validate

from . import import_ray
from .wire import error_from_wire, png_image, request_to_wire, result_from_wire

log = logging.getLogger(__name__)

REPLICA_FAILED = "a replica failed; Ray Serve is replacing it, try again"
STALE_S = 5.0  # no heartbeat for this long: the replica is gone (heartbeats come every HEARTBEAT_S)


def _local_path(value: Any) -> Any:
    """Relative paths that exist here are sent absolute: replicas do not share our working directory."""
    if isinstance(value, str | Path) and Path(value).exists():
        return str(Path(value).resolve())
    return value


def pipeline_options_for_replicas(options: PipelineOptions | None, overrides: dict[str, Any]) -> dict[str, Any]:
    """Every field of the pipeline options as plain data (serving.deployment rebuilds the object), with
    the paths that exist here made absolute: nothing is hand-listed, so a new setting reaches the replicas."""
    return (options or PipelineOptions()).updated(**overrides).with_absolute_paths().model_dump()


def device_options(devices: DeviceSettings) -> dict[str, str | None]:
    """TORCH_DTYPE and DIFFUSERS_ATTENTION_TYPE as names for the replicas (serving.deployment); the
    local pool's other device variables do not apply to Ray (it places the replicas itself)."""
    return {"dtype": dtype_name(devices.dtype) if devices.dtype else None, "attention": devices.attention}


class RayBackend:
    """Talks to the deployment through a DeploymentHandle; status comes from the StatusBoard actor."""

    def __init__(
        self, handle: Any, board: Any, replicas: int, info: ModelInfo, app_args: dict | None, owns_ray: bool
    ) -> None:
        self.handle, self.board, self.replicas, self.info = handle, board, replicas, info
        self.app_args = app_args  # deployment.application's arguments when start() deployed it, else None
        self.deployed = app_args is not None  # close() deletes only what it deployed
        self.owns_ray = owns_ray
        self._gate = threading.Condition()  # requests in flight vs a model switch
        self._active = 0
        self._switching = False

    @classmethod
    def start(
        cls,
        model: str | None = None,
        replicas: int = 1,
        device: str | None = "auto",
        address: str | None = None,
        cpus_per_replica: float = 1.0,
        reuse: bool = True,
        device_options: dict[str, str | None] | None = None,
        options: PipelineOptions | None = None,
        **overrides: Any,
    ) -> RayBackend:
        """Connect, deploy `replicas` replicas (or reuse the running deployment), wait until one answers.

        address: None (RAY_ADDRESS if set, else a local instance sized to this machine), "auto",
        "ray://host:10001". device: auto | cpu | cuda | xpu | npu. `options` (the app's
        PipelineOptions, every field: the step cache, compile, quantization too) with `overrides`
        (max_batch=..., as `PipelineOptions.updated`) load the pipeline on each replica.
        """
        ray, serve = import_ray()
        from .deployment import APP_NAME, application, detect_kind, status_board

        owns_ray = not ray.is_initialized()
        if owns_ray:
            ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
        board = status_board()
        app_status = serve.status().applications.get(APP_NAME)
        app_args = None
        if not (reuse and app_status is not None and app_status.status == "RUNNING"):
            kind = detect_kind() if device in (None, "", "auto") else device
            app_args = {"model": _local_path(model), "replicas": replicas, "kind": kind, "cpus": cpus_per_replica}
            app_args["options"] = pipeline_options_for_replicas(options, overrides)
            app_args["device_options"] = dict(device_options or {})  # the app's TORCH_DTYPE / attention
            serve.start(proxy_location="Disabled")  # the app calls through handles, not HTTP
            handle = serve.run(application(**app_args), name=APP_NAME, route_prefix=None)
            log.info("Ray Serve: deployed %d %s replica(s)", replicas, kind)
        else:
            handle = serve.get_app_handle(APP_NAME)
            replicas = max(1, sum(d.replica_states.get("RUNNING", 0) for d in app_status.deployments.values()))
            log.info("Ray Serve: reusing the running deployment %r (%d replica(s))", APP_NAME, replicas)
            if (options or PipelineOptions()).updated(**overrides) != PipelineOptions():
                log.warning(
                    "the running deployment keeps the pipeline settings it was deployed with; this app's "
                    "(STEP_CACHE, COMPILE, MAX_BATCH, ...) apply to a deployment it starts itself"
                )
        info = handle.model_info.remote().result(timeout_s=600)
        return cls(handle, board, replicas, info, app_args, owns_ray)

    # ---------------------------------------------------------------- GenerationBackend
    capabilities = Capabilities(previews=True, switch_models=True, count_tokens=False)

    @property
    def concurrency(self) -> int:
        return self.replicas

    def model_info(self) -> ModelInfo:
        return self.info

    def generate(
        self,
        request: GenerationRequest,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        preview: PreviewFn | None = None,
    ) -> GenerationResult:
        """Stream one request's events from a replica; Stop keeps what finished, as in-process."""
        with self._gate:  # behind a model switch in progress
            self._gate.wait_for(lambda: not self._switching)
            self._active += 1
        try:
            validate(request, self.info.limits)  # fail fast without taking a replica; the replica checks again
            return self._stream(pin_seed(request), progress, should_cancel, preview)
        finally:
            with self._gate:
                self._active -= 1
                self._gate.notify_all()

    def _stream(self, request: GenerationRequest, progress, should_cancel, preview: PreviewFn | None):
        ray, _ = import_ray()
        from ray.serve.exceptions import DeploymentUnavailableError, ReplicaUnavailableError

        token = secrets.token_hex(8)
        stream = self.handle.options(stream=True).generate.remote(request_to_wire(request), token, preview is not None)
        finished = cancel_sent = False
        try:
            for kind, value in stream:
                if kind == "preview":  # (first image, PNG bytes): frames of the chunk being denoised
                    if preview is not None:
                        preview(value[0], [png_image(b) for b in value[1]])
                    continue
                if kind == "progress":
                    if progress is not None:
                        report_progress(progress, *value)
                    if not cancel_sent and should_cancel is not None and should_cancel():
                        self.board.cancel.remote(token)  # the replica stops after this step, returns what finished
                        cancel_sent = True
                    continue
                finished = True
                if kind == "error":
                    raise error_from_wire(value)
                return result_from_wire(value)
        except (ray.exceptions.RayActorError, ReplicaUnavailableError, DeploymentUnavailableError) as exc:
            log.error("Ray replica failed: %s", exc)
            raise PipelineError(REPLICA_FAILED) from exc
        except ray.exceptions.RayTaskError as exc:
            raise PipelineError(f"generation failed on a Ray replica: {exc.cause!r}; try again") from exc
        finally:
            if not finished:
                stream.cancel()  # we are leaving early (error, interrupt): stop the replica's work
        raise PipelineError(REPLICA_FAILED)

    def load_model(self, model_id: str, progress: Any = None) -> ModelInfo:
        """Switch every replica to `model_id`: after the running requests, new ones wait.

        A redeploy of the application with the new model and the old one as fallback: Serve
        replaces the replicas (each frees its device as its process ends) and returns once the
        new ones run; each has put on the board whether it loaded the new model. If any could
        not, all are redeployed on the old model and ModelLoadError says why.
        """
        say = progress or (lambda _f, _m: None)
        if self.app_args is None:
            raise ModelLoadError("this Ray deployment was started outside the app: redeploy it with another model")
        with self._gate:
            self._gate.wait_for(lambda: not self._switching)
            self._switching = True
        try:
            say(0.05, "waiting for running work")
            with self._gate:
                self._gate.wait_for(lambda: self._active == 0)
            old = self.app_args["model"]
            say(0.2, f"loading {model_id} on {self.replicas} replica(s)")
            errors = self._deploy(_local_path(model_id), fallback=old)
            if errors:
                say(0.7, f"loading {old} again")
                self._deploy(old, fallback=None)
                raise ModelLoadError(
                    f"could not switch to {model_id}: {errors[0]}; {self.info.model_name} is serving again"
                )
            ray, _ = import_ray()
            ray.get(self.board.settle.remote(self.app_args["deploy_id"]), timeout=30)  # restarts: no fallback
            self.info = self.handle.model_info.remote().result(timeout_s=600)
            say(1.0, "ready")
            return self.info
        finally:
            with self._gate:
                self._switching = False
                self._gate.notify_all()

    def _deploy(self, model: str, fallback: str | None) -> list[str]:
        """Redeploy on `model`; the new replicas' load errors (none: every one serves `model`)."""
        ray, serve = import_ray()
        from .deployment import APP_NAME, application

        self.app_args = {**self.app_args, "model": model, "fallback": fallback, "deploy_id": secrets.token_hex(4)}
        self.handle = serve.run(application(**self.app_args), name=APP_NAME, route_prefix=None)
        rows = ray.get(self.board.snapshot.remote(), timeout=30).values()
        return [
            r["switch_error"] for r in rows if r.get("deploy_id") == self.app_args["deploy_id"] and r["switch_error"]
        ]

    def status(self) -> list[ReplicaStatus]:
        """One row per replica from the board (never queues behind a busy replica), plus Serve's view."""
        ray, serve = import_ray()
        from .deployment import APP_NAME, DEPLOYMENT_NAME

        rows = ray.get(self.board.snapshot.remote(), timeout=5)
        app = serve.status().applications.get(APP_NAME)
        states = app.deployments[DEPLOYMENT_NAME].replica_states if app and DEPLOYMENT_NAME in app.deployments else {}
        now = time.time()
        out = []
        for _, row in sorted(rows.items()):
            status = ReplicaStatus(**{k: v for k, v in row.items() if k in ReplicaStatus.__dataclass_fields__})
            if now - row["seen"] > STALE_S:
                status.healthy, status.busy, status.activity = False, False, "gone"
                status.error = f"no heartbeat for {now - row['seen']:.0f} s: the replica stopped; Serve replaces it"
            out.append(status)
        fresh = sum(r.healthy for r in out)
        starting = sum(n for s, n in states.items() if s not in ("RUNNING", "STOPPING"))
        for n in range(max(0, starting - max(0, fresh - states.get("RUNNING", 0)))):
            out.append(self._placeholder(f"ray:starting#{n}", "Serve is starting a replica"))
        return out or [self._placeholder("ray", "no replica has reported yet")]

    @staticmethod
    def _placeholder(name: str, why: str) -> ReplicaStatus:
        return ReplicaStatus(
            name=name, device="?", backend="?", device_name="starting", dtype="?", attention="?",
            healthy=False, activity="starting", error=why,
        )  # fmt: skip

    def close(self) -> None:
        """Delete what start() deployed (and the board with it); stop Ray if start() started it."""
        ray, serve = import_ray()
        if self.deployed:
            from .deployment import APP_NAME

            serve.delete(APP_NAME)
            ray.kill(self.board)
        if self.owns_ray:
            ray.shutdown()
