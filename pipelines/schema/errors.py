"""Domain errors of the pipeline layer. The UI turns them into `gr.Error` with their message."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipelines.schema.request import GenerationResult


class PipelineError(Exception):
    """Base class: a message meant for the user, not a traceback."""


class ModelLoadError(PipelineError):
    """The model could not be found or loaded; the message says how to fix it."""


class LoraError(PipelineError, ValueError):
    """A LoRA file was refused or does not fit the loaded model."""


class UnsupportedTaskError(PipelineError, ValueError):
    """The loaded model cannot do what was asked (text-to-image on an edit-only model...)."""


class OutOfMemoryError(PipelineError):
    """Out of memory even at one image per micro-batch. `partial` holds what did finish."""

    def __init__(self, message: str, partial: GenerationResult | None = None):
        super().__init__(message)
        self.partial = partial
