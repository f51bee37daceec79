"""The model picker: the recipes and MODELS_DIR folders that can load here, switched at runtime for every replica."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from pipelines import ModelInfo
from ui import edit_tab, generate_tab, inpaint_tab, video_tab
from ui.studio import Studio


def build(studio: Studio) -> dict[str, Any]:
    """A dropdown of what can load here and a Load button (shown only where switching is allowed).

    Models that cannot load here (pipelines.weights.catalog: not downloaded while the Hub is off, files
    missing) are left out rather than shown disabled: a user expects every choice of a dropdown to
    work, and Gradio's Dropdown cannot disable one choice; the info line names them, and the API's
    `/models` lists each with its reason (the same listing A1111's sd-models reads)."""
    listed = studio.models()
    names = [m["name"] for m in listed["models"]]
    current = studio.info.model_name
    if current not in names:
        names.insert(0, current)
    can_switch = studio.engine.can_switch
    c: dict[str, Any] = {}
    with gr.Row(equal_height=False, elem_id="model-row"):  # not stretched: the button keeps a button's height
        c["model"] = gr.Dropdown(
            names, value=current, label="Model", elem_id="model-picker", interactive=can_switch, scale=4,
            info=hidden_note(listed.get("unavailable", [])) if can_switch else studio.engine.switch_off_reason,
        )  # fmt: skip
        c["load"] = gr.Button("Load model", elem_id="load-model-btn", visible=can_switch, scale=0, min_width=140)
        c["status"] = gr.Markdown(elem_id="model-status", scale=2)
    return c


def hidden_note(unavailable: list[dict[str, str]]) -> str | None:
    """The picker's line on the models it leaves out (None when it leaves out none)."""
    if not unavailable:
        return None
    names = ", ".join(m["name"] for m in unavailable[:3])
    more = f" and {len(unavailable) - 3} more" if len(unavailable) > 3 else ""
    return f"Not listed, as they cannot load here: {names}{more} (the API's /models says why)"


def wire(studio: Studio, m: dict[str, Any], tab: dict[str, dict[str, Any]], header: Any, tabs: Any,
         header_text: Callable[[ModelInfo], str]) -> None:  # fmt: skip
    """Load button: switch, then update every control that depends on the model."""

    def model_updates(info: ModelInfo) -> dict[Any, Any]:
        out = {**generate_tab.updates(info, tab["generate"]), **edit_tab.updates(info, tab["edit"])}
        out.update(inpaint_tab.updates(info, tab["inpaint"]))
        out.update(video_tab.updates(info, tab["video"]))
        out[header] = gr.update(value=header_text(info))
        out[m["model"]] = gr.update(value=info.model_name)
        return out

    outputs = [*model_updates(studio.info), m["status"]]

    def ui_load(name: str, progress=gr.Progress()):
        try:
            info = studio.load_model(name, progress)
        except gr.Error as exc:  # the previous model serves on: show why, keep the controls as they are
            return {**model_updates(studio.info), m["status"]: f"⚠️ {exc.message}"}
        first = studio.engine.status()[0]
        return {**model_updates(info), m["status"]: f"✅ {info.model_name} loaded ({first.device})"}

    def open_tab():
        return gr.Tabs(selected="generate" if studio.info.text_to_image else "edit")

    # The tab change is its own step: a queued event that also outputs to the Tabs leaves a
    # page-wide loading overlay over every button (Gradio 6.31, seen in the browser test).
    m["load"].click(
        ui_load, m["model"], outputs, api_visibility="private", concurrency_id="switch", show_progress_on=[m["status"]]
    ).then(open_tab, None, tabs, api_visibility="private", queue=False)
