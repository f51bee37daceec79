"""Who may call the HTTP APIs, and as which engine caller.

Gradio's `auth` guards only Gradio's own routes, so the A1111 and OpenAI routes check the caller
here, with the same accounts:
- HTTP Basic `user:password` with the AUTH / AUTH_FILE users (A1111's `--api-auth`; Open WebUI
  sends it as "user:password" in its A1111 settings);
- `Authorization: Bearer <key>` with one of API_KEYS (what the `openai` SDK sends), or a bearer
  token "user:password" of an AUTH user (for clients that only have an API-key field).
With neither AUTH nor API_KEYS set, every caller is let in (HTTP_API then serves only on localhost
unless asked: `AppSettings.http_api_enabled`).

Each HTTP call is a one-off engine caller (its own session), counted for QUEUE_PER_USER by user, or
by API key, or by address.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from dataclasses import dataclass
from typing import Any

from engine import AppSettings, Caller
from engine.auth import Users


class Unauthorized(Exception):
    """No or wrong credentials; each API answers it in its own error shape (401)."""


@dataclass(frozen=True)
class Access:
    users: Users | None = None
    keys: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, settings: AppSettings) -> Access:
        return cls(settings.users, settings.api_keys)

    @property
    def open(self) -> bool:
        return self.users is None and not self.keys

    def describe(self) -> str:
        if self.open:
            return "no sign-in"
        parts = (["HTTP Basic with the AUTH users"] if self.users else []) + (["Bearer API_KEYS"] if self.keys else [])
        return " or ".join(parts)

    def caller(self, request: Any) -> Caller:
        """The engine caller of a Starlette request, or `Unauthorized`."""
        address = request.client.host if request.client else None
        session = secrets.token_hex(8)  # each HTTP call is its own session (A1111's /interrupt stops by caller)
        if self.open:
            return Caller(session=session, address=address, one_off=True)
        scheme, _, value = (request.headers.get("authorization") or "").partition(" ")
        user = self._user(scheme.lower(), value.strip())
        if user is None:
            raise Unauthorized("missing or wrong credentials: use HTTP Basic user:password or a Bearer API key")
        return Caller(user=user, session=session, address=address, one_off=True)

    def key_caller(self, request: Any, key: str) -> Caller:
        """The caller of a request that carries one of API_KEYS in its path (for clients that send no
        credentials at all: SillyTavern's ComfyUI calls); `Unauthorized` for anything else."""
        user = self._key_user(key)
        if user is None:
            raise Unauthorized("the key in the path is not one of API_KEYS")
        address = request.client.host if request.client else None
        return Caller(user=user, session=secrets.token_hex(8), address=address, one_off=True)

    def _key_user(self, value: str) -> str | None:
        """"key:N" when `value` is the N-th of API_KEYS (compared in constant time), else None."""
        for n, key in enumerate(self.keys):
            if hmac.compare_digest(key.encode(), value.encode()):
                return f"key:{n + 1}"
        return None

    def _user(self, scheme: str, value: str) -> str | None:
        """The signed-in name ("key:N" for the N-th API key), or None."""
        if scheme == "basic":
            try:
                value = base64.b64decode(value, validate=True).decode("utf-8")
            except (binascii.Error, UnicodeDecodeError):
                return None
        elif scheme != "bearer":
            return None
        if scheme == "bearer" and (user := self._key_user(value)) is not None:
            return user
        name, sep, password = value.partition(":")
        if sep and self.users is not None and self.users(name, password):
            return name
        return None
