"""Settings of the app: every variable of engine/ and the front ends, declared once as `AppSettings`
(with the pipeline's `PipelineOptions` and the devices' `DeviceSettings` as its sections), read once
at start (`AppSettings.from_env(os.environ)`, by app.py and `python -m engine`) and validated
before anything heavy is imported or loaded.

Nothing below reads the environment: the sections are passed down as objects (tests/test_engine.py
builds the backend with the environment locked). A bad value stops the start with one line naming
the variable and the values it accepts (`SettingsError`), never a traceback. docs/settings.md's
table is generated from these declarations (`python -m engine.settings_docs`).

Rules across variables (`_rules`): on ZeroGPU COMPILE=auto is off and RUNTIME=auto is torch; on a Space the server listens on
0.0.0.0 unless GRADIO_SERVER_NAME says otherwise; AUTH and AUTH_FILE make one set of users; the
Ray backend refuses the local pool's device variables and EDIT_MODEL_ID, which it cannot honour.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, InstanceOf

from config import Accepts, AutoFlag, Flag, Lower, Refused, Section, SettingsError, read_section, setting
from devices.options import DeviceSettings
from pipelines import PipelineOptions

from .auth import AuthError, Users

__all__ = ["AppSettings", "SettingsError"]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(b|kb|mb|gb)\s*$", re.IGNORECASE)
_SIZE_UNITS = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}
_KEY_RE = re.compile(r"[A-Za-z0-9_.\-]{16,256}")
BACKENDS = ("local", "ray")
RAY_DEVICES = ("auto", "cpu", "cuda", "xpu", "npu")
DEFAULT_MODELS_DIR = Path(__file__).resolve().parents[1] / "models"  # the embedded models


def _resolved(value: Any) -> Any:
    return Path(value).resolve() if isinstance(value, str) else value


def _file_size(value: Any) -> str:
    if not isinstance(value, str) or not _SIZE_RE.match(value):
        raise ValueError("not a size")
    return value.replace(" ", "").lower()


def _api_keys(value: Any) -> Any:
    """key1,key2: each at least 16 characters of letters, digits, - _ . (a guessable key is refused)."""
    if not isinstance(value, str):
        return value
    keys = tuple(k.strip() for k in value.split(",") if k.strip())
    for n, key in enumerate(keys, 1):
        if not _KEY_RE.fullmatch(key):
            raise Refused(f"key {n} is not one")
    return keys


def _users(where: str) -> BeforeValidator:
    """AUTH (the text) or AUTH_FILE (a file of such lines) as Users; the reason names the line."""

    def parse(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return Users.parse(value, None) if where == "AUTH" else Users.parse(None, value)
        except AuthError as exc:
            if where == "AUTH":  # no detail: it could quote a password
                raise ValueError("not user:password") from None
            raise Refused(str(exc).removeprefix("AUTH_FILE").lstrip(": ")) from None

    return BeforeValidator(parse)


ResolvedPath = Annotated[Path, BeforeValidator(_resolved)]
FileSize = Annotated[
    str, BeforeValidator(_file_size), Accepts("a size such as 500kb, 10mb or 1gb", invalid=("abc", "10 tb"))
]
ApiKeys = Annotated[
    tuple[str, ...],
    BeforeValidator(_api_keys),
    Accepts(
        "comma-separated keys of 16 to 256 letters, digits, - _ .",
        invalid=("short", "x" * 16 + ",has space"),
        secret=True,
    ),
]
Auth = Annotated[
    InstanceOf[Users] | None,
    _users("AUTH"),
    Accepts(
        "user:password[,user2:password2]; a password may be a pbkdf2_sha256$... hash", invalid=("nocolon",), secret=True
    ),
]
AuthFile = Annotated[
    InstanceOf[Users] | None,
    _users("AUTH_FILE"),
    Accepts("a readable file of user:password lines", invalid=("/nonexistent/auth-file",)),
]
OnSpaces = Annotated[
    bool, BeforeValidator(lambda v: bool(v.strip()) if isinstance(v, str) else v), Accepts("any text (set: a Space)")
]


class AppSettings(Section, title="App"):
    """Everything the app takes from the environment, besides its sections (docs/settings.md)."""

    pipeline: PipelineOptions = Field(default_factory=PipelineOptions)
    devices: DeviceSettings = Field(default_factory=DeviceSettings)
    output_dir: ResolvedPath = setting(
        "OUTPUT_DIR", "outputs", "where PNGs (with metadata) are written; never served by URL", validate_default=True
    )  # resolved where the app starts
    server_name: str = setting(
        "GRADIO_SERVER_NAME", "127.0.0.1", "the address to listen on", shown="`127.0.0.1`; `0.0.0.0` on a Space"
    )
    server_port: int = setting("GRADIO_SERVER_PORT", 7860, "the port", ge=1, le=65535)
    queue_size: int = setting(
        "QUEUE_SIZE", 16, "generations waiting in the engine's queue, whole server", ge=1, le=10_000
    )
    queue_per_user: int = setting(
        "QUEUE_PER_USER", 4, "queued + running generations of one session / user / address", ge=1, le=10_000
    )
    max_file_size: FileSize = setting("MAX_FILE_SIZE", "10mb", "upload size")
    max_prompt_chars: int = setting("MAX_PROMPT_CHARS", 2000, "prompt and negative prompt length", ge=1, le=1_000_000)
    max_edit_files: int = setting("MAX_EDIT_FILES", 16, "files per edit request", ge=1, le=1000)
    max_upload_pixels: int = setting(
        "MAX_UPLOAD_PIXELS",
        4096 * 4096,
        "pixels per uploaded image (read from the header, before decoding)",
        ge=64,
        le=2**31,
    )
    time_budget: float = setting(
        "TIME_BUDGET", 600.0, "seconds one generation may run before it stops with what finished", ge=1.0, le=86_400.0
    )
    output_max_gb: float = setting(
        "OUTPUT_MAX_GB", 5.0, "OUTPUT_DIR's size; the oldest PNGs go first (0: no limit)", ge=0.0, le=1e6
    )
    output_max_days: float = setting(
        "OUTPUT_MAX_DAYS", 30.0, "OUTPUT_DIR's age limit in days (0: no limit)", ge=0.0, le=1e5
    )
    cache_minutes: int = setting(
        "CACHE_MINUTES", 60, "Gradio's copies of results are deleted after this", ge=1, le=100_000
    )
    monitoring: Flag = setting("MONITORING", False, "on: opens Gradio's /monitoring dashboard")
    generation_backend: Annotated[Literal[BACKENDS], Lower] = setting(
        "GENERATION_BACKEND", "local", "local (the in-process device pool) or ray (Ray Serve; docs/scale-out.md)"
    )
    ray_address: str | None = setting("RAY_ADDRESS", None, "the Ray cluster's address", shown="a local instance")
    ray_replicas: int = setting("RAY_REPLICAS", 1, "Ray replicas, one device each", ge=1, le=4096)
    ray_device: Annotated[Literal[RAY_DEVICES], Lower] = setting(
        "RAY_DEVICE", "auto", "the device kind of each Ray replica"
    )
    ray_cpus_per_replica: float = setting(
        "RAY_CPUS_PER_REPLICA", 1.0, "CPUs reserved per Ray replica (and its torch threads on CPU)", ge=0.1, le=256.0
    )
    settings_file: str | None = setting(
        "SETTINGS_FILE", None,
        "the settings file every entry point reads under the environment (`python -m devices optimize --apply` "
        "and `set` write it; empty: none; docs/settings.md#the-settings-file)",
        shown="`~/.config/diffusion-anywhere/settings.json`",
    )  # fmt: skip  (config.settings_file reads it; declared here for the table and the check)
    status_interval: float = 2.0  # seconds between status panel refreshes (not a variable)
    history_seconds: int = 300  # the status panel's memory chart (not a variable)
    on_spaces: OnSpaces = setting(
        "SPACE_ID", False, "set by Hugging Face Spaces (any value): the app runs as a Space", shown="unset"
    )
    zero_gpu: Flag = setting(
        "SPACES_ZERO_GPU",
        False,
        "set by Spaces on ZeroGPU hardware: generations run in spaces.GPU workers (docs/zerogpu.md)",
    )
    zero_gpu_duration: float = setting(
        "ZEROGPU_DURATION", 120.0, "the most GPU seconds one generation asks ZeroGPU for", ge=10.0, le=1500.0
    )
    auth: Auth = setting("AUTH", None, "sign-in; `python -m engine.auth USER` prints a line with a hashed password")
    auth_file: AuthFile = setting("AUTH_FILE", None, "sign-in, from a file (with AUTH: both sets of users)")
    users: InstanceOf[Users] | None = None  # AUTH and AUTH_FILE together (from_env): sign-in required when set
    models_dir: ResolvedPath | None = setting(
        "MODELS_DIR", DEFAULT_MODELS_DIR, "model folders offered by the model picker (with the recipes in models/recipes/)",
        shown="`models/`",
    )  # fmt: skip
    allow_model_switch: AutoFlag = setting(
        "ALLOW_MODEL_SWITCH", "auto", "switching models for every user: auto = only when listening on localhost"
    )
    edit_model_id: str = setting(
        "EDIT_MODEL_ID", "",
        "the Edit tab's model: unset = the embedded editor beside the embedded model, else the main model; a "
        "folder / Hub id / recipe; none = always the main model",
        shown="(automatic)",
    )  # fmt: skip
    video_model_id: str = setting(
        "VIDEO_MODEL_ID", "",
        "the Video tab's model: unset = the embedded tiny-shapes-video beside the embedded model; a folder / Hub id / "
        "recipe of a video family (Wan, LTX); none = no video",
        shown="(automatic)",
    )  # fmt: skip
    http_api: AutoFlag = setting(
        "HTTP_API", "auto",
        "the A1111 (/sdapi/v1) and OpenAI (/v1/images) HTTP APIs on the app's port; auto = on localhost or with "
        "AUTH/API_KEYS, not on a public address without sign-in nor on ZeroGPU",
    )  # fmt: skip
    api_keys: ApiKeys = setting("API_KEYS", (), "Bearer keys for the HTTP APIs (what the openai SDK sends as api_key)")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> AppSettings:
        """Read and check every variable (`env`: os.environ at start); SettingsError naming the first bad one."""
        return _rules(read_section(env, cls))

    @property
    def loopback(self) -> bool:
        """Listening on this machine only (127.0.0.1, localhost or ::1)."""
        return self.server_name in ("127.0.0.1", "localhost", "::1")

    @property
    def exposed_without_sign_in(self) -> bool:
        """Listening beyond this machine with no AUTH (Spaces have their own visibility settings)."""
        return not self.loopback and self.users is None and not self.on_spaces

    @property
    def model_switch_allowed(self) -> bool:
        """A switch changes the model for every user: by default only a server on localhost allows it."""
        if self.allow_model_switch == "auto":
            return self.loopback
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
        local = self.loopback and not self.on_spaces
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


def _rules(settings: AppSettings) -> AppSettings:
    """The rules across variables (module docstring); SettingsError for a combination a backend cannot honour."""
    changes: dict[str, Any] = {}
    if settings.zero_gpu and "auto" in (settings.pipeline.compile, settings.pipeline.runtime):
        # ZeroGPU attaches a GPU only inside a spaces.GPU call: a compile warm-up at load would run without
        # one, and the CPU seen at load is not where generations run (so no OpenVINO there either)
        changes["pipeline"] = settings.pipeline.replace(
            compile="off" if settings.pipeline.compile == "auto" else settings.pipeline.compile,
            runtime="torch" if settings.pipeline.runtime == "auto" else settings.pipeline.runtime,
        )
    if settings.on_spaces and "server_name" not in settings.model_fields_set:
        changes["server_name"] = "0.0.0.0"
    if settings.auth is not None or settings.auth_file is not None:
        accounts = [u.accounts for u in (settings.auth, settings.auth_file) if u is not None]
        changes["users"] = Users({k: v for a in accounts for k, v in a.items()})
    if settings.generation_backend == "ray":
        _check_ray(settings)
    return settings.replace(**changes) if changes else settings


def _check_ray(settings: AppSettings) -> None:
    """What the Ray backend cannot honour stops the start instead of being ignored: its replicas take
    their devices from RAY_DEVICE / RAY_REPLICAS, and it serves one model (edits go to it)."""
    devices = settings.devices
    local_only = {
        "PREFERRED_DEVICE": devices.preferred != "auto",
        "PREFERRED_DEVICE_STRICT": devices.strict,
        "CPU_REPLICAS": devices.cpu_replicas is not None,
        "PARALLEL": devices.parallel is not None,
        "REPLICA_PROCESSES": devices.replica_processes,
    }
    unused = [name for name, used in local_only.items() if used]
    if unused:
        raise SettingsError(
            f"{', '.join(unused)}: set for the local device pool, but GENERATION_BACKEND=ray places its replicas "
            "by RAY_DEVICE and RAY_REPLICAS; unset it"
        )
    if settings.video_model_id not in ("", "none"):
        raise SettingsError(
            f"VIDEO_MODEL_ID={settings.video_model_id!r}: the Ray backend serves one model; a video model is served by "
            "MODEL_ID itself there, or use GENERATION_BACKEND=local"
        )
    if settings.edit_model_id not in ("", "none"):
        raise SettingsError(
            f"EDIT_MODEL_ID={settings.edit_model_id!r}: the Ray backend serves one model, which takes the edits too; "
            "unset EDIT_MODEL_ID or use GENERATION_BACKEND=local"
        )
