"""A ComfyUI sampler node's inputs as one of our requests: KSampler, KSamplerAdvanced and the
custom-sampling family all end here.

- On an empty latent: text-to-image at the latent's size, `batch` images (seeds seed, seed+1, ...).
- On a video latent (EmptyHunyuanLatentVideo, Wan22ImageToVideoLatent, WanImageToVideo): one video request,
  `num_frames` = its length, its start image as the first frame (image-to-video), the video model's fps.
- On another sampler's latent enlarged by LatentUpscale(By), when only the second pass differs in
  what our hires fix can vary (prompt, sampler, steps, strength): the first request with its hires
  fix on, a latent upscaler and the enlarged size — one engine job, the UI's hires fix exactly.
- On pictures (VAEEncode, or a sampler's output that cannot fuse): image-to-image, `denoise` as the
  strength; with a mask (SetLatentNoiseMask, VAEEncodeForInpaint): inpainting.
- ControlNets applied to the positive conditioning are the request's ControlNet units (the image
  as given: preprocessor "none"); the negative's are the same units in ComfyUI's graphs and are
  not read twice.

`steps` are ComfyUI's: the steps that run. A partial denoise in diffusers runs int(steps x
strength), so the request asks for round(steps / denoise) and runs `steps`, as ComfyUI does.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from pipelines import GenerationRequest, from_any
from pipelines.schema.control import ControlUnit
from pipelines.schema.hires import Hires
from pipelines.schema.inpaint import Inpaint
from pipelines.schema.request import spec

from .values import Conditioning, Latent, Model, Pictures, Sampled

if TYPE_CHECKING:
    from pipelines import ModelInfo

MAX_STEPS = int(spec("steps").value.high)
# ComfyUI's latent upscale methods -> our latent upscalers (pipelines.imaging.upscalers.LATENT)
LATENT_METHODS = {
    "nearest-exact": "Latent (nearest-exact)", "bilinear": "Latent", "area": "Latent (antialiased)",
    "bicubic": "Latent (bicubic)", "bislerp": "Latent",
}  # fmt: skip


class Context(Protocol):
    node: str  # the node running

    def pictures(self, latent: Latent) -> Pictures: ...
    def model_name(self) -> str: ...
    def video_info(self) -> ModelInfo | None: ...
    def warn(self, text: str) -> None: ...
    def latent_upscalers(self) -> tuple[str, ...]: ...


@dataclass(frozen=True)
class SamplerInputs:
    model: Model
    positive: Conditioning
    negative: Conditioning
    latent: Latent
    seed: int
    steps: int
    cfg: float
    sampler_name: str
    scheduler: str
    denoise: float = 1.0


def sample(ctx: Context, given: SamplerInputs) -> Latent:
    """The sampler's output latent: a request to run when its pixels are needed."""
    latent = given.latent
    _check_model(ctx, given)
    if latent.frames is not None:
        return replace(latent, sampled=Sampled(ctx.node, _video(ctx, given)), upscale_method=None, start=None)
    if given.denoise == 0 and not latent.empty:  # ComfyUI: nothing is redrawn
        return latent
    if latent.empty:
        if given.denoise < 1.0:
            ctx.warn(f"node {ctx.node}: denoise {given.denoise:g} on an empty latent runs as 1.0 (text-to-image)")
        fields = {**_common(ctx, given), "width": latent.width, "height": latent.height, "num_images": latent.batch}
        request = GenerationRequest(**fields)
    else:
        request = _fused(ctx, given) or _redraw(ctx, given)
    return Latent(request_width(request, latent), request_height(request, latent), latent.batch, Sampled(ctx.node, request))


def _check_model(ctx: Context, given: SamplerInputs) -> None:
    """A video latent is the video model's, a picture's latent an image model's (the engine routes a request by
    its task, so a graph naming the other model would silently run on this one)."""
    video = ctx.video_info()
    name = given.model.name
    if given.latent.frames is not None and (video is None or name != video.model_name):
        wanted = f"the video model ({video.model_name})" if video else "a video model (none is served here)"
        raise ValueError(f"node {ctx.node}: a video latent is sampled by {wanted}, not {name}: load it with UNETLoader")
    if given.latent.frames is None and video is not None and name == video.model_name and name != ctx.model_name():
        raise ValueError(f"node {ctx.node}: {name} makes clips: sample a video latent with it (EmptyHunyuanLatentVideo, "
                         "Wan22ImageToVideoLatent, WanImageToVideo)")  # fmt: skip


