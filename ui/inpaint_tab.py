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

from pipelines.backend import ModelInfo
from pipelines.inpaint import (
    DEFAULT_STRENGTH,
    INPAINT_AREAS,
    INPAINT_DEFAULTS,
    INPAINT_FAMILIES,
    MASKED_CONTENT,
    MAX_MASK_BLUR,
    MAX_PADDING,
)
from pipelines.pnginfo import read_png_info
from ui import fields, inpainting
from ui.generate_tab import (
    sampling_controls,
    sampling_props,
    seed_box,
    step_cache_controls,
    step_cache_props,
    wire_step_cache,
)
from ui.inputs import InputError, bounds
from ui.send import inpaint_targets, inpaint_updates
from ui.studio import Studio
from ui.text import info_line, refuse

MAX_OUTPAINT_SLIDER = 512  # the sliders' range; the API takes up to pipelines.inpaint.MAX_EXTEND


def unavailable_text(info: ModelInfo) -> str:
    return (
        f"**{info.model_name} ({info.pipeline_class}) cannot inpaint**: diffusers has no inpainting pipeline "
        f"for it. Models that inpaint (and outpaint): {INPAINT_FAMILIES}."
    )


def updates(info: ModelInfo, c: dict[str, Any]) -> dict[Any, Any]:
    """What changes in this tab when another model is loaded."""
    props = sampling_props(info)
    out = {c[name]: gr.update(**props[name]) for name in fields.SAMPLING}
    out.update({c[name]: gr.update(**p) for name, p in step_cache_props(info).items()})
    out[c["unavailable"]] = gr.update(value=unavailable_text(info), visible=not info.inpaint)
    out[c["run"]] = gr.update(interactive=info.inpaint)
    out[c["outpaint"]] = gr.update(interactive=info.inpaint)
    for side in fields.OUTPAINT_SIDES:
        out[c[side]] = gr.update(step=info.size_multiple, value=0)
    return out


def _form(info: ModelInfo, c: dict[str, Any]) -> None:
    """The prompt and the inpaint's own controls."""
    c["prompt"] = gr.Textbox(label="Prompt", lines=2, elem_id="inpaint-prompt", info="what the painted area becomes")
    c["negative_prompt"] = gr.Textbox(value="", label="Negative prompt", lines=1, elem_id="inpaint-negative")
    c["strength"] = gr.Slider(
        *bounds("strength"), value=DEFAULT_STRENGTH, step=0.01, label="Denoising strength", elem_id="inpaint-strength",
        info="how much of what was under the mask is re-drawn",
    )  # fmt: skip
    with gr.Row():
        c["mask_blur"] = gr.Slider(
            0, MAX_MASK_BLUR, value=INPAINT_DEFAULTS.mask_blur, step=1, label="Mask blur", elem_id="inpaint-mask-blur"
        )
        c["padding"] = gr.Slider(
            0, MAX_PADDING, value=INPAINT_DEFAULTS.padding, step=1, label="Only masked padding, pixels"
        )
    with gr.Row():
        c["masked_content"] = gr.Radio(list(MASKED_CONTENT), value=INPAINT_DEFAULTS.masked_content, label="Masked content")
        c["inpaint_area"] = gr.Radio(list(INPAINT_AREAS), value=INPAINT_DEFAULTS.inpaint_area, label="Inpaint area")
    c["invert_mask"] = gr.Checkbox(label="Invert mask (repaint everything but the strokes)", value=False)
    c["num_images"] = gr.Slider(1, info.max_batch, value=1, step=1, label="Images", elem_id="inpaint-num-images")
    with gr.Row():
        c["seed"] = seed_box(elem_id="inpaint-seed")
        c["random_seed"] = gr.Checkbox(label="Random seed", value=True, elem_id="inpaint-random-seed")
    with gr.Accordion("Advanced", open=False, elem_id="inpaint-advanced"):
        controls = sampling_controls(info, prefix="inpaint-")
        c.update({name: controls[name] for name in fields.SAMPLING})
        for name in ("width", "height"):  # an inpaint keeps its picture's size
            controls[name].unrender()
        c.update(step_cache_controls(info, prefix="inpaint-"))


