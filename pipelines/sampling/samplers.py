"""Samplers by the names people know from A1111/Forge/ComfyUI, mapped to diffusers schedulers.

The mapping follows diffusers' own table of A1111 equivalents (docs: "Schedulers"); options such as
Karras sigmas are part of the name ("DPM++ 2M Karras"). Only samplers whose scheduler class is in
the loaded scheduler's `compatibles` are offered. A chosen sampler is built with
`from_config(model's scheduler config, **options)`, so the model's prediction type, timestep
spacing and betas are kept; a scheduler class with no A1111 name is offered under its class name.

A compatible class is not always a sampler that works with the model's noise schedule. The
embedded tiny-shapes models use a cosine schedule with "trailing" timesteps: its last step jumps
from sigma 642 (t = 998) to 20,291 (t = 999). Karras sigmas then repeat t = 998 (DPM++ 2M Karras
crashes with an IndexError, DPM2 Karras returns NaNs) and second-order steps across the jump (Heun,
DPM2 a) blow up. So each candidate is first run on a problem with a known answer
(`schedule_fault`): Gaussian data through the model's schedule with the exact denoiser, at 20 steps
and (for NaN or an error only) at 1-8 steps: Euler a gives NaN at 3 steps across the jump.

The jump is the schedule's fault, not the sampler's: "squaredcos_cap_v2" clips its last betas at
0.999, which puts alpha_bar at 2.4e-9 at t = 999. So a sampler that fails on such a "singular tail"
is tried once more on the same schedule with its tail capped at sigma 14.6 (Stable Diffusion's own
last noise level, the range A1111's samplers are made for; `tail_repair`): every noise level below
the cap is the model's own, and above it the input is noise to the model either way (signal-to-noise
1/213). Measured on the embedded model (48 scenes, 20 steps, all three of colour, shape and background
right): caps of 80, 14.6 and 8 give Heun 0.52, 1.0, 1.0 and DPM2 a 0.38, 0.94, 0.94; the Karras DPM++
variants and Euler a are right in every scene at each cap (docs/samplers-and-guidance.md). Samplers
that pass only so are offered with the repair (`build` applies it); the model's own sampler and those
that pass as is keep the schedule untouched, so their images are unchanged. A sampler failing even so is not offered.
On SD-style schedules every sampler passes as is.

A sampler may also need a few steps to start: `Sampler.min_steps` (PLMS's warm-up takes 4). A request
below it is refused on `steps` before any model work (`check_steps`), instead of failing inside
diffusers with a message that names neither the field nor the sampler.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipelines.schema.fields import RequestError

KARRAS = {"use_karras_sigmas": True}
# A typical default. On tiny-shapes' schedule the Karras variants and Heun fail at every step count
# from 8 to 50, DPM2 a up to 20. At 4 steps nearly every sampler misses the spread by more than the
# tolerance (few-step sampling is coarse, not broken), so requests at other step counts are not probed.
PROBE_STEPS = 20
PROBE_MEAN, PROBE_STD, PROBE_TOLERANCE = 0.3, 1.0, 0.15  # the data; Euler a at 20 steps: std 0.88-0.90
SDE = {"algorithm_type": "sde-dpmsolver++"}


@dataclass(frozen=True)
class Sampler:
    name: str  # as A1111 writes it in "Sampler:" (Karras variants: A1111 >= 1.9 writes "Schedule type: Karras")
    scheduler: str  # diffusers class name
    options: dict[str, Any] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()  # A1111's own aliases for it (k-diffusion names), as /sdapi/v1/samplers lists them
    min_steps: int = 1  # the fewest steps it runs without an error or NaN (measured; the table says why)
    min_steps_unless: dict[str, Any] = field(default_factory=dict)  # scheduler config values that lift it

    def steps_needed(self, config: Mapping[str, Any]) -> int:
        """The fewest steps on a scheduler config: `min_steps`, or 1 where the config has every value of
        `min_steps_unless` (SD 1.5's PNDM config skips the warm-up that makes PLMS need 4)."""
        if self.min_steps_unless and all(config.get(k) == v for k, v in self.min_steps_unless.items()):
            return 1
        return self.min_steps

    @property
    def a1111(self) -> tuple[str, str | None]:
        """(Sampler, Schedule type) as A1111 1.9+ writes them."""
        if self.options.get("use_karras_sigmas"):
            return self.name.removesuffix(" Karras"), "Karras"
        return self.name, None


log = logging.getLogger(__name__)

# min_steps, measured with diffusers 0.42.1 (steps 1-8; scheduler loop with the exact denoiser of
# `schedule_fault`, and whole tiny pipelines) on SD 1.5's, SD 2's v-prediction, SDXL's and the embedded
# tiny-shapes' configs, and SD3/Flux flow-matching ones: every sampler runs from 1 step, except PLMS
# (docs/samplers-and-guidance.md, "Fewest steps"; LMS measured with scipy, which it needs to be offered).
SAMPLERS = [
    Sampler("DPM++ 2M", "DPMSolverMultistepScheduler", {"use_karras_sigmas": False, "algorithm_type": "dpmsolver++"}, ("k_dpmpp_2m",)),
    Sampler("DPM++ 2M Karras", "DPMSolverMultistepScheduler", {**KARRAS, "algorithm_type": "dpmsolver++"}),
    Sampler("DPM++ 2M SDE", "DPMSolverMultistepScheduler", {"use_karras_sigmas": False, **SDE}, ("k_dpmpp_2m_sde",)),
    Sampler("DPM++ 2M SDE Karras", "DPMSolverMultistepScheduler", {**KARRAS, **SDE}),
    Sampler("DPM++ SDE", "DPMSolverSinglestepScheduler", {"use_karras_sigmas": False}, ("k_dpmpp_sde",)),
    Sampler("DPM++ SDE Karras", "DPMSolverSinglestepScheduler", KARRAS),
    Sampler("DPM2", "KDPM2DiscreteScheduler", {"use_karras_sigmas": False}, ("k_dpm_2",)),
    Sampler("DPM2 Karras", "KDPM2DiscreteScheduler", KARRAS),
    Sampler("DPM2 a", "KDPM2AncestralDiscreteScheduler", {"use_karras_sigmas": False}, ("k_dpm_2_a",)),
    Sampler("DPM2 a Karras", "KDPM2AncestralDiscreteScheduler", KARRAS),
    Sampler("Euler", "EulerDiscreteScheduler", {"use_karras_sigmas": False}, ("k_euler",)),
    Sampler("Euler a", "EulerAncestralDiscreteScheduler", {}, ("k_euler_a", "k_euler_ancestral")),
    Sampler("Heun", "HeunDiscreteScheduler", {"use_karras_sigmas": False}, ("k_heun",)),
    Sampler("LMS", "LMSDiscreteScheduler", {"use_karras_sigmas": False}, ("k_lms",)),
    Sampler("LMS Karras", "LMSDiscreteScheduler", KARRAS),
    Sampler("DDIM", "DDIMScheduler", {}, ("ddim",)),
    # PLMS: PNDM's Runge-Kutta warm-up (PRK) spans the schedule's last 4 timesteps; with 1-3 steps
    # diffusers cannot lay it out ("operands could not be broadcast together with shapes (2,) (8,)").
    # Configs that skip PRK (SD 1.5's own: skip_prk_steps true) run from 1 step; PNDM's default is PRK.
    Sampler("PLMS", "PNDMScheduler", {}, ("plms",), min_steps=4, min_steps_unless={"skip_prk_steps": True}),
    Sampler("UniPC", "UniPCMultistepScheduler", {}, ("unipc",)),
    Sampler("DEIS", "DEISMultistepScheduler"),
    Sampler("LCM", "LCMScheduler", {}, ("k_lcm",)),
    Sampler("TCD", "TCDScheduler", {}, ("tcd",)),  # Forge's and ComfyUI's name: Hyper-SD's and TCD-LoRA's sampler
    Sampler("Euler (flow matching)", "FlowMatchEulerDiscreteScheduler"),
]
BY_NAME = {s.name: s for s in SAMPLERS}


def offered(scheduler: Any) -> list[Sampler]:
    """The samplers this model can use: A1111 names first, then other compatible classes by class name."""
    return list(_check(*_key(scheduler)).offered)


def faults(scheduler: Any) -> dict[str, str]:
    """Compatible samplers left out because they cannot run this model's noise schedule: name -> why."""
    return dict(_check(*_key(scheduler)).faults)


def repaired(scheduler: Any) -> dict[str, str]:
    """Samplers offered only on the schedule with its singular tail capped (`tail_repair`): name -> why
    they fail on the model's own schedule."""
    return dict(_check(*_key(scheduler)).repaired)


# Few-step samplers every discrete-noise-schedule model can take, though diffusers' `compatibles` lists omit them:
# LCM-LoRA, TCD-LoRA and Hyper-SD ship for SD 1.5 / SDXL checkpoints whose own scheduler is PNDM, Euler or DPM++,
# and their model cards swap in `LCMScheduler.from_config(pipe.scheduler.config)` (or TCD's) the same way.
FEW_STEP = ("LCMScheduler", "TCDScheduler")


def discrete(scheduler: Any) -> bool:
    """Whether `scheduler` runs a discrete (DDPM-style) noise schedule, not flow matching."""
    config = dict(scheduler.config)
    return "beta_schedule" in config and not config.get("use_flow_sigmas")


def _key(scheduler: Any) -> tuple[tuple[str, ...], str]:
    classes = (type(scheduler).__name__, *sorted(c.__name__ for c in getattr(scheduler, "compatibles", [])))
    config = dict(scheduler.config)
    if discrete(scheduler):
        classes += tuple(c for c in FEW_STEP if c not in classes)
    return classes, json.dumps(config, sort_keys=True, default=str)


@dataclass(frozen=True)
class _Checked:
    offered: tuple[Sampler, ...]
    faults: tuple[tuple[str, str], ...]  # (name, why) of those not offered
    repaired: tuple[tuple[str, str], ...]  # (name, why it failed as is) of those offered with `tail_repair`
    repair: tuple[tuple[str, Any], ...]  # the config overrides `tail_repair` gives (empty: none needed)


@functools.lru_cache(maxsize=32)
def _check(classes: tuple[str, ...], config: str) -> _Checked:
    """What this schedule offers, cached per scheduler config: probing every candidate takes ~2.4 s here
    (~1 s before the 1-8-step NaN probe and the repaired schedule's second probe)."""
    import diffusers

    cfg = json.loads(config)
    usable = {c for c in classes if _constructible(c, cfg)}
    candidates = [s for s in SAMPLERS if s.scheduler in usable]
    covered = {s.scheduler for s in candidates}
    candidates += [Sampler(c, c) for c in sorted(usable - covered)]
    own = getattr(diffusers, classes[0]).from_config(cfg) if classes[0] in usable else None
    repair = tail_repair(own) if own is not None else {}
    own_repaired = getattr(diffusers, classes[0]).from_config({**cfg, **repair}) if repair else None
    offered_, faults_, repaired_ = [], [], []
    for sampler in candidates:
        fault = _fault(own, sampler, cfg) if own is not None else None
        if fault is not None and own_repaired is not None and _fault(own_repaired, sampler, {**cfg, **repair}) is None:
            log.info("sampler %s offered on the capped schedule: %s", sampler.name, fault)
            repaired_.append((sampler.name, fault))
            fault = None
        if fault is None:
            offered_.append(sampler)
        else:
            log.info("sampler %s not offered for this model: %s", sampler.name, fault)
            faults_.append((sampler.name, fault))
    return _Checked(tuple(offered_), tuple(faults_), tuple(repaired_), tuple(repair.items()))


def _fault(own: Any, sampler: Sampler, config: dict[str, Any]) -> str | None:
    """`schedule_fault` at PROBE_STEPS, then NaN or an error from its fewest steps to 8 (few are coarse, not wrong)."""
    candidate = _make(sampler, config)  # built once: `set_timesteps` restarts it (KDPM2's init takes 0.2 s)
    fault = schedule_fault(own, candidate)
    for steps in range(sampler.steps_needed({**config, **sampler.options}), 9):
        if fault is None:
            fault = schedule_fault(own, candidate, steps, spread=False)
    return fault


# A singular tail: the last trained noise level this many times the one before it (the cosine schedule's 31x;
# SD's scaled-linear 1.003x). TAIL_SIGMA_MAX is where `tail_repair` caps it: SD 1.5's and SDXL's last sigma.
TAIL_JUMP, TAIL_SIGMA_MAX = 4.0, 14.6


def tail_repair(scheduler: Any) -> dict[str, Any]:
    """Config overrides (`trained_betas`) that cap a singular tail of `scheduler`'s noise schedule at
    TAIL_SIGMA_MAX, or {} where the schedule has none. Noise levels below the cap are kept exactly;
    those above it are spaced geometrically up to the cap, so timesteps stay distinct."""
    import torch

    alphas = getattr(scheduler, "alphas_cumprod", None)
    if alphas is None or len(alphas) < 3:
        return {}
    alphas = alphas.double()
    sigmas = ((1 - alphas) / alphas).sqrt()
    if not sigmas[-1] > TAIL_JUMP * sigmas[-2] or not sigmas[-1] > TAIL_SIGMA_MAX:
        return {}
    first = int(torch.searchsorted(sigmas, torch.tensor(TAIL_SIGMA_MAX, dtype=torch.float64)))
    capped = sigmas.clone()
    capped[first:] = torch.logspace(
        math.log10(float(sigmas[first - 1])), math.log10(TAIL_SIGMA_MAX), len(sigmas) - first + 1, dtype=torch.float64
    )[1:]
    new = 1 / (1 + capped**2)
    betas = 1 - new / torch.cat([torch.ones(1, dtype=torch.float64), new[:-1]])
    return {"trained_betas": [float(b) for b in betas]}


def _constructible(name: str, config: dict[str, Any]) -> bool:
    """False for schedulers whose optional dependency is missing (DPMSolverSDEScheduler needs torchsde)
    or that cannot start from this model's config (EDMEulerScheduler from SDXL's Euler config: TypeError;
    DEIS from a DPM++ 2M SDE config, a recipe's default sampler: NotImplementedError for its algorithm)."""
    import diffusers

    try:
        getattr(diffusers, name).from_config(config)
    except (ImportError, AttributeError, TypeError, ValueError, NotImplementedError) as exc:
        log.debug("sampler %s not offered: %s", name, exc)
        return False
    return True


def current(scheduler: Any) -> Sampler:
    """The sampler the model's own scheduler is, by its class and options."""
    config = dict(getattr(scheduler, "config", {}))
    cls = type(scheduler).__name__
    for s in SAMPLERS:
        if s.scheduler == cls and all(
            config.get(k, v if k != "use_karras_sigmas" else False) == v for k, v in s.options.items()
        ):
            return s
    return Sampler(cls, cls)


def minima(scheduler: Any) -> dict[str, int]:
    """The fewest steps of every sampler this model offers and of its own scheduler (`current`), by name:
    each table entry's `min_steps` on the config the sampler is built from (`ModelInfo.min_steps`)."""
    config = dict(scheduler.config)
    out = {s.name: s.steps_needed({**config, **s.options}) for s in offered(scheduler)}
    own = current(scheduler)
    out[own.name] = own.steps_needed(config)
    return out


def check_steps(sampler: str, steps: int, minima: Mapping[str, int]) -> None:
    """Refuse `steps` below `sampler`'s minimum (`minima`: this module's `minima` or `ModelInfo.min_steps`) with a
    RequestError on `steps`, so every front end names the field; a sampler not in `minima` (not offered
    here) is left to `build`, whose refusal names the sampler."""
    need = minima.get(sampler, 1)
    if steps < need:
        raise RequestError(("steps",), f"{sampler} needs at least {need} steps; got {steps}")


def build(scheduler: Any, name: str, overrides: Mapping[str, Any] | None = None) -> Any:
    """A new scheduler for sampler `name` from the model's scheduler config (ValueError if not offered), with
    `overrides` of that config (a few-step kind's trailing timesteps: pipelines.sampling.few_step)."""
    choices = {s.name: s for s in offered(scheduler)}
    if name not in choices:
        why = faults(scheduler).get(name)
        reason = f" (it cannot run this model's noise schedule: {why})" if why else ""
        raise RequestError("sampler", f"{name!r} is not available for this model{reason}; available: {', '.join(choices)}")
    checked = _check(*_key(scheduler))
    repair = dict(checked.repair) if name in dict(checked.repaired) else {}
    return _make(choices[name], {**scheduler.config, **repair, **(overrides or {})})


def _make(sampler: Sampler, config: Any) -> Any:
    """The scheduler for `sampler` from a model's scheduler config. DDIM and DDPM clip x0 to [-1, 1]
    unless told not to; latents are not bounded that way (A1111 and ComfyUI never clip, diffusers'
    SD configs say `clip_sample: false`), so a config that does not set it gets False."""
    import diffusers

    cls = getattr(diffusers, sampler.scheduler)
    options = dict(sampler.options)
    if "clip_sample" in inspect.signature(cls.__init__).parameters and "clip_sample" not in config:
        options["clip_sample"] = False
    return cls.from_config(config, **options)


def schedule_fault(model_scheduler: Any, candidate: Any, steps: int = PROBE_STEPS, spread: bool = True) -> str | None:
    """Why `candidate` cannot sample with the model's noise schedule, or None if it can.

    The test has a known answer: data ~ N(PROBE_MEAN, PROBE_STD) per element, the exact denoiser for
    it at the model's own noise levels (`alphas_cumprod`, in the model's prediction type), and 4,096
    samples run through the candidate exactly as a pipeline does (`scale_model_input`, `step`). A
    sampler that works returns the data's mean and spread; one that cannot step this schedule
    raises, returns NaNs, or a spread far off. Models without a discrete schedule (EDM, flow
    matching) are not tested here, nor pixel-space models that clip their samples to [-1, 1] (the
    test's data are not bounded); a candidate without a discrete schedule for a model with one is
    a different parametrisation (EDM preconditioning on a v-prediction UNet) and is refused.
    With `spread=False` only NaN, infinity or an error count (a few-step run is coarse, not wrong).
    """
    alphas = getattr(model_scheduler, "alphas_cumprod", None)
    prediction = model_scheduler.config.get("prediction_type", "epsilon")
    if (
        alphas is None
        or prediction not in ("epsilon", "v_prediction", "sample")
        or model_scheduler.config.get("clip_sample")
    ):
        return None
    if getattr(candidate, "alphas_cumprod", None) is None:
        return "it does not use the model's discrete noise schedule"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mean, std = _sample_gaussian(prediction, alphas.double(), candidate, steps)
    except Exception as exc:  # whatever a third-party scheduler raises here, a request would raise too
        return f"{steps} steps fail ({type(exc).__name__}: {exc})"
    if not (math.isfinite(mean) and math.isfinite(std)):
        return f"{steps} steps give NaN or infinite values"
    if type(candidate).__name__ in FEW_STEP or not spread:
        # a consistency sampler returns the model's clean estimate at its last noise level (t = 239 of 1000 at
        # 20 steps on LCM's 50-step grid), not a sample: the exact denoiser's estimate there is the data's mean
        # shrunk towards it. Only a distilled model's estimate is sharp, so only running cleanly is asked here.
        return None
    if abs(mean - PROBE_MEAN) > PROBE_TOLERANCE or abs(std - PROBE_STD) > PROBE_TOLERANCE:
        return f"on data of mean {PROBE_MEAN} and spread {PROBE_STD} it returns mean {mean:.3g}, spread {std:.3g}"
    return None


def _sample_gaussian(prediction_type: str, alphas: Any, scheduler: Any, steps: int) -> tuple[float, float]:
    """Mean and spread of 4,096 samples from N(PROBE_MEAN, PROBE_STD) by `scheduler` and the exact denoiser."""
    import torch

    scheduler.set_timesteps(steps)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(4096, 1, generator=generator, dtype=torch.float64) * scheduler.init_noise_sigma
    takes_generator = "generator" in inspect.signature(scheduler.step).parameters
    for t in scheduler.timesteps:
        x_in = scheduler.scale_model_input(x, t)
        pos = min(max(float(t), 0.0), len(alphas) - 1.0)  # fractional for DPM2's interpolated steps
        low = int(pos)
        a_bar = torch.lerp(alphas[low], alphas[min(low + 1, len(alphas) - 1)], pos - low)
        a, s = a_bar.sqrt(), (1 - a_bar).sqrt()
        x0 = PROBE_MEAN + a * PROBE_STD**2 / (a**2 * PROBE_STD**2 + s**2) * (x_in - a * PROBE_MEAN)
        eps = (x_in - a * x0) / s
        out = {"epsilon": eps, "v_prediction": a * eps - s * x0, "sample": x0}[prediction_type]
        x = scheduler.step(out, t, x, **({"generator": generator} if takes_generator else {})).prev_sample
    return float(x.mean()), float(x.std())


# Schedule types ("Schedule type" in A1111/Forge/SD.Next, `scheduler` in ComfyUI, Fooocus and SwarmUI):
# every spelling -> A1111's label. Only Karras is offered here (as the sampler's Karras variant); the
# others run on the sampler's own schedule, and Send to Generate says so.
SCHEDULES = {
    "automatic": "Automatic", "uniform": "Uniform", "karras": "Karras", "exponential": "Exponential",
    "polyexponential": "Polyexponential", "sgm uniform": "SGM Uniform", "kl optimal": "KL Optimal",
    "align your steps": "Align Your Steps", "align your steps gits": "Align Your Steps GITS",
    "align your steps 11": "Align Your Steps 11", "align your steps 32": "Align Your Steps 32",
    "simple": "Simple", "normal": "Normal", "ddim": "DDIM", "ddim uniform": "DDIM", "beta": "Beta",
    "turbo": "Turbo", "linear quadratic": "Linear Quadratic",
}  # fmt: skip
# Schedules that are the sampler's own (not Karras): reading one keeps the plain sampler without a note.
PLAIN_SCHEDULES = {"Automatic", "Uniform", "Normal", "SGM Uniform", "Simple", "DDIM"}
# A1111's "Automatic" is each sampler's own default (modules/sd_samplers_kdiffusion.py); the others' is Uniform.
A1111_AUTOMATIC = {"DPM++ 2M": "Karras", "DPM++ SDE": "Karras", "DPM2": "Karras", "DPM2 a": "Karras",
                   "DPM++ 2M SDE": "Exponential"}  # fmt: skip
# Sampler names other tools write (lower case, "_" and "-" as spaces, "k " / "sample " prefixes, " gpu"
# suffix and A1111's schedule suffixes removed first) -> ours. InvokeAI's " k" suffix means Karras.
ALIASES = {
    "euler": "Euler", "euler a": "Euler a", "euler ancestral": "Euler a", "heun": "Heun", "lms": "LMS",
    "dpm 2": "DPM2", "dpm2": "DPM2", "kdpm 2": "DPM2", "dpm 2 ancestral": "DPM2 a", "dpm2 a": "DPM2 a", "dpm 2 a": "DPM2 a",
    "kdpm 2 a": "DPM2 a", "dpm2 ancestral": "DPM2 a", "dpmpp 2m": "DPM++ 2M", "dpm++ 2m": "DPM++ 2M",
    "dpmpp 2m sde": "DPM++ 2M SDE", "dpm++ 2m sde": "DPM++ 2M SDE", "dpmpp sde": "DPM++ SDE",
    "dpm++ sde": "DPM++ SDE", "ddim": "DDIM", "ddim v3": "DDIM", "plms": "PLMS", "pndm": "PLMS",
    "uni pc": "UniPC", "uni pc bh2": "UniPC", "unipc": "UniPC", "lcm": "LCM", "deis": "DEIS",
}  # fmt: skip


@dataclass(frozen=True)
class Resolved:
    """A sampler and schedule read from another tool, as we name them."""

    sampler: str  # ours ("DPM++ 2M Karras") where one matches, else the text as written
    schedule: str | None  # A1111's label ("Karras", "Exponential"), None when not given
    known: bool  # the sampler is one of ours
    note: str | None  # why the schedule could not be kept


def schedule_label(text: str | None) -> str | None:
    """A1111's label for a schedule type however a tool spells it ("sgm_uniform" -> "SGM Uniform")."""
    if not text or not str(text).strip():
        return None
    key = str(text).strip().lower().replace("_", " ").replace("-", " ")
    return SCHEDULES.get(key, str(text).strip())


def _alias(name: str) -> tuple[str | None, str | None]:
    """(our base sampler, schedule held in the name) for any tool's spelling; (None, None) if unknown."""
    key = " ".join(name.strip().lower().replace("_", " ").replace("-", " ").split())
    for prefix in ("k ", "sample "):
        key = key.removeprefix(prefix)
    key = key.removesuffix(" gpu")
    schedule = None
    if key.endswith(" k"):  # InvokeAI: "dpmpp_2m_k"
        key, schedule = key[:-2].removesuffix(" gpu"), "Karras"
    for label in sorted(SCHEDULES, key=len, reverse=True):  # "DPM++ 2M Karras", "Euler a Exponential"
        if key.endswith(" " + label) and key[: -len(label) - 1] in ALIASES:
            key, schedule = key[: -len(label) - 1], SCHEDULES[label]
            break
    found = ALIASES.get(key) or next((s.name for s in SAMPLERS if s.name.lower() == key), None)
    return found, schedule


def from_any(sampler: str | None, schedule: str | None = None) -> Resolved:
    """Our sampler for a (sampler, schedule) pair as A1111, Forge, ComfyUI, Fooocus, SwarmUI, InvokeAI
    or NovelAI write it: "DPM++ 2M" + "Karras", "DPM++ 2M Karras", "dpmpp_2m" + "karras", "k_euler_ancestral".
    A1111's "Automatic" is the sampler's own default there (Karras for DPM++ 2M); no schedule at all
    (A1111 before 1.9, and tools without one) is the plain sampler."""
    text = str(sampler or "").strip()
    base, in_name = _alias(text) if text else (None, None)
    label = schedule_label(schedule) or in_name
    if base is None:
        return Resolved(text, label, text in BY_NAME, None)
    effective = A1111_AUTOMATIC.get(base, label) if label == "Automatic" else label
    if effective == "Karras" and f"{base} Karras" in BY_NAME:
        return Resolved(f"{base} Karras", label, True, None)
    if base.endswith(" Karras") or effective is None or effective in PLAIN_SCHEDULES:
        return Resolved(base, label, True, None)
    shown = label if effective == label else f"{label} ({effective} for {base} in A1111)"
    return Resolved(base, label, True, f"schedule {shown} is not offered here; {base} runs its own schedule")


def sampler_fields(sampler: str, schedule: str | None = None) -> dict[str, str]:
    """A reader's fields for a tool's sampler: "sampler" (ours where one matches), "schedule" (A1111's
    label) when given, and "sampler_as_written" when our name is not the tool's ("euler_ancestral")."""
    resolved = from_any(sampler, schedule)
    out = {"sampler": resolved.sampler}
    if resolved.schedule:
        out["schedule"] = resolved.schedule
    if resolved.sampler.removesuffix(" Karras") != sampler.strip().removesuffix(" Karras"):
        out["sampler_as_written"] = sampler.strip()
    return out


def from_a1111(sampler: str, schedule_type: str | None = None) -> str:
    """Our sampler name for A1111's fields ("DPM++ 2M" + "Karras", or the older "DPM++ 2M Karras")."""
    return from_any(sampler, schedule_type).sampler


SPACING_SCHEDULES = {"linspace": "Uniform", "trailing": "SGM Uniform", "leading": "DDIM"}


def schedule_type(sampler: str, config: Any = None) -> str:
    """A1111's "Schedule type" for one of our samplers on a scheduler config: Karras for the Karras
    variants, "Simple" for flow matching, else the label of A1111's schedule that spaces timesteps as
    the config does ("linspace": Uniform, "trailing": SGM Uniform, "leading": DDIM). Written always:
    A1111 reads a missing one as "Automatic", which for DPM++ 2M means Karras."""
    found = BY_NAME.get(sampler)
    if found is not None and found.options.get("use_karras_sigmas"):
        return "Karras"
    if "FlowMatch" in (found.scheduler if found else sampler):
        return "Simple"
    spacing = dict(config or {}).get("timestep_spacing", "linspace")
    return SPACING_SCHEDULES.get(str(spacing), "Uniform")
