"""`create_demo(engine, settings)`: the Blocks assembled from the tabs; `launch`.

The engine (`engine.build_engine`) owns admission, so Gradio's queue only carries events: the
generation events run as soon as they arrive (no Gradio concurrency limit) and wait, if they must,
in the engine's queue, where every front end's jobs are counted together.
"""

from __future__ import annotations

import logging
from typing import Any

import gradio as gr
from starlette.middleware import Middleware

from engine import AppSettings, Engine
from pipelines import ModelInfo
from ui import (
    api,
    edit_tab,
    gallery_sends,
    generate_tab,
    history,
    inpaint_api,
    inpaint_tab,
    models,
    pnginfo_tab,
    status,
    upscale_api,
    upscale_tab,
    video_tab,
)
from ui.positional import PositionalCalls
from ui.studio import Studio

log = logging.getLogger("diffusion_anywhere")

CSS = """
#gallery img, #edit-gallery img, #inpaint-gallery img, #xyz-grid img, #edit-xyz-grid img { image-rendering: pixelated; }  /* 64x64 images upscaled without blur */
#status-panel .prose table { font-size: 0.8em; width: 100%; }
#status-panel .prose th, #status-panel .prose td { overflow-wrap: normal; word-break: normal; hyphens: none; }  /* whole words */
#load-model-btn { align-self: center; }  /* a button's height beside the picker, not the row's */
#info-line { min-height: 2.2em; }
"""


def _header(engine: Engine, info: ModelInfo) -> str:
    replicas = [r for r in engine.status() if r.role == "main"]  # the editor is shown in the status panel
    first = replicas[0]
    devices = first.device if len(replicas) == 1 else f"{len(replicas)} replicas ({first.backend})"
    return (
        f"## Diffusion Anywhere  \n<small>{info.model_name} on {first.device_name} · `{devices}` · "
        f"{first.dtype} · {first.attention} attention</small>"
    )


def create_demo(engine: Engine, settings: AppSettings | None = None) -> gr.Blocks:
    """Build the Blocks for a ready engine. Launch it with `launch(demo, settings)`."""
    settings = settings or AppSettings()
    studio = Studio(engine, settings)
    age = settings.cache_minutes * 60
    with gr.Blocks(title="Diffusion Anywhere", delete_cache=(min(age, 600), age)) as demo:
        header = gr.Markdown(_header(engine, studio.info))
        picker = models.build(studio)
        with gr.Row(equal_height=False):
            first_tab = "generate" if studio.info.text_to_image else "edit"
            with gr.Column(scale=4, min_width=700), gr.Tabs(selected=first_tab) as tabs:  # 1024 px: status under
                with gr.Tab("Generate", id="generate"):
                    g = generate_tab.build(studio)
                with gr.Tab("Edit", id="edit"):
                    e = edit_tab.build(studio)
                with gr.Tab("Inpaint", id="inpaint"):
                    i = inpaint_tab.build(studio)
                with gr.Tab("Video", id="video"):
                    vid = video_tab.build(studio)
                with gr.Tab("Upscale", id="upscale"):
                    u = upscale_tab.build(studio)
                with gr.Tab("History", id="history") as history_tab:
                    history_refresh = history.build(studio, g, i, tabs)
                with gr.Tab("PNG info", id="pnginfo"):
                    pnginfo_tab.build(studio, g, e, i, tabs)
            with gr.Column(scale=1, min_width=300, elem_id="status-panel"):
                status_md, plot = status.panel()
        generate_tab.wire(studio, g)
        tab = {"generate": g, "edit": e, "inpaint": i, "video": vid}
        models.wire(studio, picker, tab, header, tabs, lambda info: _header(engine, info))
        edit_tab.wire(studio, e)
        inpaint_tab.wire(studio, i)
        upscale_tab.wire(studio, u)
        video_tab.wire(studio, vid)
        sends = {"inpaint": gallery_sends.to_inpaint(studio, i, tabs), "controlnet": gallery_sends.to_controlnet(g, tabs),
                 "video": gallery_sends.to_video(vid, tabs), "upscale": gallery_sends.to_upscale(u, tabs)}  # fmt: skip
        gallery_sends.wire(
            [
                gallery_sends.Source(g["gallery"], g["downloads"], 1, {n: g[f"send_{n}"] for n in sends}),
                gallery_sends.Source(e["gallery"], e["downloads"], 2, {n: e[f"send_{n}"] for n in sends}),
                gallery_sends.Source(i["gallery"], i["downloads"], 1, {"upscale": i["send_upscale"]}),
            ],
            sends,
        )

        _wire_stop(studio, [g["stop"], e["stop"], i["stop"], vid["stop"]])
        api.wire(studio)
        inpaint_api.wire(studio)
        upscale_api.wire(studio)
        history_tab.select(None, None, None, js=f"() => document.getElementById('{history_refresh.elem_id}').click()")
        # Status: outside the queue, so it keeps updating while a generation runs.
        timer = gr.Timer(settings.status_interval)
        timer.tick(
            studio.status, None, [status_md, plot], api_visibility="private", queue=False, show_progress="hidden"
        )
        demo.load(studio.status, None, [status_md, plot], api_visibility="private", queue=False)
    studio.demo = demo
    demo.studio = studio  # for tests and embedding
    demo.tabs = tab  # each tab's components by name, its form under "form"
    return demo


