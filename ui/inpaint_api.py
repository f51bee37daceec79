"""The public `/inpaint` and `/outpaint`: the picture and the mask arrive as files.

Files, not decoded images, so that their headers are checked (pixel limit, and the mask's size
against the picture's) before anything is decoded (`ui.inputs.open_image_and_mask`). The other
parameters are raw JSON checked by `ui.inputs`, named by `ui.fields.INPAINT_API`; the events run
on the same queue and under the same per-caller rules as `/edit`.
"""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from pipelines.inpaint import DEFAULT_STRENGTH, INPAINT_DEFAULTS
from ui import inpainting, inputs
from ui.api import with_parameters
from ui.fields import INPAINT_API, OUTPAINT_SIDES
from ui.studio import Studio
from ui.text import refuse

TEXT = ("prompt", "negative_prompt", "masked_content", "inpaint_area")  # the parameters sent as text

# A parameter a caller leaves out: None is "the model's" (steps, guidance, guidance_end).
DEFAULTS: dict[str, Any] = {
    "prompt": "", "negative_prompt": "", "strength": DEFAULT_STRENGTH, "mask_blur": INPAINT_DEFAULTS.mask_blur,
    "masked_content": INPAINT_DEFAULTS.masked_content, "inpaint_area": INPAINT_DEFAULTS.inpaint_area,
    "padding": INPAINT_DEFAULTS.padding, "invert_mask": INPAINT_DEFAULTS.invert,
    "num_images": 1, "steps": None, "guidance_scale": None, "seed": -1, "sampler": "", "guidance_end": None,
    "step_cache": None, "step_cache_threshold": None,
    "left": 0, "up": 0, "right": 0, "down": 0,
}  # fmt: skip


def _inputs(names: tuple[str, ...]) -> list[Any]:
    """Hidden inputs for the API's raw values (a text box for text, JSON for the rest)."""
    return [
        gr.Textbox(value=DEFAULTS[n], label=n, visible=False)
        if n in TEXT
        else gr.JSON(value=json.dumps(DEFAULTS[n]), label=n, visible=False)
        for n in names
    ]


def _file(label: str) -> gr.File:
    return gr.File(label=label, type="filepath", visible=False)


def _open(studio: Studio, image: Any, mask: Any = None):
    try:
        if mask is None:
            return inputs.open_image(image, studio.limits), None
        return inputs.open_image_and_mask(image, mask, studio.limits)
    except ValueError as exc:
        raise refuse(str(exc)) from exc


def padding() -> tuple[int, Any]:
    """How many values the first callers of /inpaint sent after the files (the step cache came later),
    and null (the model's) for each added since; /outpaint has its four sides more."""
    first = INPAINT_API.index("step_cache")
    return first, lambda: [None] * (len(INPAINT_API) - first)


def wire(studio: Studio) -> dict[Any, tuple[int, Any]]:
    """/inpaint and /outpaint; returns each one's `accept_shorter_calls` entry."""

    def api_inpaint(*args: Any):
        request, image, mask, *values, progress = args
        raw = dict(zip(INPAINT_API, values, strict=True))
        picture, painted = _open(studio, image, mask)
        gallery, result, _ = inpainting.finish(inpainting.inpaint(studio, raw, picture, painted, request, progress))
        return gallery, result.info()

    def api_outpaint(*args: Any):
        request, image, *values, progress = args
        raw = dict(zip((*OUTPAINT_SIDES, *INPAINT_API), values, strict=True))
        picture, _ = _open(studio, image)
        gallery, result, _ = inpainting.finish(inpainting.outpaint(studio, raw, picture, request, progress))
        return gallery, result.info()

    with_parameters(api_inpaint, ("image", "mask", *INPAINT_API), DEFAULTS)
    api_inpaint.__doc__ = (
        "Repaint where the mask is painted (white, or alpha for a transparent PNG); the mask has the image's size. "
        "Every pixel outside the mask stays the image's. seed < 0 means random; null: the model's default."
    )
    with_parameters(api_outpaint, ("image", *OUTPAINT_SIDES, *INPAINT_API), DEFAULTS)
    api_outpaint.__doc__ = (
        "Extend the image by left/up/right/down pixels (multiples of the model's size step) and paint the new border."
    )
    outputs = [gr.Gallery(visible=False, format="png"), gr.JSON(visible=False)]
    queue = dict(concurrency_id="generate", concurrency_limit=None)  # the engine admits and queues (ui.demo)
    gr.Button(visible=False).click(
        api_inpaint, [_file("image"), _file("mask"), *_inputs(INPAINT_API)], outputs, api_name="inpaint", **queue
    )
    gr.Button(visible=False).click(
        api_outpaint, [_file("image"), *_inputs((*OUTPAINT_SIDES, *INPAINT_API))], outputs, api_name="outpaint", **queue
    )
    count, added = padding()
    return {api_inpaint: (2 + count, added), api_outpaint: (1 + len(OUTPAINT_SIDES) + count, added)}
