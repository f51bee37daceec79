"""Model and LoRA hashes as A1111 and Civitai write them, so a PNG's `Model hash` / `Lora hashes`
name the same files on those sites:

- `Model hash`: AutoV2, the first 10 hex digits of the whole file's SHA-256.
- `Lora hashes`: A1111's LoRA extension (extensions-builtin/Lora/network.py, `read_hash`) uses the
  `sshs_model_hash` of the file's own metadata when it has one, else the "addnet" hash of a
  safetensors file (SHA-256 of the data AFTER the header: 8 bytes of header length, then the JSON
  header are skipped; modules/hashes.py `addnet_hash_safetensors`), else the whole file's SHA-256;
  the first 12 hex digits.
- `TI hashes`: a textual-inversion embedding's whole-file SHA-256, the first 12 hex digits.

Apart from the pipeline because hashing is plain file work: a multi-GB checkpoint is read once per
file version (cached by path, size and modification time), started in the background at load.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any


@functools.lru_cache(maxsize=64)
def _hash(path: str, size: int, mtime: float) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


@functools.lru_cache(maxsize=64)
def _addnet_hash(path: str, size: int, mtime: float) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as f:
        header_length = int.from_bytes(f.read(8), "little")
        header = f.read(header_length) if header_length < (100 << 20) else b""
        try:
            own = json.loads(header).get("__metadata__", {}).get("sshs_model_hash")
        except (ValueError, AttributeError):
            own = None
        if isinstance(own, str) and own:
            return own
        f.seek(8 + header_length)
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    return sha.hexdigest()


def lora_hash(path: str | Path) -> str:
    """A LoRA's hash as A1111 writes it in `Lora hashes` (and Civitai matches): 12 hex digits of the
    addnet hash for a safetensors file, of the whole file's SHA-256 for any other."""
    st = Path(path).stat()
    if str(path).endswith(".safetensors"):
        return _addnet_hash(str(path), st.st_size, st.st_mtime)[:12]
    return _hash(str(path), st.st_size, st.st_mtime)[:12]


def short_hash(path: str | Path) -> str:
    """A1111's/Civitai's AutoV2 hash of a file: SHA-256, first 10 hex digits (cached per file version)."""
    st = Path(path).stat()
    return _hash(str(path), st.st_size, st.st_mtime)[:10]


def embedding_hash(path: str | Path) -> str:
    """A textual-inversion embedding's hash as A1111 writes it in `TI hashes`: the file's SHA-256,
    first 12 hex digits."""
    st = Path(path).stat()
    return _hash(str(path), st.st_size, st.st_mtime)[:12]


def model_weights_file(source: str | Path) -> Path | None:
    """The file whose hash names a model: the checkpoint itself, or a diffusers folder's denoiser weights."""
    path = Path(source)
    if path.is_file():
        return path
    for part in ("unet", "transformer"):
        weights = path / part / "diffusion_pytorch_model.safetensors"
        if weights.is_file():
            return weights
    return None


def model_hash(source: str | Path) -> str | None:
    """A1111's short hash of a model (checkpoint or denoiser weights); None when no such file exists
    (a Hub id not in a local folder)."""
    weights = model_weights_file(source)
    return short_hash(weights) if weights else None


def result_hashes(source: str | Path, lora_files: Mapping[str, Any], loras: Mapping[str, float]) -> dict[str, Any]:
    """`model_hash`, and `lora_hashes` of the LoRAs used that have a file, for a result's metadata."""
    out: dict[str, Any] = {"model_hash": model_hash(source)}
    if loras:
        out["lora_hashes"] = {n: lora_hash(lora_files[n]) for n in loras if n in lora_files}
    return out
