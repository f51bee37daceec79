"""The Inpaint tab: repaint what is painted over one picture; an Outpaint accordion extends its canvas.

Its own tab, not a mode of Edit: the Edit tab takes many files at once, while an inpaint paints a
mask over one picture, which needs the editor's space (a brush, an eraser, layers). The picture is
the editor's background; the mask is what is painted on its layers (or an uploaded mask image).
Inpaints run on the main model (`ModelInfo.inpaint`); the buttons are off, with the reason shown,
when it cannot inpaint.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines import INPAINT_FAMILIES, ModelInfo, read_png_info
from ui import inpainting
from ui.fields import OUTPAINT_SIDES
from ui.form import Form, wire_step_cache
from ui.send import inpaint_updates
from ui.studio import Studio
from ui.text import info_line, refuse
from ui.uploads import InputError

MAX_OUTPAINT_SLIDER = 512  # the sliders' range; the API takes up to pipelines.schema.inpaint.MAX_EXTEND


def unavailable_text(info: ModelInfo) -> str:
    return (
        f"**{info.model_name} ({info.pipeline_class}) cannot inpaint**: diffusers has no inpainting pipeline "
        f"for it. Models that inpaint (and outpaint): {INPAINT_FAMILIES}."
    )


def updates(info: ModelInfo, c: dict[str, Any]) -> dict[Any, Any]:
    """What changes in this tab when another model is loaded."""
    out = c["form"].updates(info)
    out[c["unavailable"]] = gr.update(value=unavailable_text(info), visible=not info.inpaint)
    out[c["run"]] = gr.update(interactive=info.inpaint)
    out[c["outpaint"]] = gr.update(interactive=info.inpaint)
    for side in OUTPAINT_SIDES:
        out[c[side]] = gr.update(step=info.size_multiple, value=0)
    return out


def _form(form: Form) -> None:
    """The prompt and the inpaint's own controls; the sampling ones under Advanced."""
    form.add("prompt", lines=2, info="what the painted area becomes")
    form.add("negative_prompt")
    form.add("strength", label="Denoising strength", info="how much of what was under the mask is re-drawn")
    with gr.Row():
        form.add("mask_blur")
        form.add("padding")
    with gr.Row():
        form.add("masked_content")
        form.add("inpaint_area")
    form.add("invert_mask", label="Invert mask (repaint everything but the strokes)")
    form.add("num_images", label="Images")
    form.add("seed")
    with gr.Accordion("Advanced", open=False, elem_id="inpaint-advanced"):
        for name in ("sampler", "steps", "guidance_scale", "guidance_end", "step_cache", "step_cache_threshold"):
            form.add(name)
        form.add_rest()  # the LoRAs, and any field new to the schema


def build(studio: Studio) -> dict[str, Any]:
    info = studio.info
    c: dict[str, Any] = {}
    form = c["form"] = Form("inpaint", info, c, studio.engine.detect)
    with gr.Row(equal_height=False):
        with gr.Column(scale=3, min_width=320):
            c["editor"] = gr.ImageEditor(
                type="pil", label="Picture (upload) and mask (paint over it)", elem_id="inpaint-editor", format="png",
                brush=gr.Brush(default_size=16, colors=["#ffffff", "#ff0000"], default_color="#ffffff"), eraser=gr.Eraser(),
                transforms=(), height=420, sources=("upload", "clipboard"),
            )  # fmt: skip
            c["mask"] = gr.Image(
                type="pil", image_mode=None, label="Mask image (optional: used instead of the strokes)", height=140,
                sources=["upload"], elem_id="inpaint-mask",
            )  # fmt: skip
            _form(form)
            c["unavailable"] = gr.Markdown(
                unavailable_text(info), elem_id="inpaint-unavailable", visible=not info.inpaint
            )
            with gr.Row():
                c["run"] = gr.Button("Inpaint", variant="primary", elem_id="inpaint-btn", interactive=info.inpaint)
                c["stop"] = gr.Button("Stop", variant="stop")
            with gr.Accordion("Outpaint", open=False):
                with gr.Row():
                    for side in OUTPAINT_SIDES:
                        c[side] = gr.Slider(0, MAX_OUTPAINT_SLIDER, value=0, step=info.size_multiple, label=side.title(), elem_id=f"outpaint-{side}")  # fmt: skip
                c["outpaint"] = gr.Button("Outpaint", elem_id="outpaint-btn", interactive=info.inpaint)
        with gr.Column(scale=3, min_width=360):
            c["gallery"] = gr.Gallery(
                label="Results", elem_id="inpaint-gallery", columns=2, height=430, format="png",
                object_fit="contain", buttons=["download", "fullscreen"],
            )  # fmt: skip
            c["info"] = gr.Markdown(elem_id="inpaint-info")
            c["downloads"] = gr.File(
                label="PNG downloads", file_count="multiple", height=80, elem_id="inpaint-downloads", interactive=False
            )  # an output: no upload zone
            c["send_upscale"] = gr.Button("Send to Upscale", size="sm", elem_id="inpaint-send-upscale")
    return c


def _answers(events):
    """The tab's outputs for an inpaint's or outpaint's events: previews, then the results."""
    for kind, value in events:
        if kind == "preview":
            yield [(im, "preview") for im in value], gr.skip(), gr.skip()
        elif kind == "done":
            gallery, result, paths = value
            yield gallery, info_line(result), paths


def wire(studio: Studio, c: dict[str, Any]) -> None:
    """The Inpaint and Outpaint buttons (the public API is ui.inpaint_api's: it takes files)."""
    form: Form = c["form"]

    def picture(value: Any, mask: Any):
        try:
            return inpainting.editor_image_and_mask(value, mask)
        except InputError as exc:
            raise refuse(str(exc)) from exc

    def ui_inpaint(v: dict, request: gr.Request, progress=gr.Progress()):
        raw = form.read(v)
        image, mask = picture(v[c["editor"]], v[c["mask"]])
        yield from _answers(inpainting.inpaint(studio, raw, image, mask, request, progress))

    def ui_outpaint(v: dict, request: gr.Request, progress=gr.Progress()):
        raw = {**form.read(v), **{side: v[c[side]] for side in OUTPAINT_SIDES}}
        image, _ = picture(v[c["editor"]], None)
        yield from _answers(inpainting.outpaint(studio, raw, image, request, progress))

    common = dict(
        outputs=[c["gallery"], c["info"], c["downloads"]],
        show_progress_on=[c["info"]],  # the gallery stays visible: it shows the live previews
        api_visibility="private",
        concurrency_id="generate",
        concurrency_limit=None,  # the engine admits and queues (ui.demo)
    )
    wire_step_cache(c)
    inputs = {c["editor"], c["mask"], *form.inputs}
    c["run"].click(ui_inpaint, inputs, **common)
    c["outpaint"].click(ui_outpaint, {*inputs, *(c[s] for s in OUTPAINT_SIDES)}, **common)


def send_image(studio: Studio, path: str | None, i: dict[str, Any], tabs: gr.Tabs) -> dict[Any, Any]:
    """Send to Inpaint: the PNG at `path` as the editor's picture, its parameters in the form, the tab opened."""
    if not path:
        raise gr.Error("select an image first", print_exception=False)
    try:
        params = read_png_info(path)["parameters"]
    except (ValueError, OSError):  # no parameters in it: the picture alone
        params = {}
    return {**inpaint_updates(params, studio.info, path, i["form"]), tabs: gr.Tabs(selected="inpaint")}
