"""The handlers behind the Inpaint tab and `/inpaint`, `/outpaint`: parse, run like an edit, save, answer.

Kept beside `ui.studio` (not in it, which holds the handlers every tab shares): an inpaint is a
`GenerationRequest` with one input image and an `Inpaint`, run through `Studio.run` exactly as an
edit is (the same engine queue, per-caller limits, previews and saving). Inpaints go to the main
model (the editor router sends them there), so they are checked against its limits.
"""

from __future__ import annotations

from typing import Any

import gradio as gr
from PIL import Image

from pipelines import EMPTY_MASK_WARNING, binary_mask, extend_canvas
from pipelines.schema.fields import whole
from ui import uploads
from ui.fields import OUTPAINT_SIDES
from ui.studio import Studio, _previews
from ui.text import refuse


def editor_image_and_mask(value: Any, mask_upload: Image.Image | None) -> tuple[Image.Image, Image.Image]:
    """The picture and the mask from the Inpaint tab's ImageEditor value.

    The picture is the editor's background; the mask is the union of the painted pixels (alpha > 0)
    of every layer, or the uploaded mask image when one is given (it replaces the strokes).
    """
    background = (value or {}).get("background")
    if background is None:
        raise uploads.InputError("image: upload a picture into the editor first")
    image = background.convert("RGB")
    if mask_upload is not None:
        return image, mask_upload
    mask = Image.new("L", image.size, 0)
    for layer in (value or {}).get("layers") or []:
        painted = binary_mask(layer.convert("RGBA"))  # by alpha: any stroke, whatever its colour
        if painted.size != image.size:  # a canvas of another size than the picture: the layer covers it
            painted = painted.resize(image.size, Image.Resampling.NEAREST)
        mask.paste(255, mask=painted)
    return image, mask


def inpaint(studio: Studio, raw: dict[str, Any], image: Image.Image, mask: Image.Image, request, progress):
    """Yields ("preview", images) while denoising, then ("done", (gallery, result, paths))."""
    try:
        uploads.check_pixels(image, "image", studio.limits)
        req = studio.request({**raw, "init_images": [image], "mask": mask}, studio.limits.for_task("inpaint"))
    except ValueError as exc:
        raise refuse(str(exc)) from exc
    result = yield from _previews(studio.run(req, request, progress))
    if EMPTY_MASK_WARNING in result.warnings:  # also in the info line and the API's info
        gr.Warning(EMPTY_MASK_WARNING)
    paths = studio.save(result, request)
    gallery = [(p, f"seed {s}") for p, s in zip(paths, result.seeds, strict=True)]
    yield "done", (gallery, result, paths)


def outpaint(studio: Studio, raw: dict[str, Any], image: Image.Image, request, progress):
    """Extend the canvas by `raw`'s left/up/right/down pixels and inpaint the new border (same events)."""
    try:
        uploads.check_pixels(image, "image", studio.limits)
        sides = {side: _pixels(side, raw.get(side)) for side in OUTPAINT_SIDES}
        canvas, mask = extend_canvas(image, **sides, step=studio.info.size_multiple)
    except ValueError as exc:
        raise refuse(str(exc)) from exc
    yield from inpaint(studio, {**raw, "invert_mask": False}, canvas, mask, request, progress)


def _pixels(side: str, value: Any) -> int:
    """An outpaint side's pixels by the schema's whole-number rules (0 when unset); its range and the
    model's size step are `extend_canvas`'s to check."""
    if value in (None, ""):
        return 0
    try:
        return whole(value)
    except ValueError as exc:
        raise uploads.InputError(f"{side}: {exc}") from None

