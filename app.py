"""Diffusion Anywhere: the Gradio app (entry point, UI assembly and launch).

    python app.py                         # embedded model, best device, http://127.0.0.1:7860
    PREFERRED_DEVICE=npu python app.py    # ask for an Ascend NPU (falls back with a warning)
    PREFERRED_DEVICE=all python app.py    # one replica per device of the best backend

Importing this module reads no setting, loads no model and probes no device: `main()` reads the
settings (`ui.settings`, validated before anything loads), builds the generation backend and the
UI with `create_demo(backend, settings)`. The UI talks only to a `GenerationBackend`.
"""

from __future__ import annotations

try:  # ZeroGPU Spaces: `spaces` must be imported before anything touches CUDA
    import spaces
except ImportError:
    spaces = None

import argparse
import json
import logging
import sys
from typing import Any

import gradio as gr

from pipelines import GenerationRequest, GenerationResult, OutOfMemoryError, PipelineError
from pipelines.backend import GenerationBackend, ModelInfo
from ui import inputs
from ui.jobs import JobRunner, caller_key, caller_load, drop_queued
from ui.outputs import OutputStore
from ui.settings import AppSettings, SettingsError
from ui.status import MemoryHistory, status_json, status_markdown

log = logging.getLogger("diffusion_anywhere")

CSS = """
#gallery img, #edit-gallery img { image-rendering: pixelated; }  /* 64x64 images upscaled without blur */
#status-panel .prose table { font-size: 0.8em; }
#info-line { min-height: 2.2em; }
"""


def gpu(fn):
    """`spaces.GPU` on Hugging Face ZeroGPU; the function itself everywhere else."""
    return spaces.GPU(duration=120)(fn) if spaces is not None else fn


def refuse(message: str) -> gr.Error:
    """A refused request: one log line, the message to the caller, no traceback anywhere."""
    log.info("refused: %s", message)
    return gr.Error(message, print_exception=False)


def info_line(result: GenerationResult) -> str:
    t = result.timings
    peak = f"{result.peak_memory / 2**20:.1f} MiB" if result.peak_memory else "n/a"
    text = (
        f"{len(result.images)} image(s) in {t['total']:.2f} s · {t['steps_per_second']:.1f} it/s · "
        f"peak {peak} · {result.device} · {result.dtype} · {result.attention}"
    )
    if result.warnings:
        text += " · ⚠️ " + "; ".join(result.warnings)
    return text


def vocabulary_markdown(vocab: dict[str, Any]) -> str:
    if not vocab.get("pattern"):
        return ""
    return (
        "**This model only knows its own small world.** Prompt pattern: "
        f"`{vocab['pattern']}`  \n"
        f"colors: {', '.join(vocab.get('colors', []))}  \n"
        f"shapes: {', '.join(vocab.get('shapes', []))}"
    )


