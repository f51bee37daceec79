""" "Send to Generate / Edit / Inpaint": fill a tab's form from parameters read out of a PNG.

Values are fitted to the loaded model's limits (size step, largest side, steps, guidance) and
LoRAs the server does not have are left out; what had to change is returned as notes.

- Sampler: any tool's name and schedule (A1111 "DPM++ 2M" + "Karras", ComfyUI "euler_ancestral" +
  "karras", "dpmpp_2m_sde_gpu", InvokeAI "dpmpp_2m_k", NovelAI "k_euler_ancestral") is mapped by
  pipelines.sampling.samplers.from_any to one this model offers; where none fits, the model's own is kept and
  the note says why.
- Prompt: the Generate form runs one prompt per line, so a multi-line prompt read from a PNG is
  sent as ONE line, its lines joined by a space (what CLIP's tokenizer makes of a newline anyway).
- Step cache: the one the image ran with (none where the PNG names none), so the seed reproduces it;
  on a model without step caches the note says the run is uncached.
- Seed: any seed 0..2^64-1 is sent exactly (the seed field is text); one outside that range
  (A1111's -1: random) ticks "Random seed".
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines import NO_STEP_CACHE as NONE
from pipelines import ModelInfo, StepCache, control_settings, from_any
from pipelines import step_cache_name as canonical
from pipelines.schema.hires import HIRES_DEFAULTS
from pipelines.schema.inpaint import DEFAULT_STRENGTH
from pipelines.schema.request import IMG2IMG_STRENGTH, SEED_SPACE, fields, spec
from ui.form import PANELS, SLIDER_THRESHOLD_MIN, Form, slider_threshold


def _fit_size(value: Any, info: ModelInfo, default: int) -> int:
    if not isinstance(value, int):
        return default
    low, high = info.side_bounds  # the sliders' (an infotext's Size is the first pass's, also with hires fix)
    return max(low, min(high, round(value / info.size_multiple) * info.size_multiple))


def form_values(params: dict[str, Any], info: ModelInfo) -> tuple[dict[str, Any], list[str]]:
    """The Generate form's values for `params`, and notes on what was adjusted."""
    notes: list[str] = []
    values: dict[str, Any] = {
        "prompt": one_prompt(params.get("prompt"), notes),
        "negative_prompt": params.get("negative_prompt") if isinstance(params.get("negative_prompt"), str) else "",
        **_seed(params.get("seed"), notes),
        "steps": _fit("steps", int(params.get("steps") or info.default_steps)),
        "guidance_scale": _fit("guidance_scale", float(params.get("guidance_scale", info.default_guidance))),
        "width": _fit_size(params.get("width"), info, info.default_width),
        "height": _fit_size(params.get("height"), info, info.default_height),
    }
    end = params.get("guidance_end", 1.0)  # not written: guidance ran every step
    values["guidance_end"] = _fit("guidance_end", float(end)) if info.guidance_end else info.default_guidance_end
    if end < 1.0 and not info.guidance_end:
        notes.append(f"guidance end {end:g} is not available with {info.model_name}; guidance runs every step")
    _edit_values(params, info, values, notes)
    _step_cache_values(params, info, values, notes)
    _hires_values(params, info, values, notes)
    if (values["width"], values["height"]) != (params.get("width"), params.get("height")) and "width" in params:
        notes.append(f"size {params['width']}x{params['height']} fitted to {values['width']}x{values['height']}")
    values["sampler"] = sampler_for(params, info, notes)
    loras = params.get("loras") or {}
    values["loras"] = {n: s for n, s in loras.items() if n in info.loras}
    missing = sorted(set(loras) - set(values["loras"]))
    if missing:
        notes.append("LoRA(s) not on this server: " + ", ".join(missing))
    if params.get("model") and params["model"] != info.model_name:
        notes.append(f"made with model {params['model']}; this server runs {info.model_name}")
    _recorded_values(params, values, info, notes)
    values["styles"] = _styles(params, info, (values["prompt"], values["negative_prompt"]), notes)
    values["controlnet"] = [control_settings(unit) for unit in params.get("controlnet") or []]
    if values["controlnet"]:
        notes.append(f"{len(values['controlnet'])} ControlNet unit(s): settings restored; add their control images")
    values["ip_adapter"] = [p for p in params.get("ip_adapter") or [] if p.get("model") in info.ip_adapters]
    if params.get("ip_adapter"):
        notes.append(f"{len(params['ip_adapter'])} image prompt(s): {len(values['ip_adapter'])} restored "
                     "(adapters this model has); add their reference images")  # fmt: skip
    return values, notes


