"""The engine: admission and jobs for every front end (the Gradio UI and API, the CLI, the Space, the
HTTP APIs), so that each gets the same limits, the same progress and previews, and the same Stop.

- Admission (`submit`): the request is validated against the model's limits (its sampler's fewest
  steps included: `ModelInfo.min_steps`) and its seed pinned before it takes a place, so a request
  that cannot run never waits in the queue; a caller with QUEUE_PER_USER jobs queued or running is
  refused, and so is any caller when QUEUE_SIZE jobs already wait. The check and the enqueue happen
  under one lock, so simultaneous calls cannot overflow either limit.
- Scheduling: jobs start in arrival order, as many at once as the backend's `concurrency` (one per
  healthy replica); a start waits on a condition, never polls.
- A job's events (`Job.events`): `Queued(ahead)` while it waits, `Progress` per step, `Preview`
  frames (where the backend declares previews), then `Finished(result)`; an error is raised from
  the iterator. They are produced on the engine's worker thread and consumed on the caller's own
  thread, so a front end reports them in its own context (Gradio's progress lives in context
  variables of the event's thread, which a worker thread does not have).
- Stop: `stop(session, user)` stops the caller's running jobs after their current step (they
  return what finished) and drops its queued ones. Nobody reaches another caller's jobs: a job is
  matched on both its session (a browser session, or a REST call's own event id) and its user.
- TIME_BUDGET: a running job stops with what finished once it has run that long.
- Context: a job runs in a copy of its submitter's context variables (`contextvars`), so what the
  front end's request carries reaches the backend on the worker thread: on ZeroGPU, `spaces.GPU`
  reads the Gradio request there (gradio's `LocalContext.request`) to charge the visitor's quota.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from pipelines import (
    Annotators,
    Capabilities,
    GenerationBackend,
    ModelEntry,
    ModelInfo,
    ReplicaStatus,
    Upscalers,
    Wildcards,
    detect,
    extras_size,
    find_model,
    list_models,
    upscale_extras,
)
from pipelines.schema.errors import PipelineError
from pipelines.schema.request import GenerationRequest, GenerationResult, pin_seed

log = logging.getLogger(__name__)
STOPS_KEPT = 10_000  # callers whose latest Stop is remembered before the old ones are dropped


class Refused(PipelineError):
    """A job the engine did not take (or dropped before it started); the message says why."""


class QueueFull(Refused):
    """QUEUE_SIZE jobs already wait."""


class TooManyJobs(Refused):
    """The caller already has QUEUE_PER_USER jobs queued or running."""


class CancelledBeforeStart(Refused):
    """Stopped while it waited: nothing ran."""


class SwitchRefused(Refused):
    """A model switch that this server or backend does not allow."""


@dataclass(frozen=True)
class Caller:
    """Who submits: the signed-in user, the session (browser tab, client) and the address.

    `one_off`: the session is the call's own id (a plain REST call), so the per-caller limit counts
    by address instead, or every call would be a new caller.
    """

    user: str | None = None
    session: str | None = None
    address: str | None = None
    one_off: bool = False

    @property
    def key(self) -> str:
        """Whose queue share a job takes: the user, else the session, else the address."""
        if self.user:
            return f"user:{self.user}"
        if self.session and not self.one_off:
            return f"session:{self.session}"
        return f"address:{self.address or 'unknown'}"


@dataclass(frozen=True)
class Admission:
    """The engine's limits (QUEUE_SIZE, QUEUE_PER_USER, TIME_BUDGET)."""

    queue_size: int = 16  # jobs waiting to start
    per_caller: int = 4  # jobs of one caller, queued + running
    time_budget: float = 600.0  # seconds a job may run before it stops with what finished


@dataclass(frozen=True)
class Switching:
    """Which models may be loaded at run time: MODELS_DIR's folders and the recipes, where allowed."""

    allowed: bool = False  # ALLOW_MODEL_SWITCH (by default only on a server on localhost)
    models_dir: Any = None  # a Path; None: the recipes only


# ---------------------------------------------------------------- events
@dataclass(frozen=True)
class Queued:
    ahead: int  # jobs that start before this one


@dataclass(frozen=True)
class Progress:
    step: int  # steps done over the whole request
    total: int
    image: int  # index of the image being made
    note: str = ""  # what holds the steps up, while it does (an OpenVINO conversion inside the request)


@dataclass(frozen=True)
class Preview:
    images: list[Any]  # the latest frame of every image previewed so far, in image order