class Studio:
    """The handlers behind the UI and the API: parse, admit, run, save, answer."""

    def __init__(self, backend: GenerationBackend, settings: AppSettings):
        self.backend = backend
        self.settings = settings
        self.info: ModelInfo = backend.model_info()
        self.limits = inputs.Limits(
            self.info, settings.max_prompt_chars, settings.max_edit_files, settings.max_upload_pixels
        )
        self.runner = JobRunner(backend, settings.time_budget)
        self.store = OutputStore.from_settings(settings.output_dir, settings.output_max_gb, settings.output_max_days)
        self.history = MemoryHistory(settings.history_seconds)
        self.demo: gr.Blocks | None = None

    # ---------------------------------------------------------------- admission
    def admission(self, request: gr.Request | None, n_inputs: int) -> list[dict]:
        """Gradio validator, run when a call joins the queue: one caller may hold QUEUE_PER_USER places."""
        key = caller_key(request)
        limit = self.settings.queue_per_user
        ok = self.demo is None or caller_load(self.demo, key) < limit
        message = "" if ok else f"you already have {limit} generation(s) queued or running (QUEUE_PER_USER)"
        if not ok:
            log.info("refused: %s for %s", message, key.split(":")[0])
        return [gr.validate(ok, message)] + [gr.validate(True, "")] * (n_inputs - 1)

    @staticmethod
    def job_id(request: gr.Request | None) -> str:
        """The id `/stop` takes: the session, which for a plain REST call is its own event id."""
        return getattr(request, "session_hash", None) or "anonymous"

    # ---------------------------------------------------------------- running
    def run(self, req: GenerationRequest, job_id: str, progress: gr.Progress | None) -> GenerationResult:
        total_images = req.total_images

        def report(step: int, total: int, _image: int) -> None:
            if progress is not None:
                progress(step / max(total, 1), desc=f"{total_images} image(s): step {step}/{total}")

        try:
            return _run_on_device(self.runner, req, job_id, report)
        except OutOfMemoryError as exc:
            if exc.partial is None or not exc.partial.images:
                raise refuse(str(exc)) from exc
            gr.Warning(str(exc))  # keep what finished: show it, with the reason it stopped
            exc.partial.warnings.append(str(exc))
            return exc.partial
        except (PipelineError, ValueError) as exc:
            raise refuse(str(exc)) from exc
        except Exception as exc:  # never a traceback or a server path in the browser; the log keeps it
            log.exception("generation failed")
            raise gr.Error(f"generation failed ({type(exc).__name__}); the server log has the details") from exc

    def save(self, result: GenerationResult) -> list[str]:
        """Write the PNGs; hand Gradio the files (it serves its own copies, only to this caller)."""
        saved = self.store.save(result)
        if saved.warning:
            result.warnings.append(saved.warning)
            gr.Warning(saved.warning)
        return saved.paths

    def generate(self, raw: dict[str, Any], request: gr.Request | None, progress: gr.Progress | None):
        job_id = self.job_id(request)
        try:
            req = inputs.generation_request(raw, self.limits)
        except ValueError as exc:
            raise refuse(str(exc)) from exc
        result = self.run(req, job_id, progress)
        paths = self.save(result)
        gallery = [(p, f"seed {s}") for p, s in zip(paths, result.seeds, strict=True)]
        return gallery, result, paths

    def edit(self, raw: dict[str, Any], files: Any, request: gr.Request | None, progress: gr.Progress | None):
        job_id = self.job_id(request)
        try:
            images = inputs.open_images(inputs.upload_paths(files, self.limits), self.limits)
            req = inputs.generation_request(raw, self.limits, init_images=images)
        except ValueError as exc:
            raise refuse(str(exc)) from exc
        result = self.run(req, job_id, progress)
        paths = self.save(result)
        pairs: list[tuple[Any, str]] = []
        for i, (path, src, s) in enumerate(zip(paths, result.inputs, result.seeds, strict=True)):
            pairs += [(src, f"input {i + 1}"), (path, f"result {i + 1} · seed {s}")]
        return pairs, result, paths

    async def stop(self, job_id: str | None, request: gr.Request | None) -> dict[str, int]:
        """Stop the caller's running job after its step and drop its queued ones.

        Without `job_id` it is the caller's session; a REST caller passes the event id that
        `POST /gradio_api/call/generate` returned to it.
        """
        target = (job_id or "").strip() or getattr(request, "session_hash", None)
        if not target:
            return {"running": 0, "queued": 0}
        dropped = await drop_queued(self.demo, target) if self.demo is not None else 0
        return {"running": int(self.runner.stop(target)), "queued": dropped}

    # ---------------------------------------------------------------- status
    def status(self):
        replicas = self.backend.status()
        return status_markdown(replicas, self.warnings(), self.settings.zero_gpu), self.history.sample(replicas)

    def warnings(self) -> list[str]:
        notes = []
        if self.settings.server_name not in ("127.0.0.1", "localhost", "::1") and not self.settings.on_spaces:
            notes.append(f"listening on {self.settings.server_name} without sign-in: anyone on the network can use it")
        return notes


@gpu
def _run_on_device(runner: JobRunner, req: GenerationRequest, job_id: str, progress) -> GenerationResult:
    return runner.run(req, job_id, progress)


# ------------------------------------------------------------------ the UI
def _header(backend: GenerationBackend, info: ModelInfo) -> str:
    replicas = backend.status()
    first = replicas[0]
    devices = first.device if len(replicas) == 1 else f"{len(replicas)} replicas ({first.backend})"
    return (
        f"## Diffusion Anywhere  \n<small>{info.model_name} on {first.device_name} · `{devices}` · "
        f"{first.dtype} · {first.attention} attention</small>"
    )


def _sampling_controls(info: ModelInfo) -> dict[str, Any]:
    """Steps, guidance and size with the model's defaults and exactly the limits the server enforces."""
    step = info.size_multiple
    return {
        "steps": gr.Slider(1, 150, value=info.default_steps, step=1, label="Steps"),
        "guidance_scale": gr.Slider(0, 50, value=info.default_guidance, step=0.5, label="Guidance (CFG)"),
        "width": gr.Slider(step, info.max_side, value=info.default_width, step=step, label="Width"),
        "height": gr.Slider(step, info.max_side, value=info.default_height, step=step, label="Height"),
    }


