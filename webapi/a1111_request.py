"""A1111's txt2img / img2img request bodies, read into our `GenerationRequest`.

Field names come from the request schema (`pipelines.schema.request.fields`: each field's A1111 key, or
our own name for the fields A1111 lacks, such as `guidance_end` and `step_cache`, taken as
extensions), so a field added to the schema is read here without a change. What A1111 encodes
differently is converted here, once (`CONVERTED`): `batch_size` x `n_iter` images, `sampler_name`
(+ `scheduler`) to our sampler, `<lora:name:scale>` tags in the prompt, `inpainting_fill` codes,
`inpaint_full_res` as the inpaint area, sizes off the model's step rounded down as A1111 does.

Clients send A1111's whole request with its defaults (the `webuiapi` package sends about 40 fields),
so every A1111 field is accepted: the ones this server does are used, the others are ignored with a
warning only when set to something other than A1111's default (`UNSUPPORTED`). Unknown keys are
ignored. A refusal names A1111's field (`a1111_loc`), answered 422 in FastAPI's shape.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from engine.inputs import Limits, read
from pipelines import SAMPLERS_BY_NAME as BY_NAME
from pipelines import GenerationRequest, ModelInfo, from_any
from pipelines.schema.fields import Flag, RequestError, shown, whole
from pipelines.schema.request import fields, names, spec

from . import a1111_controlnet, images
from . import a1111_extensions as extensions
from .errors import WireError

# A1111 1.10's request fields (modules/api/models.py builds its API models from the processing
# classes' parameters plus a few of its own): a response echoes only these, as A1111's model does.
_COMMON = (
    "prompt", "negative_prompt", "styles", "seed", "subseed", "subseed_strength", "seed_resize_from_h",
    "seed_resize_from_w", "sampler_name", "scheduler", "batch_size", "n_iter", "steps", "cfg_scale", "width", "height",
    "restore_faces", "tiling", "do_not_save_samples", "do_not_save_grid", "eta", "denoising_strength",
    "s_min_uncond", "s_churn", "s_tmax", "s_tmin", "s_noise", "override_settings",
    "override_settings_restore_afterwards", "refiner_checkpoint", "refiner_switch_at", "disable_extra_networks",
    "firstpass_image", "comments", "force_task_id", "sampler_index", "script_name", "script_args", "send_images",
    "save_images", "alwayson_scripts", "infotext",
)  # fmt: skip
A1111_FIELDS = {
    "txt2img": frozenset((*_COMMON, "enable_hr", "firstphase_width", "firstphase_height", "hr_scale", "hr_upscaler",
                          "hr_second_pass_steps", "hr_resize_x", "hr_resize_y", "hr_checkpoint_name",
                          "hr_sampler_name", "hr_scheduler", "hr_prompt", "hr_negative_prompt")),
    "img2img": frozenset((*_COMMON, "init_images", "resize_mode", "image_cfg_scale", "mask", "mask_blur_x",
                          "mask_blur_y", "mask_blur", "mask_round", "inpainting_fill", "inpaint_full_res",
                          "inpaint_full_res_padding", "inpainting_mask_invert", "initial_noise_multiplier",
                          "latent_mask", "include_init_images")),
}  # fmt: skip
A1111_IMG2IMG_STRENGTH = 0.75  # A1111's denoising_strength default for img2img (an inpaint's is ours, 1.0)
# Fields this server ignores, with the values that mean "off" in A1111 (no warning for those).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "hr_checkpoint_name": (None, "", "Use same checkpoint"),
    "firstphase_width": (0, None),
    "firstphase_height": (0, None),
    "restore_faces": (False, None),
    "tiling": (False, None),
    "subseed_strength": (0, None),
    "seed_resize_from_h": (0, -1, None),
    "seed_resize_from_w": (0, -1, None),
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
# Our fields A1111 has no key for in its own body, and why (every other field is read: tests/test_fields.py).
NOT_TAKEN = {
    "loras": "carried as <lora:name:scale> tags in `prompt`, as A1111 writes them",
    "mask": "A1111's `mask` (base64) is decoded with the images, before the fields",
    "init_images": "A1111's `init_images` (base64) are decoded first, header checks included",
    **dict.fromkeys(
        ("num_frames", "fps", "guidance_scale_2", "decode_timestep", "decode_noise_scale"),
        "A1111's txt2img/img2img make pictures; clips come from the Video tab, /video, the CLIs and ComfyUI's API",
    ),
}
_LORA_TAG = re.compile(r"<lora:([^:>]+)(?::([^:>]*))?(?::[^>]*)?>")
INPAINTING_FILL = {0: "fill", 1: "original"}  # 2 latent noise, 3 latent nothing: not offered (original used)
NAMES = names("a1111")  # our flat field -> A1111's key


@dataclass
class Parsed:
    """A request read from an A1111 body, with what the response reports besides the result."""

    request: GenerationRequest
    prompt: str  # as sent, with its <lora:> tags (A1111's info reports it so)
    batch_size: int
    n_iter: int
    sampler: str  # A1111's sampler name as asked ("" = the model's own)
    warnings: list[str] = field(default_factory=list)


def a1111_loc(exc: RequestError) -> tuple[str | int, ...]:
    """A refusal's place in A1111's body: the field's A1111 key, and a list item's index."""
    if exc.field is None:
        return ()
    return (NAMES.get(exc.field, exc.field), *(p for p in exc.sub if isinstance(p, int)))


def a1111_message(exc: RequestError) -> str:
    """The refusal as A1111's client reads it: A1111's name for the field, then the sentence."""
    loc = a1111_loc(exc)
    where = str(loc[0]) + "".join(f"[{i}]" for i in loc[1:]) if loc else ""
    return f"{where}: {exc.detail}" if where else exc.detail


def unsupported(payload: dict[str, Any]) -> list[str]:
    """A warning for each ignored field set to a value other than A1111's default."""
    out = []
    for name, defaults in UNSUPPORTED.items():
        if name not in payload or any(payload[name] == d for d in defaults):  # 0 == 0.0 == False: A1111 sends either
            continue
        out.append(f"{name}={shown(payload[name], 60)}: " + WHY.get(name, "not supported here, ignored"))
    return out


