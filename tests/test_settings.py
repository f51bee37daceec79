"""One settings model: every variable declared once (config.sections), read once at start by the
one reader, refused in one line naming it, documented from the declarations.

The lists here are derived from the declarations (`sections(AppSettings)`), so a new variable is
covered by every test without being named in it.
"""

from __future__ import annotations

import ast
import contextlib
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Literal, get_origin

import pytest
import torch

from config import SettingsError, accepted, bounds, declared_accepts, sections, value_type, variables
from config.settings_file import read_file, settings_path, update_file
from devices import DeviceManager
from devices.options import DeviceSettings
from engine import settings_docs
from engine.settings import AppSettings
from pipelines.run.options import PipelineOptions

ROOT = Path(__file__).resolve().parents[1]
VARIABLES = [v for section in sections(AppSettings) for v in variables(section)]
FREE_TEXT = ("any text", "a path")  # what a variable that refuses nothing accepts


def bad_values(variable) -> list[str]:
    """Values the declaration refuses: its Accepts' examples, "bogus" for a choice, a word and the
    numbers just outside the bounds for a number; none for free text."""
    accepts = declared_accepts(variable.info)
    if accepts is not None:
        return list(accepts.invalid)
    kind, b = value_type(variable.info), bounds(variable.info)
    if get_origin(kind) is Literal:
        return ["bogus"]
    if kind in (int, float):
        out = ["x", "1.5"] if kind is int else ["x"]
        low, high = b.get("ge", b.get("gt")), b.get("le", b.get("lt"))
        if low is not None:
            out.append(str(low if "gt" in b else low - 1))
        if high is not None:
            out.append(str(high if "lt" in b else high + 1))
        return out
    return []


CASES = [(v.name, bad) for v in VARIABLES for bad in bad_values(v)]


def test_every_variable_is_declared_once_with_a_description():
    names = [v.name for v in VARIABLES]
    assert len(names) == len(set(names)), "a variable is declared twice"
    assert len(names) >= 45 and {"MEMORY_MODE", "PREFERRED_DEVICE_STRICT", "STEP_CACHE", "API_KEYS"} <= set(names)
    assert all(re.fullmatch(r"[A-Z][A-Z0-9_]+", n) for n in names)
    assert all(v.description and v.accepts and v.default for v in VARIABLES)


def test_every_variable_refuses_something_or_takes_any_text():
    """A variable with no bad value must say it takes any text or a path (MODEL_ID, OUTPUT_DIR):
    a new constrained variable without one fails here instead of going untested below."""
    free = [v.name for v in VARIABLES if not bad_values(v)]
    assert all(v.accepts.startswith(FREE_TEXT) for v in VARIABLES if v.name in free), free
    assert len(CASES) > len(VARIABLES)


@pytest.mark.parametrize(("name", "value"), CASES)
def test_every_bad_value_stops_with_one_line_naming_the_variable(name, value):
    variable = next(v for v in VARIABLES if v.name == name)
    with pytest.raises(SettingsError) as refused:
        AppSettings.from_env({name: value})
    message = str(refused.value)
    assert "\n" not in message
    secret = declared_accepts(variable.info) is not None and declared_accepts(variable.info).secret
    assert message.startswith(f"{name} (value hidden) is not valid" if secret else f"{name}={value!r} is not valid")
    assert f"is not valid: expected {accepted(variable.info)}" in message
    if secret:
        assert value not in message


def test_blank_is_unset_and_the_defaults_are_the_declared_ones():
    blank = AppSettings.from_env({v.name: "  " for v in VARIABLES})
    assert blank == AppSettings.from_env({}) == AppSettings()
    assert AppSettings().output_dir == Path("outputs").resolve()
    assert (
        AppSettings.from_env({}).pipeline == PipelineOptions() and AppSettings.from_env({}).devices == DeviceSettings()
    )


