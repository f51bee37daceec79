"""The refusals before any model work: what this model cannot do, said with what it can
(`check_task`, step 1 of `ImagePipeline.generate`).
Each function takes the `ImagePipeline` it works for as `p` (typed Any: that module imports this one).
"""

from __future__ import annotations

from typing import Any

from pipelines.control import controlnet as control
from pipelines.control import ip_adapter
from pipelines.imaging import hires
from pipelines.imaging.inpaint import INPAINT_FAMILIES
from pipelines.run.traits import denoiser, vae_scale_factor
from pipelines.sampling import step_cache, vae_tiling
from pipelines.schema.errors import UnsupportedTaskError
from pipelines.schema.fields import RequestError
from pipelines.schema.request import GenerationRequest
from pipelines.video import memory as video_memory
from pipelines.weights import quantization


def check_task(p: Any, request: GenerationRequest) -> None:
    """Refuse what this model cannot do, with a message that says what it can do."""
    t = p.traits
    if p.xla is not None:  # the TPU route (pipelines.run.xla_route)
        from pipelines.run.xla_route import request_refusal

        why = request_refusal(request)
        if why:
            raise UnsupportedTaskError(f"{p.model_name} on {p.dm.device}: {why}")
    if request.hires is not None:  # RequestError naming the hires field (the engine asked this at submit too)
        hires.check(request, p.model_info())
    if request.step_cache not in (None, step_cache.NONE) and p.runtime is not None and p.runtime.plan.strict:
        raise UnsupportedTaskError(
            f"{torch_needed(p, request)}, so {request.step_cache} cannot be used with RUNTIME=openvino "
            "(RUNTIME=auto runs such a request on torch; RUNTIME=torch runs every request there)"
        )
    if request.step_cache not in (None, step_cache.NONE) and not t.step_cache:
        raise UnsupportedTaskError(
            f"{p.model_name} ({t.class_name}) has no step cache: diffusers gives its "
            f"{type(denoiser(p.pipe)).__name__} none, so {request.step_cache} cannot be used. "
            f"Families with step caching: {step_cache.FAMILIES}"
        )
    if (request.task == "video") != (p.clips is not None):
        what = "makes clips: a request to it names num_frames" if p.clips else "makes images: a video model serves num_frames"
        raise UnsupportedTaskError(f"{p.model_name} ({t.class_name}) {what}")
    if p.clips is not None:
        p.clips.accept(request)  # frames, first frame, second expert (RequestError naming the field)
        if request.loras and not t.lora:
            raise UnsupportedTaskError(f"{t.class_name} has no LoRA loader in diffusers; LoRAs cannot be used with it")
        return check_memory(p, request)
    if request.controlnet:
        check_control(p, request)
    if request.ip_adapter:
        check_image_prompts(p, request)
    if request.inpaint is not None or t.inpaint_native:
        return check_inpaint(p, request)
    if request.init_images is None and not t.text_to_image:
        raise UnsupportedTaskError(
            f"{p.model_name} ({t.class_name}) is an image-editing model: it needs an input image "
            "(use the Edit tab or pass images); it cannot generate from a prompt alone"
        )
    if request.init_images is not None and not (t.edit or t.image_to_image):
        raise UnsupportedTaskError(
            f"{p.model_name} ({t.class_name}) does text-to-image only: diffusers has no image-to-image "
            "pipeline for this family, so it cannot edit images"
        )
    if request.loras and not t.lora:
        raise UnsupportedTaskError(f"{t.class_name} has no LoRA loader in diffusers; LoRAs cannot be used with it")


def check_memory(p: Any, request: GenerationRequest) -> None:
    """A clip that cannot fit the device's free memory (DeviceManager.memory_stats) is refused before any model
    work, naming what would fit (pipelines.video.memory); none where the device cannot say what is free."""
    free = p.dm.memory_stats()["free"]
    if free is None:
        return
    shape, weights, clip = clip_memory(p, request)
    if video_memory.estimate(shape, weights, clip).needed <= free:
        return
    device = video_memory.Device(str(p.dm.device), free, can_offload=p.dm.backend != "cpu")
    quantized = bool(set(video_memory.PHASES["denoiser"]) & set(quantization.applied(p.pipe)))
    others = video_memory.alternatives(p.pipe, p.component_bytes, p.memory_savers, quantized, device)
    raise video_memory.refusal(shape, weights, clip, device, p.size_multiple, others)


