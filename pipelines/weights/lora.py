"""LoRA adapters through diffusers + peft (`load_lora_weights`, `set_adapters`, `delete_adapters`).

Rules: only `.safetensors` (diffusers reads them with safetensors, its pickle fallback disabled);
only files inside LORA_DIR unless the caller explicitly allows another path; a file that does
not fit the model is refused with a clear error and leaves the pipeline as it was.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.one_load import ONE_LOAD
from pipelines.schema.errors import LoraError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoraInfo:
    name: str
    path: Path | None
    loaded: bool


class LoraManager:
    def __init__(self, pipe: Any, device_manager: Any, lora_dir: Path):
        self.pipe = pipe
        self.dm = device_manager
        self.lora_dir = Path(lora_dir).resolve()
        self._loaded: dict[str, Path] = {}

    def available(self) -> dict[str, Path]:
        """`.safetensors` files in LORA_DIR, by adapter name (the file's stem)."""
        if not self.lora_dir.is_dir():
            return {}
        return {p.stem: p for p in sorted(self.lora_dir.glob("*.safetensors"))}

    def list(self) -> list[LoraInfo]:
        names = {**self.available(), **self._loaded}
        return [LoraInfo(n, p, n in self._loaded) for n, p in sorted(names.items())]

    @property
    def loaded(self) -> list[str]:
        return list(self._loaded)

    def _check_path(self, path: Path, allow_outside: bool) -> Path:
        if path.suffix.lower() != ".safetensors":
            raise LoraError(
                f"{path.name}: only .safetensors LoRA files are accepted (.bin/.pt/.ckpt are pickles that can run code)"
            )
        resolved = path.expanduser().resolve()
        if not allow_outside and not resolved.is_relative_to(self.lora_dir):
            raise LoraError(f"{path} is outside the LoRA folder {self.lora_dir} (LORA_DIR); refusing to load it")
        return resolved

    def resolve(self, path: str | Path) -> Path:
        """A LoRA by path, by file name in LORA_DIR, or by the name `list()` shows (the file's stem)."""
        path = Path(path)
        if path.is_absolute() or path.exists():
            return path
        if path.suffix == "":
            if (self.lora_dir / f"{path}.safetensors").is_file():
                return self.lora_dir / f"{path}.safetensors"
            known = ", ".join(self.available()) or "none"
            raise LoraError(f"LoRA not found: no {path}.safetensors in the LoRA folder (available: {known})")
        return self.lora_dir / path

    def load(self, path: str | Path, name: str | None = None, allow_outside: bool = False) -> str:
        """Load a LoRA file as adapter `name` (default: its stem).

        Loaded by path, not from a pre-read dict, so diffusers reads the file's safetensors header:
        peft/diffusers adapter metadata (lora_alpha, rank and alpha patterns) sets the strength
        the trainer meant. Kohya/A1111 files (`lora_unet_...`, `.alpha` tensors) are converted by
        diffusers, alpha included. `use_safetensors=True` forbids diffusers' pickle fallback.
        """
        resolved = self._check_path(self.resolve(path), allow_outside)
        if not resolved.is_file():
            raise LoraError(f"LoRA file not found: {resolved.name}")
        name = name or resolved.stem
        if name in self._loaded:
            self.unload(name)
        try:
            with ONE_LOAD:  # peft builds the adapter's layers under a process-wide meta swap
                self.pipe.load_lora_weights(
                    str(resolved.parent), weight_name=resolved.name, adapter_name=name,
                    use_safetensors=True, local_files_only=True,
                )  # fmt: skip
        except Exception as exc:
            self._discard(name)
            raise LoraError(f"{resolved.name} is not a LoRA for this model: {str(exc).splitlines()[0]}") from exc
        adapters = {a for names in self.pipe.get_list_adapters().values() for a in names}
        if name not in adapters:  # diffusers only warns when no key matched any layer
            self._discard(name)
            raise LoraError(f"{resolved.name} is not a LoRA for this model: none of its weights match its layers")
        self._loaded[name] = resolved
        log.info("LoRA %s loaded from %s", name, resolved)
        return name

    def _discard(self, name: str) -> None:
        try:
            self.pipe.delete_adapters(name)
        except Exception as exc:  # nothing was registered under this name
            log.debug("nothing to clean up for LoRA %s: %s", name, exc)

    def unload(self, name: str) -> None:
        if name not in self._loaded:
            raise LoraError(f"LoRA {name!r} is not loaded (loaded: {', '.join(self._loaded) or 'none'})")
        self.pipe.delete_adapters(name)
        del self._loaded[name]
        log.info("LoRA %s unloaded", name)

    def key(self, scales: dict[str, float]) -> str:
        """The active set as a cache key: each adapter's name, file (path, size, time) and scale; "" for none.
        A runtime that bakes LoRA scales into compiled graphs (pipelines.weights.openvino) keys them by it."""
        parts = []
        for name, scale in sorted(scales.items()):
            path = self._loaded.get(name)
            stat = path.stat() if path is not None and path.is_file() else None
            parts.append(f"{name}={scale:g}@{path}:{stat.st_size if stat else 0}:{stat.st_mtime_ns if stat else 0}")
        return ";".join(parts)

    def load_named(self, names: Iterable[str]) -> None:
        """Load each of `names` not loaded yet from LORA_DIR; LoraError naming what is available for one that is not there."""
        available = self.available()
        for name in names:
            if name not in self._loaded:
                if name not in available:
                    known = sorted({*available, *self._loaded})
                    raise LoraError(f"loras: unknown LoRA {name!r}; available: {', '.join(known) or 'none'}")
                self.load(available[name], name=name)

    def activate(self, scales: dict[str, float]) -> None:
        """Make exactly these adapters active with these scales (loading from LORA_DIR on demand)."""
        self.load_named(scales)
        if not self._loaded:
            return
        if scales:
            self.pipe.enable_lora()  # undo an earlier disable_lora()
            self.pipe.set_adapters(list(scales), list(scales.values()))
        else:
            self.pipe.disable_lora()


def load_outside(pipeline: Any, wanted: dict[str, str]) -> dict[str, str]:
    """{name or .safetensors file: scale} -> {loaded adapter name: scale} (files outside LORA_DIR too: the
    command lines, `python -m pipelines` and `pipelines.batch`, drive one pipeline for porting a model)."""
    loaded = {}
    for source, scale in wanted.items():
        path = pipeline.loras.available().get(source, source)
        loaded[pipeline.load_lora(path, allow_outside=True)] = scale
    return loaded
