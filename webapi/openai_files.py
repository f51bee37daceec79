"""The images an OpenAI call answers with: encoded (png / jpeg / webp, with our metadata) and, for
`response_format="url"`, kept in memory behind an unguessable URL.

A URL is `<the request's base URL>/v1/images/files/<token>.<ext>`, the token 32 random bytes: like
OpenAI's signed URLs it is fetched without credentials and expires, here after CACHE_MINUTES.
Expired files are pruned on every store and fetch; the store also keeps at most `max_bytes`
(oldest dropped first), so a flood of url calls cannot fill the memory. Nothing is written to the
output folder.
"""

from __future__ import annotations

import io
import secrets
import threading
import time
from collections import OrderedDict
from typing import Any

from PIL import Image

from pipelines import a1111_parameters

from .running import png_bytes

MEDIA_TYPES = {"png": "image/png", "jpeg": "image/jpeg", "webp": "image/webp"}
_EXIF_IFD, _USER_COMMENT = 0x8769, 0x9286


def encode(image: Image.Image, meta: dict[str, Any] | None, fmt: str = "png", compression: int | None = None) -> bytes:
    """The image as `fmt`; the generation parameters as a PNG's text chunks (A1111's `parameters`
    and our JSON), or as EXIF UserComment in a jpeg / webp (where A1111 writes them)."""
    if fmt == "png":
        return png_bytes(image, meta)
    buffer = io.BytesIO()
    exif = Image.Exif()
    if meta:
        exif.get_ifd(_EXIF_IFD)[_USER_COMMENT] = b"UNICODE\0" + a1111_parameters(meta).encode("utf-16-be")
    quality = 90 if compression is None else max(1, 100 - compression)
    image.convert("RGB").save(buffer, format=fmt.upper(), quality=quality, exif=exif.tobytes())
    return buffer.getvalue()


class FileStore:
    """Encoded images by token, each kept `minutes` (CACHE_MINUTES), at most `max_bytes` in all."""

    def __init__(self, minutes: float, max_bytes: int = 512 * 2**20):
        self.seconds = minutes * 60
        self.max_bytes = max_bytes
        self._files: OrderedDict[str, tuple[float, str, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def put(self, data: bytes, fmt: str) -> str:
        """Store `data`; returns its file name (`<token>.<ext>`)."""
        name = f"{secrets.token_urlsafe(32)}.{fmt}"
        with self._lock:
            self._prune(time.monotonic())
            self._files[name] = (time.monotonic() + self.seconds, MEDIA_TYPES[fmt], data)
            total = sum(len(entry[2]) for entry in self._files.values())
            while total > self.max_bytes and len(self._files) > 1:
                _, (_, _, dropped) = self._files.popitem(last=False)
                total -= len(dropped)
        return name

    def get(self, name: str) -> tuple[str, bytes] | None:
        """(media type, bytes), or None when unknown or expired."""
        with self._lock:
            self._prune(time.monotonic())
            entry = self._files.get(name)
        return None if entry is None else (entry[1], entry[2])

    def _prune(self, now: float) -> None:
        for name in [n for n, (expires, _, _) in self._files.items() if expires <= now]:
            del self._files[name]

    def __len__(self) -> int:
        with self._lock:
            return len(self._files)
