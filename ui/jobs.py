"""Running generations for callers: cancel flags per caller, the time budget, the per-caller queue limit.

Who is a caller: the Gradio session (browser tab or gradio_client), which for a plain REST call
(`POST /gradio_api/call/generate`) is that call's own event id, returned to the caller and
accepted by `/stop` as `job_id`. Nobody can stop a job whose id they were not given.

The queue itself is Gradio's (bounded by QUEUE_SIZE, REST included since the app queues with
`api_open=False`). Gradio has no per-caller limit, no public way to drop a queued event, and its
QUEUE_SIZE check can be raced by simultaneous joins, so `guard_admissions` wraps its `push` and
`queued_events`/`drop_queued` read its queue objects; tests/test_reliability.py fails if that
internal shape changes.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipelines import GenerationRequest, GenerationResult
from pipelines.backend import GenerationBackend

log = logging.getLogger(__name__)

ProgressReport = Callable[[int, int, int], None]


@dataclass
class _Job:
    cancel: threading.Event = field(default_factory=threading.Event)
    deadline: float = 0.0
    timed_out: bool = False

    def should_stop(self) -> bool:
        if not self.timed_out and time.monotonic() > self.deadline:
            self.timed_out = True
        return self.timed_out or self.cancel.is_set()


def _caller(user: str | None, session: str | None, host: str | None) -> str:
    if user:
        return f"user:{user}"
    if session:
        return f"session:{session}"
    return f"address:{host or 'unknown'}"


class JobRunner:
    """Runs requests on the backend with a cancel flag per job and the time budget."""

    def __init__(self, backend: GenerationBackend, time_budget: float):
        self.backend = backend
        self.time_budget = time_budget
        self._jobs: dict[str, list[_Job]] = {}
        self._lock = threading.Lock()

    def stop(self, job_id: str) -> bool:
        """Ask every running job of `job_id` to stop after its current step. True if one was running."""
        with self._lock:
            jobs = list(self._jobs.get(job_id, ()))
        for job in jobs:
            job.cancel.set()
        return bool(jobs)

    def run(
        self, request: GenerationRequest, job_id: str, progress: ProgressReport | None, preview: Any = None
    ) -> GenerationResult:
        """Run on the backend; `preview` (if given and the backend takes one) gets live previews."""
        job = _Job(deadline=time.monotonic() + self.time_budget)
        with self._lock:
            self._jobs.setdefault(job_id, []).append(job)
        try:
            extra = {"preview": preview} if preview is not None and takes_previews(self.backend) else {}
            result = self.backend.generate(request, progress=progress, should_cancel=job.should_stop, **extra)
        finally:
            with self._lock:
                jobs = self._jobs.get(job_id, [])
                if job in jobs:
                    jobs.remove(job)
                if not jobs:
                    self._jobs.pop(job_id, None)
        if job.timed_out:
            result.warnings.append(
                f"stopped after the time budget of {self.time_budget:g} s (TIME_BUDGET): "
                f"{len(result.images)} of {request.total_images} image(s) finished"
            )
        return result


def takes_previews(backend: GenerationBackend) -> bool:
    """In-process backends stream previews; a remote one (Ray) may not."""
    return "preview" in inspect.signature(backend.generate).parameters


# ---------------------------------------------------------------- Gradio's queue
def queued_events(demo: Any) -> list[Any]:
    """Events waiting in Gradio's queue (not yet running)."""
    queue = demo._queue
    return [event for q in queue.event_queue_per_concurrency_id.values() for event in list(q.queue)]


def running_events(demo: Any) -> list[Any]:
    return [event for events in demo._queue.active_jobs if events for event in events]


def event_caller(event: Any) -> str:
    """The caller of a queued event; a plain REST call's session id is its own event id: by address."""
    client = getattr(getattr(event, "request", None), "client", None)
    session = None if event.session_hash == event._id else event.session_hash
    return _caller(event.username, session, getattr(client, "host", None))


def guard_admissions(demo: Any, concurrency_id: str, limit: int, on_refuse: Callable[[str], None]) -> None:
    """Admit generation events one at a time, refusing a caller over `limit` queued + running.

    Wraps Gradio's `Queue.push`: with admissions serialized, Gradio's own QUEUE_SIZE check cannot be
    raced by simultaneous calls either (it checks, awaits, then appends). Other events pass straight.
    """
    queue = demo._queue
    push = queue.push
    lock = asyncio.Lock()

    async def admit(body: Any, request: Any, username: str | None):
        fn = demo.fns.get(body.fn_index) if body.fn_index is not None else None
        if fn is None or fn.concurrency_id != concurrency_id:
            return await push(body, request, username)
        async with lock:
            client = getattr(request, "client", None)
            key = _caller(username, body.session_hash, getattr(client, "host", None))
            load = sum(
                1
                for e in queued_events(demo) + running_events(demo)
                if e.fn.concurrency_id == concurrency_id and event_caller(e) == key
            )
            if load >= limit:
                message = f"you already have {limit} generation(s) queued or running (QUEUE_PER_USER)"
                on_refuse(f"{message} for {key.split(':')[0]}")
                # Gradio's validation-error shape: clients show the message (HTTP 422)
                return False, [{"__type__": "validate", "is_valid": False, "message": message}], "validator_error"
            return await push(body, request, username)

    queue.push = admit


async def drop_queued(demo: Any, session_hash: str, username: str | None = None) -> int:
    """Remove a caller's waiting events from Gradio's queue and end their streams (as Gradio's /cancel does).

    With sign-in, only events of the same user match, whatever session id is given.
    """
    from gradio.server_messages import ProcessCompletedMessage

    queue = demo._queue
    dropped = 0
    for event in queued_events(demo):
        if event.session_hash != session_hash or (username is not None and event.username != username):
            continue
        await queue.remove_from_queue(event._id)
        messages = queue.pending_messages_per_session.get(session_hash)
        if messages is not None:
            messages.put_nowait(
                ProcessCompletedMessage(
                    output={"error": "cancelled before it started"}, success=False, event_id=event._id
                )
            )
        dropped += 1
    if dropped:
        log.info("stop: removed %d queued job(s)", dropped)
    return dropped
