"""Samplers by the names people know from A1111/Forge/ComfyUI, mapped to diffusers schedulers.

The mapping follows diffusers' own table of A1111 equivalents (docs: "Schedulers"); options such as
Karras sigmas are part of the name ("DPM++ 2M Karras"). Only samplers whose scheduler class is in
the loaded scheduler's `compatibles` are offered. A chosen sampler is built with
`from_config(model's scheduler config, **options)`, so the model's prediction type, timestep
spacing and betas are kept; a scheduler class with no A1111 name is offered under its class name.
"""

from __future__ import annotations

import functools
import json
import logging
import warnings
from dataclasses import dataclass, field
from typing import Any

KARRAS = {"use_karras_sigmas": True}
SDE = {"algorithm_type": "sde-dpmsolver++"}


@dataclass(frozen=True)
class Sampler:
    name: str  # as A1111 writes it in "Sampler:" (Karras variants: A1111 >= 1.9 writes "Schedule type: Karras")
    scheduler: str  # diffusers class name
    options: dict[str, Any] = field(default_factory=dict)

    @property
    def a1111(self) -> tuple[str, str | None]:
        """(Sampler, Schedule type) as A1111 1.9+ writes them."""
        if self.options.get("use_karras_sigmas"):
            return self.name.removesuffix(" Karras"), "Karras"
        return self.name, None


log = logging.getLogger(__name__)

SAMPLERS = [
    Sampler("DPM++ 2M", "DPMSolverMultistepScheduler", {"use_karras_sigmas": False, "algorithm_type": "dpmsolver++"}),
    Sampler("DPM++ 2M Karras", "DPMSolverMultistepScheduler", {**KARRAS, "algorithm_type": "dpmsolver++"}),
    Sampler("DPM++ 2M SDE", "DPMSolverMultistepScheduler", {"use_karras_sigmas": False, **SDE}),
    Sampler("DPM++ 2M SDE Karras", "DPMSolverMultistepScheduler", {**KARRAS, **SDE}),
    Sampler("DPM++ SDE", "DPMSolverSinglestepScheduler", {"use_karras_sigmas": False}),
    Sampler("DPM++ SDE Karras", "DPMSolverSinglestepScheduler", KARRAS),
    Sampler("DPM2", "KDPM2DiscreteScheduler", {"use_karras_sigmas": False}),
    Sampler("DPM2 Karras", "KDPM2DiscreteScheduler", KARRAS),
    Sampler("DPM2 a", "KDPM2AncestralDiscreteScheduler", {"use_karras_sigmas": False}),
    Sampler("DPM2 a Karras", "KDPM2AncestralDiscreteScheduler", KARRAS),
    Sampler("Euler", "EulerDiscreteScheduler", {"use_karras_sigmas": False}),
    Sampler("Euler a", "EulerAncestralDiscreteScheduler"),
    Sampler("Heun", "HeunDiscreteScheduler", {"use_karras_sigmas": False}),
    Sampler("LMS", "LMSDiscreteScheduler", {"use_karras_sigmas": False}),
    Sampler("LMS Karras", "LMSDiscreteScheduler", KARRAS),
    Sampler("DDIM", "DDIMScheduler"),
    Sampler("PLMS", "PNDMScheduler"),
    Sampler("UniPC", "UniPCMultistepScheduler"),
    Sampler("DEIS", "DEISMultistepScheduler"),
    Sampler("LCM", "LCMScheduler"),
    Sampler("Euler (flow matching)", "FlowMatchEulerDiscreteScheduler"),
]
BY_NAME = {s.name: s for s in SAMPLERS}


def offered(scheduler: Any) -> list[Sampler]:
    """The samplers this model can use: A1111 names first, then other compatible classes by class name."""
    classes = (type(scheduler).__name__, *sorted(c.__name__ for c in getattr(scheduler, "compatibles", [])))
    config = json.dumps(dict(scheduler.config), sort_keys=True, default=str)
    return list(_offered(classes, config))


@functools.lru_cache(maxsize=32)
def _offered(classes: tuple[str, ...], config: str) -> tuple[Sampler, ...]:
    """Cached per scheduler config: building every candidate once costs ~0.1 s."""
    usable = {c for c in classes if _constructible(c, json.loads(config))}
    named = [s for s in SAMPLERS if s.scheduler in usable]
    covered = {s.scheduler for s in named}
    return tuple(named + [Sampler(c, c) for c in sorted(usable - covered)])


def _constructible(name: str, config: dict[str, Any]) -> bool:
    """False for schedulers whose optional dependency is missing (DPMSolverSDEScheduler needs torchsde)
    or that cannot start from this model's config (EDMEulerScheduler from SDXL's Euler config: TypeError)."""
    import diffusers

    try:
        with warnings.catch_warnings():  # numpy 2 deprecation notes from diffusers' sigma tables
            warnings.simplefilter("ignore", DeprecationWarning)
            getattr(diffusers, name).from_config(config)
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        log.debug("sampler %s not offered: %s", name, exc)
        return False
    return True


def current(scheduler: Any) -> Sampler:
    """The sampler the model's own scheduler is, by its class and options."""
    config = dict(getattr(scheduler, "config", {}))
    cls = type(scheduler).__name__
    for s in SAMPLERS:
        if s.scheduler == cls and all(config.get(k, v if k != "use_karras_sigmas" else False) == v for k, v in s.options.items()):
            return s
    return Sampler(cls, cls)


def build(scheduler: Any, name: str) -> Any:
    """A new scheduler for sampler `name` from the model's scheduler config (ValueError if not offered)."""
    choices = {s.name: s for s in offered(scheduler)}
    if name not in choices:
        raise ValueError(f"sampler: {name!r} is not available for this model; available: {', '.join(choices)}")
    sampler = choices[name]
    import diffusers

    cls = getattr(diffusers, sampler.scheduler)
    return cls.from_config(scheduler.config, **sampler.options)


def from_a1111(sampler: str, schedule_type: str | None = None) -> str:
    """Our sampler name for A1111's fields ("DPM++ 2M" + "Karras", or the older "DPM++ 2M Karras")."""
    if schedule_type and schedule_type.lower() == "karras" and f"{sampler} Karras" in BY_NAME:
        return f"{sampler} Karras"
    return sampler