def split_loras(prompt: str) -> tuple[str, dict[str, Any]]:
    """The prompt without its `<lora:name:scale>` tags, and {name: scale as written} (1 when left out)."""
    loras = {name.strip(): scale.strip() or 1.0 for name, scale in _LORA_TAG.findall(prompt)}
    return (_LORA_TAG.sub("", prompt).strip() if loras else prompt), loras


def sampler(payload: dict[str, Any], model: ModelInfo, warnings: list[str]) -> str | None:
    """Our sampler for A1111's sampler_name (+ scheduler); None: the model's own. Names as any tool
    writes them (k-diffusion aliases too) through the one alias table, `pipelines.sampling.samplers.from_any`."""
    name = payload.get("sampler_name") or payload.get("sampler_index")
    schedule = payload.get("scheduler")
    if schedule is not None and not isinstance(schedule, str):
        raise WireError(("scheduler",), f"must be text, got {shown(schedule)}")
    if name in (None, "", "Automatic"):
        return None
    if not isinstance(name, str):
        raise WireError(("sampler_name",), f"must be text, got {shown(name)}")
    base = from_any(name).sampler  # the name alone: "k_euler_a" -> "Euler a"
    ours = from_any(base, schedule).sampler  # "Automatic" is the sampler's default schedule (DPM++ 2M: Karras)
    karras = (schedule or "").strip().lower() == "karras"
    if (karras and ours == base and not base.endswith(" Karras")) or (ours != base and ours not in model.samplers):
        if schedule and schedule.strip().lower() != "automatic":  # Automatic: the best this model has, no news
            warnings.append(
                f"scheduler={schedule!r}: {base} with the {schedule} schedule is not available for this model; "
                f"{base} with its own schedule used"
            )
        ours = base
    elif schedule and schedule.strip().lower() not in ("automatic", "karras"):
        warnings.append(f"scheduler={schedule!r}: not supported here, the sampler's own schedule used")
    by_case = {s.lower(): s for s in model.samplers}
    ours = by_case.get(ours.lower(), ours)
    if ours not in model.samplers:
        offered = ", ".join(a1111_sampler_names(model))
        raise WireError(("sampler_name",), f"{shown(name, 80)} is not available; available: {offered}")
    return ours


