"""The request schema: what a generation request is, every field, default, bound and rule written once.

`GenerationRequest` is the one description of a request that every front end derives from: the
Gradio tabs and `/generate` `/edit` `/inpaint`, the A1111 and OpenAI HTTP APIs, both CLIs, the
Ray wire and the ZeroGPU call. Each field is declared here once (`Annotated[type, <value type>,
About(...)]` and `Field(default, description=...)`, building blocks in `pipelines.schema.fields`): its
type, default, bounds or choices, a one-line description, its label, the kinds of request that
use it, and the name A1111, OpenAI and the CLI give it. `fields()` lists them flat (the
inpaint's options are sent flat by every front end); tests/test_fields.py checks that every front
end takes every field or says why not, and docs/request-fields.md is generated from `fields()`.

Validation lives here too, in two steps that raise one error type, `RequestError(loc, detail)`:
- the schema's own rules, when a request is made (`GenerationRequest(...)`, or `parse(data)` for
  raw caller values): types, bounds, text hygiene, one task's fields together;
- the serving model's limits (`validate(request, limits)`, the pipeline's `check_inputs`): the
  batch cap, the size step, the largest side and area.
Fields whose default is "the model's" are None in a request until `with_defaults(model)` fills
them from the model that serves it (the engine does at submit, a pipeline when called directly).

Seeds: any seed 0..2^64-1 is accepted (the range of torch's generators, and what ComfyUI writes);
a request without one gets a random seed once (`pin_seed`, below 2^32 as A1111 draws them, so it
stays valid in tools with 32-bit seeds), and image k of a request has seed (seed + k) mod 2^64.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Protocol

from PIL import Image
from pydantic import BaseModel, Field, ValidationError, model_validator

from pipelines.schema.fields import (
    IMAGE_TASKS,
    About,
    Choice,
    Flag,
    Names,
    Picture,
    Prompts,
    Range,
    RequestError,
    Scales,
    Schema,
    Seed,
    Spec,
    Text,
    Units,
    dotted,
    refuse,
    request_error,
)

__all__ = ["RequestError", "dotted", "request_error"]  # re-exported: the schema's error type
from pipelines.schema.control import ControlUnit
from pipelines.schema.detailer import OFF as DETAILER_OFF
from pipelines.schema.detailer import SECOND, Detailer, Detailer2nd
from pipelines.schema.hires import Hires
from pipelines.schema.image_prompt import ImagePrompt
from pipelines.schema.inpaint import DEFAULT_STRENGTH, Inpaint
from pipelines.schema.regions import Regions, is_regional, split_prompt

SEED_SPACE = 2**64  # torch.Generator.manual_seed takes 0..2^64-1
RANDOM_SEED_SPACE = 2**32  # random seeds: short, and valid in tools that keep 32-bit seeds
IMG2IMG_STRENGTH = 0.6  # image-to-image's default strength (an inpaint's is DEFAULT_STRENGTH)
STRENGTH = {"img2img": IMG2IMG_STRENGTH, "inpaint": DEFAULT_STRENGTH}  # a request's strength by its task
# The step caches (what each does: pipelines.sampling.step_cache) and the default threshold of those that
# have one (diffusers' own defaults; TaylorSeer has none).
STEP_CACHES = ("none", "FirstBlockCache", "TaylorSeer", "MagCache")
STEP_CACHE_THRESHOLDS = {"FirstBlockCache": 0.05, "MagCache": 0.06}
# A model's defaults where it names none (its vocabulary, recipe or diffusers signature): 20 steps
# (the signatures' 50 are too many for a first image), CFG 4, image guidance 1.5 (InstructPix2Pix's).
FALLBACK_STEPS, FALLBACK_GUIDANCE, FALLBACK_IMAGE_GUIDANCE = 20, 4.0, 1.5
WILDCARD_MODES = ("random", "combinatorial", "off")  # pipelines.prompts.wildcards
MAX_FRAMES = 257  # a clip's most frames (LTX's 257 at 24 fps: ten seconds)
MAX_TEMPLATES = 10_000  # prompt_template's entries: one per resolved prompt
EDIT_TASKS = frozenset({"img2img", "inpaint"})
VIDEO = frozenset({"video"})
# a timestep-aware VAE's decode (LTX-Video 0.9.1 and later): a video model without one refuses both
DECODE_KNOBS = ("decode_timestep", "decode_noise_scale")
# The request's parts that work on one still picture: a video request refuses them.
IMAGE_ONLY = ("inpaint", "hires", "controlnet", "ip_adapter", "regions", "detailer", "detailer_2nd", "strength", "image_guidance_scale")
TXT2IMG = frozenset({"txt2img"})
IMG2IMG = frozenset({"img2img"})
INPAINT = frozenset({"inpaint"})


class ModelDefaults(Protocol):
    """What `with_defaults` reads of the model serving a request (`ModelInfo` has it)."""

    default_steps: int
    default_guidance: float
    default_image_guidance: float


class GenerationRequest(Schema):
    """One unit of work: prompts x images per prompt (x input images for editing).

    Immutable: `replace(**changes)` is a checked copy. None means "the model's" (or, for
    `strength`, the task's), filled by `with_defaults`."""

    def __init__(self, prompt: Any = None, /, **data: Any) -> None:
        """`GenerationRequest("a cat", steps=20)` (the prompt may come first) or by name; refusals as
        RequestError."""
        if prompt is not None:
            data["prompt"] = prompt
        try:
            super().__init__(**data)
        except ValidationError as exc:
            raise request_error(exc) from None

    @classmethod
    def parse(cls, data: Mapping[str, Any], max_chars: int | None = None) -> GenerationRequest:
        """A request from a caller's raw values (`nest` makes the shape from flat ones); its text at most
        `max_chars` long (MAX_PROMPT_CHARS)."""
        request = cls(**data)
        if max_chars is not None:
            for name in ("prompt", "negative_prompt"):
                texts = getattr(request, name)
                for i, text in enumerate([texts] if isinstance(texts, str | None) else texts):
                    if text is not None and len(text) > max_chars:
                        sub = () if isinstance(texts, str) else (i,)
                        raise RequestError(
                            name, f"{len(text)} characters, more than the limit of {max_chars} (MAX_PROMPT_CHARS)", sub
                        )
        return request

    prompt: Annotated[str | list[str], Prompts(), About("Prompt", a1111="prompt", openai="prompt", cli="prompt")] = Field(
        description="what to draw (an edit: the instruction); a list of prompts makes images of each"
    )
    negative_prompt: Annotated[str | None, Text(), About("Negative prompt", a1111="negative_prompt", cli="--negative")] = Field(
        None, description="what to keep out of the images"
    )
    num_images: Annotated[int, Range(1, 10_000, integer=True), About("Number of images", a1111="batch_size", openai="n", cli="--num-images", step=1)] = Field(
        1, description="images per prompt (and per input image); at most the server's MAX_BATCH in all"
    )  # fmt: skip
    steps: Annotated[int | None, Range(1, 150, integer=True), About("Steps", a1111="steps", infotext="Steps", step=1)] = Field(
        None, description="denoising steps; null: the model's (150: A1111's slider end)"
    )
    guidance_scale: Annotated[float | None, Range(0.0, 50.0), About("Guidance (CFG)", a1111="cfg_scale", cli="--guidance", infotext="CFG scale", step=0.5)] = Field(
        None, description="classifier-free guidance; null: the model's (50: what some distilled models run at)"
    )  # fmt: skip
    width: Annotated[int | None, Range(8, 16384, integer=True), About("Width", a1111="width", openai="size", unit="px")] = Field(
        None, description="a multiple of the model's size step; null: the model's (an edit: the input's aspect ratio)"
    )
    height: Annotated[int | None, Range(8, 16384, integer=True), About("Height", a1111="height", openai="size", unit="px")] = Field(
        None, description="a multiple of the model's size step; null: the model's (an edit: the input's aspect ratio)"
    )
    seed: Annotated[int | None, Seed(), About("Seed", a1111="seed", infotext="Seed")] = Field(
        None, description="0..2^64-1; image k gets seed + k; null or negative: random"
    )
    loras: Annotated[dict[str, float], Scales(Range(-4.0, 4.0)), About("LoRAs", a1111="prompt", cli="--lora", step=0.05)] = Field(
        default_factory=dict, description="LoRA name (from the server's LORA_DIR) -> scale (+-4: beyond that merges are noise)"
    )  # fmt: skip
    styles: Annotated[tuple[str, ...], Names(), About("Styles", a1111="styles", cli="--style")] = Field(
        (), description="styles of the server's STYLES_FILE (A1111's styles.csv), applied in order to prompt and negative"
    )  # fmt: skip
    sampler: Annotated[str | None, Text(), About("Sampler", a1111="sampler_name")] = Field(
        None, description="an A1111 sampler name the model offers (\"DPM++ 2M Karras\"); null: the model's own"
    )
    guidance_end: Annotated[float | None, Range(0.01, 1.0), About("Guidance end", infotext="Guidance end", step=0.01)] = Field(
        None, description="share of the steps with guidance, the last ones unguided (0 would skip all); null: the model's"
    )
    step_cache: Annotated[str | None, Choice(STEP_CACHES), About("Step cache")] = Field(
        None, description="reuse work between steps (DiT models; pipelines.sampling.step_cache); null: the model's"
    )
    step_cache_threshold: Annotated[float | None, Range(0.0, 1.0, low_open=True), About("Step cache threshold", step=0.01)] = Field(
        None, description="higher skips more steps (a relative change: 0 would skip none); null: the method's default"
    )  # fmt: skip
    guidance_rescale: Annotated[float | None, Range(0.0, 1.0), About("Guidance rescale", infotext="CFG rescale", step=0.05)] = Field(
        None, description="pulls guidance's burnt, over-saturated colours back (Lin et al. 2023: v-prediction models run 0.5-0.7); null: the model's (0, none)"
    )  # fmt: skip
    clip_skip: Annotated[int | None, Range(1, 12, integer=True), About("Clip skip", infotext="Clip skip", step=1)] = Field(
        None, description="the CLIP text encoders' layer, counted from the last as A1111 does (1: the last, 2: the one before); SD 1.x/2.x, SDXL, SD3 (their second-to-last is their own: 1 and 2 are the same there); null: 1"
    )  # fmt: skip
    init_images: Annotated[list[Image.Image] | None, Picture(many=True), About("Input images", tasks=EDIT_TASKS | VIDEO, a1111="init_images", openai="image", cli="--init-image")] = Field(
        None, description="the images to edit or inpaint (a video request: the first frame of each clip, image-to-video); null: from the prompt alone"
    )  # fmt: skip
    strength: Annotated[float | None, Range(0.01, 1.0), About("Strength", tasks=EDIT_TASKS, a1111="denoising_strength", infotext="Denoising strength", step=0.01)] = Field(
        None, description=f"how much of each input is re-drawn (0 would keep it); null: {DEFAULT_STRENGTH:g} to inpaint, {IMG2IMG_STRENGTH:g} for image-to-image"
    )  # fmt: skip
    image_guidance_scale: Annotated[float | None, Range(0.0, 10.0), About("Image guidance", tasks=IMG2IMG, a1111="image_cfg_scale", cli="--image-guidance", infotext="Image CFG scale", step=0.1)] = Field(
        None, description="instruction editors: how closely the result keeps the input (InstructPix2Pix runs 1-5); null: the model's"
    )  # fmt: skip
    inpaint: Annotated[Inpaint | None, About("Inpaint", tasks=INPAINT)] = Field(
        None, description="repaint only the mask of each input image (pipelines.imaging.inpaint)"
    )
    hires: Annotated[Hires | None, About("Hires fix", tasks=TXT2IMG)] = Field(
        None, description="a second pass at a larger size over the first's enlarged images (pipelines.imaging.hires)"
    )
    controlnet: Annotated[tuple[ControlUnit, ...], Units(ControlUnit), About("ControlNet", tasks=IMAGE_TASKS, a1111="alwayson_scripts")] = Field(
        (), description="ControlNet units: each a control image, its preprocessor, a model, weight, start/end (pipelines.control.controlnet)"
    )  # fmt: skip
    ip_adapter: Annotated[tuple[ImagePrompt, ...], Units(ImagePrompt, most=4), About("Image prompt", tasks=IMAGE_TASKS, a1111="alwayson_scripts")] = Field(
        (), description="IP-Adapter image prompts: each a reference picture, an adapter and a scale (pipelines.control.ip_adapter)"
    )  # fmt: skip

    num_frames: Annotated[int | None, Range(1, MAX_FRAMES, integer=True), About("Frames", tasks=VIDEO, cli="--frames", infotext="Frames", step=1)] = Field(
        None, description="frames of each clip: set, the request is a video (a video model serves it; 1 frame: a still image); null: an image request"
    )  # fmt: skip
    fps: Annotated[float | None, Range(1.0, 60.0), About("FPS", tasks=VIDEO, infotext="FPS", step=1)] = Field(
        None, description="frames per second of the clip's file (LTX also conditions on it); null: the model's"
    )
    guidance_scale_2: Annotated[float | None, Range(0.0, 50.0), About("Guidance (low noise)", tasks=VIDEO, cli="--guidance-2", infotext="CFG scale 2", step=0.5)] = Field(
        None, description="a two-expert model's (Wan 2.2 A14B) guidance for its low-noise expert; null: the same as guidance_scale"
    )  # fmt: skip
    decode_timestep: Annotated[float | None, Range(0.0, 1.0), About("Decode timestep", tasks=VIDEO, infotext="Decode timestep", step=0.005)] = Field(
        None, description="a timestep-aware VAE's (LTX-Video 0.9.1 and later) decode: the noise level it decodes the latents at (0.03-0.05 recommended); null: the pipeline's (0)"
    )  # fmt: skip
    decode_noise_scale: Annotated[float | None, Range(0.0, 1.0), About("Decode noise", tasks=VIDEO, infotext="Decode noise scale", step=0.005)] = Field(
        None, description="with decode_timestep (LTX-Video 0.9.1 and later): the share of noise mixed into the latents before that decode (0.025 recommended); null: the same as decode_timestep"
    )  # fmt: skip

    wildcards: Annotated[str, Choice(WILDCARD_MODES), About("Wildcards")] = Field(
        "random", description="{a|b} and __name__ (WILDCARD_DIR) in prompts: a random pick per image (by its seed), every combination, or off (the text as written)"
    )  # fmt: skip
    prompt_template: Annotated[tuple[str, ...], Names(most=MAX_TEMPLATES), About("Prompt template", infotext="Template")] = Field(
        (), description="the template each prompt was resolved from (set by the server when it resolves wildcards; kept in the images' metadata)"
    )  # fmt: skip
    regions: Annotated[Regions | None, About("Regional prompts", tasks=IMAGE_TASKS)] = Field(
        None, description="several prompts, each for its own part of the picture (pipelines.sampling.regional)"
    )
    detailer: Annotated[Detailer | None, About("Detailer", tasks=IMAGE_TASKS)] = Field(
        None, description="after the images: find regions with a detector and inpaint each at full resolution (pipelines.imaging.detailer)"
    )  # fmt: skip
    detailer_2nd: Annotated[Detailer2nd | None, About("Detailer 2nd pass", tasks=IMAGE_TASKS)] = Field(  # type: ignore[valid-type]
        None, description="a second detailer pass after the first (ADetailer's 2nd tab)"
    )

    @model_validator(mode="before")
    @classmethod
    def _regional_prompt(cls, data: Any) -> Any:
        """A prompt written with ADDCOL/ADDROW/ADDBASE/ADDCOMM turns regional prompts on (those words mean
        nothing else), split by the keyword's direction, unless the request says how."""
        if not isinstance(data, dict) or data.get("regions") is not None:
            return data
        prompt = data.get("prompt")
        texts = [prompt] if isinstance(prompt, str) else list(prompt) if isinstance(prompt, list | tuple) else []
        regional = [t for t in texts if isinstance(t, str) and is_regional(t)]
        if regional:
            split = "Rows" if split_prompt(regional[0]).rows else "Columns"
            data = {**data, "regions": {"regional_prompts": True, "region_split": split}}
        return data

    @model_validator(mode="after")
    def _one_task(self) -> GenerationRequest:
        """What holds between fields: an inpaint has its images, of its mask's size; hires fix is
        text-to-image's."""
        if self.hires is not None and self.init_images:
            raise refuse("hires fix refines a text-to-image first pass; an edit or inpaint has no first pass", field=("hires",))
        if self.num_frames is not None:
            self._video_only()
        if self.inpaint is None:
            return self
        if not self.init_images:
            raise refuse("needs the input image the mask belongs to (init_images)", field=("inpaint",))
        mask = self.inpaint.mask
        for i, image in enumerate(self.init_images):
            if image.size != mask.size:
                raise refuse(
                    f"{mask.width}x{mask.height} but input image {i} is {image.width}x{image.height}; "
                    "the mask must have its image's size",
                    field=("inpaint", "mask"),
                )
        return self

    def _video_only(self) -> None:
        """A video request (num_frames set) has none of the image-only parts: they work on one picture."""
        for name in IMAGE_ONLY:
            if getattr(self, name) not in (None, ()):
                raise refuse("works on still pictures; a video request (num_frames set) takes none", field=(name,))

    def replace(self, **changes: Any) -> GenerationRequest:
        """A checked copy with `changes` (RequestError as construction)."""
        return type(self)(**{**{name: getattr(self, name) for name in type(self).model_fields}, **changes})

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    @property
    def total_images(self) -> int:
        return len(self.prompts) * self.num_images * max(1, len(self.init_images or []))

    @property
    def task(self) -> str:
        """txt2img | img2img | inpaint | video: which fields apply, and which model serves it (`routes_to_editor`,
        a video model for video)."""
        if self.num_frames is not None:
            return "video"
        return "inpaint" if self.inpaint is not None else ("img2img" if self.init_images else "txt2img")

    def with_defaults(self, model: ModelDefaults) -> GenerationRequest:
        """Every "the model's" default filled from `model`, and the task's strength (one place, so
        the CLI, the APIs and the UI make the same request from the same fields)."""
        changes: dict[str, Any] = {}
        if self.steps is None:
            changes["steps"] = model.default_steps
        if self.guidance_scale is None:
            changes["guidance_scale"] = model.default_guidance
        if self.image_guidance_scale is None:
            changes["image_guidance_scale"] = model.default_image_guidance
        if self.strength is None and self.init_images and self.task in STRENGTH:
            changes["strength"] = STRENGTH[self.task]
        return self.model_copy(update=changes) if changes else self


def routes_to_editor(task: str) -> bool:
    """The routing rule, written once: an edit without a mask (img2img) goes to the model serving edits
    (an instruction editor where one is loaded); text-to-image and inpaints (an instruction editor
    cannot inpaint) go to the main model. `ModelInfo.for_task` and `EditRouter` both ask this."""
    return task == "img2img"


def _walk(model: type[BaseModel]) -> list[Spec]:
    """The fields of `model` as Specs; a nested part (the inpaint) contributes its own fields, flat,
    with the part's tasks (its fields apply where the part does)."""
    out = []
    for name, info in model.model_fields.items():
        about = next(m for m in info.metadata if isinstance(m, About))
        parts = [t for t in typing.get_args(info.annotation) if isinstance(t, type) and issubclass(t, BaseModel)]
        leaf = any(hasattr(m, "__get_pydantic_core_schema__") for m in info.metadata)  # a list of parts is one field
        if parts and not leaf:
            out += [
                dataclasses.replace(s, path=(name, *s.path), about=dataclasses.replace(s.about, tasks=about.tasks))
                for s in _walk(parts[0])
            ]
            continue
        value = next(m for m in info.metadata if hasattr(m, "__get_pydantic_core_schema__"))
        default = None if info.is_required() else info.get_default(call_default_factory=True)
        nullable = type(None) in typing.get_args(info.annotation)
        out.append(Spec(name, (name,), value, about, default, info.description or "", info.is_required(), nullable))
    return out


@functools.cache
def _specs() -> Mapping[str, Spec]:
    """The flat field list, read once from the classes (it cannot change after import)."""
    specs = _walk(GenerationRequest)
    names = [s.name for s in specs]
    assert len(set(names)) == len(names), f"flat field names must be unique: {names}"
    return MappingProxyType({s.name: s for s in specs})


def fields(task: str | None = None) -> list[Spec]:
    """Every field of a request, flat and in the schema's order (what front ends derive from);
    `task`: only those a request of that kind uses."""
    return [spec for spec in _specs().values() if task is None or task in spec.about.tasks]


def unit_fields() -> tuple[str, ...]:
    """The request's lists of parts with a picture each (ControlNet units, image prompts): the front
    ends decode, and the Ray wire carries, the pictures of exactly these."""
    return tuple(s.name for s in fields() if s.kind == "units")


def spec(name: str) -> Spec:
    """One field by its flat name ("steps", "mask_blur")."""
    return _specs()[name]


def names(ecosystem: str) -> dict[str, str]:
    """flat field -> its name in `ecosystem` ("a1111", "openai", "cli"): the schema's `About`, else
    our name (the CLI's: --our-name)."""
    own = {"cli": lambda name: "--" + name.replace("_", "-")}.get(ecosystem, lambda name: name)
    return {s.name: getattr(s.about, ecosystem) or own(s.name) for s in fields()}


def nest(flat: Mapping[str, Any]) -> dict[str, Any]:
    """A front end's flat values as the request's shape: the inpaint's fields under `inpaint` (only
    when a mask is given); unknown names are left out (each front end reads its own fields)."""
    data: dict[str, Any] = {}
    for item in fields():
        if item.name in flat:
            target = data
            for part in item.path[:-1]:
                target = target.setdefault(part, {})
            target[item.path[-1]] = flat[item.name]
    if "inpaint" in data and data["inpaint"].get("mask") is None:
        del data["inpaint"]  # inpaint options without a mask: not an inpaint
    if "hires" in data and not _switched_on(data["hires"].get("hires_fix")):
        # Hires options with hires fix off: left out unread. A1111 clients send them always, some with
        # values that only mean "off" (hr_scale 0, hr_upscaler "none"), which A1111 ignores too.
        del data["hires"]
    if "regions" in data and not _switched_on(data["regions"].get("regional_prompts")):
        del data["regions"]  # likewise: the region options with regional prompts off
    for part, switch in (("detailer", "ad_model"), ("detailer_2nd", "ad_model" + SECOND)):
        if part in data and str(data[part].get(switch) or "").strip().lower() in DETAILER_OFF:
            del data[part]  # a pass without a detector: off (ADetailer's "None")
    return data


def _switched_on(value: Any) -> bool:
    """A flag's value as `nest` reads it: a value the schema would refuse counts as on, so that the
    part stays in the request and its refusal names the field."""
    try:
        return Flag().parse(value)
    except ValueError:  # pydantic's PydanticCustomError is a ValueError
        return True


@dataclass(frozen=True)
class RequestLimits:
    """A loaded model's limits on this device, as one object (`ModelInfo.limits`)."""

    size_multiple: int = 8  # width/height step
    max_batch: int = 16  # most images per request
    max_pixels: int = 2048 * 2048  # largest width x height
    max_side: int = 16384  # largest width or height


def pin_seed(request: GenerationRequest) -> GenerationRequest:
    """The request with its seed fixed: a random one drawn here when it has none.

    Drawn once, before a request is split or sent anywhere, so every part and replica uses the
    same seed and the result reports the seed that reproduces it.
    """
    if request.seed is not None:
        return request
    return request.model_copy(update={"seed": secrets.randbelow(RANDOM_SEED_SPACE)})


def item_seed(seed: int, index: int) -> int:
    """The seed of image `index` of a request: seed + index, wrapping inside the generator's range."""
    return (seed + index) % SEED_SPACE


def validate(request: GenerationRequest, limits: RequestLimits, count: int | None = None) -> None:
    """The serving model's limits (the schema checked everything else when the request was made):
    RequestError naming the field; cheap, runs before any model work.

    `count`: the images actually run now when only a range of the request runs (a pool or a
    batch job splitting it); the batch cap applies to those.
    """
    if request.num_images > limits.max_batch:
        raise RequestError("num_images", f"{request.num_images} is out of range 1..{limits.max_batch} (MAX_BATCH)")
    if (count if count is not None else request.total_images) > limits.max_batch:
        raise RequestError(
            "num_images",
            f"{len(request.prompts)} prompt(s) x {request.num_images} image(s)"
            + (f" x {len(request.init_images)} input image(s)" if request.init_images else "")
            + f" = {request.total_images} images, more than MAX_BATCH={limits.max_batch}",
        )
    step = limits.size_multiple
    for name in ("width", "height"):
        value = getattr(request, name)
        if value is None:
            continue
        if not step <= value <= limits.max_side:
            raise RequestError(name, f"{value} is out of range {step}..{limits.max_side} (this model's limits)")
        if value % step:
            raise RequestError(name, f"{value} is not a multiple of {step} (this model's size step)")
    if request.width and request.height and request.width * request.height > limits.max_pixels:
        raise RequestError(
            "width",
            f"{request.width}x{request.height} = {request.width * request.height} pixels, "
            f"more than this model's cap of {limits.max_pixels} on this device (MAX_PIXELS)",
        )


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
    step_cache: str = ""  # the step cache it ran with ("FirstBlockCache 0.05"), "" for none (pipelines.sampling.step_cache)
    vae_tiling: bool = False  # decoded (and encoded) in tiles: the image was large (TILED_VAE_PIXELS) or memory short
    hires: str = ""  # the hires pass it ran ("64x64 -> 128x128, Lanczos, strength 0.3"), "" for none (pipelines.imaging.hires)
    detailer: str = ""  # the detailer passes it ran ("shapes-segformer: 3 region(s) in 2 of 2 image(s)") (pipelines.imaging.detailer)
    # A video request's clips, each its frames, in the order of `images` (which holds each clip's first frame, so a
    # front end that shows pictures shows the clips' posters); empty for an image request (pipelines.video)
    clips: list[list[Image.Image]] = field(default_factory=list)
    fps: float = 0.0  # the clips' frames per second

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
        if self.vae_tiling:
            out["vae_tiling"] = True
        if self.hires:
            out["hires"] = self.hires
        if self.detailer:
            out["detailer"] = self.detailer
        if self.clips:
            out.update(num_clips=len(self.clips), num_frames=[len(c) for c in self.clips], fps=self.fps)
        return out
