"""`/upscale`: the Upscale tab's work for API clients (gradio_client), as `/inpaint` is the Inpaint tab's.

Images in, enlarged PNGs out, through the engine's upscalers (pipelines.imaging.upscalers): by a factor,
or to a size when width and height are given; a second upscaler blended in at a visibility.
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines import NO_UPSCALER
from ui.studio import Studio
from ui.upscale_tab import first_upscaler, upscale_files


def wire(studio: Studio) -> None:
    names = studio.engine.upscaler_names()

    def api_upscale(files: Any, upscaler: str, scale_by: float, width: float | None, height: float | None,
                    upscaler_2: str, upscaler_2_visibility: float) -> tuple[list[str], dict[str, Any]]:  # fmt: skip
        """Enlarge the uploaded images with an upscaler (the `upscaler` parameter's choices): by scale_by, or
        to width x height when both are above 0; upscaler_2 blended in at upscaler_2_visibility (0..1)."""
        size = (int(width), int(height)) if width and height else None
        published, sizes = upscale_files(studio, files, upscaler, scale_by, size, upscaler_2, upscaler_2_visibility)
        info = {"upscaler": upscaler, "upscaler_2": upscaler_2, "upscaler_2_visibility": upscaler_2_visibility,
                "sizes": [{"from": [w, h], "to": [w2, h2]} for w, h, w2, h2 in sizes]}  # fmt: skip
        return published, info

    inputs = [
        gr.File(label="images", file_count="multiple", file_types=["image"], type="filepath", visible=False),
        gr.Dropdown(names, value=first_upscaler(names), label="upscaler", visible=False),
        gr.Number(2.0, label="scale_by", visible=False),
        gr.Number(0, label="width", precision=0, visible=False),  # 0: by scale_by
        gr.Number(0, label="height", precision=0, visible=False),
        gr.Dropdown(names, value=NO_UPSCALER, label="upscaler_2", visible=False),
        gr.Number(0.0, label="upscaler_2_visibility", visible=False),
    ]
    outputs = [gr.Gallery(visible=False, format="png"), gr.JSON(visible=False)]
    gr.Button(visible=False).click(api_upscale, inputs, outputs, api_name="upscale", concurrency_id="upscale")
