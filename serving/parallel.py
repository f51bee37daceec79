"""ParallelGroup: a replica in processes of its own: several devices splitting one image (PARALLEL), or one.

A group of one device with nothing split is a replica in a process of its own (REPLICA_PROCESSES).

Owns the group's processes and everything that crosses to them; devices/parallel.py owns the device
side (collectives, the attention backends, which models can, the CPU work-arounds).

- Processes: the app starts one worker per device of the group (torch.multiprocessing, spawn: a fresh
  interpreter, no inherited CUDA state), each joins a torch.distributed group on a free 127.0.0.1 port
  (gloo on CPUs, nccl/hccl/xccl on accelerators), loads the model with the app's own code
  (`ImagePipeline.from_pretrained`) and shards the denoiser (`devices.parallel.enable`). Every rank runs
  every request; rank 0's result is the group's.
- Wire: requests, results and errors cross as plain data (serving/wire.py); errors come back as the
  same exception class. Rank 0 streams progress and previews; a second pipe to rank 0 answers token
  counts and its status row while a request runs.
- Stop: the caller's `should_cancel` sets an Event all ranks see; each rank's own `should_cancel`
  all-reduces it (MAX), so every rank stops at the same step (one stopping alone would leave the others
  waiting in a collective forever).
- Supervision: the app waits on the workers' pipes and their process sentinels together
  (`multiprocessing.connection.wait`), so a dead worker is noticed at once, not by polling. A death,
  or a rank failing while the others hang, fails the running request naming the rank, pid and exit
  code; the group is killed and restarted in the background (the status row says so) and the next
  request waits for it.
- A replica in its own process (`process_pool`, REPLICA_PROCESSES=on): the same worker, supervision
  and wire with one device and no plan: no torch.distributed group, nothing split. It exists for the
  CPU pool: replicas in one interpreter take turns on Python's GIL between their kernels (the sampler,
  hooks, the UNet's own Python), replicas in processes run at once (docs/scale-out.md).
- To DevicePool a group is a replica: `generate(request, progress, should_cancel, preview, item_range)`,
  `dm`, `status`, `close`, `model_info`, `count_tokens`, `limits`, `options`, `model_id`; a pool of
  groups (`parallel_pool`) spreads requests over groups as over devices (4 GPUs, degree 2 = 2 groups).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import logging
import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.multiprocessing as mp

from devices import DeviceManager
from devices import parallel as par
from devices.options import DeviceOptions, DeviceSettings
from devices.pool import cpu_threads_each, devices_for
from pipelines import (
    CancelFn,
    Capabilities,
    ModelInfo,
    PipelineOptions,
    PreviewFn,
    ProgressFn,
    ReplicaStatus,
    report_progress,
)
from pipelines.schema.errors import LoraError, ModelLoadError, PipelineError
from pipelines.schema.request import GenerationRequest, GenerationResult, RequestLimits
from serving import wire
from serving.pool import DevicePool

log = logging.getLogger(__name__)

CANCEL_TICK = 0.1  # seconds between looks at the caller's should_cancel while the group works
STUCK_AFTER = 30.0  # seconds the other ranks get to answer once one rank failed, before the group is killed
CLOSE_WAIT = 10.0  # seconds a worker gets to leave its group when the app closes it
DENOISERS = ("transformer", "transformer_2", "unet")  # diffusers' component names for the denoiser(s)
# diffusers refuses an adapter on a model it split ("the adapter layers are not covered by the model's `_tp_plan`"),
# so a tensor group is told before any rank tries; context parallel keeps every weight whole and serves LoRAs
WHY_NO_LORAS = (
    "LoRAs cannot be used with tensor parallel: the denoiser's weights are split over the devices and diffusers "
    "cannot add LoRA layers to a split model; PARALLEL=ulysses:N keeps every weight whole and serves LoRAs "
    "(the same images as one device)"
)


@dataclass(frozen=True)
class GroupSpec:
    """What a group's workers need: the model, the group's devices, the plan, the app's options."""

    source: str
    devices: tuple[str, ...]
    plan: par.ParallelPlan | None  # None: one device in a process of its own, nothing split
    options: PipelineOptions
    device_settings: DeviceSettings
    threads: int | None = None  # torch's CPU threads per worker (the cores divided), None: torch's default

    @property
    def name(self) -> str:
        if self.plan is None:  # named as an in-process replica is ("cpu", "cuda:1"; the pool numbers CPU ones)
            return self.devices[0]
        return f"{self.plan.mode}:{len(self.devices)}[{','.join(self.devices)}]"

    @property
    def title(self) -> str:
        """What messages call it: "parallel group ulysses:2[cuda:0,cuda:1]", "replica process cpu"."""
        return f"replica process {self.name}" if self.plan is None else f"parallel group {self.name}"

    @property
    def splits_weights(self) -> bool:
        """Tensor parallel: every rank holds part of the denoiser's weights."""
        return self.plan is not None and not self.plan.context


