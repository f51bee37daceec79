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
from pipelines.run.traits import denoiser
from pipelines.sampling import step_cache
from pipelines.schema.errors import UnsupportedTaskError
from pipelines.schema.fields import RequestError
from pipelines.schema.request import GenerationRequest


def check_task(p: Any, request: GenerationRequest) -> None:
    """Refuse what this model cannot do, with a message that says what it can do."""
    t = p.traits
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
        return
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
