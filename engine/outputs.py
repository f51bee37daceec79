"""Where results are written: OUTPUT_DIR, bounded by size and age, never losing an image.

- Names are unique and unguessable (`save_images`: a random request id per request), writes are
  atomic (temp file + rename), so two requests never overwrite each other and a kill leaves no
  truncated PNG.
- OUTPUT_DIR is NOT served by the web server: the app hands Gradio each result, and Gradio serves
  its own copy under a content-hash folder, only to the caller it returned it to.
- When OUTPUT_DIR cannot be written (full disk, permissions), the images still reach the user from
  a private temporary folder, with a warning that names no server path.
- Retention: after each save the oldest PNGs are deleted while the folder is over OUTPUT_MAX_GB or
  older than OUTPUT_MAX_DAYS. Files being written (`*.part`) are never touched.
"""

from __future__ import annotations

import logging
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from PIL import Image

from pipelines import TEMP_SUFFIX, GenerationResult, save_clip, save_pngs

log = logging.getLogger(__name__)
SAVED_SUFFIXES = (".png", ".mp4", ".webp", ".gif", ".zip")  # pictures, and clips beside their poster PNGs (save_clips)
CLIP_SUFFIXES = SAVED_SUFFIXES[1:]
NAME_PREFIX = "%H%M%S"  # a saved PNG's name starts with the time of day (`save_pngs` adds the rest)


def day_folder(root: Path) -> Path:
    """Today's folder under `root`: outputs are kept a folder per day."""
    return root / time.strftime("%Y-%m-%d")


@dataclass
class SavedImages:
    paths: list[str]
    warning: str | None = None  # set when OUTPUT_DIR could not be written


@dataclass
class OutputStore:
    """Saves results under `root/<date>/` and keeps the folder within its limits."""

    root: Path
    max_bytes: int  # 0: no size limit
    max_age_seconds: float  # 0: no age limit
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _fallback: Path | None = None

    @classmethod
    def from_settings(cls, root: Path, max_gb: float, max_days: float) -> OutputStore:
        return cls(root=Path(root), max_bytes=int(max_gb * 2**30), max_age_seconds=max_days * 86400)

    def folder(self, owner: str | None) -> Path:
        """Where a user's outputs live: `users/<name>/` with sign-in, the root without."""
        return self.root / "users" / owner if owner else self.root

    def save(self, result: GenerationResult, owner: str | None = None, extra: dict[str, str] | None = None) -> SavedImages:
        """Write the result's PNGs (with `extra` text chunks besides our metadata); on an OS error write
        them to a private temp folder instead."""
        folder, prefix = self._today(owner), time.strftime(NAME_PREFIX)
        try:
            paths = save_pngs(result.images, result.metadata, folder, prefix=prefix, extra=extra)
        except OSError as exc:
            log.error("cannot write to OUTPUT_DIR (%s): %s", folder, exc)
            paths = save_pngs(result.images, result.metadata, self._fallback_dir(), prefix=prefix, extra=extra)
            reason = exc.strerror or type(exc).__name__
            return SavedImages(
                [str(p) for p in paths],
                f"the images were not saved on the server ({reason}); download them now",
            )
        self.prune()
        return SavedImages([str(p) for p in paths])

    def save_clips(self, result: GenerationResult, posters: list[str], fmt: str = "mp4") -> list[str]:
        """Each clip of a video result beside its poster PNG (same name, `fmt`'s suffix: mp4 | webp | gif | png, a zip),
        with the poster's parameters inside (A1111's infotext, our JSON: PNG info reads them back)."""
        suffix = ".zip" if fmt == "png" else "." + fmt  # PNG frames go in a zip beside the poster PNG
        return [
            str(save_clip(clip, result.fps, meta, Path(poster).with_suffix(suffix)))
            for clip, meta, poster in zip(result.clips, result.metadata, posters, strict=True)
        ]

    def save_pictures(
        self, images: list[Image.Image], metadata: list[dict[str, Any]], owner: str | None, extra: dict[str, str]
    ) -> list[Path]:
        """Write pictures with their metadata into the owner's folder (History lists them); OSError
        propagates (the HTTP caller is told, as ComfyUI tells it)."""
        paths = save_pngs(images, metadata, self._today(owner), time.strftime(NAME_PREFIX), extra)
        self.prune()
        return paths

    def _today(self, owner: str | None) -> Path:
        """Where a save goes: the owner's folder, a folder per day (`history` reads `*/*.png` of it)."""
        return day_folder(self.folder(owner))

    def _fallback_dir(self) -> Path:
        if self._fallback is None:
            self._fallback = Path(tempfile.mkdtemp(prefix="diffusion-anywhere-unsaved-"))
        return self._fallback

    def history(self, owner: str | None) -> list[Path]:
        """One user's finished PNGs (everyone's when sign-in is off), newest first."""
        folder = self.folder(owner)
        found = [p for p in folder.glob("*/*.png") if p.is_file() and not p.name.startswith(".")]
        return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)

    def files(self) -> list[Path]:
        """Finished PNGs and clips, oldest first (files being written are excluded)."""
        found = [
            p for p in self.root.rglob("*") if p.suffix.lower() in SAVED_SUFFIXES and p.is_file() and not p.name.endswith(TEMP_SUFFIX)
        ]  # fmt: skip
        return sorted(found, key=lambda p: p.stat().st_mtime)

    @staticmethod
    def clips_of(poster: str | Path) -> list[Path]:
        """The clip files saved beside a poster PNG (`save_clips`: same name, a clip's suffix)."""
        return [p for s in CLIP_SUFFIXES if (p := Path(poster).with_suffix(s)).is_file()]

    def usage(self) -> int:
        return sum(p.stat().st_size for p in self.files())

    def prune(self) -> list[Path]:
        """Delete the oldest PNGs until the folder is within OUTPUT_MAX_GB and OUTPUT_MAX_DAYS."""
        if not self.max_bytes and not self.max_age_seconds:
            return []
        removed: list[Path] = []
        with self._lock:
            files = [(p, p.stat()) for p in self.files()]
            total = sum(st.st_size for _, st in files)
            cutoff = time.time() - self.max_age_seconds if self.max_age_seconds else None
            for path, st in files:
                too_old = cutoff is not None and st.st_mtime < cutoff
                too_big = bool(self.max_bytes) and total > self.max_bytes
                if not (too_old or too_big):
                    break  # oldest first: everything after is newer and the folder fits
                path.unlink(missing_ok=True)
                total -= st.st_size
                removed.append(path)
        if removed:
            log.info("retention: removed %d old output file(s)", len(removed))
        return removed