class WorkerDied(PipelineError):
    """A worker of the group exited (killed, crashed, out of host memory)."""


class _Broken(Exception):
    """The group cannot go on (a rank failed outside the request's fault, or failed while the others
    were left waiting in a collective): `error` is what the caller gets, as the rank's own class."""

    def __init__(self, error: Exception):
        super().__init__(str(error))
        self.error = error


# ------------------------------------------------------------------------- the worker process
def worker_options(options: PipelineOptions) -> PipelineOptions:
    """The options a worker loads with: torch runs the networks (OpenVINO graphs and compiled graphs
    cannot hold the group's collectives; RUNTIME=openvino was refused at start)."""
    return options.updated(runtime="torch", compile="off")


def _load(spec: GroupSpec, rank: int, port: int) -> tuple[Any, torch.device, dict[str, Any]]:
    """Join the group, load the model, shard its denoiser; the pipeline, its device and the ready report."""
    from pipelines import ImagePipeline  # in the worker only: the app's process never loads a copy

    device = spec.devices[rank]
    kind = par.kind_of(device)
    collective = par.collective_for(kind)
    if collective.visible is not None:  # this worker sees its own device only, as index 0
        os.environ[collective.visible] = device.split(":", 1)[1] if ":" in device else "0"
    local = "cpu" if kind == "cpu" else f"{kind}:0"
    if spec.threads:
        torch.set_num_threads(spec.threads)
    if spec.plan is not None:
        par.join_group(kind, rank, len(spec.devices), port)
    dm = DeviceManager(options=DeviceOptions.for_device(local, spec.device_settings))
    options = spec.options if spec.plan is None else worker_options(spec.options)
    pipeline = ImagePipeline.from_pretrained(spec.source, dm, options)
    components = pipeline.diffusers_pipeline.components
    denoisers = [components[n] for n in DENOISERS if components.get(n) is not None]
    if spec.plan is not None:
        if not denoisers:
            raise ValueError(f"PARALLEL={spec.plan}: {type(pipeline.diffusers_pipeline).__name__} has no denoiser to split")
        for model in denoisers:
            par.enable(model, spec.plan, dm.backend, len(spec.devices), dm.device.type)  # ROCm's type is cuda
    report = {
        "rank": rank,
        "pid": os.getpid(),
        "weights": sum(par.local_bytes(m) for m in denoisers),  # this rank's share of the denoiser's weights
        "split": [par.applied(m) for m in denoisers],  # read back from diffusers: what each denoiser runs
    }
    return pipeline, dm.device, report


