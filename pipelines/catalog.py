"""The models a server offers for switching: its recipes and the model folders under MODELS_DIR.

Only these can be loaded at runtime (by name): a switch request never names an arbitrary path or
Hub id, so a caller cannot make the server download, read or run anything its operator did not
put there.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from . import recipes


@dataclass(frozen=True)
class ModelEntry:
    name: str  # what the picker shows and /load_model takes
    source: str  # MODEL_ID for it: a recipe name or a folder
    kind: str  # "recipe" | "folder"


def list_models(models_dir: Path | None, recipes_dir: Path = recipes.RECIPES_DIR) -> list[ModelEntry]:
    """Recipes first (by name), then diffusers folders (with model_index.json) directly under `models_dir`."""
    out = [ModelEntry(name, name, "recipe") for name in recipes.available(recipes_dir)]
    taken = {e.name for e in out}
    if models_dir is not None and Path(models_dir).is_dir():
        for folder in sorted(Path(models_dir).iterdir()):
            if (folder / "model_index.json").is_file() and folder.name not in taken:
                out.append(ModelEntry(folder.name, str(folder.resolve()), "folder"))
    return out


def find(name: str, models_dir: Path | None, recipes_dir: Path = recipes.RECIPES_DIR) -> ModelEntry:
    entries = {e.name: e for e in list_models(models_dir, recipes_dir)}
    if name not in entries:
        raise ValueError(f"model: {name!r} is not offered here; available: {', '.join(entries) or 'none'}")
    return entries[name]
