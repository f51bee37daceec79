"""Images arriving over HTTP (base64 strings, data URLs, multipart files), checked before decoding.

The header is read first (size only), so a small file that would decode to a huge bitmap (an image
bomb) is refused by MAX_UPLOAD_PIXELS before any pixel is allocated; MAX_FILE_SIZE caps the bytes.
Every refusal is an `InputError` naming the field (`images[0]`, `mask`, `init_images[1]`).
"""

from __future__ import annotations

import base64
import binascii
import io
import re

from PIL import Image

from ui.inputs import InputError

_DATA_URL = re.compile(r"^data:image/[\w.+-]+;base64,", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 1024, "mb": 1024**2, "gb": 1024**3}


def size_bytes(text: str) -> int:
    """MAX_FILE_SIZE ("10mb") in bytes."""
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(b|kb|mb|gb)", text.strip().lower())
    if not match:
        raise ValueError(f"not a size: {text!r}")
    return int(float(match.group(1)) * _UNITS[match.group(2)])


def from_base64(value: object, name: str, max_bytes: int) -> bytes:
    """The bytes of a base64 string (plain or a data URL), or InputError naming `name`."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"{name}: expected a base64-encoded image, got {type(value).__name__}")
    text = _DATA_URL.sub("", value.strip(), count=1)
    if len(text) * 3 // 4 > max_bytes:
        raise InputError(f"{name}: more than the upload limit of {max_bytes} bytes (MAX_FILE_SIZE)")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=False)
    except (binascii.Error, ValueError):
        raise InputError(f"{name}: not valid base64") from None


def open_bytes(data: bytes, name: str, max_pixels: int, max_bytes: int, mode: str | None = "RGB") -> Image.Image:
    """Decode an image from bytes after its header passed the byte and pixel limits."""
    if len(data) > max_bytes:
        raise InputError(f"{name}: {len(data)} bytes, more than the upload limit of {max_bytes} (MAX_FILE_SIZE)")
    try:
        with Image.open(io.BytesIO(data)) as im:  # the header only
            width, height = im.size
            if width * height > max_pixels:
                raise InputError(
                    f"{name}: {width}x{height} = {width * height} pixels, more than the limit of "
                    f"{max_pixels} (MAX_UPLOAD_PIXELS)"
                )
            im.load()
            return im.convert(mode) if mode else im.copy()
    except InputError:
        raise
    except Image.DecompressionBombError as exc:  # PIL refuses the header itself past ~179 Mpixels
        found = re.search(r"\((\d+) pixels\)", str(exc))
        pixels = f"{found.group(1)} pixels" if found else "more pixels than PIL opens"
        raise InputError(f"{name}: {pixels}, more than the limit of {max_pixels} (MAX_UPLOAD_PIXELS)") from None
    except (OSError, ValueError, SyntaxError):
        raise InputError(f"{name}: not an image this server can read") from None