def worker(rank: int, spec: GroupSpec, port: int, conn: Connection, queries: Connection | None, cancel: Any) -> None:
    """One rank: join, load, then run every request the app sends until told to close."""
    try:
        pipeline, device, report = _load(spec, rank, port)
    except Exception as exc:
        log.exception("rank %d of %s failed to start", rank, spec.name)
        conn.send(("error", wire.error_to_wire(exc)))
        return
    conn.send(("ready", report))
    if queries is not None:
        threading.Thread(target=_answer, args=(pipeline, queries), name="group-queries", daemon=True).start()

    def should_cancel() -> bool:  # a group agrees (every rank stops at the same step); a process alone just looks
        return par.agree(cancel.is_set(), device) if spec.plan is not None else cancel.is_set()

    while True:
        try:
            message = conn.recv()
        except EOFError:  # the app is gone (its end of the pipe closed): leave as on close
            message = ("close",)
        if message[0] == "close":
            break
        _, request, item_range, previews = message
        conn.send(_run(pipeline, rank, conn, wire.request_from_wire(request), item_range, previews, should_cancel))
    if spec.plan is not None:
        par.leave_group()


def _run(pipeline, rank, conn, request, item_range, previews, should_cancel) -> tuple[str, Any]:
    """One request on this rank: rank 0 streams progress and previews and sends the result."""

    def progress(step: int, total: int, image: int, note: str = "") -> None:
        conn.send(("progress", (step, total, image, note)))

    def preview(first: int, images: list[Any]) -> None:
        conn.send(("preview", (first, [wire.png_bytes(im) for im in images])))

    lead = rank == 0
    extra = {"preview": preview} if lead and previews else {}
    try:
        result = pipeline.generate(request, progress if lead else None, should_cancel, item_range=item_range, **extra)
    except Exception as exc:
        log.exception("rank %d: the request failed", rank)
        return ("error", wire.error_to_wire(exc))
    return ("result", wire.result_to_wire(result)) if lead else ("done", None)


def _answer(pipeline: Any, queries: Connection) -> None:
    """Rank 0's second pipe: token counts, the model's description and the status row, beside a running
    request (what one ImagePipeline answers while it generates)."""
    questions = {
        "count_tokens": pipeline.count_tokens,
        "model_info": lambda _: pipeline.model_info(),
        "status": lambda _: pipeline.status()[0],
    }
    while True:
        try:
            what, arg = queries.recv()
        except EOFError:  # the app closed the pipe: the group is closing
            return
        try:
            queries.send(("ok", questions[what](arg)))
        except Exception as exc:  # answered, not swallowed: the app raises it as the same class
            log.exception("rank 0: %s failed", what)
            queries.send(("error", wire.error_to_wire(exc)))


