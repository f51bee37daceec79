"""The tabs' uploads (Gradio hands them over as files): checked from their headers before decoding.

A file's count and pixel count are checked before any image is decoded (a 120 KB PNG can be
10000x10000), against MAX_EDIT_FILES and MAX_UPLOAD_PIXELS (`engine.inputs.Limits`). The request
fields themselves are the schema's to check (`engine.inputs.read`).
"""

from __future__ import annotations

import base64
import binascii
import io
from pathlib import Path
from typing import Any

from PIL import Image

from engine.inputs import Limits


class InputError(ValueError):
    """An upload was refused; the message names it and is shown to the caller as is."""


def upload_paths(files: Any, limits: Limits) -> list[Path]:
    """Paths of uploaded files, checked for count before anything is opened."""
    if not files:
        raise InputError("images: upload at least one image to edit")
    items = files if isinstance(files, list) else [files]
    if len(items) > limits.max_edit_files:
        raise InputError(f"images: {len(items)} files, more than the limit of {limits.max_edit_files} (MAX_EDIT_FILES)")
    paths = []
    for item in items:
        path = item.get("path") if isinstance(item, dict) else getattr(item, "name", item)
        if not isinstance(path, str | Path):
            raise InputError(f"images: expected uploaded files, got {type(item).__name__}")
        paths.append(Path(path))
    return paths


def _check_headers(paths: list[Path], limits: Limits, names: list[str]) -> list[tuple[int, int]]:
    """Each upload's (width, height) read from its header only, refused over MAX_UPLOAD_PIXELS."""
    sizes = []
    for name, path in zip(names, paths, strict=True):
        try:
            with Image.open(path) as im:  # reads the header only
                sizes.append(im.size)
        except (OSError, Image.DecompressionBombError, ValueError):
            raise InputError(f"{name} ({path.name[:60]}): not an image this server can read") from None
    for name, (w, h) in zip(names, sizes, strict=True):
        if w * h > limits.max_upload_pixels:
            raise InputError(
                f"{name}: {w}x{h} = {w * h} pixels, more than the limit of "
                f"{limits.max_upload_pixels} (MAX_UPLOAD_PIXELS)"
            )
    return sizes


def _load(path: Path, name: str, mode: str | None) -> Image.Image:
    try:
        with Image.open(path) as im:
            im.load()
            return im.convert(mode) if mode else im.copy()
    except (OSError, ValueError):
        raise InputError(f"{name} ({path.name[:60]}): the file is damaged") from None


def open_images(paths: list[Path], limits: Limits) -> list[Image.Image]:
    """Decode uploads only after every header passed the pixel check (a 120 KB PNG can be 10000x10000)."""
    names = [f"images[{i}]" for i in range(len(paths))]
    _check_headers(paths, limits, names)
    return [_load(path, name, "RGB") for path, name in zip(paths, names, strict=True)]


def upload_path(item: Any, name: str) -> Path:
    """The path of one uploaded file (a filepath, a FileData dict or a tempfile), or InputError."""
    if item in (None, ""):
        raise InputError(f"{name}: upload an image")
    path = item.get("path") if isinstance(item, dict) else getattr(item, "name", item)
    if not isinstance(path, str | Path):
        raise InputError(f"{name}: expected an uploaded file, got {type(item).__name__}")
    return Path(path)


def open_image(item: Any, limits: Limits, name: str = "image") -> Image.Image:
    """One uploaded picture as RGB, decoded only after its header passed the pixel check."""
    path = upload_path(item, name)
    _check_headers([path], limits, [name])
    return _load(path, name, "RGB")


def open_image_and_mask(image: Any, mask: Any, limits: Limits) -> tuple[Image.Image, Image.Image]:
    """An inpaint's uploads: both headers checked (pixels, then equal sizes) before either is decoded;
    the image as RGB, the mask as it was painted (its alpha counts: `pipelines.imaging.inpaint.binary_mask`)."""
    paths = [upload_path(image, "image"), upload_path(mask, "mask")]
    (iw, ih), (mw, mh) = _check_headers(paths, limits, ["image", "mask"])
    if (iw, ih) != (mw, mh):
        raise InputError(f"mask: {mw}x{mh} but the image is {iw}x{ih}; the mask must have its image's size")
    return _load(paths[0], "image", "RGB"), _load(paths[1], "mask", None)


def check_pixels(image: Image.Image, name: str, limits: Limits) -> None:
    """An image the browser sent already decoded (the Inpaint tab's editor): the same pixel limit."""
    if image.width * image.height > limits.max_upload_pixels:
        raise InputError(
            f"{name}: {image.width}x{image.height} = {image.width * image.height} pixels, more than the limit of "
            f"{limits.max_upload_pixels} (MAX_UPLOAD_PIXELS)"
        )


def unit_images(units: Any, field: str, limits: Limits) -> Any:
    """ControlNet units or image prompts (`field`) as an endpoint receives them in JSON: each image as
    base64 (or a data URL; never a path: a caller does not name files on this server), decoded only
    after its header passed the pixel check. Anything else is left for the schema to refuse."""
    if not isinstance(units, list):
        return units
    out = []
    for i, unit in enumerate(units):
        if isinstance(unit, dict) and isinstance(unit.get("image"), str) and unit["image"]:
            unit = {**unit, "image": _base64_image(unit["image"], f"{field}[{i}].image", limits)}
        out.append(unit)
    return out


def _base64_image(text: str, name: str, limits: Limits) -> Image.Image:
    try:
        data = base64.b64decode(text.split(",", 1)[1] if text.startswith("data:") else text, validate=True)
    except (binascii.Error, ValueError):
        raise InputError(f"{name}: expected a base64-encoded image") from None
    try:
        with Image.open(io.BytesIO(data)) as im:  # the header only
            w, h = im.size
    except (OSError, Image.DecompressionBombError, ValueError):
        raise InputError(f"{name}: not an image this server can read") from None
    if w * h > limits.max_upload_pixels:
        raise InputError(f"{name}: {w}x{h} = {w * h} pixels, more than the limit of {limits.max_upload_pixels} (MAX_UPLOAD_PIXELS)")
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return im.convert("RGB")
    except (OSError, ValueError):
        raise InputError(f"{name}: the image is damaged") from None
