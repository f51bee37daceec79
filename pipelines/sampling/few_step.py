"""Few-step models and LoRAs: what each kind needs (sampler, steps, guidance), applied when one is picked.

A few-step model (SD-Turbo, a Lightning UNet) or LoRA (LCM-LoRA, TCD-LoRA, Hyper-SD, Lightning LoRAs, the
embedded `tiny-shapes-lcm`) was distilled for a sampler, a handful of steps and little or no guidance; run
with a model's usual 20-30 steps, DPM++ and CFG 7 it gives mush or burnt colours. So, FastSD CPU's and
Forge's behaviour:

- picked (the model's name or source, a recipe's LoRA, or a LoRA in the request), its kind is found by name
  (`find`), and a request that leaves steps, guidance or sampler to the model gets the kind's (`apply`);
- what breaks it is refused with the reason (`check`): guidance above what the kind was distilled for, more
  steps than it was (the embedded LCM-LoRA: 0.77 of scenes right at 4 steps, 0.65 at 8), a sampler it was not
  distilled for, a step cache (it skips steps a 4-step run does not have to spare).

| kind | names | sampler | steps | guidance (max) | why |
|---|---|---|---|---|---|
| LCM | `lcm` (lcm-lora-sdv1-5, lcm-lora-sdxl, LCM_Dreamshaper, tiny-shapes-lcm) | LCM | 4 (2-8) | 1 (2) | consistency-distilled with the teacher's CFG inside: guidance 1 is one UNet call a step |
| TCD | `tcd` (TCD-SD15-LoRA, TCD-SDXL-LoRA) | TCD | 4 (1-8) | 1 (2) | trajectory-consistency distilled: TCD's own sampler |
| Hyper-SD | `hyper-sd`, `hyper-sdxl` + `Nstep(s)` | TCD | N (1-N x 2) | 1 (2; CFG variants 8) | its card: TCD or trailing DDIM, guidance off except the CFG-preserving LoRAs |
| Lightning | `lightning` + `Nstep(s)` | Euler | N (1-N x 2) | 1 (1) | SDXL-Lightning's card: Euler, trailing timesteps, no CFG |
| Turbo | `sd-turbo`, `sdxl-turbo` | Euler a | 1 (1-4) | 1 (1) | adversarially distilled without CFG: guidance > 1 burns the picture |

Guidance 1 is "off" in this app (one UNet call per step, as diffusers' `guidance_scale <= 1`).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from pipelines.sampling import step_cache
from pipelines.schema.fields import RequestError


@dataclass(frozen=True)
class FewStep:
    """One kind of few-step distillation and what it was distilled for."""

    name: str
    pattern: str  # searched (case-insensitive) in a model's or LoRA's name
    sampler: str
    steps: int
    max_steps: int
    guidance_max: float
    samplers: tuple[str, ...]  # the samplers it was distilled for (the first is the default)
    why: str
    scheduler_options: tuple[tuple[str, Any], ...] = ()  # what the sampler needs on top of the model's config

    def for_name(self, name: str) -> FewStep:
        """This kind with the step count a name states ("Hyper-SD15-2steps", "sdxl_lightning_8step")."""
        found = re.search(r"(\d+)[-_ ]?steps?", name, re.IGNORECASE)
        if not found or self.name not in ("Hyper-SD", "Lightning"):
            return self
        steps = int(found.group(1))
        guidance = 8.0 if self.name == "Hyper-SD" and "cfg" in name.lower() else self.guidance_max
        return dataclasses.replace(self, steps=steps, max_steps=max(2 * steps, 2), guidance_max=guidance)


TRAILING = (("timestep_spacing", "trailing"),)
KINDS = (
    FewStep("LCM", r"(^|[-_ ])lcm([-_ .]|$)", "LCM", 4, 8, 2.0, ("LCM", "TCD"),
            "consistency-distilled with the teacher's guidance inside (LCM-LoRA)"),
    FewStep("TCD", r"tcd", "TCD", 4, 8, 2.0, ("TCD", "LCM"), "trajectory-consistency distilled (TCD-LoRA)"),
    FewStep("Hyper-SD", r"hyper[-_ ]?sd", "TCD", 4, 8, 2.0, ("TCD", "LCM", "DDIM"),
            "Hyper-SD: TCD or trailing DDIM, guidance off (its CFG LoRAs take 5-8)", TRAILING),
    FewStep("Lightning", r"lightning.*?\d+[-_ ]?steps?", "Euler", 4, 8, 1.0, ("Euler", "Euler a", "LCM", "TCD"),
            "SDXL-Lightning: Euler with trailing timesteps, no CFG", TRAILING),
    FewStep("Turbo", r"(sd|sdxl)[-_ ]?turbo", "Euler a", 1, 4, 1.0, ("Euler a", "Euler", "LCM", "TCD"),
            "adversarially distilled without CFG (SD-Turbo, SDXL-Turbo)"),
)  # fmt: skip


def find(names: Iterable[str]) -> FewStep | None:
    """The few-step kind the first matching name is of (a model id or folder, a LoRA's name or file), or None."""
    for name in names:
        base = str(name).replace("\\", "/").rsplit("/", 1)[-1] or str(name)
        for kind in KINDS:
            if re.search(kind.pattern, base, re.IGNORECASE):
                return kind.for_name(base)
    return None


def apply(kind: FewStep, request: Any) -> Any:
    """The request with what it left to the model (steps, guidance, sampler) set to the kind's."""
    changes: dict[str, Any] = {}
    if request.steps is None:
        changes["steps"] = kind.steps
    if request.guidance_scale is None:
        changes["guidance_scale"] = 1.0
    if request.sampler is None:
        changes["sampler"] = kind.sampler
    return request.model_copy(update=changes) if changes else request


def check(kind: FewStep, request: Any, sampler: str) -> None:
    """RequestError naming the field a few-step kind cannot take (the request's defaults filled)."""
    what = f"{kind.name} ({kind.why})"
    if request.guidance_scale is not None and request.guidance_scale > kind.guidance_max:
        raise RequestError(
            "guidance_scale",
            f"{request.guidance_scale:g} is above what {what} takes: at most {kind.guidance_max:g} (1 = off, one "
            "UNet call a step); higher burns the picture",
        )
    if request.steps is not None and request.steps > kind.max_steps:
        raise RequestError(
            "steps", f"{request.steps} is more than {what} was distilled for: at most {kind.max_steps} (its default: {kind.steps})"
        )
    if sampler not in kind.samplers:
        raise RequestError("sampler", f"{sampler} is not a sampler {what} was distilled for; use {', '.join(kind.samplers)}")
    if request.step_cache not in (None, step_cache.NONE):
        raise RequestError(
            "step_cache", f"{request.step_cache} skips steps; {what} runs {kind.steps} steps and has none to spare"
        )
