"""Reading an HTTP API's JSON body, bounded, with every malformed body a 4xx naming no field.

Both APIs read their bodies here, so the same body gets the same answer from each (a body nested
thousands of levels deep once gave A1111's routes a 500 naming Python's RecursionError).
"""

from __future__ import annotations

import json
from typing import Any

from .errors import WireError


class TooLarge(WireError):
    """The body is over its cap (A1111 answers 422 as FastAPI would; OpenAI 413)."""


def fields_cap(max_prompt_chars: int) -> int:
    """Bytes a body of fields may take (no images): room for two MAX_PROMPT_CHARS prompts in JSON's
    widest escapes (\\uXXXX, 6 bytes a character, some characters two) and every other field."""
    return 65536 + 16 * max_prompt_chars


async def read_bytes(request: Any, cap: int) -> bytes:
    """The body, read up to `cap` bytes (TooLarge past it: nothing more is read)."""
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > cap:
            raise TooLarge((), f"the request body is larger than {cap} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


async def json_body(request: Any, cap: int) -> Any:
    """The decoded JSON body (None when empty), or WireError saying what is wrong with it."""
    raw = await read_bytes(request, cap)
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except RecursionError:  # "[[[[..." nested past Python's stack: a malformed body, not a server error
        raise WireError((), "the request body is not valid JSON: nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError((), f"the request body is not valid JSON: {exc}") from None
