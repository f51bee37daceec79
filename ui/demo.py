"""`create_demo(backend, settings)`: the Blocks assembled from the tabs; `launch`; `make_backend`."""

from __future__ import annotations

import logging
from typing import Any

import gradio as gr

from pipelines.backend import GenerationBackend, ModelInfo
from ui import api, edit_tab, generate_tab, history, models, pnginfo_tab, status
from ui.jobs import guard_admissions
from ui.settings import AppSettings
from ui.studio import Studio

log = logging.getLogger("diffusion_anywhere")

CSS = """
#gallery img, #edit-gallery img { image-rendering: pixelated; }  /* 64x64 images upscaled without blur */
#status-panel .prose table { font-size: 0.8em; }
#info-line { min-height: 2.2em; }
"""


def _header(backend: GenerationBackend, info: ModelInfo) -> str:
    replicas = [r for r in backend.status() if r.role == "main"]  # the editor is shown in the status panel
    first = replicas[0]
    devices = first.device if len(replicas) == 1 else f"{len(replicas)} replicas ({first.backend})"
    return (
        f"## Diffusion Anywhere  \n<small>{info.model_name} on {first.device_name} · `{devices}` · "
        f"{first.dtype} · {first.attention} attention</small>"
    )


def create_demo(backend: GenerationBackend, settings: AppSettings | None = None) -> gr.Blocks:
    """Build the Blocks for a ready backend. Launch it with `launch(demo, settings)`."""
    settings = settings or AppSettings()
    studio = Studio(backend, settings)
    age = settings.cache_minutes * 60
    with gr.Blocks(title="Diffusion Anywhere", delete_cache=(min(age, 600), age)) as demo:
        header = gr.Markdown(_header(backend, studio.info))
        picker = models.build(studio)
        with gr.Row(equal_height=False):
            first_tab = "generate" if studio.info.text_to_image else "edit"
            with gr.Column(scale=5), gr.Tabs(selected=first_tab) as tabs:
                with gr.Tab("Generate", id="generate"):
                    g = generate_tab.build(studio)
                with gr.Tab("Edit", id="edit"):
                    e = edit_tab.build(studio)
                with gr.Tab("History", id="history") as history_tab:
                    history_refresh = history.build(studio, g, tabs)
                with gr.Tab("PNG info", id="pnginfo"):
                    pnginfo_tab.build(studio, g, e, tabs)
            with gr.Column(scale=2, min_width=280, elem_id="status-panel"):
                status_md, plot = status.panel()
        generate_tab.wire(studio, g)
        models.wire(studio, picker, g, e, header, tabs, lambda info: _header(studio.backend, info))
        edit_tab.wire(studio, e)

        async def ui_stop(request: gr.Request) -> None:
            await studio.stop(None, request)

        for btn in (g["stop"], e["stop"]):
            btn.click(ui_stop, None, None, api_visibility="private", queue=False)
        api.wire(studio)
        history_tab.select(None, None, None, js=f"() => document.getElementById('{history_refresh.elem_id}').click()")
        # Status: outside the queue, so it keeps updating while a generation runs.
        timer = gr.Timer(settings.status_interval)
        timer.tick(
            studio.status, None, [status_md, plot], api_visibility="private", queue=False, show_progress="hidden"
        )
        demo.load(studio.status, None, [status_md, plot], api_visibility="private", queue=False)
    studio.demo = demo
    demo.studio = studio  # for tests and embedding
    return demo


def launch(demo: gr.Blocks, settings: AppSettings, **kwargs: Any) -> gr.Blocks:
    """One bounded queue for every route (REST included: api_open=False), then launch without blocking."""
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=1, api_open=False)
    guard_admissions(demo, "gpu", settings.queue_per_user, lambda why: log.info("refused: %s", why))
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
    )
    options.update(kwargs)
    demo.launch(**options)
    return demo


def make_backend(settings: AppSettings, model: str | None = None, device: str | None = None) -> GenerationBackend:
    """The in-process device pool (one replica per device), or Ray Serve (GENERATION_BACKEND=ray);
    with an instruction editor for the Edit tab beside it (EDIT_MODEL_ID, `pipelines.editing`)."""
    model = model or settings.pipeline.model_id
    opts = settings.pipeline
    options = dict(lora_dir=opts.lora_dir, max_batch=opts.max_batch, max_pixels=opts.max_pixels, max_side=opts.max_side)
    if settings.generation_backend == "ray":
        from serving.ray_backend import RayBackend

        return RayBackend.start(
            model=model,
            address=settings.ray_address,
            replicas=settings.ray_replicas,
            device=settings.ray_device,
            cpus_per_replica=settings.ray_cpus_per_replica,
            **options,
        )
    from pipelines.editing import EditRouter, default_editor
    from pipelines.pool import DevicePool

    main = DevicePool.from_pretrained(model, devices=device, **options)
    editor = default_editor(model, settings.edit_model_id)
    if editor is None:
        return main
    return EditRouter(main, DevicePool.from_pretrained(editor, devices=device, **options), not settings.edit_model_id)
