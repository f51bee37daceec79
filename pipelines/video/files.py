"""Clips as files: H.264 MP4 (PyAV), animated WebP and GIF (Pillow), PNG frames in a zip; and back.

`write_video` picks the format from the file's suffix (`SUFFIXES`) and writes atomically (a hidden
`*.part` file beside the target, then a rename: a crash never leaves half a clip under its name).
Each format keeps the clip's A1111-style `parameters` and our `metadata` where it has room:

| format | parameters | metadata (key -> text) |
|---|---|---|
| MP4 | the `comment` tag | a tag per key (movflags `use_metadata_tags`: QuickTime `mdta` keys) |
| WebP | EXIF UserComment (A1111's place) and XMP `da:parameters` | XMP, an element per key |
| GIF | its comment extension | not kept (GIF has one comment) |
| zip | a `parameters` text chunk in every PNG | a text chunk per key in every PNG |

With `use_metadata_tags` ffmpeg writes EVERY tag, `comment` included, as an `mdta` key rather than
iTunes' `©cmt` atom (without the flag the mp4 muxer drops keys it does not know); ffmpeg and PyAV
read both forms alike. WebP and GIF merge a frame identical to the one before it into that one
(its time added): a clip with still stretches reads back with fewer frames and the same duration.

`read_video` and `read_frames` also read the MP4/MOV/WebM/MKV clips other tools write (PyAV).
"""

from __future__ import annotations

import html
import io
import itertools
import json
import math
import os
import re
import secrets
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from PIL import Image, ImageSequence, PngImagePlugin

FORMATS = ("mp4", "webp", "gif", "png")  # what a user can ask for; "png" is PNG frames in a .zip
SUFFIXES = {"mp4": ".mp4", "webp": ".webp", "gif": ".gif", "png": ".zip"}  # format -> file suffix
TEMP_SUFFIX = ".part"  # files being written (as pipelines.pnginfo.write's): never read or listed as outputs
PARAMETERS = "parameters"
MAX_FPS_DENOMINATOR = 1001  # fps as a fraction p/q with q <= 1001: 23.976... -> 24000/1001 exactly
MP4_OPTIONS = {"movflags": "+faststart+use_metadata_tags"}  # moov first (plays while loading); our tags kept
X264_OPTIONS = {"crf": "18", "preset": "medium"}  # visually lossless for generated frames
WEBP_QUALITY = 90
GIF_MIN_DELAY_CS = 2  # browsers play a GIF delay under 20 ms as 100 ms: GIF above 50 fps plays at 50
USER_COMMENT, EXIF_IFD = 0x9286, 0x8769
XMP_NS = "urn:diffusion-anywhere:video:1.0"
# Colour: BT.601 (SMPTE 170M) matrix, TV range, tagged so, with BT.709 (= sRGB's) primaries and transfer.
# Chromium guesses an untagged clip's matrix from its height (BT.709 from 720 lines): ffmpeg's untagged
# BT.601 then shows green as (0, 216, 2) in a 1280x720 clip; and Debian's chromium 156 (software
# compositing) shows BT.709-matrix clips a little off (blue 243, green's blue 11); SMPTE 170M reads exact.
MATRIX, PRIMARIES, TRANSFER, TV_RANGE = 6, 1, 1, 1  # AVCOL_SPC_SMPTE170M, AVCOL_PRI_BT709, AVCOL_TRC_BT709, AVCOL_RANGE_MPEG
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,78}")  # a metadata key: an XML name, a PNG keyword, an mdta key
_RESERVED = {"parameters", "comment"}
_FRAME_NAME = re.compile(r"frame_\d{5,}\.png")
_CONTAINER_TAGS = {"major_brand", "minor_version", "compatible_brands", "encoder", "comment"}  # not ours
_IMAGE_BRANDS = {b"avif", b"avis", b"heic", b"heix", b"heim", b"heis", b"hevc", b"hevx", b"mif1", b"msf1"}


