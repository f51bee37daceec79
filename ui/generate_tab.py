"""The Generate tab: prompt(s), settings within the model's limits, gallery, downloads; and its events."""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines import ModelInfo
from ui import detailer_panel, plot_panel, regions_panel
from ui.form import Form, wire_step_cache
from ui.studio import Studio
from ui.text import embeddings_markdown, info_line, vocabulary_markdown


def unavailable_text(info: ModelInfo) -> str:
    return (
        f"**{info.model_name} is an image-editing model** ({info.pipeline_class}): it needs an input "
        "image and cannot generate from a prompt alone. Use the **Edit** tab."
    )


def updates(info: ModelInfo, g: dict[str, Any]) -> dict[Any, Any]:
    """What changes in this tab when another model is loaded."""
    out = {**g["form"].updates(info), **plot_panel.updates(info, g, "generate")}
    out[g["run"]] = gr.update(interactive=info.text_to_image)
    out[g["unavailable"]] = gr.update(value=unavailable_text(info), visible=not info.text_to_image)
    text = vocabulary_markdown(info.vocabulary)
    out[g["vocabulary"]] = gr.update(value=text, visible=bool(text))
    embeddings = embeddings_markdown(info)
    out[g["embeddings"]] = gr.update(value=embeddings, visible=bool(embeddings))
    out[g["tokens"]] = gr.update(value="")
    out[g["wildcards_list"]] = gr.update(samples=[[f"__{n}__"] for n in info.wildcards], visible=bool(info.wildcards))
    return out


def _buttons(info: ModelInfo, c: dict[str, Any]) -> None:
    c["unavailable"] = gr.Markdown(unavailable_text(info), elem_id="generate-unavailable", visible=not info.text_to_image)
    with gr.Row():
        c["run"] = gr.Button("Generate", variant="primary", elem_id="generate-btn", interactive=info.text_to_image)
        c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop-btn")


def build(studio: Studio) -> dict[str, Any]:
    """Two columns of equal width, the settings one (the prompt, the sampling settings always shown, the
    buttons) and the image one (the gallery, the X/Y/Z grid, the downloads); under both, the optional parts
    as section tabs, one shown at a time (`_sections`), instead of a stack of accordions."""
    info = studio.info
    c: dict[str, Any] = {}
    form = c["form"] = Form("generate", info, c, studio.engine.detect)
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=340, elem_id="generate-settings"):
            _settings(studio, form, c)
        with gr.Column(scale=1, min_width=340):
            _images(c)
    _sections(studio, form, c)
    examples = list(info.examples) or EXAMPLES
    gr.Examples([[e] for e in examples], inputs=[c["prompt"]], label="Examples")
    return c


EXAMPLES = ["an astronaut riding a horse, photograph", "a watercolor fox in the snow"]


def _settings(studio: Studio, form: Form, c: dict[str, Any]) -> None:
    info = studio.info
    form.add("prompt", lines=2, placeholder=(list(info.examples) or EXAMPLES)[0], info="one prompt per line")
    c["tokens"] = gr.Markdown(elem_id="token-count", visible=studio.counts_tokens)
    vocabulary = vocabulary_markdown(info.vocabulary)
    c["vocabulary"] = gr.Markdown(vocabulary, elem_id="vocabulary", visible=bool(vocabulary))
    embeddings = embeddings_markdown(info)
    c["embeddings"] = gr.Markdown(embeddings, elem_id="embeddings", visible=bool(embeddings))
    detailer_panel.wildcard_chips(info.wildcards, c)
    form.add("negative_prompt")
    with gr.Row():
        form.add("sampler")
        form.add("steps")
    with gr.Row():
        form.add("width")
        form.add("height")
    form.add("guidance_scale")
    with gr.Row():
        form.add("num_images")
        form.add("guidance_end")  # shown for the models that have it
    form.add("seed")
    _buttons(info, c)