def hires_sampler(payload: dict[str, Any], model: ModelInfo, warnings: list[str]) -> str | None:
    """hr_sampler_name (+ hr_scheduler) as `sampler` reads the first pass's; None: the first pass's."""
    name = payload.get("hr_sampler_name")
    if name in SAME_SAMPLER:
        return None
    schedule = payload.get("hr_scheduler")
    schedule = None if schedule in (None, "", "Use same scheduler") else schedule
    try:
        return sampler({"sampler_name": name, "scheduler": schedule}, model, warnings)
    except WireError as exc:  # named by the hires keys, not the first pass's
        raise WireError(("hr_sampler_name" if exc.loc == ("sampler_name",) else "hr_scheduler",), exc.detail) from None


def a1111_sampler_names(model: ModelInfo) -> list[str]:
    """The model's samplers as A1111 1.9+ lists them (Karras is a scheduler, not a sampler)."""
    names_ = [BY_NAME[s].a1111[0] if s in BY_NAME else s for s in model.samplers]
    return list(dict.fromkeys(names_))


def size(payload: dict[str, Any], key: str, model: ModelInfo, warnings: list[str]) -> int | None:
    """A width/height by the schema's rules; off the model's size step, rounded down to it (A1111 does too)."""
    value = payload.get(key)
    if value in (None, 0):  # A1111's img2img sends 0 for "the input's size"
        return None
    try:
        number = spec(key).parse(value)
    except ValueError as exc:
        raise WireError((key,), str(exc)) from None
    step = model.size_multiple
    if number % step and number > step:
        warnings.append(f"{key}={number}: rounded down to {number - number % step} (this model's size step is {step})")
        number -= number % step
    return number


def images_count(payload: dict[str, Any], limits: Limits, images_in: int = 1) -> tuple[int, int]:
    """(batch_size, n_iter), their product within MAX_BATCH."""
    top = limits.max_batch
    batch = _whole(payload, "batch_size", top)
    n_iter = _whole(payload, "n_iter", top)
    if batch * n_iter * images_in > top:
        raise WireError(
            ("batch_size",),
            f"{batch} x n_iter {n_iter}" + (f" x {images_in} init images" if images_in > 1 else "")
            + f" = {batch * n_iter * images_in} images, more than this server's MAX_BATCH={top}",
        )  # fmt: skip
    return batch, n_iter


def _whole(payload: dict[str, Any], key: str, top: int) -> int:
    """A count of A1111's (batch_size, n_iter) by the schema's rules for `num_images`, 1 by default."""
    value = payload.get(key)
    try:
        number = 1 if value is None else spec("num_images").parse(value)
    except ValueError as exc:
        raise WireError((key,), str(exc)) from None
    if number > top:
        raise WireError((key,), f"{number} is out of range 1..{top} (MAX_BATCH)")
    return number


def checkpoint(payload: dict[str, Any]) -> str | None:
    """override_settings.sd_model_checkpoint, if any (the other override settings are ignored)."""
    overrides = payload.get("override_settings")
    if overrides in (None, {}):
        return None
    if not isinstance(overrides, dict):
        raise WireError(("override_settings",), "must be an object of option name -> value")
    name = overrides.get("sd_model_checkpoint")
    if name is not None and not isinstance(name, str):
        raise WireError(("override_settings", "sd_model_checkpoint"), "must be text")
    return name or None


def override_warnings(payload: dict[str, Any]) -> list[str]:
    overrides = payload.get("override_settings") or {}
    read = {"sd_model_checkpoint", "CLIP_stop_at_last_layers"}  # `checkpoint`, `_clip_skip`
    harmless = {"sd_vae": "Automatic"}
    return [
        f"override_settings.{k}={shown(v)}: not supported here, ignored"
        for k, v in overrides.items()
        if k not in read and (k not in harmless or v not in (harmless[k], None, "None"))
    ]


