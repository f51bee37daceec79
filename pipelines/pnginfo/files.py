"""The text a picture carries, whatever wrote it: PNG text chunks, EXIF UserComment, XMP.

PNG chunks are walked here rather than through Pillow's decoder: the image data is never decoded
(a huge or truncated picture costs nothing), text chunks after the image data are read, and a file
cut short keeps the chunks before the cut. JPEG and WEBP carry generation parameters in EXIF
(UserComment, A1111's and Fooocus' place; ComfyUI's "prompt:" / "workflow:" in Make and Model) or XMP (`parameters`, `dc:description`), read with Pillow.

A1111's "stealth" PNG info (the stealth-pnginfo extension's; read by sd-parsers' eager mode, written
by NovelAI too) hides the parameters in the pixels' lowest bits, column by column (down the first
column, then the next): one bit a pixel in the alpha channel, or three (red, green, blue) in the RGB
variant. A 15-byte signature ("stealth_pnginfo" / "stealth_pngcomp" for alpha, "stealth_rgbinfo" /
"stealth_rgbcomp" for RGB), the data's length in bits (32 bits, big-endian), then UTF-8 text, gzipped
for the "comp" signatures: an A1111 infotext, or NovelAI's text chunks as JSON. Only a picture with
no chunk of parameters is decoded for it, up to STEALTH_MAX_PIXELS.

Every reader here returns what it could read and a list of notes; nothing raises past `read_text`
but OSError for a file that cannot be opened at all.
"""

from __future__ import annotations

import html
import io
import json
import re
import struct
import warnings
import zlib
from pathlib import Path
from typing import BinaryIO

import numpy as np

from pipelines.video.files import is_video, read_video

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MAX_CHUNK = 16 << 20  # a text chunk larger than this is skipped (no tool writes one; a hostile file might)
MAX_READ = 64 << 20  # bytes read from a file at most
USER_COMMENT, IMAGE_DESCRIPTION, SOFTWARE, MAKER_NOTE, EXIF_IFD = 0x9286, 0x010E, 0x0131, 0x927C, 0x8769
_XMP_TAGS = ("parameters", "UserComment", "description", "prompt", "workflow", "sd-metadata")


def read_text(path: str | Path | BinaryIO) -> tuple[dict[str, str], list[str]]:
    """({key: text}, notes) of an image file: PNG chunks by their keyword; JPEG/WEBP/other formats'
    EXIF UserComment as "UserComment" (also "parameters" when no other holds it), XMP fields by name."""
    if not hasattr(path, "read") and is_video(path):  # a clip: its container's tags (pipelines.video.files)
        clip = read_video(path)
        note = f"a {clip.format} clip: {clip.frames} frames at {clip.fps:g} fps, {clip.width}x{clip.height}"
        return {**clip.metadata, **({"parameters": clip.parameters} if clip.parameters else {})}, [note]
    if hasattr(path, "read"):  # an open binary file (an upload held in memory)
        data = path.read(MAX_READ)
    else:
        with open(path, "rb") as f:
            data = f.read(MAX_READ)
    text, notes = png_chunks(data) if data.startswith(PNG_SIGNATURE) else _other_format(path)
    if not any(key in text for key in HOLDS_PARAMETERS) and (data.startswith(PNG_SIGNATURE) or data[8:12] == b"WEBP"):
        _put(text, _stealth(data, notes))
    return text, notes


# chunks or tags the readers take parameters from, in the order a reader shows an unknown one raw (pipelines.pnginfo.read)
PARAMETER_KEYS = (
    "parameters", "prompt", "workflow", "invokeai_metadata", "sd-metadata", "Dream", "Comment",
    "parameters-json", "smproj", "UserComment",
)  # fmt: skip
# ... and TensorArt's: a picture with none of these is searched for stealth ones
HOLDS_PARAMETERS = (*PARAMETER_KEYS, "generation_data")


