"""What the UI, the CLI and the APIs ask for, and what they get back; the bounds every caller obeys.

This module owns every request bound and default (`BOUNDS`, the dataclass defaults): the UI's
sliders, the API's parsing, Send-to's clamping and `validate` all read them from here, so a
bound cannot drift between front ends. A model's own limits (size step, largest side and area,
batch) come as one `RequestLimits` object (`ModelInfo.limits`).

`validate(request, limits)` is the pipeline's `check_inputs`: every rule raises a `ValueError`
that names the field and the bad value, before any model work starts.

Seeds: any seed 0..2^64-1 is accepted (the range of torch's generators, and what ComfyUI writes);
a request without one gets a random seed once (`pin_seed`, below 2^32 as A1111 draws them, so it
stays valid in tools with 32-bit seeds), and image k of a request has seed (seed + k) mod 2^64.
"""

from __future__ import annotations

import dataclasses
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from PIL import Image

from .inpaint import Inpaint

IMAGE_MODES = ("RGB", "RGBA", "L")
SEED_SPACE = 2**64  # torch.Generator.manual_seed takes 0..2^64-1
RANDOM_SEED_SPACE = 2**32  # random seeds: short, and valid in tools that keep 32-bit seeds
STEP_CACHES = ("none", "FirstBlockCache", "TaylorSeer", "MagCache")  # what each does: pipelines.step_cache


class RequestError(ValueError):
    """A refused request value, with where it is: `loc` is the field's path in the request schema
    (("steps",), ("inpaint", "mask_blur"), ("init_images", 1), ("loras", "outline")) and `detail`
    the sentence without the name. `str()` is "steps: 200 is out of range 1..150".

    Every front end maps `loc` to its own name for the field (A1111's `loc`, OpenAI's `param`, a CLI
    flag) without parsing the text."""

    def __init__(self, loc: tuple[str | int, ...] | str, detail: str):
        self.loc: tuple[str | int, ...] = (loc,) if isinstance(loc, str) else tuple(loc)
        self.detail = detail
        super().__init__(f"{dotted(self.loc)}: {detail}" if self.loc else detail)

    @property
    def field(self) -> str | None:
        """The top-level field (the first string of `loc`), or None for the request as a whole."""
        return next((part for part in self.loc if isinstance(part, str)), None)


def dotted(loc: tuple[str | int, ...]) -> str:
    """("inpaint", "mask_blur") -> "inpaint.mask_blur"; ("init_images", 1) -> "init_images[1]"."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


@dataclass(frozen=True)
class Bound:
    """The accepted range of one request field (`low_open`: `low` itself is refused)."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False

    def check(self, name: str, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int if self.integer else int | float):
            raise ValueError(f"{name}: must be {'an integer' if self.integer else 'a number'}, got {value!r}")
        if not self.integer and (math.isnan(value) or math.isinf(value)):
            raise ValueError(f"{name}: must be a finite number, got {value}")
        if value > self.high or value < self.low or (self.low_open and value == self.low):
            raise ValueError(f"{name}: {value} is out of range {self.describe()}")

    def describe(self) -> str:
        if self.integer:
            return f"{self.low}..{self.high}"
        return f"({self.low:g}, {self.high:g}]" if self.low_open else f"[{self.low:g}, {self.high:g}]"


# Every numeric field a caller sets, with its one range. Why these numbers:
# steps 150 (A1111's slider end), guidance 50 (what some distilled models are run at),
# strength and guidance end down to 0.01 (0 would skip every step / all guidance), image
# guidance 10 (InstructPix2Pix-style editors are run at 1-5), LoRA scales +-4 (A1111 allows any,
# Forge's sliders stop at +-2 and merges beyond 4 are noise), a step cache's threshold up to 1 (a
# relative change: FirstBlockCache at 1 would skip nearly every step; 0 would skip none).
BOUNDS: dict[str, Bound] = {
    "steps": Bound(1, 150, integer=True),
    "guidance_scale": Bound(0.0, 50.0),
    "guidance_end": Bound(0.01, 1.0),
    "strength": Bound(0.01, 1.0),
    "image_guidance_scale": Bound(0.0, 10.0),
    "lora_scale": Bound(-4.0, 4.0),
    "seed": Bound(0, SEED_SPACE - 1, integer=True),
    "step_cache_threshold": Bound(0.0, 1.0, low_open=True),
}


@dataclass(frozen=True)
class RequestLimits:
    """A loaded model's limits on this device, as one object (`ModelInfo.limits`)."""

    size_multiple: int = 8  # width/height step
    max_batch: int = 16  # most images per request
    max_pixels: int = 2048 * 2048  # largest width x height
    max_side: int = 16384  # largest width or height


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
    seed: int | None = None  # None: random (pin_seed), reported back in the result
    init_images: list[Image.Image] | None = None
    strength: float = 0.6  # image-to-image: how much of the input is re-drawn
    image_guidance_scale: float = 1.5  # instruction-edit pipelines only (InstructPix2Pix-style)
    guidance_end: float | None = None  # share of the steps with guidance (pipelines.guidance); None: the model's
    loras: dict[str, float] = field(default_factory=dict)  # adapter name -> scale
    sampler: str | None = None  # A1111-style name ("DPM++ 2M Karras"); None: the model's own scheduler
    inpaint: Inpaint | None = None  # repaint only the mask of each input image (pipelines.inpaint)
    step_cache: str | None = (
        None  # none | FirstBlockCache | TaylorSeer | MagCache (pipelines.step_cache); None: the model's
    )
    step_cache_threshold: float | None = None  # None: the method's default (TaylorSeer has none)

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    @property
    def total_images(self) -> int:
        return len(self.prompts) * self.num_images * max(1, len(self.init_images or []))


