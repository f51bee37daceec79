"""A tab's form, derived from the request schema: its fields, their controls, their values.

Each tab serves one kind of request (Generate: txt2img, Edit: img2img, Inpaint: inpaint) and shows
every field of that task (`pipelines.schema.request.fields`), except the ones it says it does not take,
with the reason (`NOT_TAKEN`; tests/test_fields.py checks). A tab places the fields it lays out
itself (`Form.add`), and `Form.add_rest` puts every other one in its Advanced section, so a field
added to the schema appears on every tab of its task with no change here. A control's bounds,
choices, step, label and default come from the schema; where the default is "the model's", from
the loaded model (`model_props`, also what a model switch updates).

Values are read back by field name (`Form.read`) into the flat values every front end gives
`engine.inputs.read`: the form's sliders never hold a value the schema would refuse.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from pipelines import STEP_CACHE_FAMILIES as FAMILIES
from pipelines import ModelInfo
from pipelines.schema.control import PREPROCESSORS, ControlUnit
from pipelines.schema.detailer import SECOND, model_defaults
from pipelines.schema.fields import Choice, Range, Seed, Spec
from pipelines.schema.image_prompt import ImagePrompt
from pipelines.schema.request import DECODE_KNOBS, STEP_CACHE_THRESHOLDS, STRENGTH, fields, spec
from ui import control_panel, image_prompt_panel

# The panels of the request's lists of parts (kind "units"): components, read, fill.
PANELS = (control_panel.ControlPanel, image_prompt_panel.ImagePromptPanel)

TASK = {"generate": "txt2img", "edit": "img2img", "inpaint": "inpaint", "video": "video"}
PREFIX = {"generate": "", "edit": "edit-", "inpaint": "inpaint-", "video": "video-"}  # of the elements' ids (browser tests find them)
# Fields of a tab's task the tab does not take, and why.
_TEMPLATE = "set by the server: the wildcard template each prompt was resolved from (kept in the images' metadata)"
NOT_TAKEN: dict[str, dict[str, str]] = {
    "generate": {"prompt_template": _TEMPLATE},
    "edit": {
        "prompt_template": _TEMPLATE,
        "width": "an edit keeps its input's aspect ratio at the model's area",
        "height": "an edit keeps its input's aspect ratio at the model's area",
    },
    "video": {"prompt_template": _TEMPLATE},
    "inpaint": {
        "prompt_template": _TEMPLATE,
        "width": "an inpaint keeps its picture's size (\"only masked\" renders the masked box at the model's area)",
        "height": "an inpaint keeps its picture's size (\"only masked\" renders the masked box at the model's area)",
    },
}
# Fields a tab takes from its own widgets, not a form control: the Edit tab's files, the Inpaint
# tab's editor (the picture and its strokes or a mask upload).
FROM_WIDGETS = {"init_images", "mask"}
# What a tab shows before the user changes it, where that is not the schema's default: Generate
# makes a batch of 4 (what the app is for), every other tab one image per input; the strength is
# the task's (the request's own default, `pipelines.schema.request.STRENGTH`).
FIRST_VALUES = {
    "generate": {"num_images": 4},
    **{tab: {"strength": STRENGTH[TASK[tab]]} for tab in ("edit", "inpaint")},
}
SLIDER_THRESHOLD_MIN = 0.01  # the step cache slider's lowest value (the bound itself is open at 0)
# Fields whose "unset" (null) has a fixed meaning the schema states ("null: the model's (0, none)", "null: 1"):
# their slider starts there, which the pipeline runs exactly as unset (and records nothing for).
UNSET_AS = {"guidance_rescale": 0.0, "clip_skip": 1}
_IDS = {"guidance_scale": "guidance", "image_guidance_scale": "image-guidance", "negative_prompt": "negative"}


def tab_fields(tab: str) -> list[Spec]:
    """The schema fields `tab` shows as controls, in the schema's order."""
    return [s for s in fields(TASK[tab]) if s.name not in NOT_TAKEN[tab] and s.name not in FROM_WIDGETS]


