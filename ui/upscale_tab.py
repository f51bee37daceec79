"""The Upscale tab (A1111's Extras): enlarge uploaded images by a factor or to a size, with an
upscaler model (pipelines.imaging.upscalers: the embedded one, UPSCALER_DIR's) or Lanczos/Nearest, and
optionally a second upscaler blended in. The work runs in the engine (`Engine.upscale`)."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any

import gradio as gr

from pipelines import MAX_FACTOR, UpscalerError
from pipelines import NO_UPSCALER as NONE
from ui.studio import Studio
from ui.text import refuse
from ui.uploads import InputError, open_images, upload_paths

log = logging.getLogger(__name__)
BY, TO = "Scale by", "Scale to"


def first_upscaler(names: list[str]) -> str:
    """The tab's first choice: a model where the server has one (better than any resampling), else Lanczos."""
    pixel = {NONE, "Lanczos", "Nearest"}
    return next((n for n in names if n not in pixel), "Lanczos" if "Lanczos" in names else names[0])


def build(studio: Studio) -> dict[str, Any]:
    names = studio.engine.upscaler_names()
    c: dict[str, Any] = {}
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            c["files"] = gr.File(label="Images", file_count="multiple", file_types=["image"], elem_id="upscale-files")
            c["upscaler"] = gr.Dropdown(names, value=first_upscaler(names), label="Upscaler", elem_id="upscale-upscaler")
            c["mode"] = gr.Radio([BY, TO], value=BY, label="Resize", elem_id="upscale-mode")
            c["factor"] = gr.Slider(1.0, MAX_FACTOR, value=2.0, step=0.05, label="Scale by", elem_id="upscale-factor")
            with gr.Row():
                c["width"] = gr.Number(512, label="Width", precision=0, minimum=8, elem_id="upscale-width", visible=False)
                c["height"] = gr.Number(512, label="Height", precision=0, minimum=8, elem_id="upscale-height", visible=False)
            with gr.Accordion("Second upscaler", open=False):
                c["second"] = gr.Dropdown(names, value=NONE, label="Upscaler 2", elem_id="upscale-second")
                c["visibility"] = gr.Slider(0.0, 1.0, value=0.0, step=0.05, label="Upscaler 2 visibility")
            c["run"] = gr.Button("Upscale", variant="primary", elem_id="upscale-btn")
        with gr.Column(scale=3, min_width=360):
            c["gallery"] = gr.Gallery(label="Upscaled", elem_id="upscale-gallery", columns=2, height=430, format="png")
            c["info"] = gr.Markdown(elem_id="upscale-info")
            c["downloads"] = gr.File(label="PNG downloads", file_count="multiple", height=80, interactive=False)
    return c


def upscale_files(studio: Studio, files: Any, upscaler: str, factor: float, size: tuple[int, int] | None,
                  second: str, visibility: float) -> tuple[list[str], list[tuple[int, int, int, int]]]:
    """The Upscale tab's and `/upscale`'s work: the uploaded images enlarged in the engine, published as
    PNGs (Gradio's own copies); returns their paths and (width, height, new width, new height) of each."""
    try:
        pictures = open_images(upload_paths(files, studio.limits), studio.limits)
        out = studio.engine.upscale(pictures, upscaler, factor, size, second, float(visibility))
    except (InputError, UpscalerError) as exc:
        raise refuse(str(exc)) from None
    with tempfile.TemporaryDirectory(prefix="upscaled-") as folder:
        paths = []
        for i, image in enumerate(out):
            path = Path(folder) / f"upscaled-{i:03d}.png"
            image.save(path)
            paths.append(str(path))
        published = studio.publish(paths)  # Gradio's own copies: the folder goes away
    return published, [(a.width, a.height, b.width, b.height) for a, b in zip(pictures, out, strict=True)]


def wire(studio: Studio, u: dict[str, Any]) -> None:
    def ui_upscale(files, upscaler, mode, factor, width, height, second, visibility):
        size = (int(width), int(height)) if mode == TO else None
        published, sizes = upscale_files(studio, files, upscaler, factor, size, second, visibility)
        shown = ", ".join(f"{w}x{h} → {w2}x{h2}" for w, h, w2, h2 in sizes)
        return published, f"{len(published)} image(s) upscaled by {upscaler}: {shown}", published

    u["mode"].change(
        lambda m: (gr.update(visible=m == BY), gr.update(visible=m == TO), gr.update(visible=m == TO)),
        u["mode"], [u["factor"], u["width"], u["height"]], api_visibility="private", queue=False,
    )  # fmt: skip
    u["run"].click(
        ui_upscale,
        [u[k] for k in ("files", "upscaler", "mode", "factor", "width", "height", "second", "visibility")],
        [u["gallery"], u["info"], u["downloads"]],
        api_visibility="private",
        concurrency_id="upscale",
    )
