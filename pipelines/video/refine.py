"""A video model's refine pass: each clip redrawn by a motion-module refiner (AnimateDiff) as video-to-video.

A model's vocabulary.json names it, relative to the model's folder:

    "refiner": {"folder": "../refiners/tiny-shapes-motion", "strength": 0.65, "guidance": 4.0}

("folder", not "path": the vocabulary reaches clients in `ModelInfo`, and gradio_client takes a dict with a "path"
in a JSON output for a file to download.) The embedded tiny-shapes-video moves the asked shape the asked way but draws its outline roughly; its refiner
(motion modules over the embedded image model, models/train/video_motion.py) keeps the draft's motion and
redraws its shapes (docs/video.md). The pass runs `AnimateDiffVideoToVideoPipeline` over the draft's frames with
the request's prompt, negative prompt and seed, for `strength` of the request's steps (at least one), at the
refiner's own guidance and sampler; for image-to-video the given first frame stays the draft's. Its steps are
part of the request's progress, and Stop interrupts it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RefinerSpec:
    """Where the refiner is and how it runs."""

    path: Path
    strength: float  # the share of the request's steps it redraws (video-to-video strength)
    guidance: float

    @property
    def name(self) -> str:
        return self.path.name

    def steps(self, steps: int) -> int:
        """The denoising steps it runs for a request of `steps` (diffusers' `int(steps x strength)`, at least 1)."""
        return max(1, int(steps * self.strength))


def read_spec(vocabulary: dict[str, Any], source: str | Path) -> RefinerSpec | None:
    """The refiner a model's vocabulary names, its path resolved against the model's folder `source`."""
    raw = vocabulary.get("refiner")
    if not raw:
        return None
    path = (Path(source) / raw["folder"]).resolve()
    return RefinerSpec(path, float(raw.get("strength", 0.65)), float(raw.get("guidance", 4.0)))


def load(spec: RefinerSpec, dm: Any) -> Any:
    """The refiner's video-to-video pipeline on the model's device, in its dtype."""
    from diffusers import AnimateDiffPipeline, AnimateDiffVideoToVideoPipeline

    base = AnimateDiffPipeline.from_pretrained(str(spec.path), dtype=dm.dtype)
    pipe = AnimateDiffVideoToVideoPipeline.from_pipe(base).to(dm.device)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def refine(pipe: Any, spec: RefinerSpec, frames: list[Any], request: Any, prompt: str, generator: Any,
           callback: Any) -> list[Any]:  # fmt: skip
    """`frames` redrawn (a clip of PIL images); for image-to-video the first frame stays the given one."""
    out = pipe(
        video=frames, prompt=prompt, negative_prompt=request.negative_prompt or None, strength=spec.strength,
        num_inference_steps=request.steps, guidance_scale=spec.guidance, generator=generator, output_type="pil",
        callback_on_step_end=callback,
    ).frames[0]  # fmt: skip
    if request.init_images:
        out[0] = frames[0]
    return out