# ------------------------------------------------------------------------- the app's side
@dataclass
class _Workers:
    """One start of the group: the processes, their pipes, rank 0's query pipe, the shared cancel flag."""

    processes: list[Any]
    pipes: list[Connection]
    queries: Connection
    cancel: Any
    reports: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class ParallelGroup:
    """The devices of `spec` as one replica: every request runs on all of them, one image split over them."""

    capabilities = Capabilities(previews=True, switch_models=False, count_tokens=True)

    def __init__(self, spec: GroupSpec):
        self.spec = spec
        self.options = spec.options
        self.model_id = spec.source
        self.model_name = os.path.basename(spec.source.rstrip("/")) or spec.source
        self.dm = DeviceManager(options=DeviceOptions.for_device(spec.devices[0], spec.device_settings))
        self.restarts = 0
        self.note: str | None = None  # a restart in progress, or the last one and why
        self.activity = "idle"
        self._lock = threading.Lock()  # one request at a time: every rank runs it
        self._query_lock = threading.Lock()
        self._ready = threading.Event()
        self._closed = False
        self._broken = False  # the last restart failed
        self._workers = self._start()
        self._ready.set()

    @property
    def name(self) -> str:
        return self.spec.name

    # ---------------------------------------------------------------- starting and stopping
    def _start(self) -> _Workers:
        """Spawn one worker per device and wait until every rank has loaded (or raise what failed)."""
        ctx = mp.get_context("spawn")
        port, cancel = par.free_port(), ctx.Event()
        processes, pipes, queries = [], [], None
        for rank in range(len(self.spec.devices)):
            ours, theirs = ctx.Pipe()
            ask, answer = ctx.Pipe() if rank == 0 else (None, None)
            args = (rank, self.spec, port, theirs, answer, cancel)
            mode = self.spec.plan.mode if self.spec.plan is not None else "replica"
            process = ctx.Process(target=worker, args=args, name=f"{mode}-rank{rank}", daemon=True)
            process.start()
            theirs.close()
            if answer is not None:
                answer.close()
                queries = ask
            processes.append(process)
            pipes.append(ours)
        workers = _Workers(processes, pipes, queries, cancel)
        try:
            replies = self._gather(workers, None, None, None, "while starting")
        except _Broken as broken:  # a rank failed and the others hung: what that rank said
            _kill(workers)
            raise _as_load_error(broken.error, self.spec) from None
        except Exception:
            _kill(workers)
            raise
        errors = [r for _, (kind, r) in sorted(replies.items()) if kind == "error"]
        if errors:
            _kill(workers)
            raise _as_load_error(wire.error_from_wire(errors[0]), self.spec)
        workers.reports = [replies[r][1] for r in range(len(processes))]
        log.info("%s ready: pids %s", self.spec.title, [p.pid for p in processes])
        return workers

    def close(self) -> None:
        self._closed = True
        with self._lock:
            _stop(self._workers)

    def _restart(self, reason: str) -> None:
        """Kill what is left of the group and start it again; `_ready` is clear until it is done (the
        caller cleared it, so no request takes the broken group meanwhile), and the next request waits."""
        self._ready.clear()
        self.note = f"restarting after: {reason}"
        _kill(self._workers)
        try:
            self._workers = self._start()
            self.restarts += 1
            self._broken = False
            self.note = f"restarted {self.restarts} time(s); last after: {reason}"
            log.warning("%s restarted after: %s", self.spec.title, reason)
        except Exception as exc:
            log.exception("%s could not restart", self.spec.title)
            self._broken = True  # the next request tries again
            self.note = f"could not restart after: {reason}: {type(exc).__name__}: {exc}"
        finally:
            if self._closed:
                _kill(self._workers)
            self._ready.set()

    def _take(self) -> _Workers:
        """Wait until the group is ready and hold it (`_lock`, released by the caller); a group whose rank
        died while idle, or whose last restart failed, is started again first."""
        while True:
            self._ready.wait()
            self._lock.acquire()
            if self._ready.is_set():
                break
            self._lock.release()  # a restart began between the wait and the lock: wait for it
        if self._closed:
            self._lock.release()
            raise PipelineError(f"{self.spec.title} is closed")
        gone = [rank for rank, p in enumerate(self._workers.processes) if not p.is_alive()]
        if gone or self._broken:
            why = str(_died(self.spec.title, gone[0], self._workers.processes[gone[0]], "while idle")) if gone else self.note
            self._restart(str(why))
        if self._broken:
            self._lock.release()
            raise PipelineError(f"{self.spec.title}: {self.note}")
        return self._workers

    # ---------------------------------------------------------------- the replica face DevicePool uses
    def model_info(self) -> ModelInfo:
        """Rank 0's, asked each time (LoRAs and embeddings added since are listed, as by one pipeline)."""
        info = self._ask("model_info", None)
        return dataclasses.replace(info, lora_supported=False) if self.spec.splits_weights else info

    @property
    def limits(self) -> RequestLimits:
        return self.model_info().limits

    @property
    def rank_weights(self) -> list[int]:
        """Each rank's bytes of the denoiser's weights (its shard under tensor parallel)."""
        return [r["weights"] for r in self._workers.reports]

    @property
    def splits(self) -> list[list[str]]:
        """Per rank, what each denoiser runs, read back from diffusers after `enable`."""
        return [r["split"] for r in self._workers.reports]

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._workers.processes]

    def count_tokens(self, prompt: str) -> list:
        return self._ask("count_tokens", prompt)

    def _ask(self, what: str, arg: Any) -> Any:
        self._ready.wait()
        with self._query_lock:
            self._workers.queries.send((what, arg))
            kind, data = self._workers.queries.recv()
        if kind == "error":
            raise wire.error_from_wire(data)
        return data

    def status(self) -> list[ReplicaStatus]:
        """One row for the group: rank 0's device row, named for the group, with what the group is doing."""
        healthy = self._ready.is_set() and not (self.note or "").startswith("could not")
        try:
            row = self._ask("status", None) if self._ready.is_set() else None
        except (EOFError, OSError) as exc:  # rank 0 is gone: the running request will say so
            row, healthy = None, False
            self.note = f"rank 0 unreachable ({type(exc).__name__}); {self.note or ''}"
        if row is None:
            row = ReplicaStatus(self.name, str(self.dm.device), self.dm.backend, self.dm.device_name,
                                self.dm.dtype_name, self.dm.attention)  # fmt: skip
        weights = self._weights_text() if self._ready.is_set() else row.weights
        return [dataclasses.replace(row, name=self.name, device=self.spec.devices[0], healthy=healthy,
                                    busy=self.activity != "idle", activity=self.activity, error=self.note,
                                    weights=weights)]  # fmt: skip

    def _weights_text(self) -> str:
        per_rank = ", ".join(f"{b / 2**20:.1f} MiB" for b in self.rank_weights)
        if self.spec.plan is None:
            return f"the whole denoiser in process {self.pids[0]} ({per_rank})"
        share = f"1/{len(self.spec.devices)} of the denoiser" if self.spec.splits_weights else "the whole denoiser"
        return f"{self.spec.plan}: {share} on each device ({per_rank})"

    def generate(
        self,
        request: GenerationRequest,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        preview: PreviewFn | None = None,
        item_range: tuple[int, int] | None = None,
    ) -> GenerationResult:
        """Every rank runs the request; rank 0's progress, previews and result come back."""
        if request.loras and self.spec.splits_weights:
            raise LoraError(f"PARALLEL={self.spec.plan}: {WHY_NO_LORAS}")
        workers = self._take()
        try:
            workers.cancel.clear()
            message = ("generate", wire.request_to_wire(request), item_range, preview is not None)
            self.activity = "starting"
            for pipe in workers.pipes:
                pipe.send(message)
            replies = self._gather(workers, progress, should_cancel, preview)
            failure = next((d for k, d in replies.values() if k == "error" and d["kind"] == "failure"), None)
            if failure is not None:  # not the request's fault: the ranks may no longer be in step
                raise _Broken(wire.error_from_wire(failure))
        except (WorkerDied, BrokenPipeError, _Broken) as exc:
            error = exc.error if isinstance(exc, _Broken) else exc
            error = self._death(workers, exc) if isinstance(exc, BrokenPipeError) else error
            self._ready.clear()  # before the lock is released: no request takes the broken group
            threading.Thread(target=self._restart, args=(str(error),), name=f"restart-{self.name}", daemon=True).start()
            raise error from None
        finally:
            self.activity = "idle"
            self._lock.release()
        return _outcome(replies)

    def _death(self, workers: _Workers, exc: BaseException) -> WorkerDied:
        """The WorkerDied for a pipe that broke (its worker died before the wait saw the sentinel)."""
        for rank, process in enumerate(workers.processes):
            process.join(1.0)
            if process.exitcode is not None:
                return _died(self.spec.title, rank, process)
        return WorkerDied(f"{self.spec.title}: a worker's pipe broke ({exc}); it is restarting")

    def _gather(self, workers: _Workers, progress, should_cancel, preview, when: str = "during the request") -> dict[int, tuple[str, Any]]:
        """Every rank's answer, streaming rank 0's progress and previews. Waits on the pipes and the
        processes' sentinels together: a death is seen as it happens. Raises WorkerDied on a death or
        when the other ranks do not answer within STUCK_AFTER of one rank's failure."""
        pending = set(range(len(workers.pipes)))
        owner = {pipe: rank for rank, pipe in enumerate(workers.pipes)}
        owner.update({p.sentinel: rank for rank, p in enumerate(workers.processes)})
        replies: dict[int, tuple[str, Any]] = {}
        failed_at: float | None = None
        while pending:
            watched = [x for r in pending for x in (workers.pipes[r], workers.processes[r].sentinel)]
            timeout = CANCEL_TICK if should_cancel is not None or failed_at is not None else None
            for item in wait(watched, timeout=timeout):
                rank = owner[item]
                pipe = workers.pipes[rank]
                if rank not in pending or (item is not pipe and not pipe.poll()):
                    if rank in pending:  # the sentinel, nothing left to read: the process is gone
                        raise _died(self.spec.title, rank, workers.processes[rank], when)
                    continue
                try:
                    kind, data = pipe.recv()
                except EOFError:  # it died while sending
                    raise _died(self.spec.title, rank, workers.processes[rank], when) from None
                if self._streamed(kind, data, progress, preview):
                    continue
                replies[rank] = (kind, data)
                pending.discard(rank)
                if kind == "error" and failed_at is None:
                    failed_at = time.monotonic()
            if should_cancel is not None and not workers.cancel.is_set() and should_cancel():
                workers.cancel.set()
            if failed_at is not None and pending and time.monotonic() - failed_at > STUCK_AFTER:
                raise _Broken(_stuck(self.spec.title, replies, pending))
        return replies

    def _streamed(self, kind: str, data: Any, progress: ProgressFn | None, preview: PreviewFn | None) -> bool:
        """Rank 0's progress and previews, passed on; False for a reply."""
        if kind == "progress":
            self.activity = data[3] or f"step {data[0]}/{data[1]}"  # the note: a conversion on this rank
            if progress is not None:
                report_progress(progress, *data)
            return True
        if kind == "preview":
            if preview is not None:
                preview(data[0], [wire.png_image(b) for b in data[1]])
            return True
        return False


