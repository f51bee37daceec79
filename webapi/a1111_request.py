"""A1111's txt2img / img2img request bodies, read into our `GenerationRequest`.

Clients send A1111's whole request with its defaults (the `webuiapi` package sends about 40 fields),
so every A1111 field is accepted: the ones this server does are used, the others are ignored, with a
warning only when set to something other than A1111's default (`UNSUPPORTED`). Unknown keys are
ignored. Every value is checked by `ui.inputs` (the same bounds and messages as the UI and the Gradio
API); a refusal is a `FieldError` naming A1111's field, answered 422 in FastAPI's shape.

One A1111 prompt is one prompt (newlines kept); `<lora:name:scale>` tags in it become the request's
LoRAs. batch_size x n_iter images, seeds seed, seed+1, ... as A1111 numbers them.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from pipelines import GenerationRequest
from pipelines.backend import ModelInfo
from pipelines.inpaint import DEFAULT_STRENGTH, INPAINT_DEFAULTS, MAX_MASK_BLUR, MAX_PADDING, Inpaint, binary_mask
from pipelines.samplers import BY_NAME, from_a1111
from ui import inputs
from ui.inputs import InputError, Limits

from . import images

log = logging.getLogger(__name__)

A1111_IMG2IMG_STRENGTH = 0.75  # A1111's denoising_strength default for img2img without a mask
# Fields this server ignores, with the values that mean "off" in A1111 (no warning for those).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "enable_hr": (False, None),
    "restore_faces": (False, None),
    "tiling": (False, None),
    "subseed_strength": (0, None),
    "seed_resize_from_h": (0, -1, None),
    "seed_resize_from_w": (0, -1, None),
    "styles": ([], None),
    "alwayson_scripts": ({}, None),
    "script_name": (None, ""),
    "script_args": ([], None),
    "s_churn": (0, None),
    "s_tmax": (0, None),
    "s_tmin": (0, None),
    "s_noise": (1, None),
    "refiner_checkpoint": (None, ""),
    "resize_mode": (0, None),
    "initial_noise_multiplier": (1, None),
    "latent_mask": (None, ""),
    "disable_extra_networks": (False, None),
    "save_images": (False, None),
}
WHY = {"save_images": "the API never saves images on the server (A1111's API default)"}
SAMPLER_ALIASES = {  # A1111's aliases (k-diffusion names)
    "k_euler_a": "Euler a", "k_euler_ancestral": "Euler a", "k_euler": "Euler", "k_lms": "LMS", "k_heun": "Heun",
    "k_dpm_2": "DPM2", "k_dpm_2_a": "DPM2 a", "k_dpmpp_2m": "DPM++ 2M", "k_dpmpp_sde": "DPM++ SDE",
    "k_dpmpp_2m_sde": "DPM++ 2M SDE", "ddim": "DDIM", "plms": "PLMS", "unipc": "UniPC", "k_lcm": "LCM",
}  # fmt: skip
_LORA_TAG = re.compile(r"<lora:([^:>]+)(?::([^:>]*))?(?::[^>]*)?>")
INPAINTING_FILL = {0: "fill", 1: "original"}  # 2 latent noise, 3 latent nothing: not offered (original used)


class FieldError(InputError):
    """A refused value and where it is in the body (FastAPI's `loc`, without the leading "body")."""

    def __init__(self, loc: tuple[str | int, ...], message: str):
        super().__init__(message)
        self.loc = loc


@dataclass
class Parsed:
    """A request read from an A1111 body, with what the response reports besides the result."""

    request: GenerationRequest
    prompt: str  # as sent, with its <lora:> tags (A1111's info reports it so)
    batch_size: int
    n_iter: int
    sampler: str  # A1111's sampler name as asked ("" = the model's own)
    warnings: list[str] = field(default_factory=list)


def _given(payload: dict[str, Any], name: str, default: Any) -> Any:
    value = payload.get(name)
    return default if value is None else value


def flag(name: str, value: Any) -> bool:
    """A1111 sends some switches as true/false and others as 0/1."""
    if isinstance(value, int) and not isinstance(value, bool) and value in (0, 1):
        return bool(value)
    return inputs.flag(name, value)


def unsupported(payload: dict[str, Any]) -> list[str]:
    """A warning for each ignored field set to a value other than A1111's default."""
    out = []
    for name, defaults in UNSUPPORTED.items():
        if name not in payload:
            continue
        value = payload[name]
        if any(value == d for d in defaults):  # 0 == 0.0 == False: A1111 sends either
            continue
        shown = repr(value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        out.append(f"{name}={shown}: " + WHY.get(name, "not supported here, ignored"))
    return out


def split_loras(prompt: str, known: tuple[str, ...]) -> tuple[str, dict[str, float]]:
    """The prompt without its `<lora:name:scale>` tags, and {name: scale} (scale 1 when left out)."""
    loras: dict[str, Any] = {}
    for name, scale in _LORA_TAG.findall(prompt):
        loras[name.strip()] = scale.strip() or 1.0
    text = _LORA_TAG.sub("", prompt)
    try:
        chosen = inputs.loras(loras, known) if loras else {}
    except InputError as exc:
        raise FieldError(("prompt",), "prompt: " + str(exc).removeprefix("loras: ")) from None
    return text.strip() if loras else text, chosen


def sampler(payload: dict[str, Any], model: ModelInfo, warnings: list[str]) -> str | None:
    """Our sampler for A1111's sampler_name (+ scheduler); None: the model's own."""
    name = payload.get("sampler_name") or payload.get("sampler_index")
    schedule = payload.get("scheduler")
    if name in (None, "", "Automatic"):
        return None
    if not isinstance(name, str):
        raise FieldError(("sampler_name",), f"sampler_name: must be text, got {type(name).__name__}")
    if schedule is not None and not isinstance(schedule, str):
        raise FieldError(("scheduler",), f"scheduler: must be text, got {type(schedule).__name__}")
    name = SAMPLER_ALIASES.get(name.strip().lower(), name.strip())
    ours = from_a1111(name, schedule)  # "Automatic" is the sampler's default schedule, as in A1111 (DPM++ 2M: Karras)
    karras = (schedule or "").strip().lower() == "karras"
    if (karras and ours == name and not name.endswith(" Karras")) or (ours != name and ours not in model.samplers):
        if schedule and schedule.strip().lower() != "automatic":  # Automatic: the best this model has, no news
            warnings.append(
                f"scheduler={schedule!r}: {name} with the {schedule} schedule is not available for this model; "
                f"{name} with its own schedule used"
            )
        ours = name
    elif schedule and schedule.strip().lower() not in ("automatic", "karras"):
        warnings.append(f"scheduler={schedule!r}: not supported here, the sampler's own schedule used")
    if ours not in model.samplers:
        by_case = {s.lower(): s for s in model.samplers}
        ours = by_case.get(ours.lower(), ours)
    if ours not in model.samplers:
        offered = ", ".join(a1111_sampler_names(model))
        raise FieldError(("sampler_name",), f"sampler_name: {name[:80]!r} is not available; available: {offered}")
    return None if ours == model.scheduler else ours


def a1111_sampler_names(model: ModelInfo) -> list[str]:
    """The model's samplers as A1111 1.9+ lists them (Karras is a scheduler, not a sampler)."""
    names = [BY_NAME[s].a1111[0] if s in BY_NAME else s for s in model.samplers]
    return list(dict.fromkeys(names))


def size(payload: dict[str, Any], name: str, model: ModelInfo, default: int | None, warnings: list[str]) -> int | None:
    """A width/height in range; off the model's size step, rounded down to it (A1111 does too)."""
    value = payload.get(name)
    if value is None:
        return default
    number = inputs.whole_number(name, value, model.size_multiple, model.max_side)
    step = model.size_multiple
    if number % step:
        warnings.append(f"{name}={number}: rounded down to {number - number % step} (this model's size step is {step})")
        number -= number % step
    return number


def images_count(payload: dict[str, Any], limits: Limits, images_in: int = 1) -> tuple[int, int]:
    """(batch_size, n_iter), their product within MAX_BATCH."""
    top = limits.max_batch
    batch = inputs.whole_number("batch_size", _given(payload, "batch_size", 1), 1, top)
    n_iter = inputs.whole_number("n_iter", _given(payload, "n_iter", 1), 1, top)
    if batch * n_iter * images_in > top:
        raise FieldError(
            ("batch_size",),
            f"batch_size: {batch} x n_iter {n_iter}"
            + (f" x {images_in} init images" if images_in > 1 else "")
            + f" = {batch * n_iter * images_in} images, more than this server's MAX_BATCH={top}",
        )
    return batch, n_iter


def checkpoint(payload: dict[str, Any]) -> str | None:
    """override_settings.sd_model_checkpoint, if any (the other override settings are ignored)."""
    overrides = payload.get("override_settings")
    if overrides in (None, {}):
        return None
    if not isinstance(overrides, dict):
        raise FieldError(("override_settings",), "override_settings: must be an object of option name -> value")
    name = overrides.get("sd_model_checkpoint")
    if name is not None and not isinstance(name, str):
        raise FieldError(("override_settings", "sd_model_checkpoint"), "sd_model_checkpoint: must be text")
    return name or None


def override_warnings(payload: dict[str, Any]) -> list[str]:
    overrides = payload.get("override_settings") or {}
    harmless = {"sd_model_checkpoint": None, "CLIP_stop_at_last_layers": 1, "sd_vae": "Automatic"}
    return [
        f"override_settings.{k}={str(v)[:40]!r}: not supported here, ignored"
        for k, v in overrides.items()
        if k not in harmless or (k != "sd_model_checkpoint" and v not in (harmless[k], None, "None"))
    ]


def common(payload: dict[str, Any], limits: Limits, model: ModelInfo, images_in: int = 1) -> Parsed:
    """The fields txt2img and img2img share, as a text-to-image request."""
    if not isinstance(payload, dict):
        raise FieldError((), "the body must be a JSON object of A1111's request fields")
    warnings = unsupported(payload) + override_warnings(payload)
    raw_prompt = inputs.clean_text("prompt", payload.get("prompt"), limits.max_prompt_chars, required=True)
    prompt, loras = split_loras(raw_prompt, model.loras)
    if not prompt.strip():
        raise FieldError(("prompt",), "prompt: must be non-empty text besides its <lora:...> tags")
    negative = inputs.clean_text("negative_prompt", payload.get("negative_prompt"), limits.max_prompt_chars, False)
    batch, n_iter = images_count(payload, limits, images_in)
    request = GenerationRequest(
        prompt=prompt,
        negative_prompt=negative or None,
        num_images=batch * n_iter,
        steps=inputs.whole_number("steps", _given(payload, "steps", model.default_steps), *inputs.bounds("steps")),
        guidance_scale=inputs.finite_number(
            "cfg_scale", _given(payload, "cfg_scale", model.default_guidance), *inputs.bounds("guidance_scale")
        ),
        seed=inputs.seed(payload.get("seed")),
        loras=loras,
        sampler=sampler(payload, model, warnings),
    )
    name = payload.get("sampler_name") if isinstance(payload.get("sampler_name"), str) else ""
    checkpoint(payload)  # its type checked here too; loaded before the request is read (webapi.a1111)
    return Parsed(request, raw_prompt, batch, n_iter, name, warnings)


def txt2img(payload: dict[str, Any], limits: Limits) -> Parsed:
    model = limits.model
    parsed = common(payload, limits, model)
    parsed.request = dataclasses.replace(
        parsed.request,
        width=size(payload, "width", model, model.default_width, parsed.warnings),
        height=size(payload, "height", model, model.default_height, parsed.warnings),
    )
    return parsed


def decode_images(payload: dict[str, Any], limits: Limits, max_bytes: int) -> list[Image.Image]:
    """init_images, each checked from its header before it is decoded."""
    values = payload.get("init_images")
    if not isinstance(values, list) or not values:
        raise FieldError(("init_images",), "init_images: a list of at least one base64 image is required")
    if len(values) > limits.max_edit_files:
        raise FieldError(
            ("init_images",), f"init_images: {len(values)} images, more than {limits.max_edit_files} (MAX_EDIT_FILES)"
        )
    out = []
    for i, value in enumerate(values):
        data = images.from_base64(value, f"init_images[{i}]", max_bytes)
        out.append(images.open_bytes(data, f"init_images[{i}]", limits.max_upload_pixels, max_bytes, "RGB"))
    return out


def mask_options(payload: dict[str, Any], image: Image.Image, limits: Limits, max_bytes: int, warnings: list[str]):
    """The inpaint of A1111's mask fields (white = repaint), or None without a mask."""
    if payload.get("mask") in (None, ""):
        return None
    data = images.from_base64(payload["mask"], "mask", max_bytes)
    width, height = images.header_size(data, "mask", limits.max_upload_pixels)  # sizes compared before decoding
    if (width, height) != image.size:
        raise FieldError(
            ("mask",),
            f"mask: {width}x{height} but init_images[0] is {image.width}x{image.height}; "
            "the mask must have its image's size",
        )
    mask = images.open_bytes(data, "mask", limits.max_upload_pixels, max_bytes, None)
    d = INPAINT_DEFAULTS  # what a field left out means: the app's inpaint defaults (one owner)
    codes = {content: code for code, content in INPAINTING_FILL.items()}
    fill = inputs.whole_number("inpainting_fill", _given(payload, "inpainting_fill", codes[d.masked_content]), 0, 3)
    if fill not in INPAINTING_FILL:
        warnings.append(f"inpainting_fill={fill} (latent noise/nothing): not supported here, 'original' used")
    only_masked = flag("inpaint_full_res", _given(payload, "inpaint_full_res", d.only_masked))
    return Inpaint(
        mask=binary_mask(mask),
        mask_blur=inputs.whole_number("mask_blur", _given(payload, "mask_blur", d.mask_blur), 0, MAX_MASK_BLUR),
        masked_content=INPAINTING_FILL.get(fill, "original"),
        inpaint_area="only masked" if only_masked else "whole picture",
        padding=inputs.whole_number(
            "inpaint_full_res_padding", _given(payload, "inpaint_full_res_padding", d.padding), 0, MAX_PADDING
        ),
        invert=flag("inpainting_mask_invert", _given(payload, "inpainting_mask_invert", d.invert)),
    )


def img2img(payload: dict[str, Any], limits: Limits, max_bytes: int) -> Parsed:
    """An image-to-image request (an inpaint with a mask): init_images decoded after header checks."""
    if not isinstance(payload, dict):
        raise FieldError((), "the body must be a JSON object of A1111's request fields")
    pictures = decode_images(payload, limits, max_bytes)
    info = limits.model
    masked = payload.get("mask") not in (None, "")
    model = info if masked else info.for_edits  # inpaints run on the main model, edits on the editor
    parsed = common(payload, dataclasses.replace(limits, model=model), model, len(pictures))
    inpaint = mask_options(payload, pictures[0], limits, max_bytes, parsed.warnings)
    if inpaint is not None and len(pictures) > 1:
        raise FieldError(("init_images",), "init_images: an inpaint takes one image (the mask's)")
    default_strength = DEFAULT_STRENGTH if inpaint is not None else A1111_IMG2IMG_STRENGTH
    parsed.request = dataclasses.replace(
        parsed.request,
        init_images=pictures,
        width=size(payload, "width", model, None, parsed.warnings),
        height=size(payload, "height", model, None, parsed.warnings),
        strength=inputs.finite_number(
            "denoising_strength", _given(payload, "denoising_strength", default_strength), *inputs.bounds("strength")
        ),
        inpaint=inpaint,
    )
    if model.image_guidance:
        parsed.request.image_guidance_scale = inputs.finite_number(
            "image_cfg_scale",
            _given(payload, "image_cfg_scale", model.default_image_guidance),
            *inputs.bounds("image_guidance_scale"),
        )
    return parsed