def _generate_tab(studio: Studio) -> dict[str, Any]:
    info = studio.info
    examples = list(info.examples) or ["an astronaut riding a horse, photograph", "a watercolor fox in the snow"]
    c: dict[str, Any] = {}
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            c["prompt"] = gr.Textbox(
                label="Prompt", lines=2, elem_id="prompt", placeholder=examples[0], info="one prompt per line"
            )
            if info.vocabulary:
                gr.Markdown(vocabulary_markdown(info.vocabulary), elem_id="vocabulary")
            c["negative_prompt"] = gr.Textbox(value="", label="Negative prompt", lines=1)
            c["num_images"] = gr.Slider(
                1, info.max_batch, value=min(4, info.max_batch), step=1, label="Number of images", elem_id="num-images"
            )
            with gr.Row():
                c["seed"] = gr.Number(label="Seed", value=0, precision=0, minimum=-1, min_width=100)
                c["random_seed"] = gr.Checkbox(label="Random seed", value=True, min_width=100)
            with gr.Row():
                c["run"] = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                c["stop"] = gr.Button("Stop", variant="stop", elem_id="stop-btn")
            with gr.Accordion("Advanced", open=False):
                c.update(_sampling_controls(info))
                c["loras"] = gr.CheckboxGroup(
                    list(info.loras), label="LoRAs", visible=bool(info.loras), info="from the server's LoRA folder"
                )
                c["scales"] = [
                    gr.Slider(-2, 2, value=1.0, step=0.05, label=f"{n} scale", visible=False) for n in info.loras
                ]
        with gr.Column(scale=3, min_width=360):
            c["gallery"] = gr.Gallery(
                label="Images", elem_id="gallery", columns=4, height=430, format="png",
                object_fit="contain", buttons=["download", "fullscreen"],
            )  # fmt: skip
            c["info"] = gr.Markdown(elem_id="info-line")
            c["downloads"] = gr.File(label="PNG downloads (with metadata)", file_count="multiple", height=80)
            c["info_json"] = gr.JSON(visible=False)
    gr.Examples([[e] for e in examples], inputs=[c["prompt"]], label="Examples")
    return c


def _edit_tab(studio: Studio) -> dict[str, Any]:
    info = studio.info
    c: dict[str, Any] = {}
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            c["files"] = gr.File(label="Input images", file_count="multiple", file_types=["image"], height=140)
            c["prompt"] = gr.Textbox(label="Instruction / prompt", lines=2, placeholder=(info.examples or ("",))[0])
            c["strength"] = gr.Slider(
                0.05, 1.0, value=0.6, step=0.05, label="Strength", info="how much of each input is re-drawn"
            )
            c["num_images"] = gr.Slider(1, info.max_batch, value=1, step=1, label="Images per input")
            with gr.Row():
                c["seed"] = gr.Number(label="Seed", value=0, precision=0, minimum=-1)
                c["random_seed"] = gr.Checkbox(label="Random seed", value=True)
            with gr.Accordion("Advanced", open=False):
                controls = _sampling_controls(info)
                c["steps"], c["guidance_scale"] = controls["steps"], controls["guidance_scale"]
            with gr.Row():
                c["run"] = gr.Button("Edit", variant="primary", elem_id="edit-btn")
                c["stop"] = gr.Button("Stop", variant="stop")
        with gr.Column(scale=3, min_width=360):
            c["gallery"] = gr.Gallery(
                label="Inputs and results", elem_id="edit-gallery", columns=4, height=430, format="png",
                buttons=["download", "fullscreen"],
            )  # fmt: skip
            c["info"] = gr.Markdown()
            c["downloads"] = gr.File(label="PNG downloads", file_count="multiple", height=80)
    return c


def _status_panel() -> tuple[gr.Markdown, gr.LinePlot]:
    gr.Markdown("### Device & memory")
    status_md = gr.Markdown(elem_id="status")
    plot = gr.LinePlot(
        x="seconds", y="MiB", color="memory", height=220, x_title="seconds ago", y_title="MiB",
        label="Memory, last minutes", elem_id="memory-plot",
    )  # fmt: skip
    return status_md, plot


