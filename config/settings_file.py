"""The settings file: variables a command wrote for this machine (`python -m devices optimize --apply`,
`python -m devices set npu`), read by every entry point under the environment.

Precedence, highest first: the environment > the settings file > the declared defaults. The file
holds the same variable names and text values the environment would (`{"TORCH_DTYPE":
"float32"}`), so one reader (`read_section`) checks both, and a value from the file that is not
valid is refused with the same one line, naming the file.

Where: `SETTINGS_FILE` when set (a Space or a test points it elsewhere; empty text: no file), else
`$XDG_CONFIG_HOME/diffusion-anywhere/settings.json` (`~/.config/...`): per user and per machine,
like the hardware it describes, and never inside the repository a Space deploys.

Why JSON and not TOML or YAML: Python 3.10 has no TOML reader and the file is written by a
program; a person can still edit it.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from .sections import Section, SettingsError, declared_accepts, sections, variables

log = logging.getLogger(__name__)

VARIABLE = "SETTINGS_FILE"
ENVIRONMENT = "environment"


class SettingsFileError(SettingsError):
    """The settings file exists but cannot be used; the message names the file and what is wrong."""


def settings_path(env: Mapping[str, str]) -> Path | None:
    """The file this process reads and the commands write; None when SETTINGS_FILE is set but empty."""
    if VARIABLE in env:
        text = env[VARIABLE].strip()
        return Path(text).expanduser() if text else None
    base = env.get("XDG_CONFIG_HOME", "").strip() or os.path.join(env.get("HOME", "") or str(Path.home()), ".config")
    return Path(base) / "diffusion-anywhere" / "settings.json"


def read_file(path: Path | None) -> dict[str, str]:
    """The file's variables as text; {} when there is no file. SettingsFileError when it is not a
    JSON object of names to scalars (the app stops with that line rather than guessing)."""
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise SettingsFileError(f"settings file {path} cannot be read: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsFileError(f"settings file {path} is not a JSON object of VARIABLE: value")
    bad = [k for k, v in data.items() if not isinstance(v, (str, int, float, bool))]
    if bad:
        raise SettingsFileError(f"settings file {path}: {bad[0]} is not a text or number value")
    return {str(k): _text(v) for k, v in data.items()}


def update_file(path: Path, values: Mapping[str, str]) -> None:
    """Merge `values` into the file (created with its folder); written to a temporary file and
    renamed, so a reader never sees half a file."""
    merged = {**read_file(path), **{k: str(v) for k, v in values.items()}}
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".settings-", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        json.dump(merged, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)
    log.info("settings file %s: %s", path, ", ".join(f"{k}={v}" for k, v in values.items()))


@dataclass(frozen=True)
class Layered:
    """The environment over the file: `values` is what the sections read, `sources` says for each
    variable the file gave where it came from (the start log prints it)."""

    values: dict[str, str]
    sources: dict[str, str]
    path: Path | None

    def origins(self, cls: type[Section]) -> list[str]:
        """"NAME=value (where)" for every variable of `cls` and its sections that the environment or
        the file sets (secrets shown as ***): the start log's account of where each setting came from."""
        out = []
        for section in sections(cls):
            for v in variables(section):
                if (self.values.get(v.name) or "").strip():
                    accepts = declared_accepts(v.info)
                    shown = "***" if accepts is not None and accepts.secret else self.values[v.name].strip()
                    out.append(f"{v.name}={shown} ({self.source(v.name)})")
        return out

    def source(self, name: str) -> str:
        """"environment", "settings file <path>", or "default" for a variable neither sets."""
        if self.sources.get(name):
            return self.sources[name]
        return ENVIRONMENT if (self.values.get(name) or "").strip() else "default"


def layered(env: Mapping[str, str]) -> Layered:
    """The environment with the settings file under it: a variable set (not blank) in the
    environment wins; one only the file sets comes from the file."""
    path = settings_path(env)
    from_file = read_file(path)
    values = dict(env)
    sources: dict[str, str] = {}
    for name, value in from_file.items():
        if not (env.get(name) or "").strip():
            values[name] = value
            sources[name] = f"settings file {path}"
    return Layered(values, sources, path)


def environment(env: Mapping[str, str]) -> dict[str, str]:
    """What an entry point reads its sections from: `env` (os.environ) over the settings file."""
    return layered(env).values


def _text(value: str | int | float | bool) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value)