def _recorded_values(params: dict[str, Any], values: dict[str, Any], info: ModelInfo, notes: list[str]) -> None:
    """Every other number, text, choice or switch a PNG records (the schema names its infotext key: "Clip
    skip", "RP Ratios", "ADetailer model", and any field new to the schema), a number fitted to its range;
    where the PNG has none, unset or the field's default (what A1111 leaves out is the default)."""
    for item in fields():
        if not item.about.infotext or item.name in values:
            continue
        value = params.get(item.name)
        if item.kind in ("whole", "number"):
            values[item.name] = _fit(item.name, value) if isinstance(value, int | float) else None
        elif item.kind in ("text", "choice", "flag"):  # Regional Prompter's, ADetailer's: off where the PNG has none
            values[item.name] = value if value is not None else item.default
    for name in ("ad_model", "ad_model_2nd"):  # a detector this server lacks (ADetailer's YOLO files): the pass off
        if values.get(name) not in (None, "None", *info.detectors):
            notes.append(f"detector {values[name]} is not on this server; that detailer pass is off")
            values[name] = "None"


def _styles(params: dict[str, Any], info: ModelInfo, prompts: tuple[str, str], notes: list[str]) -> list[str]:
    """The PNG's style names this server's styles file has, in order; one whose texts the prompt and the
    negative prompt already hold is left off (its tool wrote the styled prompts: choosing it again would
    add the texts twice)."""
    wanted = [name for name in params.get("styles") or [] if isinstance(name, str)]
    chosen, applied = [], []
    for name in wanted:
        style = info.styles.get(name)
        if style is None:
            continue
        pieces = [(piece.strip(" ,"), held) for key, held in zip(("prompt", "negative_prompt"), prompts, strict=True)
                  for piece in str(style.get(key) or "").split("{prompt}") if piece.strip(" ,")]  # fmt: skip
        (applied if pieces and all(piece in held for piece, held in pieces) else chosen).append(name)
    missing = [name for name in wanted if name not in info.styles]
    if missing:
        notes.append("style(s) not in this server's styles file: " + ", ".join(missing))
    if applied:
        notes.append("style(s) already in the prompt, not chosen again: " + ", ".join(applied))
    return chosen


def one_prompt(prompt: Any, notes: list[str]) -> str:
    """A prompt as ONE line for the Generate form (which runs each line as its own prompt): the lines
    joined by a space, as CLIP's tokenizer reads a newline."""
    lines = [line.strip() for line in str(prompt or "").splitlines() if line.strip()]
    if len(lines) > 1:
        notes.append(f"the prompt's {len(lines)} lines were joined into one prompt (one image, as made)")
    return " ".join(lines)


def _seed(seed: Any, notes: list[str]) -> dict[str, Any]:
    """The seed field (text: a 64-bit seed keeps every digit, generate_tab.seed_box) and the random toggle."""
    valid = isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed < SEED_SPACE
    if seed is not None and not valid:
        notes.append(f"seed {seed} is not one of 0..2^64-1 (-1 is A1111's random); a random seed is used")
    return {"seed": str(seed) if valid else "0", "random_seed": not valid}