def slider_threshold(method: str) -> float:
    """The threshold a form shows for `method`: its default; for a method without one (its slider is
    hidden) FirstBlockCache's, ready for when a method with one is picked."""
    return STEP_CACHE_THRESHOLDS.get(method, STEP_CACHE_THRESHOLDS["FirstBlockCache"])


def _step_cache(info: ModelInfo) -> dict[str, Any]:
    why = (
        "reuses work between steps: faster, slightly different images"
        if info.step_cache
        else f"not available: {info.pipeline_class} has no step cache in diffusers. Families with one: {FAMILIES}"
    )
    return {"value": info.default_step_cache, "interactive": info.step_cache, "info": why}


def _threshold(info: ModelInfo) -> dict[str, Any]:
    method = info.default_step_cache
    value = max(SLIDER_THRESHOLD_MIN, info.default_step_cache_threshold or slider_threshold(method))
    return {"value": value, "visible": method in STEP_CACHE_THRESHOLDS}


def _samplers(info: ModelInfo) -> list[str]:
    """The samplers this model offers, its own first where the table has none for it (a scheduler class or
    options without an A1111 name, e.g. Euler with Karras sigmas): the dropdown's value is always one of
    its choices, and a request naming the model's own runs it (`ModelInfo.accept`)."""
    offered = list(info.samplers)
    return offered if info.scheduler in offered else [info.scheduler, *offered]


# A control's properties that depend on the loaded model: used to build it and to update it after a
# model switch (one place, so both always agree with the server's limits).
MODEL_PROPS: dict[str, Callable[[ModelInfo], dict[str, Any]]] = {
    "sampler": lambda info: {"choices": _samplers(info), "value": info.scheduler},
    "steps": lambda info: {"value": info.default_steps},
    "guidance_scale": lambda info: {"value": info.default_guidance, "info": info.guidance_label},
    "guidance_end": lambda info: {"value": info.default_guidance_end, "visible": info.guidance_end},
    "width": lambda info: _side(info, info.default_width),
    "height": lambda info: _side(info, info.default_height),
    "num_images": lambda info: {"maximum": info.max_batch},
    "image_guidance_scale": lambda info: {"value": info.default_image_guidance, "visible": info.image_guidance},
    "step_cache": _step_cache,
    "num_frames": lambda info: _frames(info),
    "fps": lambda info: {"value": info.clips.default_fps if info.clips else 16.0},
    "guidance_scale_2": lambda info: {"value": info.default_guidance, "visible": bool(info.clips and info.clips.two_experts)},
    # a timestep-aware VAE's decode (LTX-Video 0.9.1+): 0 decodes the latents as denoised, the pipeline's default
    **dict.fromkeys(DECODE_KNOBS, lambda info: {"value": 0.0, "visible": bool(info.clips and info.clips.timestep_decode)}),
    "step_cache_threshold": _threshold,
    "styles": lambda info: {"choices": list(info.styles), "visible": bool(info.styles)},
    "hires_fix": lambda info: {"interactive": _hires_possible(info), "info": _hires_info(info)},
    "hires_upscaler": lambda info: {"choices": list(info.upscalers)},
    "hires_sampler": lambda info: {"choices": [("Same as the first pass", ""), *((s, s) for s in info.samplers)]},
    **{
        name + suffix: prop
        for suffix in ("", SECOND)
        for name, prop in {
            "ad_model": lambda info: {"choices": ["None", *info.detectors], "info": _detector_info(info)},
            "ad_denoising_strength": lambda info: {"value": model_defaults(info.vocabulary)["ad_denoising_strength"]},
            "ad_inpaint_only_masked_padding": lambda info: {"value": model_defaults(info.vocabulary)["ad_inpaint_only_masked_padding"]},
        }.items()
    },
}  # fmt: skip