DEFAULTS = GenerationRequest(prompt="")  # the request defaults, read by forms that leave a field out


def pin_seed(request: GenerationRequest) -> GenerationRequest:
    """The request with its seed fixed: a random one drawn here when it has none.

    Drawn once, before a request is split or sent anywhere, so every part and replica uses the
    same seed and the result reports the seed that reproduces it.
    """
    if request.seed is not None:
        return request
    return dataclasses.replace(request, seed=secrets.randbelow(RANDOM_SEED_SPACE))


def item_seed(seed: int, index: int) -> int:
    """The seed of image `index` of a request: seed + index, wrapping inside the generator's range."""
    return (seed + index) % SEED_SPACE


def validate(request: GenerationRequest, limits: RequestLimits, count: int | None = None) -> None:
    """Raise ValueError naming the first bad field; cheap, runs before any model work.

    `count`: the images actually run now when only a range of the request runs (a pool or a
    batch job splitting it); the batch cap applies to those.
    """
    _check_prompts(request)
    Bound(1, limits.max_batch, integer=True).check("num_images", request.num_images)
    if (count if count is not None else request.total_images) > limits.max_batch:
        raise ValueError(
            f"num_images: {len(request.prompts)} prompt(s) x {request.num_images} image(s)"
            + (f" x {len(request.init_images)} input image(s)" if request.init_images else "")
            + f" = {request.total_images} images, more than MAX_BATCH={limits.max_batch}"
        )
    for name in ("steps", "guidance_scale"):
        BOUNDS[name].check(name, getattr(request, name))
    if request.guidance_end is not None:
        BOUNDS["guidance_end"].check("guidance_end", request.guidance_end)
    _check_size(request, limits)
    if request.seed is not None:
        BOUNDS["seed"].check("seed", request.seed)
    if request.init_images is not None:
        _check_images(request)
    if request.inpaint is not None:
        if not request.init_images:
            raise ValueError("inpaint: needs the input image the mask belongs to (init_images)")
        request.inpaint.check(request.init_images)
    if not isinstance(request.loras, dict):
        raise ValueError(f"loras: must be a dict of adapter name -> scale, got {type(request.loras).__name__}")
    for name, scale in request.loras.items():
        BOUNDS["lora_scale"].check(f"loras[{name!r}]", scale)
    if request.step_cache is not None and request.step_cache not in STEP_CACHES:
        raise ValueError(f"step_cache: {str(request.step_cache)[:40]!r} is not one of {', '.join(STEP_CACHES)}")
    if request.step_cache_threshold is not None:
        BOUNDS["step_cache_threshold"].check("step_cache_threshold", request.step_cache_threshold)


def _check_prompts(request: GenerationRequest) -> None:
    prompts = request.prompts
    if not prompts:
        raise ValueError("prompt: at least one prompt is required, got an empty list")
    for p in prompts:
        if not isinstance(p, str) or not p.strip():
            raise ValueError(f"prompt: must be non-empty text, got {p!r}")
    if request.negative_prompt is not None and not isinstance(request.negative_prompt, str):
        raise ValueError(f"negative_prompt: must be text or None, got {request.negative_prompt!r}")


def _check_size(request: GenerationRequest, limits: RequestLimits) -> None:
    step = limits.size_multiple
    for name in ("width", "height"):
        value = getattr(request, name)
        if value is None:
            continue
        Bound(step, limits.max_side, integer=True).check(name, value)
        if value % step:
            raise ValueError(f"{name}: {value} is not a multiple of {step} (this model's size step)")
    if request.width and request.height and request.width * request.height > limits.max_pixels:
        raise ValueError(
            f"width x height: {request.width}x{request.height} = {request.width * request.height} pixels, "
            f"more than this model's cap of {limits.max_pixels} on this device (MAX_PIXELS)"
        )


def _check_images(request: GenerationRequest) -> None:
    if not request.init_images:
        raise ValueError("init_images: empty list; pass None for text-to-image")
    for i, image in enumerate(request.init_images):
        if not isinstance(image, Image.Image):
            raise ValueError(f"init_images[{i}]: must be a PIL image, got {type(image).__name__}")
        if image.mode not in IMAGE_MODES:
            raise ValueError(f"init_images[{i}]: image mode {image.mode!r} not supported; use RGB")
        if image.width < 8 or image.height < 8:
            raise ValueError(f"init_images[{i}]: {image.width}x{image.height} is too small")
    BOUNDS["strength"].check("strength", request.strength)
    BOUNDS["image_guidance_scale"].check("image_guidance_scale", request.image_guidance_scale)


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
    step_cache: str = ""  # the step cache it ran with ("FirstBlockCache 0.05"), "" for none (pipelines.step_cache)

    def info(self) -> dict[str, Any]:
        """JSON-friendly summary (what the API returns beside the images)."""
        out = {
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
        if self.step_cache:  # only where one ran: a request without a cache reports what it always did
            out["step_cache"] = self.step_cache
        return out
