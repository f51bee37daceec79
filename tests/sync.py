"""Concurrency in tests without timing: threads whose failures reach the test, and jobs held at a step.

- `in_thread(fn, ...)` runs `fn` on a thread of its own and returns a Future: `.result(timeout)`
  gives its value or raises its exception (an AssertionError in the thread fails the test), and a
  thread still running after `timeout` raises TimeoutError instead of being forgotten. A plain
  `threading.Thread` loses its exception: the test would pass while its assertion failed.
- `HoldAtStep` wraps a backend's `generate` so that the next job stops at a denoising step and stays
  there until the job is cancelled or the test releases it. A test of Stop or of a client that goes
  away then knows the job is mid-way when it acts, and can check that the job stopped early, on a
  fast machine as on a slow one: a long job and a sleep only make that likely.
- `until(condition)` polls a condition with a bound: for state that settles a moment after the
  event the test waited for (a job leaves the engine's running set just after its answer is sent).
- `AtOnce` wraps a backend's `generate` and records the most calls that ran at the same time (cells
  of a plot on a pool of replicas).
- `Overlap` stands in for a context manager that swaps process-wide state (accelerate's and peft's
  `init_empty_weights`) and makes two threads' first entries overlap in the worst order.
- `send_and_leave` sends an HTTP request and returns the open connection, for the test to close
  (the client going away) when it chooses.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any
from urllib.parse import urlsplit


class AtOnce:
    """A backend's `generate` that counts how many of its calls run at the same time (`most`)."""

    def __init__(self, generate: Callable[..., Any]):
        self._generate = generate
        self._lock = threading.Lock()
        self._running: set[int] = set()
        self.most = 0

    def __call__(self, request, *args, **kwargs):
        with self._lock:
            self._running.add(threading.get_ident())
            self.most = max(self.most, len(self._running))
        try:
            return self._generate(request, *args, **kwargs)
        finally:
            with self._lock:
                self._running.discard(threading.get_ident())


class Overlap:
    """Stands in for `init_empty_weights` (diffusers and peft build modules inside it; it swaps
    `torch.nn.Module.register_parameter` for the whole process) and makes the first entries of two
    threads overlap in the worst order: the first thread waits inside the swap until a second is inside
    too, and the second stays inside until the first has left. Two loads at once then leave the swap in
    place, and every module built afterwards has its weights on meta. With one load at a time the first
    waits `patience` seconds for a second that cannot come; later entries pass straight through.
    `threads`: how many threads entered."""

    def __init__(self, real: Callable[..., Any], patience: float = 3.0):
        self.real, self.patience = real, patience
        self._order: list[int] = []
        self._lock = threading.Lock()
        self._second_inside, self._first_out = threading.Event(), threading.Event()

    @property
    def threads(self) -> int:
        return len(self._order)

    @contextlib.contextmanager
    def __call__(self, *args: Any, **kwargs: Any):
        me = threading.get_ident()
        with self._lock:
            new = me not in self._order
            if new:
                self._order.append(me)
            first, second = new and self._order[0] == me, new and self._order[1:2] == [me]
        with self.real(*args, **kwargs):
            if first:
                self._second_inside.wait(self.patience)
            elif second:
                self._second_inside.set()
                self._first_out.wait(self.patience)
            yield
        if first:
            self._first_out.set()


def in_thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
    """Start `fn(*args, **kwargs)` on a daemon thread; its outcome is the returned future's."""
    future: Future = Future()
    future.set_running_or_notify_cancel()

    def run() -> None:
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as exc:  # handed to whoever calls future.result(), in the test's thread
            future.set_exception(exc)

    threading.Thread(target=run, name=f"test-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


class HoldAtStep:
    """A backend's `generate`, holding the next job at denoising step `step` (over the whole request).

    The job reports that step (its progress goes on to the engine as usual, so pollers see it), sets
    `reached`, then waits until it is cancelled (`held_until == "cancel"`) or `release()` is called
    (`"release"`). The wait is bounded by `limit` seconds (`"limit"`): a cancel that never comes fails
    the test's assertions instead of hanging it, and the job then runs on to its end. Only one job
    is held; later ones pass through. `steps`, `total`, `result` record what the held job did.
    """

    def __init__(self, generate: Callable[..., Any], step: int = 2, limit: float = 60.0):
        self._generate, self.step, self.limit = generate, step, limit
        self.reached, self.finished = threading.Event(), threading.Event()
        self._released = threading.Event()
        self._armed = threading.Lock()
        self.steps: list[int] = []
        self.total: int | None = None
        self.held_until: str | None = None
        self.result: Any = None

    def release(self) -> None:
        self._released.set()

    def __call__(self, request, progress=None, should_cancel=None, preview=None):
        if not self._armed.acquire(blocking=False):  # a job after the held one
            return self._generate(request, progress, should_cancel, preview)

        def on_step(step: int, total: int, image: int) -> None:
            self.steps.append(step)
            self.total = total
            if progress is not None:
                progress(step, total, image)
            if step >= self.step and not self.reached.is_set():
                self._hold(should_cancel)

        try:
            self.result = self._generate(request, on_step, should_cancel, preview)
            return self.result
        finally:
            self.finished.set()

    def _hold(self, should_cancel: Callable[[], bool] | None) -> None:
        self.reached.set()
        deadline = time.monotonic() + self.limit
        while not self._released.wait(0.01):  # the job's cancel flag is read by polling, as the pipeline does
            if should_cancel is not None and should_cancel():
                self.held_until = "cancel"
                return
            if time.monotonic() > deadline:
                self.held_until = "limit"
                return
        self.held_until = "release"

    def stopped_early(self) -> bool:
        """The held job ended because it was cancelled there, before its last step."""
        return (
            self.finished.is_set()
            and self.held_until == "cancel"
            and bool(self.result is not None and self.result.cancelled)
            and max(self.steps) < (self.total or 0)
        )

    def __repr__(self) -> str:
        why = {"cancel": "cancelled there", "release": "released by the test", None: "never held"}
        cancelled = getattr(self.result, "cancelled", None)
        ended = why.get(self.held_until, f"not cancelled within {self.limit:g} s, so it ran on")
        return f"<job held at step {self.step}: {ended}; steps {self.steps} of {self.total}; cancelled={cancelled}>"


def until(condition: Callable[[], Any], timeout: float = 30.0) -> bool:
    """Poll `condition` until it holds (True) or `timeout` seconds pass (False): a bound against a
    hang, never a claim about speed."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def send_and_leave(url: str, body: dict, auth: tuple[str, str] | None = None, key: str | None = None):
    """POST `body` as JSON to `url` and return the connection without reading the answer: closing it
    is the client going away, at the moment the test chooses."""
    parts = urlsplit(url)
    headers = {"Content-Type": "application/json"}
    if auth is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(":".join(auth).encode()).decode()
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=60)
    connection.request("POST", parts.path, body=json.dumps(body), headers=headers)
    return connection