def _frames(info: ModelInfo) -> dict[str, Any]:
    """The frames slider of a video model: its default, its most, in its step (k x step + 1)."""
    if info.clips is None:
        return {"value": 17, "step": 4, "minimum": 1, "info": "no video model is loaded (VIDEO_MODEL_ID)"}
    c = info.clips
    return {"value": c.default_frames, "step": c.frame_step, "minimum": 1, "maximum": c.max_frames,
            "info": f"k x {c.frame_step} + 1 frames (the model packs {c.frame_step} per latent frame); 1: a still"}  # fmt: skip


def _detector_info(info: ModelInfo) -> str:
    if not info.inpaint:
        return f"not available: {info.pipeline_class} cannot inpaint, which the detailer does to each region"
    return "finds regions in each image and repaints each at full resolution (DETECTOR_DIR)"


def _side(info: ModelInfo, value: int) -> dict[str, Any]:
    """A size slider between the model's side bounds (ModelInfo.side_bounds)."""
    low, high = info.side_bounds
    return {"minimum": low, "maximum": high, "value": value, "step": info.size_multiple}


def _hires_possible(info: ModelInfo) -> bool:
    return info.text_to_image and info.image_to_image and not info.edit


def _hires_info(info: ModelInfo) -> str:
    if _hires_possible(info):
        return f"draw at {info.default_width}x{info.default_height}, enlarge, then refine: a larger image without a repeated subject"
    return f"not available: {info.pipeline_class} has no image-to-image pipeline for the second pass"


# ... and those that depend on the tab too: an instruction editor takes no strength (the Edit tab
# hides it there), while an inpaint always does.
TAB_PROPS: dict[tuple[str, str], Callable[[ModelInfo], dict[str, Any]]] = {
    ("edit", "strength"): lambda info: {"visible": info.image_to_image and not info.edit},
}


def model_props(name: str, info: ModelInfo, tab: str) -> dict[str, Any]:
    props = MODEL_PROPS[name](info) if name in MODEL_PROPS else {}
    return {**props, **TAB_PROPS[(tab, name)](info)} if (tab, name) in TAB_PROPS else props


def _follows_model(tab: str, name: str) -> bool:
    return name in MODEL_PROPS or (tab, name) in TAB_PROPS


