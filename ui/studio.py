"""The handlers behind every tab and the API: parse, submit to the engine, follow the job, save, answer.

Knows the backend only through the engine (`engine.Engine`) and the model only through its
`ModelInfo`. A job's events are read here, on the Gradio event's own thread, which is where
Gradio's progress and warnings work (they live in that thread's context variables).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import gradio as gr

from engine import AppSettings, Engine, Finished, Preview, Progress, Queued, Refused
from engine.inputs import Limits, read
from engine.jobs import Job
from engine.outputs import OutputStore
from pipelines import GenerationRequest, GenerationResult, ModelInfo, OutOfMemoryError, PipelineError, token_summary
from pipelines.schema.request import unit_fields
from ui import uploads
from ui.callers import caller_of, user_of
from ui.status import MemoryHistory, status_markdown
from ui.text import refuse

log = logging.getLogger("diffusion_anywhere")


class Studio:
    """The handlers behind the UI and the API: parse, submit, follow, save, answer."""

    def __init__(self, engine: Engine, settings: AppSettings):
        self.engine = engine
        self.settings = settings
        self._set_info(engine.model_info())
        self.store = OutputStore.from_settings(settings.output_dir, settings.output_max_gb, settings.output_max_days)
        self.history = MemoryHistory(settings.history_seconds)
        self.demo: gr.Blocks | None = None

    def _set_info(self, info: ModelInfo) -> None:
        self.info = info
        self.limits = Limits.of(self.settings, info)
        self.edit_limits = self.limits.for_task("img2img")  # the model serving edits: its own limits
        self.video_limits = self.limits.for_task("video")  # the model serving video

    def request(self, flat: dict[str, Any], limits: Limits) -> GenerationRequest:
        """The request of a tab's or an endpoint's flat values; the forms take one prompt per line."""
        units = {name: uploads.unit_images(flat.get(name), name, limits) for name in unit_fields()}  # base64, checked first
        return read({**flat, "prompt": one_prompt_per_line(flat.get("prompt")), **units}, limits)

    def edit_request(self, raw: dict[str, Any], files: Any) -> GenerationRequest:
        """The Edit tab's request: its fields, and the uploaded images checked from their headers."""
        images = uploads.open_images(uploads.upload_paths(files, self.edit_limits), self.edit_limits)
        return self.request({**raw, "init_images": images}, self.edit_limits)

    # ---------------------------------------------------------------- models
    def models(self) -> dict[str, Any]:
        """`/models`: what can be loaded (recipes, MODELS_DIR folders) and what is loaded now."""
        return self.engine.models()

    def load_model(self, name: str, progress: gr.Progress | None = None) -> ModelInfo:
        """Switch every replica to the model `name`; the old one keeps serving if the new one fails."""

        def say(fraction: float, message: str) -> None:
            if progress is not None:
                progress(fraction, desc=message)

        try:
            info = self.engine.load_model(name, progress=say)
        except Refused as exc:
            raise refuse(str(exc)) from exc
        except PipelineError as exc:
            self._set_info(self.engine.model_info())
            raise gr.Error(str(exc), print_exception=False) from exc
        self._set_info(info)
        return info

    @staticmethod
    def user(request: gr.Request | None) -> str | None:
        """The signed-in user (AUTH), or None when sign-in is off."""
        return user_of(request)

    # ---------------------------------------------------------------- running
    def follow(self, job: Job, progress: gr.Progress | None) -> Iterator[Preview | Progress | Finished]:
        """A job's previews and steps, then its end, reporting its place in the queue and its steps to `progress`.

        Each step is yielded too: a Gradio handler that yields on it can be closed between steps when its
        client cancels (gradio_client's `job.cancel()`), and closing it cancels the job here (`finally`)."""
        total_images = job.request.total_images
        try:
            for event in job.events():
                if isinstance(event, Queued) and progress is not None:
                    progress(0.0, desc=f"queued: {event.ahead + 1} job(s) ahead" if event.ahead else "next in line")
                elif isinstance(event, Progress):
                    if progress is not None:
                        step, total = event.step, max(event.total, 1)
                        steps = f"{total_images} image(s): step {step}/{total}" if event.total else "starting"
                        progress(step / total, desc=event.note or steps)
                    yield event
                elif isinstance(event, Preview | Finished):
                    yield event
        finally:
            self.engine.cancel(job)  # no-op once finished; the caller went away: drop or stop its job

    def run(self, req: GenerationRequest, request: gr.Request | None, progress: gr.Progress | None):
        """Submit and follow: yields Preview and Progress events, then returns the result (refusals as gr.Error)."""
        try:
            job = self.engine.submit(req, caller_of(request))
            for event in self.follow(job, progress):
                if isinstance(event, Finished):
                    return event.result
                yield event
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
        raise gr.Error("the generation ended without a result; the server log has the details")

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

    def generate_live(self, raw: dict[str, Any], request: gr.Request | None, progress: gr.Progress | None):
        """Yields ("preview", images) while denoising, then ("done", (gallery, result, paths))."""
        try:
            req = self.request(raw, self.limits)
        except ValueError as exc:
            raise refuse(str(exc)) from exc
        result = yield from _previews(self.run(req, request, progress))
        paths = self.save(result, request)
        gallery = [(p, f"seed {s}") for p, s in zip(paths, result.seeds, strict=True)]
        yield "done", (gallery, result, paths)

    def edit(self, raw: dict[str, Any], files: Any, request: gr.Request | None, progress: gr.Progress | None):
        try:
            req = self.edit_request(raw, files)
        except ValueError as exc:
            raise refuse(str(exc)) from exc
        result = yield from _previews(self.run(req, request, progress))
        paths = self.save(result, request)
        pairs: list[tuple[Any, str]] = []
        for i, (path, src, s) in enumerate(zip(paths, result.inputs, result.seeds, strict=True)):
            pairs += [(src, f"input {i + 1}"), (path, f"result {i + 1} · seed {s}")]
        yield "done", (pairs, result, paths)

    def video(self, raw: dict[str, Any], image: Any, fmt: str, request: gr.Request | None, progress: gr.Progress | None):
        """A video request (the Video tab, `/video`): its fields, the first frame if given (image-to-video);
        yields ("done", (clip paths, result, poster paths)), each clip written as `fmt` beside its poster PNG."""
        clips = self.video_limits.model.clips
        if clips is None:
            raise refuse("no video model is loaded here (VIDEO_MODEL_ID names one)")
        if raw.get("num_frames") in (None, ""):
            raw = {**raw, "num_frames": clips.default_frames}  # left out: the video model's, still a video request
        try:
            images = uploads.open_images([uploads.upload_path(image, "init_images")], self.video_limits) if image else None
            req = self.request({**raw, "init_images": images}, self.video_limits)
        except ValueError as exc:
            raise refuse(str(exc)) from exc
        result = yield from _previews(self.run(req, request, progress))
        try:
            saved = self.store.save(result, owner=self.user(request))
            clips = self.store.save_clips(result, saved.paths, fmt)
        except OSError as exc:
            log.error("cannot save clips: %s", exc)
            raise refuse(f"the clips could not be saved on the server ({exc.strerror or type(exc).__name__})") from exc
        yield "done", (self.publish(clips), result, self.publish(saved.paths))

    def stop(self, job_id: str | None, request: gr.Request | None) -> dict[str, int]:
        """Stop the caller's running job after its step and drop its queued ones.

        Without `job_id` it is the caller's session; a REST caller passes the event id that
        `POST /gradio_api/call/generate` returned to it.
        """
        session = (job_id or "").strip() or getattr(request, "session_hash", None)
        if not session:
            return {"running": 0, "queued": 0}
        return self.engine.stop(session, self.user(request))

    # ---------------------------------------------------------------- status
    @property
    def counts_tokens(self) -> bool:
        return self.engine.capabilities.count_tokens

    def token_count(self, text: str | None) -> str:
        """ "tokens: CLIP 12/75 · T5 14/255" for the longest prompt line (one prompt per line)."""
        lines = [line for line in (text or "").splitlines() if line.strip()]
        if not lines:
            return ""
        longest = max(lines, key=len)[: self.limits.max_prompt_chars]
        return "<small>tokens: " + token_summary(self.engine.count_tokens(longest)) + "</small>"

    def status(self):
        replicas = self.engine.status()
        load = self.engine.load()
        queue = f"{load['running']} generation(s) running, {load['waiting']} waiting (QUEUE_SIZE {self.settings.queue_size})"
        text = status_markdown(replicas, self.warnings(), self.settings.zero_gpu, queue)
        return text, self.history.sample(replicas)

    def warnings(self) -> list[str]:
        notes = []
        if self.settings.exposed_without_sign_in:
            notes.append(f"listening on {self.settings.server_name} without sign-in: anyone on the network can use it")
        return notes


def one_prompt_per_line(value: Any) -> Any:
    """The forms' convention: each non-empty line is a prompt (one line: one prompt); "" stays "" so
    the schema names it; anything but text goes to the schema as it is."""
    if not isinstance(value, str):
        return value
    lines = [line.strip() for line in value.splitlines() if line.strip()]
    return "" if not lines else lines[0] if len(lines) == 1 else lines


def api_answers(events: Iterator[tuple[str, Any]], answer: Callable[[Any], tuple], outputs: int):
    """A public endpoint's answers for a run's events: nothing new (`outputs` skips) at each step, so a
    cancelling client (gradio_client's `job.cancel()`) closes the handler between steps and `Studio.follow`
    cancels the job; then `answer` of the ("done", value) event."""
    for kind, value in events:
        if kind == "done":
            yield answer(value)
            return
        yield tuple(gr.skip() for _ in range(outputs))
    raise AssertionError("unreachable: a run's events end with done")


def _previews(run: Iterator[Preview | Progress]):
    """Re-yield a run's previews as ("preview", images) and its steps as ("step", step); return its result."""
    while True:
        try:
            event = next(run)
        except StopIteration as end:
            return end.value
        yield ("preview", event.images) if isinstance(event, Preview) else ("step", event.step)