def _outcome(replies: dict[int, tuple[str, Any]]) -> GenerationResult:
    """Rank 0's result, or the first error as the same exception class."""
    for rank in sorted(replies):
        kind, data = replies[rank]
        if kind == "error":
            raise wire.error_from_wire(data)
    kind, data = replies[0]
    return wire.result_from_wire(data)


def _died(title: str, rank: int, process: Any, when: str = "during the request") -> WorkerDied:
    process.join(1.0)
    code = process.exitcode
    how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with code {code}"
    then = "" if when == "while starting" else "; it is being restarted, try again"
    return WorkerDied(f"{title}: rank {rank} (pid {process.pid}) {how} {when}{then}")


def _stuck(title: str, replies: dict[int, tuple[str, Any]], pending: set[int]) -> Exception:
    """The first failed rank's error (its own class), saying the others were left waiting."""
    rank, data = next((r, d) for r, (k, d) in sorted(replies.items()) if k == "error")
    note = (f"{data['message']} (rank {rank} of {title}; rank(s) {sorted(pending)} did not finish "
            f"within {STUCK_AFTER:g} s, left waiting in a collective: the group is being restarted, try again)")  # fmt: skip
    return wire.error_from_wire({**data, "message": note})


def _as_load_error(exc: Exception, spec: GroupSpec) -> Exception:
    """A failure to start as ModelLoadError naming the group; a refusal (ValueError) as it is."""
    if isinstance(exc, ValueError):
        return exc
    return ModelLoadError(f"{spec.title} could not start {spec.source}: {exc}")