def _stealth(data: bytes, notes: list[str]) -> dict[str, str]:
    """A1111's stealth PNG info (`read_stealth`) as chunks: an infotext as `parameters`;
    NovelAI's JSON of its text chunks as those chunks."""
    found, said = read_stealth(data)
    notes.extend(said)
    if found is None:
        return {}
    if found.lstrip().startswith("{"):
        try:
            chunks = json.loads(found)
        except (ValueError, RecursionError):
            chunks = None
        if isinstance(chunks, dict) and isinstance(chunks.get("Comment"), str):
            return {str(k): v if isinstance(v, str) else json.dumps(v) for k, v in chunks.items()}
    return {"parameters": found}


def png_chunks(data: bytes) -> tuple[dict[str, str], list[str]]:
    """The tEXt, zTXt and iTXt chunks of a PNG (and its eXIf), from the bytes of the file."""
    text: dict[str, str] = {}
    notes: list[str] = []
    pos = len(PNG_SIGNATURE)
    while pos + 8 <= len(data):
        length, kind = struct.unpack(">I4s", data[pos : pos + 8])
        body = data[pos + 8 : pos + 8 + length]
        if len(body) < length:
            notes.append(f"the file is cut short inside a {kind.decode('latin-1')} chunk; read what came before")
            break
        pos += 12 + length
        if kind == b"IEND":
            break
        if kind not in (b"tEXt", b"zTXt", b"iTXt", b"eXIf"):
            continue
        if length > MAX_CHUNK:
            notes.append(f"a {length:,}-byte {kind.decode()} chunk was skipped (more than {MAX_CHUNK:,})")
            continue
        try:
            if kind == b"eXIf":
                _put(text, exif_text(b"Exif\x00\x00" + body))
            else:
                key, value = _text_chunk(kind, body)
                text.setdefault(key, value)
        except (ValueError, zlib.error, UnicodeError, struct.error, SyntaxError, OSError) as exc:
            notes.append(f"an unreadable {kind.decode()} chunk was skipped ({exc})")
    else:
        notes.append("the file ends before its IEND chunk")
    if "XML:com.adobe.xmp" in text:
        _put(text, xmp_text(text["XML:com.adobe.xmp"]))
    return text, notes


def _text_chunk(kind: bytes, body: bytes) -> tuple[str, str]:
    """(keyword, text) of one tEXt / zTXt / iTXt chunk. tEXt is Latin-1 by the PNG spec; a tEXt that
    is valid UTF-8 (some tools write it so) is read as UTF-8."""
    key, _, rest = body.partition(b"\x00")
    keyword = key.decode("latin-1")
    if kind == b"tEXt":
        return keyword, _decode(rest)
    if kind == b"zTXt":
        return keyword, _decode(_inflate(rest[1:]))
    compressed, rest = rest[:1] == b"\x01", rest[2:]  # iTXt: flag, method, language\0, translated\0, text
    _, _, rest = rest.partition(b"\x00")
    _, _, rest = rest.partition(b"\x00")
    return keyword, (_inflate(rest) if compressed else rest).decode("utf-8", errors="replace")


def _inflate(data: bytes) -> bytes:
    """zlib data inflated to at most MAX_CHUNK bytes (a small chunk can inflate to gigabytes)."""
    out = zlib.decompressobj().decompress(data, MAX_CHUNK)
    if len(out) >= MAX_CHUNK:
        raise ValueError(f"it inflates past {MAX_CHUNK:,} bytes")
    return out


