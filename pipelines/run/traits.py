"""What a loaded diffusers pipeline can do, and how a request's values map onto its arguments.

Every family names things its own way: Flux-dev's `guidance_scale` is an embedded (distilled)
guidance, Qwen-Image's CFG is `true_cfg_scale` and only runs with a negative prompt, Flux and
Qwen-Image pack latents 2x2 (size step = VAE factor x 2), SD3 patches them (x patch size),
edit pipelines (Kontext, Qwen-Image-Edit, InstructPix2Pix) need an input image, PixArt only
has the legacy `callback`. All of it is read from the pipeline itself - its `__call__`
signature, its image processor, its denoiser's config - not from a table of model names, so a
family diffusers adds tomorrow is described the same way.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
from dataclasses import dataclass
from typing import Any

from pipelines.sampling import step_cache

log = logging.getLogger(__name__)

GUIDANCE_LABELS = {
    "cfg": "CFG scale (classifier-free guidance: higher follows the prompt more, 1 = off)",
    "distilled": "distilled guidance (embedded in the model, no second pass: Flux-dev style)",
    "true_cfg": "true CFG scale (a second pass with the negative prompt; 1 = off)",
    "none": "ignored: this model takes no guidance",
}


@dataclass(frozen=True)
class PipelineTraits:
    """One pipeline's abilities and argument names, read once at load."""

    class_name: str
    params: frozenset[str]
    text_to_image: bool  # runs from a prompt alone
    edit: bool  # an instruction editor: takes an input image, no strength
    image_to_image: str  # "native" (takes image + strength), "from_pipe" (diffusers builds one), "" (none)
    size_step: int
    default_size: tuple[int, int]
    guidance: str  # cfg | distilled | true_cfg | none
    guidance_param: str | None
    default_guidance: float | None  # the pipeline's own default for that argument
    default_steps: int | None
    step_callback: str  # "on_step_end" | "legacy" (callback, callback_steps) | "none" (step_callback_style)
    lora: bool
    image_guidance: bool = False  # takes image_guidance_scale (InstructPix2Pix)
    inpaint: str = ""  # the pipeline class that inpaints: this one (takes mask_image), its from_pipe twin, or ""
    step_cache: bool = False  # its denoiser takes diffusers' enable_cache (pipelines.sampling.step_cache)

    @property
    def inpaint_native(self) -> bool:
        """This pipeline itself takes a mask (Flux Fill, an SD inpainting checkpoint): it needs one."""
        return self.inpaint == self.class_name

    @property
    def guidance_label(self) -> str:
        return GUIDANCE_LABELS[self.guidance]

    @property
    def tasks(self) -> tuple[str, ...]:
        out = ["text-to-image"] if self.text_to_image else []
        if self.edit:
            out.append("instruction edit")
        if self.image_to_image:
            out.append("image-to-image")
        if self.inpaint:
            out.append("inpaint")
        return tuple(out)


def call_params(pipe: Any) -> dict[str, inspect.Parameter]:
    """The parameters of the pipeline's `__call__` (read once per pipeline class: ~50 us a read, twice a request)."""
    return dict(_call_params(type(pipe)))


@functools.cache
def _call_params(cls: type) -> dict[str, inspect.Parameter]:
    params = dict(inspect.signature(cls.__call__).parameters)
    first = next(iter(params.values()), None)  # the class's function: its first parameter is the pipeline itself
    if first is not None and first.kind in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD):
        del params[first.name]
    return params


def denoiser(pipe: Any) -> Any:
    return getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)


def _config(module: Any, key: str, default: Any = None) -> Any:
    return getattr(getattr(module, "config", None), key, default)


def vae_scale_factor(pipe: Any) -> int:
    """Pixels per latent, across: image pipelines' `vae_scale_factor`, Wan's `vae_scale_factor_spatial`, LTX's
    `vae_spatial_compression_ratio`."""
    for name in ("vae_scale_factor", "vae_scale_factor_spatial", "vae_spatial_compression_ratio"):
        if value := getattr(pipe, name, None):
            return int(value)
    return 8


def size_step(pipe: Any) -> int:
    """Width/height step: the VAE factor times the latent packing (Flux/Qwen pack 2x2; their image
    processor is built with that factor) or the denoiser's patch size (SD3, PixArt), at least 8."""
    vae = vae_scale_factor(pipe)
    processor = getattr(pipe, "image_processor", None)
    packed = int(_config(processor, "vae_scale_factor", vae) or vae)
    patch = _config(denoiser(pipe), "patch_size", 1) or 1
    patch = patch[-1] if isinstance(patch, (tuple, list)) else patch  # a video's (frames, height, width): the last
    return math.lcm(8, max(packed, vae * int(patch)))


def default_size(pipe: Any) -> tuple[int, int]:
    """(width, height) the model was trained at: the denoiser's latent sample size x the VAE
    factor, else the pipeline's `default_sample_size` (Flux, Qwen-Image), else its call's default
    width and height (the video families: Wan's 832x480), else 1024."""
    sample = _config(denoiser(pipe), "sample_size")
    if not isinstance(sample, int):
        sample = getattr(pipe, "default_sample_size", None)
    if isinstance(sample, int):
        side = sample * vae_scale_factor(pipe)
        return side, side
    params = call_params(pipe)
    sides = [params[n].default if n in params else None for n in ("width", "height")]
    if all(isinstance(v, int) for v in sides):
        return sides[0], sides[1]
    return 1024, 1024