class Form:
    """The controls of one tab's fields, by field name (`c`), built in the tab's layout."""

    def __init__(self, tab: str, info: ModelInfo, c: dict[str, Any], detect: Callable[..., Any] | None = None):
        self.tab, self.info, self.c = tab, info, c
        self.detect = detect  # ControlNet map previews: the engine's (its annotators); None: built-in maps only
        self.first = FIRST_VALUES.get(tab, {})
        self.built: list[str] = []
        self.lora_names: list[str] = []  # the LoRA picker's, fixed when it is built (a slider each)

    def add(self, name: str, **props: Any) -> Any:
        """The control of field `name`, with the schema's bounds and label and the model's defaults;
        `props` (layout: lines, info, placeholder) win."""
        item = spec(name)
        base = {"label": item.about.label, "elem_id": PREFIX[self.tab] + _IDS.get(name, name.replace("_", "-"))}
        props = {**base, **self._props(item), **model_props(name, self.info, self.tab), **props}
        if name in self.first:
            props["value"] = self.first[name]
        if props.get("value") is None and name in UNSET_AS:
            props["value"] = UNSET_AS[name]
        builder = _BUILDERS.get(name) or _KINDS[item.kind]
        component = builder(self, item, props)
        self.built.append(name)
        return component

    def add_rest(self) -> None:
        """Every field of the tab not placed yet (a field new to the schema lands here)."""
        for item in tab_fields(self.tab):
            if item.name not in self.built:
                self.add(item.name)

    def _props(self, item: Spec) -> dict[str, Any]:
        value = item.value
        out: dict[str, Any] = {"value": item.default}
        if isinstance(value, Range):
            low = SLIDER_THRESHOLD_MIN if value.low_open else value.low
            step = item.about.step or (1 if value.integer else 0.01)
            out.update(minimum=low, maximum=value.high, step=step)
        return out

    @property
    def inputs(self) -> list[Any]:
        """Every component the form's values are read from."""
        out = []
        for name in self.built:
            if isinstance(self.c[name], PANELS):
                out += self.c[name].components
                continue
            out += self.c["scales"] if name == "loras" else []
            out.append(self.c[name])
            out += [self.c["random_seed"]] if name == "seed" else []
        return out

    def read(self, v: dict[Any, Any]) -> dict[str, Any]:
        """The flat values of an event's inputs (`v`: component -> value)."""
        panels = {name for name in self.built if isinstance(self.c[name], PANELS)}
        flat = {name: v[self.c[name]] for name in self.built if name not in ("seed", "loras", *panels)}
        flat.update({name: self.c[name].read(v) for name in panels})
        if "seed" in self.built:
            flat["seed"] = None if v[self.c["random_seed"]] else v[self.c["seed"]]
        if "loras" in self.built:
            chosen = v[self.c["loras"]] or []
            flat["loras"] = {n: v[s] for n, s in zip(self.lora_names, self.c["scales"], strict=True) if n in chosen}
        return flat

    def values_of(self, updates: dict[Any, Any]) -> dict[str, Any]:
        """The values an updates dict (`ui.send.fill`) sets, by field name ("random_seed" too)."""
        names = {id(self.c[name]): name for name in (*self.built, *(["random_seed"] if "seed" in self.built else []))}
        return {names[id(k)]: u["value"] for k, u in updates.items() if id(k) in names and "value" in u}

    def updates(self, info: ModelInfo) -> dict[Any, Any]:
        """What changes in the form when another model is loaded."""
        out = {
            self.c[name]: gr.update(**model_props(name, info, self.tab))
            for name in self.built
            if _follows_model(self.tab, name)
        }
        if "num_images" in self.first and "num_images" in self.built:
            out[self.c["num_images"]] = gr.update(
                maximum=info.max_batch, value=min(self.first["num_images"], info.max_batch)
            )
        return out


def _slider(form: Form, item: Spec, props: dict[str, Any]) -> Any:
    """A slider; a number box where the field's default is "unset" (null: the model's) and neither the model
    nor UNSET_AS names a value to start from, so the form can send "unset" back: its bounds in its info line."""
    if props.get("value") is None:
        bounds = f"{props.get('minimum')} to {props.get('maximum')}; empty: the model's"
        props = {**props, "info": f"{props['info']} ({bounds})" if props.get("info") else bounds}
        return gr.Number(**props, precision=0 if item.kind == "whole" else None)
    return gr.Slider(**props)


def _text(form: Form, item: Spec, props: dict[str, Any]) -> Any:
    props = {"lines": 1, **props, "value": props.get("value") or ""}
    return gr.Textbox(**props)


def _choice(form: Form, item: Spec, props: dict[str, Any]) -> Any:
    options = list(item.value.options) if isinstance(item.value, Choice) else props.pop("choices")
    props.setdefault("choices", options)
    return (gr.Radio if len(props["choices"]) <= 3 else gr.Dropdown)(**props)


def _flag(form: Form, item: Spec, props: dict[str, Any]) -> Any:
    return gr.Checkbox(**{k: v for k, v in props.items() if k != "value"}, value=bool(props.get("value")))


def _names(form: Form, item: Spec, props: dict[str, Any]) -> Any:
    """Names the server offers (the styles of its STYLES_FILE), several in order; hidden when it has none."""
    props = {"info": "from the server's styles file, applied in order", **props, "value": list(props.get("value") or [])}
    return gr.Dropdown(multiselect=True, **props)


def _sampler(form: Form, item: Spec, props: dict[str, Any]) -> Any:
    return gr.Dropdown(**props)


