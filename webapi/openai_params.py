"""The OpenAI images request's fields, read into our `GenerationRequest` (docs/openai-api.md has the table).

Bounds have one owner: numbers go through `ui.inputs` (`generation_request`, `whole_number`,
`clean_text`, `inpaint_options`) and sizes through `pipelines.request.validate`, so this API
accepts exactly what the UI accepts. What differs is OpenAI's:
- one prompt, newlines kept (the UI's one-prompt-per-line split does not apply);
- `n` is `num_images`; `size` is "WxH", "auto" or omitted (the model's default size). OpenAI's
  fixed sizes (1024x1024, 1536x1024, ...) on a model whose native size differs keep their aspect
  ratio at the model's native area, rounded to its size step (1024x1024 on a 512x512 model is
  512x512); any other "WxH" is taken literally and must fit the model's limits. For an edit, a fixed
  size or "auto" keeps the input's aspect ratio at the model's area;
- our own fields arrive beside them (the SDK's `extra_body`, or form fields of an edit): `EXTRAS`.
Fields we accept but cannot honour are ignored (`IGNORED`) or answered with a warning; unknown
fields are ignored with a warning in the response, so a typo in an extra does not pass unseen.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

from pipelines import GenerationRequest
from pipelines.backend import ModelInfo
from pipelines.inpaint import DEFAULT_STRENGTH, render_size
from pipelines.request import validate
from ui.inputs import InputError, Limits, clean_text, generation_request, inpaint_options, whole_number

OPENAI_SIZES = ("256x256", "512x512", "1024x1024", "1792x1024", "1024x1792", "1536x1024", "1024x1536")
RESPONSE_FORMATS = ("b64_json", "url")
OUTPUT_FORMATS = {"png": "PNG", "jpeg": "JPEG", "jpg": "JPEG", "webp": "WEBP"}
EXTRAS = ("seed", "negative_prompt", "steps", "guidance_scale", "sampler", "strength", "image_guidance_scale",
          "guidance_end", "loras")  # fmt: skip
INPAINT_EXTRAS = ("mask_blur", "masked_content", "inpaint_area", "padding", "invert_mask")
OPENAI_FIELDS = ("prompt", "n", "size", "response_format", "model", "output_format", "output_compression",
                 "background", "stream")  # fmt: skip
IGNORED = ("quality", "style", "moderation", "user", "safety_identifier", "complexity", "input_fidelity",
           "partial_images", "frame_count", "frame_duration_ms", "svg")  # fmt: skip
_SIZE = re.compile(r"\s*(\d{1,7})\s*[xX×]\s*(\d{1,7})\s*")


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
        raise InputError(f"response_format: {str(fmt)[:40]!r} is not one of {', '.join(RESPONSE_FORMATS)}")
    kind = raw.get("output_format") or "png"
    if not isinstance(kind, str) or kind.lower() not in OUTPUT_FORMATS:
        raise InputError(f"output_format: {str(kind)[:40]!r} is not one of png, jpeg, webp")
    compression = raw.get("output_compression")
    if compression is not None:
        compression = whole_number("output_compression", compression, 0, 100)
    return Output(fmt, "jpeg" if kind.lower() == "jpg" else kind.lower(), compression)


def size(value: Any, model: ModelInfo, edit: bool) -> tuple[int | None, int | None]:
    """(width, height) for `size`; (None, None) for an edit's automatic size (`pipelines.calls.size`)."""
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "auto")):
        return (None, None) if edit else (model.default_width, model.default_height)
    match = _SIZE.fullmatch(value) if isinstance(value, str) else None
    if not match:
        raise InputError(f"size: expected WIDTHxHEIGHT (such as 1024x1024) or auto, got {str(value)[:40]!r}")
    width, height = int(match.group(1)), int(match.group(2))
    native = (model.default_width, model.default_height)
    if value.strip() in OPENAI_SIZES and edit:
        return None, None  # OpenAI's presets say nothing of the input's shape: keep its aspect ratio
    if value.strip() in OPENAI_SIZES and (width, height) != native:
        width, height = render_size((width, height), native, model.size_multiple)
    try:
        validate(GenerationRequest(prompt="size", width=width, height=height), model.limits)
    except ValueError as exc:
        raise InputError(f"size: {value.strip()} is not accepted here: {exc}") from None
    return width, height


def warnings_for(raw: dict[str, Any], request: GenerationRequest, model: str, extra: tuple[str, ...] = ()) -> list[str]:
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
    known = {*OPENAI_FIELDS, *IGNORED, *EXTRAS, *extra}
    unknown = sorted(str(k)[:40] for k in raw if k not in known)
    if unknown:
        notes.append(f"ignored unknown field(s): {', '.join(unknown)}")
    return notes


def _common(raw: dict[str, Any], limits: Limits, images: Any) -> GenerationRequest:
    """Our request from OpenAI's fields plus our extras; errors name the OpenAI field."""
    if raw.get("stream") not in (None, False, "false"):
        raise InputError("stream: streaming (partial images) is not supported by this server")
    prompt = clean_text("prompt", raw.get("prompt"), limits.max_prompt_chars, required=True)
    n = whole_number("n", 1 if raw.get("n") is None else raw["n"], 1, limits.max_batch)
    width, height = size(raw.get("size"), limits.model, edit=images is not None)
    fields = {name: raw[name] for name in EXTRAS if raw.get(name) is not None}
    fields.update(prompt=prompt, num_images=n, width=width, height=height)
    return dataclasses.replace(generation_request(fields, limits, init_images=images), prompt=prompt)


def generation(raw: dict[str, Any], limits: Limits) -> Parsed:
    """POST /v1/images/generations (JSON)."""
    if not isinstance(raw, dict):
        raise InputError(f"the request body must be a JSON object, got {type(raw).__name__}")
    request = _common(raw, limits, None)
    return Parsed(request, output(raw), warnings_for(raw, request, limits.model.model_name))


def edit(raw: dict[str, Any], limits: Limits, images: list[Any], mask: Any = None) -> Parsed:
    """POST /v1/images/edits: an inpaint with a mask (our white-is-repaint mask, already converted),
    else an instruction edit or image-to-image, whichever the model serving edits does."""
    if mask is None:
        request = _common(raw, limits, images)
        return Parsed(request, output(raw), warnings_for(raw, request, limits.model.model_name))
    raw = {**raw, "strength": raw.get("strength") if raw.get("strength") is not None else DEFAULT_STRENGTH}
    request = dataclasses.replace(_common(raw, limits, images), inpaint=inpaint_options(raw, mask))
    return Parsed(request, output(raw), warnings_for(raw, request, limits.model.model_name, INPAINT_EXTRAS))
