"""ComfyUI's prompt queue, history and websocket clients, kept per caller.

`Prompts` holds the queue (pending prompts in order, the running ones), runs them on worker
threads (as many as the backend runs at once: a device pool's replicas each take one; inside, every
sampler is an engine job, so the UI's, A1111's and OpenAI's callers share the same queue and
limits), and keeps the finished ones' history (the newest MAX_HISTORY). Every read and every
change is the caller's own: another caller's prompt ids are unknown to it. `Sockets` delivers a
prompt's messages to the websocket of its `client_id`, and the queue's status to every socket.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.websockets import WebSocketDisconnect

from engine import Caller, Engine, QueueFull
from pipelines import PipelineError

from .execute import Cache, Folders, Interrupted, Run, execute
from .graph import Graph

log = logging.getLogger(__name__)
MAX_HISTORY = 200  # finished prompts kept per caller (each with its graph: at most MAX_PROMPT_BYTES)
MAX_PENDING = 1000  # prompts waiting, every caller's together
MAX_PENDING_PER_CALLER = 200
OUTBOX_SIZE = 1000  # websocket messages waiting for a slow client
IDLE_SECONDS = 30.0  # a worker with nothing to run for this long ends (`add` starts another)


@dataclass
class Entry:
    id: str
    number: int
    owner: str | None
    caller: Caller
    client_id: str | None
    graph: Graph
    extra: dict[str, Any]
    status: str = "pending"  # pending | running | success | error
    outputs: dict[str, Any] = field(default_factory=dict)
    messages: list[list[Any]] = field(default_factory=list)
    run: Run | None = None
    cancelled: bool = False

    def queue_item(self) -> list[Any]:
        """ComfyUI's queue entry: [number, prompt_id, prompt, extra_data, outputs to execute]."""
        return [self.number, self.id, self.graph.raw, self.extra, list(self.graph.outputs)]

    def history_item(self) -> dict[str, Any]:
        return {
            "prompt": self.queue_item(),
            "outputs": self.outputs,
            "status": {"status_str": self.status, "completed": self.status == "success", "messages": self.messages},
            "meta": {node: {"node_id": node, "display_node": node} for node in self.outputs},
        }


@dataclass
class Outbox:
    """One open websocket's messages, sent in order by its own task on its own event loop; a client
    too slow to take OUTBOX_SIZE of them loses the newest rather than the server's memory."""

    socket: Any
    owner: str | None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.get_running_loop)
    queue: asyncio.Queue = field(default_factory=lambda: asyncio.Queue(OUTBOX_SIZE))

    def put(self, message: Any) -> None:
        """From any thread."""
        with contextlib.suppress(RuntimeError):  # the socket's loop has closed: the client is gone
            self.loop.call_soon_threadsafe(self._offer, message)

    def _offer(self, message: Any) -> None:
        if not self.queue.full():
            self.queue.put_nowait(message)

    async def drain(self) -> None:
        """Send until the socket closes (then the handler's receive loop ends too)."""
        while True:
            message = await self.queue.get()
            try:
                await (self.socket.send_bytes(message) if isinstance(message, bytes) else self.socket.send_json(message))
            except (RuntimeError, OSError, WebSocketDisconnect):  # closed under us: nothing more to send
                return


class Sockets:
    """Open websockets by client id, each with its caller (`Outbox`)."""

    def __init__(self) -> None:
        self._open: dict[tuple[str | None, str], Outbox] = {}  # (caller, client id): one caller cannot take another's
        self._lock = threading.Lock()

    def add(self, client_id: str, socket: Any, owner: str | None) -> Outbox:
        """On the socket's event loop."""
        outbox = Outbox(socket, owner)
        with self._lock:
            self._open[owner, client_id] = outbox
        return outbox

    def remove(self, client_id: str, outbox: Outbox) -> None:
        with self._lock:
            if self._open.get((outbox.owner, client_id)) is outbox:
                del self._open[outbox.owner, client_id]

    def send(self, owner: str | None, client_id: str | None, message: Any) -> None:
        """To the prompt's client (its caller's own socket only); without a client id, to every socket of the caller."""
        with self._lock:
            targets = [o for (who, cid), o in self._open.items() if who == owner and client_id in (None, cid)]
        for outbox in targets:
            outbox.put(message)

    def broadcast(self, message_for: Callable[[str | None], Any]) -> None:
        with self._lock:
            targets = list(self._open.values())
        for outbox in targets:
            outbox.put(message_for(outbox.owner))