@pytest.mark.parametrize(
    ("env", "field", "expected"),
    [
        *[({"MONITORING": word}, "monitoring", True) for word in ("1", "TRUE", "yes", " On ")],
        *[({"MONITORING": word}, "monitoring", False) for word in ("0", "false", "NO", "off")],
        ({"HTTP_API": "yes"}, "http_api", "1"),
        ({"HTTP_API": "OFF"}, "http_api", "0"),
        ({"ALLOW_MODEL_SWITCH": "Auto"}, "allow_model_switch", "auto"),
        ({"GENERATION_BACKEND": "LOCAL"}, "generation_backend", "local"),
        ({"MAX_FILE_SIZE": "1.5 KB"}, "max_file_size", "1.5kb"),
        ({"API_KEYS": " " + "k" * 16 + " , " + "j" * 16}, "api_keys", ("k" * 16, "j" * 16)),
    ],
)
def test_the_spellings_accepted_before_are_accepted(env, field, expected):
    assert getattr(AppSettings.from_env(env), field) == expected


def test_section_spellings():
    import torch

    assert PipelineOptions.from_env({"STEP_CACHE": "FIRSTBLOCKCACHE"}).step_cache == "FirstBlockCache"
    assert PipelineOptions.from_env({"STEP_CACHE": "taylorseer"}).step_cache == "TaylorSeer"
    assert PipelineOptions.from_env({"MEMORY_MODE": " Group-Leaf "}).memory_mode == "group-leaf"
    for word, dtype in (("fp16", torch.float16), ("half", torch.float16), ("BF16", torch.bfloat16)):
        assert DeviceSettings.from_env({"TORCH_DTYPE": word}).dtype == dtype
    assert DeviceSettings.from_env({"PREFERRED_DEVICE": " CUDA:0, cuda:1 "}).preferred == "cuda:0,cuda:1"
    assert DeviceSettings.from_env({"PREFERRED_DEVICE_STRICT": "Yes"}).strict is True


def test_library_constructors_never_read_the_environment(monkeypatch):
    """Every variable set to a bad value: what a library builds without an entry point is the defaults."""
    for name, value in CASES:
        monkeypatch.setenv(name, value)
    assert PipelineOptions() == PipelineOptions.from_env({})
    assert DeviceSettings() == DeviceSettings.from_env({})
    assert AppSettings().pipeline == PipelineOptions()
    dm = DeviceManager()
    assert (dm.backend, dm.options.strict) == ("cpu", False)


def test_updated_checks_the_values_it_is_given():
    options = PipelineOptions().updated(max_batch=3, lora_dir="models", torch_dtype="x")
    assert (options.max_batch, options.lora_dir, options.extra) == (3, Path("models"), {"torch_dtype": "x"})
    with pytest.raises(ValueError, match="memory_mode"):
        PipelineOptions().updated(memory_mode="bogus")


def test_the_docs_table_is_current():
    text = settings_docs.DOCS.read_text(encoding="utf-8")
    assert settings_docs.current(text) == text, "docs/settings.md is not current: run python -m engine.settings_docs"
    assert all(f"| `{v.name}` |" in text for v in VARIABLES)


def environment_readers() -> set[str]:
    """Project files (tests and benchmarks aside) that touch os.environ / os.getenv."""
    found = set()
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(("tests/", "benchmarks/", ".")) or "/." in rel:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb")) or (
                isinstance(node, ast.ImportFrom)
                and node.module == "os"
                and any(a.name in ("environ", "getenv") for a in node.names)
            ):
                found.add(rel)
    return found


def test_the_environment_is_read_only_where_docs_settings_md_says():
    """Entry points (from_env(os.environ)) and the platform-set exceptions, each listed in the docs."""
    text = settings_docs.DOCS.read_text(encoding="utf-8")
    section = text.split("### Where the environment is read", 1)[1].split("\n## ", 1)[0]
    documented = set(re.findall(r"\b((?:[a-z_]+/)*[a-z_]+\.py)\b", section))
    assert environment_readers() == documented