def _seed(form: Form, item: Spec, props: dict[str, Any]) -> Any:
    """The seed, as text: seeds go up to 2^64-1 (ComfyUI writes such seeds), which a browser's number
    field would round (JavaScript numbers keep 53 bits); and the Random seed switch beside it."""
    assert isinstance(item.value, Seed)
    with gr.Row():
        form.c["seed"] = gr.Textbox(label=props["label"], value="0", max_lines=1, min_width=100,
                                    elem_id=props["elem_id"])  # fmt: skip
        form.c["random_seed"] = gr.Checkbox(label="Random seed", value=True, min_width=100,
                                            elem_id=PREFIX[form.tab] + "random-seed")  # fmt: skip
    return form.c["seed"]


def _loras(form: Form, item: Spec, props: dict[str, Any]) -> Any:
    """A checkbox per LoRA of the server's folder, and a scale slider shown for each one ticked."""
    scale = item.value.scale
    names = form.lora_names = list(form.info.loras)
    form.c["loras"] = gr.CheckboxGroup(
        names, label=props["label"], visible=bool(names), info="from the server's LoRA folder", elem_id=props["elem_id"]
    )
    form.c["scales"] = [
        gr.Slider(scale.low, scale.high, value=1.0, step=item.about.step or 0.05, label=f"{n} scale", visible=False)
        for n in names
    ]
    for name, slider in zip(names, form.c["scales"], strict=True):
        form.c["loras"].change(
            lambda chosen, n=name: gr.update(visible=n in (chosen or [])), form.c["loras"], slider,
            api_visibility="private", queue=False,
        )  # fmt: skip
    return form.c["loras"]


def _units(form: Form, item: Spec, props: dict[str, Any]) -> Any:
    """ControlNet units (ui.control_panel) or image prompts (ui.image_prompt_panel): an accordion each, or
    (`section=True`: the tab places it in a section tab of its own) a column."""
    section = bool(props.get("section"))
    if item.value.part is ImagePrompt:
        return image_prompt_panel.build(PREFIX[form.tab], list(form.info.ip_adapters), props["label"], section)
    if item.value.part is ControlUnit:
        modules = [*PREPROCESSORS, *form.info.annotators]
        return control_panel.build(PREFIX[form.tab], list(form.info.controlnets), props["label"], modules, form.detect,
                                   section)  # fmt: skip
    raise TypeError(f"no panel for {item.value.part.__name__} ({item.name})")


def _register(builder: Callable[[Form, Spec, dict[str, Any]], Any]) -> Callable[[Form, Spec, dict[str, Any]], Any]:
    """A builder that files the component it makes under its field's name."""

    def build(form: Form, item: Spec, props: dict[str, Any]) -> Any:
        component = builder(form, item, props)
        form.c[item.name] = component
        return component

    return build


_KINDS = {
    kind: _register(builder)
    for kind, builder in {
        "whole": _slider, "number": _slider, "text": _text, "prompt": _text, "choice": _choice, "flag": _flag,
        "scales": _loras, "names": _names, "units": _units,
    }.items()
}  # fmt: skip
def _dropdown(form: Form, item: Spec, props: dict[str, Any]) -> Any:
    """A text field whose values the server lists (hires fix's upscalers and sampler)."""
    return gr.Dropdown(**{**props, "value": props.get("value") or ""})


_BUILDERS = {
    "sampler": _register(_sampler), "seed": _register(_seed), "hires_upscaler": _register(_dropdown),
    "hires_sampler": _register(_dropdown), "ad_model": _register(_dropdown), "ad_model_2nd": _register(_dropdown),
}  # fmt: skip


def wire_step_cache(c: dict[str, Any]) -> None:
    """The threshold shows for the methods that have one; picking a method (not Send to Generate /
    Edit / Inpaint, which set the image's own threshold) moves it to that method's default."""
    if "step_cache" not in c:
        return
    c["step_cache"].change(
        lambda m: gr.update(visible=m in STEP_CACHE_THRESHOLDS), c["step_cache"], c["step_cache_threshold"],
        api_visibility="private", queue=False,
    )  # fmt: skip
    c["step_cache"].input(
        lambda m: gr.update(value=slider_threshold(m)),
        c["step_cache"], c["step_cache_threshold"], api_visibility="private", queue=False,
    )  # fmt: skip