def build(studio: Studio) -> dict[str, Any]:
    info = studio.info
    c: dict[str, Any] = {}
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
            _form(info, c)
            c["unavailable"] = gr.Markdown(
                unavailable_text(info), elem_id="inpaint-unavailable", visible=not info.inpaint
            )
            with gr.Row():
                c["run"] = gr.Button("Inpaint", variant="primary", elem_id="inpaint-btn", interactive=info.inpaint)
                c["stop"] = gr.Button("Stop", variant="stop")
            with gr.Accordion("Outpaint", open=False):
                with gr.Row():
                    for side in fields.OUTPAINT_SIDES:
                        c[side] = gr.Slider(0, MAX_OUTPAINT_SLIDER, value=0, step=info.size_multiple, label=side.title(), elem_id=f"outpaint-{side}")  # fmt: skip
                c["outpaint"] = gr.Button("Outpaint", elem_id="outpaint-btn", interactive=info.inpaint)
        with gr.Column(scale=3, min_width=360):
            c["gallery"] = gr.Gallery(
                label="Results", elem_id="inpaint-gallery", columns=2, height=430, format="png",
                object_fit="contain", buttons=["download", "fullscreen"],
            )  # fmt: skip
            c["info"] = gr.Markdown(elem_id="inpaint-info")
            c["downloads"] = gr.File(
                label="PNG downloads", file_count="multiple", height=80, elem_id="inpaint-downloads"
            )
    return c


def _answers(events):
    """The tab's outputs for an inpaint's or outpaint's events: previews, then the results."""
    for kind, value in events:
        if kind == "preview":
            yield [(im, "preview") for im in value], gr.skip(), gr.skip()
        else:
            gallery, result, paths = value
            yield gallery, info_line(result), paths


def wire(studio: Studio, c: dict[str, Any]) -> None:
    """The Inpaint and Outpaint buttons (the public API is ui.inpaint_api's: it takes files)."""
    names = [n for n in fields.INPAINT]

    def picture(value: Any, mask: Any):
        try:
            return inpainting.editor_image_and_mask(value, mask)
        except InputError as exc:
            raise refuse(str(exc)) from exc

    def ui_inpaint(v: dict, request: gr.Request, progress=gr.Progress()):
        raw = {name: v[c[name]] for name in names}
        image, mask = picture(v[c["editor"]], v[c["mask"]])
        yield from _answers(inpainting.inpaint(studio, raw, image, mask, request, progress))

    def ui_outpaint(v: dict, request: gr.Request, progress=gr.Progress()):
        raw = {name: v[c[name]] for name in (*names, *fields.OUTPAINT_SIDES)}
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
    form = {c["editor"], c["mask"], *(c[n] for n in names)}
    c["run"].click(ui_inpaint, form, **common)
    c["outpaint"].click(ui_outpaint, {*form, *(c[s] for s in fields.OUTPAINT_SIDES)}, **common)


def send_image(studio: Studio, path: str | None) -> list[Any]:
    """Send to Inpaint: the PNG at `path` as the editor's picture, its parameters in the form, the tab opened."""
    if not path:
        raise gr.Error("select an image first", print_exception=False)
    try:
        params = read_png_info(path)["parameters"]
    except (ValueError, OSError):  # no parameters in it: the picture alone
        params = {}
    return [*inpaint_updates(params, studio.info, path), gr.Tabs(selected="inpaint")]


def _picker(stride: int):
    """A gallery's select event -> the index of the result chosen (`stride` gallery items per result)."""

    def pick(evt: gr.SelectData) -> int:
        return evt.index // stride

    return pick


def wire_sends(studio: Studio, i: dict[str, Any], tabs: gr.Tabs, galleries: list[tuple[Any, Any, Any, int]]) -> None:
    """Send to Inpaint under result galleries: (gallery, PNG downloads, button, gallery items per result).

    The selected result goes (the first when none was selected); the Edit gallery shows each result
    after its input, so its stride is 2."""
    for gallery, downloads, button, stride in galleries:
        chosen = gr.State(0)

        def send(paths: list[str] | None, index: int) -> list[Any]:
            paths = paths or []
            return send_image(studio, paths[min(index, len(paths) - 1)] if paths else None)

        events = dict(api_visibility="private", queue=False)
        gallery.select(_picker(stride), None, chosen, **events)
        button.click(send, [downloads, chosen], [*inpaint_targets(i), tabs], **events)
