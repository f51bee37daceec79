"""Step caching: skip part of the denoiser's work on steps whose result barely changes, per request.

diffusers 0.42 gives a DiT transformer that inherits `CacheMixin` (Flux and its Kontext/Fill
variants, Qwen-Image and Qwen-Image-Edit, Chroma, Wan, HunyuanImage/Video, CogView4, LTX, Mochi...)
`enable_cache(config)` / `disable_cache()`: hooks on its blocks, no weights touched. So a cache is
switched on for one request and off again after it (also on error or Stop), without reloading:

- FirstBlockCache (threshold, diffusers' default 0.05): run the first block each step; when its
  output moved less than `threshold` (relative mean difference) since the last full step, reuse the
  cached residual of all the other blocks.
- TaylorSeer (no threshold): a full step every 5 steps (after the first 3), the steps between
  predicted from a first-order Taylor expansion of each block's output.
- MagCache (threshold, default 0.06): skip the blocks while the accumulated change of the residual's
  magnitude, predicted from per-step "mag ratios", stays under `threshold`. The ratios belong to the
  checkpoint and the schedule: the first MagCache request of a model at a step count and sampler runs
  diffusers' calibration mode (nothing skipped, the image is the uncached one), and later ones use
  the ratios it measured (kept in memory for the life of the loaded model).

UNet families (SD 1.5, SDXL) and the DiTs without `CacheMixin` in diffusers 0.42 (SD3, PixArt,
Sana, HiDream) have none: a request asking for a cache there is refused with the families that can.
This module imports diffusers only when a cache is used (the UI and the settings read its names).
"""

from __future__ import annotations

import ast
import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pipelines.schema.errors import UnsupportedTaskError
from pipelines.schema.request import STEP_CACHE_THRESHOLDS as DEFAULT_THRESHOLDS
from pipelines.schema.request import STEP_CACHES as METHODS
from pipelines.schema.request import spec

log = logging.getLogger(__name__)

NONE = METHODS[0]  # the names are pipelines.schema.request's (the owner of every request value)
FAMILIES = (
    "Flux (also Kontext and Fill), Qwen-Image (also Qwen-Image-Edit), Chroma, Wan, HunyuanImage, CogView4 "
    "and the other DiT transformers diffusers gives a cache to"
)
NOT_SUPPORTED = "SD 1.5 and SDXL (UNet), SD3, PixArt, Sana and HiDream have no step cache in diffusers 0.42"
CALIBRATION = "(calibration run)"  # after the label of a MagCache run that only calibrated (it skipped nothing)
_MAG_LOGGER = "diffusers.hooks.mag_cache"  # where diffusers reports the ratios its calibration measured
_MAG_PREFIX = "MagCache Calibration Results:"


def canonical(name: str) -> str | None:
    """The method's own spelling for any capitalisation ("firstblockcache" -> "FirstBlockCache"), else None."""
    return {m.lower(): m for m in METHODS}.get(name.strip().lower())


@dataclass(frozen=True)
class StepCache:
    """One chosen cache: the method and, for the methods that have one, its threshold."""

    method: str
    threshold: float | None = None

    @classmethod
    def of(cls, method: str | None, threshold: float | None = None) -> StepCache | None:
        """The cache for a method name (None or "none": no cache); the method's default threshold."""
        if method is None or method == NONE:
            return None
        if method not in DEFAULT_THRESHOLDS:
            return cls(method)
        return cls(method, float(threshold) if threshold is not None else DEFAULT_THRESHOLDS[method])

    @property
    def label(self) -> str:
        """ "FirstBlockCache 0.05", "TaylorSeer": what the info line and the A1111 text say."""
        return self.method if self.threshold is None else f"{self.method} {self.threshold:g}"

    @classmethod
    def from_label(cls, text: str) -> StepCache | None:
        """The cache a `label` names (a PNG's "Step cache: FirstBlockCache 0.05"); None for a method
        this app does not have or a threshold outside the request field's range."""
        name, _, threshold = text.strip().partition(" ")
        method = canonical(name)
        if method is None or method == NONE:
            return None
        if method not in DEFAULT_THRESHOLDS:
            return cls(method)
        try:
            value = float(threshold) if threshold.strip() else DEFAULT_THRESHOLDS[method]
            spec("step_cache_threshold").parse(value)
        except ValueError:
            return None
        return cls(method, value)


def supported(denoiser: Any) -> bool:
    """Whether diffusers gives this denoiser `enable_cache` (its class inherits CacheMixin)."""
    from diffusers.models.cache_utils import CacheMixin

    return isinstance(denoiser, CacheMixin)


@dataclass
class Applied:
    """What a request ran with: its cache, and for MagCache whether this run only calibrated."""

    cache: StepCache
    calibrating: bool = False
    ratios: list[float] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.cache.label + (" (calibration run: nothing skipped)" if self.calibrating else "")

    def metadata(self) -> dict[str, Any]:
        meta: dict[str, Any] = {"step_cache": self.cache.method}
        if self.cache.threshold is not None:
            meta["step_cache_threshold"] = self.cache.threshold
        if self.calibrating:
            meta["step_cache_calibration"] = True
        return meta


def _config(cache: StepCache, steps: int, ratios: list[float] | None) -> Any:
    """diffusers' config for `cache` on a run of `steps` denoiser steps."""
    from diffusers import FirstBlockCacheConfig, MagCacheConfig, TaylorSeerCacheConfig

    if cache.method == "FirstBlockCache":
        return FirstBlockCacheConfig(threshold=cache.threshold)
    if cache.method == "TaylorSeer":
        return TaylorSeerCacheConfig()
    if ratios is None:
        return MagCacheConfig(calibrate=True, num_inference_steps=steps)
    return MagCacheConfig(threshold=cache.threshold, num_inference_steps=steps, mag_ratios=list(ratios))