@dataclass(frozen=True)
class VideoInfo:
    """What a clip file holds. `fps` and `duration` are 0 where the file has no timing (a one-frame
    WebP is a still picture); `width`/`height` are the stored size (an MP4's padded to even)."""

    frames: int
    fps: float
    duration: float
    width: int
    height: int
    parameters: str
    metadata: dict[str, str]
    format: str


def format_of(path: str | Path) -> str:
    """The format (one of FORMATS) a file name asks for, by its suffix; ValueError for any other."""
    suffix = Path(path).suffix.lower()
    for name, known in SUFFIXES.items():
        if suffix == known:
            return name
    raise ValueError(
        f"unknown video suffix {suffix or '(none)'!r} in {Path(path).name!r}: use one of {', '.join(SUFFIXES.values())}"
    )


def write_video(
    frames: list[Image.Image], fps: float, path: str | Path, parameters: str = "", metadata: dict[str, str] | None = None
) -> Path:
    """Write `frames` as a clip at `fps` to `path` (format by suffix: .mp4 .webp .gif .zip); returns the path.

    MP4: H.264 (libx264, CRF 18), yuv420p with its BT.601 matrix tagged (`MATRIX`), moov atom first
    (a browser starts playing before the file is loaded), time base 1/fps exactly (`MAX_FPS_DENOMINATOR`) so the duration is
    len(frames)/fps. H.264 in yuv420p needs even sizes: an odd width or height is padded by one
    pixel, a copy of the last column or row. WebP (lossy, quality 90) and GIF loop forever, each
    frame's delay 1000/fps ms rounded so the delays add up to len(frames)/fps (GIF counts in 10 ms,
    at least 20). The zip holds frame_00000.png... and the fps in its comment.
    ValueError for no frames, frames of different sizes, fps <= 0, a bad metadata key, an unknown suffix.
    """
    path = Path(path)
    kind = format_of(path)
    metadata = dict(metadata or {})
    _check(frames, fps, parameters, metadata)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    try:
        _WRITERS[kind](frames, fps, temp, parameters, metadata)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


