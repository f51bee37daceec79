"""Images arriving over HTTP (base64 strings, data URLs, multipart files), checked before decoding.

The header is read first (size only), so a small file that would decode to a huge bitmap (an image
bomb) is refused by MAX_UPLOAD_PIXELS before any pixel is allocated; MAX_FILE_SIZE caps the bytes.
Every refusal is a `WireError` at the field's place in the body (`image`, `mask`, `init_images[1]`).
"""

from __future__ import annotations

import base64
import binascii
import io
import re

from PIL import Image

from .errors import WireError

_DATA_URL = re.compile(r"^data:image/[\w.+-]+;base64,", re.IGNORECASE)


def from_base64(value: object, loc: tuple[str | int, ...], max_bytes: int) -> bytes:
    """The bytes of a base64 string (plain or a data URL), or WireError at `loc`."""
    if not isinstance(value, str) or not value.strip():
        raise WireError(loc, f"expected a base64-encoded image, got {type(value).__name__}")
    text = "".join(_DATA_URL.sub("", value.strip(), count=1).split())  # line-wrapped base64 is common
    if len(text) * 3 // 4 > max_bytes:
        raise WireError(loc, f"more than the upload limit of {max_bytes} bytes (MAX_FILE_SIZE)")
    try:
        return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise WireError(loc, "not valid base64") from None


def header_size(data: bytes, loc: tuple[str | int, ...], max_pixels: int) -> tuple[int, int]:
    """(width, height) from the header only, refused over MAX_UPLOAD_PIXELS. Pillow refuses a header
    of more than twice its MAX_IMAGE_PIXELS outright (DecompressionBombError) before our check could
    name the limit: that is answered as what it is, too many pixels."""
    try:
        with Image.open(io.BytesIO(data)) as im:
            width, height = im.size
    except Image.DecompressionBombError as exc:
        found = re.search(r"\((\d+) pixels\)", str(exc))
        count = f"{found.group(1)} pixels" if found else "more pixels"
        raise WireError(loc, f"{count}, more than the limit of {max_pixels} (MAX_UPLOAD_PIXELS)") from None
    except (OSError, ValueError, SyntaxError):
        raise WireError(loc, "not an image this server can read") from None
    if width * height > max_pixels:
        raise WireError(
            loc, f"{width}x{height} = {width * height} pixels, more than the limit of {max_pixels} (MAX_UPLOAD_PIXELS)"
        )
    return width, height


def open_bytes(
    data: bytes, loc: tuple[str | int, ...], max_pixels: int, max_bytes: int, mode: str | None = "RGB"
) -> Image.Image:
    """Decode an image from bytes after its header passed the byte and pixel limits."""
    if len(data) > max_bytes:
        raise WireError(loc, f"{len(data)} bytes, more than the upload limit of {max_bytes} (MAX_FILE_SIZE)")
    header_size(data, loc, max_pixels)
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return im.convert(mode) if mode else im.copy()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        raise WireError(loc, "the image is damaged") from None
