"""What travels between the app and a replica: plain data only (no ray import here).

Requests and results cross process (and machine) boundaries as dicts of builtins, with images as
PNG bytes: lossless, so an image made by a replica is pixel-identical to one made in-process, and
nothing depends on both sides having the same classes to unpickle (only the same field names).
Errors travel as (kind, message) and are rebuilt as the same exception class with the same
message, so the UI shows exactly what the in-process pipeline would have said.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Any

from PIL import Image

from pipelines.schema import errors
from pipelines.schema.request import GenerationRequest, GenerationResult, unit_fields

PNG_LEVEL = 1  # lossless at any level; level 1 keeps encoding cheap next to the denoising


def png_bytes(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG", compress_level=PNG_LEVEL)
    return buffer.getvalue()


def png_image(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()  # read it now: the buffer is not kept
    return image


def request_to_wire(request: GenerationRequest) -> dict[str, Any]:
    """Every field of the request schema (`model_dump`: a field added to the schema travels without a
    change here), images as PNG bytes."""
    data = request.model_dump()
    if request.init_images is not None:
        data["init_images"] = [png_bytes(image) for image in request.init_images]
    if request.inpaint is not None:
        data["inpaint"]["mask"] = png_bytes(request.inpaint.mask)
    for name in unit_fields():  # ControlNet units, image prompts
        for unit, sent in zip(getattr(request, name), data[name], strict=True):
            sent["image"] = png_bytes(unit.image)
    return data


def request_from_wire(data: dict[str, Any]) -> GenerationRequest:
    """The request again, checked by the schema on this side too."""
    data = dict(data)
    if data.get("init_images") is not None:
        data["init_images"] = [png_image(b) for b in data["init_images"]]
    if data.get("inpaint") is not None:
        data["inpaint"] = {**data["inpaint"], "mask": png_image(data["inpaint"]["mask"])}
    for name in unit_fields():
        data[name] = [{**unit, "image": png_image(unit["image"])} for unit in data.get(name) or ()]
    return GenerationRequest(**data)


def result_to_wire(result: GenerationResult) -> dict[str, Any]:
    data = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
    data["images"] = [png_bytes(image) for image in result.images]
    data["inputs"] = [None if image is None else png_bytes(image) for image in result.inputs]
    data["clips"] = [[png_bytes(frame) for frame in clip] for clip in result.clips]
    return data


def result_from_wire(data: dict[str, Any]) -> GenerationResult:
    data = dict(data)
    data["images"] = [png_image(b) for b in data["images"]]
    data["inputs"] = [None if b is None else png_image(b) for b in data["inputs"]]
    data["clips"] = [[png_image(b) for b in clip] for clip in data.get("clips", ())]
    return GenerationResult(**data)


def error_to_wire(exc: Exception) -> dict[str, Any]:
    """Request errors keep their class name; anything else is reported as a replica failure."""
    if isinstance(exc, errors.PipelineError) and hasattr(errors, type(exc).__name__):
        kind = type(exc).__name__
    elif isinstance(exc, ValueError):
        kind = "ValueError"
    else:
        kind = "failure"
    partial = getattr(exc, "partial", None)
    return {
        "kind": kind,
        "message": str(exc) if kind != "failure" else f"{type(exc).__name__}: {exc}",
        "partial": result_to_wire(partial) if partial is not None else None,
    }


def error_from_wire(data: dict[str, Any]) -> Exception:
    kind, message = data["kind"], data["message"]
    if kind == "ValueError":
        return ValueError(message)
    if kind == "OutOfMemoryError":
        partial = data.get("partial")
        return errors.OutOfMemoryError(message, result_from_wire(partial) if partial else None)
    cls = getattr(errors, kind, None)
    if isinstance(cls, type) and issubclass(cls, errors.PipelineError):
        return cls(message)
    return errors.PipelineError(f"generation failed in a replica's process ({message}); please try again")