def _kill(workers: _Workers) -> None:
    """End every process of a group now (a group with a dead rank cannot finish any collective)."""
    for process in workers.processes:
        if process.is_alive():
            process.kill()
    for process in workers.processes:
        process.join(CLOSE_WAIT)
    for pipe in [*workers.pipes, workers.queries]:
        if pipe is not None:
            pipe.close()


def _stop(workers: _Workers) -> None:
    """Ask every worker to leave its group and exit; kill those that do not within CLOSE_WAIT."""
    for pipe in workers.pipes:
        try:
            pipe.send(("close",))
        except (BrokenPipeError, OSError) as exc:  # that worker is already gone; _kill below reaps it
            log.warning("parallel group: a worker was gone at close (%s)", exc)
    deadline = time.monotonic() + CLOSE_WAIT
    for process in workers.processes:
        process.join(max(0.0, deadline - time.monotonic()))
    _kill(workers)


# ------------------------------------------------------------------------- building
def group_specs(source: str, options: PipelineOptions, settings: DeviceSettings, devices: str | None = None) -> list[GroupSpec]:
    """The groups PARALLEL makes of PREFERRED_DEVICE (or `devices`); ValueError for what cannot run."""
    plan = settings.parallel
    if plan is None:
        raise ValueError("PARALLEL is off")
    if options.runtime == "openvino":
        raise ValueError(f"PARALLEL={plan}: RUNTIME=openvino runs OpenVINO graphs, which cannot split one image over "
                         "devices; use RUNTIME=torch or auto (a group runs torch)")  # fmt: skip
    text = devices if devices is not None else settings.preferred
    listed = devices_for(_all_if_auto(text), settings.cpu_replicas)
    groups = par.groups_for([str(d) for d in listed], plan)
    for group in groups:
        par.attention_backend(plan, par.kind_of(group[0]))  # ring where it cannot run: refused before any load
    cpu_workers = sum(len(g) for g in groups if par.kind_of(g[0]) == "cpu")
    threads = cpu_threads_each(cpu_workers) if cpu_workers else None
    return [GroupSpec(source, tuple(g), plan, options, settings, threads) for g in groups]