def sampler_for(params: dict[str, Any], info: ModelInfo, notes: list[str]) -> str:
    """The sampler this model offers for a PNG's sampler and schedule, else the model's own (noted)."""
    wanted = params.get("sampler")
    if not isinstance(wanted, str) or not wanted.strip():
        return info.scheduler
    resolved = from_any(wanted, params.get("schedule"))
    shown = " + ".join(dict.fromkeys(str(x) for x in (wanted, params.get("schedule")) if x))
    if resolved.sampler in info.samplers:
        if resolved.note:
            notes.append(resolved.note)
        return resolved.sampler
    plain = resolved.sampler.removesuffix(" Karras")
    if plain != resolved.sampler and plain in info.samplers:
        notes.append(
            f"sampler {resolved.sampler} is not available here (Karras sigmas are not offered for this model's "
            f"noise schedule); using {plain}"
        )
        return plain
    why = "this model cannot use it" if resolved.known else "no sampler of this app matches it"
    notes.append(f"sampler {shown} is not available here ({why}); using the model's own, {info.scheduler}")
    return info.scheduler


def model_for(params: dict[str, Any], info: ModelInfo) -> ModelInfo:
    """The model a PNG's parameters are checked against: an edit's (it records image guidance or a
    strength) goes to the model that serves the Edit tab, anything else to the main one."""
    edit = {"image_guidance_scale", "strength"} & set(params) and not params.get("hires_fix")  # hires: a txt2img
    return info.for_edits if edit else info


def _edit_values(params: dict[str, Any], info: ModelInfo, values: dict[str, Any], notes: list[str]) -> None:
    """The Edit tab's own fields: image guidance (instruction editors) and strength (image-to-image)."""
    wanted = params.get("image_guidance_scale")
    values["image_guidance_scale"] = info.default_image_guidance
    if wanted is not None and info.image_guidance:
        values["image_guidance_scale"] = _fit("image_guidance_scale", float(wanted))
    elif wanted is not None:
        notes.append(f"image guidance {wanted:g} is for instruction editors; {info.model_name} does not take it")
    values["strength"] = _fit("strength", float(params.get("strength", IMG2IMG_STRENGTH)))


def _step_cache_values(params: dict[str, Any], info: ModelInfo, values: dict[str, Any], notes: list[str]) -> None:
    """The step cache the image ran with: a PNG without one ran uncached (pipelines.pnginfo.write writes
    `Step cache` only where one ran), and the same seed only gives the same image with the same cache."""
    method = params.get("step_cache")
    cache = StepCache.of(canonical(method) if isinstance(method, str) else None, params.get("step_cache_threshold"))
    if cache is not None and not info.step_cache:
        notes.append(f"made with step cache {cache.label}; {info.model_name} has none, so this run is uncached")
        cache = None
    elif cache is None and info.step_cache and info.default_step_cache != NONE:
        notes.append(
            f"made without a step cache: Step cache set to none (this server's default is {info.default_step_cache})"
        )
    if params.get("step_cache_calibration"):
        notes.append("made by a MagCache calibration run, which skips nothing: sent uncached, as it ran")
    values["step_cache"] = cache.method if cache else NONE
    threshold = cache.threshold if cache and cache.threshold is not None else slider_threshold(values["step_cache"])
    values["step_cache_threshold"] = max(SLIDER_THRESHOLD_MIN, threshold)
    if threshold < SLIDER_THRESHOLD_MIN:
        notes.append(f"step cache threshold {threshold:g} raised to {SLIDER_THRESHOLD_MIN:g}, the form's lowest")


def _hires_values(params: dict[str, Any], info: ModelInfo, values: dict[str, Any], notes: list[str]) -> None:
    """Hires fix as the image ran it (off where the PNG names none): its upscaler where this server
    has it (else the default, noted), its sizes, steps, strength, prompts and sampler."""
    values["hires_fix"] = params.get("hires_fix") is True
    upscaler = params.get("hires_upscaler") or HIRES_DEFAULTS.hires_upscaler
    if upscaler not in info.upscalers:
        notes.append(f"hires upscaler {upscaler} is not on this server; using {HIRES_DEFAULTS.hires_upscaler}")
        upscaler = HIRES_DEFAULTS.hires_upscaler
    values["hires_upscaler"] = upscaler
    for name in ("hires_width", "hires_height", "hires_steps"):
        values[name] = _whole(params.get(name), spec(name))
    for name in ("hires_scale", "hires_strength"):
        value = params.get(name)
        values[name] = _fit(name, float(value)) if isinstance(value, int | float) else getattr(HIRES_DEFAULTS, name)
    for name in ("hires_prompt", "hires_negative_prompt"):
        values[name] = params.get(name) if isinstance(params.get(name), str) else ""
    wanted = params.get("hires_sampler")
    values["hires_sampler"] = sampler_for({"sampler": wanted}, info, notes) if wanted else ""


