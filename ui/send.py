""" "Send to Generate / Edit / Inpaint": fill a tab's form from parameters read out of a PNG.

Values are fitted to the loaded model's limits (size step, largest side, steps, guidance) and
LoRAs the server does not have are left out; what had to change is returned as notes.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines.backend import ModelInfo
from pipelines.inpaint import (
    DEFAULT_STRENGTH,
    INPAINT_AREAS,
    INPAINT_DEFAULTS,
    MASKED_CONTENT,
    MAX_MASK_BLUR,
    MAX_PADDING,
)
from pipelines.request import DEFAULTS
from ui.fields import SENT_TO_EDIT, SENT_TO_GENERATE, SENT_TO_INPAINT
from ui.inputs import bounds


def _fit_size(value: Any, info: ModelInfo, default: int) -> int:
    if not isinstance(value, int):
        return default
    step = info.size_multiple
    return max(step, min(info.max_side, round(value / step) * step))


def form_values(params: dict[str, Any], info: ModelInfo) -> tuple[dict[str, Any], list[str]]:
    """The Generate form's values for `params`, and notes on what was adjusted."""
    notes = []
    values: dict[str, Any] = {
        "prompt": params.get("prompt", ""),
        "negative_prompt": params.get("negative_prompt", ""),
        "seed": str(params.get("seed", 0)),  # text: a 64-bit seed keeps every digit (generate_tab.seed_box)
        "random_seed": "seed" not in params,
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
    if (values["width"], values["height"]) != (params.get("width"), params.get("height")) and "width" in params:
        notes.append(f"size {params['width']}x{params['height']} fitted to {values['width']}x{values['height']}")
    wanted = params.get("sampler")
    values["sampler"] = wanted if wanted in info.samplers else info.scheduler
    if wanted and wanted not in info.samplers:
        notes.append(f"sampler {wanted} is not available here; using {info.scheduler}")
    loras = params.get("loras") or {}
    values["loras"] = {n: s for n, s in loras.items() if n in info.loras}
    missing = sorted(set(loras) - set(values["loras"]))
    if missing:
        notes.append("LoRA(s) not on this server: " + ", ".join(missing))
    if params.get("model") and params["model"] != info.model_name:
        notes.append(f"made with model {params['model']}; this server runs {info.model_name}")
    return values, notes


def model_for(params: dict[str, Any], info: ModelInfo) -> ModelInfo:
    """The model a PNG's parameters are checked against: an edit's (it records image guidance or a
    strength) goes to the model that serves the Edit tab, anything else to the main one."""
    return info.for_edits if {"image_guidance_scale", "strength"} & set(params) else info


def _edit_values(params: dict[str, Any], info: ModelInfo, values: dict[str, Any], notes: list[str]) -> None:
    """The Edit tab's own fields: image guidance (instruction editors) and strength (image-to-image)."""
    wanted = params.get("image_guidance_scale")
    values["image_guidance_scale"] = info.default_image_guidance
    if wanted is not None and info.image_guidance:
        values["image_guidance_scale"] = _fit("image_guidance_scale", float(wanted))
    elif wanted is not None:
        notes.append(f"image guidance {wanted:g} is for instruction editors; {info.model_name} does not take it")
    values["strength"] = _fit("strength", float(params.get("strength", DEFAULTS.strength)))


def _fit(field: str, value: float) -> float:
    """`value` clamped to the field's bounds (what its slider and the pipeline accept)."""
    low, high = bounds(field)
    return min(high, max(low, value))


def generate_updates(params: dict[str, Any], info: ModelInfo, scales: list) -> list[Any]:
    """gr.update()s for the Generate tab's SENT_TO_GENERATE components, then one per LoRA scale slider."""
    values, _ = form_values(params, info)
    chosen = values.pop("loras")
    updates = [gr.update(value=values[name]) for name in SENT_TO_GENERATE if name != "loras"]
    updates.append(gr.update(value=list(chosen)))
    updates += [
        gr.update(value=chosen.get(name, 1.0), visible=name in chosen)
        for name, _slider in zip(info.loras, scales, strict=True)
    ]
    return updates


def generate_targets(g: dict[str, Any]) -> list[Any]:
    """The components `generate_updates` fills, in its order."""
    return [g[name] for name in SENT_TO_GENERATE if name != "loras"] + [g["loras"], *g["scales"]]


def edit_updates(params: dict[str, Any], info: ModelInfo) -> list[Any]:
    """gr.update()s for the Edit tab's SENT_TO_EDIT components (values fitted to the model that edits)."""
    values, _ = form_values(params, info.for_edits)
    return [gr.update(value=values[name]) for name in SENT_TO_EDIT]


def edit_targets(e: dict[str, Any]) -> list[Any]:
    """The components `edit_updates` fills, in its order."""
    return [e[name] for name in SENT_TO_EDIT]


def inpaint_values(params: dict[str, Any], info: ModelInfo) -> tuple[dict[str, Any], list[str]]:
    """The Inpaint form's values for `params` (fitted to the main model, which inpaints), and notes."""
    values, notes = form_values(params, info)
    values["strength"] = _fit("strength", float(params.get("strength", DEFAULT_STRENGTH)))
    values["mask_blur"] = _whole(params.get("mask_blur"), INPAINT_DEFAULTS.mask_blur, MAX_MASK_BLUR)
    values["padding"] = _whole(params.get("padding"), INPAINT_DEFAULTS.padding, MAX_PADDING)
    values["masked_content"] = _one_of(params.get("masked_content"), MASKED_CONTENT)
    values["inpaint_area"] = _one_of(params.get("inpaint_area"), INPAINT_AREAS)
    values["invert_mask"] = params.get("invert_mask") is True
    if not info.inpaint:
        notes.append(f"{info.model_name} cannot inpaint; load a model that does")
    return values, notes


def _whole(value: Any, default: int, high: int) -> int:
    """A pixel count clamped to 0..high; the default where the PNG has none (or not a number)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return min(high, max(0, round(value)))


def _one_of(value: Any, options: tuple[str, ...]) -> str:
    return value if value in options else options[0]


def inpaint_updates(params: dict[str, Any], info: ModelInfo, image: str | None) -> list[Any]:
    """gr.update()s for the Inpaint tab's editor (`image` as its picture, no strokes) and its
    SENT_TO_INPAINT components."""
    values, _ = inpaint_values(params, info)
    editor = gr.update(value=image) if image else gr.update()
    return [editor, *(gr.update(value=values[name]) for name in SENT_TO_INPAINT)]


def inpaint_targets(i: dict[str, Any]) -> list[Any]:
    """The components `inpaint_updates` fills, in its order."""
    return [i["editor"], *(i[name] for name in SENT_TO_INPAINT)]