def run_app(env: dict[str, str], tmp_path: Path) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`python app.py` with `env`, and the modules it had imported when it exited (sitecustomize)."""
    (tmp_path / "sitecustomize.py").write_text(
        "import atexit, os, sys\n"
        "atexit.register(lambda: open(os.environ['IMPORTED_MODULES_FILE'], 'w').write('\\n'.join(sys.modules)))\n"
    )
    modules = tmp_path / "modules.txt"
    full = {**os.environ, **env, "PYTHONPATH": str(tmp_path), "IMPORTED_MODULES_FILE": str(modules)}
    run = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=full, capture_output=True, text=True, timeout=300)
    return run, set(modules.read_text().split("\n")) if modules.exists() else set()


@pytest.mark.parametrize(
    ("name", "value", "line"),
    [
        ("MEMORY_MODE", "bogus", "MEMORY_MODE='bogus' is not valid: expected one of off, auto, balanced, max, group, group-leaf"),
        ("PREFERRED_DEVICE_STRICT", "maybe", "PREFERRED_DEVICE_STRICT='maybe' is not valid: expected 1/true/yes/on or 0/false/no/off"),
    ],
)  # fmt: skip
def test_the_app_stops_a_bad_setting_in_one_line_before_importing_diffusers_or_gradio(name, value, line, tmp_path):
    run, modules = run_app({name: value}, tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [f"error: {line}"]
    assert modules and "engine.settings" in modules
    assert not {"diffusers", "gradio", "transformers"} & modules


@pytest.mark.parametrize(
    ("command", "name", "value"),
    [
        (["-m", "devices"], "PREFERRED_DEVICE_STRICT", "maybe"),
        (["-m", "pipelines", "a red circle"], "MEMORY_MODE", "bogus"),
    ],
)
def test_the_entry_points_below_engine_read_their_sections(command, name, value):
    env = {**os.environ, name: value}
    run = subprocess.run([sys.executable, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 2
    assert run.stderr.strip().splitlines()[-1].startswith(f"error: {name}={value!r} is not valid: expected")


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"PREFERRED_DEVICE": "cpu"}, "PREFERRED_DEVICE"),
        ({"CPU_REPLICAS": "2", "PREFERRED_DEVICE_STRICT": "1"}, "PREFERRED_DEVICE_STRICT, CPU_REPLICAS"),
        ({"EDIT_MODEL_ID": "models/tiny-shapes-edit"}, "EDIT_MODEL_ID"),
    ],
)
def test_the_ray_backend_refuses_at_start_what_it_cannot_honour(env, named):
    with pytest.raises(SettingsError, match=f"^{named}") as refused:
        AppSettings.from_env({"GENERATION_BACKEND": "ray", **env})
    assert "\n" not in str(refused.value)
    assert AppSettings.from_env({"GENERATION_BACKEND": "ray", "EDIT_MODEL_ID": "none"}).edit_model_id == "none"


def test_every_pipeline_option_travels_to_the_ray_replicas(tmp_path, monkeypatch):
    """What serving.deployment rebuilds on a replica equals the app's options, field by field, with
    the paths that exist here made absolute (nothing hand-listed: a new field travels too)."""
    from serving.ray_backend import pipeline_options_for_replicas

    monkeypatch.chdir(ROOT)
    gguf = tmp_path / "t.gguf"
    gguf.write_bytes(b"")
    env = {
        "MODEL_ID": "models/tiny-shapes", "LORA_DIR": "models/loras", "EMBEDDINGS_DIR": "models/recipes",
        "UPSCALER_DIR": "models/train", "CONTROLNET_DIR": "models/upscalers", "IPADAPTER_DIR": "models/controlnets",
        "ANNOTATOR_DIR": "models/ip_adapters", "DETECTOR_DIR": "models/loras", "WILDCARD_DIR": "models/controlnets",
        "CONTROLNET_MODELS": "someone/controlnet-x", "TILED_VAE_PIXELS": "70000",
        "STYLES_FILE": "models/tiny-shapes/vocabulary.json", "MAX_BATCH": "3", "MAX_PIXELS": "4096",
        "MAX_SIDE": "128", "MICRO_BATCH": "2", "PREVIEW_EVERY": "2", "MEMORY_MODE": "balanced", "COMPILE": "off",
        "STEP_CACHE": "MagCache", "STEP_CACHE_THRESHOLD": "0.3", "BASE_MODEL": "some/base",
        "RUNTIME": "openvino", "OPENVINO_DEVICE": "gpu.1", "OPENVINO_SHAPES": "static", "OPENVINO_CACHE": "models",
        "OPENVINO_WEIGHTS": "int8", "TINY_VAE": "madebyollin/taesd",
        "QUANTIZATION": f"transformer=gguf:{os.path.relpath(gguf, ROOT)},vae=fp8-layerwise",
    }  # fmt: skip
    options = PipelineOptions.from_env(env)
    assert all(
        getattr(options, name) != getattr(PipelineOptions(), name)
        for name in PipelineOptions.model_fields
        if name != "extra"
    )
    rebuilt = PipelineOptions(**pipeline_options_for_replicas(options, {"micro_batch": 1}))
    assert rebuilt == options.updated(
        micro_batch=1,
        model_id=str(ROOT / "models/tiny-shapes"),
        lora_dir=ROOT / "models/loras",
        embeddings_dir=ROOT / "models/recipes",
        upscaler_dir=ROOT / "models/train",
        controlnet_dir=ROOT / "models/upscalers",
        ipadapter_dir=ROOT / "models/controlnets",
        annotator_dir=ROOT / "models/ip_adapters",
        detector_dir=ROOT / "models/loras",
        wildcard_dir=ROOT / "models/controlnets",
        styles_file=ROOT / "models/tiny-shapes/vocabulary.json",
        openvino_cache=ROOT / "models",
        quantization=f"transformer=gguf:{gguf},vae=fp8-layerwise",
    )


# ---------------------------------------------------------------- the settings file
@contextlib.contextmanager
def app_log():
    """The records of app.py's logger, from a handler on that logger itself: a logging.config call
    made by another test module's imports (disable_existing_loggers) can leave that logger disabled
    in a test session, which `python app.py` never is."""
    logger, records = logging.getLogger("diffusion_anywhere"), []
    handler = logging.Handler(logging.INFO)
    handler.emit = records.append
    level, disabled = logger.level, logger.disabled
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.disabled = False
    try:
        yield records
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.disabled = disabled


def test_the_settings_file_sits_under_the_environment_and_the_start_log_says_where_each_came_from(
    tmp_path, monkeypatch
):
    """environment > settings file > defaults, through app.py's own reader."""
    import app

    file = tmp_path / "settings.json"
    update_file(file, {"TORCH_DTYPE": "bfloat16", "PREFERRED_DEVICE": "cpu", "COMPILE": "off"})
    monkeypatch.setenv("SETTINGS_FILE", str(file))
    monkeypatch.setenv("TORCH_DTYPE", "float32")
    monkeypatch.delenv("PREFERRED_DEVICE", raising=False)
    monkeypatch.delenv("COMPILE", raising=False)
    monkeypatch.delenv("MEMORY_MODE", raising=False)
    with app_log() as records:
        settings, _ = app.check_settings([])
    assert settings.devices.dtype == torch.float32  # the environment wins
    assert settings.devices.preferred == "cpu" and settings.pipeline.compile == "off"  # the file
    assert settings.pipeline.memory_mode == "auto"  # neither: the default
    line = next(r.getMessage() for r in records if r.getMessage().startswith("settings: "))
    assert f"PREFERRED_DEVICE=cpu (settings file {file})" in line
    assert "TORCH_DTYPE=float32 (environment)" in line and "bfloat16" not in line


