"""Every value a caller sends, checked in one place before any conversion or model work.

The browser and the API both arrive here with raw JSON-ish values. Each function raises
`InputError` (a ValueError) whose message names the field and the bad value, so a caller sees
"steps: must be a whole number, got nan" rather than "cannot convert float NaN to integer".
Uploads are checked from their header (count, pixel count) before any image is decoded.
"""

from __future__ import annotations

import dataclasses
import math
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PIL import Image

from pipelines import GenerationRequest
from pipelines.backend import ModelInfo
from pipelines.inpaint import (
    DEFAULT_STRENGTH,
    INPAINT_AREAS,
    INPAINT_DEFAULTS,
    MASKED_CONTENT,
    MAX_EXTEND,
    MAX_MASK_BLUR,
    MAX_PADDING,
    Inpaint,
    binary_mask,
)
from pipelines.request import BOUNDS, DEFAULTS
from pipelines.step_cache import DEFAULT_THRESHOLDS, METHODS, canonical

ALLOWED_CONTROL = {"\n", "\t", "\r"}


def bounds(name: str) -> tuple[float, float]:
    """(low, high) of a field, from the pipeline's BOUNDS: the sliders, the API's parsing and
    Send-to's clamping all use this, so none can drift from what the pipeline accepts."""
    bound = BOUNDS[name]
    return bound.low, bound.high


class InputError(ValueError):
    """A caller's value was refused; the message is shown to the caller as is."""


@dataclass(frozen=True)
class Limits:
    """What the server accepts (the model's limits plus the operator's settings)."""

    model: ModelInfo
    max_prompt_chars: int
    max_edit_files: int
    max_upload_pixels: int

    @property
    def max_batch(self) -> int:
        return self.model.max_batch


