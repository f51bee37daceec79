"""The Edit tab: many input images x one instruction/prompt; results paired with their inputs."""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines import ModelInfo
from ui import plot_panel
from ui.form import Form, wire_step_cache
from ui.studio import Studio
from ui.text import info_line, vocabulary_markdown


def mode_text(info: ModelInfo) -> str:
    """What the Edit tab does with the model that serves edits (`ModelInfo.for_edits`)."""
    if info.edit:
        return f"**Instruction editing** with {info.model_name}: describe the change"
    if info.image_to_image:
        return f"**Image-to-image** with {info.model_name}: the prompt describes the result"
    return (f"**{info.model_name} ({info.pipeline_class}) does text-to-image only**: diffusers has no "
            "image-to-image pipeline for it, so it cannot edit")  # fmt: skip


def updates(info: ModelInfo, e: dict[str, Any]) -> dict[Any, Any]:
    """What changes in this tab when another model is loaded."""
    plot = plot_panel.updates(info, e, "edit")
    info = info.for_edits
    out = {**e["form"].updates(info), **plot}
    out[e["mode"]] = gr.update(value=mode_text(info))
    out[e["run"]] = gr.update(interactive=info.edit or info.image_to_image)
    text = vocabulary_text(info)
    out[e["vocabulary"]] = gr.update(value=text, visible=bool(text))
    out[e["prompt"]] = gr.update(placeholder=placeholder(info))
    return out


def vocabulary_text(info: ModelInfo) -> str:
    """An instruction editor's patterns and words (text-to-image vocabularies belong to Generate)."""
    return vocabulary_markdown(info.vocabulary) if info.edit else ""


def placeholder(info: ModelInfo) -> str:
    examples = info.vocabulary.get("examples") or info.examples or ("",)
    return str(examples[0])


def build(studio: Studio) -> dict[str, Any]:
    info = studio.info.for_edits
    vocabulary = vocabulary_text(info)
    c: dict[str, Any] = {}
    form = c["form"] = Form("edit", info, c, studio.engine.detect)
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=340):
            c["files"] = gr.File(
                label="Input images", file_count="multiple", file_types=["image"], height=140, elem_id="edit-files"
            )
            form.add("prompt", label="Instruction / prompt", lines=2, placeholder=placeholder(info))
            c["mode"] = gr.Markdown(mode_text(info), elem_id="edit-mode")
            c["vocabulary"] = gr.Markdown(vocabulary, elem_id="edit-vocabulary", visible=bool(vocabulary))
            form.add("strength", info="how much of each input is re-drawn")
            form.add("image_guidance_scale", info="how closely the result keeps the input image")
            form.add("num_images", label="Images per input")
            form.add("seed")
            with gr.Accordion("Advanced", open=False):
                for name in ("sampler", "steps", "guidance_scale", "guidance_end", "step_cache", "step_cache_threshold"):
                    form.add(name)
                form.add_rest()  # the negative prompt, the LoRAs, and any field new to the schema
            with gr.Row():
                c["run"] = gr.Button(
                    "Edit", variant="primary", elem_id="edit-btn", interactive=info.edit or info.image_to_image
                )
                c["stop"] = gr.Button("Stop", variant="stop")
            plot_panel.build(studio, c, "edit")
        with gr.Column(scale=1, min_width=340):
            c["gallery"] = gr.Gallery(
                label="Inputs and results", elem_id="edit-gallery", columns=4, height=430, format="png",
                buttons=["download", "fullscreen"],
            )  # fmt: skip
            c["info"] = gr.Markdown(elem_id="edit-info")
            plot_panel.results(c, "edit")
            c["downloads"] = gr.File(label="PNG downloads", file_count="multiple", height=80, interactive=False,
                                     elem_id="edit-downloads")  # an output: no upload zone  # fmt: skip
            with gr.Row():
                c["send_inpaint"] = gr.Button("Send to Inpaint", size="sm", elem_id="edit-send-inpaint")
                c["send_controlnet"] = gr.Button("Send to ControlNet", size="sm", elem_id="edit-send-controlnet")
                c["send_video"] = gr.Button("Send to Video", size="sm", elem_id="edit-send-video")
                c["send_upscale"] = gr.Button("Send to Upscale", size="sm", elem_id="edit-send-upscale")
    return c


def wire(studio: Studio, e: dict[str, Any]) -> None:
    """The Edit button (the public `/edit` is `ui.api`'s: the same handler, raw values by name)."""
    form: Form = e["form"]

    def ui_edit(v: dict, request: gr.Request, progress=gr.Progress()):
        yield from answers(studio.edit(form.read(v), v[e["files"]], request, progress))

    wire_step_cache(e)
    plot_panel.wire(studio, e, "edit")
    e["run"].click(
        ui_edit,
        {e["files"], *form.inputs},
        [e["gallery"], e["info"], e["downloads"]],
        api_visibility="private",
        concurrency_id="generate",
        concurrency_limit=None,  # the engine admits and queues (ui.demo)
    )


def answers(events):
    """The tab's outputs for an edit's events: previews while it denoises, then inputs and results paired."""
    for kind, value in events:
        if kind == "preview":  # the results forming
            yield [(im, "preview") for im in value], gr.skip(), gr.skip()
        elif kind == "done":
            pairs, result, paths = value
            yield pairs, info_line(result), paths
