"""Diffusion Anywhere: the Gradio app (UI and launch only).

    python app.py                         # embedded model, best device, http://127.0.0.1:7860
    PREFERRED_DEVICE=npu python app.py    # ask for an Ascend NPU (falls back with a warning)

Importing this module loads no model and probes no device: `main()` does, then builds the
UI with `create_demo(pipeline, device_manager)`. The UI only calls `ImagePipeline` and
`DeviceManager`; domain errors become `gr.Error` with the pipeline layer's message.
"""

from __future__ import annotations

import os

try:  # ZeroGPU Spaces: `spaces` must be imported before anything touches CUDA
    import spaces
except ImportError:
    spaces = None

import argparse
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gradio as gr
import pandas as pd

from devices import DeviceManager
from devices.memory import human_bytes
from pipelines import GenerationRequest, GenerationResult, ImagePipeline, OutOfMemoryError, PipelineError, save_images
from pipelines.loading import quiet_load_progress_bars
from pipelines.options import DEFAULT_LORA_DIR, DEFAULT_MODEL

log = logging.getLogger("diffusion_anywhere")

ON_SPACES = bool(os.environ.get("SPACE_ID"))
ON_ZERO_GPU = os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "true")


@dataclass(frozen=True)
class AppSettings:
    """Settings of the app, read from the environment once (see README for each)."""

    model_id: str = str(DEFAULT_MODEL)
    lora_dir: Path = DEFAULT_LORA_DIR
    preferred_device: str | None = None
    max_batch: int = 16
    output_dir: Path = Path("outputs")
    server_name: str = "127.0.0.1"
    server_port: int = 7860
    queue_size: int = 16
    max_file_size: str = "10mb"
    status_interval: float = 2.0
    history_seconds: int = 300

    @classmethod
    def from_env(cls) -> AppSettings:
        env = os.environ
        return cls(
            model_id=env.get("MODEL_ID") or str(DEFAULT_MODEL),
            lora_dir=Path(env.get("LORA_DIR") or DEFAULT_LORA_DIR),
            preferred_device=env.get("PREFERRED_DEVICE") or None,
            max_batch=int(env.get("MAX_BATCH") or 16),
            output_dir=Path(env.get("OUTPUT_DIR") or "outputs").resolve(),
            server_name=env.get("GRADIO_SERVER_NAME") or ("0.0.0.0" if ON_SPACES else "127.0.0.1"),
            server_port=int(env.get("GRADIO_SERVER_PORT") or 7860),
            queue_size=int(env.get("QUEUE_SIZE") or 16),
            max_file_size=env.get("MAX_FILE_SIZE") or "10mb",
        )


SETTINGS = AppSettings.from_env()

CSS = """
#gallery img, #edit-gallery img { image-rendering: pixelated; }  /* 64x64 images upscaled without blur */
#status-panel .prose table { font-size: 0.85em; }
#info-line { min-height: 2.2em; }
"""


def gpu(fn):
    """`spaces.GPU` on Hugging Face ZeroGPU; the function itself everywhere else."""
    return spaces.GPU(duration=120)(fn) if spaces is not None else fn


# ------------------------------------------------------------------ status panel
@dataclass
class MemoryHistory:
    """Last few minutes of memory samples for the plot (one sample per second at most)."""

    seconds: int = 300
    samples: deque = field(default_factory=lambda: deque(maxlen=600))
    lock: threading.Lock = field(default_factory=threading.Lock)

    def sample(self, stats: dict[str, Any]) -> pd.DataFrame:
        now = time.time()
        with self.lock:
            if not self.samples or now - self.samples[-1][0] >= 1.0:
                device = stats["allocated"] if stats["backend"] != "cpu" else None
                self.samples.append((now, device, stats["host_rss"]))
            rows = []
            for t, device, host in self.samples:
                if now - t > self.seconds:
                    continue
                age = round(t - now, 1)
                if device is not None:
                    rows.append({"seconds": age, "MiB": device / 2**20, "memory": "device allocated"})
                rows.append({"seconds": age, "MiB": host / 2**20, "memory": "process RSS"})
        return pd.DataFrame(rows, columns=["seconds", "MiB", "memory"])


