"""Finding and loading a diffusers pipeline, with one clear error instead of a traceback wall."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from pipelines.schema.errors import ModelLoadError

log = logging.getLogger(__name__)

OFFLINE_HINT = (
    "download it first (`hf download {source}` while online) or point MODEL_ID at a local diffusers "
    "folder (one with model_index.json)"
)


def quiet_load_progress_bars() -> None:
    """Hide diffusers'/transformers' per-component loading bars (for CLIs and the app's log)."""
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


# Suffixes of the files a MODEL_ID may name; a Hub id's own dots are not one ("FLUX.1-dev", "...-base-1.0").
FILE_SUFFIXES = (".safetensors", ".ckpt", ".gguf", ".json", ".bin", ".pt", ".pth", ".sft")


def looks_like_path(source: str) -> bool:
    """Whether `source` names a local path rather than a Hub id ("namespace/name"). A dot in the name
    used to count as a file suffix: "stabilityai/stable-diffusion-xl-base-1.0" and every FLUX.1 and SD 3.5
    repository were refused as missing files, online or not."""
    return (
        source.startswith((".", "/", "~"))
        or "\\" in source
        or Path(source).suffix.lower() in FILE_SUFFIXES
        or source.count("/") > 1
    )


def load_diffusers_pipeline(source: str, dtype: torch.dtype, **kwargs: Any):
    """Load from a diffusers folder, a single-file .safetensors checkpoint or a Hub id."""
    from diffusers import DiffusionPipeline

    path = Path(source).expanduser()
    loader = DiffusionPipeline
    if kwargs.get("pipeline_class") and not path.is_file():  # a recipe's pipeline_class, by diffusers name
        import diffusers

        name = kwargs.pop("pipeline_class")
        loader = getattr(diffusers, name, None)
        if loader is None:
            raise ModelLoadError(f"pipeline_class {name!r} is not a diffusers pipeline class")
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise ModelLoadError(f"{path} is not a diffusers model folder: it has no model_index.json")
        return _call(loader.from_pretrained, str(path), source, dtype=dtype, **kwargs)
    if path.is_file():
        return _load_single_file(path, dtype, **kwargs)
    if looks_like_path(source):
        raise ModelLoadError(
            f"model not found: {source} does not exist (MODEL_ID must be a folder, a file or a Hub id)"
        )
    return _call(loader.from_pretrained, source, source, dtype=dtype, **kwargs)


def _load_single_file(path: Path, dtype: torch.dtype, **kwargs: Any):
    if path.suffix != ".safetensors":
        raise ModelLoadError(f"{path.name}: only .safetensors checkpoints are loaded (pickle files can run code)")
    from diffusers import StableDiffusionPipeline

    pipeline_class = kwargs.pop("pipeline_class", StableDiffusionPipeline)
    # Offline, from_single_file needs `config=` (a local diffusers folder of the same architecture).
    return _call(pipeline_class.from_single_file, str(path), str(path), dtype=dtype, **kwargs)


def _call(loader, target: str, source: str, **kwargs: Any):
    try:
        return loader(target, **kwargs)
    except ModelLoadError:
        raise
    except Exception as exc:
        text = str(exc)
        log.debug("loading %s failed", source, exc_info=True)
        offline = any(
            marker in text
            for marker in (
                "outgoing traffic has been disabled",
                "not fully cached",
                "offline mode",
                "Cannot reach",
                "couldn't connect",
                "Connection",
                "cannot find the requested files in the local cache",
            )
        )
        if offline or "is not a local folder and is not a valid model identifier" in text:
            raise ModelLoadError(
                f"model {source!r} could not be found locally and the Hugging Face Hub cannot be reached: "
                + OFFLINE_HINT.format(source=source)
            ) from exc
        first_line = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        raise ModelLoadError(f"could not load model {source!r}: {type(exc).__name__}: {first_line}") from exc