def test_a_bad_value_in_the_settings_file_stops_the_app_naming_the_file(tmp_path):
    file = tmp_path / "settings.json"
    file.write_text(json.dumps({"MEMORY_MODE": "bogus"}))
    run, _ = run_app({"SETTINGS_FILE": str(file)}, tmp_path)
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "error: MEMORY_MODE='bogus' is not valid: expected one of off, auto, balanced, max, group, group-leaf "
        f"(from settings file {file})"
    ]
    file.write_text("[1, 2]")
    run, _ = run_app({"SETTINGS_FILE": str(file)}, tmp_path)
    assert run.returncode == 2 and "is not a JSON object" in run.stderr


def test_update_file_merges_and_the_default_path_is_per_user(tmp_path):
    file = tmp_path / "a" / "settings.json"
    update_file(file, {"TORCH_DTYPE": "float32"})
    update_file(file, {"PREFERRED_DEVICE": "npu"})
    assert read_file(file) == {"TORCH_DTYPE": "float32", "PREFERRED_DEVICE": "npu"}
    assert settings_path({"HOME": "/home/u"}) == Path("/home/u/.config/diffusion-anywhere/settings.json")
    assert settings_path({"XDG_CONFIG_HOME": "/x", "HOME": "/h"}) == Path("/x/diffusion-anywhere/settings.json")
    assert settings_path({"SETTINGS_FILE": ""}) is None and read_file(None) == {}
