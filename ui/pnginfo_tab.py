"""The PNG info tab: drop an image (PNG, JPEG, WEBP) from this app, A1111/Forge/SD.Next, ComfyUI,
SwarmUI, Fooocus, InvokeAI, NovelAI or Stability Matrix, read its parameters, reuse them.

Whatever the file, the tab shows what could be read and notes on the rest, never a bare "Error"."""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines import read_png_info
from ui.history import params_markdown, table_cell
from ui.send import edit_updates, form_values, generate_updates, inpaint_targets, inpaint_updates, model_for, targets
from ui.studio import Studio


def build(studio: Studio, g: dict[str, Any], e: dict[str, Any], i: dict[str, Any], tabs: gr.Tabs) -> None:
    upload = gr.File(
        label="Drop an image (PNG, JPEG, WEBP) or a clip (MP4, animated WebP, GIF, PNG frames zip)",
        file_types=[".png", ".jpg", ".jpeg", ".webp", ".mp4", ".gif", ".zip"], type="filepath",
        height=120, elem_id="pnginfo-file",
    )  # fmt: skip
    details = gr.Markdown(elem_id="pnginfo-details")
    raw = gr.Textbox(label="Raw text", lines=4, max_lines=12, buttons=["copy"])
    with gr.Row():
        to_generate = gr.Button("Send to Generate", size="sm", elem_id="pnginfo-send")
        to_edit = gr.Button("Send to Edit", size="sm")
        to_inpaint = gr.Button("Send to Inpaint", size="sm", elem_id="pnginfo-send-inpaint")
    params = gr.State(None)

    def read(path: str | None):
        if not path:
            return "", "", None
        try:
            info = read_png_info(path)
        except (ValueError, OSError) as exc:
            return f"⚠️ {table_cell(str(exc))}", "", None
        try:
            _, notes = form_values(info["parameters"], model_for(info["parameters"], studio.info))
        except Exception as exc:  # a value no form takes: the table still shows what was read
            notes = [f"these values cannot fill the form ({type(exc).__name__}: {exc})"]
        return params_markdown(info, notes), info["raw"], info["parameters"] or None

    def need(p: dict | None) -> dict:
        if not p:
            raise gr.Error("drop a PNG with generation parameters first", print_exception=False)
        return p

    def send_generate(p: dict | None):
        return {**generate_updates(need(p), studio.info, g["form"]), tabs: gr.Tabs(selected="generate")}

    def send_edit(p: dict | None):
        return {**edit_updates(need(p), studio.info, e["form"]), tabs: gr.Tabs(selected="edit")}

    def send_inpaint(p: dict | None, path: str | None):
        return {**inpaint_updates(need(p), studio.info, path, i["form"]), tabs: gr.Tabs(selected="inpaint")}

    events = dict(api_visibility="private", queue=False)
    upload.change(read, upload, [details, raw, params], **events)
    to_generate.click(send_generate, params, [*targets(g["form"]), tabs], **events)
    to_edit.click(send_edit, params, [*targets(e["form"]), tabs], **events)
    to_inpaint.click(send_inpaint, [params, upload], [*inpaint_targets(i["form"]), tabs], **events)
