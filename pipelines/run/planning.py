"""One request's plan, fixed before the first diffusers call (steps 2-4 of `ImagePipeline.generate`):
the pipeline for its task and its LoRAs, one seed per image, what the call takes, the prompts as the
encoders take them (pipelines.prompts), the control units' and image prompts' arguments
(pipelines.control), an inpaint's crops (pipelines.imaging.inpaint), the step cache, and the warnings
for what will not run as asked.
Each function takes the `ImagePipeline` it works for as `p` (typed Any: that module imports this one).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pipelines.control import controlnet as control
from pipelines.control import ip_adapter
from pipelines.imaging import inpaint
from pipelines.prompts import styles
from pipelines.prompts.plan import PromptPlan
from pipelines.run import regions
from pipelines.run.calls import size_for
from pipelines.run.traits import call_params
from pipelines.sampling.guidance import supports_guidance_end
from pipelines.sampling.regional import Regional
from pipelines.sampling.step_cache import StepCache
from pipelines.schema.errors import UnsupportedTaskError
from pipelines.schema.regions import Split
from pipelines.schema.request import GenerationRequest, item_seed


@dataclasses.dataclass
class Plan:
    """One request's work, fixed before the first diffusers call (`plan`)."""

    pipe: Any
    request: GenerationRequest
    items: list[dict[str, Any]]  # the work items run here (a range of the request's, see `work_items`)
    first: int  # index of items[0] among the request's items
    accepted: frozenset[str]  # the parameters the diffusers call takes
    prompts: dict[str, str]  # the user's prompt -> the `prompt` argument (pipelines.prompts.weights)
    size: tuple[int, int]
    guidance_end: float
    warnings: list[str]
    prepared: dict[int, inpaint.Prepared] = dataclasses.field(default_factory=dict)  # by id(input image)
    cache: StepCache | None = None  # the step cache it runs with (pipelines.sampling.step_cache)
    texts: PromptPlan | None = None  # weighted and long prompts (pipelines.prompts.weights)
    control: dict[str, Any] = dataclasses.field(default_factory=dict)  # the units' and image prompts' arguments
    regional: Regional | None = None  # regional prompts (pipelines.run.regions, pipelines.sampling.regional)
    splits: dict[str, Split] = dataclasses.field(default_factory=dict)  # each prompt's regions

    def finish(self, item: dict[str, Any], image: Any) -> Any:
        """An output as the user gets it: an inpaint pasted back into its original (pipelines.imaging.inpaint)."""
        prepared = self.prepared.get(id(item["image"]))
        return image if prepared is None else prepared.paste_back(image)


@dataclasses.dataclass
class Finished:
    """What the micro-batch loop finished (pipelines.run.denoise), and how it split the batch."""

    micro: int  # the micro-batch size in use (the last one after out-of-memory splits)
    images: list[Any] = dataclasses.field(default_factory=list)
    metas: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    inputs: list[Any] = dataclasses.field(default_factory=list)
    timings: list[dict[str, float]] = dataclasses.field(default_factory=list)
    clips: list[list[Any]] = dataclasses.field(default_factory=list)  # a video request's frames, one list per item
    cancelled: bool = False
    oom_splits: int = 0


def work_items(request: GenerationRequest, seed: int) -> list[dict[str, Any]]:
    """Every image of a request in order (input image, prompt, copy), item i with seed `seed + i`.

    The order and the seeds are what make a request splittable: any contiguous range of
    these items gives the same images wherever it runs (`generate(item_range=...)`).
    """
    items: list[dict[str, Any]] = []
    templates = request.prompt_template if len(request.prompt_template) == len(request.prompts) else ()
    for image in request.init_images or [None]:
        for index, prompt in enumerate(request.prompts):
            for _ in range(request.num_images):
                item = {"prompt": prompt, "image": image, "seed": item_seed(seed, len(items))}
                if templates:  # the wildcard template it was resolved from (pipelines.prompts.wildcards)
                    item["template"] = templates[index]
                items.append(item)
    return items


def styled(p: Any, request: GenerationRequest) -> GenerationRequest:
    """`request` with its styles applied to the prompt(s) and the negative (pipelines.prompts.styles); the
    result records the prompt that ran, as A1111's does. Names this server lacks stay in `styles`
    for the warning (`request_warnings`)."""
    known = tuple(name for name in request.styles if name in p.styles)
    if not known:
        return request
    styled = [styles.apply(p.styles, known, text, request.negative_prompt or "") for text in request.prompts]
    prompt = [text for text, _ in styled] if isinstance(request.prompt, list) else styled[0][0]
    unknown = tuple(name for name in request.styles if name not in p.styles)  # said in the result
    return request.replace(prompt=prompt, negative_prompt=styled[0][1], styles=unknown)


