"""The request field a refusal names, for the APIs that answer with the field.

Every check below the engine starts its ValueError with our field's name ("steps: 200 is out of
range", "init_images[1]: not an image", "width x height (64x64): ..."). This parses that
convention once; each API maps the name to its own request field (A1111's `loc`, OpenAI's `param`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# name, an optional numeric index ("[1]"), an optional other bracket or parenthesis, then ":".
_FIELD = re.compile(r"^([A-Za-z_][\w ]*?)(?:\[(\d+)\])?(?:\[[^\]]*\])?\s*(?:\([^)]*\))?:\s*")


@dataclass(frozen=True)
class NamedField:
    name: str  # ours, as the check wrote it
    index: int | None  # which item of a list field ("init_images[1]")
    detail: str  # the message after the field


def named_field(message: str) -> NamedField | None:
    """The field a check's message starts with, or None when it names none."""
    match = _FIELD.match(message)
    if not match:
        return None
    index = match.group(2)
    return NamedField(match.group(1).strip(), int(index) if index is not None else None, message[match.end() :])
