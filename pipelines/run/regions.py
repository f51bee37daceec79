"""Regional prompts in a request's plan (pipelines.sampling.regional draws them): each prompt split into its
regions (pipelines.schema.regions), the layout checked against the divide ratio, region 0's text made the
pipeline's own prompt, and each micro-batch's embeddings of the other regions and the base encoded.
Each function takes the `ImagePipeline` it works for as `p` (typed Any: that module imports this one).
"""

from __future__ import annotations

from typing import Any

from pipelines.prompts.weights import call_embeds
from pipelines.run.traits import denoiser
from pipelines.sampling.regional import FAMILIES, Regional, RegionEmbeds
from pipelines.schema.errors import UnsupportedTaskError
from pipelines.schema.fields import RequestError
from pipelines.schema.regions import MAX_REGIONS, Split, layout, split_prompt


def check(p: Any, pipe: Any, kind: str) -> None:
    """Regional prompts need a UNet fed CLIP embeddings with an [uncond, cond] guidance batch."""
    name = type(denoiser(pipe)).__name__
    if kind not in ("clip", "clip2") or name != "UNet2DConditionModel" or p.traits.edit:
        raise UnsupportedTaskError(
            f"{type(pipe).__name__} cannot take regional prompts here: they need a UNet with CLIP text "
            f"embeddings ({', '.join(FAMILIES)} text-to-image, image-to-image, inpaint and ControlNet)"
        )


def plan_regions(p: Any, plan: Any) -> None:
    """Fill `plan.regional` and `plan.splits`, and point each prompt at its region 0's text; a prompt of
    one region runs as a plain prompt (a hires pass with a plain hires prompt, say) with a warning."""
    spec = plan.request.regions
    splits = {text: split_prompt(text) for text in plan.request.prompts}
    counts = sorted({len(s.regions) for s in splits.values()})
    if counts == [1]:
        plan.warnings.append("regional prompts are on, but the prompt has one region (no ADDCOL/ADDROW/BREAK): drawn as one")
        return
    if len(counts) > 1:
        raise RequestError("prompt", f"every prompt of a regional request needs the same number of regions, got {counts}")
    if counts[0] > MAX_REGIONS:
        raise RequestError("prompt", f"{counts[0]} regions, more than {MAX_REGIONS}")
    check(p, plan.pipe, plan.texts.kind)
    if p.runtime is not None and p.runtime.torch_reason is None and spec.region_method == "Attention":  # RUNTIME=openvino
        spec = spec.model_copy(update={"region_method": "Latent"})
        plan.request = plan.request.model_copy(update={"regions": spec})
        plan.warnings.append(
            "regional prompts ran the Latent mode: the Attention mode changes the denoiser's cross-attention, which "
            "the OpenVINO runtime runs inside one graph (RUNTIME=torch runs it)"
        )
    try:
        boxes = layout(spec.region_ratios, counts[0], spec.region_split)
    except ValueError as exc:
        raise RequestError("region_ratios", str(exc)) from None
    bases = [s.base for s in splits.values()]
    base_ratio = spec.region_base_ratio if all(bases) else 0.0
    if any(bases) and not all(bases):
        plan.warnings.append("only some prompts have a base prompt (ADDBASE): the base was left out")
    unet = denoiser(plan.pipe)
    step = 2 ** (len(unet.config.down_block_types) - 1)  # windows of whole down-sampled cells
    plan.regional = Regional(boxes, base_ratio, spec.region_method, step=step)
    cells = (plan.size[1] // p.vae_scale_factor, plan.size[0] // p.vae_scale_factor)
    for index, (top, bottom, left, right) in enumerate(plan.regional.owners(*cells)):
        if bottom <= top or right <= left:
            raise RequestError("region_ratios", f"region {index + 1} is less than one latent cell at {plan.size[0]}x{plan.size[1]}: give it a larger share")
    plan.splits = splits
    for text, split in splits.items():
        plan.prompts[text] = plan.texts.text(split.regions[0])


def chunk_embeds(plan: Any, chunk: list[dict[str, Any]]) -> RegionEmbeds:
    """The conditional embeddings of regions 1.. and of the base for one micro-batch's items."""
    splits: list[Split] = [plan.splits[item["prompt"]] for item in chunk]
    encoder = plan.texts.encoder
    count = len(splits[0].regions)
    words = plan.texts.words
    regions = [_encoded(encoder, [s.regions[r] for s in splits], words) for r in range(1, count)]
    base = _encoded(encoder, [s.base or "" for s in splits], words) if plan.regional.base_ratio > 0 else None
    return RegionEmbeds(regions, base, len(chunk))


def _encoded(encoder: Any, texts: list[str], words: Any) -> dict[str, Any]:
    """The conditional embeddings of `texts` (an `embedding:name` as the embedding's word, as region 0's)."""
    found = call_embeds(encoder, [words(t) for t in texts], None, False)
    out = {"prompt_embeds": found["prompt_embeds"]}
    if "pooled_prompt_embeds" in found:
        out["pooled"] = found["pooled_prompt_embeds"]
    return out
