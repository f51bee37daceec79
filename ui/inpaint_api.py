"""The public `/inpaint` and `/outpaint`: the picture and the mask arrive as files.

Files, not decoded images, so that their headers are checked (pixel limit, and the mask's size
against the picture's) before anything is decoded (`ui.uploads.open_image_and_mask`). The other
parameters are the Inpaint tab's fields (`ui.fields.parameters("inpaint")`), raw JSON checked by the
schema; the events run on the same queue and under the same per-caller rules as `/edit`.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from ui import inpainting, uploads
from ui.api import gallery_and_info, hidden_inputs
from ui.fields import OUTPAINT_SIDES, parameters
from ui.studio import Studio, api_answers
from ui.text import refuse


def _file(label: str) -> gr.File:
    return gr.File(label=label, type="filepath", visible=False)


def _open(studio: Studio, image: Any, mask: Any = None):
    try:
        if mask is None:
            return uploads.open_image(image, studio.limits), None
        return uploads.open_image_and_mask(image, mask, studio.limits)
    except ValueError as exc:
        raise refuse(str(exc)) from exc


def wire(studio: Studio) -> None:
    """/inpaint and /outpaint."""

    def api_inpaint(request: gr.Request, image: Any = None, mask: Any = None, progress=gr.Progress(), **values: Any):
        """Repaint where the mask is painted (white, or alpha for a transparent PNG); the mask has the image's
        size. Every pixel outside the mask stays the image's. seed < 0 means random; a parameter left out
        (or null) is the default (the model's)."""
        picture, painted = _open(studio, image, mask)
        yield from api_answers(inpainting.inpaint(studio, values, picture, painted, request, progress), gallery_and_info, 2)

    def api_outpaint(request: gr.Request, image: Any = None, progress=gr.Progress(), **values: Any):
        """Extend the image by left/up/right/down pixels (multiples of the model's size step) and paint the
        new border."""
        picture, _ = _open(studio, image)
        yield from api_answers(inpainting.outpaint(studio, values, picture, request, progress), gallery_and_info, 2)

    outputs = [gr.Gallery(visible=False, format="png"), gr.JSON(visible=False)]
    queue = dict(concurrency_id="generate", concurrency_limit=None)  # the engine admits and queues (ui.demo)
    fields = hidden_inputs("inpaint", parameters("inpaint"))
    gr.Button(visible=False).click(
        api_inpaint, inputs=[_file("image"), _file("mask")], inputs_kwargs=fields, outputs=outputs,
        api_name="inpaint", **queue,
    )  # fmt: skip
    sides = {side: gr.JSON(value=json.dumps(0), label=f"{side} (pixels)", visible=False) for side in OUTPAINT_SIDES}
    gr.Button(visible=False).click(
        api_outpaint, inputs=[_file("image")], inputs_kwargs={**sides, **hidden_inputs("inpaint", parameters("inpaint"))},
        outputs=outputs, api_name="outpaint", **queue,
    )  # fmt: skip
