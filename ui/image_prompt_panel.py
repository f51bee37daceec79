"""The Image prompt accordion of a tab: reference pictures for IP-Adapters, each with an adapter and a
scale (the fields of `pipelines.schema.image_prompt.ImagePrompt`).

Built by the form for the request's `ip_adapter` field, beside the ControlNet accordion, with the same
small protocol (`components`, `read`, `fill`). A slot with no picture, or not enabled, is left out of
the request. Slots start off, as A1111's units do; a picture dropped into a slot turns it on. Where the
model's family takes no image prompts the accordion says so and stays empty.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gradio as gr

from pipelines.schema.image_prompt import ImagePrompt

SHOWN = 2  # slots in the accordion (the API takes up to the schema's 4)


@dataclass
class PromptControls:
    enabled: Any
    image: Any
    model: Any
    scale: Any

    @property
    def settings(self) -> dict[str, Any]:
        return {"model": self.model, "scale": self.scale}


@dataclass
class ImagePromptPanel:
    """The slots' controls; `components` are an event's inputs, `read` makes the field's value of them."""

    slots: list[PromptControls]

    @property
    def components(self) -> list[Any]:
        return [c for s in self.slots for c in (s.enabled, s.image, s.model, s.scale)]

    def fill(self, prompts: list[dict[str, Any]]) -> dict[Any, Any]:
        """Updates that set each slot to `prompts`' settings (a PNG's: no picture) and enable it."""
        out: dict[Any, Any] = {}
        for controls, settings in zip(self.slots, prompts, strict=False):
            out[controls.enabled] = gr.update(value=True)
            out.update({controls.settings[k]: gr.update(value=v) for k, v in settings.items() if k in controls.settings})
        return out

    def read(self, v: dict[Any, Any]) -> list[dict[str, Any]]:
        return [
            {"image": v[s.image], "model": v[s.model], "scale": v[s.scale]}
            for s in self.slots
            if v[s.enabled] and v[s.image] is not None
        ]


def build(prefix: str, models: list[str], label: str, section: bool = False) -> ImagePromptPanel:
    """The accordion (`section`: a column, for a section tab), in the tab's layout where the form places the field."""
    scale = ImagePrompt.model_fields["scale"]
    bounds = scale.metadata[0]
    slots = []
    box = gr.Column(elem_id=f"{prefix}ip-adapter") if section else gr.Accordion(label, open=False, elem_id=f"{prefix}ip-adapter")
    with box:
        if not models:
            gr.Markdown("This model's family takes no image prompts (IP-Adapter: SD 1.x/2.x and SDXL).")
        with gr.Row():
            for i in range(SHOWN):
                eid = f"{prefix}ip-adapter-{i}-"
                with gr.Column(visible=bool(models)):
                    enabled = gr.Checkbox(label=f"Image prompt {i}", value=False, elem_id=eid + "enabled")  # a drop turns it on
                    image = gr.Image(label="Reference image", type="pil", image_mode="RGB",
                                     sources=["upload", "clipboard"], elem_id=eid + "image", height=200)  # fmt: skip
                    model = gr.Dropdown(models, value=models[0] if models else None, label="Adapter", elem_id=eid + "model")
                    weight = gr.Slider(bounds.low, bounds.high, value=scale.default, step=0.05, label="Weight",
                                       elem_id=eid + "scale")  # fmt: skip
                image.upload(lambda: True, None, enabled, api_visibility="private", queue=False)
                slots.append(PromptControls(enabled, image, model, weight))
    return ImagePromptPanel(slots)
