"""The OpenAI images request's fields, read into our `GenerationRequest` (docs/openai-api.md has the table).

OpenAI's own fields are `prompt`, `n`, `size`, `image` and `mask` (the schema names them: each
field's `About.openai`); every other field of the request schema is an extra under our own name
(the SDK's `extra_body`, or a form field of an edit), so a field added to the schema is taken here
without a change (tests/test_fields.py checks). What differs is OpenAI's:
- one prompt, newlines kept (the UI's one-prompt-per-line split does not apply);
- `n` is `num_images`; `size` is "WxH", "auto" or omitted (the model's default size). OpenAI's
  fixed sizes (1024x1024, 1536x1024, ...) on a model whose native size differs keep their aspect
  ratio at the model's native area, rounded to its size step (1024x1024 on a 512x512 model is
  512x512); any other "WxH" is taken literally and must fit the model's limits. For an edit, a fixed
  size or "auto" keeps the input's aspect ratio at the model's area.
Fields we accept but cannot honour are ignored (`IGNORED`) or answered with a warning; unknown
fields are ignored with a warning in the response, so a typo in an extra does not pass unseen.
Refusals are the schema's `RequestError` (`param_name` maps our field to OpenAI's name) or a
`WireError` for OpenAI's own fields.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from engine.inputs import Limits, read
from pipelines import GenerationRequest, ModelInfo
from pipelines import inpaint_render_size as render_size
from pipelines.schema.fields import Range, RequestError, shown
from pipelines.schema.request import fields, names, spec

from . import images
from .errors import WireError

OPENAI_SIZES = ("256x256", "512x512", "1024x1024", "1792x1024", "1024x1792", "1536x1024", "1024x1536")
RESPONSE_FORMATS = ("b64_json", "url")
OUTPUT_FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP"}
OPENAI_FIELDS = ("prompt", "n", "size", "response_format", "model", "output_format", "output_compression",
                 "background", "stream", "image", "image[]", "mask")  # fmt: skip
IGNORED = ("quality", "style", "moderation", "user", "safety_identifier", "complexity", "input_fidelity",
           "partial_images", "frame_count", "frame_duration_ms", "svg")  # fmt: skip
NAMES = names("openai")  # our flat field -> OpenAI's name (ours for an extra)
# Read apart: OpenAI's own fields (prompt, n, size) and the files of an edit (image, mask).
_OWN = {"prompt", "num_images", "width", "height", "init_images", "mask"}
NOT_TAKEN: dict[str, str] = {}  # every field of the schema is taken (tests/test_fields.py)
_PERCENT = Range(0, 100, integer=True)  # output_compression
_SIZE = re.compile(r"\s*(\d{1,7})\s*[xX×]\s*(\d{1,7})\s*")


def extras(task: str) -> list[str]:
    """The request schema's fields this task takes as extras, by name (what `extra_body` may hold)."""
    return [item.name for item in fields(task) if item.name not in _OWN and item.name not in NOT_TAKEN]


def param_name(exc: RequestError) -> str | None:
    """The OpenAI request field a schema refusal is about (`param` of OpenAI's error object)."""
    return None if exc.field is None else NAMES.get(exc.field, exc.field)


@dataclass(frozen=True)
class Output:
    """How the images are answered: b64_json or url, in png / jpeg / webp."""

    response_format: str = "b64_json"
    output_format: str = "png"
    compression: int | None = None  # 0..100 (OpenAI's output_compression): jpeg/webp quality = 100 - it


@dataclass
class Parsed:
    request: GenerationRequest
    output: Output
    warnings: list[str]


def output(raw: dict[str, Any]) -> Output:
    fmt = raw.get("response_format") or "b64_json"
    if fmt not in RESPONSE_FORMATS:
        raise WireError(("response_format",), f"{shown(fmt)} is not one of {', '.join(RESPONSE_FORMATS)}")
    kind = raw.get("output_format") or "png"
    if not isinstance(kind, str) or kind.lower() not in OUTPUT_FORMATS:
        raise WireError(("output_format",), f"{shown(kind)} is not one of png, jpeg, webp")
    compression = raw.get("output_compression")
    if compression is not None:
        try:
            compression = int(_PERCENT.parse(compression))
        except ValueError as exc:
            raise WireError(("output_compression",), str(exc)) from None
    return Output(fmt, "jpeg" if kind.lower() == "jpg" else kind.lower(), compression)


