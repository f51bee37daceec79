"""Short positional REST calls of the public endpoints, answered as the named calls they stand for.

Gradio's `POST /gradio_api/call/<endpoint>` takes `{"data": [...]}` with one value per parameter and
refuses a shorter list, while gradio_client and `call/v2/<endpoint>` (named values) give each
parameter left out its default. Callers written against an endpoint as first published (the
README's ten-value `/generate` curl of earlier releases, scripts) send only the values it had then;
each field added since is appended to the endpoint (`ui.fields`), so their list is a prefix.

This ASGI middleware, given to Gradio's FastAPI app through `launch(app_kwargs=...)`, turns such a
call into the named call of the values it sent (`call/v2`), so Gradio itself fills the rest with
the same defaults as for a named caller. A full list, any other route and anything that is not a
JSON list shorter than the endpoint's parameters pass through untouched: Gradio answers them.
"""

from __future__ import annotations

import json
import re
from typing import Any

from ui.fields import LEADING, call_order

PREFIX = "/gradio_api/call/"
ROUTE = re.compile(rf"{re.escape(PREFIX)}({'|'.join(LEADING)})/?$")
MAX_BODY = 1 << 20  # a positional call carries values and file references, never file contents


def named(endpoint: str, body: bytes) -> bytes | None:
    """The `call/v2` body for a short positional call's `body`, or None to leave the call as sent."""
    try:
        sent = json.loads(body)
    except (ValueError, RecursionError):
        return None
    order = call_order(endpoint)
    values = sent.get("data") if isinstance(sent, dict) else None
    if not isinstance(values, list) or len(values) >= len(order):
        return None
    return json.dumps(dict(zip(order[: len(values)], values, strict=True))).encode()


class PositionalCalls:
    """ASGI middleware: a short `{"data": [...]}` call of a public endpoint becomes its named call."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        match = ROUTE.search(scope["path"]) if scope["type"] == "http" and scope["method"] == "POST" else None
        if match is None:
            await self.app(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more and size <= MAX_BODY:
            message = await receive()
            if message["type"] != "http.request":  # the caller left: nothing to answer
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        body = b"".join(chunks)
        rewritten = None if more else named(match.group(1), body)
        if rewritten is not None:
            scope = _to_v2(scope, match.start(1), rewritten)
            body = rewritten
        await self.app(scope, _replay(body, more, receive), send)


def _to_v2(scope: dict, at: int, body: bytes) -> dict:
    """`scope` for the same endpoint's `call/v2` route, with `body`'s length."""
    path = scope["path"][:at] + "v2/" + scope["path"][at:]
    headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
    headers.append((b"content-length", str(len(body)).encode()))
    return {**scope, "path": path, "raw_path": path.encode(), "headers": headers}


def _replay(body: bytes, more: bool, receive: Any) -> Any:
    """A `receive` that gives `body` first (the rest still to come when `more`), then the caller's own."""
    sent = False

    async def replayed() -> dict:
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": more}

    return replayed
