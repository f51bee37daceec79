"""Who a Gradio event comes from, as the engine counts callers (`engine.Caller`).

A browser tab or a gradio_client session has a session id; a plain REST call
(`POST /gradio_api/call/generate`) gets its own event id as its session, which is what it passes
to `/stop` as `job_id`. Such one-off calls share the per-caller limit by address, or every call
would be a new caller.
"""

from __future__ import annotations

from typing import Any

from gradio.context import LocalContext

from engine import Caller


def user_of(request: Any) -> str | None:
    """The signed-in user (AUTH), or None when sign-in is off."""
    return getattr(request, "username", None) or None


def caller_of(request: Any) -> Caller:
    """The engine's caller for a Gradio event's request."""
    session = getattr(request, "session_hash", None)
    client = getattr(request, "client", None)
    event_id = LocalContext.event_id.get(None)
    return Caller(
        user=user_of(request),
        session=session,
        address=getattr(client, "host", None),
        one_off=session is not None and session == event_id,
    )