def _wire_generate(studio: Studio, g: dict[str, Any]) -> None:
    """Generate button: `v` maps each input component to its value (no coupling to argument order)."""
    names = ("prompt", "negative_prompt", "num_images", "steps", "guidance_scale", "width", "height", "seed")
    lora_names = list(studio.info.loras)

    def ui_generate(v: dict, request: gr.Request, progress=gr.Progress()):
        raw = {name: v[g[name]] for name in names}
        chosen = v[g["loras"]] or []
        raw["loras"] = {n: v[s] for n, s in zip(lora_names, g["scales"], strict=True) if n in chosen}
        raw["random_seed"] = v[g["random_seed"]]
        gallery, result, paths = studio.generate(raw, request, progress)
        return gallery, info_line(result), paths, result.info()

    def admit(v: dict, request: gr.Request):
        return studio.admission(request, len(v))

    for name, slider in zip(lora_names, g["scales"], strict=True):
        g["loras"].change(
            lambda c, n=name: gr.update(visible=n in (c or [])), g["loras"], slider,
            api_visibility="private", queue=False,
        )  # fmt: skip
    g["run"].click(
        ui_generate,
        {*(g[n] for n in names), g["random_seed"], g["loras"], *g["scales"]},
        [g["gallery"], g["info"], g["downloads"], g["info_json"]],
        validator=admit,
        api_visibility="private",
        concurrency_id="gpu",
        concurrency_limit=studio.backend.concurrency,
    )


def _wire_edit(studio: Studio, e: dict[str, Any]) -> None:
    names = ("prompt", "strength", "num_images", "steps", "guidance_scale", "seed", "random_seed")

    def ui_edit(files, prompt, strength, num_images, steps, guidance, seed, random_seed, request: gr.Request,
                progress=gr.Progress()):  # fmt: skip
        values = dict(zip(names, (prompt, strength, num_images, steps, guidance, seed, random_seed), strict=True))
        raw = {**values, "width": studio.info.default_width, "height": studio.info.default_height}
        pairs, result, paths = studio.edit(raw, files, request, progress)
        return pairs, info_line(result), paths

    def admit(files, prompt, strength, num_images, steps, guidance, seed, random_seed, request: gr.Request):
        return studio.admission(request, 1 + len(names))

    e["run"].click(
        ui_edit,
        [e["files"], *(e[n] for n in names)],
        [e["gallery"], e["info"], e["downloads"]],
        validator=admit,
        api_name="edit",
        concurrency_id="gpu",
        concurrency_limit=studio.backend.concurrency,
    )


def _wire_api(studio: Studio) -> None:
    """The public API: keyword parameters taken as raw JSON (checked by ui.inputs, not by UI sliders)."""

    def api_generate(
        prompt: str,
        negative_prompt: str,
        num_images: Any,
        steps: Any,
        guidance_scale: Any,
        width: Any,
        height: Any,
        seed: Any,
        loras: Any,
        request: gr.Request,
        progress=gr.Progress(),
    ):
        """Generate images. seed < 0 means random; loras maps LoRA names to scales."""
        raw = dict(prompt=prompt, negative_prompt=negative_prompt, num_images=num_images, steps=steps,
                   guidance_scale=guidance_scale, width=width, height=height, seed=seed, loras=loras)  # fmt: skip
        gallery, result, _ = studio.generate(raw, request, progress)
        return gallery, result.info()

    def admit(prompt, negative_prompt, num_images, steps, guidance_scale, width, height, seed, loras,
              request: gr.Request):  # fmt: skip
        return studio.admission(request, 9)

    info = studio.info
    defaults = [("", "Prompt"), ("", "Negative prompt")]
    numbers = [(4, "num_images"), (info.default_steps, "steps"), (info.default_guidance, "guidance_scale"),
               (info.default_width, "width"), (info.default_height, "height"), (-1, "seed (-1: random)"),
               ({}, "loras (name -> scale)")]  # fmt: skip
    api_inputs = [gr.Textbox(value=v, label=label, visible=False) for v, label in defaults]
    api_inputs += [gr.JSON(value=json.dumps(v), label=label, visible=False) for v, label in numbers]
    api_btn = gr.Button(visible=False)
    api_btn.click(
        api_generate,
        api_inputs,
        [gr.Gallery(visible=False, format="png"), gr.JSON(visible=False)],
        validator=admit,
        api_name="generate",
        concurrency_id="gpu",
        concurrency_limit=studio.backend.concurrency,
    )
    job_id = gr.Textbox(value="", visible=False, label="job_id")
    stopped = gr.JSON(visible=False)

    async def stop(job_id: str, request: gr.Request) -> dict[str, int]:
        """Stop a generation: the caller's session, or the REST job whose event id is `job_id`."""
        return await studio.stop(job_id, request)

    gr.Button(visible=False).click(stop, job_id, stopped, api_name="stop", queue=False)
    def status() -> dict:
        """Every replica's device, dtype, attention, memory and what it does now."""
        return status_json(studio.backend.status())

    gr.api(status, api_name="status", queue=False)