def _video(ctx: Context, given: SamplerInputs) -> GenerationRequest:
    """A video latent's request: `frames` frames from the prompt, or from its first frame (image-to-video)."""
    latent = given.latent
    if not latent.empty:
        raise ValueError(f"node {ctx.node}: a sampler on a made or encoded clip (video-to-video) is not served: a clip starts "
                         "from noise, or from a first frame (WanImageToVideo's start_image)")  # fmt: skip
    if given.denoise < 1.0:
        ctx.warn(f"node {ctx.node}: denoise {given.denoise:g} on a video latent runs as 1.0 (every step, from noise)")
    fields = {**_common(ctx, given), "width": latent.width, "height": latent.height, "num_images": latent.batch,
              "num_frames": latent.frames}  # fmt: skip
    if latent.start is not None:
        fields["init_images"] = [latent.start]
    return GenerationRequest(**fields)


def request_width(request: GenerationRequest, latent: Latent) -> int:
    return latent.width if request.width is None else request.width


def request_height(request: GenerationRequest, latent: Latent) -> int:
    return latent.height if request.height is None else request.height


def _common(ctx: Context, given: SamplerInputs) -> dict[str, Any]:
    resolved = from_any(given.sampler_name, given.scheduler)
    if resolved.note:
        ctx.warn(f"node {ctx.node}: {resolved.note}")
    units = tuple(
        ControlUnit(image=c.image, module="none", model=c.name, weight=c.strength, guidance_start=c.start, guidance_end=c.end)
        for c in given.positive.controls
    )
    return {
        "controlnet": units,
        "prompt": given.positive.text,
        "negative_prompt": given.negative.text or None,
        "seed": given.seed,
        "steps": given.steps,
        "guidance_scale": given.cfg,
        "sampler": resolved.sampler,
        "loras": dict(given.model.loras),
        "clip_skip": -given.positive.clip.last_layer if given.positive.clip.last_layer < -1 else None,
    }


def _second_pass_steps(ctx: Context, given: SamplerInputs) -> int:
    """The request's steps for `given.steps` to run at this denoise (at most the schema's)."""
    wanted = max(1, round(given.steps / given.denoise))
    if wanted > MAX_STEPS:
        ctx.warn(f"node {ctx.node}: {given.steps} steps at denoise {given.denoise:g} would be {wanted} in all; "
                 f"{MAX_STEPS} run ({round(MAX_STEPS * given.denoise)} of them here)")  # fmt: skip
    return min(wanted, MAX_STEPS)


def _fused(ctx: Context, given: SamplerInputs) -> GenerationRequest | None:
    """The first sampler's request with our hires fix as this second pass, where that is exact."""
    latent, first = given.latent, given.latent.sampled
    if first is None or latent.upscale_method is None or latent.mask is not None or given.positive.controls:
        return None
    prior = first.request
    upscaler = LATENT_METHODS.get(latent.upscale_method)
    if (
        prior.task != "txt2img" or prior.hires is not None or upscaler not in ctx.latent_upscalers()
        or dict(given.model.loras) != prior.loras or given.cfg != prior.guidance_scale or given.denoise >= 1.0
    ):  # fmt: skip
        return None
    sampler = _common(ctx, given)["sampler"]
    hires = Hires(
        hires_fix=True,
        hires_upscaler=upscaler,
        hires_width=latent.width,
        hires_height=latent.height,
        hires_steps=_second_pass_steps(ctx, given),
        hires_strength=given.denoise,
        hires_prompt=given.positive.text if given.positive.text != prior.prompt else None,
        hires_negative_prompt=(given.negative.text or None) if (given.negative.text or None) != prior.negative_prompt else None,
        hires_sampler=sampler if sampler != prior.sampler else None,
    )
    return prior.model_copy(update={"hires": hires})


def _redraw(ctx: Context, given: SamplerInputs) -> GenerationRequest:
    """Image-to-image (inpainting under a mask) on the latent's pictures."""
    pictures = ctx.pictures(given.latent)
    fields = {
        **_common(ctx, given),
        "init_images": list(pictures.images),
        "strength": given.denoise,
        "steps": _second_pass_steps(ctx, given),
    }
    if given.latent.mask is not None:
        fields["inpaint"] = Inpaint(mask=given.latent.mask.image, mask_blur=0)
    return GenerationRequest(**fields)
