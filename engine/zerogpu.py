"""ZeroGPU (Hugging Face Spaces with `SPACES_ZERO_GPU=true`): generations run in `spaces.GPU`'s worker.

How ZeroGPU works (`spaces` 0.51.3, see docs/zerogpu.md): importing `spaces` patches torch so that
the Space's process sees an emulated CUDA device without a GPU; the model is loaded and moved "to
cuda" on the main thread at start-up (the moves are recorded, and the weights are packed to disk
when Gradio launches). A call of a `@spaces.GPU` function asks the device API for a GPU
(`/schedule`), forks a worker process that inherits the module globals, moves the recorded weights
onto the real GPU there, and pickles the arguments in and every yielded value out; `/release` gives
the GPU back. Closing the generator of a decorated generator function stops the worker's generator
at its next yield.

Here:
- `ZeroGPUBackend` wraps the backend `build_backend` made (the pool, with the editor beside it):
  model info, status and token counts are answered in the Space's process; `generate` calls the
  one decorated module-level function, `_generate_on_gpu(request)`, and forwards what it yields to
  the engine's callbacks.
- `_generate_on_gpu` runs `_BACKEND.generate` (the global set at start-up, inherited through the
  fork) in a thread of the worker and yields ("progress", (step, total, image)) at every step,
  ("preview", (first, images)) frames, and last ("result", GenerationResult) or ("error", exc).
- Stop and TIME_BUDGET: the engine's cancel flag lives in the Space's process, the denoising loop
  in the worker. `_STOP`, a multiprocessing event created at import (so every forked worker shares
  it), carries it across: the parent sets it, the worker's `should_cancel` reads it, and the
  worker's `generate` returns what finished with `cancelled=True` exactly as on any other backend.
  Closing the generator (which ZeroGPU turns into its stop event) is kept for a consumer that goes
  away: it discards the worker's partial result, so it is not how Stop returns images.
- Duration: `gpu_duration(request)` asks ZeroGPU for seconds from steps x images x pixels, capped
  at ZEROGPU_DURATION; the generation stops itself with what finished a little before that, so
  ZeroGPU never aborts it.
- Model switching is off (`capabilities.switch_models` is False): a switch would load the new
  model in the Space's process after launch, where the weights can no longer be packed for the
  workers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import multiprocessing
import pickle
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

from pipelines import (
    CancelFn,
    Capabilities,
    GenerationBackend,
    ModelInfo,
    PreviewFn,
    ProgressFn,
    ReplicaStatus,
    report_progress,
)
from pipelines.schema.errors import PipelineError
from pipelines.schema.request import GenerationRequest, GenerationResult

log = logging.getLogger(__name__)

# duration: START_SECONDS + STEP_SECONDS x steps x images x (width x height / 512^2), capped
START_SECONDS = 15.0  # the worker's fork and the move of the weights to the GPU
STEP_SECONDS = 0.1  # one denoising step of one 512x512 image (conservative for SD-class models on an H200 slice)
DEFAULT_MAX_DURATION = 120.0  # ZEROGPU_DURATION's default: the most one generation asks for
STOP_MARGIN = 5.0  # seconds before the duration at which the generation stops itself with what finished

_BACKEND: GenerationBackend | None = None  # the model, set at start-up; the forked worker inherits it
_MAX_DURATION = DEFAULT_MAX_DURATION
_DEFAULT_SIZE = (512, 512)  # the model's default width and height (a request without a size gets them)
_STOP = multiprocessing.get_context("fork").Event()  # set by the Space's process, read in the worker


def gpu_duration(request: GenerationRequest) -> float:
    """Seconds of GPU to ask ZeroGPU for (a function of the decorated function's own argument)."""
    pixels = (request.width or _DEFAULT_SIZE[0]) * (request.height or _DEFAULT_SIZE[1]) / (512 * 512)
    work = max(1, request.steps) * max(1, request.total_images) * max(pixels, 0.25)
    return float(min(_MAX_DURATION, math.ceil(START_SECONDS + STEP_SECONDS * work)))


def _worker_events(request: GenerationRequest) -> Iterator[tuple[str, Any]]:
    """The body of the decorated function (run in the forked worker): generate in a thread, yield
    every event as it comes (at least one per step, so a closed generator stops at the next step)."""
    assert _BACKEND is not None, "engine.zerogpu: the backend is set at start-up (ZeroGPUBackend)"
    events: queue.Queue = queue.Queue()
    closed = threading.Event()

    def run() -> None:
        try:
            result = _BACKEND.generate(
                request,
                progress=lambda step, total, image, note="": events.put(("progress", (step, total, image, note))),
                should_cancel=lambda: closed.is_set() or _STOP.is_set(),
                preview=lambda first, images: events.put(("preview", (first, list(images)))),
            )
            events.put(("result", result))
        except BaseException as exc:  # handed to the Space's process, raised there
            events.put(("error", _picklable(exc)))

    worker = threading.Thread(target=run, name="zerogpu-generate", daemon=True)
    worker.start()
    try:
        while True:
            kind, value = events.get()
            yield kind, value
            if kind in ("result", "error"):
                return
    finally:  # also on close(): stop the generation after its current step
        closed.set()
        worker.join(timeout=60)


def _picklable(exc: BaseException) -> BaseException:
    """The exception itself where it survives pickling, else a PipelineError with its message."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        error = ValueError if isinstance(exc, ValueError) else PipelineError
        return error(f"{type(exc).__name__}: {exc}")


_generate_on_gpu = _worker_events  # replaced by the `spaces.GPU`-decorated function in `install`


def install(backend: GenerationBackend, max_duration: float = DEFAULT_MAX_DURATION) -> None:
    """Set the module globals the worker inherits and decorate the GPU function (main thread, at
    start-up, before Gradio launches: `spaces` packs the weights and reports the function then)."""
    import spaces  # only on ZeroGPU: app.py imported it before torch

    global _BACKEND, _MAX_DURATION, _DEFAULT_SIZE, _generate_on_gpu
    _BACKEND, _MAX_DURATION = backend, max_duration
    info = backend.model_info()
    _DEFAULT_SIZE = (info.default_width, info.default_height)
    _generate_on_gpu = spaces.GPU(duration=gpu_duration)(_worker_events)


class ZeroGPUBackend:
    """The app's backend, each generation on a ZeroGPU worker (one at a time: one stop event)."""

    def __init__(self, inner: GenerationBackend, max_duration: float = DEFAULT_MAX_DURATION):
        self.inner = inner
        self.max_duration = max_duration
        self._one = threading.Lock()
        install(inner, max_duration)

    @property
    def capabilities(self) -> Capabilities:
        """Previews and token counts as the backend behind; no model switching on ZeroGPU."""
        inner = self.inner.capabilities
        return Capabilities(previews=inner.previews, switch_models=False, count_tokens=inner.count_tokens)

    @property
    def concurrency(self) -> int:
        return 1

    def generate(
        self,
        request: GenerationRequest,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        preview: PreviewFn | None = None,
    ) -> GenerationResult:
        """Run `request` in the ZeroGPU worker; returns what finished, also when stopped."""
        with self._one:
            _STOP.clear()
            budget = gpu_duration(request) - STOP_MARGIN
            deadline = time.monotonic() + budget
            over_budget = False
            events = _generate_on_gpu(request)
            try:
                for kind, value in events:  # at least one event per step
                    if kind == "progress" and progress is not None:
                        report_progress(progress, *value)
                    elif kind == "preview" and preview is not None:
                        preview(*value)
                    elif kind == "error":
                        raise value
                    elif kind == "result":
                        if over_budget:
                            value.warnings.append(
                                f"stopped before ZeroGPU's duration of {budget + STOP_MARGIN:g} s ran out "
                                f"(ZEROGPU_DURATION={self.max_duration:g}): {len(value.images)} of "
                                f"{request.total_images} image(s) finished"
                            )
                        return value
                    # Stop, TIME_BUDGET and ZeroGPU's duration, checked between steps as on every backend
                    over_budget = over_budget or time.monotonic() > deadline
                    if over_budget or (should_cancel is not None and should_cancel()):
                        _STOP.set()  # the worker's generate returns what finished after this step
                raise PipelineError("the ZeroGPU worker ended without a result")
            finally:
                events.close()  # a no-op once it ended; else ZeroGPU's stop event ends the worker's generator
                _STOP.clear()

    def model_info(self) -> ModelInfo:
        return self.inner.model_info()

    def status(self) -> list[ReplicaStatus]:
        return [dataclasses.replace(r, name=f"{r.name} (ZeroGPU)") for r in self.inner.status()]

    def count_tokens(self, prompt: str) -> Any:
        """The backend's token counter (tokenizers run in the Space's process, not on the GPU)."""
        return self.inner.count_tokens(prompt)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.inner.close()