def process_pool(source: str, options: PipelineOptions, settings: DeviceSettings, devices: str | None = None):
    """A DevicePool whose replicas each run in a process of their own (REPLICA_PROCESSES=on), one per
    device of PREFERRED_DEVICE (or `devices`), the CPU's cores divided among the CPU ones."""
    listed = [str(d) for d in devices_for(devices if devices is not None else settings.preferred, settings.cpu_replicas)]
    odd = sorted({par.kind_of(d) for d in listed} - set(par.COLLECTIVES))
    if odd:  # a worker is shown its own device by the kind's visibility variable (devices.parallel.COLLECTIVES)
        raise ValueError(
            f"REPLICA_PROCESSES=on runs replicas of {', '.join(par.COLLECTIVES)} in processes of their own, not of "
            f"{', '.join(odd)} ({'; '.join(par.NO_GROUP.get(k, 'unknown') for k in odd)}); unset REPLICA_PROCESSES"
        )
    cpus = sum(par.kind_of(d) == "cpu" for d in listed)
    threads = cpu_threads_each(cpus) if cpus else None
    return _pool_of([GroupSpec(source, (device,), None, options, settings, threads) for device in listed])


def _all_if_auto(text: str) -> str:
    """PREFERRED_DEVICE=auto with PARALLEL: every device of the best backend (a group needs several)."""
    return "all" if text.strip().lower() in ("", "auto") else text


def parallel_pool(source: str, options: PipelineOptions, settings: DeviceSettings, devices: str | None = None):
    """A DevicePool whose replicas are parallel groups (one group when the degree covers every device)."""
    return _pool_of(group_specs(source, options, settings, devices))


def _pool_of(specs: list[GroupSpec]) -> DevicePool:
    """A DevicePool of `specs` started; a model switch starts the same specs with the new model and options."""

    def build(model: str, _managers: list, opts: PipelineOptions) -> list[ParallelGroup]:
        return _start_groups([dataclasses.replace(s, source=model, options=opts) for s in specs])

    return DevicePool(_start_groups(specs), builder=build)


def _start_groups(specs: list[GroupSpec]) -> list[ParallelGroup]:
    """Every group (or replica process) started at once, each loading while the others do (one after the
    other, 8 GPUs' groups would take 8 loads); the first failure is raised, the started ones closed."""
    at_once = max(1, min(len(specs), os.cpu_count() or 1))  # loads at once: each takes its model's host memory
    with concurrent.futures.ThreadPoolExecutor(max_workers=at_once, thread_name_prefix="start-group") as starting:
        futures = [starting.submit(ParallelGroup, spec) for spec in specs]
        concurrent.futures.wait(futures)
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    if failed is not None:
        for future in futures:
            if future.exception() is None:
                future.result().close()
        raise failed
    return [future.result() for future in futures]
