"""A caller's values as a request, under the server's limits: the part of reading a request that every
front end shares (the Gradio tabs and API, the A1111 and OpenAI APIs, the CLI).

Each front end speaks its own names (A1111's `cfg_scale`, OpenAI's `n`, a form's sliders, a CLI
flag) and maps them to the schema's flat names (`pipelines.schema.request.fields`, `names`); `read` then
makes the request in the schema's shape and checks it against the schema and MAX_PROMPT_CHARS. The
serving model's own rules (batch cap, size step, samplers, LoRAs) are the engine's to check when the
request is submitted (`ModelInfo.accept`), so no front end can skip them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pipelines import ModelInfo
from pipelines.schema.request import GenerationRequest, fields, nest

from .settings import AppSettings

_TEXT_KINDS = ("text", "prompt")  # where "" is a value (an empty prompt is refused by name), not "unset"


@dataclass(frozen=True)
class Limits:
    """What the server accepts from a caller: the serving model's limits and the operator's settings."""

    model: ModelInfo
    max_prompt_chars: int = 2000
    max_edit_files: int = 16
    max_upload_pixels: int = 4096 * 4096

    @classmethod
    def of(cls, settings: AppSettings, model: ModelInfo) -> Limits:
        return cls(model, settings.max_prompt_chars, settings.max_edit_files, settings.max_upload_pixels)

    @property
    def max_batch(self) -> int:
        return self.model.max_batch

    def for_task(self, task: str) -> Limits:
        """These limits with the model that serves a request of `task` (`ModelInfo.for_task`)."""
        return dataclasses.replace(self, model=self.model.for_task(task))


def given(flat: Mapping[str, Any], blank_is_unset: bool = True) -> dict[str, Any]:
    """The values a caller really set: null is "the default" everywhere (the model's, the method's,
    the field's); so is "" for every field but text where `blank_is_unset` (a form's empty box, and
    the Gradio endpoints' own default for "the model's"), while the HTTP APIs' clients send JSON,
    where "" for a number is a mistake to name."""
    kinds = {spec.name: spec.kind for spec in fields()}
    return {
        name: value
        for name, value in flat.items()
        if value is not None and not (blank_is_unset and value == "" and kinds.get(name) not in _TEXT_KINDS)
    }


def read(flat: Mapping[str, Any], limits: Limits, blank_is_unset: bool = True) -> GenerationRequest:
    """The request from a front end's flat values (schema names; unset: the field's default), checked
    by the schema with MAX_PROMPT_CHARS; RequestError naming the field otherwise."""
    return GenerationRequest.parse(nest(given(flat, blank_is_unset)), limits.max_prompt_chars)
