"""Pipeline options: read from the environment once, by the app's settings (`from_env`), and passed
down as this object; below that nothing reads the environment (arguments override fields: `updated`).

- MODEL_ID: a diffusers folder, a Hub id or a .safetensors checkpoint (default: the embedded
  model in models/tiny-shapes)
- LORA_DIR: folder of .safetensors LoRAs that may be loaded (default: models/loras)
- MAX_BATCH: most images per request (default 16)
- MAX_PIXELS: most pixels per image, width x height (default: the model's native area x
  PIXEL_BUDGET_FACTOR of the device: 4 on CPU/MPS, 9 on CUDA/ROCm/NPU/XPU)
- MAX_SIDE: largest width or height (default: 4 x the model's native side)
- MICRO_BATCH: most images denoised together (default 8); halves itself on out-of-memory
- PREVIEW_EVERY: steps between live previews in the UI (default 5)
- MEMORY_MODE: off | auto | balanced | max | group | group-leaf (default auto; see
  DeviceManager.set_memory_efficient_mode)
- COMPILE: auto | on | off (default auto: the per-device table in devices.compile; off on CPU and MPS)
- STEP_CACHE: none | FirstBlockCache | TaylorSeer | MagCache, the step cache of requests that name
  none (default: none, or the recipe's; pipelines.step_cache); off where the model has no cache
- STEP_CACHE_THRESHOLD: its threshold, a number in (0, 1] (default: the method's own)
- QUANTIZATION: component=method[:file],... (default none; pipelines.quantization, docs/quantization.md)
- BASE_MODEL: the diffusers folder or Hub id that a MODEL_ID=<file>.gguf transformer completes
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from devices.compile import parse_compile

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO_ROOT / "models" / "tiny-shapes"
DEFAULT_LORA_DIR = REPO_ROOT / "models" / "loras"


def _env_int(env: Mapping[str, str], name: str, default: int | None) -> int | None:
    value = env.get(name, "").strip()
    if not value:
        return default
    try:
        number = int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} is not valid: expected an integer of at least 1") from None
    if number < 1:
        raise ValueError(f"{name}={value!r} is out of range: expected an integer of at least 1")
    return number


def _env_step_cache(env: Mapping[str, str]) -> tuple[str | None, float | None]:
    """STEP_CACHE (any capitalisation) and STEP_CACHE_THRESHOLD; (None, None) where unset."""
    from .request import spec
    from .step_cache import METHODS, canonical

    raw = env.get("STEP_CACHE", "").strip()
    method = canonical(raw) if raw else None
    if raw and method is None:
        raise ValueError(f"STEP_CACHE={raw!r} is not valid: expected one of {', '.join(METHODS)}")
    raw = env.get("STEP_CACHE_THRESHOLD", "").strip()
    if not raw:
        return method, None
    field = spec("step_cache_threshold")  # the request field's one range
    try:
        threshold = field.parse(raw)
    except ValueError:
        raise ValueError(f"STEP_CACHE_THRESHOLD={raw!r} is not valid: expected a number in {field.accepted()}") from None
    return method, threshold


def _env_compile(env: Mapping[str, str]) -> str:
    try:
        return parse_compile(env.get("COMPILE"))
    except ValueError as exc:
        raise ValueError(f"COMPILE: {exc}") from None


@dataclass(frozen=True)
class PipelineOptions:
    model_id: str = str(DEFAULT_MODEL)
    lora_dir: Path = DEFAULT_LORA_DIR
    max_batch: int = 16
    max_pixels: int | None = None  # None: the model's native area x the device's PIXEL_BUDGET_FACTOR
    max_side: int | None = None  # None: 4 x the model's native side
    micro_batch: int = 8
    memory_mode: str = "auto"
    compile: str = "auto"  # COMPILE: auto | on | off (devices.compile)
    preview_every: int = 5  # steps between live previews (README "Live previews": chosen by measurement)
    step_cache: str | None = None  # STEP_CACHE; None: the recipe's, else none (pipelines.step_cache)
    step_cache_threshold: float | None = None  # STEP_CACHE_THRESHOLD; None: the method's default
    quantization: str = ""  # QUANTIZATION: "" loads the model as it is (pipelines.quantization)
    base_model: str = ""  # BASE_MODEL: the rest of the pipeline for a MODEL_ID=<file>.gguf
    extra: dict = field(default_factory=dict)  # passed to diffusers' from_pretrained

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PipelineOptions:
        """The variables above; ValueError naming a bad one."""
        env = os.environ if environ is None else environ
        step_cache, threshold = _env_step_cache(env)
        if env.get("QUANTIZATION", "").strip():  # checked at start, not when the model loads minutes later
            from .quantization import parse_setting

            parse_setting(env["QUANTIZATION"].strip())
        return cls(
            model_id=env.get("MODEL_ID", "").strip() or str(DEFAULT_MODEL),
            lora_dir=Path(env.get("LORA_DIR", "").strip() or DEFAULT_LORA_DIR),
            max_batch=_env_int(env, "MAX_BATCH", 16),
            max_pixels=_env_int(env, "MAX_PIXELS", None),
            max_side=_env_int(env, "MAX_SIDE", None),
            micro_batch=_env_int(env, "MICRO_BATCH", 8),
            memory_mode=env.get("MEMORY_MODE", "").strip() or "auto",
            preview_every=_env_int(env, "PREVIEW_EVERY", 5),
            step_cache=step_cache,
            step_cache_threshold=threshold,
            quantization=env.get("QUANTIZATION", "").strip(),
            base_model=env.get("BASE_MODEL", "").strip(),
            compile=_env_compile(env),
        )

    def updated(self, **overrides) -> PipelineOptions:
        """These options with fields replaced by the non-None `overrides`; unknown keywords are
        diffusers' `from_pretrained` arguments and go to `extra`."""
        known = {f.name for f in fields(self)}
        extra = {k: v for k, v in overrides.items() if k not in known}
        chosen = {k: v for k, v in overrides.items() if k in known and v is not None}
        if "lora_dir" in chosen:
            chosen["lora_dir"] = Path(chosen["lora_dir"])
        return replace(self, **chosen, extra={**self.extra, **extra})
