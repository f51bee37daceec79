"""Running an HTTP call's request through the engine, and answering with images.

`run_job` submits with the caller's identity (so QUEUE_SIZE / QUEUE_PER_USER / the model's limits
apply exactly as for the UI), then waits for the result without blocking the event loop; a client
that disconnects cancels its own job (dropped if still queued, stopped after its step if running),
nobody else's. Waiting is event-driven: the job's result and the connection's `http.disconnect`,
whichever comes first.
"""

from __future__ import annotations

import asyncio
import base64
import io
import logging
import threading
from collections.abc import Callable
from typing import Any

from PIL import Image

from engine import Caller, Engine
from engine.jobs import Job
from pipelines import GenerationRequest, GenerationResult, png_info

log = logging.getLogger(__name__)


class ClientGone(Exception):
    """The caller disconnected before its result; its job was cancelled."""


async def run_job(
    engine: Engine, request: GenerationRequest, caller: Caller, http_request: Any = None
) -> GenerationResult:
    """Submit (raises engine.Refused / ValueError as submit does) and await the result.

    `http_request`: the Starlette request, watched for a disconnect (its body must already be read).
    """
    job = engine.submit(request, caller)
    return await wait(engine, job, http_request)


async def wait(engine: Engine, job: Job, http_request: Any = None) -> GenerationResult:
    return await until_gone(job.result, http_request, lambda: engine.cancel(job), f"job {job.id}")


async def until_gone(work: Callable[[], Any], http_request: Any, on_gone: Callable[[], None], what: str) -> Any:
    """`work()`'s value, run on a thread of its own, or ClientGone after calling `on_gone` when the
    client disconnects first (a job: cancelled; a script: its cells stopped)."""
    result = _on_thread(work, what)
    watchers = {result}
    if http_request is not None:
        watchers.add(asyncio.ensure_future(_disconnected(http_request)))
    try:
        done, _ = await asyncio.wait(watchers, return_when=asyncio.FIRST_COMPLETED)
        if result not in done:
            on_gone()
            log.info("client went away: %s cancelled", what)
            raise ClientGone("the client disconnected")
        return result.result()
    finally:
        for watcher in watchers - {result}:
            watcher.cancel()
        if not result.done():  # the work ends after its current step; nobody reads its result
            result.add_done_callback(lambda f: f.cancelled() or f.exception())


def _on_thread(work: Callable[[], Any], what: str) -> asyncio.Future:
    """`work()` as a future, waited for on a thread of its own: not one of the event loop's
    default executor threads (a few on a small machine), which QUEUE_SIZE waiting calls would all
    hold, starving every other `to_thread` (image decoding and encoding) behind them."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(outcome: Any, failed: bool) -> None:
        if not future.done():
            (future.set_exception if failed else future.set_result)(outcome)

    def follow() -> None:
        try:
            outcome, failed = work(), False
        except BaseException as exc:  # handed to the awaiting coroutine, which raises it
            outcome, failed = exc, True
        if not loop.is_closed():  # a closed loop has no caller left to tell
            loop.call_soon_threadsafe(settle, outcome, failed)

    threading.Thread(target=follow, name=f"wait-{what}", daemon=True).start()
    return future


async def _disconnected(http_request: Any) -> None:
    """Returns when the client closes the connection (ASGI's `http.disconnect`)."""
    while True:
        message = await http_request.receive()
        if message.get("type") == "http.disconnect":
            return


def png_bytes(image: Image.Image, meta: dict[str, Any] | None = None) -> bytes:
    """A PNG with our metadata (the A1111 `parameters` text and our JSON), as saved files have."""
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", pnginfo=png_info(meta) if meta else None)
    return buffer.getvalue()


def png_base64(image: Image.Image, meta: dict[str, Any] | None = None) -> str:
    return base64.b64encode(png_bytes(image, meta)).decode("ascii")