def size(value: Any, model: ModelInfo, edit: bool) -> tuple[int | None, int | None]:
    """(width, height) for `size`; (None, None) for an edit's automatic size (`pipelines.run.calls.size`)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return (None, None) if edit else (model.default_width, model.default_height)
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if not match:
        raise WireError(("size",), f"expected WIDTHxHEIGHT (such as 1024x1024) or auto, got {shown(value)}")
    width, height = int(match.group(1)), int(match.group(2))
    native = (model.default_width, model.default_height)
    if value.strip() in OPENAI_SIZES and edit:
        return None, None  # OpenAI's presets say nothing of the input's shape: keep its aspect ratio
    if value.strip() in OPENAI_SIZES and (width, height) != native:
        width, height = render_size((width, height), native, model.size_multiple)
    try:
        model.accept(GenerationRequest(prompt="size", width=width, height=height))
    except RequestError as exc:
        raise WireError(("size",), f"{value.strip()} is not accepted here: {exc}") from None
    return width, height


def warnings_for(raw: dict[str, Any], request: GenerationRequest, model: str, task: str) -> list[str]:
    """What the response says about fields it did not honour as asked (`model`: the one answering)."""
    notes = []
    asked = raw.get("model")
    if asked and asked != model:
        notes.append(f"model {str(asked)[:80]!r} is not the one serving this call: answered with {model}")
    wanted = raw.get("size")
    if (
        isinstance(wanted, str)
        and wanted.strip() in OPENAI_SIZES
        and (request.width, request.height) != tuple(int(v) for v in wanted.strip().split("x"))
    ):
        got = f"{request.width}x{request.height}" if request.width else "the input's aspect ratio at the model's area"
        notes.append(f"size {wanted.strip()}: rendered at {got} (this model's native size is its best)")
    if raw.get("background") == "transparent":
        notes.append("background: transparent is not supported: the images are opaque")
    known = {*OPENAI_FIELDS, *IGNORED, *extras(task)}
    unknown = sorted(str(k)[:40] for k in raw if k not in known)
    if unknown:
        notes.append(f"ignored unknown field(s): {', '.join(unknown)}")
    return notes


def _flat(raw: dict[str, Any], task: str, limits: Limits) -> dict[str, Any]:
    """The extras `raw` sets, by our names; in a form (text values) an object field arrives as JSON text."""
    flat = {}
    kinds = {item.name: item.kind for item in fields(task)}
    for name in extras(task):
        value = raw.get(NAMES[name])
        if isinstance(value, str) and kinds[name] == "scales" and value.strip().startswith("{"):
            try:
                value = json.loads(value)
            except ValueError:
                raise RequestError(name, f"must be a JSON object of name -> scale, got {shown(value)}") from None
        if kinds[name] == "units":
            value = _units(name, value, limits)
        flat[name] = value
    return flat


def _units(name: str, value: Any, limits: Limits) -> Any:
    """ControlNet units or image prompts (`name`) as `extra_body` sends them: JSON (text in a form), each
    image base64, decoded after its header passed the pixel check."""
    if isinstance(value, str) and value.strip().startswith("["):
        try:
            value = json.loads(value)
        except ValueError:
            raise RequestError(name, f"must be a JSON list of units, got {shown(value)}") from None
    if not isinstance(value, list):
        return value
    out = []
    for i, unit in enumerate(value):
        if isinstance(unit, dict) and isinstance(unit.get("image"), str):
            cap = limits.max_upload_pixels * 4  # bytes: an uncompressed RGBA image at the pixel limit
            data = images.from_base64(unit["image"], (name, i, "image"), cap)
            unit = {**unit, "image": images.open_bytes(data, (name, i, "image"), limits.max_upload_pixels, cap)}
        out.append(unit)
    return out


def _common(raw: dict[str, Any], limits: Limits, task: str, images: Any, mask: Any = None) -> GenerationRequest:
    """Our request from OpenAI's fields plus our extras; refusals name the OpenAI field."""
    if raw.get("stream") not in (None, False, "false"):
        raise WireError(("stream",), "streaming (partial images) is not supported by this server")
    n = raw.get("n")
    if n is not None:
        try:
            n = spec("num_images").parse(n)
        except ValueError as exc:
            raise WireError(("n",), str(exc)) from None
    width, height = size(raw.get("size"), limits.model, edit=images is not None)
    flat = _flat(raw, task, limits)
    flat.update(prompt=raw.get("prompt"), num_images=n, width=width, height=height, init_images=images, mask=mask)
    if not isinstance(flat["prompt"], str) and flat["prompt"] is not None:
        raise WireError(("prompt",), f"must be text, got {shown(flat['prompt'])}")
    prompt = flat["prompt"] if flat["prompt"] is not None else ""
    return read({**flat, "prompt": prompt}, limits, blank_is_unset=False)


def generation(raw: dict[str, Any], limits: Limits) -> Parsed:
    """POST /v1/images/generations (JSON)."""
    if not isinstance(raw, dict):
        raise WireError((), f"the request body must be a JSON object, got {type(raw).__name__}")
    request = _common(raw, limits, "txt2img", None)
    return Parsed(request, output(raw), warnings_for(raw, request, limits.model.model_name, "txt2img"))


def edit(raw: dict[str, Any], limits: Limits, images: list[Any], mask: Any = None) -> Parsed:
    """POST /v1/images/edits: an inpaint with a mask (our white-is-repaint mask, already converted),
    else an instruction edit or image-to-image, whichever the model serving edits does."""
    task = "img2img" if mask is None else "inpaint"
    request = _common(raw, limits, task, images, mask)
    return Parsed(request, output(raw), warnings_for(raw, request, limits.model.model_name, task))
