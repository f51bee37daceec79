"""The PNG info tab: drop a PNG from this app, A1111/Forge or ComfyUI, read its parameters, reuse them."""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines.pnginfo import read_png_info
from ui.history import params_markdown
from ui.send import form_values, generate_targets, generate_updates, model_for
from ui.studio import Studio

# The Edit tab's fields "Send to Edit" fills, in the order of its outputs.
EDIT_FIELDS = (
    "prompt", "seed", "random_seed", "steps", "guidance_scale", "guidance_end", "sampler", "image_guidance_scale",
    "strength",
)  # fmt: skip


def build(studio: Studio, g: dict[str, Any], e: dict[str, Any], tabs: gr.Tabs) -> None:
    upload = gr.File(label="Drop a PNG", file_types=[".png"], type="filepath", height=120, elem_id="pnginfo-file")
    details = gr.Markdown(elem_id="pnginfo-details")
    raw = gr.Textbox(label="Raw text", lines=4, max_lines=12, buttons=["copy"])
    with gr.Row():
        to_generate = gr.Button("Send to Generate", size="sm", elem_id="pnginfo-send")
        to_edit = gr.Button("Send to Edit", size="sm")
    params = gr.State(None)

    def read(path: str | None):
        if not path:
            return "", "", None
        try:
            info = read_png_info(path)
        except (ValueError, OSError) as exc:
            return f"⚠️ {exc}", "", None
        _, notes = form_values(info["parameters"], model_for(info["parameters"], studio.info))
        return params_markdown(info, notes), info["raw"], info["parameters"]

    def need(p: dict | None) -> dict:
        if not p:
            raise gr.Error("drop a PNG with generation parameters first", print_exception=False)
        return p

    def send_generate(p: dict | None):
        return [*generate_updates(need(p), studio.info, g["scales"]), gr.Tabs(selected="generate")]

    def send_edit(p: dict | None):
        values, _ = form_values(need(p), studio.info.for_edits)  # fitted to the model that edits
        return [gr.update(value=values[k]) for k in EDIT_FIELDS] + [gr.Tabs(selected="edit")]

    events = dict(api_visibility="private", queue=False)
    upload.change(read, upload, [details, raw, params], **events)
    to_generate.click(send_generate, params, [*generate_targets(g), tabs], **events)
    edit_targets = [*(e[k] for k in EDIT_FIELDS), tabs]
    to_edit.click(send_edit, params, edit_targets, **events)
