"""Settings of the app, read from the environment once (`AppSettings.from_env`) and validated before
anything heavy is imported or loaded.

Every variable of the app is read here and nowhere else: the pipeline's (`PipelineOptions`) and the
devices' (`DeviceSettings`) are parsed here too and passed down as objects, so nothing below the
settings re-reads the environment (tests/test_engine.py builds the backend with the environment
locked). A bad value stops the start with a message naming the variable and the values it accepts
(`SettingsError`), never a traceback.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from devices.options import DeviceSettings
from pipelines.options import PipelineOptions

from .auth import Users

T = TypeVar("T")
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}
_TRUE, _FALSE = {"1", "true", "yes", "on"}, {"0", "false", "no", "off", ""}
BACKENDS = ("local", "ray")
DEFAULT_MODELS_DIR = Path(__file__).resolve().parents[1] / "models"  # the embedded models


class SettingsError(ValueError):
    """A setting has a value the app cannot use; the message names the variable and what it accepts."""


def on_spaces(env: Mapping[str, str]) -> bool:
    return bool(env.get("SPACE_ID"))


@dataclass(frozen=True)
class AppSettings:
    """Everything the app takes from the environment (see README, "Settings" and "Security and limits")."""

    pipeline: PipelineOptions = field(default_factory=PipelineOptions)  # MODEL_ID, LORA_DIR, MAX_BATCH, ...
    devices: DeviceSettings = field(default_factory=DeviceSettings)  # PREFERRED_DEVICE, CPU_REPLICAS, TORCH_DTYPE, ...
    output_dir: Path = Path("outputs")
    server_name: str = "127.0.0.1"
    server_port: int = 7860
    queue_size: int = 16
    queue_per_user: int = 4  # queued + running generations of one session / user / address
    max_file_size: str = "10mb"
    max_prompt_chars: int = 2000
    max_edit_files: int = 16
    max_upload_pixels: int = 4096 * 4096
    time_budget: float = 600.0  # seconds one generation may run before it stops with what finished
    output_max_gb: float = 5.0
    output_max_days: float = 30.0
    cache_minutes: int = 60  # Gradio's copies of results are deleted after this
    monitoring: bool = False
    generation_backend: str = "local"
    ray_address: str | None = None
    ray_replicas: int = 1
    ray_device: str = "auto"
    ray_cpus_per_replica: float = 1.0
    status_interval: float = 2.0
    history_seconds: int = 300
    on_spaces: bool = False
    zero_gpu: bool = False  # SPACES_ZERO_GPU (set by Spaces on ZeroGPU hardware): generations run in spaces.GPU workers
    zero_gpu_duration: float = 120.0  # ZEROGPU_DURATION: the most GPU seconds one generation asks ZeroGPU for
    users: Users | None = None  # AUTH / AUTH_FILE: sign-in required when set
    models_dir: Path | None = None  # MODELS_DIR: model folders offered for switching (with the recipes)
    allow_model_switch: str = "auto"  # ALLOW_MODEL_SWITCH: auto (only on localhost) | 1 | 0
    edit_model_id: str = ""  # EDIT_MODEL_ID: the Edit tab's model; "" = the embedded editor beside the embedded model
    http_api: str = "auto"  # HTTP_API: auto | 1 | 0 — the A1111 and OpenAI HTTP APIs (webapi)
    api_keys: tuple[str, ...] = ()  # API_KEYS: Bearer keys for the HTTP APIs, comma-separated

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> AppSettings:
        """Read and check every variable; raise SettingsError naming the first bad one."""
        env = os.environ if env is None else env
        spaces = on_spaces(env)
        return cls(
            pipeline=_pipeline_options(env),
            devices=_device_settings(env),
            output_dir=Path(_text(env, "OUTPUT_DIR") or "outputs").resolve(),
            server_name=_text(env, "GRADIO_SERVER_NAME") or ("0.0.0.0" if spaces else "127.0.0.1"),
            server_port=_number(env, "GRADIO_SERVER_PORT", int, 7860, 1, 65535),
            queue_size=_number(env, "QUEUE_SIZE", int, 16, 1, 10_000),
            queue_per_user=_number(env, "QUEUE_PER_USER", int, 4, 1, 10_000),
            max_file_size=_file_size(env),
            max_prompt_chars=_number(env, "MAX_PROMPT_CHARS", int, 2000, 1, 1_000_000),
            max_edit_files=_number(env, "MAX_EDIT_FILES", int, 16, 1, 1000),
            max_upload_pixels=_number(env, "MAX_UPLOAD_PIXELS", int, 4096 * 4096, 64, 2**31),
            time_budget=_number(env, "TIME_BUDGET", float, 600.0, 1.0, 86_400.0),
            output_max_gb=_number(env, "OUTPUT_MAX_GB", float, 5.0, 0.0, 1e6),
            output_max_days=_number(env, "OUTPUT_MAX_DAYS", float, 30.0, 0.0, 1e5),
            cache_minutes=_number(env, "CACHE_MINUTES", int, 60, 1, 100_000),
            monitoring=_flag(env, "MONITORING"),
            generation_backend=_choice(env, "GENERATION_BACKEND", BACKENDS),
            ray_address=_text(env, "RAY_ADDRESS"),
            ray_replicas=_number(env, "RAY_REPLICAS", int, 1, 1, 4096),
            ray_device=_choice(env, "RAY_DEVICE", ("auto", "cpu", "cuda", "xpu", "npu")),
            ray_cpus_per_replica=_number(env, "RAY_CPUS_PER_REPLICA", float, 1.0, 0.1, 256.0),
            on_spaces=spaces,
            zero_gpu=_flag(env, "SPACES_ZERO_GPU"),
            zero_gpu_duration=_number(env, "ZEROGPU_DURATION", float, 120.0, 10.0, 1500.0),
            users=Users.parse(_text(env, "AUTH"), _text(env, "AUTH_FILE")),
            models_dir=Path(_text(env, "MODELS_DIR") or DEFAULT_MODELS_DIR).resolve(),
            allow_model_switch=_switch(env),
            edit_model_id=_text(env, "EDIT_MODEL_ID") or "",
            http_api=_auto_flag(env, "HTTP_API"),
            api_keys=_api_keys(env),
        )

    @property
    def exposed_without_sign_in(self) -> bool:
        """Listening beyond this machine with no AUTH (Spaces have their own visibility settings)."""
        local = self.server_name in ("127.0.0.1", "localhost", "::1")
        return not local and self.users is None and not self.on_spaces

    @property
    def model_switch_allowed(self) -> bool:
        """A switch changes the model for every user: by default only a server on localhost allows it."""
        if self.allow_model_switch == "auto":
            return self.server_name in ("127.0.0.1", "localhost", "::1")
        return self.allow_model_switch == "1"

    @property
    def max_file_bytes(self) -> int:
        """MAX_FILE_SIZE in bytes, for the routes that read uploads themselves (the HTTP APIs)."""
        number, unit = _SIZE_RE.match(self.max_file_size).groups()
        return int(float(number) * _SIZE_UNITS[unit.lower()])

    @property
    def signed_in_only(self) -> bool:
        """Callers must sign in: AUTH / AUTH_FILE users, or API_KEYS for the HTTP APIs."""
        return self.users is not None or bool(self.api_keys)

    @property
    def http_api_enabled(self) -> bool:
        """Serve the A1111 and OpenAI HTTP APIs (webapi)?

        auto: yes on localhost or with sign-in (AUTH or API_KEYS); not on a public address without
        sign-in, Spaces included (A1111 too serves its API only when asked, with --api), and not on
        ZeroGPU, whose GPU quota is charged per Gradio visitor and has no visitor for a plain HTTP
        call. HTTP_API=1 serves them anyway; 0 never.
        """
        if self.http_api != "auto":
            return self.http_api == "1"
        local = self.server_name in ("127.0.0.1", "localhost", "::1") and not self.on_spaces
        return (local or self.signed_in_only) and not self.zero_gpu

    @property
    def http_api_off_reason(self) -> str:
        if self.http_api == "0":
            return "HTTP_API=0"
        if self.zero_gpu:
            return "on ZeroGPU, where a plain HTTP call has no visitor to charge GPU time to (HTTP_API=1 serves them)"
        return f"listening on {self.server_name} without AUTH or API_KEYS (HTTP_API=1 serves them anyway)"

    @property
    def effective_time_budget(self) -> float:
        """TIME_BUDGET, and on ZeroGPU no longer than the GPU time one generation asks for."""
        return min(self.time_budget, self.zero_gpu_duration) if self.zero_gpu else self.time_budget

    def replace(self, **changes: Any) -> AppSettings:
        return dataclasses.replace(self, **changes)


def _pipeline_options(env: Mapping[str, str]) -> PipelineOptions:
    """The pipeline layer reads its own variables (MODEL_ID, LORA_DIR, MAX_BATCH, MAX_PIXELS, ...)."""
    try:
        options = PipelineOptions.from_env(environ=env)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None
    if _flag(env, "SPACES_ZERO_GPU") and options.compile == "auto":
        # ZeroGPU attaches a GPU only inside a spaces.GPU call: a compile warm-up at load would run without one
        options = options.updated(compile="off")
    return options


def _device_settings(env: Mapping[str, str]) -> DeviceSettings:
    try:
        return DeviceSettings.from_env(env)
    except ValueError as exc:
        raise SettingsError(str(exc)) from None


def _switch(env: Mapping[str, str]) -> str:
    return _auto_flag(env, "ALLOW_MODEL_SWITCH")


def _auto_flag(env: Mapping[str, str], name: str) -> str:
    """auto | 1 | 0, from auto or any of _flag's spellings."""
    raw = (env.get(name) or "auto").strip().lower()
    if raw == "auto":
        return raw
    try:
        return "1" if _flag({name: raw}, name) else "0"
    except SettingsError:
        raise SettingsError(f"{name}={raw!r} is not valid: expected auto, 1 or 0") from None


