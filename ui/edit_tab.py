"""The Edit tab: many input images x one instruction/prompt; results paired with their inputs."""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines.backend import ModelInfo
from pipelines.request import DEFAULTS
from ui import fields
from ui.api import with_parameters
from ui.generate_tab import (
    sampling_controls,
    sampling_props,
    seed_box,
    step_cache_controls,
    step_cache_props,
    wire_step_cache,
)
from ui.inputs import bounds
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
    info = info.for_edits
    props = sampling_props(info)
    out = {e[name]: gr.update(**props[name]) for name in fields.SAMPLING}
    out.update({e[name]: gr.update(**p) for name, p in step_cache_props(info).items()})
    out[e["mode"]] = gr.update(value=mode_text(info))
    out[e["strength"]] = gr.update(visible=info.image_to_image and not info.edit)
    out[e["image_guidance_scale"]] = gr.update(visible=info.image_guidance, value=info.default_image_guidance)
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
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            c["files"] = gr.File(
                label="Input images", file_count="multiple", file_types=["image"], height=140, elem_id="edit-files"
            )
            c["prompt"] = gr.Textbox(
                label="Instruction / prompt", lines=2, placeholder=placeholder(info), elem_id="edit-prompt"
            )
            c["mode"] = gr.Markdown(mode_text(info), elem_id="edit-mode")
            c["vocabulary"] = gr.Markdown(vocabulary, elem_id="edit-vocabulary", visible=bool(vocabulary))
            c["strength"] = gr.Slider(
                *bounds("strength"), value=DEFAULTS.strength, step=0.01, label="Strength", info="how much of each input is re-drawn",
                visible=info.image_to_image and not info.edit,
            )  # fmt: skip
            c["image_guidance_scale"] = gr.Slider(
                *bounds("image_guidance_scale"), value=info.default_image_guidance, step=0.1, label="Image guidance", visible=info.image_guidance,
                info="how closely the result keeps the input image", elem_id="image-guidance",
            )  # fmt: skip
            c["num_images"] = gr.Slider(1, info.max_batch, value=1, step=1, label="Images per input")
            with gr.Row():
                c["seed"] = seed_box()
                c["random_seed"] = gr.Checkbox(label="Random seed", value=True, elem_id="edit-random-seed")
            with gr.Accordion("Advanced", open=False):
                controls = sampling_controls(info, prefix="edit-")
                c.update({name: controls[name] for name in fields.SAMPLING})
                for name in ("width", "height"):  # an edit keeps its input's aspect ratio at the model's area
                    controls[name].unrender()
                c.update(step_cache_controls(info, prefix="edit-"))
            with gr.Row():
                c["run"] = gr.Button(
                    "Edit", variant="primary", elem_id="edit-btn", interactive=info.edit or info.image_to_image
                )
                c["stop"] = gr.Button("Stop", variant="stop")
        with gr.Column(scale=3, min_width=360):
            c["gallery"] = gr.Gallery(
                label="Inputs and results", elem_id="edit-gallery", columns=4, height=430, format="png",
                buttons=["download", "fullscreen"],
            )  # fmt: skip
            c["info"] = gr.Markdown(elem_id="edit-info")
            c["downloads"] = gr.File(label="PNG downloads", file_count="multiple", height=80)
            c["send_inpaint"] = gr.Button("Send to Inpaint", size="sm", elem_id="edit-send-inpaint")
    return c


# /edit's inputs that callers have always sent: the files, then EDIT_API up to the step cache
PUBLISHED = 1 + [name for name, _ in fields.EDIT_API].index("step_cache")


def padding(studio: Studio) -> tuple[int, Any]:
    """/edit's published inputs, and the values of those added since for a caller that sends none:
    the editing model's step cache (null) at its threshold (the slider takes no null)."""
    return PUBLISHED, lambda: [None, step_cache_props(studio.info.for_edits)["step_cache_threshold"]["value"]]


def wire(studio: Studio, e: dict[str, Any]) -> Any:
    """The Edit button; its public API (`/edit`) keeps the parameter names it was published with.
    Returns the API's function, for `accept_shorter_calls`."""
    api_names = [name for name, _ in fields.EDIT_API]

    def ui_edit(*args):
        request, files, *values, progress = args
        raw = {field: value for (_, field), value in zip(fields.EDIT_API, values, strict=True)}
        for kind, value in studio.edit(raw, files, request, progress):
            if kind == "preview":  # the results forming
                yield [(im, "preview") for im in value], gr.skip(), gr.skip()
            else:
                pairs, result, paths = value
                yield pairs, info_line(result), paths

    wire_step_cache(e)
    with_parameters(ui_edit, ("files", *api_names))
    e["run"].click(
        ui_edit,
        [e["files"], *(e[field] for _, field in fields.EDIT_API)],
        [e["gallery"], e["info"], e["downloads"]],
        api_name="edit",
        concurrency_id="generate",
        concurrency_limit=None,  # the engine admits and queues (ui.demo)
    )
    return ui_edit
