"""The keyword arguments of one diffusers call, per family (see pipelines.run.traits).

Only arguments the pipeline's `__call__` names are passed: a pipeline with `**kwargs`
(PixArt, HiDream) would swallow anything else silently.
"""

from __future__ import annotations

import importlib.util
import logging
import math
from typing import Any

import torch

from pipelines.run.traits import PipelineTraits, guidance_kwargs
from pipelines.schema.request import GenerationRequest
from pipelines.video import family

log = logging.getLogger(__name__)


def size_for(request: GenerationRequest, traits: PipelineTraits) -> tuple[int, int]:
    """(width, height) to render: the request's, else for an edit the input's aspect ratio at
    the model's native area (rounded to the size step), else the model's default size."""
    if request.width and request.height:
        return request.width, request.height
    dw, dh = traits.default_size
    if not request.init_images:
        return request.width or dw, request.height or dh
    iw, ih = request.init_images[0].size
    step = traits.size_step
    scale = math.sqrt(dw * dh / (iw * ih))
    width = request.width or max(step, round(iw * scale / step) * step)
    height = request.height or max(step, round(ih * scale / step) * step)
    return width, height


def _clean_caption_available() -> bool:
    """PixArt/Sana's caption cleaning needs bs4 and ftfy; without them diffusers prints a warning
    on every call and turns it off, so ask for it only when it can run."""
    return all(importlib.util.find_spec(m) is not None for m in ("bs4", "ftfy"))


def call_kwargs(
    traits: PipelineTraits,
    params: frozenset[str],
    request: GenerationRequest,
    chunk: list[dict],
    size: tuple[int, int],
    generators: list[Any],
    discrete: bool = True,
    clips: family.VideoAbilities | None = None,
) -> dict[str, Any]:
    """Arguments for `pipe(**kwargs)` rendering `chunk` (work items) at `size`; `discrete`: the pipeline's
    scheduler has a discrete (DDPM-style) schedule, whose image-to-image keeps `int(steps x strength)` steps;
    `clips`: a video model's abilities (its prompt length)."""
    width, height = size
    n = len(chunk)
    kwargs: dict[str, Any] = {
        "prompt": [item["prompt"] for item in chunk],
        "num_inference_steps": request.steps,
        # a clip's call renders one clip: its one generator as itself (LTXImageToVideoPipeline draws a 0.9.1+
        # VAE's decode noise with torch.randn, which takes a generator, not a list)
        "generator": generators[0] if request.num_frames is not None and len(generators) == 1 else generators,
        "output_type": "pil",
        "width": width,
        "height": height,
    }
    negative = request.negative_prompt
    guidance = guidance_kwargs(traits, request.guidance_scale, negative, params)
    if "negative_prompt" in guidance:
        negative = guidance.pop("negative_prompt")
    kwargs.update(guidance)
    if negative:
        kwargs["negative_prompt"] = [negative] * n
    if request.init_images is not None:
        starts = [item["image"] for item in chunk]
        if isinstance(starts[0], torch.Tensor):  # latents (a hires pass's latent mode, pipelines.imaging.hires)
            kwargs["image"] = torch.cat(starts)
        else:
            kwargs["image"] = [image.convert("RGB").resize((width, height)) for image in starts]
        kwargs["strength"] = request.strength
        if discrete and request.strength is not None and "strength" in params:  # not an editor, not a video's frame
            kwargs["num_inference_steps"] = image_to_image_steps(request.steps, request.strength)
        kwargs["image_guidance_scale"] = request.image_guidance_scale
        kwargs["max_area"] = width * height  # Kontext renders at max_area (1024^2) unless told
        kwargs["_auto_resize"] = False  # Kontext: keep the input at the requested size
    if request.guidance_rescale:
        kwargs["guidance_rescale"] = request.guidance_rescale
    if request.num_frames is not None:
        kwargs.update(family.call_kwargs(params, request, kwargs.get("image"), clips))
    if "clean_caption" in params:
        kwargs["clean_caption"] = _clean_caption_available()
    return {k: v for k, v in kwargs.items() if k in params}


def image_to_image_steps(steps: int, strength: float) -> int:
    """The schedule an image-to-image call is given: `steps`, or where steps x strength < 1 the fewest steps
    whose `strength` share is one step. diffusers' SD and SDXL pipelines keep `int(steps * strength)`
    of a discrete schedule, so 3 steps at 0.2 kept none and crashed ("stack expects a non-empty
    TensorList", SDXL: "zip() argument 2 is shorter"); A1111 runs at least one step, at the strength's
    noise level. Flow-matching pipelines (Flux, SD3) keep a float share and always run one."""
    needed = steps
    while int(needed * strength) < 1:
        needed += 1
    return needed
