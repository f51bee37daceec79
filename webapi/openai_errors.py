"""OpenAI's error object for the `/v1` routes, and the route class that guarantees it.

Every answer that is not a success is `{"error": {"message", "type", "param", "code"}}`, as the
`openai` SDK parses it (`BadRequestError.param`, `.code`, `.message`):
- 400 `invalid_request_error`, `param` naming the request field (bad JSON, types, ranges, images);
- 401 `invalid_request_error` / `invalid_api_key` (no or wrong credentials);
- 404 `invalid_request_error` / `not_found` (an unknown model, an expired image URL);
- 429 `rate_limit_error` (`rate_limit_exceeded`: QUEUE_PER_USER; `queue_full`: QUEUE_SIZE), with Retry-After;
- 500 `server_error` (the message only: the traceback goes to the log), 503 when the server cannot
  take the job at all (a model that failed to load).

`OpenAIRoute` wraps each handler of the router, so FastAPI's own errors on these routes
(RequestValidationError, HTTPException) and anything unexpected come out in that shape too,
without an app-wide handler that would change Gradio's or the A1111 API's routes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from pipelines.schema.fields import RequestError

from .errors import WireError
from .openai_params import param_name

log = logging.getLogger(__name__)


class OpenAIError(Exception):
    """An answer in OpenAI's error shape; raised anywhere below a route, answered by `OpenAIRoute`."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type, param, code
        self.headers = headers or {}

    def response(self) -> JSONResponse:
        body = {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}
        return JSONResponse(body, status_code=self.status, headers=self.headers)


def bad_request(message: str, param: str | None = None, code: str | None = None) -> OpenAIError:
    """A 400 for a refused value of `param` (OpenAI's name for the field; None: the request)."""
    return OpenAIError(400, message, param=param, code=code or "invalid_value")


def refused(exc: ValueError) -> OpenAIError:
    """A 400 for a refusal: the schema's (`RequestError`, its field named as OpenAI names it), an
    OpenAI field's own (`WireError`), or any other check's (no field)."""
    if isinstance(exc, RequestError):
        param = param_name(exc)
        where = param + "".join(f"[{p}]" for p in exc.sub if isinstance(p, int)) if param else ""
        return bad_request(f"{where}: {exc.detail}" if where else exc.detail, param)
    if isinstance(exc, WireError):
        return bad_request(str(exc), str(exc.loc[0]) if exc.loc else None)
    return bad_request(str(exc))


def not_found(message: str, param: str | None = None) -> OpenAIError:
    return OpenAIError(404, message, param=param, code="not_found")


def _validation(exc: RequestValidationError) -> OpenAIError:
    first = (exc.errors() or [{}])[0]
    where = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
    param = ".".join(where) or None
    return bad_request(f"{param or 'request'}: {first.get('msg', 'invalid value')}", param=param)


def _http(exc: HTTPException) -> OpenAIError:
    kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
    return OpenAIError(exc.status_code, str(exc.detail), type=kind, headers=dict(exc.headers or {}))


class OpenAIRoute(APIRoute):
    """An APIRoute whose every failure is an OpenAI error object (no traceback to the client)."""

    def get_route_handler(self) -> Callable[[Any], Any]:
        handler = super().get_route_handler()

        async def route(request: Any) -> Any:
            try:
                return await handler(request)
            except OpenAIError as exc:
                log.info("OpenAI API: %s %s: %d %s", request.method, request.url.path, exc.status, exc.message)
                return exc.response()
            except RequestValidationError as exc:
                return _validation(exc).response()
            except HTTPException as exc:
                return _http(exc).response()
            except Exception:
                log.exception("OpenAI API: %s %s failed", request.method, request.url.path)
                error = OpenAIError(500, "the server failed to answer this request (see its log)", "server_error")
                return error.response()

        return route
