"""The diffusers calls of one plan (steps 5-6 of `ImagePipeline.generate`): micro-batches with their own
CPU generators, halved on out-of-memory; progress, previews, the prompt switch and guidance end through
the step callback (pipelines.run.callbacks); Stop through the pipeline's interrupt.
Each function takes the `ImagePipeline` it works for as `p` (typed Any: that module imports this one).
"""

from __future__ import annotations

import contextlib
import functools
import logging
from typing import Any

import torch

from pipelines.prompts.plan import PromptSwitch
from pipelines.run import regions, results
from pipelines.run.callbacks import (
    CallMonitor,
    CancelFn,
    Chained,
    Interrupted,
    LegacyCallback,
    PreviewFn,
    Previews,
    ProgressFn,
)
from pipelines.run.calls import call_kwargs
from pipelines.run.planning import Finished, Plan
from pipelines.run.traits import call_params, step_callback_style
from pipelines.sampling import samplers
from pipelines.sampling.guidance import DEFAULT_GUIDANCE_END, GuidanceCutoff
from pipelines.schema.errors import OutOfMemoryError
from pipelines.schema.request import GenerationRequest
from pipelines.video import refine
from pipelines.video.first_frame import KEEPS_FIRST_FRAME, FirstFrame

log = logging.getLogger(__name__)

# Out-of-memory messages of the backends that do not raise torch.OutOfMemoryError.
OOM_MARKERS = ("out of memory", "NPU out of memory", "MPS backend out of memory", "ACL_ERROR_RT_MEMORY_ALLOCATION")


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m.lower() in str(exc).lower() for m in OOM_MARKERS)


