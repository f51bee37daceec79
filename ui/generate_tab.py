"""The Generate tab: prompt(s), settings within the model's limits, gallery, downloads; and its events."""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines.backend import ModelInfo
from pipelines.step_cache import DEFAULT_THRESHOLDS, FAMILIES, METHODS
from ui import fields
from ui.inputs import SLIDER_THRESHOLD_MIN, bounds, slider_threshold
from ui.studio import Studio
from ui.text import info_line, vocabulary_markdown


def sampling_props(info: ModelInfo) -> dict[str, dict[str, Any]]:
    """The model-dependent properties of the sampling controls: used to build them and to update
    them after a model switch (one place, so both always agree with the server's limits)."""
    step = info.size_multiple
    return {
        "sampler": {"choices": list(info.samplers), "value": info.scheduler},
        "steps": {"value": info.default_steps},
        "guidance_scale": {"value": info.default_guidance, "info": info.guidance_label},
        "guidance_end": {"value": info.default_guidance_end, "visible": info.guidance_end},
        "width": {"minimum": step, "maximum": info.max_side, "value": info.default_width, "step": step},
        "height": {"minimum": step, "maximum": info.max_side, "value": info.default_height, "step": step},
    }


def sampling_controls(info: ModelInfo, prefix: str = "") -> dict[str, Any]:
    """Steps, guidance and size with the model's defaults and exactly the limits the server enforces."""
    p = sampling_props(info)
    return {
        "sampler": gr.Dropdown(**p["sampler"], label="Sampler", elem_id=f"{prefix}sampler"),
        "steps": gr.Slider(*bounds("steps"), **p["steps"], step=1, label="Steps", elem_id=f"{prefix}steps"),
        "guidance_scale": gr.Slider(
            *bounds("guidance_scale"),
            **p["guidance_scale"],
            step=0.5,
            label="Guidance (CFG)",
            elem_id=f"{prefix}guidance",
        ),
        "guidance_end": gr.Slider(
            *bounds("guidance_end"),
            **p["guidance_end"],
            step=0.01,
            label="Guidance end",
            elem_id=f"{prefix}guidance-end",
            info="share of the steps with guidance; the last ones run unguided (1 = every step)",
        ),
        "width": gr.Slider(**p["width"], label="Width"),
        "height": gr.Slider(**p["height"], label="Height"),
    }


def step_cache_props(info: ModelInfo) -> dict[str, dict[str, Any]]:
    """The step cache's choice and threshold for this model: disabled, with the reason, where it has none."""
    method = info.default_step_cache
    threshold = max(
        SLIDER_THRESHOLD_MIN,
        info.default_step_cache_threshold or slider_threshold(method),
    )
    why = (
        "reuses work between steps: faster, slightly different images"
        if info.step_cache
        else f"not available: {info.pipeline_class} has no step cache in diffusers. Families with one: {FAMILIES}"
    )
    return {
        "step_cache": {"value": method, "interactive": info.step_cache, "info": why},
        "step_cache_threshold": {"value": threshold, "visible": method in DEFAULT_THRESHOLDS},
    }


def step_cache_controls(info: ModelInfo, prefix: str = "") -> dict[str, Any]:
    """The step cache (pipelines.step_cache): a method, and a threshold for the methods that have one."""
    p = step_cache_props(info)
    return {
        "step_cache": gr.Dropdown(list(METHODS), **p["step_cache"], label="Step cache", elem_id=f"{prefix}step-cache"),
        "step_cache_threshold": gr.Slider(
            SLIDER_THRESHOLD_MIN, bounds("step_cache_threshold")[1], **p["step_cache_threshold"], step=0.01,
            label="Step cache threshold", elem_id=f"{prefix}step-cache-threshold",
            info="higher skips more steps (faster, further from the uncached image)",
        ),
    }  # fmt: skip


def wire_step_cache(c: dict[str, Any]) -> None:
    """The threshold shows for the methods that have one; picking a method (not Send to Generate /
    Edit / Inpaint, which set the image's own threshold) moves it to that method's default."""
    c["step_cache"].change(
        lambda m: gr.update(visible=m in DEFAULT_THRESHOLDS), c["step_cache"], c["step_cache_threshold"],
        api_visibility="private", queue=False,
    )  # fmt: skip
    c["step_cache"].input(
        lambda m: gr.update(value=slider_threshold(m)),
        c["step_cache"], c["step_cache_threshold"], api_visibility="private", queue=False,
    )  # fmt: skip


def seed_box(**props: Any) -> gr.Textbox:
    """The seed, as text: seeds go up to 2^64-1 (ComfyUI writes such seeds), which a browser's number
    field would round (JavaScript numbers keep 53 bits)."""
    return gr.Textbox(label="Seed", value="0", max_lines=1, min_width=100, **props)


def unavailable_text(info: ModelInfo) -> str:
    return (
        f"**{info.model_name} is an image-editing model** ({info.pipeline_class}): it needs an input "
        "image and cannot generate from a prompt alone. Use the **Edit** tab."
    )