def _prompt(payload: dict[str, Any], flat: dict[str, Any]) -> None:
    """`prompt` and the LoRAs of its tags (their scales checked by the schema, named `prompt` here)."""
    raw = payload.get("prompt")
    if not isinstance(raw, str):
        flat["prompt"] = raw  # the schema names what is wrong with it
        return
    text, loras = split_loras(raw)
    if loras and not text.strip():
        raise WireError(("prompt",), "must be non-empty text besides its <lora:...> tags")
    flat.update(prompt=text, loras=loras)


def _inpainting_fill(payload: dict[str, Any], flat: dict[str, Any], warnings: list[str]) -> None:
    if payload.get("inpainting_fill") is None:
        return
    try:
        code = whole(payload["inpainting_fill"])  # the schema's rules for a whole number, then A1111's codes
    except ValueError as exc:
        raise WireError(("inpainting_fill",), str(exc)) from None
    if code not in (0, 1, 2, 3):
        raise WireError(("inpainting_fill",), f"{code} is out of range 0..3")
    if code not in INPAINTING_FILL:
        warnings.append(f"inpainting_fill={code} (latent noise/nothing): not supported here, 'original' used")
    flat["masked_content"] = INPAINTING_FILL.get(code, "original")


def _inpaint_full_res(payload: dict[str, Any], flat: dict[str, Any], warnings: list[str]) -> None:
    if payload.get("inpaint_full_res") is None:
        return
    try:
        only_masked = Flag().parse(payload["inpaint_full_res"])
    except ValueError as exc:
        raise WireError(("inpaint_full_res",), str(exc)) from None
    flat["inpaint_area"] = "only masked" if only_masked else "whole picture"


# Our fields whose A1111 encoding differs from our value: read by these, not copied.
def _clip_skip(payload: dict[str, Any], flat: dict[str, Any], _warnings: list[str]) -> None:
    """Clip skip as A1111 takes it per request: `override_settings.CLIP_stop_at_last_layers` (its setting),
    or a top-level `clip_skip` (SillyTavern, SD.Next; not a field of A1111's own request); the setting wins."""
    overrides = payload.get("override_settings")
    value = overrides.get("CLIP_stop_at_last_layers") if isinstance(overrides, dict) else None
    value = payload.get("clip_skip") if value is None else value
    if value is not None:
        flat["clip_skip"] = value  # the schema checks it (a whole number 1..12)


CONVERTED: dict[str, Callable[..., None]] = {
    "masked_content": _inpainting_fill,
    "inpaint_area": _inpaint_full_res,
    "clip_skip": _clip_skip,
}
_READ_APART = {"prompt", "loras", "num_images", "sampler", "hires_sampler", "width", "height", "init_images", "mask",
               "controlnet", "ip_adapter"}  # fmt: skip
SAME_SAMPLER = (None, "", "Use same sampler")  # A1111's hr_sampler_name for "the first pass's"


def flat_fields(payload: dict[str, Any], task: str, warnings: list[str]) -> dict[str, Any]:
    """Every schema field of `task` A1111's body sets, by its A1111 key, as our flat values."""
    flat: dict[str, Any] = {}
    _prompt(payload, flat)
    for item in fields(task):
        if item.name in _READ_APART:
            continue
        if item.name in CONVERTED:
            CONVERTED[item.name](payload, flat, warnings)
        elif payload.get(NAMES[item.name]) is not None:
            flat[item.name] = payload[NAMES[item.name]]
    return flat


def common(payload: dict[str, Any], limits: Limits, task: str, images_in: int = 1) -> tuple[dict[str, Any], Parsed]:
    """The flat values and the report of the fields txt2img and img2img share."""
    if not isinstance(payload, dict):
        raise WireError((), "the body must be a JSON object of A1111's request fields")
    model = limits.model
    warnings = unsupported(payload) + override_warnings(payload)
    others = [name for name in a1111_controlnet.other_scripts(payload) if not extensions.handled(name)]
    warnings += [f"alwayson_scripts.{name}: not supported here, ignored" for name in others]
    batch, n_iter = images_count(payload, limits, images_in)
    flat = flat_fields(payload, task, warnings)
    if isinstance(flat.get("prompt"), str):
        regions, flat["prompt"] = extensions.regional_prompter(payload, flat["prompt"], warnings)
        flat.update(regions)
    flat.update(**extensions.adetailer(payload, task, warnings), **extensions.dynamic_prompts(payload))
    flat.update(
        num_images=batch * n_iter,
        sampler=sampler(payload, model, warnings),
        hires_sampler=hires_sampler(payload, model, warnings),
        width=size(payload, "width", model, warnings),
        height=size(payload, "height", model, warnings),
    )
    checkpoint(payload)  # its type checked here too; loaded before the request is read (webapi.a1111)
    name = payload.get("sampler_name") if isinstance(payload.get("sampler_name"), str) else ""
    prompt = payload.get("prompt") if isinstance(payload.get("prompt"), str) else ""
    return flat, Parsed(None, prompt, batch, n_iter, name, warnings)  # type: ignore[arg-type]


