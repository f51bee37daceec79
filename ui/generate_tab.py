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
    out = g["form"].updates(info)
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
    info = studio.info
    examples = list(info.examples) or ["an astronaut riding a horse, photograph", "a watercolor fox in the snow"]
    c: dict[str, Any] = {}
    form = c["form"] = Form("generate", info, c, studio.engine.detect)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            form.add("prompt", lines=2, placeholder=examples[0], info="one prompt per line")
            c["tokens"] = gr.Markdown(elem_id="token-count", visible=studio.counts_tokens)
            vocabulary = vocabulary_markdown(info.vocabulary)
            c["vocabulary"] = gr.Markdown(vocabulary, elem_id="vocabulary", visible=bool(vocabulary))
            embeddings = embeddings_markdown(info)
            c["embeddings"] = gr.Markdown(embeddings, elem_id="embeddings", visible=bool(embeddings))
            detailer_panel.wildcard_chips(info.wildcards, c)
            form.add("negative_prompt")
            form.add("num_images")
            form.add("seed")
            _buttons(info, c)
            with gr.Accordion("Hires. fix", open=False, elem_id="hires-accordion"):
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
            regions_panel.build(form, c)
            detailer_panel.build(form)
            form.add("controlnet")  # its own accordion (ui.control_panel)
            form.add("ip_adapter")  # its own accordion (ui.image_prompt_panel)
            with gr.Accordion("Advanced", open=False):
                for name in ("sampler", "steps", "guidance_scale", "guidance_end", "width", "height"):
                    form.add(name)
                form.add("step_cache")
                form.add("step_cache_threshold", info="higher skips more steps (faster, further from the uncached image)")
                form.add_rest()  # the LoRAs, and any field new to the schema
            plot_panel.build(studio, c, "generate")
        with gr.Column(scale=3, min_width=360):
            c["gallery"] = gr.Gallery(
                label="Images", elem_id="gallery", columns=4, height=430, format="png",
                object_fit="contain", buttons=["download", "fullscreen"],
            )  # fmt: skip
            c["info"] = gr.Markdown(elem_id="info-line")
            c["downloads"] = gr.File(label="PNG downloads (with metadata)", file_count="multiple", height=80)
            c["info_json"] = gr.JSON(visible=False)
            with gr.Row():
                c["send_inpaint"] = gr.Button("Send to Inpaint", size="sm", elem_id="generate-send-inpaint")
                c["send_controlnet"] = gr.Button("Send to ControlNet", size="sm", elem_id="generate-send-controlnet")
                c["send_video"] = gr.Button("Send to Video", size="sm", elem_id="generate-send-video")
    gr.Examples([[e] for e in examples], inputs=[c["prompt"]], label="Examples")
    return c


def wire(studio: Studio, g: dict[str, Any]) -> None:
    """Generate button: `v` maps each input component to its value (read back by field name)."""
    form: Form = g["form"]

    def ui_generate(v: dict, request: gr.Request, progress=gr.Progress()):
        for kind, value in studio.generate_live(form.read(v), request, progress):
            if kind == "preview":  # the batch forming, every PREVIEW_EVERY steps
                yield [(im, "preview") for im in value], gr.skip(), gr.skip(), gr.skip()
            else:
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