def updates(info: ModelInfo, g: dict[str, Any]) -> dict[Any, Any]:
    """What changes in this tab when another model is loaded."""
    out = {g[name]: gr.update(**props) for name, props in sampling_props(info).items()}
    out.update({g[name]: gr.update(**props) for name, props in step_cache_props(info).items()})
    out[g["run"]] = gr.update(interactive=info.text_to_image)
    out[g["unavailable"]] = gr.update(value=unavailable_text(info), visible=not info.text_to_image)
    text = vocabulary_markdown(info.vocabulary)
    out[g["vocabulary"]] = gr.update(value=text, visible=bool(text))
    out[g["tokens"]] = gr.update(value="")
    return out


def build(studio: Studio) -> dict[str, Any]:
    info = studio.info
    examples = list(info.examples) or ["an astronaut riding a horse, photograph", "a watercolor fox in the snow"]
    c: dict[str, Any] = {}
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            c["prompt"] = gr.Textbox(
                label="Prompt", lines=2, elem_id="prompt", placeholder=examples[0], info="one prompt per line"
            )
            c["tokens"] = gr.Markdown(elem_id="token-count", visible=studio.counts_tokens)
            c["vocabulary"] = gr.Markdown(
                vocabulary_markdown(info.vocabulary),
                elem_id="vocabulary",
                visible=bool(vocabulary_markdown(info.vocabulary)),
            )
            c["negative_prompt"] = gr.Textbox(value="", label="Negative prompt", lines=1)
            c["num_images"] = gr.Slider(
                1, info.max_batch, value=min(4, info.max_batch), step=1, label="Number of images", elem_id="num-images"
            )
            with gr.Row():
                c["seed"] = seed_box()
                c["random_seed"] = gr.Checkbox(label="Random seed", value=True, min_width=100)
            c["unavailable"] = gr.Markdown(
                unavailable_text(info), elem_id="generate-unavailable", visible=not info.text_to_image
            )
            with gr.Row():
                c["run"] = gr.Button(
                    "Generate", variant="primary", elem_id="generate-btn", interactive=info.text_to_image
                )
                c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop-btn")
            with gr.Accordion("Advanced", open=False):
                c.update(sampling_controls(info))
                c.update(step_cache_controls(info))
                c["loras"] = gr.CheckboxGroup(
                    list(info.loras), label="LoRAs", visible=bool(info.loras), info="from the server's LoRA folder"
                )
                c["scales"] = [
                    gr.Slider(*bounds("lora_scale"), value=1.0, step=0.05, label=f"{n} scale", visible=False)
                    for n in info.loras
                ]
        with gr.Column(scale=3, min_width=360):
            c["gallery"] = gr.Gallery(
                label="Images", elem_id="gallery", columns=4, height=430, format="png",
                object_fit="contain", buttons=["download", "fullscreen"],
            )  # fmt: skip
            c["info"] = gr.Markdown(elem_id="info-line")
            c["downloads"] = gr.File(label="PNG downloads (with metadata)", file_count="multiple", height=80)
            c["info_json"] = gr.JSON(visible=False)
            c["send_inpaint"] = gr.Button("Send to Inpaint", size="sm", elem_id="generate-send-inpaint")
    gr.Examples([[e] for e in examples], inputs=[c["prompt"]], label="Examples")
    return c


def wire(studio: Studio, g: dict[str, Any]) -> None:
    """Generate button: `v` maps each input component to its value (no coupling to argument order)."""
    names = [n for n in fields.GENERATE if n != "loras"] + list(fields.STEP_CACHE)
    lora_names = list(studio.info.loras)

    def ui_generate(v: dict, request: gr.Request, progress=gr.Progress()):
        raw = {name: v[g[name]] for name in names}
        chosen = v[g["loras"]] or []
        raw["loras"] = {n: v[s] for n, s in zip(lora_names, g["scales"], strict=True) if n in chosen}
        for kind, value in studio.generate_live(raw, request, progress):
            if kind == "preview":  # the batch forming, every PREVIEW_EVERY steps
                yield [(im, "preview") for im in value], gr.skip(), gr.skip(), gr.skip()
            else:
                gallery, result, paths = value
                yield gallery, info_line(result), paths, result.info()

    wire_step_cache(g)
    if studio.counts_tokens:
        g["prompt"].change(studio.token_count, g["prompt"], g["tokens"], api_visibility="private", queue=False)
    for name, slider in zip(lora_names, g["scales"], strict=True):
        g["loras"].change(
            lambda c, n=name: gr.update(visible=n in (c or [])), g["loras"], slider,
            api_visibility="private", queue=False,
        )  # fmt: skip
    g["run"].click(
        ui_generate,
        {*(g[n] for n in names), g["loras"], *g["scales"]},
        [g["gallery"], g["info"], g["downloads"], g["info_json"]],
        show_progress_on=[g["info"]],  # the gallery stays visible: it shows the live previews
        api_visibility="private",
        concurrency_id="generate",
        concurrency_limit=None,  # the engine admits and queues (ui.demo)
    )
