"""The handlers behind every tab and the API: parse, admit, run, save, answer.

Knows the backend only through `GenerationBackend` and the model only through its `ModelInfo`.
"""

from __future__ import annotations

import contextvars
import dataclasses
import logging
import queue
import threading
from typing import Any

import gradio as gr

from pipelines import GenerationRequest, GenerationResult, OutOfMemoryError, PipelineError, catalog
from pipelines.backend import GenerationBackend, ModelInfo
from pipelines.tokens import token_summary
from ui import inputs
from ui.jobs import JobRunner, drop_queued
from ui.outputs import OutputStore
from ui.settings import AppSettings
from ui.status import MemoryHistory, status_markdown
from ui.text import refuse

try:  # ZeroGPU Spaces only
    import spaces
except ImportError:
    spaces = None

log = logging.getLogger("diffusion_anywhere")


def gpu(fn):
    """`spaces.GPU` on Hugging Face ZeroGPU; the function itself everywhere else."""
    return spaces.GPU(duration=120)(fn) if spaces is not None else fn


class Studio:
    """The handlers behind the UI and the API: parse, admit, run, save, answer."""

    def __init__(self, backend: GenerationBackend, settings: AppSettings):
        self.backend = backend
        self.settings = settings
        self._set_info(backend.model_info())
        self.runner = JobRunner(backend, settings.time_budget)
        self.store = OutputStore.from_settings(settings.output_dir, settings.output_max_gb, settings.output_max_days)
        self.history = MemoryHistory(settings.history_seconds)
        self.demo: gr.Blocks | None = None

    def _set_info(self, info: ModelInfo) -> None:
        self.info = info
        s = self.settings
        self.limits = inputs.Limits(info, s.max_prompt_chars, s.max_edit_files, s.max_upload_pixels)
        self.edit_limits = dataclasses.replace(self.limits, model=info.for_edits)  # an editor's own defaults

    # ---------------------------------------------------------------- models
    @property
    def can_switch(self) -> bool:
        """A backend that can switch (the device pool, Ray Serve) on a server whose settings allow it."""
        return callable(getattr(self.backend, "load_model", None)) and self.settings.model_switch_allowed

    @property
    def switch_off_reason(self) -> str:
        if not callable(getattr(self.backend, "load_model", None)):
            return "this backend serves one model (restart with another MODEL_ID to change it)"
        return "switching models is off on this server (ALLOW_MODEL_SWITCH)"

    def models(self) -> dict[str, Any]:
        """`/models`: what can be loaded (recipes, MODELS_DIR folders) and what is loaded now."""
        entries = catalog.list_models(self.settings.models_dir)
        return {
            "current": self.info.model_name,
            "models": [{"name": e.name, "kind": e.kind} for e in entries],
            "switch_allowed": self.can_switch,
        }

    def load_model(self, name: str, progress: gr.Progress | None = None) -> ModelInfo:
        """Switch every replica to the model `name` (one of `models()`); the old one keeps serving
        if the new one fails to load."""
        if not self.can_switch:
            raise refuse(
                self.switch_off_reason + ": a switch changes the model for every user "
                "(ALLOW_MODEL_SWITCH=1 allows it beyond localhost)"
            )
        try:
            entry = catalog.find((name or "").strip(), self.settings.models_dir)
        except ValueError as exc:
            raise refuse(str(exc)) from exc

        def say(fraction: float, message: str) -> None:
            if progress is not None:
                progress(fraction, desc=message)

        try:
            info = self.backend.load_model(entry.source, progress=say)
        except PipelineError as exc:
            self._set_info(self.backend.model_info())
            raise gr.Error(str(exc), print_exception=False) from exc
        self._set_info(info)
        log.info("model switched to %s", info.model_name)
        return info

    @staticmethod
    def user(request: gr.Request | None) -> str | None:
        """The signed-in user (AUTH), or None when sign-in is off."""
        return getattr(request, "username", None) or None

    def job_id(self, request: gr.Request | None, given: str | None = None) -> str:
        """Whose job: the session (for a plain REST call, its own event id) or the id a caller was
        given, always inside the signed-in user's own space, so nobody reaches another user's jobs."""
        job = (given or "").strip() or getattr(request, "session_hash", None) or "anonymous"
        user = self.user(request)
        return f"{user}/{job}" if user else job

    # ---------------------------------------------------------------- running
    def run(self, req: GenerationRequest, job_id: str, progress: gr.Progress | None, preview=None) -> GenerationResult:
        total_images = req.total_images

        def report(step: int, total: int, _image: int) -> None:
            if progress is not None:
                progress(step / max(total, 1), desc=f"{total_images} image(s): step {step}/{total}")

        try:
            return _run_on_device(self.runner, req, job_id, report, preview)
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

    def save(self, result: GenerationResult, request: gr.Request | None) -> list[str]:
        """Write the PNGs (in the user's own folder when sign-in is on); Gradio serves its own copies
        of them, only to this caller."""
        try:
            saved = self.store.save(result, owner=self.user(request))
        except OSError as exc:  # not even the temporary folder could be written
            log.error("cannot save results anywhere: %s", exc)
            raise refuse(f"the images could not be saved on the server ({exc.strerror or type(exc).__name__})") from exc
        if saved.warning:
            result.warnings.append(saved.warning)
            gr.Warning(saved.warning)
        return self.publish(saved.paths)

    def publish(self, paths: list[str]) -> list[str]:
        """Gradio's own copies of files (content-hash folders in its cache, pruned by CACHE_MINUTES).

        Served files come only from there: OUTPUT_DIR can live anywhere (not only under the working
        directory or /tmp, which Gradio would require) and is never itself reachable by URL.
        """
        from gradio.processing_utils import save_file_to_cache

        cache = self.demo.GRADIO_CACHE if self.demo is not None else None
        return [save_file_to_cache(p, cache) for p in paths] if cache else paths

    def generate(self, raw: dict[str, Any], request: gr.Request | None, progress: gr.Progress | None, preview=None):
        job_id = self.job_id(request)
        try:
            req = inputs.generation_request(raw, self.limits)
        except ValueError as exc:
            raise refuse(str(exc)) from exc
        result = self.run(req, job_id, progress, preview)
        paths = self.save(result, request)
        gallery = [(p, f"seed {s}") for p, s in zip(paths, result.seeds, strict=True)]
        return gallery, result, paths

    def generate_live(self, raw: dict[str, Any], request: gr.Request | None, progress: gr.Progress | None):
        """`generate` that yields ("preview", images) while denoising, then ("done", result tuple).

        The generation runs in a worker thread; this generator blocks on a queue of its previews
        (no polling), so Gradio streams each frame to the browser as it arrives.
        """
        frames: queue.Queue = queue.Queue()
        shown: dict[int, Any] = {}

        def on_preview(first: int, images: list[Any]) -> None:
            shown.update({first + i: im for i, im in enumerate(images)})
            frames.put(("preview", [shown[k] for k in sorted(shown)]))

        def work() -> None:
            try:
                frames.put(("done", self.generate(raw, request, progress, on_preview)))
            except BaseException as exc:  # handed to the generator, which raises it in Gradio's thread
                frames.put(("error", exc))

        context = contextvars.copy_context()  # Gradio's progress and warnings live in context variables
        threading.Thread(target=context.run, args=(work,), name="generate", daemon=True).start()
        while True:
            kind, value = frames.get()
            if kind == "error":
                raise value
            yield kind, value
            if kind == "done":
                return

    def edit(self, raw: dict[str, Any], files: Any, request: gr.Request | None, progress: gr.Progress | None):
        job_id = self.job_id(request)
        try:
            images = inputs.open_images(inputs.upload_paths(files, self.edit_limits), self.edit_limits)
            req = inputs.generation_request(raw, self.edit_limits, init_images=images)
        except ValueError as exc:
            raise refuse(str(exc)) from exc
        result = self.run(req, job_id, progress)
        paths = self.save(result, request)
        pairs: list[tuple[Any, str]] = []
        for i, (path, src, s) in enumerate(zip(paths, result.inputs, result.seeds, strict=True)):
            pairs += [(src, f"input {i + 1}"), (path, f"result {i + 1} · seed {s}")]
        return pairs, result, paths

    async def stop(self, job_id: str | None, request: gr.Request | None) -> dict[str, int]:
        """Stop the caller's running job after its step and drop its queued ones.

        Without `job_id` it is the caller's session; a REST caller passes the event id that
        `POST /gradio_api/call/generate` returned to it.
        """
        session = (job_id or "").strip() or getattr(request, "session_hash", None)
        if not session:
            return {"running": 0, "queued": 0}
        user = self.user(request)
        dropped = await drop_queued(self.demo, session, user) if self.demo is not None else 0
        return {"running": int(self.runner.stop(self.job_id(request, job_id))), "queued": dropped}

    # ---------------------------------------------------------------- status
    @property
    def counts_tokens(self) -> bool:
        """Whether the backend can count prompt tokens (a local pipeline or pool; not Ray)."""
        return callable(getattr(self.backend, "count_tokens", None))

    def token_count(self, text: str | None) -> str:
        """ "tokens: CLIP 12/75 · T5 14/255" for the longest prompt line (one prompt per line)."""
        lines = [line for line in (text or "").splitlines() if line.strip()]
        if not lines:
            return ""
        longest = max(lines, key=len)[: self.limits.max_prompt_chars]
        return "<small>tokens: " + token_summary(self.backend.count_tokens(longest)) + "</small>"

    def status(self):
        replicas = self.backend.status()
        return status_markdown(replicas, self.warnings(), self.settings.zero_gpu), self.history.sample(replicas)

    def warnings(self) -> list[str]:
        notes = []
        if self.settings.exposed_without_sign_in:
            notes.append(f"listening on {self.settings.server_name} without sign-in: anyone on the network can use it")
        return notes


@gpu
def _run_on_device(runner: JobRunner, req: GenerationRequest, job_id: str, progress, preview) -> GenerationResult:
    return runner.run(req, job_id, progress, preview)