class Prompts:
    def __init__(self, engine: Engine, folders: Folders, workers: int):
        self.engine, self.folders = engine, folders
        self.sockets = Sockets()
        self._changed = threading.Condition()
        self._pending: list[Entry] = []
        self._running: dict[str, Entry] = {}
        self._history: OrderedDict[str, Entry] = OrderedDict()
        self._caches: dict[str | None, Cache] = {}
        self._number = 0
        self._workers = workers
        self._alive = 0  # worker threads running

    # ------------------------------------------------------------- queue
    def known(self, prompt_id: str) -> bool:
        with self._changed:
            return prompt_id in self._running or prompt_id in self._history or any(e.id == prompt_id for e in self._pending)

    def add(self, owner: str | None, entry_for: Callable[[int], Entry], front: bool = False) -> Entry:
        """Queue a prompt; `QueueFull` past MAX_PENDING prompts waiting (ComfyUI has no bound; a
        client may queue a batch of prompts at once, so this is wider than the engine's QUEUE_SIZE)."""
        with self._changed:
            mine = sum(e.owner == owner for e in self._pending)
            if len(self._pending) >= MAX_PENDING or mine >= MAX_PENDING_PER_CALLER:
                raise QueueFull(f"{mine} of your prompts ({len(self._pending)} in all) are waiting: try again in a moment")
            self._number += 1
            entry = entry_for(-self._number if front else self._number)
            (self._pending.insert(0, entry) if front else self._pending.append(entry))
            self._start_workers()
            self._changed.notify()
        self._status()
        return entry

    def remaining(self, owner: str | None = None) -> int:
        with self._changed:
            entries = [*self._pending, *self._running.values()]
            return sum(owner is None or e.owner == owner for e in entries)

    def queue(self, owner: str | None) -> dict[str, list]:
        with self._changed:
            return {
                "queue_running": [e.queue_item() for e in self._running.values() if e.owner == owner],
                "queue_pending": [e.queue_item() for e in self._pending if e.owner == owner],
            }

    def delete(self, owner: str | None, ids: list[str] | None) -> int:
        """Drop the caller's pending prompts (all when `ids` is None); returns how many."""
        with self._changed:
            keep = [e for e in self._pending if e.owner != owner or (ids is not None and e.id not in ids)]
            dropped = len(self._pending) - len(keep)
            self._pending = keep
        self._status()
        return dropped

    def interrupt(self, owner: str | None, prompt_id: str | None = None) -> int:
        """Stop the caller's running prompt(s) after the current step."""
        with self._changed:
            running = [e for e in self._running.values() if e.owner == owner and prompt_id in (None, e.id)]
        for entry in running:
            entry.cancelled = True
            if entry.run is not None:
                entry.run.interrupt()
        return len(running)

    # ------------------------------------------------------------- history
    def history(self, owner: str | None, prompt_id: str | None = None, max_items: int | None = None) -> dict[str, Any]:
        with self._changed:
            mine = [e for e in self._history.values() if e.owner == owner and prompt_id in (None, e.id)]
        if max_items is not None:
            mine = mine[-max_items:]
        return {e.id: e.history_item() for e in mine}

    def forget(self, owner: str | None, ids: list[str] | None) -> int:
        with self._changed:
            gone = [k for k, e in self._history.items() if e.owner == owner and (ids is None or k in ids)]
            for k in gone:
                del self._history[k]
        return len(gone)

    # ------------------------------------------------------------- running
    def _start_workers(self) -> None:
        """Enough workers for the pending prompts, up to the backend's concurrency (under the lock)."""
        while self._alive < min(self._workers, len(self._pending) + len(self._running)):
            self._alive += 1
            threading.Thread(target=self._work, name="comfy-prompts", daemon=True).start()

    def _next(self) -> Entry | None:
        """The next pending prompt, or None after IDLE_SECONDS without one (the worker then ends:
        an app that is closed keeps no thread, and no engine, alive)."""
        with self._changed:
            if not self._changed.wait_for(lambda: self._runnable() is not None, IDLE_SECONDS):
                self._alive -= 1
                return None
            entry = self._runnable()
            self._pending.remove(entry)
            entry.status = "running"
            self._running[entry.id] = entry
            return entry

    def _runnable(self) -> Entry | None:
        """The first pending prompt whose caller runs fewer prompts than QUEUE_PER_USER (its samplers
        would be refused by the engine otherwise); others' prompts go first meanwhile."""
        limit = self.engine.admission.per_caller
        for entry in self._pending:
            if sum(r.owner == entry.owner for r in self._running.values()) < limit:
                return entry
        return None

    def _work(self) -> None:
        while (entry := self._next()) is not None:
            self._status()
            ending: list[dict[str, Any]] = []
            try:
                ending = self._execute(entry)
            finally:
                self._file(entry)
                for message in ending:  # after the history entry exists: clients read it on these
                    self.sockets.send(entry.owner, entry.client_id, message)
                self._status()

    def _file(self, entry: Entry) -> None:
        """Move a finished prompt to the history: the caller's newest MAX_HISTORY kept."""
        with self._changed:
            del self._running[entry.id]
            self._history[entry.id] = entry
            mine = [k for k, e in self._history.items() if e.owner == entry.owner]
            for k in mine[: max(0, len(mine) - MAX_HISTORY)]:
                del self._history[k]
            self._changed.notify_all()  # a caller at QUEUE_PER_USER may run its next prompt

    def _execute(self, entry: Entry) -> list[dict[str, Any]]:
        """Run the prompt; returns the messages that end it (sent once it is in the history)."""

        def send(message: Any) -> None:
            if isinstance(message, dict) and message["type"] in ("execution_start", "execution_cached"):
                entry.messages.append([message["type"], message["data"] | {"timestamp": int(time.time() * 1000)}])
            self.sockets.send(entry.owner, entry.client_id, message)

        extra = entry.extra
        workflow = (extra.get("extra_pnginfo") or {}).get("workflow") if isinstance(extra.get("extra_pnginfo"), dict) else None
        previews = str(extra.get("preview_method", "none")).lower() not in ("none", "")
        entry.run = run = Run(entry.id, self.engine, entry.caller, entry.owner, self.folders, entry.graph, send, previews, workflow)
        if entry.cancelled:
            run.interrupt()
        cache = self._caches.setdefault(entry.owner, Cache())
        try:
            entry.outputs = execute(run, cache)
        except Interrupted:
            return self._failed(entry, "execution_interrupted", {})
        except Exception as exc:  # told to the client and kept in its history; the worker goes on
            if not isinstance(exc, PipelineError | ValueError | OSError):
                log.exception("ComfyUI prompt %s failed at node %s", entry.id, run.node)
            return self._failed(entry, "execution_error", {"exception_message": str(exc), "exception_type": type(exc).__name__,
                                                           "traceback": [], "current_inputs": {}, "current_outputs": {}})  # fmt: skip
        entry.status = "success"
        for warning in run.warnings:
            entry.messages.append(["warning", {"prompt_id": entry.id, "message": warning}])
        done = {"prompt_id": entry.id, "timestamp": int(time.time() * 1000)}
        entry.messages.append(["execution_success", done])
        return [{"type": "execution_success", "data": done}, _done(entry.id)]

    def _failed(self, entry: Entry, kind: str, data: dict[str, Any]) -> list[dict[str, Any]]:
        run = entry.run
        node = run.node if run else ""
        node_type = entry.graph.nodes[node].type.name if node in entry.graph.nodes else ""
        data = {"prompt_id": entry.id, "node_id": node, "node_type": node_type, "executed": [], **data}
        entry.status = "error"
        entry.messages.append([kind, data])
        log.info("ComfyUI prompt %s: %s at node %s", entry.id, kind, node)
        return [{"type": kind, "data": data}, _done(entry.id)]

    def _status(self) -> None:
        """Each socket hears its own caller's count (a client may take 0 as "my prompt is done")."""
        self.sockets.broadcast(lambda owner: status_message(self.remaining(owner)))


def _done(prompt_id: str) -> dict[str, Any]:
    """ComfyUI's "this prompt is over": `executing` with no node."""
    return {"type": "executing", "data": {"node": None, "display_node": None, "prompt_id": prompt_id}}


def status_message(remaining: int, sid: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"status": {"exec_info": {"queue_remaining": remaining}}}
    if sid is not None:
        data["sid"] = sid
    return {"type": "status", "data": data}
