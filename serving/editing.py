"""A second model for the Edit tab: text-to-image on one backend, edits on another.

A text-to-image model "edits" by image-to-image: it redraws the picture from a strength, it does
not follow an instruction. An instruction editor (InstructPix2Pix-style, such as the embedded
`tiny-shapes-edit`) does. `EditRouter` is a `GenerationBackend` that sends requests with input
images to the editor and the others (text-to-image, and inpaints: a mask) to the main model, and describes both in one `ModelInfo`
(`ModelInfo.editor`), so the UI needs no second code path.

Which editor: `EDIT_MODEL_ID` (a folder, Hub id or recipe name); by default the embedded editor
when the main model is the embedded text-to-image model; `EDIT_MODEL_ID=none` edits with the
main model. After a runtime switch to another main model, a default editor steps aside (that
model's own image-to-image or editing serves the Edit tab); one named in EDIT_MODEL_ID stays.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from pipelines import GenerationBackend, ModelInfo, ReplicaStatus
from pipelines.schema.request import GenerationRequest, routes_to_editor
from serving.routing import Beside

log = logging.getLogger(__name__)

MODELS = Path(__file__).resolve().parents[1] / "models"
EMBEDDED_T2I = MODELS / "tiny-shapes"
EMBEDDED_EDITOR = MODELS / "tiny-shapes-edit"


def default_editor(main_model: str, edit_model_id: str) -> str | None:
    """The editor for `main_model` under the EDIT_MODEL_ID setting ("" = automatic, "none" = off)."""
    if edit_model_id.lower() in ("none", "off"):
        return None
    if edit_model_id:
        return edit_model_id
    embedded = _same(main_model, EMBEDDED_T2I) or main_model == EMBEDDED_T2I.name
    return str(EMBEDDED_EDITOR) if embedded and (EMBEDDED_EDITOR / "model_index.json").is_file() else None


def _same(a: str, b: Path) -> bool:
    try:
        return Path(a).resolve() == b.resolve()
    except OSError:
        return False


class EditRouter(Beside):
    """The main backend for text-to-image, the editor backend for requests with input images."""

    def __init__(self, main: GenerationBackend, editor: GenerationBackend, automatic: bool = True):
        super().__init__(main, editor)
        self.editor = editor
        self.automatic = automatic  # the default editor (steps aside when the main model changes)
        self._editing = True

    def _for(self, request: GenerationRequest) -> GenerationBackend:
        """Edits to the editor; text-to-image and inpaints (a mask: the main model's inpainting twin;
        an instruction editor has none) to the main model: `routes_to_editor`'s rule."""
        return self.editor if self._editing and routes_to_editor(request.task) else self.main

    def model_info(self) -> ModelInfo:
        info = self.main.model_info()
        if not self._editing:
            return info
        return dataclasses.replace(info, editor=self.editor.model_info())

    def status(self) -> list[ReplicaStatus]:
        rows = self.main.status()
        if self._editing:
            rows += [dataclasses.replace(r, name=f"{r.name} (editor)", role="editor") for r in self.editor.status()]
        return rows

    def load_model(self, model_id: str, progress: Any = None) -> ModelInfo:
        """Switch the main model (declared when the main backend switches); a default editor serves
        on only beside the embedded model."""
        self.main.load_model(model_id, progress=progress)  # type: ignore[attr-defined]
        if self.automatic:
            self._editing = default_editor(model_id, "") is not None
            log.info("edits now go to %s", "the embedded editor" if self._editing else "the main model")
        return self.model_info()
