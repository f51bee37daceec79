"""Guidance end: classifier-free guidance on the first part of the steps only (SD.Next's "CFG end").

Why: guidance is what makes a model follow its prompt, and what the image shows is settled
before the last, low-noise steps; there guidance is largely unnecessary (Kynkäänniemi et al.
2024, "Applying guidance in a limited interval"), while each guided step costs two or three
model passes per image instead of one. Off by default (1.0): on the embedded editor it was no
better on the evaluation (README, the embedded editor).

diffusers' own `SDCFGCutoffCallback` family does the same, but keeps `prompt_embeds[-1:]`: one
prompt's embeddings, so a batch of two images stops with a RuntimeError (size 128 vs 64, tried on
the tiny SD 1.5 of tests/families.py). `GuidanceCutoff` keeps the conditional half (or third) of
the whole batch instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_GUIDANCE_END = 1.0  # guidance on every step: what every diffusers pipeline does


@dataclass(frozen=True)
class _Layout:
    tensors: tuple[str, ...]  # the step tensors that carry the guidance batch
    chunks: int  # how many copies of the batch guidance runs (uncond + cond = 2)
    conditional: int  # which copy is the conditional prediction


_SD = _Layout(("prompt_embeds",), 2, 1)
_SDXL = _Layout(("prompt_embeds", "add_text_embeds", "add_time_ids"), 2, 1)
# [text + image, image only, neither]: the text-and-image copy is the full conditional
_PIX2PIX = _Layout(("prompt_embeds", "image_latents"), 3, 0)

# Pipelines whose step loop reads these tensors back from `callback_on_step_end` and re-checks
# `do_classifier_free_guidance` every step (read in diffusers 0.42's sources; SD3's image-to-image
# pipeline does not read its pooled embeddings back, so it is not here).
LAYOUTS: dict[str, _Layout] = {
    "StableDiffusionPipeline": _SD,
    "StableDiffusionImg2ImgPipeline": _SD,
    "StableDiffusionXLPipeline": _SDXL,
    "StableDiffusionXLImg2ImgPipeline": _SDXL,
    "StableDiffusion3Pipeline": _Layout(("prompt_embeds", "pooled_prompt_embeds"), 2, 1),
    "StableDiffusionInstructPix2PixPipeline": _PIX2PIX,
}


def supports_guidance_end(pipe: Any) -> bool:
    return type(pipe).__name__ in LAYOUTS


def guided_steps(steps: int, end: float) -> int:
    """How many of `steps` run with guidance: at least one, `end` of them rounded."""
    return min(steps, max(1, round(steps * end)))


class GuidanceCutoff:
    """A `callback_on_step_end` that turns guidance off after `end` of the call's steps.

    After the last guided step it sets the pipeline's guidance scale to 0 (its
    `do_classifier_free_guidance` turns false) and hands back only the conditional copy of the
    batch tensors, so the remaining steps run the model once per image on the full condition.
    """

    def __init__(self, pipe: Any, end: float):
        self.layout = LAYOUTS[type(pipe).__name__]
        self.end = end

    @property
    def tensor_inputs(self) -> list[str]:
        return list(self.layout.tensors)

    def __call__(self, pipe: Any, step: int, _timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        guided = guided_steps(pipe.num_timesteps, self.end)
        if step != guided - 1 or guided == pipe.num_timesteps or not pipe.do_classifier_free_guidance:
            return {}
        pipe._guidance_scale = 0.0
        layout = self.layout
        return {name: tensors[name].chunk(layout.chunks)[layout.conditional] for name in layout.tensors}