def status_markdown(dm: DeviceManager, stats: dict[str, Any]) -> str:
    h = human_bytes
    lines = [
        f"**{dm.device_name}**",
        "",
        f"| device | `{dm.device}` ({dm.backend}) |",
        "|---|---|",
        f"| dtype | {str(dm.dtype).removeprefix('torch.')} |",
        f"| attention | {dm.attention} |",
    ]
    if ON_ZERO_GPU:
        lines.append("| GPU memory | allocated per call on ZeroGPU: no resident figures between calls |")
    elif dm.backend == "cpu":
        lines += [
            f"| process memory | {h(stats['allocated'])} |",
            f"| peak | {h(stats['peak'])} |",
        ]
    else:
        lines += [
            f"| allocated | {h(stats['allocated'])} |",
            f"| reserved | {h(stats['reserved'])} |",
            f"| peak | {h(stats['peak'])} |",
            f"| free / total | {h(stats['free'])} / {h(stats['total'])} |",
        ]
    lines.append(f"| host RAM | {h(stats['host_available'])} free of {h(stats['host_total'])} |")
    if dm.fallback_reason:
        lines += ["", f"⚠️ requested `{dm.requested}` not usable: {dm.fallback_reason}"]
    lines += ["", f"<small>live · updated {time.strftime('%H:%M:%S')}</small>"]
    return "\n".join(lines)