def plan(
    p: Any,
    request: GenerationRequest,
    item_range: tuple[int, int] | None,
    items: list[dict[str, Any]] | None = None,
    first: int = 0,
) -> Plan:
    """Steps 2-4: the pipeline and its LoRAs, one seed per image, and what this pipeline takes,
    all fixed before the first diffusers call."""
    # 2-3. pipeline and LoRAs
    p.ip_loaded.use(request.ip_adapter)  # into the shared UNet (before a twin is built over it), or out
    pipe = p.twins.for_request(request)
    scales = {**p.base_loras, **request.loras}
    p.loras.activate(scales)
    if request.ip_adapter:
        p.ip_loaded.lend(pipe)
    if p.runtime is not None:  # a new LoRA or IP-Adapter set gets its own graphs (pipelines.weights.openvino)
        p.runtime.use_loras(p.loras.key(scales))
        p.runtime.use_ip_adapters(p.ip_loaded.key(request.ip_adapter))
    # 4. one seed per image
    size = size_for(request, p.traits)
    if items is None:
        items = p.work_items(request, request.seed)  # generate() pinned the seed
        if item_range is not None:
            first = item_range[0]
            items = items[item_range[0] : item_range[1]]
    accepted = frozenset(call_params(pipe))
    warnings = request_warnings(p, request, pipe, accepted)
    warnings += size_warnings(p.trained_sides, request.task, size)
    guidance_end = guidance_end_for(p, request, pipe, warnings)
    texts = PromptPlan(pipe, accepted, request.steps, p.embeddings.words, request.clip_skip or 1)
    warnings += texts.warnings(request.prompts, request.negative_prompt)
    prompts = {text: texts.text(text) for text in request.prompts}  # metadata keeps the prompt as written
    plan = Plan(pipe, request, items, first, accepted, prompts, size, guidance_end, warnings, texts=texts)
    plan.cache = step_cache_for(p, request, warnings)
    if request.regions is not None and request.regions.regional_prompts:
        regions.plan_regions(p, plan)
    if request.inpaint is not None:
        plan_inpaint(p, plan)
    if request.controlnet:
        maps = [control.prepare(unit, plan.size, p.annotators) for unit in request.controlnet]
        models = [p.controlnets.get(unit.model) for unit in request.controlnet]
        modes = control.control_modes(request.controlnet, models)
        plan.control, said = control.call_kwargs(request.controlnet, maps, accepted, request.task, modes)
        plan.warnings += said
    if request.ip_adapter and "ip_adapter_image" not in accepted:
        raise UnsupportedTaskError(
            f"{type(pipe).__name__} takes no image prompts in diffusers: send the image prompts without the units, or the "
            f"units in text-to-image"
        )
    plan.control.update(ip_adapter.call_kwargs(request.ip_adapter))
    return plan


def plan_inpaint(p: Any, plan: Plan) -> None:
    """Each input image's start, mask and paste-back (pipelines.imaging.inpaint); "only masked" renders the
    masked crop at the request's size, else at the crop's aspect ratio at the model's native area."""
    request, spec = plan.request, plan.request.inpaint
    mask = inpaint.binary_mask(spec.mask, spec.invert_mask)
    if spec.only_masked:
        asked = (request.width, request.height) if request.width and request.height else None
        plan.size = inpaint.size_for(spec, mask, asked, p.default_size, p.size_multiple)
    for image in request.init_images:
        plan.prepared[id(image)] = inpaint.prepare(image, mask, spec, plan.size)


def step_cache_for(p: Any, request: GenerationRequest, warnings: list[str]) -> StepCache | None:
    """The request's step cache ("none": off), else the model's default (STEP_CACHE, the recipe's);
    check_task refused a named one where the model has none."""
    default = p.default_step_cache
    if request.step_cache is None:  # the model's default, at the request's threshold where it gives one
        if default is None or default.threshold is None or request.step_cache_threshold is None:
            return default
        return StepCache(default.method, request.step_cache_threshold)
    cache = StepCache.of(request.step_cache, request.step_cache_threshold)
    if cache is not None and cache.threshold is None and request.step_cache_threshold is not None:
        warnings.append(f"{cache.method} has no threshold; step_cache_threshold was ignored")
    return cache


def stops_guidance(p: Any, pipe: Any) -> bool:
    """Whether `pipe` can turn guidance off mid-run: it is known to pipelines.sampling.guidance and reads
    its tensors back from `callback_on_step_end`."""
    return p.traits.step_callback == "on_step_end" and supports_guidance_end(pipe)


def guidance_end_for(p: Any, request: GenerationRequest, pipe: Any, warnings: list[str]) -> float:
    """The share of the steps to guide: the request's, else the model's default; 1.0 (every
    step) where this pipeline cannot stop guidance, with a warning if the request asked."""
    end = request.guidance_end if request.guidance_end is not None else p.default_guidance_end
    if end >= 1.0:
        return 1.0
    if not stops_guidance(p, pipe):
        if request.guidance_end is not None:
            warnings.append(f"{type(pipe).__name__} cannot stop guidance early; guidance end was ignored")
        return 1.0
    return end


def size_warnings(trained: tuple[int, int] | None, task: str, size: tuple[int, int]) -> list[str]:
    """A text-to-image size outside the sides the model was trained at (its card's): said, not refused
    (MAX_SIDE/MAX_PIXELS refuse); hires fix's second pass, an image-to-image, is where larger belongs."""
    if trained is None or task != "txt2img" or (trained[0] <= min(size) and max(size) <= trained[1]):
        return []
    return [
        f"{size[0]}x{size[1]} is outside the sizes this model was trained at ({trained[0]}-{trained[1]} px a side): "
        f"it may repeat or lose the subject; hires fix draws larger pictures from a trained size"
    ]


def request_warnings(p: Any, request: GenerationRequest, pipe: Any, accepted: frozenset[str]) -> list[str]:
    """What the user asked for that this model will not do as asked, said before it runs."""
    warnings: list[str] = []
    if request.negative_prompt and "negative_prompt" not in accepted:
        warnings.append(f"{type(pipe).__name__} has no negative prompt; it was ignored")
    if p.traits.guidance == "none" and request.guidance_scale:
        warnings.append(f"{type(pipe).__name__} takes no guidance; the guidance value was ignored")
    if request.guidance_rescale and "guidance_rescale" not in accepted:
        warnings.append(f"{type(pipe).__name__} has no guidance rescale; {request.guidance_rescale:g} was ignored")
    if p.traits.step_callback == "none":
        warnings.append(f"{type(pipe).__name__} reports no steps: no progress, and Stop waits for the end")
    if request.styles:  # the ones `_styled` could not apply
        warnings.append(styles.unknown_warning(p.styles, request.styles))
    return warnings