def clip_memory(p: Any, request: GenerationRequest) -> tuple[video_memory.VideoShape, video_memory.Weights, video_memory.Clip]:
    """What the memory estimate of a video request reads: the model's shape, its weights per the memory plan, and
    the clip as it will run (its size, a guidance pass, a tiled decode, the math attention path)."""
    width, height = p.render_size(request)
    guidance = request.guidance_scale if request.guidance_scale is not None else p.default_guidance
    vae = p.pipe.vae  # tiled as pipelines.sampling.vae_tiling.applied decides: at load, or above TILED_VAE_PIXELS
    tiled = "vae_tiling" in p.memory_savers or (
        width * height > p._tiled_vae_pixels and vae_tiling.tiles(vae)
    )
    clip = video_memory.Clip(request.num_frames, width, height, guidance > 1, tiled, p.dm.attention == "vanilla")
    shape = video_memory.read_shape(p.pipe, p.clips.frame_step, vae_scale_factor(p.pipe), p.clips.text_length, p.dm.dtype)
    return shape, video_memory.plan_weights(p.pipe, p.component_bytes, p.memory_savers), clip


def torch_needed(p: Any, request: GenerationRequest) -> str | None:
    """Why this request needs the torch modules where the OpenVINO runtime runs the networks, or None.
    RUNTIME=auto runs such a request on torch (ImagePipeline.generate); RUNTIME=openvino refuses a step
    cache and runs regional Attention as Latent (pipelines.run.regions), as it always did."""
    if p.runtime is None:
        return None
    if request.step_cache not in (None, step_cache.NONE):
        return f"the step cache {request.step_cache} skips torch blocks inside the denoiser, which OpenVINO runs as one graph"
    regions = request.regions
    if regions is not None and regions.regional_prompts and regions.region_method == "Attention":
        return "regional prompts' Attention mode changes the denoiser's cross-attention, inside OpenVINO's graph"
    return None


def check_control(p: Any, request: GenerationRequest) -> None:
    """Units need this family's ControlNet pipeline for the task, and models this server has."""
    try:
        control.twin_class(p.traits.class_name, request.task)
    except control.ControlError as exc:
        raise UnsupportedTaskError(f"{p.model_name}: {exc}") from None
    for i, unit in enumerate(request.controlnet):
        try:
            p.controlnets.check(unit.model)
        except control.ControlError as exc:
            raise RequestError("controlnet", str(exc), (i,)) from None
    try:  # the models' kinds together (T2I-Adapters, union models): their config.json, nothing loaded
        classes = [p.controlnets.class_of(unit.model) for unit in request.controlnet]
        control.check_kinds(p.traits.class_name, request.task, classes)
    except control.ControlError as exc:
        raise UnsupportedTaskError(f"{p.model_name}: {exc}") from None


def check_image_prompts(p: Any, request: GenerationRequest) -> None:
    """Image prompts need a family diffusers loads IP-Adapters into and adapters this server has."""
    try:
        ip_adapter.check_family(p.traits.class_name, len(request.ip_adapter))
    except ip_adapter.IpAdapterError as exc:
        raise UnsupportedTaskError(f"{p.model_name}: {exc}") from None
    for i, prompt in enumerate(request.ip_adapter):
        try:
            p.ip_adapters.check(prompt.model)
        except ip_adapter.IpAdapterError as exc:
            raise RequestError("ip_adapter", str(exc), (i,)) from None


def check_inpaint(p: Any, request: GenerationRequest) -> None:
    """An inpaint needs a model that inpaints; a model that only inpaints needs a mask."""
    t = p.traits
    if request.inpaint is None:
        raise UnsupportedTaskError(
            f"{p.model_name} ({t.class_name}) is an inpainting model: it needs an input image and a mask "
            "(use Inpaint, or the /inpaint API)"
        )
    if not t.inpaint:
        raise UnsupportedTaskError(
            f"{p.model_name} ({t.class_name}) cannot inpaint: diffusers has no inpainting pipeline for this "
            f"family. Families that inpaint and outpaint: {INPAINT_FAMILIES}"
        )
    if request.loras and not t.lora:
        raise UnsupportedTaskError(f"{t.class_name} has no LoRA loader in diffusers; LoRAs cannot be used with it")