def txt2img(payload: dict[str, Any], limits: Limits, max_bytes: int = 0) -> Parsed:
    """A text-to-image request; ControlNet units' images decoded after header checks (`max_bytes`)."""
    flat, parsed = common(payload, limits, "txt2img")
    flat.update(a1111_controlnet.split(a1111_controlnet.units(payload, None, limits, max_bytes, parsed.warnings)))
    model = limits.model  # A1111's txt2img always has a size: the model's where none was sent
    flat.update(width=flat["width"] or model.default_width, height=flat["height"] or model.default_height)
    parsed.request = read(flat, limits, blank_is_unset=False)
    return parsed


def decode_images(payload: dict[str, Any], limits: Limits, max_bytes: int) -> list[Image.Image]:
    """init_images, each checked from its header before it is decoded."""
    values = payload.get("init_images")
    if not isinstance(values, list) or not values:
        raise WireError(("init_images",), "a list of at least one base64 image is required")
    if len(values) > limits.max_edit_files:
        raise WireError(("init_images",), f"{len(values)} images, more than {limits.max_edit_files} (MAX_EDIT_FILES)")
    out = []
    for i, value in enumerate(values):
        data = images.from_base64(value, ("init_images", i), max_bytes)
        out.append(images.open_bytes(data, ("init_images", i), limits.max_upload_pixels, max_bytes, "RGB"))
    return out


def decode_mask(payload: dict[str, Any], image: Image.Image, limits: Limits, max_bytes: int) -> Image.Image | None:
    """A1111's mask (white = repaint), its size compared with the first image's before it is decoded."""
    if payload.get("mask") in (None, ""):
        return None
    data = images.from_base64(payload["mask"], ("mask",), max_bytes)
    width, height = images.header_size(data, ("mask",), limits.max_upload_pixels)
    if (width, height) != image.size:
        raise WireError(
            ("mask",),
            f"{width}x{height} but init_images[0] is {image.width}x{image.height}; the mask must have its image's size",
        )
    return images.open_bytes(data, ("mask",), limits.max_upload_pixels, max_bytes, None)


def img2img(payload: dict[str, Any], limits: Limits, max_bytes: int) -> Parsed:
    """An image-to-image request (an inpaint with a mask): init_images decoded after header checks."""
    if not isinstance(payload, dict):
        raise WireError((), "the body must be a JSON object of A1111's request fields")
    pictures = decode_images(payload, limits, max_bytes)
    mask = decode_mask(payload, pictures[0], limits, max_bytes)
    task = "inpaint" if mask is not None else "img2img"
    if mask is not None and len(pictures) > 1:
        raise WireError(("init_images",), "an inpaint takes one image (the mask's)")
    limits = limits.for_task(task)  # inpaints run on the main model, edits on the model serving edits
    flat, parsed = common(payload, limits, task, len(pictures))
    flat.update(init_images=pictures, mask=mask)
    flat.update(a1111_controlnet.split(a1111_controlnet.units(payload, pictures[0], limits, max_bytes, parsed.warnings)))
    if task == "img2img":
        flat.setdefault("strength", A1111_IMG2IMG_STRENGTH)
        if not limits.model.image_guidance:
            flat.pop("image_guidance_scale", None)  # A1111 sends it for every model; only editors take it
    parsed.request = read(flat, limits, blank_is_unset=False)
    return parsed