def _fit(field: str, value: float) -> float:
    """`value` clamped to the field's bounds (what its slider and the pipeline accept)."""
    bound = spec(field).value
    return min(bound.high, max(bound.low, value))


# What Send fills: every field of the tab but the number of images (a PNG is one image). ControlNet
# units get their settings (a PNG does not hold their images: the note says to add them).
NOT_SENT = {"num_images"}


def fill(form: Form, values: dict[str, Any]) -> dict[Any, Any]:
    """gr.update()s setting `form`'s fields (those `values` has, but NOT_SENT) to `values`."""
    c, out = form.c, {}
    for name in form.built:
        if name in NOT_SENT or name not in values:
            continue
        if isinstance(c[name], PANELS):  # ControlNet units, image prompts
            out.update(c[name].fill(values[name]))
        elif name == "loras":
            chosen = values["loras"]
            out[c["loras"]] = gr.update(value=list(chosen))
            for lora, slider in zip(form.lora_names, c["scales"], strict=True):
                out[slider] = gr.update(value=chosen.get(lora, 1.0), visible=lora in chosen)
        else:
            out[c[name]] = gr.update(value=values[name])
    if "seed" in form.built and "random_seed" in values:
        out[c["random_seed"]] = gr.update(value=values["random_seed"])
    return out


def targets(form: Form) -> list[Any]:
    """Every component `fill` may set (an event's outputs)."""
    return [component for component in form.inputs]


def generate_updates(params: dict[str, Any], info: ModelInfo, form: Form) -> dict[Any, Any]:
    """Send to Generate: the Generate form's fields from a PNG's parameters (fitted to the main model)."""
    values, _ = form_values(params, info)
    return fill(form, values)


def edit_updates(params: dict[str, Any], info: ModelInfo, form: Form) -> dict[Any, Any]:
    """Send to Edit: the Edit form's fields (values fitted to the model that edits)."""
    values, _ = form_values(params, info.for_edits)
    return fill(form, values)


def inpaint_values(params: dict[str, Any], info: ModelInfo) -> tuple[dict[str, Any], list[str]]:
    """The Inpaint form's values for `params` (fitted to the main model, which inpaints), and notes."""
    values, notes = form_values(params, info)
    values["strength"] = _fit("strength", float(params.get("strength", DEFAULT_STRENGTH)))
    for name in ("mask_blur", "padding"):
        values[name] = _whole(params.get(name), spec(name))
    for name in ("masked_content", "inpaint_area"):
        values[name] = _one_of(params.get(name), spec(name).value.options)
    values["invert_mask"] = params.get("invert_mask") is True
    if not info.inpaint:
        notes.append(f"{info.model_name} cannot inpaint; load a model that does")
    return values, notes


def _whole(value: Any, field: Any) -> int:
    """A pixel count clamped to the field's range; its default where the PNG has none (or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return field.default
    return int(min(field.value.high, max(field.value.low, round(value))))


def _one_of(value: Any, options: tuple[str, ...]) -> str:
    return value if value in options else options[0]


def inpaint_updates(params: dict[str, Any], info: ModelInfo, image: str | None, form: Form) -> dict[Any, Any]:
    """Send to Inpaint: the editor's picture (`image`, no strokes) and the Inpaint form's fields."""
    values, _ = inpaint_values(params, info)
    out = fill(form, values)
    out[form.c["editor"]] = gr.update(value=image) if image else gr.update()
    return out


def inpaint_targets(form: Form) -> list[Any]:
    """The components `inpaint_updates` fills."""
    return [form.c["editor"], *targets(form)]
