"""What the UI, the CLI and the API ask for, and what they get back.

`GenerationRequest.validate()` is the pipeline's `check_inputs`: every rule raises a
`ValueError` that names the field and the bad value, before any model work starts.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

MIN_STEPS, MAX_STEPS = 1, 150
MAX_GUIDANCE = 50.0
MAX_SEED = 2**32 - 1
IMAGE_MODES = ("RGB", "RGBA", "L")


@dataclass
class GenerationRequest:
    """One unit of work: prompts x images per prompt (x input images for editing)."""

    prompt: str | list[str]
    negative_prompt: str | None = None
    num_images: int = 1  # per prompt (and per input image)
    steps: int = 20
    guidance_scale: float = 4.0
    width: int | None = None  # None: the model's default size
    height: int | None = None
    seed: int | None = None  # None: random, reported back in the result
    init_images: list[Image.Image] | None = None
    strength: float = 0.6  # image-to-image: how much of the input is re-drawn
    image_guidance_scale: float = 1.5  # instruction-edit pipelines only (InstructPix2Pix-style)
    guidance_end: float | None = None  # share of the steps with guidance (pipelines.guidance); None: the model's
    loras: dict[str, float] = field(default_factory=dict)  # adapter name -> scale
    sampler: str | None = None  # A1111-style name ("DPM++ 2M Karras"); None: the model's own scheduler

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    @property
    def total_images(self) -> int:
        return len(self.prompts) * self.num_images * max(1, len(self.init_images or []))

    def validate(
        self,
        size_multiple: int = 8,
        max_batch: int = 16,
        max_pixels: int = 2048 * 2048,
        count: int | None = None,
        max_side: int = 16384,
    ) -> None:
        """Raise ValueError naming the first bad field; cheap, runs before any model work.

        `count`: the images actually run now when only a range of the request runs (a pool or a
        batch job splitting it); the batch cap applies to those.
        """
        prompts = self.prompts
        if not prompts:
            raise ValueError("prompt: at least one prompt is required, got an empty list")
        for p in prompts:
            if not isinstance(p, str) or not p.strip():
                raise ValueError(f"prompt: must be non-empty text, got {p!r}")
        if self.negative_prompt is not None and not isinstance(self.negative_prompt, str):
            raise ValueError(f"negative_prompt: must be text or None, got {self.negative_prompt!r}")
        _check_int("num_images", self.num_images, 1, max_batch)
        if (count if count is not None else self.total_images) > max_batch:
            raise ValueError(
                f"num_images: {len(prompts)} prompt(s) x {self.num_images} image(s)"
                + (f" x {len(self.init_images)} input image(s)" if self.init_images else "")
                + f" = {self.total_images} images, more than MAX_BATCH={max_batch}"
            )
        _check_int("steps", self.steps, MIN_STEPS, MAX_STEPS)
        _check_number("guidance_scale", self.guidance_scale, 0.0, MAX_GUIDANCE)
        if self.guidance_end is not None:
            _check_number("guidance_end", self.guidance_end, 0.0, 1.0, low_open=True)
        for name in ("width", "height"):
            value = getattr(self, name)
            if value is None:
                continue
            _check_int(name, value, size_multiple, max_side)
            if value % size_multiple:
                raise ValueError(f"{name}: {value} is not a multiple of {size_multiple} (this model's size step)")
        if self.width and self.height and self.width * self.height > max_pixels:
            raise ValueError(
                f"width x height: {self.width}x{self.height} = {self.width * self.height} pixels, "
                f"more than this model's cap of {max_pixels} on this device (MAX_PIXELS)"
            )
        if self.seed is not None:
            _check_int("seed", self.seed, 0, MAX_SEED)
        if self.init_images is not None:
            if not self.init_images:
                raise ValueError("init_images: empty list; pass None for text-to-image")
            for i, image in enumerate(self.init_images):
                if not isinstance(image, Image.Image):
                    raise ValueError(f"init_images[{i}]: must be a PIL image, got {type(image).__name__}")
                if image.mode not in IMAGE_MODES:
                    raise ValueError(f"init_images[{i}]: image mode {image.mode!r} not supported; use RGB")
                if image.width < 8 or image.height < 8:
                    raise ValueError(f"init_images[{i}]: {image.width}x{image.height} is too small")
            _check_number("strength", self.strength, 0.0, 1.0, low_open=True)
            _check_number("image_guidance_scale", self.image_guidance_scale, 0.0, MAX_GUIDANCE)
        if not isinstance(self.loras, dict):
            raise ValueError(f"loras: must be a dict of adapter name -> scale, got {type(self.loras).__name__}")
        for name, scale in self.loras.items():
            _check_number(f"loras[{name!r}]", scale, -4.0, 4.0)


def _check_int(name: str, value: Any, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{name}: must be an integer, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name}: {value} is out of range {low}..{high}")


def _check_number(name: str, value: Any, low: float, high: float, low_open: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: must be a number, got {value!r}")
    if math.isnan(value) or math.isinf(value):
        raise ValueError(f"{name}: must be a finite number, got {value}")
    if value > high or value < low or (low_open and value == low):
        bound = f"({low}, {high}]" if low_open else f"[{low}, {high}]"
        raise ValueError(f"{name}: {value} is out of range {bound}")


@dataclass
class GenerationResult:
    """Images with everything needed to reproduce and judge them."""

    images: list[Image.Image]
    seeds: list[int]
    metadata: list[dict[str, Any]]
    timings: dict[str, float]  # encode/denoise/decode/total seconds, steps_per_second (load excluded)
    peak_memory: int | None  # bytes; None where the backend cannot tell
    device: str
    dtype: str
    attention: str
    warnings: list[str] = field(default_factory=list)
    cancelled: bool = False
    inputs: list[Image.Image | None] = field(default_factory=list)  # the input image of each output (editing)
    attention_components: dict[str, str] = field(default_factory=dict)  # per component, what ran

    def info(self) -> dict[str, Any]:
        """JSON-friendly summary (what the API returns beside the images)."""
        return {
            "seeds": self.seeds,
            "timings": {k: round(v, 4) for k, v in self.timings.items()},
            "peak_memory": self.peak_memory,
            "device": self.device,
            "dtype": self.dtype,
            "attention": self.attention,
            "attention_components": self.attention_components,
            "warnings": self.warnings,
            "cancelled": self.cancelled,
            "num_images": len(self.images),
        }
