"""The Regions accordion: regional prompts' fields and a preview of the split (what each part of the prompt draws where)."""

from __future__ import annotations

from typing import Any

import gradio as gr
from PIL import Image, ImageDraw

from pipelines.schema.regions import layout, split_prompt

PREVIEW_SIDE = 160  # the preview's longer side, pixels
COLOURS = ((231, 76, 60), (52, 152, 219), (46, 204, 113), (241, 196, 15), (155, 89, 182), (230, 126, 34))
HELP = (
    "Write the regions' prompts in the prompt, in reading order, separated by **ADDCOL** (side by side), "
    "**ADDROW** (stacked) or **BREAK**; an optional base prompt before **ADDBASE** goes into every region, "
    "a common prompt before **ADDCOMM** is put in front of each. A prompt with ADDCOL/ADDROW turns this on."
)


def preview(prompt: str, ratios: str, split: str, width: int | None, height: int | None) -> tuple[Image.Image | None, str]:
    """The split drawn at the picture's aspect ratio, each region numbered with the start of its prompt."""
    first = (prompt or "").splitlines()[0] if prompt else ""
    parts = split_prompt(first)
    try:
        boxes = layout(ratios or "1,1", len(parts.regions), split or "Columns")
    except ValueError as exc:
        return None, str(exc)
    w, h = width or 64, height or 64
    scale = PREVIEW_SIDE / max(w, h)
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    image = Image.new("RGB", size, "white")
    pen = ImageDraw.Draw(image)
    for index, box in enumerate(boxes):
        rect = [box.left * size[0], box.top * size[1], box.right * size[0] - 1, box.bottom * size[1] - 1]
        pen.rectangle(rect, fill=COLOURS[index % len(COLOURS)], outline="black")
        pen.text((rect[0] + 3, rect[1] + 2), str(index + 1), fill="black")
    said = "; ".join(f"{i + 1}: {text[:40]}" for i, text in enumerate(parts.regions))
    return image, f"{len(boxes)} region(s): {said}" + (f" · base: {parts.base[:40]}" if parts.base else "")


def build(form: Any, c: dict[str, Any], section: bool = False) -> None:
    """The accordion (`section`: a column, for a section tab), its fields placed by the form (their bounds and
    labels from the schema)."""
    box = gr.Column(elem_id="regions-section") if section else gr.Accordion("Regional prompts", open=False, elem_id="regions-accordion")
    with box:
        gr.Markdown(HELP)
        form.add("regional_prompts")
        with gr.Row():
            form.add("region_split")
            form.add("region_method")
        with gr.Row():
            form.add("region_ratios")
            form.add("region_base_ratio")
        with gr.Row():
            c["region_preview"] = gr.Image(label="Split", elem_id="region-preview", height=120, interactive=False,
                                           buttons=[], show_label=True)  # fmt: skip
            c["region_said"] = gr.Markdown(elem_id="region-said")


def wire(c: dict[str, Any]) -> None:
    inputs = [c["prompt"], c["region_ratios"], c["region_split"], c["width"], c["height"]]
    for component in inputs:
        component.change(preview, inputs, [c["region_preview"], c["region_said"]], api_visibility="private", queue=False)
