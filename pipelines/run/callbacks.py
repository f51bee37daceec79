"""Step callbacks of one diffusers call, kept apart from the pipeline as diffusers keeps its own
(diffusers/callbacks.py): each is a small object the call invokes after every denoising step.

`CallMonitor` reports progress, honours cancel and times the phases; `Previews` adds cheap preview
images; `Chained` runs the prompt switch and guidance end after them; `LegacyCallback` adapts the whole protocol to the
old `callback(step, timestep, latents)` of pipelines that have no `callback_on_step_end`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from devices import DeviceManager
from pipelines.run.backend import CancelFn, PreviewFn, ProgressFn, report_progress  # the backend contract's
from pipelines.sampling.preview import PreviewDecoder


class RequestProgress:
    """One request's progress as the pipeline reports it: each step sets the replica's activity line and goes to
    the caller's `progress`; `note(text)` (an OpenVINO conversion inside the request) goes out at the last step
    reported (0 of 0 before the first), so the progress bar says what holds it up, and an empty note puts the
    steps back."""

    def __init__(self, owner: Any, progress: ProgressFn | None, images: int, first_image: int):
        self.owner, self.progress, self.images = owner, progress, images
        self.last = (0, 0, first_image)  # (steps done, in all, image): none yet

    def begin(self) -> None:
        """The activity line of a request that has made no step yet."""
        self.owner.activity = self._line(0)

    def _line(self, step: int, total: int = 0) -> str:
        return f"{self.images} image(s), " + (f"step {step}/{total}" if total else "starting")

    def __call__(self, step: int, total: int, image: int, note: str = "") -> None:
        self.last = (step, total, image)
        self.owner.activity = note or self._line(step, total)
        if self.progress is not None:
            report_progress(self.progress, step, total, image, note)

    def note(self, text: str) -> None:
        self(*self.last, text)


class CallMonitor:
    """The `callback_on_step_end` of one diffusers call: progress, cancel and phase timings.

    Timings without re-implementing the pipeline: encode = call start -> end of the last
    text-encoder forward (forward hooks); denoise = -> end of the last step; decode = -> call
    return. On accelerators each mark synchronizes, so the times are real, not launch times.
    Progress counts steps over the whole request (`base` steps done before this call, of
    `total`); `first_image` is the index of this call's first image.
    """

    def __init__(
        self,
        pipe: Any,
        dm: DeviceManager,
        progress: ProgressFn | None,
        should_cancel: CancelFn | None,
        base: int,
        total: int,
        first_image: int,
        call_steps: int,
    ):
        self.dm = dm
        self.progress, self.should_cancel = progress, should_cancel
        self.base, self.total, self.first_image = base, total, first_image
        self.call_steps = call_steps  # steps this call reports (PNDM calls back one time more)
        self.cancelled = False
        self.start = self.encoded = self.last_step = 0.0
        self.steps = 0
        self._hooks = [
            module.register_forward_hook(self._on_encoder)
            for name, module in getattr(pipe, "components", {}).items()
            if name.startswith("text_encoder") and isinstance(module, torch.nn.Module)
        ]

    def _now(self) -> float:
        self.dm.synchronize()
        return time.perf_counter()

    def _on_encoder(self, *_args: Any) -> None:
        if self.steps == 0:
            self.encoded = self._now()

    def begin(self) -> None:
        self.start = self.encoded = self.last_step = self._now()

    def __call__(self, pipe: Any, step: int, _timestep: Any, _tensors: dict) -> dict:
        self.steps += 1
        self.last_step = self._now()
        self.dm.sample_peak()
        if self.progress is not None:
            self.progress(self.base + min(step + 1, self.call_steps), self.total, self.first_image)
        if self.should_cancel is not None and self.should_cancel():
            self.cancelled = True
            pipe._interrupt = True  # diffusers skips the remaining steps
        return {}

    def finish(self) -> dict[str, float]:
        end = self._now()
        self.dm.sample_peak()  # after the decode, often the largest use
        for hook in self._hooks:
            hook.remove()
        last = self.last_step if self.steps else end
        return {
            "encode": self.encoded - self.start,
            "denoise": max(0.0, last - self.encoded),
            "decode": end - last,
            "total": end - self.start,
            "steps": float(self.steps),
        }


class Previews:
    """The step callback with previews: the monitor's callback, then every `every` steps a preview."""

    def __init__(self, monitor: CallMonitor, decoder: PreviewDecoder, preview: PreviewFn, first: int, every: int):
        self.monitor, self.decoder, self.preview = monitor, decoder, preview
        self.first_image, self.every = first, every
        self.latents = None

    def __call__(self, pipe: Any, step: int, timestep: Any, tensors: dict) -> dict:
        result = self.monitor(pipe, step, timestep, tensors)
        self.latents = tensors.get("latents")
        if self.every and (step + 1) % self.every == 0 and not self.monitor.cancelled:
            images = self.decoder.decode(self.latents)
            if images:
                self.preview(self.first_image, images)
        return result

    def learn(self, images: list[Any]) -> None:
        if self.latents is not None:
            self.decoder.learn(self.latents, images)


class Chained:
    """The step callback, then the callbacks that change the step's tensors (the prompt switch, then
    guidance end), each seeing the tensors as the one before left them: progress and previews see
    every step as before."""

    def __init__(self, callback: Callable[..., dict], *changers: Any):
        self.callback, self.changers = callback, changers

    @property
    def tensor_inputs(self) -> list[str]:
        return list(dict.fromkeys(["latents", *(name for c in self.changers for name in c.tensor_inputs)]))

    def __call__(self, pipe: Any, step: int, timestep: Any, tensors: dict) -> dict:
        out = dict(self.callback(pipe, step, timestep, tensors))
        for changer in self.changers:
            out.update(changer(pipe, step, timestep, {**tensors, **out}))
        return out


class Interrupted(Exception):
    """Raised from a legacy step callback to stop a pipeline that has no `_interrupt` check."""


class LegacyCallback:
    """Adapts the old `callback(step, timestep, latents)` to the `callback_on_step_end` protocol."""

    def __init__(self, pipe: Any, on_step_end: Callable[..., dict]):
        self.pipe, self.on_step_end = pipe, on_step_end

    def __call__(self, step: int, timestep: Any, latents: Any) -> None:
        self.on_step_end(self.pipe, step, timestep, {"latents": latents})
        if getattr(self.pipe, "_interrupt", False):
            raise Interrupted
