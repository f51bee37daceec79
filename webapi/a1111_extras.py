"""A1111's Extras upscaling: `/sdapi/v1/extra-single-image`, `/extra-batch-images` and `/upscalers`.

The bodies are A1111 1.10's (modules/api/models.py `ExtrasBaseRequest`): `resize_mode` 0 scales by
`upscaling_resize`, 1 scales to `upscaling_resize_w` x `upscaling_resize_h` (cropped to fit with
`upscaling_crop`, A1111's default); `upscaler_1`, then `upscaler_2` blended in at
`extras_upscaler_2_visibility`. Face restoration (GFPGAN, CodeFormer) is not offered: a value other
than 0 is answered with a warning in `html_info`, the image is still upscaled.
The work runs in the engine (`Engine.upscale`), on the server's device, one request at a time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from pipelines import MAX_FACTOR, UpscalerError
from pipelines import NO_UPSCALER as NONE
from pipelines.schema.fields import Range, shown

from . import images
from .errors import WireError

FACE_RESTORERS = ("gfpgan_visibility", "codeformer_visibility")


@dataclass
class Extras:
    """One extras request, read and checked before any image work."""

    upscaler: str
    factor: float | None
    size: tuple[int, int] | None
    second: str | None
    visibility: float
    warnings: list[str] = field(default_factory=list)


def _number(payload: dict[str, Any], key: str, bound: Range, default: float) -> float:
    value = payload.get(key)
    if value is None:
        return default
    try:
        return bound.parse(value)
    except ValueError as exc:
        raise WireError((key,), str(exc)) from None


def _name(payload: dict[str, Any], key: str, offered: list[str]) -> str:
    value = payload.get(key)
    if value in (None, ""):
        return NONE
    if not isinstance(value, str) or value not in offered:
        raise WireError((key,), f"{shown(value, 80)} is not available; available: {', '.join(offered)}")
    return value


def read(payload: dict[str, Any], offered: list[str]) -> Extras:
    """The extras fields of an A1111 body, named by A1111's keys when refused (422)."""
    mode = payload.get("resize_mode")
    if mode not in (None, 0, 1, "0", "1") or isinstance(mode, bool):
        raise WireError(("resize_mode",), f"{shown(mode)} is not 0 (scale by) or 1 (scale to)")
    by_size = mode in (1, "1")
    size = None
    factor = _number(payload, "upscaling_resize", Range(1.0, MAX_FACTOR), 2.0)
    if by_size:
        side = Range(1, 16384, integer=True)
        size = (int(_number(payload, "upscaling_resize_w", side, 512)), int(_number(payload, "upscaling_resize_h", side, 512)))
    extras = Extras(
        upscaler=_name(payload, "upscaler_1", offered),
        factor=None if by_size else factor,
        size=size,
        second=_name(payload, "upscaler_2", offered),
        visibility=_number(payload, "extras_upscaler_2_visibility", Range(0.0, 1.0), 0.0),
    )
    for key in FACE_RESTORERS:
        if payload.get(key) not in (None, 0, 0.0):
            extras.warnings.append(f"{key}={shown(payload[key])}: face restoration is not offered here, ignored")
    return extras


def decode(value: Any, loc: tuple[str | int, ...], max_bytes: int, max_pixels: int) -> Image.Image:
    data = images.from_base64(value, loc, max_bytes)
    return images.open_bytes(data, loc, max_pixels, max_bytes, "RGB")


def html_info(extras: Extras, count: int, sizes: list[tuple[int, int]]) -> str:
    """A1111 answers an HTML note; ours says what ran (and what was ignored)."""
    what = extras.upscaler + (f" + {extras.second} ({extras.visibility:g})" if extras.second not in (None, NONE) and extras.visibility else "")
    text = f"<p>{count} image(s) upscaled by {what} to {', '.join(f'{w}x{h}' for w, h in sizes)}</p>"
    return text + "".join(f"<p>{w}</p>" for w in extras.warnings)


def refused(exc: UpscalerError) -> WireError:
    return WireError(("upscaler_1",), str(exc))