def _number(name: str, value: Any, what: str) -> int | float:
    """A JSON-ish number (int, float or numeric string) or InputError "must be <what>"; bools refused."""
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise InputError(f"{name}: must be {what}, got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        shown = repr(value) if value is None or isinstance(value, bool) else type(value).__name__
        raise InputError(f"{name}: must be {what}, got {shown}")
    return value


def whole_number(name: str, value: Any, low: int, high: int) -> int:
    """An integer given as int, integral float or digit string; NaN, inf, fractions and bools refused.

    Digit strings are read exactly (a 64-bit seed as text keeps every digit, which a float would not)."""
    if isinstance(value, str) and value.strip().lstrip("+-").isdigit():
        value = int(value.strip())
    value = _number(name, value, "a whole number")
    if isinstance(value, float) and (not math.isfinite(value) or not value.is_integer()):
        raise InputError(f"{name}: must be a whole number, got {value!r}")
    number = int(value)
    if not low <= number <= high:
        raise InputError(f"{name}: {number} is out of range {low}..{high}")
    return number


def finite_number(name: str, value: Any, low: float, high: float) -> float:
    number = float(_number(name, value, "a number"))
    if not math.isfinite(number):
        raise InputError(f"{name}: must be a finite number, got {value!r}")
    if not low <= number <= high:
        raise InputError(f"{name}: {number:g} is out of range {low:g}..{high:g}")
    return number


def clean_text(name: str, value: Any, max_chars: int, required: bool) -> str:
    """Text without lone surrogates or control characters, at most `max_chars` long."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InputError(f"{name}: must be text, got {type(value).__name__}")
    if len(value) > max_chars:
        raise InputError(f"{name}: {len(value)} characters, more than the limit of {max_chars} (MAX_PROMPT_CHARS)")
    for i, ch in enumerate(value):
        category = unicodedata.category(ch)
        if category == "Cs":
            raise InputError(f"{name}: invalid character (a lone UTF-16 surrogate) at position {i}")
        if category == "Cc" and ch not in ALLOWED_CONTROL:
            raise InputError(f"{name}: control character U+{ord(ch):04X} at position {i} is not allowed")
    if required and not value.strip():
        raise InputError(f"{name}: must be non-empty text")
    return value


def prompts(value: Any, max_chars: int) -> str | list[str]:
    """One prompt per non-empty line; "" stays "" so that validation names it."""
    text = clean_text("prompt", value, max_chars, required=True)
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[0] if len(lines) == 1 else lines


def seed(value: Any, random: bool = False) -> int | None:
    """None (random) for the random toggle, an empty field or a negative seed (A1111's -1)."""
    if random or value is None or (isinstance(value, str) and not value.strip()):
        return None
    number = whole_number("seed", value, -(2**63), int(BOUNDS["seed"].high))
    return None if number < 0 else number


def loras(value: Any, known: Sequence[str]) -> dict[str, float]:
    """{name: scale} with names from LORA_DIR only."""
    if value in (None, ""):
        return {}
    if not isinstance(value, dict):
        raise InputError(f"loras: must be an object of LoRA name -> scale, got {type(value).__name__}")
    chosen = {}
    for name, scale in value.items():
        if name not in known:
            offered = ", ".join(known) or "none"
            raise InputError(f"loras: unknown LoRA {str(name)[:80]!r}; available: {offered}")
        chosen[name] = finite_number(f"loras[{name!r}]", scale, *bounds("lora_scale"))
    return chosen


def sampler(value: Any, model: ModelInfo) -> str | None:
    """A sampler the model offers, by name; "" or None: the model's own."""
    if value in (None, ""):
        return None
    if not isinstance(value, str) or value not in model.samplers:
        raise InputError(f"sampler: {str(value)[:80]!r} is not available; available: {', '.join(model.samplers)}")
    return None if value == model.scheduler else value


SLIDER_THRESHOLD_MIN = 0.01  # the step cache sliders' lowest value (the bound itself is open at 0)


def slider_threshold(method: str) -> float:
    """The threshold a form shows for `method`: its default; for a method without one (its slider is
    hidden) FirstBlockCache's, ready for when a method with one is picked."""
    return DEFAULT_THRESHOLDS.get(method, DEFAULT_THRESHOLDS["FirstBlockCache"])


def step_cache(raw: dict[str, Any]) -> dict[str, Any]:
    """`step_cache` (any capitalisation; "" or None: the model's default) and its threshold, dropped for
    a method without one (the form's slider always sends a value). The model's support is the
    pipeline's to check: it refuses with the families that have a cache."""
    value = raw.get("step_cache")
    method = None
    if value not in (None, ""):
        method = canonical(value) if isinstance(value, str) else None
        if method is None:
            raise InputError(f"step_cache: {str(value)[:80]!r} is not one of {', '.join(METHODS)}")
    threshold = raw.get("step_cache_threshold")
    if threshold is None or (method is not None and method not in DEFAULT_THRESHOLDS):
        return {"step_cache": method, "step_cache_threshold": None}
    number = finite_number("step_cache_threshold", threshold, *bounds("step_cache_threshold"))
    if number <= 0:
        raise InputError("step_cache_threshold: must be more than 0 (0 would skip nothing)")
    return {"step_cache": method, "step_cache_threshold": number}


def generation_request(raw: dict[str, Any], limits: Limits, init_images=None) -> GenerationRequest:
    """A GenerationRequest from raw caller values; the pipeline then checks model-specific rules."""
    m = limits.model
    return GenerationRequest(
        prompt=prompts(raw.get("prompt"), limits.max_prompt_chars),
        negative_prompt=clean_text("negative_prompt", raw.get("negative_prompt"), limits.max_prompt_chars, False)
        or None,
        num_images=whole_number("num_images", _given(raw, "num_images", 1), 1, m.max_batch),
        steps=whole_number("steps", _given(raw, "steps", m.default_steps), *bounds("steps")),
        guidance_scale=finite_number(
            "guidance_scale", _given(raw, "guidance_scale", m.default_guidance), *bounds("guidance_scale")
        ),
        width=_size(raw, "width", m.default_width, m, init_images is not None),
        height=_size(raw, "height", m.default_height, m, init_images is not None),
        seed=seed(raw.get("seed"), bool(raw.get("random_seed"))),
        loras=loras(raw.get("loras"), m.loras),
        sampler=sampler(raw.get("sampler"), m),
        init_images=init_images,
        strength=finite_number("strength", _given(raw, "strength", DEFAULTS.strength), *bounds("strength")),
        image_guidance_scale=finite_number(
            "image_guidance_scale",
            _given(raw, "image_guidance_scale", m.default_image_guidance),
            *bounds("image_guidance_scale"),
        ),
        guidance_end=None
        if _given(raw, "guidance_end", None) is None
        else finite_number("guidance_end", raw["guidance_end"], *bounds("guidance_end")),
        **step_cache(raw),
    )


def _given(raw: dict[str, Any], name: str, default: Any) -> Any:
    """A caller's value, or `default` where it sent none (missing or null)."""
    value = raw.get(name)
    return default if value is None else value


def _size(raw: dict[str, Any], name: str, default: int, m: ModelInfo, edit: bool) -> int | None:
    """A width/height; none given (or null): the model's default, and for an edit the input's aspect
    ratio at the model's area."""
    value = raw.get(name)
    if value is None:
        return None if edit else default
    return whole_number(name, value, m.size_multiple, m.max_side)


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
    the image as RGB, the mask as it was painted (its alpha counts: `pipelines.inpaint.binary_mask`)."""
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


def choice(name: str, value: Any, options: Sequence[str], default: str) -> str:
    if value in (None, ""):
        return default
    if value not in options:
        raise InputError(f"{name}: {str(value)[:80]!r} is not one of {', '.join(options)}")
    return value


def flag(name: str, value: Any) -> bool:
    """A checkbox: true/false (JSON or text), null: false."""
    if value is None or isinstance(value, bool):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise InputError(f"{name}: must be true or false, got {str(value)[:40]!r}")


def inpaint_options(raw: dict[str, Any], mask: Image.Image) -> Inpaint:
    """The mask and how it is used, from raw caller values (bounds from pipelines.inpaint)."""
    return Inpaint(
        mask=binary_mask(mask),
        mask_blur=whole_number("mask_blur", _given(raw, "mask_blur", INPAINT_DEFAULTS.mask_blur), 0, MAX_MASK_BLUR),
        masked_content=choice(
            "masked_content", raw.get("masked_content"), MASKED_CONTENT, INPAINT_DEFAULTS.masked_content
        ),
        inpaint_area=choice("inpaint_area", raw.get("inpaint_area"), INPAINT_AREAS, INPAINT_DEFAULTS.inpaint_area),
        padding=whole_number("padding", _given(raw, "padding", INPAINT_DEFAULTS.padding), 0, MAX_PADDING),
        invert=flag("invert_mask", raw.get("invert_mask")),
    )


def inpaint_request(raw: dict[str, Any], limits: Limits, image: Image.Image, mask: Image.Image) -> GenerationRequest:
    """An inpaint of `image` where `mask` is painted; strength defaults to the inpaint's own."""
    raw = {**raw, "strength": _given(raw, "strength", DEFAULT_STRENGTH)}
    options = inpaint_options(raw, mask)
    return dataclasses.replace(generation_request(raw, limits, init_images=[image]), inpaint=options)


def outpaint_sides(raw: dict[str, Any]) -> dict[str, int]:
    """Pixels to add on each side (`pipelines.inpaint.extend_canvas` checks the model's size step)."""
    return {side: whole_number(side, _given(raw, side, 0), 0, MAX_EXTEND) for side in ("left", "up", "right", "down")}