def _wire_stop(studio: Studio, buttons: list[gr.Button]) -> None:
    """Every tab's Stop: the caller's running job stops after its step, its queued ones are dropped."""

    def ui_stop(request: gr.Request) -> None:
        studio.stop(None, request)

    for btn in buttons:
        btn.click(ui_stop, None, None, api_visibility="private", queue=False)


def launch(demo: gr.Blocks, settings: AppSettings, **kwargs: Any) -> gr.Blocks:
    """Launch without blocking. Every route is queued (REST included: api_open=False); generations are
    admitted by the engine, so Gradio needs a thread for each one it holds (QUEUE_SIZE waiting plus
    the running ones) besides its own 40. A positional REST call that sends only the values an endpoint
    was first published with is answered as its named call (`ui.positional`). (The HTTP APIs are
    mounted beside it by `app.serve`.)"""
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=1, api_open=False)
    options = dict(
        server_name=settings.server_name,
        server_port=settings.server_port,
        max_file_size=settings.max_file_size,
        enable_monitoring=settings.monitoring,
        auth=settings.users,
        theme=gr.themes.Soft(primary_hue="indigo", secondary_hue="slate"),
        css=CSS,
        show_error=True,
        prevent_thread_lock=True,
        max_threads=40 + settings.queue_size + demo.studio.engine.backend.concurrency,
        app_kwargs={"middleware": [Middleware(PositionalCalls)]},  # short positional REST calls (ui.positional)
    )
    options.update(kwargs)
    return _start(demo, settings, options)


def _start(demo: gr.Blocks, settings: AppSettings, options: dict[str, Any]) -> gr.Blocks:
    """`demo.launch(**options)`, started again when Gradio's start-up probe timed out (`_probe_timed_out`)."""
    for attempt in range(LAUNCH_ATTEMPTS):
        try:
            demo.launch(**options)
            return demo
        except ValueError as error:
            if not _probe_timed_out(error, settings):
                raise
            demo.close(verbose=False)  # the server thread Gradio started before its probe
            if attempt == LAUNCH_ATTEMPTS - 1:
                raise
            log.warning("Gradio's start-up probe of %s timed out (a busy machine); starting again", demo.local_url)
    raise AssertionError("unreachable")


LAUNCH_ATTEMPTS = 3


def _probe_timed_out(error: ValueError, settings: AppSettings) -> bool:
    """Gradio's launch probes its own page (a HEAD with a 3 s timeout, once) and, when that fails, takes
    localhost to be unreachable and raises. On a loopback address localhost is reachable by definition,
    so that error means the probe was slow (seen once in CI on a loaded 2-core machine): the server is
    closed and started again, at most LAUNCH_ATTEMPTS times in all."""
    return settings.loopback and str(error).startswith("When localhost is not accessible")