class _RatioCatcher(logging.Handler):
    """Reads the ratios diffusers' MagCache calibration reports at the end of a run (its one output:
    it logs them, then resets its state). The first report of this run's length is the conditional
    pass's; the length also keeps a replica calibrating at another step count (a device pool's
    threads share the logger) from being taken for this one."""

    def __init__(self, steps: int) -> None:
        super().__init__(logging.INFO)
        self.steps = steps
        self.ratios: list[float] | None = None

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.ratios is None and message.startswith(_MAG_PREFIX):
            ratios = [float(x) for x in ast.literal_eval(message[len(_MAG_PREFIX) :].strip())]
            self.ratios = ratios if len(ratios) == self.steps else None


_catching = {"count": 0, "level": logging.NOTSET}  # calibrations running now, and the logger's own level
_catching_lock = threading.Lock()


@contextlib.contextmanager
def _catch_ratios(steps: int) -> Iterator[_RatioCatcher]:
    """diffusers' MagCache logger at INFO while any calibration runs (its report is an INFO record),
    back to its own level after the last one."""
    logger = logging.getLogger(_MAG_LOGGER)
    catcher = _RatioCatcher(steps)
    with _catching_lock:
        if _catching["count"] == 0:
            _catching["level"] = logger.level
            logger.setLevel(logging.INFO)
        _catching["count"] += 1
        logger.addHandler(catcher)
    try:
        yield catcher
    finally:
        with _catching_lock:
            logger.removeHandler(catcher)
            _catching["count"] -= 1
            if _catching["count"] == 0:
                logger.setLevel(_catching["level"])


def _enable(denoiser: Any, config: Any, cache: StepCache) -> None:
    """`enable_cache`, its failures said as a refusal: diffusers' FirstBlockCache needs a first block and
    at least one after it (an IndexError on a one-block transformer, which only test models have)."""
    try:
        denoiser.enable_cache(config)
    except (IndexError, ValueError, TypeError) as exc:
        if denoiser.is_cache_enabled:
            denoiser.disable_cache()
        raise UnsupportedTaskError(
            f"{cache.method} cannot be applied to {type(denoiser).__name__}: {type(exc).__name__}: {exc}"
            + (" (it needs at least two transformer blocks)" if isinstance(exc, IndexError) else "")
        ) from exc


@contextlib.contextmanager
def applied(
    denoiser: Any, cache: StepCache | None, steps: int, calibrations: dict, sampler: str = ""
) -> Iterator[Applied | None]:
    """`cache` on `denoiser` for the body, removed after it whatever happens (error, Stop).

    `calibrations` maps (steps, sampler) to MagCache ratios (the ratios follow the noise schedule):
    a MagCache run without ratios for its key calibrates and stores them there for the next request.
    """
    if cache is None:
        yield None
        return
    key = (steps, sampler)
    ratios = calibrations.get(key) if cache.method == "MagCache" else None
    run = Applied(cache, calibrating=cache.method == "MagCache" and ratios is None)
    _enable(denoiser, _config(cache, steps, ratios), cache)
    contexts = None
    try:
        contexts = CallContexts(denoiser)
        with _catch_ratios(steps) if run.calibrating else contextlib.nullcontext() as catcher:
            yield run
        if catcher is not None and catcher.ratios:
            run.ratios = calibrations[key] = catcher.ratios
            log.info("MagCache calibrated for %d steps: %d ratios kept for later requests", steps, len(run.ratios))
    finally:
        if contexts is not None:
            contexts.remove()
        denoiser.disable_cache()


class CallContexts:
    """Names every denoiser call for the cache hooks, which keep one state per name.

    diffusers 0.42.1's FluxPipeline and Qwen-Image pipelines wrap each call in
    `transformer.cache_context("cond")` / `("uncond")`; its Flux img2img, inpaint, Kontext, Fill and
    Chroma pipelines do not, and the hooks then raise "No cache context is set" (so Edit and Inpaint
    on Flux failed with a cache). Here the first call at a timestep is "cond" and the next ones
    "uncond", "uncond-2"...: the order in which diffusers pipelines make them, and the names the
    wrapping pipelines use (their images are bit-identical with and without it; the extra fields a
    pipeline may pass to `cache_context`, read only by SeaCache, are not kept). The timestep must
    come as a keyword, as in every diffusers pipeline; comparing it costs one device sync a call.
    """

    def __init__(self, denoiser: Any) -> None:
        self.denoiser = denoiser
        self.timestep: Any = None
        self.index = 0
        self.entered: list[contextlib.AbstractContextManager] = []
        self.handles = [
            denoiser.register_forward_pre_hook(self._enter, with_kwargs=True),
            denoiser.register_forward_hook(self._exit, always_call=True),
        ]

    def _enter(self, _module: Any, args: tuple, kwargs: dict) -> None:
        timestep = kwargs.get("timestep")
        same_step = timestep is not None and self.timestep is not None and _same_timestep(timestep, self.timestep)
        self.index = self.index + 1 if same_step else 0
        self.timestep = timestep
        name = "cond" if self.index == 0 else "uncond" if self.index == 1 else f"uncond-{self.index}"
        context = self.denoiser.cache_context(name)
        context.__enter__()
        self.entered.append(context)

    def _exit(self, *_args: Any) -> None:
        if self.entered:
            self.entered.pop().__exit__(None, None, None)

    def remove(self) -> None:
        for handle in self.handles:
            handle.remove()
        while self.entered:
            self._exit()


def _same_timestep(a: Any, b: Any) -> bool:
    """Whether two timesteps (tensors or numbers) are the same step's."""
    import torch

    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and bool(torch.equal(a, b))
    return a == b
