"""Textual-inversion embeddings from EMBEDDINGS_DIR, usable in prompts by their file name, as in A1111.

Each file's stem is its word (`embeddings/bad-hands.safetensors` -> `bad-hands`; ComfyUI's
`embedding:bad-hands` is read as the same word). They are loaded once, when the pipeline loads,
through diffusers' `load_textual_inversion` (the tokenizer gains the word, the text encoder its
vectors), so a prompt that names one works on every path: the pipeline's own encoding and ours
(`pipelines.prompts.weights`, which expands a multi-vector word as diffusers does).

| file                        | holds (A1111, its trainers, Civitai)                    |
|-----------------------------|---------------------------------------------------------|
| `.safetensors`              | `emb_params` (vectors x width); SDXL: `clip_l` and `clip_g` |
| `.pt` / `.bin`              | A1111's `string_to_param: {"*": vectors}`, or diffusers' `{word: vector}` |

`.pt`/`.bin` are pickles: they are read with torch's weights-only loader, which refuses code. A file
that does not fit the model's text encoders (another width, another family) is skipped with the
reason, which A1111's `/sdapi/v1/embeddings` lists as `skipped`.
"""

from __future__ import annotations

import logging
import pickle
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipelines.weights.hashing import embedding_hash

log = logging.getLogger(__name__)

SUFFIXES = (".safetensors", ".pt", ".bin")
_COMFY = re.compile(r"\bembedding:([\w.\-]+)")


@dataclass(frozen=True)
class Embedding:
    name: str
    path: Path
    vectors: int
    width: int  # the first text encoder's width it fits

    @property
    def hash(self) -> str:
        return embedding_hash(self.path)


def read(path: Path) -> dict[str, torch.Tensor]:
    """The vectors of one embedding file per text encoder: {"clip_l": ..., "clip_g": ...} for SDXL,
    else {"clip_l": ...} (2-D: vectors x width)."""
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        data: dict[str, Any] = load_file(str(path))
    else:
        data = torch.load(path, map_location="cpu", weights_only=True)
    if "clip_l" in data:
        return {k: _rows(v) for k, v in data.items() if k in ("clip_l", "clip_g")}
    if "string_to_param" in data:
        return {"clip_l": _rows(next(iter(data["string_to_param"].values())))}
    if "emb_params" in data:
        return {"clip_l": _rows(data["emb_params"])}
    tensors = [v for v in data.values() if isinstance(v, torch.Tensor)]
    if len(tensors) == 1:  # diffusers' {word: vector}
        return {"clip_l": _rows(tensors[0])}
    raise ValueError(f"no embedding vectors found (keys: {', '.join(map(str, list(data)[:6]))})")


def _rows(value: Any) -> torch.Tensor:
    tensor = torch.as_tensor(value).detach().float()
    return tensor[None] if tensor.ndim == 1 else tensor


class Embeddings:
    """The embeddings loaded into one pipeline, and the files it skipped with the reason."""

    def __init__(self, pipe: Any, folder: Path) -> None:
        self.folder = Path(folder)
        self.loaded: dict[str, Embedding] = {}
        self.skipped: dict[str, str] = {}
        if not hasattr(pipe, "load_textual_inversion") or not self.folder.is_dir():
            return
        for path in sorted(p for p in self.folder.iterdir() if p.suffix.lower() in SUFFIXES):
            try:
                self.loaded[path.stem] = _load(pipe, path)
            except (ValueError, RuntimeError, OSError, KeyError, TypeError, pickle.UnpicklingError) as exc:
                # the file's fault (not an embedding, another model's, a pickle with code): skip it, say why
                self.skipped[path.stem] = f"{path.name}: {exc}"
                log.warning("embedding %s skipped: %s", path.name, exc)
        if self.loaded:
            log.info("embeddings loaded from %s: %s", self.folder, ", ".join(self.loaded))

    def words(self, prompt: str) -> str:
        """`prompt` with ComfyUI's `embedding:name` written as the embedding's word."""
        return _COMFY.sub(lambda m: self._word(m.group(1)) or m.group(0), prompt) if "embedding:" in prompt else prompt

    def _word(self, written: str) -> str | None:
        stem = Path(written).stem if Path(written).suffix.lower() in SUFFIXES else written
        return stem if stem in self.loaded else None

    def used(self, *prompts: str) -> dict[str, str]:
        """{name: hash} of the embeddings `prompts` name (A1111's `TI hashes`)."""
        text = " ".join(self.words(p) for p in prompts)
        return {n: e.hash for n, e in self.loaded.items() if re.search(rf"(?<![\w-]){re.escape(n)}(?![\w-])", text)}


def _load(pipe: Any, path: Path) -> Embedding:
    """One file into `pipe`'s tokenizers and text encoders; ValueError where it does not fit."""
    vectors = read(path)
    pairs = [("clip_l", pipe.tokenizer, pipe.text_encoder)]
    if getattr(pipe, "text_encoder_2", None) is not None and "clip_g" in vectors:
        pairs.append(("clip_g", pipe.tokenizer_2, pipe.text_encoder_2))
    elif "clip_g" in vectors:
        raise ValueError("an SDXL embedding (clip_l + clip_g) for a model with one CLIP")
    elif getattr(pipe, "text_encoder_2", None) is not None and "CLIP" in type(pipe.text_encoder_2).__name__:
        raise ValueError("an SD 1.x/2.x embedding for a model with two CLIPs (SDXL takes clip_l + clip_g)")
    for key, _, encoder in pairs:
        width = encoder.get_input_embeddings().weight.shape[1]
        if vectors[key].shape[1] != width:
            raise ValueError(f"{key} vectors are {vectors[key].shape[1]} wide; this text encoder takes {width}")
    for key, tokenizer, encoder in pairs:
        pipe.load_textual_inversion(vectors[key], token=path.stem, tokenizer=tokenizer, text_encoder=encoder)
    return Embedding(path.stem, path, vectors["clip_l"].shape[0], vectors["clip_l"].shape[1])
