"""What a request gives back (step 7 of `ImagePipeline.generate`): the images with their metadata
(what ran, for the PNG's infotext: pipelines.pnginfo), timings, hashes, peak memory, and the warnings
for what did not go as asked.
Each function takes the `ImagePipeline` it works for as `p` (typed Any: that module imports this one).
"""

from __future__ import annotations

from typing import Any

from pipelines.control import controlnet as control
from pipelines.control import ip_adapter
from pipelines.imaging import inpaint
from pipelines.imaging.inpaint import EMPTY_MASK_WARNING
from pipelines.run.planning import Finished, Plan, work_items
from pipelines.sampling import samplers, step_cache
from pipelines.schema.request import GenerationRequest, GenerationResult
from pipelines.video import family
from pipelines.weights import hashing, quantization


def assemble(p: Any, plan: Plan, out: Finished, cache: step_cache.Applied | None = None) -> GenerationResult:
    """Step 7: what finished, with its metadata and timings, and warnings for what did not go as asked;
    the step cache it ran with in the result and in each image's metadata."""
    warnings, items = plan.warnings, plan.items
    width, height = plan.size
    if out.oom_splits:
        chunks = -(-len(items) // out.micro)
        warnings.append(f"out of memory: batch split into {chunks} chunks of at most {out.micro} image(s)")
    if out.cancelled:
        warnings.append(f"cancelled: {len(out.images)} of {len(items)} image(s) finished")
    if out.images and out.images[0].size != (width, height) and not plan.prepared:
        w, h = out.images[0].size
        warnings.append(f"{p.traits.class_name} produced {w}x{h} instead of the requested {width}x{height}")
    result = make_result(p, out.images, out.metas, out.inputs, out.timings, warnings, out.cancelled)
    if out.clips:
        result.clips, result.fps = out.clips, float(plan.request.fps or 0.0)
        for meta, clip in zip(result.metadata, out.clips, strict=True):
            meta.update(num_frames=len(clip), fps=result.fps, **family.own_knobs(plan.request))  # the clip's knobs too
    texts = plan.texts
    if texts is not None and texts.kind and texts.clip_skip > 1:  # A1111 writes it only above 1
        for meta in result.metadata:
            meta["clip_skip"] = texts.clip_skip
    if cache is not None:
        result.step_cache = cache.label
        for meta in result.metadata:
            meta.update(cache.metadata())
    return result


def metadata(
    p: Any,
    request: GenerationRequest,
    item: dict,
    width: int,
    height: int,
    guidance_end: float = 1.0,
    rescale: float | None = None,
) -> dict[str, Any]:
    meta = {
        "prompt": item["prompt"],
        "negative_prompt": request.negative_prompt or "",
        "steps": request.steps,
        "sampler": request.sampler or p.scheduler_name,
        "schedule": samplers.schedule_type(request.sampler or p.scheduler_name, p.pipe.scheduler.config),
        "guidance_scale": request.guidance_scale,
        "seed": item["seed"],
        "width": width,
        "height": height,
        "model": p.model_name,
        "loras": dict(request.loras),
        "device": str(p.dm.device),
        "dtype": p.dm.dtype_name,
        "attention": p.dm.attention,
        "attention_components": dict(p.attention_applied),
    }
    if request.init_images is not None and p.traits.image_guidance:
        meta["image_guidance_scale"] = request.image_guidance_scale
    takes_strength = not p.traits.edit or request.inpaint is not None  # an instruction editor's inpaint twin does
    if request.init_images is not None and takes_strength:
        meta["strength"] = request.strength
    if guidance_end < 1.0:
        meta["guidance_end"] = guidance_end
    if rescale:
        meta["guidance_rescale"] = rescale  # only where it ran (0: none, what A1111 leaves out)
    if request.inpaint is not None:
        meta.update(inpaint.metadata(request.inpaint))
    if request.controlnet:
        meta["controlnet"] = [control.describe(unit) for unit in request.controlnet]
    if request.ip_adapter:
        meta["ip_adapter"] = [ip_adapter.describe(prompt) for prompt in request.ip_adapter]
    if request.regions is not None and request.regions.regional_prompts:
        meta.update(request.regions.model_dump())  # Regional Prompter's infotext ("RP Active", "RP Ratios", ...)
    if item.get("template"):
        meta["prompt_template"] = item["template"]  # Dynamic Prompts' "Template"
    if p.tiny_vae.name:  # A1111's "VAE": the tiny autoencoder drew the pixels
        meta["vae"] = p.tiny_vae.name
    quantized = quantization.applied(p.pipe)
    if quantized:  # which weights made the image: a quantized model's output differs from the plain one's
        meta["quantization"] = quantized
    return meta


def make_result(p: Any, images, metas, inputs, timings, warnings, cancelled) -> GenerationResult:
    total = {k: sum(t[k] for t in timings) for k in ("encode", "denoise", "decode", "total")}
    steps = sum(t["steps"] for t in timings)
    total["steps_per_second"] = steps / total["denoise"] if total["denoise"] > 0 else 0.0
    for meta in metas:
        meta["timings"] = {k: round(v, 4) for k, v in total.items()}
        meta.update(hashing.result_hashes(p.source, p.loras.available(), meta.get("loras", {})))
        embeddings = p.embeddings.used(meta["prompt"], meta.get("negative_prompt", ""))
        if embeddings:
            meta["ti_hashes"] = embeddings
    return GenerationResult(
        images=images,
        seeds=[m["seed"] for m in metas],
        metadata=metas,
        timings=total,
        peak_memory=p.dm.memory_stats()["peak"],
        device=str(p.dm.device),
        dtype=p.dm.dtype_name,
        attention=p.dm.attention,
        warnings=warnings,
        cancelled=cancelled,
        inputs=inputs,
        attention_components=dict(p.attention_applied),
    )


def unchanged(p: Any, request: GenerationRequest, item_range: tuple[int, int] | None) -> GenerationResult:
    """An inpaint with an empty mask: each input image back as it was, with a warning (no model work)."""
    items = work_items(request, request.seed)
    if item_range is not None:
        items = items[item_range[0] : item_range[1]]
    images = [item["image"].convert("RGB") for item in items]
    metas = [metadata(p, request, item, *image.size) for item, image in zip(items, images, strict=True)]
    inputs = [item["image"] for item in items]
    return make_result(p, images, metas, inputs, [], [EMPTY_MASK_WARNING], False)
