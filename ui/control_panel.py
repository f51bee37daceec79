"""The ControlNet accordion of a tab: units as tabs, each an image, its preprocessor and preview, a model,
weight, start/end, control and resize modes (the fields of `pipelines.control.controlnet.ControlUnit`).

Built by the form for the request's `controlnet` field (a list of units), so every tab of a task that
takes units has it. A unit with no image, or not enabled, is left out of the request. Units start off, as
A1111's do; a picture dropped into a unit (or sent to it) turns it on. "Preview map"
runs the preprocessor through the engine (`Engine.detect`: the model-based ones by its annotators)
and shows what the ControlNet will see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gradio as gr

from pipelines import detect
from pipelines.schema.control import CONTROL_MODES, CONTROL_TYPES, RESIZE_MODES, ControlUnit, PreprocessorError, resolve

UNITS_SHOWN = 2  # tabs in the accordion (the API takes up to the schema's 8)


@dataclass
class UnitControls:
    enabled: Any
    image: Any
    preview: Any
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def components(self) -> list[Any]:
        return [self.enabled, self.image, *self.settings.values()]


@dataclass
class ControlPanel:
    """The units' controls; `components` are an event's inputs, `read` makes the field's value of them."""

    units: list[UnitControls]
    accordion: Any  # what shows the units: their accordion, or the Tabs of the section tab holding them
    tabs: Any
    modules: list[str]  # the preprocessors offered (built-in, and the annotators installed)
    section: str | None = None  # the id of that section tab, where `accordion` is a Tabs (`in_section`)

    def in_section(self, tabs: Any, section: str) -> None:
        """The units sit in the section tab `section` of `tabs`: Send to ControlNet selects it."""
        self.accordion, self.section = tabs, section

    @property
    def components(self) -> list[Any]:
        return [c for unit in self.units for c in unit.components]

    @property
    def images(self) -> list[Any]:
        """The units' control images (what `receive` reads to find a free unit)."""
        return [unit.image for unit in self.units]

    @property
    def receivers(self) -> list[Any]:
        """Every component `receive` sets (an event's outputs)."""
        return [*self.images, *(unit.enabled for unit in self.units), self.accordion, self.tabs]

    def receive(self, picture: str, images: list[Any]) -> dict[Any, Any]:
        """Send to ControlNet: `picture` becomes the control image of the first unit without one (unit 0
        when every unit has one), enabled, its tab shown and the accordion open. The unit's other
        settings stay (a user who set canny keeps canny); its preview follows from the image's change."""
        index = next((n for n, image in enumerate(images) if image is None), 0)
        unit = self.units[index]
        return {
            unit.image: gr.update(value=picture),
            unit.enabled: gr.update(value=True),
            self.accordion: gr.Tabs(selected=self.section) if self.section else gr.Accordion(open=True),
            self.tabs: gr.Tabs(selected=index),
        }

    def fill(self, units: list[dict[str, Any]]) -> dict[Any, Any]:
        """Updates that set each shown unit to `units`' settings (a PNG's: no image) and enable it."""
        out: dict[Any, Any] = {}
        for controls, settings in zip(self.units, units, strict=False):
            out[controls.enabled] = gr.update(value=True)
            settings = {**settings, "module": self._offered(settings.get("module"))}
            out.update({controls.settings[k]: gr.update(value=v) for k, v in settings.items() if k in controls.settings and v is not None})
        return out

    def _offered(self, module: str | None) -> str | None:
        """A PNG's preprocessor as the dropdown names it (A1111's "depth_midas" is our "depth"); None
        (the form keeps its own) for one this server does not offer."""
        try:
            name = resolve(module).name if module else None
        except PreprocessorError:
            return None
        return name if name in self.modules else None

    def read(self, v: dict[Any, Any]) -> list[dict[str, Any]]:
        out = []
        for unit in self.units:
            if not v[unit.enabled] or v[unit.image] is None:
                continue
            values = {name: v[c] for name, c in unit.settings.items()}
            pre = resolve(values["module"])  # a threshold is recorded only where the preprocessor has it
            values["threshold_a"] = values["threshold_a"] if pre.threshold_a else None
            values["threshold_b"] = values["threshold_b"] if pre.threshold_b else None
            out.append({"image": v[unit.image], **values})
        return out


def _thresholds(module: str) -> tuple[Any, Any]:
    """The sliders at the preprocessor's own defaults (canny 100/200, scribble 127, tile 4), labelled by it."""
    pre = resolve(module)
    slider_a, slider_b = pre.threshold_a, pre.threshold_b
    return tuple(gr.update(value=s[1], label=s[0]) if s else gr.update(label="(not used)") for s in (slider_a, slider_b))


