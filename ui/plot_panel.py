"""The X/Y/Z plot on the Generate tab: up to three axes over the form's request, one labelled grid.

The form's values are the plot's base request; each axis names a parameter (engine.axes: A1111's
labels, then our own fields and each LoRA) and its values as A1111 writes them (`1-5 (+2)`, `Euler a,
DPM++ 2M`, `512x512`). The cells run through the engine like any request, side by side on a pool;
Stop ends the plot with the finished cells; the grid and every cell image are saved with their
metadata (so they are in History and can be sent back to the form).
"""

from __future__ import annotations

import logging
from typing import Any

import gradio as gr

from engine.axes import axis_types, find_axis
from engine.plots import Axis, PlotOptions, plot_cells, run_script
from pipelines.fields import RequestError
from ui.callers import caller_of
from ui.form import Form
from ui.studio import Studio
from ui.text import refuse

log = logging.getLogger(__name__)
PLACEHOLDERS = {"x": "e.g. 10-30 (+10)  ·  Euler a, DPM++ 2M  ·  512x512, 768x512", "y": "e.g. 1, 4, 7", "z": ""}


def build(studio: Studio, c: dict[str, Any]) -> None:
    """The accordion (inside the Generate tab's settings column)."""
    names = [t.name for t in axis_types("txt2img", studio.info.loras) if t.kind != "off"]
    with gr.Accordion("X/Y/Z plot", open=False, elem_id="xyz-plot"):
        for axis in "xyz":
            with gr.Row():
                c[f"xyz_{axis}_type"] = gr.Dropdown(
                    names, value="Seed" if axis == "x" else "Nothing", label=f"{axis.upper()} type",
                    elem_id=f"xyz-{axis}-type", scale=1,
                )  # fmt: skip
                c[f"xyz_{axis}_values"] = gr.Textbox(
                    label=f"{axis.upper()} values", placeholder=PLACEHOLDERS[axis], elem_id=f"xyz-{axis}-values", scale=2
                )
        with gr.Row():
            c["xyz_legend"] = gr.Checkbox(True, label="Draw legend", elem_id="xyz-legend")
            c["xyz_keep_seeds"] = gr.Checkbox(False, label="Keep -1 for seeds", elem_id="xyz-keep-seeds")
            c["xyz_margin"] = gr.Slider(0, 100, 0, step=2, label="Grid margins (px)", elem_id="xyz-margin")
        c["xyz_run"] = gr.Button("Run X/Y/Z plot", elem_id="xyz-run")
        c["xyz_grid"] = gr.Image(label="Grid", type="filepath", format="png", elem_id="xyz-grid", interactive=False)
        c["xyz_info"] = gr.Markdown(elem_id="xyz-info")


def wire(studio: Studio, c: dict[str, Any]) -> None:
    form: Form = c["form"]
    own = [c[f"xyz_{a}_{part}"] for a in "xyz" for part in ("type", "values")]
    options = [c["xyz_legend"], c["xyz_keep_seeds"], c["xyz_margin"]]

    def ui_plot(v: dict, request: gr.Request, progress=gr.Progress()):
        axes = [(v[c[f"xyz_{a}_type"]], v[c[f"xyz_{a}_values"]]) for a in "xyz"]
        chosen = PlotOptions(legend=bool(v[c["xyz_legend"]]), margin=int(v[c["xyz_margin"]] or 0),
                             keep_random_seeds=bool(v[c["xyz_keep_seeds"]]))  # fmt: skip
        return plot(studio, form.read(v), axes, chosen, request, progress)

    c["xyz_run"].click(
        ui_plot,
        {*form.inputs, *own, *options},
        [c["xyz_grid"], c["gallery"], c["xyz_info"]],
        show_progress_on=[c["xyz_info"]],
        api_visibility="private",
        concurrency_id="generate",
        concurrency_limit=None,  # the engine admits and queues each cell
    )


def plot(studio: Studio, raw: dict[str, Any], axes: list[tuple[str, str]], options: PlotOptions, request, progress):
    """Run the plot of the form's request; (grid path, gallery of the cells, a summary line)."""
    try:
        base = studio.request(raw, studio.limits)
        types = axis_types("txt2img", studio.info.loras)
        chosen = [Axis.of(find_axis(types, name), text) for name, text in axes if name and name != "Nothing"]
        cells, layout = plot_cells(base, chosen, options)
    except (ValueError, RequestError) as exc:
        raise refuse(str(exc)) from exc

    def step(done: int, total: int) -> None:
        progress(done / total, desc=f"cell {done}/{total}")

    progress(0.0, desc=f"{len(cells)} cells")
    try:
        done = run_script(studio.engine, cells, layout, caller_of(request), step)
    except (ValueError, RequestError) as exc:
        raise refuse(str(exc)) from exc
    result = done.as_result(grid=True, lone_images=True)
    if not result.images:
        raise refuse("the plot was stopped before any cell finished")
    paths = studio.save(result, request)
    cells_shown = [(p, f"seed {s}") for p, s in zip(paths[1:], result.seeds[1:], strict=True)]
    summary = f"{len(done.results)} of {len(cells)} cell(s)" + (" · stopped" if done.cancelled else "")
    if done.warnings:
        summary += " · " + "; ".join(done.warnings[:3])
    return paths[0], cells_shown, summary