def img2img_available(pipe: Any) -> bool:
    """Does diffusers have an image-to-image twin of this pipeline (`AutoPipelineForImage2Image.from_pipe`)?"""
    from diffusers.pipelines.auto_pipeline import AUTO_IMAGE2IMAGE_PIPELINES_MAPPING, _get_task_class

    twin = _get_task_class(AUTO_IMAGE2IMAGE_PIPELINES_MAPPING, type(pipe).__name__, throw_error_if_not_exist=False)
    return twin is not None


# Inpainting twins diffusers has but `AutoPipelineForInpainting` does not map (0.42.1), by pipeline class.
EXTRA_INPAINT_TWINS = {
    "FluxKontextPipeline": "FluxKontextInpaintPipeline",  # Kontext's own masked edit, built with from_pipe
}


def inpaint_twin(pipe: Any) -> str:
    """The class name of the inpainting pipeline diffusers builds from this one with `from_pipe`
    (sharing every weight), or "" where it has none (InstructPix2Pix, PixArt, Sana, HiDream)."""
    from diffusers.pipelines.auto_pipeline import AUTO_INPAINT_PIPELINES_MAPPING, _get_task_class

    name = type(pipe).__name__
    if name in EXTRA_INPAINT_TWINS:
        return EXTRA_INPAINT_TWINS[name]
    twin = _get_task_class(AUTO_INPAINT_PIPELINES_MAPPING, name, throw_error_if_not_exist=False)
    return twin.__name__ if twin is not None else ""


def _guidance(pipe: Any, params: dict[str, inspect.Parameter]) -> tuple[str, str | None]:
    """Which argument the UI's guidance slider drives.

    A denoiser with `guidance_embeds` (Flux-dev, Kontext) takes distilled guidance through
    `guidance_scale`. Without it, a pipeline that has `true_cfg_scale` (Qwen-Image, Flux-schnell)
    ignores `guidance_scale`: its real CFG is `true_cfg_scale`. Everything else is classic CFG.
    """
    if _config(denoiser(pipe), "guidance_embeds", False) and "guidance_scale" in params:
        return "distilled", "guidance_scale"
    if "true_cfg_scale" in params:
        return "true_cfg", "true_cfg_scale"
    if "guidance_scale" in params:
        return "cfg", "guidance_scale"
    return "none", None


def _default(params: dict[str, inspect.Parameter], name: str | None) -> Any:
    if name is None or name not in params:
        return None
    value = params[name].default
    return None if value is inspect.Parameter.empty else value


def step_callback_style(params: Any) -> str:
    """How a pipeline whose `__call__` takes `params` reports steps: "on_step_end", "legacy" (PixArt's
    and SD's T2I-Adapter pipeline's `callback(step, timestep, latents)`), or "none"."""
    if "callback_on_step_end" in params:
        return "on_step_end"
    if "callback" in params and "callback_steps" in params:
        return "legacy"
    return "none"


def inspect_pipeline(pipe: Any) -> PipelineTraits:
    params = call_params(pipe)
    takes_image = "image" in params
    takes_mask = "mask_image" in params
    edit = takes_image and "strength" not in params and not takes_mask
    native_i2i = takes_image and "strength" in params and not takes_mask
    i2i = "native" if native_i2i else ("from_pipe" if not takes_image and img2img_available(pipe) else "")
    guidance, guidance_param = _guidance(pipe, params)
    callback = step_callback_style(params)
    default_guidance = _default(params, guidance_param)
    default_steps = _default(params, "num_inference_steps")
    return PipelineTraits(
        class_name=type(pipe).__name__,
        params=frozenset(params),
        text_to_image=not takes_image,
        edit=edit,
        image_to_image=i2i,
        size_step=size_step(pipe),
        default_size=default_size(pipe),
        guidance=guidance,
        guidance_param=guidance_param,
        default_guidance=float(default_guidance) if isinstance(default_guidance, (int, float)) else None,
        default_steps=int(default_steps) if isinstance(default_steps, int) else None,
        step_callback=callback,
        lora=hasattr(pipe, "load_lora_weights"),
        image_guidance="image_guidance_scale" in params,
        inpaint=type(pipe).__name__ if takes_mask else inpaint_twin(pipe),
        step_cache=step_cache.supported(denoiser(pipe)),
    )


def guidance_kwargs(traits: PipelineTraits, value: float, negative: str | None, params: frozenset[str]) -> dict:
    """The call arguments for the slider's `value` on this pipeline."""
    if traits.guidance_param is None or traits.guidance_param not in params:
        return {}
    out: dict[str, Any] = {traits.guidance_param: value}
    if traits.guidance == "true_cfg" and value > 1 and not negative and "negative_prompt" in params:
        out["negative_prompt"] = " "  # true CFG runs only with a negative prompt (Qwen-Image's own examples use " ")
    return out