def previewer(maker: Callable[..., Any]) -> Callable[..., Any]:
    """The Preview map handler: the map `maker` (Engine.detect) makes of a unit's image (at its
    resolution; 0: the image's own); a refusal (a model not installed) shown as the error it is."""

    def preview(image: Any, module: str, a: float, b: float, res: int) -> Any:
        if image is None:
            return None
        try:  # a preprocessor without thresholds ignores them
            return maker(image, module, res or None, a, b)
        except PreprocessorError as exc:
            raise gr.Error(str(exc), print_exception=False) from None

    return preview


def build(prefix: str, models: list[str], label: str, modules: list[str], maker: Callable[..., Any] | None = None,
          section: bool = False) -> ControlPanel:  # fmt: skip
    """The accordion (`section`: a column, for a section tab), in the tab's layout where the form places the
    field. `modules`: the preprocessors offered (the built-in ones and the annotators installed); `maker`: what
    makes previews (built-in maps only when None)."""
    fields = ControlUnit.model_fields
    units = []
    preview = previewer(maker or detect)
    box = gr.Column(elem_id=f"{prefix}controlnet") if section else gr.Accordion(label, open=False, elem_id=f"{prefix}controlnet")
    with box as accordion, gr.Tabs() as tabs:
        for i in range(UNITS_SHOWN):
            with gr.Tab(f"Unit {i}", id=i):
                units.append(_unit(f"{prefix}controlnet-{i}-", models, modules, fields, preview))
    return ControlPanel(units, accordion, tabs, modules)


def _unit(eid: str, models: list[str], modules: list[str], fields: dict[str, Any], preview: Callable[..., Any]) -> UnitControls:
    def d(name: str) -> Any:
        return fields[name].default

    with gr.Row():
        enabled = gr.Checkbox(label="Enable", value=False, elem_id=eid + "enabled")  # off, as A1111's; a drop turns it on
    with gr.Row():
        image = gr.Image(label="Control image", type="pil", image_mode="RGB", sources=["upload", "clipboard"],
                         elem_id=eid + "image", height=200)  # fmt: skip
        shown = gr.Image(label="Map preview", type="pil", interactive=False, elem_id=eid + "preview", height=200)
    s: dict[str, Any] = {}
    with gr.Row():
        s["module"] = gr.Dropdown(modules, value=d("module"), label="Preprocessor", elem_id=eid + "module")
        s["model"] = gr.Dropdown(models, value=models[0] if models else None, label="Model", elem_id=eid + "model")
        s["control_type"] = gr.Dropdown(list(CONTROL_TYPES), value=d("control_type"), label="Control type (union models)",
                                        elem_id=eid + "control-type")  # fmt: skip
    with gr.Row():
        s["threshold_a"] = gr.Slider(0, 255, value=100, step=1, label="Threshold A", elem_id=eid + "threshold-a")
        s["threshold_b"] = gr.Slider(0, 255, value=200, step=1, label="Threshold B", elem_id=eid + "threshold-b")
        s["processor_res"] = gr.Slider(0, 2048, value=d("processor_res"), step=8, label="Preprocessor resolution (0: the output's)")
    with gr.Row():
        s["weight"] = gr.Slider(0, 2, value=d("weight"), step=0.05, label="Control weight", elem_id=eid + "weight")
        s["guidance_start"] = gr.Slider(0, 1, value=d("guidance_start"), step=0.01, label="Starting control step")
        s["guidance_end"] = gr.Slider(0, 1, value=d("guidance_end"), step=0.01, label="Ending control step")
    s["control_mode"] = gr.Radio(list(CONTROL_MODES), value=d("control_mode"), label="Control mode")
    s["resize_mode"] = gr.Radio(list(RESIZE_MODES), value=d("resize_mode"), label="Resize mode")
    # .input, not .change: Send to Generate sets the module and the PNG's thresholds together
    s["module"].input(_thresholds, s["module"], [s["threshold_a"], s["threshold_b"]], api_visibility="private", queue=False)
    button = gr.Button("Preview map", size="sm", elem_id=eid + "preview-button")
    inputs = [image, s["module"], s["threshold_a"], s["threshold_b"], s["processor_res"]]
    button.click(preview, inputs, shown, api_visibility="private", queue=False)
    image.change(preview, inputs, shown, api_visibility="private", queue=False)
    image.upload(lambda: True, None, enabled, api_visibility="private", queue=False)
    return UnitControls(enabled, image, shown, s)