def denoise(
    p: Any, plan: Plan, progress: ProgressFn | None, should_cancel: CancelFn | None, preview: PreviewFn | None
) -> Finished:
    """Steps 5-6: the items in micro-batches (halved on out-of-memory), progress and cancel
    through the step callback. A chunk interrupted by cancel is dropped: it is only partly denoised."""
    items = plan.items
    # a video model renders one clip per call (its image-to-video twin encodes a batch's first frames once per generator)
    most = 1 if p.clips is not None else p.options.micro_batch
    out = Finished(micro=min(len(items), most, p.micro_batch_limit.get(plan.size, 10**6)))
    p.dm.reset_peak_memory()
    done = 0
    steps_done = 0
    while done < len(items):
        if should_cancel is not None and should_cancel():
            out.cancelled = True
            break
        chunk = items[done : done + out.micro]
        draft_steps = steps_for(p, plan.request, plan.accepted)
        steps_per_call = draft_steps + refine_steps(p, plan.request)
        total_steps = steps_done + steps_per_call * -(-(len(items) - done) // out.micro)
        call, switch = chunk_kwargs(p, plan, chunk)
        changers = [c for c in (switch, first_frame(p, plan, chunk)) if c is not None]
        first = plan.first + done
        timer = CallMonitor(plan.pipe, p.dm, progress, should_cancel, steps_done, total_steps, first, draft_steps)
        try:
            output, timing = run_call(p, plan.pipe, call, timer, preview, first, plan.guidance_end, changers)
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            # what finished so far, for OutOfMemoryError (nothing was cancelled yet)
            partial = functools.partial(
                results.make_result, p, out.images, out.metas, out.inputs, out.timings, plan.warnings, False
            )
            out.micro = shrink_after_oom(p, exc, out.micro, plan.size, partial)
            out.oom_splits += 1
            continue
        if steps_per_call > draft_steps and not timer.cancelled:  # a video model's refine pass (pipelines.video.refine)
            timer = CallMonitor(p.refiner, p.dm, progress, should_cancel, steps_done + draft_steps, total_steps, first,
                                steps_per_call - draft_steps)  # fmt: skip
            output, seconds = refined(p, plan, chunk, output, timer)
            timing = {**timing, "refine": seconds, "total": timing["total"] + seconds}
        if timer.cancelled:
            out.cancelled = True
            break
        out.timings.append(timing)
        steps_done += steps_per_call
        for item, image in zip(chunk, _outputs(output, out.clips), strict=True):
            image = plan.finish(item, image)
            out.images.append(image)
            out.inputs.append(item["image"])
            rescale = plan.request.guidance_rescale if "guidance_rescale" in plan.accepted else None  # what ran
            out.metas.append(results.metadata(p, plan.request, item, *image.size, plan.guidance_end, rescale))
            if steps_per_call > draft_steps:
                out.metas[-1].update(refiner=p.refiner_spec.name, refiner_strength=p.refiner_spec.strength)
        done += len(chunk)
    return out


def _outputs(output: Any, clips: list[list[Any]]) -> list[Any]:
    """A call's pictures, one per item: a video pipeline's clips go to `clips` and each gives its first frame
    (a clip of one frame is a picture: num_frames=1 returns images)."""
    if not hasattr(output, "frames"):
        return output.images
    clips += [list(frames) for frames in output.frames if len(frames) > 1]
    return [frames[0] for frames in output.frames]


def chunk_kwargs(p: Any, plan: Plan, chunk: list[dict[str, Any]]) -> tuple[dict[str, Any], PromptSwitch | None]:
    """The diffusers call of one micro-batch: its own CPU generators, its prompts as the encoders take
    them (pipelines.prompts.plan), and the step callback that changes them between steps, if any."""
    generators = [p.dm.create_generator(item["seed"]) for item in chunk]
    if plan.regional is not None:  # the other regions' embeddings of these items (pipelines.run.regions)
        plan.regional.chunk = regions.chunk_embeds(plan, chunk)
    fitted = [{**item, "prompt": plan.prompts[item["prompt"]]} for item in chunk]
    discrete = samplers.discrete(plan.pipe.scheduler)
    if not plan.prepared:
        kwargs = call_kwargs(p.traits, plan.accepted, plan.request, fitted, plan.size, generators, discrete, p.clips)
        return plan.texts.apply({**kwargs, **plan.control})
    prepared = [plan.prepared[id(item["image"])] for item in chunk]
    fitted = [{**item, "image": prep.image} for item, prep in zip(fitted, prepared, strict=True)]
    kwargs = call_kwargs(p.traits, plan.accepted, plan.request, fitted, plan.size, generators, discrete, p.clips)
    kwargs["mask_image"] = [prep.mask for prep in prepared]
    return plan.texts.apply({**kwargs, **plan.control})


def refine_steps(p: Any, request: GenerationRequest) -> int:
    """The steps of a video model's refine pass for `request` (pipelines.video.refine); 0 without one, or for a
    still picture (one frame: nothing moves)."""
    if p.refiner is None or (request.num_frames or 1) < 2:
        return 0
    return p.refiner_spec.steps(request.steps)


def refined(p: Any, plan: Plan, chunk: list[dict[str, Any]], output: Any, timer: CallMonitor) -> tuple[Any, float]:
    """(`output` with its clip redrawn by the model's refiner, the pass's seconds): one clip a call, its steps reported
    and Stop checked by `timer`."""
    frames = output.frames[0]
    generator = p.dm.create_generator(chunk[0]["seed"])
    prompt = plan.prompts[chunk[0]["prompt"]]
    try:
        timer.begin()
        output.frames[0] = refine.refine(p.refiner, p.refiner_spec, list(frames), plan.request, prompt, generator, timer)
    finally:
        timing = timer.finish()
        p.refiner._interrupt = False
    return output, timing["total"]


def first_frame(p: Any, plan: Plan, chunk: list[dict[str, Any]]) -> FirstFrame | None:
    """The step callback that keeps a clip's first frame, for image-to-video on a video model without an image
    input (pipelines.video.first_frame), or None."""
    if p.clips is None or plan.request.init_images is None or p.clips.image_to_video not in KEEPS_FIRST_FRAME:
        return None
    image = chunk[0]["image"].convert("RGB").resize(plan.size)
    return FirstFrame(image, p.dm.create_generator(chunk[0]["seed"]))


def run_call(
    p: Any,
    pipe: Any,
    call: dict[str, Any],
    timer: CallMonitor,
    preview: PreviewFn | None,
    first: int,
    guidance_end: float = DEFAULT_GUIDANCE_END,
    changers: list[Any] = (),
):
    """One diffusers call with the step callback (previews, then what changes the step's tensors: the prompt
    switch, a kept first frame, guidance end); returns (output, phase timings)."""
    callback = timer
    if preview is not None:
        callback = Previews(timer, p.preview_decoder, preview, first, p.options.preview_every)
    style = step_callback_style(call_params(pipe))  # a twin's may differ (SD's T2I-Adapter)
    if style == "on_step_end":
        call["callback_on_step_end"] = callback
        changers = [*changers, *([GuidanceCutoff(pipe, guidance_end)] if guidance_end < 1.0 else [])]
        if changers:
            chained = Chained(callback, *changers)
            call["callback_on_step_end"] = chained
            call["callback_on_step_end_tensor_inputs"] = chained.tensor_inputs
    elif style == "legacy":  # PixArt: callback(step, timestep, latents), no interrupt flag
        call["callback"] = LegacyCallback(pipe, callback)
        call["callback_steps"] = 1
    output = None
    try:
        timer.begin()
        with p.dm.attention_context(), contextlib.nullcontext() if p.runtime is None else p.runtime.serving(pipe):
            output = pipe(**call)
    except Interrupted:
        pass  # a legacy-callback pipeline stopped by Stop: timer.cancelled says so
    finally:
        timing = timer.finish()
        pipe._interrupt = False
    if timer.progress is not None and not timer.cancelled:
        timer.progress(timer.base + timer.call_steps, timer.total, timer.first_image)  # done == total
    if preview is not None and output is not None and hasattr(output, "images"):
        callback.learn(output.images)
    return output, timing


def shrink_after_oom(p: Any, exc: Exception, micro: int, size: tuple[int, int], partial) -> int:
    """The halved micro-batch after an out-of-memory error, or OutOfMemoryError (with what
    finished) when one image at a time does not fit either."""
    p.dm.empty_cache()
    if micro == 1:
        raise OutOfMemoryError(
            f"out of memory at {size[0]}x{size[1]} even with one image at a time on {p.dm.device}; "
            "try a smaller width/height, or MEMORY_MODE=max to offload weights",
            partial(),
        ) from exc
    p.micro_batch_limit[size] = micro // 2
    log.warning("out of memory at micro-batch %d; retrying with %d", micro, micro // 2)
    return micro // 2


def steps_for(p: Any, request: GenerationRequest, accepted: set[str]) -> int:
    """Denoising steps one call runs: image-to-image skips the first (1 - strength) of them."""
    if request.init_images is None or "strength" not in accepted:
        return request.steps
    return max(1, int(request.steps * request.strength))