def _check(frames: list[Image.Image], fps: float, parameters: str, metadata: dict[str, str]) -> None:
    if not frames:
        raise ValueError("no frames to write: a clip needs at least one frame")
    if isinstance(fps, bool) or not isinstance(fps, int | float | Fraction) or not math.isfinite(fps) or fps <= 0:
        raise ValueError(f"fps must be a positive number of frames per second, not {fps!r}")
    if Fraction(fps).limit_denominator(MAX_FPS_DENOMINATOR) == 0:
        raise ValueError(f"fps {fps!r} is too slow: at least 1/{MAX_FPS_DENOMINATOR} frame per second")
    size = frames[0].size
    other = next((i for i, frame in enumerate(frames) if frame.size != size), None)
    if other is not None:
        (w, h), (ow, oh) = size, frames[other].size
        raise ValueError(f"frames differ in size: frame 0 is {w}x{h}, frame {other} is {ow}x{oh}; a clip's frames share one size")
    if not isinstance(parameters, str):
        raise ValueError(f"parameters must be text, not {type(parameters).__name__}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not _KEY.fullmatch(key) or key.lower() in _RESERVED:
            raise ValueError(
                f"metadata key {key!r} is not usable: letters, digits, _ . - (not first), at most 79, not {sorted(_RESERVED)}"
            )
        if not isinstance(value, str):
            raise ValueError(f"metadata {key!r} must be text (json.dumps it), not {type(value).__name__}")


def _even(image: Image.Image) -> Image.Image:
    """`image` with an odd width or height padded by one pixel: a copy of its last column or row."""
    w, h = image.size
    if w % 2 == 0 and h % 2 == 0:
        return image
    out = Image.new(image.mode, (w + w % 2, h + h % 2))
    out.paste(image, (0, 0))
    if w % 2:
        out.paste(image.crop((w - 1, 0, w, h)), (w, 0))
    if h % 2:
        out.paste(out.crop((0, h - 1, out.width, h)), (0, h))
    return out


def _write_mp4(frames: list[Image.Image], fps: float, path: Path, parameters: str, metadata: dict[str, str]) -> None:
    import av

    rate = Fraction(fps).limit_denominator(MAX_FPS_DENOMINATOR)
    width, height = (n + n % 2 for n in frames[0].size)
    # the movie's clock (its edit list: where the B-frame delay is cut) ticks as the track's (1/fps's
    # numerator doubled up to 10000, as the muxer picks it), not in ms: the duration is frames/fps exactly
    timescale = rate.numerator
    while timescale < 10000:
        timescale *= 2
    options = {**MP4_OPTIONS, "movie_timescale": str(timescale)}
    with av.open(str(path), "w", format="mp4", options=options) as container:
        for key, value in {"comment": parameters, **metadata}.items():
            if value:
                container.metadata[key] = value
        stream = container.add_stream("libx264", rate=rate, options=X264_OPTIONS)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        codec = stream.codec_context
        codec.time_base = 1 / rate
        codec.colorspace, codec.color_primaries, codec.color_trc, codec.color_range = MATRIX, PRIMARIES, TRANSFER, TV_RANGE
        for index, image in enumerate(frames):
            frame = av.VideoFrame.from_image(_even(image.convert("RGB")))
            frame = frame.reformat(format="yuv420p", dst_colorspace="ITU601", dst_color_range="MPEG")
            frame.pts, frame.time_base = index, codec.time_base
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def _delays(fps: float, count: int, unit_ms: int, least: int) -> list[int]:
    """Each frame's delay in ms, in whole `unit_ms` (at least `least` units), rounded so they add up to
    count/fps as near as the unit allows (8 fps in GIF's 10 ms: 120, 130, 120, ...)."""
    ticks = [round(i * 1000 / unit_ms / fps) for i in range(count + 1)]
    return [max(least, b - a) * unit_ms for a, b in itertools.pairwise(ticks)]


def _rgb_or_rgba(image: Image.Image) -> Image.Image:
    return image if image.mode in ("RGB", "RGBA") else image.convert("RGBA" if "A" in image.getbands() else "RGB")


def _write_webp(frames: list[Image.Image], fps: float, path: Path, parameters: str, metadata: dict[str, str]) -> None:
    images = [_rgb_or_rgba(frame) for frame in frames]
    images[0].save(
        path, format="WEBP", save_all=True, append_images=images[1:], duration=_delays(fps, len(images), 1, 1),
        loop=0, quality=WEBP_QUALITY, exif=_exif(parameters), xmp=_xmp({PARAMETERS: parameters, **metadata}),
    )  # fmt: skip


def _write_gif(frames: list[Image.Image], fps: float, path: Path, parameters: str, metadata: dict[str, str]) -> None:
    images = [frame.convert("RGB") for frame in frames]
    extra = {"comment": parameters.encode("utf-8")} if parameters else {}
    images[0].save(
        path, format="GIF", save_all=True, append_images=images[1:],
        duration=_delays(fps, len(images), 10, GIF_MIN_DELAY_CS), loop=0, **extra,
    )  # fmt: skip


def _write_zip(frames: list[Image.Image], fps: float, path: Path, parameters: str, metadata: dict[str, str]) -> None:
    text = PngImagePlugin.PngInfo()
    for key, value in {PARAMETERS: parameters, **metadata}.items():
        if value:
            text.add_text(key, value)  # tEXt, or iTXt for text beyond Latin-1
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:  # PNG is compressed already
        archive.comment = json.dumps({"fps": float(fps), "frames": len(frames)}).encode()
        for index, image in enumerate(frames):
            buffer = io.BytesIO()
            image.save(buffer, format="PNG", pnginfo=text)
            archive.writestr(f"frame_{index:05d}.png", buffer.getvalue())


_WRITERS: dict[str, Callable[[list[Image.Image], float, Path, str, dict[str, str]], None]] = {
    "mp4": _write_mp4, "webp": _write_webp, "gif": _write_gif, "png": _write_zip,
}  # fmt: skip


def _exif(parameters: str) -> bytes:
    """EXIF with `parameters` as its UserComment, as A1111 writes it (UNICODE, UTF-16 big-endian)."""
    if not parameters:
        return b""
    exif = Image.Exif()
    exif.get_ifd(EXIF_IFD)[USER_COMMENT] = b"UNICODE\x00" + parameters.encode("utf-16-be")
    return exif.tobytes()


def _xmp(fields: dict[str, str]) -> bytes:
    """An XMP packet with an element per field (`da:parameters`, `da:<key>`)."""
    body = "".join(f"<da:{key}>{html.escape(value, quote=False)}</da:{key}>" for key, value in fields.items() if value)
    if not body:
        return b""
    return (
        '<?xpacket begin="\ufeff" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/">'
        '<rdf:RDF xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#">'
        f'<rdf:Description rdf:about="" xmlns:da="{XMP_NS}">{body}</rdf:Description>'
        '</rdf:RDF></x:xmpmeta><?xpacket end="w"?>'
    ).encode()


def _xmp_fields(xmp: bytes | str) -> dict[str, str]:
    text = xmp.decode("utf-8", errors="replace") if isinstance(xmp, bytes) else xmp
    found = re.finditer(r"<da:([A-Za-z_][\w.-]*)>(.*?)</da:\1>", text, re.S)
    return {match.group(1): html.unescape(match.group(2)) for match in found}


def _user_comment(raw: bytes | str | None) -> str:
    if raw is None or isinstance(raw, str):
        return (raw or "").strip("\x00")
    code, body = raw[:8], raw[8:]
    if code == b"UNICODE\x00":
        return body.decode("utf-16" if body[:2] in (b"\xfe\xff", b"\xff\xfe") else "utf-16-be", errors="replace")
    return (body if code in (b"ASCII\x00\x00\x00", b"\x00" * 8) else raw).decode("utf-8", errors="replace").strip("\x00")


def _sniff(path: str | Path) -> str | None:
    """The clip format of a file by its first bytes: FORMATS' names, or "mov", "webm", "mkv"; None for
    anything else (a HEIF/AVIF picture, a zip that is not our PNG frames). OSError if unreadable."""
    with open(path, "rb") as f:
        head = f.read(64)
    if head[4:8] == b"ftyp":
        brand = head[8:12]
        return None if brand in _IMAGE_BRANDS else "mov" if brand == b"qt  " else "mp4"
    if head.startswith(b"\x1a\x45\xdf\xa3"):  # EBML: Matroska, or WebM by its doctype
        return "webm" if b"webm" in head else "mkv"
    if head.startswith(b"RIFF") and head[8:12] == b"WEBP":
        return "webp"
    if head[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    if head.startswith(b"PK\x03\x04"):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except zipfile.BadZipFile:
            return None
        return "png" if names and all(_FRAME_NAME.fullmatch(name) for name in names) else None
    return None


def is_video(path: str | Path) -> bool:
    """Whether `path` is a clip, by its content (never its name): MP4, MOV, WebM or MKV; an animated
    WebP or GIF (a one-frame one is a picture); a zip of frame_NNNNN.png (what write_video writes)."""
    try:
        kind = _sniff(path)
        if kind in ("webp", "gif"):
            with Image.open(path) as image:
                return bool(getattr(image, "is_animated", False))
    except (OSError, ValueError, SyntaxError):  # unreadable, a directory, a picture Pillow refuses
        return False
    return kind is not None


def read_video(path: str | Path) -> VideoInfo:
    """What the clip at `path` holds; its frames are decoded and counted (never the container's
    estimate). ValueError for a file that is not a clip."""
    kind = _sniff(path)
    if kind in ("webp", "gif"):
        return _read_animated(path, kind)
    if kind == "png":
        return _read_zip(path)
    if kind is None:
        raise ValueError(f"{Path(path).name!r} is not a video file (MP4, MOV, WebM, MKV, WebP, GIF, a zip of PNG frames)")
    return _read_av(path, kind)


def _read_av(path: str | Path, kind: str) -> VideoInfo:
    import av

    with av.open(str(path)) as container:
        if not container.streams.video:
            raise ValueError(f"{Path(path).name!r} has no video stream")
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        count = sum(1 for _ in container.decode(stream))
        rate = stream.average_rate or stream.guessed_rate
        fps = float(rate) if rate else 0.0
        if stream.duration and stream.time_base:
            duration = float(stream.duration * stream.time_base)
        elif container.duration:
            duration = container.duration / av.time_base
        else:
            duration = count / fps if fps else 0.0
        tags = {key.lower(): value for key, value in container.metadata.items()}
        width, height = stream.codec_context.width, stream.codec_context.height
    metadata = {key: value for key, value in tags.items() if key not in _CONTAINER_TAGS}
    return VideoInfo(count, fps, duration, width, height, tags.get("comment", ""), metadata, kind)


def _read_animated(path: str | Path, kind: str) -> VideoInfo:
    with Image.open(path) as image:
        info = dict(image.info)
        width, height = image.size
        user_comment = image.getexif().get_ifd(EXIF_IFD).get(USER_COMMENT) if kind == "webp" else None
        delays = []
        for frame in ImageSequence.Iterator(image):
            frame.load()  # a WebP frame's duration is known once it is decoded
            delays.append(frame.info.get("duration") or 0)
    fields = _xmp_fields(info["xmp"]) if info.get("xmp") else {}
    comment = info.get("comment", b"")
    parameters = fields.pop(PARAMETERS, "")
    if kind == "webp":
        parameters = _user_comment(user_comment) or parameters
    else:
        parameters = comment.decode("utf-8", errors="replace") if isinstance(comment, bytes) else str(comment)
    duration = sum(delays) / 1000 if len(delays) > 1 else 0.0
    fps = len(delays) / duration if duration else 0.0
    return VideoInfo(len(delays), fps, duration, width, height, parameters, fields, kind)


def _frame_names(archive: zipfile.ZipFile) -> list[str]:
    return sorted(name for name in archive.namelist() if _FRAME_NAME.fullmatch(name))


def _read_zip(path: str | Path) -> VideoInfo:
    with zipfile.ZipFile(path) as archive:
        names = _frame_names(archive)
        with Image.open(io.BytesIO(archive.read(names[0]))) as first:
            first.load()
            text = dict(getattr(first, "text", {}))
            width, height = first.size
        try:
            fps = float(json.loads(archive.comment or b"{}").get("fps", 0.0))
        except (ValueError, AttributeError, TypeError):
            fps = 0.0
    parameters = text.pop(PARAMETERS, "")
    return VideoInfo(len(names), fps, len(names) / fps if fps else 0.0, width, height, parameters, text, "png")


def read_frames(path: str | Path) -> list[Image.Image]:
    """Every frame of the clip at `path`, as RGB pictures. ValueError for a file that is not a clip."""
    kind = _sniff(path)
    if kind is None:
        raise ValueError(f"{Path(path).name!r} is not a video file (MP4, MOV, WebM, MKV, WebP, GIF, a zip of PNG frames)")
    if kind in ("webp", "gif"):
        with Image.open(path) as image:
            return [frame.convert("RGB") for frame in ImageSequence.Iterator(image)]
    if kind == "png":
        with zipfile.ZipFile(path) as archive:
            return [Image.open(io.BytesIO(archive.read(name))).convert("RGB") for name in _frame_names(archive)]
    import av

    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        stream.thread_type = "AUTO"
        # the frame's own range (a full-range clip is not read as TV range); its matrix is its own by default
        return [frame.to_image(src_color_range=frame.color_range or None) for frame in container.decode(stream)]
