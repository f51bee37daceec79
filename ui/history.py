"""The History tab: what this user made, newest first, a page at a time, with reuse and delete.

Read from OUTPUT_DIR (the PNGs carry their parameters): no database. The page's file list stays on
the server (gr.State); the browser only ever names an index on the page it was shown, so nobody
can delete or read a file by naming a path.
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import gradio as gr

from pipelines import read_png_info
from ui import gallery_sends
from ui.send import generate_updates, targets
from ui.studio import Studio

PAGE = 24


MAX_CELL = 2000  # characters of one value shown


def table_cell(value: Any) -> str:
    """A value as one Markdown table cell, shown as it is: HTML and Markdown characters escaped (a
    prompt's `<lora:x:1>` and `(word:1.2)` stay visible), a pipe escaped, and each line break a
    `<br>`, so a multi-line prompt stays in its row instead of breaking the table."""
    text = value if isinstance(value, str) else ", ".join(f"{k}: {v}" for k, v in value.items()) if isinstance(
        value, dict
    ) else str(value)
    if len(text) > MAX_CELL:
        text = text[:MAX_CELL] + "…"
    text = html.escape(text, quote=False)
    text = re.sub(r"([\\`*_\[\]|~#])", r"\\\1", text)
    return "<br>".join(line.strip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))


def params_markdown(info: dict[str, Any], notes: list[str] | None = None) -> str:
    """The parameters read from an image as a two-column table, then the reader's and the form's notes."""
    p = info["parameters"]
    rows = [f"| {k} | {table_cell(v)} |" for k, v in p.items() if k != "extra" and v not in ("", {}, None)]
    text = f"**{info['source']}**\n\n| parameter | value |\n|---|---|\n" + "\n".join(rows)
    return text + "".join(f"\n\n⚠️ {table_cell(n)}" for n in [*info.get("notes", []), *(notes or [])])


def build(studio: Studio, g: dict[str, Any], i: dict[str, Any], tabs: gr.Tabs) -> gr.Button:
    """The tab's layout and events; returns its Refresh button (clicked when the tab opens)."""
    with gr.Row():
        refresh = gr.Button("Refresh", size="sm", elem_id="history-refresh")
        previous = gr.Button("◀ Newer", size="sm")
        following = gr.Button("Older ▶", size="sm")
        where = gr.Markdown(elem_id="history-page")
    gallery = gr.Gallery(label="History", elem_id="history-gallery", columns=6, height=360, format="png")
    details = gr.Markdown(elem_id="history-details")
    clip = gr.Video(label="Clip", elem_id="history-clip", visible=False, autoplay=True, loop=True, height=240)
    with gr.Row():
        sends = {
            "generate": gr.Button("Send to Generate", size="sm", elem_id="history-send"),
            "inpaint": gr.Button("Send to Inpaint", size="sm", elem_id="history-send-inpaint"),
            "controlnet": gr.Button("Send to ControlNet", size="sm", elem_id="history-send-controlnet"),
        }
        delete = gr.Button("Delete", size="sm", variant="stop")
    page, files, selected = gr.State(0), gr.State([]), gr.State(None)

    def show(number: int, request: gr.Request):
        listing = studio.store.history(studio.user(request))
        pages = max(1, -(-len(listing) // PAGE))
        number = min(max(0, number), pages - 1)
        chunk = listing[number * PAGE : (number + 1) * PAGE]
        shown = studio.publish([str(p) for p in chunk])
        label = f"{len(listing)} image(s) · page {number + 1} of {pages}"
        return shown, label, number, [str(p) for p in chunk], None, ""

    def choose(chunk: list[str], evt: gr.SelectData):
        path = Path(chunk[evt.index])
        playable = [p for p in studio.store.clips_of(path) if p.suffix == ".mp4"]  # a video's poster: its clip plays
        shown = gr.update(value=studio.publish([str(playable[0])])[0], visible=True) if playable else gr.update(value=None, visible=False)
        return evt.index, params_markdown(read_png_info(path)), shown

    def remove(number: int, chunk: list[str], index: int | None, request: gr.Request):
        if index is not None:
            for path in [Path(chunk[index]), *studio.store.clips_of(chunk[index])]:
                path.unlink(missing_ok=True)
        return show(number, request)

    listing = [gallery, where, page, files, selected, details]
    events = dict(api_visibility="private", queue=False)

    def newer(number: int, request: gr.Request):
        return show(number - 1, request)

    def older(number: int, request: gr.Request):
        return show(number + 1, request)

    refresh.click(show, page, listing, **events)
    previous.click(newer, page, listing, **events)
    following.click(older, page, listing, **events)
    gallery.select(choose, files, [selected, details, clip], **events)
    _wire_sends(studio, g, i, tabs, sends, files, selected)
    delete.click(remove, [page, files, selected], listing, **events)
    return refresh


def _wire_sends(studio: Studio, g: dict[str, Any], i: dict[str, Any], tabs: gr.Tabs, buttons: dict[str, Any],
                files: gr.State, selected: gr.State) -> None:  # fmt: skip
    """Send the selected image to Generate (its parameters), Inpaint (picture and parameters) or a
    ControlNet unit of Generate (the picture)."""

    def send_to_generate(chunk: list[str], index: int | None):
        if index is None:
            raise gr.Error("select an image first", print_exception=False)
        params = read_png_info(chunk[index])["parameters"]
        return {**generate_updates(params, studio.info, g["form"]), tabs: gr.Tabs(selected="generate")}

    events = dict(api_visibility="private", queue=False)
    buttons["generate"].click(send_to_generate, [files, selected], [*targets(g["form"]), tabs], **events)
    sends = {"inpaint": gallery_sends.to_inpaint(studio, i, tabs), "controlnet": gallery_sends.to_controlnet(g, tabs)}
    for name, target in sends.items():  # the result galleries' targets (ui.gallery_sends), the selected image

        def send(chunk: list[str], index: int | None, *values: Any, target=target):
            return target.handler(None if index is None else chunk[index], *values)

        buttons[name].click(send, [files, selected, *target.inputs], target.outputs, **events)