def _decode(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _put(text: dict[str, str], found: dict[str, str]) -> None:
    for key, value in found.items():
        text.setdefault(key, value)


def user_comment(raw: bytes | str) -> str:
    """EXIF UserComment text: an 8-byte character code ("UNICODE\\0": UTF-16, big- or little-endian as
    written; "ASCII\\0\\0\\0"; 8 NULs: undefined) then the text. A1111 writes UTF-16 BE (piexif)."""
    if isinstance(raw, str):
        return raw.strip("\x00")
    code, body = raw[:8], raw[8:]
    if code == b"UNICODE\x00":
        if body[:2] in (b"\xfe\xff", b"\xff\xfe"):
            return body.decode("utf-16").strip("\x00")
        even_zeros = body[0::2].count(0)
        odd_zeros = body[1::2].count(0)
        return body.decode("utf-16-be" if even_zeros >= odd_zeros else "utf-16-le", errors="replace").strip("\x00")
    if code in (b"ASCII\x00\x00\x00", b"\x00" * 8, b"JIS\x00\x00\x00\x00\x00"):
        return _decode(body).strip("\x00")
    return _decode(raw).strip("\x00")


def exif_text(exif_bytes: bytes) -> dict[str, str]:
    """UserComment, ImageDescription, Software and MakerNote (Fooocus: its metadata scheme) of EXIF bytes."""
    from PIL import Image

    exif = Image.Exif()
    with warnings.catch_warnings():  # "Corrupt EXIF data": what can be read is read
        warnings.simplefilter("ignore")
        exif.load(exif_bytes)
        sub = exif.get_ifd(EXIF_IFD)
    out = {}
    for tag, name, ifd in (
        (USER_COMMENT, "UserComment", sub),
        (MAKER_NOTE, "MakerNote", sub),
        (IMAGE_DESCRIPTION, "ImageDescription", exif),
        (SOFTWARE, "Software", exif),
    ):
        value = ifd.get(tag) or (exif.get(tag) if tag == USER_COMMENT else None)  # SaveImagePlus: in IFD0
        if value:
            text = user_comment(value) if tag == USER_COMMENT else _as_text(value)
            if text.strip():
                out[name] = text
    for value in exif.values():  # ComfyUI's WEBP: Make "workflow:{...}", Model "prompt:{...}"
        head, sep, rest = _as_text(value).partition(":") if isinstance(value, str | bytes) else ("", "", "")
        if sep and head.lower() in ("prompt", "workflow") and rest.lstrip().startswith("{"):
            out.setdefault(head.lower(), rest)
    return out


def _as_text(value: object) -> str:
    return _decode(value).strip("\x00") if isinstance(value, bytes) else str(value)


def xmp_text(xmp: bytes | str) -> dict[str, str]:
    """Fields of an XMP packet by local name (`sd:parameters`, `exif:UserComment`, `dc:description`),
    as elements (an rdf:Alt's first rdf:li) or attributes. Read with patterns, not an XML parser: a
    packet is a few fields, and no entity in it is ever expanded."""
    text = (_as_text(xmp) if isinstance(xmp, bytes) else str(xmp))[:MAX_CHUNK]
    out = {}
    for name in _XMP_TAGS:
        opening = re.search(rf"<(\w+:)?{re.escape(name)}\b[^>]*>", text)
        # the first opening tag and the first closing one after it (never a search from every opening:
        # a packet of many unclosed tags would cost a scan each)
        closing = re.compile(rf"</(\w+:)?{re.escape(name)}>").search(text, opening.end()) if opening else None
        attribute = re.search(rf'\s(\w+:)?{re.escape(name)}="([^"]*)"', text)
        if opening and closing:
            inner = text[opening.end() : closing.start()]
            item = re.search(r"<rdf:li\b[^>]*>(.*?)</rdf:li>", inner, re.S)
            value = item.group(1) if item else re.sub(r"<[^>]+>", "", inner)
        elif attribute:
            value = attribute.group(2)
        else:
            continue
        if value.strip():
            out[name] = html.unescape(value).strip()
    return out


STEALTH_MAX_PIXELS = 36 << 20  # pixels decoded at most (a picture is decoded only to look for stealth metadata)
SIGNATURES = {
    b"stealth_pnginfo": ("alpha", False), b"stealth_pngcomp": ("alpha", True),
    b"stealth_rgbinfo": ("rgb", False), b"stealth_rgbcomp": ("rgb", True),
}  # fmt: skip
_HEADER_BITS = 15 * 8 + 32


def read_stealth(data: bytes) -> tuple[str | None, list[str]]:
    """(the hidden text or None, notes) of an image file's bytes (the module's docstring has the format)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            if image.width * image.height > STEALTH_MAX_PIXELS:
                return None, [f"a {image.width}x{image.height} picture is not searched for hidden (stealth) metadata"]
            if image.mode not in ("RGB", "RGBA"):
                image = image.convert("RGBA" if "A" in image.mode or "transparency" in image.info else "RGB")
            pixels = np.asarray(image)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        return None, [f"the picture could not be decoded to look for hidden (stealth) metadata ({exc})"]
    streams = [("rgb", pixels[:, :, :3])]
    if pixels.shape[2] == 4:
        streams.insert(0, ("alpha", pixels[:, :, 3:]))
    for kind, channel in streams:
        found = _stealth_text(kind, channel)
        if found is not None:
            return found
    return None, []


def _stealth_text(kind: str, channel: np.ndarray) -> tuple[str | None, list[str]] | None:
    """The text of one bit stream (`channel`: rows x columns x 1 or 3), or None when it carries no
    signature of its kind."""
    head = _lowest_bits(channel, _HEADER_BITS)
    signature = SIGNATURES.get(np.packbits(head[:120]).tobytes())
    if signature is None or signature[0] != kind or len(head) < _HEADER_BITS:
        return None
    length = int.from_bytes(np.packbits(head[120:152]).tobytes(), "big")
    if length > channel.size - _HEADER_BITS or length > MAX_CHUNK * 8:
        return None, [f"hidden (stealth) metadata claims {length:,} bits, more than the picture holds; not read"]
    raw = np.packbits(_lowest_bits(channel, _HEADER_BITS + length)[_HEADER_BITS:]).tobytes()
    notes = ["read from the picture's hidden (stealth) metadata"]
    if signature[1]:
        inflater = zlib.decompressobj(wbits=31)  # gzip
        try:
            raw = inflater.decompress(raw, MAX_CHUNK)
        except zlib.error as exc:
            return None, [f"hidden (stealth) metadata could not be inflated ({exc})"]
        if not inflater.eof:
            notes.append("the hidden (stealth) metadata ends early (or is over 16 MB); what came before was read")
    return raw.decode("utf-8", errors="replace"), notes


def _lowest_bits(channel: np.ndarray, count: int) -> np.ndarray:
    """The first `count` lowest bits of `channel`, pixel by pixel down each column, then the next
    column (RGB: r, g, b of each pixel in turn); only the columns that hold them are copied."""
    height, _, per_pixel = channel.shape
    columns = -(-count // (per_pixel * height))
    stream = channel[:, :columns].transpose(1, 0, 2).reshape(-1)[:count]
    return (stream & 1).astype(np.uint8)


def _other_format(path: str | Path) -> tuple[dict[str, str], list[str]]:
    """JPEG, WEBP and other formats Pillow opens: EXIF, XMP, and any text Pillow reads into `info`."""
    from PIL import Image

    text: dict[str, str] = {}
    notes: list[str] = []
    with Image.open(path) as image:
        info = dict(image.info)
        fmt = image.format or "image"
    for key, value in info.items():
        if isinstance(value, str) and key not in ("xmp", "exif"):
            text.setdefault(key, value)
    if isinstance(info.get("comment"), bytes):  # a JPEG COM segment
        text.setdefault("comment", _decode(info["comment"]))
    readers = (("exif", exif_text), ("xmp", xmp_text), ("XML:com.adobe.xmp", xmp_text))
    for key, reader in readers:
        if info.get(key):
            try:
                _put(text, reader(info[key]))
            except (ValueError, UnicodeError, struct.error, SyntaxError, OSError, KeyError, TypeError) as exc:
                notes.append(f"the {fmt} file's {key} could not be read ({exc})")
    for key in ("UserComment", "parameters", "description", "comment"):
        if key in text and (key != "comment" or "Steps: " in text[key]):
            text.setdefault("parameters", text[key])
            break
    return text, notes
