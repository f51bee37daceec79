"""The Scripts accordion of the Generate and Edit tabs: X/Y/Z plot, prompt matrix, prompts from a file.

The tab's form (and, on Edit, its input images) is the request each script varies (engine.plots,
engine.prompt_scripts: A1111's semantics). The cells run through the engine like any request,
side by side on a pool; Stop ends the script with the finished cells; the grid and every cell
image are saved with their metadata (so they are in History and can be sent back to a form).
On Edit the plot offers A1111's img2img axes (Denoising, Image CFG Scale, ...).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradio as gr

from engine.axes import axis_types
from engine.plots import Cell, Layout, named_plot, run_script
from engine.prompt_scripts import LINES_PROMPT, POSITIONS, prompt_matrix_cells, prompts_from_text_cells
from pipelines import GenerationRequest, ModelInfo
from pipelines.schema.fields import RequestError
from ui.callers import caller_of
from ui.form import Form
from ui.studio import Studio
from ui.text import refuse

log = logging.getLogger(__name__)
MODES = {"generate": "txt2img", "edit": "img2img"}
PLACEHOLDERS = {"x": "e.g. 10-30 (+10)  ·  Euler a, DPM++ 2M  ·  512x512, 768x512", "y": "e.g. 1, 4, 7", "z": ""}
MAX_TEXT_FILE = 1 << 20  # a prompts file: text, one prompt per line
SCRIPTS = ("X/Y/Z plot", "Prompt matrix", "Prompts from file or textbox")  # A1111's Script picker, its names
GROUPS = ("group_xyz", "group_matrix", "group_lines")


def _id(tab: str, name: str) -> str:
    return name if tab == "generate" else f"{tab}-{name}"


def axis_names(info: ModelInfo, tab: str) -> list[str]:
    """The axes a plot on `tab` offers for the model serving it (`info`: its LoRAs have axes)."""
    served = info if tab == "generate" else info.for_edits
    return [t.name for t in axis_types(MODES[tab], served.loras) if t.kind != "off"]


def updates(info: ModelInfo, c: dict[str, Any], tab: str) -> dict[Any, Any]:
    """The axis pickers after another model is loaded: its LoRAs' axes, not the previous model's."""
    names = axis_names(info, tab)
    return {c[f"xyz_{a}_type"]: gr.update(choices=names) for a in "xyz"}


def build(studio: Studio, c: dict[str, Any], tab: str, section: bool = False) -> None:
    """The accordion (`section`: a column, for a section tab) in the tab's settings; its components go into `c`
    under "xyz_*" names (the grid and the summary: `results`, in the image column)."""
    names = axis_names(studio.info, tab)
    label = "Scripts: X/Y/Z plot, prompt matrix, prompts from file"
    box = gr.Column(elem_id=_id(tab, "scripts")) if section else gr.Accordion(label, open=False, elem_id=_id(tab, "scripts"))
    with box:
        c["script"] = gr.Dropdown(list(SCRIPTS), value=SCRIPTS[0], label="Script", elem_id=_id(tab, "script"))
        with gr.Group(visible=True) as c["group_xyz"]:
            for axis in "xyz":
                with gr.Row():
                    c[f"xyz_{axis}_type"] = gr.Dropdown(
                        names, value="Seed" if axis == "x" else "Nothing", label=f"{axis.upper()} type",
                        elem_id=_id(tab, f"xyz-{axis}-type"), scale=1,
                    )  # fmt: skip
                    c[f"xyz_{axis}_values"] = gr.Textbox(
                        label=f"{axis.upper()} values", placeholder=PLACEHOLDERS[axis],
                        elem_id=_id(tab, f"xyz-{axis}-values"), scale=2,
                    )  # fmt: skip
            with gr.Row(elem_id=_id(tab, "xyz-options")):  # the switches on a row of their own: labels in full
                c["xyz_legend"] = gr.Checkbox(True, label="Draw legend", min_width=160)
                c["xyz_keep_seeds"] = gr.Checkbox(False, label="Keep -1 for seeds", min_width=160)
            c["xyz_margin"] = gr.Slider(0, 100, 0, step=2, label="Grid margins (px)")
            c["xyz_run"] = gr.Button("Run X/Y/Z plot", elem_id=_id(tab, "xyz-run"))
        with gr.Group(visible=False) as c["group_matrix"]:
            gr.Markdown("Write `a red circle | on a blue background | large`: each part after the first is in or out.")
            with gr.Row():
                c["matrix_at_start"] = gr.Checkbox(False, label="Put variable parts at start of prompt")
                c["matrix_seeds"] = gr.Checkbox(False, label="Use different seed for each picture")
            with gr.Row():
                c["matrix_prompt"] = gr.Radio(["positive", "negative"], value="positive", label="Select prompt")
                c["matrix_join"] = gr.Radio(["comma", "space"], value="comma", label="Select joining char")
            c["matrix_run"] = gr.Button("Run prompt matrix", elem_id=_id(tab, "matrix-run"))
        with gr.Group(visible=False) as c["group_lines"]:
            c["lines_file"] = gr.File(label="A .txt file (or write below)", file_types=[".txt"], type="filepath", height=80)
            c["lines_text"] = gr.Textbox(label="List of prompt inputs", lines=4, elem_id=_id(tab, "lines-text"),
                                         placeholder='one per line; --prompt "a cat" --steps 20 --cfg_scale 7 sets a line\'s own')  # fmt: skip
            with gr.Row():
                c["lines_iterate"] = gr.Checkbox(False, label="Iterate seed every line")
                c["lines_same"] = gr.Checkbox(False, label="Use same random seed for all lines")
                c["lines_position"] = gr.Radio(list(POSITIONS), value="start", label="Insert prompts at the")
            c["lines_run"] = gr.Button("Run prompts", elem_id=_id(tab, "lines-run"))


def results(c: dict[str, Any], tab: str) -> None:
    """The scripts' grid and summary line, in the tab's image column (the grid shown once a plot made one)."""
    c["xyz_grid"] = gr.Image(label="X/Y/Z grid", type="filepath", format="png", elem_id=_id(tab, "xyz-grid"),
                             interactive=False, visible=False, buttons=["download", "fullscreen"])  # fmt: skip
    c["xyz_info"] = gr.Markdown(elem_id=_id(tab, "xyz-info"))


def wire(studio: Studio, c: dict[str, Any], tab: str) -> None:
    form: Form = c["form"]
    files = [c["files"]] if tab == "edit" else []
    outputs = [c["xyz_grid"], c["gallery"], c["xyz_info"]]
    event = dict(show_progress_on=[c["xyz_info"]], api_visibility="private", concurrency_id="generate",
                 concurrency_limit=None)  # fmt: skip  # the engine admits and queues each cell

    def base(v: dict, lines: bool = False) -> GenerationRequest:
        raw = form.read(v)
        if lines and not str(raw.get("prompt") or "").strip():  # the lines carry the prompts
            raw["prompt"] = LINES_PROMPT
        return studio.request(raw, studio.limits) if tab == "generate" else studio.edit_request(raw, v[c["files"]])

    def loras() -> tuple[str, ...]:
        return (studio.info if tab == "generate" else studio.info.for_edits).loras

    def ui_plot(v: dict, request: gr.Request, progress=gr.Progress()):
        named = {f"{a}_{part}": v[c[f"xyz_{a}_{part}"]] for a in "xyz" for part in ("type", "values")}
        named.update(legend=v[c["xyz_legend"]], keep_random_seeds=v[c["xyz_keep_seeds"]], margin=v[c["xyz_margin"]])
        make = lambda b: named_plot(b, MODES[tab], loras(), named)[:2]  # noqa: E731
        return answer(run_cells(studio, cells_of(lambda: base(v), make), request, progress))

    def ui_matrix(v: dict, request: gr.Request, progress=gr.Progress()):
        flags = [v[c[k]] for k in ("matrix_at_start", "matrix_seeds", "matrix_prompt", "matrix_join")]
        make = lambda b: prompt_matrix_cells(b, *flags, margin=int(v[c["xyz_margin"]] or 0))  # noqa: E731
        return answer(run_cells(studio, cells_of(lambda: base(v), make), request, progress))

    def ui_lines(v: dict, request: gr.Request, progress=gr.Progress()):
        text = _file_text(v[c["lines_file"]]) + (v[c["lines_text"]] or "")
        flags = [v[c[k]] for k in ("lines_iterate", "lines_same", "lines_position")]
        own = "" if not str(form.read(v).get("prompt") or "").strip() else None  # none: each line's alone

        def make(b: GenerationRequest):
            return prompts_from_text_cells(b, text, *flags, base_prompt=own)

        return answer(run_cells(studio, cells_of(lambda: base(v, lines=True), make), request, progress, grid=False))

    own = (c[k] for k in c if k.startswith(("xyz_", "matrix_", "lines_")) and not k.endswith("_run"))
    inputs = {*form.inputs, *files, *own} - set(outputs)
    groups = [c[g] for g in GROUPS]
    c["script"].change(lambda name: [gr.update(visible=name == s) for s in SCRIPTS], c["script"], groups,
                       api_visibility="private", queue=False)  # fmt: skip
    c["xyz_run"].click(ui_plot, inputs, outputs, **event)
    c["matrix_run"].click(ui_matrix, inputs, outputs, **event)
    c["lines_run"].click(ui_lines, inputs, outputs, **event)


def cells_of(base: Callable[[], GenerationRequest], make: Any) -> tuple[list[Cell], Layout]:
    """A script's cells (`make`) from the request `base()` reads; a refused value as the tab's error message."""
    try:
        return make(base())
    except (ValueError, RequestError) as exc:
        raise refuse(str(exc)) from exc


def run_cells(studio: Studio, made: tuple[list[Cell], Layout], request: Any, progress: Any, grid: bool = True) -> dict:
    """Run a script's cells (progress counts cells) and save what came back: the grid first, then
    each cell's images. {"grid": path | None, "cells": [(path, caption)], "info": {...}}."""
    cells, layout = made

    def step(done: int, total: int) -> None:
        progress(done / total, desc=f"cell {done}/{total}")

    progress(0.0, desc=f"{len(cells)} cells")
    try:
        done = run_script(studio.engine, cells, layout, caller_of(request), step)
    except (ValueError, RequestError) as exc:
        raise refuse(str(exc)) from exc
    result = done.as_result(grid=grid, lone_images=True)
    if not result.images:
        raise refuse("stopped before any cell finished")
    paths = studio.save(result, request)
    first = 1 if grid and done.grid is not None else 0
    info = {"cells": len(cells), "finished": len(done.results), "cancelled": done.cancelled,
            "models_loaded": done.models_loaded, "warnings": done.warnings, "seeds": result.seeds[first:]}  # fmt: skip
    captions = [(p, f"seed {s}") for p, s in zip(paths[first:], result.seeds[first:], strict=True)]
    return {"grid": paths[0] if first else None, "cells": captions, "info": info}


def answer(out: dict) -> tuple[Any, Any, str]:
    """The accordion's outputs: the grid, the cells in the tab's gallery, a summary line."""
    info = out["info"]
    summary = f"{info['finished']} of {info['cells']} cell(s)" + (" · stopped" if info["cancelled"] else "")
    if info["warnings"]:
        summary += " · " + "; ".join(info["warnings"][:3])
    return gr.update(value=out["grid"], visible=out["grid"] is not None), out["cells"], summary


def _file_text(path: str | None) -> str:
    """An uploaded prompts file's text (UTF-8), ending in a newline so the textbox's lines follow it."""
    if not path:
        return ""
    data = Path(path).read_bytes()[:MAX_TEXT_FILE]
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise refuse("the prompts file is not UTF-8 text") from None
    return text if text.endswith("\n") else text + "\n"