@dataclass(frozen=True)
class Finished:
    result: GenerationResult


Event = Queued | Progress | Preview | Finished


@dataclass(eq=False)
class Job:
    """One admitted request: its events, its cancel flag, its time budget."""

    request: GenerationRequest
    caller: Caller
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    state: str = "queued"  # queued | running | done
    progress: Progress | None = None  # the latest, for pollers (status panels, A1111's /progress)
    preview: Preview | None = None
    timed_out: bool = False
    _events: queue.Queue = field(default_factory=queue.Queue, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _deadline: float = float("inf")
    _frames: dict[int, Any] = field(default_factory=dict, repr=False)
    _context: contextvars.Context = field(default_factory=contextvars.copy_context, repr=False)  # the submitter's

    def cancel(self) -> None:
        """Stop after the current step (a running job returns what finished)."""
        self._cancel.set()

    def should_stop(self) -> bool:
        if not self.timed_out and time.monotonic() > self._deadline:
            self.timed_out = True
        return self.timed_out or self._cancel.is_set()

    def events(self, timeout: float | None = None) -> Iterator[Event]:
        """Every event up to `Finished`, as they come (one consumer); the job's error is raised."""
        while True:
            event = self._events.get(timeout=timeout)
            if isinstance(event, BaseException):
                raise event
            yield event
            if isinstance(event, Finished):
                return

    def result(self, timeout: float | None = None) -> GenerationResult:
        """Wait for the result, skipping the events."""
        for event in self.events(timeout):
            if isinstance(event, Finished):
                return event.result
        raise AssertionError("unreachable: events() ends with Finished or raises")

    # -------------------------------------------------------------- producer side (engine thread)
    def _put(self, event: Event | BaseException) -> None:
        self._events.put(event)

    def _on_progress(self, step: int, total: int, image: int, note: str = "") -> None:
        self.progress = Progress(step, total, image, note)
        self._put(self.progress)

    def _on_preview(self, first: int, images: list[Any]) -> None:
        self._frames.update({first + i: image for i, image in enumerate(images)})
        self.preview = Preview([self._frames[k] for k in sorted(self._frames)])
        self._put(self.preview)


class Engine:
    """Runs requests on one backend for every front end: admission, order, events, Stop, budget."""

    def __init__(
        self,
        backend: GenerationBackend,
        admission: Admission | None = None,
        switching: Switching | None = None,
        upscalers: Upscalers | None = None,
        annotators: Annotators | None = None,
        wildcards: Wildcards | None = None,
    ):
        self.backend = backend
        self.wildcards = wildcards  # WILDCARD_DIR's files: prompts resolved at submit (pipelines.prompts.wildcards)
        self.admission = admission or Admission()
        self.switching = switching or Switching()
        self.upscalers = upscalers  # the Upscale tab's and A1111 extras' (pipelines.imaging.upscalers)
        self.annotators = annotators  # the map previews' and A1111 detect's (pipelines.control.annotators)
        self._model_pass = threading.Lock()  # one upscale or annotator pass at a time: each fills the device
        self._changed = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: set[Job] = set()
        self._stopped_at: dict[tuple[str | None, str | None] | str, float] = {}  # latest Stop per (session, user), key

    # ---------------------------------------------------------------- the backend, described
    @property
    def capabilities(self) -> Capabilities:
        return self.backend.capabilities

    def model_info(self) -> ModelInfo:
        return self.backend.model_info()

    def status(self) -> list[ReplicaStatus]:
        return self.backend.status()

    def upscaler_names(self) -> list[str]:
        """What the Upscale tab and A1111's extras offer: "None" (a plain resize), the pixel ones, the models."""
        return ["None", *(self.upscalers.names(latent=False) if self.upscalers else [])]

    def upscale(
        self,
        images: list[Image.Image],
        upscaler: str,
        factor: float | None = None,
        size: tuple[int, int] | None = None,
        second: str | None = None,
        visibility: float = 0.0,
    ) -> list[Image.Image]:
        """Each image enlarged by `factor` or to `size` (pipelines.imaging.upscalers.extras); UpscalerError
        (a ValueError naming what is offered) for an unknown upscaler or a size beyond the bounds."""
        if self.upscalers is None:
            raise Refused("this server has no upscalers")
        for name in (upscaler, second):
            if name and name != "None":
                self.upscalers.check(name, latent=False)
        sizes = [extras_size(image, factor, size) for image in images]  # all checked before any work
        with self._model_pass:
            return [
                upscale_extras(self.upscalers, image, s, upscaler, second, visibility)
                for image, s in zip(images, sizes, strict=True)
            ]

    def detect(self, image: Image.Image, module: str | None, resolution: int | None = None,
               a: float | None = None, b: float | None = None) -> Image.Image:  # fmt: skip
        """A ControlNet preprocessor's map of `image` (the UI's preview, A1111's /controlnet/detect), the
        model-based ones by this engine's annotators; PreprocessorError (a ValueError) naming what is usable."""
        with self._model_pass:
            return detect(image, module, resolution, a, b, self.annotators)

    def count_tokens(self, prompt: str) -> list:
        if not self.capabilities.count_tokens:
            raise Refused("this backend does not count prompt tokens")
        return self.backend.count_tokens(prompt)  # type: ignore[attr-defined]

    # ---------------------------------------------------------------- jobs
    def submit(self, request: GenerationRequest, caller: Caller | None = None, unless_stopped_since: float | None = None) -> Job:
        """Admit a request (validated against the model serving it, its defaults filled from that
        model, seed pinned) or raise `Refused` / `RequestError` naming the field. `unless_stopped_since`:
        CancelledBeforeStart if the caller pressed Stop after that time (a script's next job, checked
        under the same lock as Stop, so none slips in after it)."""
        caller = caller or Caller()
        model = self.backend.model_info().serving(request)
        request = pin_seed(request)
        if self.wildcards is not None:  # before the batch cap is checked: combinations are images too
            request = self.wildcards.resolve(request)
        job = Job(model.accept(request).with_defaults(model), caller)
        with self._changed:
            if unless_stopped_since is not None and self._stopped_after(caller, unless_stopped_since):
                raise CancelledBeforeStart("stopped before it started")
            mine = sum(j.caller.key == caller.key for j in (*self._waiting, *self._running))
            if mine >= self.admission.per_caller:
                raise TooManyJobs(
                    f"you already have {mine} generation(s) queued or running (QUEUE_PER_USER="
                    f"{self.admission.per_caller}): wait for one to finish or stop it"
                )
            if len(self._waiting) >= self.admission.queue_size:
                raise QueueFull(f"the queue is full (QUEUE_SIZE={self.admission.queue_size}): try again in a moment")
            self._waiting.append(job)
            self._dispatch()
        return job

    def run(self, request: GenerationRequest, caller: Caller | None = None) -> GenerationResult:
        """Submit and wait (the CLI's and the benchmarks' way)."""
        return self.submit(request, caller).result()

    def stop(self, session: str, user: str | None = None) -> dict[str, int]:
        """Stop the running jobs of (session, user) after their step; drop their queued ones."""
        with self._changed:
            self._note_stop((session, user))
            dropped = [j for j in self._waiting if j.caller.session == session and j.caller.user == user]
            running = [j for j in self._running if j.caller.session == session and j.caller.user == user]
            for job in (*dropped, *running):
                self._cancel(job)
        if dropped or running:
            log.info("stop: %d running, %d queued job(s)", len(running), len(dropped))
        return {"running": len(running), "queued": len(dropped)}

    def stop_caller(self, key: str) -> dict[str, int]:
        """Stop every job of one caller (`Caller.key`: a user, an API key or an address): A1111's
        `/interrupt` names no job, and must reach only the caller's own."""
        with self._changed:
            self._note_stop(key)
            dropped = [j for j in self._waiting if j.caller.key == key]
            running = [j for j in self._running if j.caller.key == key]
            for job in (*dropped, *running):
                self._cancel(job)
        return {"running": len(running), "queued": len(dropped)}

    def _stopped_after(self, caller: Caller, since: float) -> bool:
        """(lock held) Whether a Stop reached `caller` (its session's, or its key's) after `since`
        (time.monotonic()): `submit(unless_stopped_since=)` lets a script of many jobs see a Stop that
        came between two of its jobs."""
        latest = max(self._stopped_at.get((caller.session, caller.user), 0.0), self._stopped_at.get(caller.key, 0.0))
        return latest > since

    def _note_stop(self, key: tuple[str | None, str | None] | str) -> None:
        """(lock held) When `key` last pressed Stop; entries older than an hour go once there are many
        (a script asks only about Stops since it started)."""
        now = time.monotonic()
        self._stopped_at[key] = now
        if len(self._stopped_at) > STOPS_KEPT:
            self._stopped_at = {k: t for k, t in self._stopped_at.items() if now - t < 3600}

    def cancel(self, job: Job) -> None:
        """Stop one job (its caller went away): dropped if it still waits, else stopped after its step."""
        with self._changed:
            self._cancel(job)

    def _cancel(self, job: Job) -> None:
        """(lock held) A waiting job leaves the queue at once, so it neither starts nor holds a place."""
        if job in self._waiting:
            self._waiting.remove(job)
            job.state = "done"
            job._put(CancelledBeforeStart("cancelled before it started"))
            self._dispatch()  # the others move up
        else:
            job.cancel()

    def load(self) -> dict[str, int]:
        """Jobs running and waiting now (the status panel's queue line)."""
        with self._changed:
            return {"running": len(self._running), "waiting": len(self._waiting)}

    def jobs(self) -> list[Job]:
        """Running jobs, then the queued ones in order."""
        with self._changed:
            return [*self._running, *self._waiting]

    def _dispatch(self) -> None:
        """Start waiting jobs while the backend has room; tell the others their place (lock held)."""
        while self._waiting and len(self._running) < max(1, self.backend.concurrency):
            job = self._waiting.popleft()
            job.state = "running"
            self._running.add(job)
            threading.Thread(target=self._run, args=(job,), name=f"job-{job.id}", daemon=True).start()
        for ahead, job in enumerate(self._waiting):
            job._put(Queued(ahead))

    def _run(self, job: Job) -> None:
        job._deadline = time.monotonic() + self.admission.time_budget
        preview = job._on_preview if self.capabilities.previews else None
        outcome: Finished | BaseException
        try:
            result = job._context.run(self.backend.generate, job.request, job._on_progress, job.should_stop, preview)
            if job.timed_out:
                result.warnings.append(
                    f"stopped after the time budget of {self.admission.time_budget:g} s (TIME_BUDGET): "
                    f"{len(result.images)} of {job.request.total_images} image(s) finished"
                )
            outcome = Finished(result)
        except BaseException as exc:  # handed to the consumer, which raises it in its own thread
            outcome = exc
        with self._changed:  # out of the running set before its caller hears: its next job is not refused
            self._running.discard(job)
            job.state = "done"
            self._dispatch()
            self._changed.notify_all()
        job._put(outcome)

    # ---------------------------------------------------------------- models
    def models(self) -> dict[str, Any]:
        """What can be loaded here (recipes, MODELS_DIR folders), what cannot and why (pipelines.weights.catalog),
        what is loaded now, whether switching is allowed. `models` holds only what can load, so every
        front end that offers it (the UI's picker, A1111's sd-models) offers nothing that would fail."""
        entries = list_models(self.switching.models_dir)
        return {
            "current": self.model_info().model_name,
            "models": [{"name": e.name, "kind": e.kind} for e in entries if e.loadable],
            "unavailable": [{"name": e.name, "kind": e.kind, "why": e.why_not} for e in entries if not e.loadable],
            "switch_allowed": self.can_switch,
        }

    def find_model(self, name: str) -> ModelEntry:
        """The entry `name` of `models()` where it can load here, else RequestError on `model` saying
        why and what can (pipelines.weights.catalog)."""
        return find_model((name or "").strip(), self.switching.models_dir)

    @property
    def can_switch(self) -> bool:
        return self.capabilities.switch_models and self.switching.allowed

    @property
    def switch_off_reason(self) -> str:
        if not self.capabilities.switch_models:
            return "this backend serves one model (restart with another MODEL_ID to change it)"
        return "switching models is off on this server (ALLOW_MODEL_SWITCH)"

    def load_model(self, name: str, progress: Callable[[float, str], None] | None = None) -> ModelInfo:
        """Switch every replica to the model `name` (one of `models()`); the old one keeps serving
        if the new one fails to load (ModelLoadError says why)."""
        if not self.can_switch:
            raise SwitchRefused(
                self.switch_off_reason + ": a switch changes the model for every user "
                "(ALLOW_MODEL_SWITCH=1 allows it beyond localhost)"
            )
        try:
            entry = self.find_model(name)
        except ValueError as exc:  # unknown, or cannot load here: refused at once, the model serves on
            raise SwitchRefused(str(exc)) from exc
        info = self.backend.load_model(entry.source, progress=progress)  # type: ignore[attr-defined]
        log.info("model switched to %s", info.model_name)
        return info

    def close(self) -> None:
        self.backend.close()