def _images(c: dict[str, Any]) -> None:
    c["gallery"] = gr.Gallery(
        label="Images", elem_id="gallery", columns=4, height=430, format="png",
        object_fit="contain", buttons=["download", "fullscreen"],
    )  # fmt: skip
    c["info"] = gr.Markdown(elem_id="info-line")
    plot_panel.results(c, "generate")
    c["downloads"] = gr.File(label="PNG downloads (with metadata)", file_count="multiple", height=80,
                             interactive=False, elem_id="generate-downloads")  # an output: no upload zone  # fmt: skip
    c["info_json"] = gr.JSON(visible=False)
    with gr.Row():
        c["send_inpaint"] = gr.Button("Send to Inpaint", size="sm", elem_id="generate-send-inpaint")
        c["send_controlnet"] = gr.Button("Send to ControlNet", size="sm", elem_id="generate-send-controlnet")
        c["send_video"] = gr.Button("Send to Video", size="sm", elem_id="generate-send-video")
        c["send_upscale"] = gr.Button("Send to Upscale", size="sm", elem_id="generate-send-upscale")


def _sections(studio: Studio, form: Form, c: dict[str, Any]) -> None:
    """The optional parts, a section tab each (A1111 stacks them as accordions: 7,000 px with all open)."""
    with gr.Tabs(elem_id="generate-sections") as sections:
        with gr.Tab("Hires. fix", id="hires"):
            _hires(form)
        with gr.Tab("ControlNet", id="controlnet"):
            form.add("controlnet", section=True).in_section(sections, "controlnet")
        with gr.Tab("Image prompt", id="ip-adapter"):
            form.add("ip_adapter", section=True)
        with gr.Tab("Regional prompts", id="regions"):
            regions_panel.build(form, c, section=True)
        with gr.Tab("Detailer", id="detailer"):
            detailer_panel.build(form, section=True)
        with gr.Tab("Advanced", id="advanced"):  # after the others: what they did not place lands here
            form.add("step_cache")
            form.add("step_cache_threshold", info="higher skips more steps (faster, further from the uncached image)")
            form.add_rest()  # the LoRAs, guidance rescale, clip skip, and any field new to the schema
        with gr.Tab("Scripts", id="scripts"):
            plot_panel.build(studio, c, "generate", section=True)


def _hires(form: Form) -> None:
    form.add("hires_fix")
    with gr.Row():
        form.add("hires_upscaler")
        form.add("hires_scale")
    with gr.Row():
        form.add("hires_steps")
        form.add("hires_strength")
    with gr.Row():
        form.add("hires_width")
        form.add("hires_height")
    form.add("hires_sampler")
    form.add("hires_prompt", placeholder="empty: the first pass's prompt")
    form.add("hires_negative_prompt", placeholder="empty: the first pass's negative prompt")


def wire(studio: Studio, g: dict[str, Any]) -> None:
    """Generate button: `v` maps each input component to its value (read back by field name)."""
    form: Form = g["form"]

    def ui_generate(v: dict, request: gr.Request, progress=gr.Progress()):
        for kind, value in studio.generate_live(form.read(v), request, progress):
            if kind == "preview":  # the batch forming, every PREVIEW_EVERY steps
                yield [(im, "preview") for im in value], gr.skip(), gr.skip(), gr.skip()
            elif kind == "done":
                gallery, result, paths = value
                yield gallery, info_line(result), paths, result.info()

    wire_step_cache(g)
    regions_panel.wire(g)
    detailer_panel.wire_chips(g)
    plot_panel.wire(studio, g, "generate")
    if studio.counts_tokens:
        g["prompt"].change(studio.token_count, g["prompt"], g["tokens"], api_visibility="private", queue=False)
    g["run"].click(
        ui_generate,
        set(form.inputs),
        [g["gallery"], g["info"], g["downloads"], g["info_json"]],
        show_progress_on=[g["info"]],  # the gallery stays visible: it shows the live previews
        api_visibility="private",
        concurrency_id="generate",
        concurrency_limit=None,  # the engine admits and queues (ui.demo)
    )
