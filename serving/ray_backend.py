"""RayBackend: the app's GenerationBackend on a Ray Serve deployment (GENERATION_BACKEND=ray).

    GENERATION_BACKEND=ray RAY_ADDRESS=auto RAY_REPLICAS=8 python app.py   # join a running cluster
    GENERATION_BACKEND=ray python app.py        # a local Ray instance sized to this machine

Requests and results travel as the same dataclasses the in-process pool uses (Ray pickles them,
PIL images included), so seeds and metadata are those of an in-process run. A replica that dies
mid-request gives a clear PipelineError; Serve replaces it and the next request is served.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import time
from typing import Any

from pipelines import PipelineError
from pipelines.backend import CancelFn, ModelInfo, ProgressFn, ReplicaStatus
from pipelines.request import GenerationRequest, GenerationResult

from . import import_ray
from .deployment import APP_NAME, BOARD_NAME, HEARTBEAT_S, GenerationReplica, StatusBoard

log = logging.getLogger(__name__)

RESOURCES = {  # how a replica reserves one device of each kind through Ray's own resources
    "cpu": {},
    "cuda": {"num_gpus": 1},
    "xpu": {"num_gpus": 1, "runtime_env": {"env_vars": {"RAY_DEVICE_KIND": "xpu"}}},
    "npu": {"resources": {"NPU": 1}},
}


def replica_options(kind: str, cpus: float) -> dict[str, Any]:
    if kind not in RESOURCES:
        raise ValueError(f"RAY_DEVICE={kind!r} is not valid: expected one of {', '.join(RESOURCES)} or auto")
    return {"num_cpus": cpus, **RESOURCES[kind]}


def detect_kind(cluster: dict[str, float]) -> str:
    """auto: GPUs if the cluster has any, then Ascend NPUs, else CPUs."""
    if cluster.get("GPU", 0) >= 1:
        return "cuda"
    if cluster.get("NPU", 0) >= 1:
        return "npu"
    return "cpu"


class RayBackend:
    """Talks to the deployment through a DeploymentHandle; status comes from the StatusBoard actor."""

    def __init__(self, handle: Any, board: Any, replicas: int, info: ModelInfo, owns_ray: bool):
        self.handle, self.board, self.replicas = handle, board, replicas
        self.info = info
        self.owns_ray = owns_ray

    @classmethod
    def start(
        cls,
        model: str | None = None,
        address: str | None = None,
        replicas: int = 1,
        device: str | None = "auto",
        cpus_per_replica: float = 1.0,
        **options: Any,
    ) -> RayBackend:
        """Connect (RAY_ADDRESS, or a local instance), deploy or reuse the app, wait until it answers."""
        ray, serve = import_ray()
        owns = not ray.is_initialized()
        if owns:
            ray.init(address=address or None, include_dashboard=False, log_to_driver=False)
        board = (
            ray.remote(num_cpus=0)(StatusBoard)
            .options(name=BOARD_NAME, namespace="serve", lifetime="detached", get_if_exists=True)
            .remote()
        )
        kind = detect_kind(ray.cluster_resources()) if device in (None, "", "auto") else device
        threads = int(cpus_per_replica) if kind == "cpu" else None
        app = GenerationReplica.options(
            num_replicas=replicas, ray_actor_options=replica_options(kind, cpus_per_replica)
        ).bind(model, {k: v for k, v in options.items() if v is not None}, threads)
        handle = serve.run(app, name=APP_NAME, route_prefix=None)
        info = handle.model_info.remote().result(timeout_s=600)
        log.info("Ray Serve: %d %s replica(s) of %s", replicas, kind, info.model_name)
        return cls(handle, board, replicas, info, owns)

    # ---------------------------------------------------------------- GenerationBackend
    @property
    def concurrency(self) -> int:
        return self.replicas

    def model_info(self) -> ModelInfo:
        return self.info

    def generate(
        self, request: GenerationRequest, progress: ProgressFn | None = None, should_cancel: CancelFn | None = None
    ) -> GenerationResult:
        """Stream one request's events from a replica; cancel cooperatively (what finished comes back)."""
        ray, _ = import_ray()
        if request.seed is None:
            request = dataclasses.replace(request, seed=secrets.randbelow(2**31))
        token = secrets.token_hex(8)
        stream = self.handle.options(stream=True).generate.remote(request, token)
        cancel_sent = False
        try:
            for kind, value in stream:
                if kind == "progress":
                    if progress is not None:
                        progress(*value)
                    if not cancel_sent and should_cancel is not None and should_cancel():
                        self.board.cancel.remote(token)
                        cancel_sent = True
                elif kind == "error":
                    raise value
                else:
                    return value
        except (ray.exceptions.RayActorError, ray.exceptions.ActorDiedError, ray.exceptions.RayTaskError) as exc:
            log.error("Ray replica failed: %s", exc)
            raise PipelineError("a generation replica failed; Ray Serve is replacing it, please try again") from exc
        raise PipelineError("the generation replica ended without a result; please try again")

    def status(self) -> list[ReplicaStatus]:
        """One row per replica from their reports; a replica silent for 3 heartbeats is unhealthy."""
        rows = self.board.snapshot.remote()
        ray, _ = import_ray()
        now = time.time()
        out = []
        for name, row in sorted(ray.get(rows, timeout=5).items()):
            fields = {k: v for k, v in row.items() if k in ReplicaStatus.__dataclass_fields__}
            status = ReplicaStatus(**{**fields, "name": f"ray:{name[:8]}"})
            if now - row["seen"] > 3 * HEARTBEAT_S:
                status.healthy, status.error = False, "no heartbeat: the replica is gone (Serve replaces it)"
            out.append(status)
        return out or [self._placeholder()]

    def _placeholder(self) -> ReplicaStatus:
        return ReplicaStatus(name="ray", device="?", backend="?", device_name="starting", dtype="?", attention="?")

    def close(self) -> None:
        ray, serve = import_ray()
        serve.delete(APP_NAME)
        if self.owns_ray:
            serve.shutdown()
            ray.shutdown()