def create_demo(backend: GenerationBackend, settings: AppSettings | None = None) -> gr.Blocks:
    """Build the Blocks for a ready backend. Launch it with `launch(demo, settings)`."""
    settings = settings or AppSettings()
    studio = Studio(backend, settings)
    age = settings.cache_minutes * 60
    with gr.Blocks(title="Diffusion Anywhere", delete_cache=(min(age, 600), age)) as demo:
        gr.Markdown(_header(backend, studio.info))
        with gr.Row(equal_height=False):
            with gr.Column(scale=5), gr.Tabs():
                with gr.Tab("Generate"):
                    g = _generate_tab(studio)
                with gr.Tab("Edit"):
                    e = _edit_tab(studio)
            with gr.Column(scale=2, min_width=280, elem_id="status-panel"):
                status_md, plot = _status_panel()
        _wire_generate(studio, g)
        _wire_edit(studio, e)

        async def ui_stop(request: gr.Request) -> None:
            await studio.stop(None, request)

        for btn in (g["stop"], e["stop"]):
            btn.click(ui_stop, None, None, api_visibility="private", queue=False)
        _wire_api(studio)
        # Status: outside the queue, so it keeps updating while a generation runs.
        timer = gr.Timer(settings.status_interval)
        timer.tick(studio.status, None, [status_md, plot], api_visibility="private", queue=False, show_progress="hidden")
        demo.load(studio.status, None, [status_md, plot], api_visibility="private", queue=False)
    studio.demo = demo
    demo.studio = studio  # for tests and embedding
    return demo


def launch(demo: gr.Blocks, settings: AppSettings, **kwargs: Any) -> gr.Blocks:
    """One bounded queue for every route (REST included: api_open=False), then launch without blocking."""
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=1, api_open=False)
    options = dict(
        server_name=settings.server_name,
        server_port=settings.server_port,
        max_file_size=settings.max_file_size,
        enable_monitoring=settings.monitoring,
        theme=gr.themes.Soft(primary_hue="indigo", secondary_hue="slate"),
        css=CSS,
        show_error=True,
        prevent_thread_lock=True,
    )
    options.update(kwargs)
    demo.launch(**options)
    return demo


def make_backend(settings: AppSettings, model: str | None = None, device: str | None = None) -> GenerationBackend:
    """The in-process device pool, or a Ray Serve deployment (GENERATION_BACKEND=ray)."""
    model = model or settings.model_id
    device = device if device is not None else settings.preferred_device
    options = dict(lora_dir=settings.lora_dir, max_batch=settings.max_batch)
    if settings.generation_backend == "ray":
        from serving.ray_backend import RayBackend

        return RayBackend.start(model=model, address=settings.ray_address, devices=device, **options)
    from pipelines.pool import DevicePool

    return DevicePool.from_pretrained(model, devices=device, **options)


def _check_settings(argv: list[str] | None) -> tuple[AppSettings, argparse.Namespace]:
    """Read and validate every setting before anything heavy happens; exit 2 with the message otherwise."""
    from devices.options import DeviceOptions
    from pipelines.options import PipelineOptions

    try:
        settings = AppSettings.from_env()
        PipelineOptions.from_env()
        DeviceOptions.resolve()
    except (SettingsError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    parser = argparse.ArgumentParser(description="Diffusion Anywhere web app")
    parser.add_argument("--model", default=settings.model_id, help="diffusers folder, Hub id or .safetensors")
    parser.add_argument("--device", default=settings.preferred_device, help="auto|cpu|cuda[:N]|npu[:N]|all|cuda:0,cuda:1")
    parser.add_argument("--port", type=int, default=settings.server_port)
    parser.add_argument("--host", default=settings.server_name)
    args = parser.parse_args(argv)
    return settings.replace(server_port=args.port, server_name=args.host), args


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings, args = _check_settings(argv)
    for noisy in ("httpx", "diffusers", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from pipelines.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    backend = make_backend(settings, args.model, args.device)
    demo = launch(create_demo(backend, settings), settings)
    first = backend.status()[0]
    log.info(
        "ready at %s | device %s (%s) x%d | dtype %s | attention %s | model %s",
        demo.local_url, first.device, first.device_name, len(backend.status()), first.dtype,
        first.attention, backend.model_info().model_name,
    )  # fmt: skip
    demo.block_thread()


if __name__ == "__main__":
    main()