def _api_keys(env: Mapping[str, str]) -> tuple[str, ...]:
    """API_KEYS=key1,key2: each at least 16 characters of letters, digits, - _ . (a guessable key is refused)."""
    keys = tuple(k.strip() for k in (env.get("API_KEYS") or "").split(",") if k.strip())
    for n, key in enumerate(keys, 1):
        if not re.fullmatch(r"[A-Za-z0-9_.\-]{16,256}", key):
            raise SettingsError(f"API_KEYS: key {n} is not valid: expected 16 to 256 letters, digits, - _ .")
    return keys


def _text(env: Mapping[str, str], name: str) -> str | None:
    return (env.get(name) or "").strip() or None


def _number(env: Mapping[str, str], name: str, kind: Callable[[str], T], default: T, low: T, high: T) -> T:
    raw = _text(env, name)
    if raw is None:
        return default
    accepted = f"{'an integer' if kind is int else 'a number'} from {low} to {high}"
    try:
        value = kind(raw)
    except ValueError:
        raise SettingsError(f"{name}={raw!r} is not valid: expected {accepted}") from None
    if value != value or not low <= value <= high:  # NaN or out of range
        raise SettingsError(f"{name}={raw!r} is out of range: expected {accepted}")
    return value


def _flag(env: Mapping[str, str], name: str) -> bool:
    raw = (env.get(name) or "").strip().lower()
    if raw in _TRUE:
        return True
    if raw in _FALSE:
        return False
    raise SettingsError(f"{name}={raw!r} is not valid: expected 1/true/yes/on or 0/false/no/off")


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...]) -> str:
    raw = (_text(env, name) or choices[0]).lower()
    if raw not in choices:
        raise SettingsError(f"{name}={raw!r} is not valid: expected one of {', '.join(choices)}")
    return raw


def _file_size(env: Mapping[str, str]) -> str:
    raw = _text(env, "MAX_FILE_SIZE") or "10mb"
    if not _SIZE_RE.match(raw):
        raise SettingsError(f"MAX_FILE_SIZE={raw!r} is not valid: expected a size such as 500kb, 10mb or 1gb")
    return raw.replace(" ", "").lower()