# ------------------------------------------------------------------ results
def info_line(result: GenerationResult) -> str:
    t = result.timings
    text = (
        f"{len(result.images)} image(s) in {t['total']:.2f} s · {t['steps_per_second']:.1f} it/s · "
        f"peak {human_bytes(result.peak_memory)} · {result.device} · {result.dtype} · {result.attention}"
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


class Generator:
    """Runs requests for the UI and the API; one cancel flag per browser session."""

    def __init__(self, pipeline: ImagePipeline, settings: AppSettings):
        self.pipeline = pipeline
        self.settings = settings
        self._cancel: dict[str, threading.Event] = {}

    def stop(self, session: str) -> None:
        """Ask this session's running generation to stop after its current step."""
        flag = self._cancel.get(session)
        if flag is not None:
            flag.set()

    def run(self, req: GenerationRequest, session: str, progress: gr.Progress | None) -> GenerationResult:
        flag = self._cancel[session] = threading.Event()
        total_images = req.total_images

        def report(step: int, total: int, image_index: int) -> None:
            if progress is not None:
                progress(step / max(total, 1), desc=f"{total_images} image(s): step {step}/{total}")

        try:
            return _run_on_device(self.pipeline, req, report, flag.is_set)
        except OutOfMemoryError as exc:
            if exc.partial is None or not exc.partial.images:
                raise gr.Error(str(exc)) from exc
            gr.Warning(str(exc))  # keep what finished: show it, with the reason it stopped
            exc.partial.warnings.append(str(exc))
            return exc.partial
        except (PipelineError, ValueError) as exc:
            raise gr.Error(str(exc)) from exc
        except Exception as exc:  # never a traceback in the browser; the log keeps it
            log.exception("generation failed")
            raise gr.Error(f"generation failed: {type(exc).__name__}: {exc}") from exc
        finally:
            self._cancel.pop(session, None)

    def save(self, result: GenerationResult) -> list[str]:
        folder = self.settings.output_dir / time.strftime("%Y-%m-%d")
        return [str(p) for p in save_images(result, folder, prefix=time.strftime("%H%M%S"))]


@gpu
def _run_on_device(pipeline: ImagePipeline, req: GenerationRequest, progress, should_cancel) -> GenerationResult:
    return pipeline.generate(req, progress=progress, should_cancel=should_cancel)


def _prompts(text: str | None) -> str | list[str]:
    """One prompt per non-empty line; "" stays "" so that validation names it."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return lines[0] if len(lines) == 1 else lines or ""


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def _seed(seed: float | None, random_seed: bool) -> int | None:
    if random_seed or seed is None or seed < 0:
        return None
    return int(seed)


def _gallery(paths: list[str], result: GenerationResult) -> list[tuple[str, str]]:
    return [(p, f"seed {s}") for p, s in zip(paths, result.seeds, strict=True)]


# ------------------------------------------------------------------ the UI
def create_demo(pipeline: ImagePipeline, device_manager: DeviceManager, settings: AppSettings = SETTINGS) -> gr.Blocks:
    """Build the Blocks for a loaded pipeline. Launch it with `demo.queue(...).launch(...)`."""
    dm = device_manager
    gen = Generator(pipeline, settings)
    history = MemoryHistory(settings.history_seconds)
    vocab = pipeline.vocabulary
    default_w, default_h = pipeline.default_size
    size_step = pipeline.size_multiple
    max_batch = min(settings.max_batch, pipeline.options.max_batch)
    default_steps = int(vocab.get("default_steps", 30))
    default_cfg = float(vocab.get("default_guidance_scale", 7.0))
    lora_names = sorted(pipeline.loras.available())
    examples = vocab.get("examples") or ["an astronaut riding a horse, photograph", "a watercolor fox in the snow"]

    def make_request(
        prompt, negative, num_images, steps, guidance, width, height, seed, loras, images=None, strength=0.6
    ) -> GenerationRequest:
        return GenerationRequest(
            prompt=_prompts(prompt),
            negative_prompt=negative or None,
            num_images=int(num_images),
            steps=int(steps),
            guidance_scale=float(guidance),
            width=int(width),
            height=int(height),
            seed=seed,
            init_images=images,
            strength=float(strength),
            loras=loras,
        )

    def ui_generate(v: dict, request: gr.Request, progress=gr.Progress()):
        """UI click: `v` maps each input component to its value (no coupling to argument order)."""
        chosen_loras = v[chosen] or []
        loras = {
            name: float(v[slider]) for name, slider in zip(lora_names, scales, strict=True) if name in chosen_loras
        }
        seed_value = _seed(v[seed], v[random_seed])
        req = make_request(
            v[prompt], v[negative], v[num_images], v[steps], v[guidance], v[width], v[height], seed_value, loras
        )
        result = gen.run(req, _session(request), progress)
        paths = gen.save(result)
        return _gallery(paths, result), info_line(result), paths, result.info()

    def api_generate(
        prompt: str,
        negative_prompt: str,
        num_images: int,
        steps: int,
        guidance_scale: float,
        width: int,
        height: int,
        seed: int,
        loras: dict | None,
        request: gr.Request,
        progress=gr.Progress(),
    ):
        """Generate images. seed < 0 means random; loras maps LoRA names to scales."""
        req = make_request(
            prompt,
            negative_prompt,
            num_images,
            steps,
            guidance_scale,
            width,
            height,
            _seed(seed, False),
            {k: float(v) for k, v in (loras or {}).items()},
        )
        result = gen.run(req, _session(request), progress)
        paths = gen.save(result)
        return _gallery(paths, result), result.info()

    def ui_edit(
        files,
        prompt,
        strength,
        num_images,
        steps,
        guidance,
        seed,
        random_seed,
        request: gr.Request,
        progress=gr.Progress(),
    ):
        from PIL import Image

        if not files:
            raise gr.Error("upload at least one image to edit")
        images = []
        for f in files:
            try:
                with Image.open(f) as im:
                    images.append(im.convert("RGB"))
            except OSError as exc:
                raise gr.Error(f"{Path(f).name} is not an image: {exc}") from exc
        req = make_request(
            prompt,
            "",
            num_images,
            steps,
            guidance,
            default_w,
            default_h,
            _seed(seed, random_seed),
            {},
            images=images,
            strength=strength,
        )
        result = gen.run(req, _session(request), progress)
        paths = gen.save(result)
        pairs: list[tuple[Any, str]] = []
        for i, (path, src, s) in enumerate(zip(paths, result.inputs, result.seeds, strict=True)):
            pairs += [(src, f"input {i + 1}"), (path, f"result {i + 1} · seed {s}")]
        return pairs, info_line(result), paths

    def stop(request: gr.Request) -> None:
        """Stop this session's running generation after the current step."""
        gen.stop(_session(request))

    def status():
        stats = dm.memory_stats()
        return status_markdown(dm, stats), history.sample(stats)

    def api_status() -> dict:
        """DeviceManager.memory_stats() plus device, dtype and attention."""
        return {
            **dm.memory_stats(),
            "device": str(dm.device),
            "dtype": str(dm.dtype).removeprefix("torch."),
            "attention": dm.attention,
            "fallback_reason": dm.fallback_reason,
        }

    with gr.Blocks(title="Diffusion Anywhere") as demo:
        gr.Markdown(
            f"## Diffusion Anywhere  \n<small>{pipeline.model_name} on {dm.device_name} · "
            f"`{dm.device}` · {str(dm.dtype).removeprefix('torch.')} · {dm.attention} attention</small>"
        )
        with gr.Row(equal_height=False):
            with gr.Column(scale=5), gr.Tabs():
                with gr.Tab("Generate"):
                    with gr.Row(equal_height=False):
                        with gr.Column(scale=2, min_width=300):
                            prompt = gr.Textbox(
                                label="Prompt",
                                lines=2,
                                elem_id="prompt",
                                placeholder=examples[0],
                                info="one prompt per line",
                            )
                            if vocab:
                                gr.Markdown(vocabulary_markdown(vocab), elem_id="vocabulary")
                            negative = gr.Textbox(value="", label="Negative prompt", lines=1)
                            num_images = gr.Slider(
                                1,
                                max_batch,
                                value=min(4, max_batch),
                                step=1,
                                label="Number of images",
                                elem_id="num-images",
                            )
                            with gr.Row():
                                seed = gr.Number(label="Seed", value=0, precision=0, minimum=-1, min_width=100)
                                random_seed = gr.Checkbox(label="Random seed", value=True, min_width=100)
                            with gr.Row():
                                run_btn = gr.Button("Generate", variant="primary", elem_id="generate-btn")
                                stop_btn = gr.Button("Stop", variant="stop", elem_id="stop-btn")
                            with gr.Accordion("Advanced", open=False):
                                steps = gr.Slider(1, 150, value=default_steps, step=1, label="Steps")
                                guidance = gr.Slider(0, 20, value=default_cfg, step=0.5, label="Guidance (CFG)")
                                width = gr.Slider(size_step * 4, 2048, value=default_w, step=size_step, label="Width")
                                height = gr.Slider(size_step * 4, 2048, value=default_h, step=size_step, label="Height")
                                chosen = gr.CheckboxGroup(
                                    lora_names,
                                    label="LoRAs",
                                    visible=bool(lora_names),
                                    info=f"from {pipeline.loras.lora_dir}",
                                )
                                scales = [
                                    gr.Slider(-2, 2, value=1.0, step=0.05, label=f"{n} scale", visible=False)
                                    for n in lora_names
                                ]
                        with gr.Column(scale=3, min_width=360):
                            gallery = gr.Gallery(
                                label="Images",
                                elem_id="gallery",
                                columns=4,
                                height=430,
                                format="png",
                                object_fit="contain",
                                buttons=["download", "fullscreen"],
                            )
                            info = gr.Markdown(elem_id="info-line")
                            downloads = gr.File(label="PNG downloads (with metadata)", file_count="multiple", height=80)
                            info_json = gr.JSON(visible=False)
                    gr.Examples([[e] for e in examples], inputs=[prompt], label="Examples")
                with gr.Tab("Edit"), gr.Row(equal_height=False):
                    with gr.Column(scale=2, min_width=300):
                        edit_files = gr.File(
                            label="Input images", file_count="multiple", file_types=["image"], height=140
                        )
                        edit_prompt = gr.Textbox(label="Instruction / prompt", lines=2, placeholder=examples[0])
                        edit_strength = gr.Slider(
                            0.05, 1.0, value=0.6, step=0.05, label="Strength", info="how much of each input is re-drawn"
                        )
                        edit_num = gr.Slider(1, max_batch, value=1, step=1, label="Images per input")
                        with gr.Row():
                            edit_seed = gr.Number(label="Seed", value=0, precision=0, minimum=-1)
                            edit_random = gr.Checkbox(label="Random seed", value=True)
                        with gr.Accordion("Advanced", open=False):
                            edit_steps = gr.Slider(1, 150, value=default_steps, step=1, label="Steps")
                            edit_guidance = gr.Slider(0, 20, value=default_cfg, step=0.5, label="Guidance (CFG)")
                        with gr.Row():
                            edit_btn = gr.Button("Edit", variant="primary", elem_id="edit-btn")
                            edit_stop = gr.Button("Stop", variant="stop")
                    with gr.Column(scale=3, min_width=360):
                        edit_gallery = gr.Gallery(
                            label="Inputs and results",
                            elem_id="edit-gallery",
                            columns=4,
                            height=430,
                            format="png",
                            buttons=["download", "fullscreen"],
                        )
                        edit_info = gr.Markdown()
                        edit_downloads = gr.File(label="PNG downloads", file_count="multiple", height=80)
            with gr.Column(scale=2, min_width=280, elem_id="status-panel"):
                gr.Markdown("### Device & memory")
                status_md = gr.Markdown(elem_id="status")
                plot = gr.LinePlot(
                    x="seconds",
                    y="MiB",
                    color="memory",
                    height=220,
                    x_title="seconds ago",
                    y_title="MiB",
                    label="Memory, last minutes",
                    elem_id="memory-plot",
                )

        # events ---------------------------------------------------------------
        for name, slider in zip(lora_names, scales, strict=True):
            chosen.change(
                lambda c, n=name: gr.update(visible=n in (c or [])),
                chosen,
                slider,
                api_visibility="private",
                queue=False,
            )
        run_btn.click(
            ui_generate,
            {prompt, negative, num_images, steps, guidance, width, height, seed, random_seed, chosen, *scales},
            [gallery, info, downloads, info_json],
            api_visibility="private",
            concurrency_id="gpu",
        )
        edit_btn.click(
            ui_edit,
            [edit_files, edit_prompt, edit_strength, edit_num, edit_steps, edit_guidance, edit_seed, edit_random],
            [edit_gallery, edit_info, edit_downloads],
            api_name="edit",
            concurrency_id="gpu",
        )
        for btn in (stop_btn, edit_stop):
            btn.click(stop, None, None, api_name="stop" if btn is stop_btn else False, queue=False)
        # The public API: keyword parameters, images + a JSON info dict.
        api_btn = gr.Button(visible=False)
        api_loras = gr.JSON(value={}, visible=False, label="LoRA name -> scale")
        api_gallery = gr.Gallery(visible=False, format="png")
        api_seed = gr.Number(value=-1, visible=False, precision=0, label="Seed (-1: random)")
        api_btn.click(
            api_generate,
            [prompt, negative, num_images, steps, guidance, width, height, api_seed, api_loras],
            [api_gallery, info_json],
            api_name="generate",
            concurrency_id="gpu",
        )
        gr.api(api_status, api_name="status", queue=False)
        # Status: outside the queue, so it keeps updating while a generation runs.
        timer = gr.Timer(settings.status_interval)
        timer.tick(status, None, [status_md, plot], api_visibility="private", queue=False, show_progress="hidden")
        demo.load(status, None, [status_md, plot], api_visibility="private", queue=False)
    return demo


def launch(demo: gr.Blocks, settings: AppSettings = SETTINGS, **kwargs: Any) -> gr.Blocks:
    """Queue (one generation per device at a time, bounded) and launch without blocking."""
    settings.output_dir.mkdir(parents=True, exist_ok=True)
    demo.queue(max_size=settings.queue_size, default_concurrency_limit=1)
    options = dict(
        server_name=settings.server_name,
        server_port=settings.server_port,
        max_file_size=settings.max_file_size,
        allowed_paths=[str(settings.output_dir)],
        theme=gr.themes.Soft(primary_hue="indigo", secondary_hue="slate"),
        css=CSS,
        show_error=True,
        prevent_thread_lock=True,
    )
    options.update(kwargs)
    demo.launch(**options)
    return demo


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Diffusion Anywhere web app")
    parser.add_argument("--model", default=SETTINGS.model_id, help="diffusers folder, Hub id or .safetensors")
    parser.add_argument("--device", default=SETTINGS.preferred_device, help="auto|cpu|cuda[:N]|rocm|npu[:N]|xpu|mps")
    parser.add_argument("--port", type=int, default=SETTINGS.server_port)
    parser.add_argument("--host", default=SETTINGS.server_name)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    for noisy in ("httpx", "diffusers", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    quiet_load_progress_bars()
    settings = AppSettings(**{**SETTINGS.__dict__, "server_port": args.port, "server_name": args.host})
    dm = DeviceManager(args.device)
    pipeline = ImagePipeline.from_pretrained(args.model, dm, lora_dir=settings.lora_dir, max_batch=settings.max_batch)
    demo = launch(create_demo(pipeline, dm, settings), settings)
    log.info(
        "ready at %s | device %s (%s) | dtype %s | attention %s | model %s loaded in %.2f s",
        demo.local_url,
        dm.device,
        dm.device_name,
        str(dm.dtype).removeprefix("torch."),
        dm.attention,
        pipeline.model_name,
        pipeline.load_seconds,
    )
    demo.block_thread()


if __name__ == "__main__":
    main()
