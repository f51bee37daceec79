"""ComfyUI's video nodes: Wan's text-to-video and image-to-video graphs on our video model, and clips saved.

Registered in `registry.NODES` on import.

- Latents: EmptyHunyuanLatentVideo (Wan 2.1's text-to-video graph), EmptyMochiLatentVideo, EmptyLTXVLatentVideo,
  Wan22ImageToVideoLatent (Wan 2.2 TI2V's; its start image optional) and WanImageToVideo (Wan 2.1 I2V's: the
  conditionings pass through, the start image rides on the latent). Each is a video latent of `length` frames
  (`sampler.sample` makes it one video request), checked before anything runs against the video model
  (`registry.VideoLimits`): that one is served, its frame step and most frames, its size and batch, and that it
  has image-to-video (a start image) or text-to-video (none).
- Loaders: CLIPLoader (any `type`: the served model's own text encoder reads the prompt), CLIPVisionLoader and
  CLIPVisionEncode (Wan 2.1 I2V's image encoder: the video pipeline encodes the start image itself, where it has
  an encoder), ModelSamplingSD3 (taken, its shift not applied: a request has no shift, the model's schedule runs).
- Output: SaveAnimatedWEBP and SaveAnimatedPNG (ComfyUI's options, timing and metadata), CreateVideo + SaveVideo
  (H.264 MP4 by `pipelines.write_video`). History outputs are ComfyUI's: `{"images": [{filename, subfolder, type}],
  "animated": [true]}`. A clip a sampler made is saved beside a poster PNG (its first frame with our parameters:
  History lists it and plays the clip); every file carries our parameters and ComfyUI's `prompt` (and `workflow`).
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps, PngImagePlugin

from engine.outputs import day_folder
from pipelines import METADATA_KEY, TEMP_SUFFIX, a1111_parameters, png_info, write_video
from pipelines.schema.request import spec

from .nodes import served
from .registry import BATCH, LINKED, Catalog, In, VideoLimits, combo, from_schema, link, node
from .values import Clip, ClipVision, Conditioning, Latent, Model, Pictures, Video

NO_VIDEO = "no video model is served here: VIDEO_MODEL_ID names one (the embedded tiny-shapes-video is served beside the embedded image model)"
HIGH = spec("width").value.high
FPS_RANGE = spec("fps").value  # a request's frame rate (the parameters a clip carries)
FPS = In("FLOAT", 6.0, 0.01, 1000.0, 0.01)  # SaveAnimatedWEBP/PNG's
WEBP_METHODS = {"default": 4, "fastest": 0, "slowest": 6}
EXIF_MODEL, EXIF_MAKE, EXIF_IFD, USER_COMMENT = 0x0110, 0x010F, 0x8769, 0x9286
CLIP_TYPES = ("stable_diffusion", "stable_cascade", "sd3", "stable_audio", "mochi", "ltxv", "pixart", "cosmos", "lumina2",
              "wan", "hidream", "chroma", "ace", "omnigen2", "qwen_image", "hunyuan_image", "flux2", "ovis")  # fmt: skip


def size(default: int, step: int, low: int = 16) -> In:
    return In("INT", default, low, HIGH, step)


def frames(default: int, step: int) -> In:
    return from_schema("num_frames", "INT", default, step)  # 1 to the schema's most frames


# ------------------------------------------------------------------ checks before anything runs


def video_fits(start: str | None = None) -> Callable[[Catalog, dict[str, Any]], list[tuple[str, str]]]:
    """A video latent node's check against the video model: served at all, its frames, size, batch, and a start
    image where it needs one (image-to-video only) or can take none (no image-to-video)."""

    def check(c: Catalog, values: dict[str, Any]) -> list[tuple[str, str]]:
        v = c.video
        if v is None:
            return [("length", NO_VIDEO)]
        out = _frame_problems(v, values["length"]) + _size_problems(v, values["width"], values["height"], values["batch_size"])
        given = start is not None and values.get(start) == LINKED
        if given and not v.image_to_video:
            out.append((start, f"{v.name} has no image-to-video (a TI2V or I2V model has): leave start_image out"))
        if not given and not v.text_to_video:
            out.append((start or "length", f"{v.name} is image-to-video: give it a start_image (WanImageToVideo, Wan22ImageToVideoLatent)"))
        return out

    return check


def _frame_problems(v: VideoLimits, length: int) -> list[tuple[str, str]]:
    if length > 1 and (length - 1) % v.frame_step:
        low = (length - 1) // v.frame_step * v.frame_step + 1
        return [("length", f"{length} is not k x {v.frame_step} + 1 ({v.name} packs {v.frame_step} frames per latent frame): "
                           f"{low} or {low + v.frame_step}")]  # fmt: skip
    if length > v.max_frames:
        return [("length", f"{length} frames are more than {v.name}'s {v.max_frames}")]
    return []


def _size_problems(v: VideoLimits, width: int, height: int, batch: int) -> list[tuple[str, str]]:
    out = [(k, f"larger than {v.name}'s largest side, {v.max_side}") for k, n in (("width", width), ("height", height)) if n > v.max_side]
    if width * height > v.max_pixels:
        out.append(("width", f"{width}x{height} is more than {v.name}'s {v.max_pixels} pixels"))
    if batch > v.max_batch:
        out.append(("batch_size", f"more than {v.name}'s {v.max_batch} clips at once (MAX_BATCH)"))
    return out


# ------------------------------------------------------------------ latents


def video_latent(ctx: Any, width: int, height: int, length: int, batch_size: int, start: Pictures | None = None) -> Latent:
    """A video latent of `length` frames at the video model's size multiple below, its first frame the start image
    fitted to that size (as ComfyUI's bilinear, centre-cropped upscale does)."""
    info = ctx.video_info()
    if info is None:
        raise ValueError(NO_VIDEO)
    step = info.size_multiple
    w, h = max(step, width // step * step), max(step, height // step * step)
    if (w, h) != (width, height):
        ctx.warn(f"node {ctx.node}: {width}x{height} runs as {w}x{h} (multiples of {step})")
    first = None
    if start is not None:
        if len(start.images) > 1:
            ctx.warn(f"node {ctx.node}: the first of {len(start.images)} start images is the clip's first frame")
        first = ImageOps.fit(start.images[0].convert("RGB"), (w, h), Image.Resampling.BILINEAR)
    return Latent(w, h, batch_size, frames=length, start=first)


LATENT_VIDEO = {"EmptyHunyuanLatentVideo": (848, 480, 16, 25, 4), "EmptyMochiLatentVideo": (848, 480, 16, 25, 6),
                "EmptyLTXVLatentVideo": (768, 512, 32, 97, 8)}  # ComfyUI's defaults: width, height, size step, length, its step


def _register_empty(name: str, width: int, height: int, step: int, length: int, length_step: int) -> None:
    def empty_latent_video(ctx: Any, width: int, height: int, length: int, batch_size: int) -> tuple:
        return (video_latent(ctx, width, height, length, batch_size),)

    empty_latent_video.__doc__ = "An empty clip of `length` frames: a sampler on it is text-to-video on the video model."
    inputs = {"width": size(width, step), "height": size(height, step), "length": frames(length, length_step), "batch_size": BATCH}
    node(name, "latent/video", inputs, ("LATENT",), check=video_fits())(empty_latent_video)


for _name, _shape in LATENT_VIDEO.items():
    _register_empty(_name, *_shape)


@node("Wan22ImageToVideoLatent", "conditioning/inpaint", {
    "vae": link("VAE"), "width": size(1280, 32, 32), "height": size(704, 32, 32), "length": frames(49, 4), "batch_size": BATCH,
    "start_image": link("IMAGE", optional=True),
}, ("LATENT",), check=video_fits("start_image"))  # fmt: skip
def wan22_image_to_video_latent(ctx: Any, vae: Any, width: int, height: int, length: int, batch_size: int,
                                start_image: Pictures | None = None) -> tuple:  # fmt: skip
    """A clip of `length` frames; with a start image, image-to-video from it (Wan 2.2 TI2V's graph)."""
    return (video_latent(ctx, width, height, length, batch_size, start_image),)


@node("WanImageToVideo", "conditioning/video_models", {
    "positive": link("CONDITIONING"), "negative": link("CONDITIONING"), "vae": link("VAE"), "width": size(832, 16),
    "height": size(480, 16), "length": frames(81, 4), "batch_size": BATCH,
    "clip_vision_output": link("CLIP_VISION_OUTPUT", optional=True), "start_image": link("IMAGE", optional=True),
}, ("CONDITIONING", "CONDITIONING", "LATENT"), output_names=("positive", "negative", "latent"),
   check=video_fits("start_image"))  # fmt: skip
def wan_image_to_video(ctx: Any, positive: Conditioning, negative: Conditioning, vae: Any, width: int, height: int,
                       length: int, batch_size: int, clip_vision_output: Any = None, start_image: Pictures | None = None) -> tuple:  # fmt: skip
    """Image-to-video from the start image (Wan 2.1 I2V's graph): the conditionings as given, the clip's latent."""
    return positive, negative, video_latent(ctx, width, height, length, batch_size, start_image)


# ------------------------------------------------------------------ loaders


@node("CLIPLoader", "advanced/loaders", {
    "clip_name": combo(lambda c: c.served), "type": combo(lambda c: CLIP_TYPES, "stable_diffusion"),
    "device": In("COMBO", "default", choices=lambda c: ("default", "cpu"), optional=True),
}, ("CLIP",))  # fmt: skip
def clip_loader(ctx: Any, clip_name: str, type: str, device: str = "default") -> tuple:
    """The text encoder of a model the server runs, by the model's name (any `type`: the model reads its own prompts)."""
    return (Clip(served(ctx, clip_name)),)


@node("CLIPVisionLoader", "loaders", {"clip_name": combo(lambda c: (c.video.name,) if c.video else ())}, ("CLIP_VISION",))
def clip_vision_loader(ctx: Any, clip_name: str) -> tuple:
    """The video model's image encoder, by the model's name (its pipeline encodes the start image itself)."""
    return (ClipVision(clip_name),)


@node("CLIPVisionEncode", "conditioning", {
    "clip_vision": link("CLIP_VISION"), "image": link("IMAGE"), "crop": combo(lambda c: ("center", "none"), "center"),
}, ("CLIP_VISION_OUTPUT",))  # fmt: skip
def clip_vision_encode(ctx: Any, clip_vision: ClipVision, image: Pictures, crop: str) -> tuple:
    """Taken for WanImageToVideo's clip_vision_output: the video pipeline encodes its start image itself."""
    return (clip_vision,)


@node("ModelSamplingSD3", "advanced/model", {"model": link("MODEL"), "shift": In("FLOAT", 3.0, 0.0, 100.0, 0.01)}, ("MODEL",))
def model_sampling_sd3(ctx: Any, model: Model, shift: float) -> tuple:
    """Taken, its shift not applied: a request has no shift field, the model's own schedule (its flow shift) runs."""
    ctx.warn(f"node {ctx.node}: shift {shift:g} is not applied: {model.name} samples with its own schedule's shift")
    return (model,)


# ------------------------------------------------------------------ saving clips


def _atomic(path: Path, write: Callable[[Path], None]) -> Path:
    """`write` to a hidden temporary name beside `path`, then renamed: never half a file under its name."""
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    try:
        write(temp)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


def _meta(pictures: Pictures, fps: float) -> dict[str, Any] | None:
    """Our parameters of the first clip (a sampler's frames only), at the rate the file plays where a request could
    ask for it (the model made the frames at its own: ComfyUI's save nodes never tell the model a rate)."""
    if not pictures.metadata:
        return None
    meta = dict(pictures.metadata[0])
    return meta | ({"fps": fps} if "fps" in meta and FPS_RANGE.low <= fps <= FPS_RANGE.high else {})


def save_clip(ctx: Any, pictures: Pictures, meta: dict[str, Any] | None, suffix: str, write: Callable[[Path], None],
              poster: bool = True) -> dict[str, str]:  # fmt: skip
    """A clip file in the caller's outputs, ComfyUI's {filename, subfolder, type}: beside a poster PNG (the first
    frame with our parameters, which History lists) when a sampler made the frames, else under a name of its own.
    `write` writes the file whole or not at all (`_atomic`)."""
    root = ctx.folders.root("output", ctx.owner)
    if poster and meta is not None:
        (first,) = ctx.folders.outputs.save_pictures(list(pictures.images[:1]), [meta], ctx.owner, ctx.comfy_text())
        path = first.with_suffix(suffix)
    else:
        folder = day_folder(root)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / f"ComfyUI-{secrets.token_hex(8)}{suffix}"
    write(path)
    return {"filename": path.name, "subfolder": path.parent.relative_to(root).as_posix().removeprefix("."), "type": "output"}


def _webp_exif(comfy: dict[str, str], meta: dict[str, Any] | None) -> Image.Exif:
    """ComfyUI's WebP metadata (`prompt:` in EXIF Model, `workflow:` in Make) and A1111's parameters (UserComment)."""
    exif = Image.Exif()
    exif[EXIF_MODEL] = "prompt:" + comfy["prompt"]
    for tag, (key, text) in zip(range(EXIF_MAKE, 0, -1), [kv for kv in comfy.items() if kv[0] != "prompt"], strict=False):
        exif[tag] = f"{key}:{text}"
    if meta is not None:
        exif.get_ifd(EXIF_IFD)[USER_COMMENT] = b"UNICODE\x00" + a1111_parameters(meta).encode("utf-16-be")
    return exif


def _animated(images: Pictures, saved: dict[str, str]) -> tuple:
    """ComfyUI's SavedImages output: `animated` only when there is more than one frame."""
    return ({"images": [saved]} | ({"animated": [True]} if len(images.images) > 1 else {}),)


@node("SaveAnimatedWEBP", "image/animation", {
    "images": link("IMAGE"), "filename_prefix": In("STRING", "ComfyUI"), "fps": FPS, "lossless": In("BOOLEAN", True),
    "quality": In("INT", 80, 0, 100), "method": combo(lambda c: tuple(WEBP_METHODS), "default"),
}, output_node=True)  # fmt: skip
def save_animated_webp(ctx: Any, images: Pictures, filename_prefix: str, fps: float, lossless: bool, quality: int, method: str) -> tuple:
    """The frames as one animated WebP (ComfyUI's: each frame int(1000 / fps) ms), with the graph and our parameters."""
    frames = [im.convert("RGB") for im in images.images]
    meta = _meta(images, fps)
    exif = _webp_exif(ctx.comfy_text(), meta)

    def write(path: Path) -> None:
        frames[0].save(path, format="WEBP", save_all=True, append_images=frames[1:], duration=int(1000.0 / fps), exif=exif,
                       lossless=lossless, quality=quality, method=WEBP_METHODS[method])  # fmt: skip

    return _animated(images, save_clip(ctx, images, meta, ".webp", lambda path: _atomic(path, write)))



@node("SaveAnimatedPNG", "image/animation", {
    "images": link("IMAGE"), "filename_prefix": In("STRING", "ComfyUI"), "fps": FPS, "compress_level": In("INT", 4, 0, 9),
}, output_node=True)  # fmt: skip
def save_animated_png(ctx: Any, images: Pictures, filename_prefix: str, fps: float, compress_level: int) -> tuple:
    """The frames as one animated PNG (History lists it as a picture), with the graph and our parameters."""
    frames = [im.convert("RGB") for im in images.images]
    meta = _meta(images, fps)
    info = png_info(meta, ctx.comfy_text()) if meta is not None else _text_chunks(ctx.comfy_text())

    def write(path: Path) -> None:
        frames[0].save(path, format="PNG", save_all=True, append_images=frames[1:], duration=int(1000.0 / fps),
                       compress_level=compress_level, pnginfo=info)  # fmt: skip

    return _animated(images, save_clip(ctx, images, meta, ".png", lambda path: _atomic(path, write), poster=False))


def _text_chunks(texts: dict[str, str]) -> PngImagePlugin.PngInfo:
    info = PngImagePlugin.PngInfo()
    for key, text in texts.items():
        info.add_text(key, text)
    return info


@node("CreateVideo", "image/video", {
    "images": link("IMAGE"), "fps": In("FLOAT", 30.0, 1.0, 120.0, 1.0), "audio": link("AUDIO", optional=True),
}, ("VIDEO",))  # fmt: skip
def create_video(ctx: Any, images: Pictures, fps: float, audio: Any = None) -> tuple:
    """Frames as a video at `fps` (for SaveVideo)."""
    return (Video(images, fps),)


@node("SaveVideo", "image/video", {
    "video": link("VIDEO"), "filename_prefix": In("STRING", "video/ComfyUI"), "format": combo(lambda c: ("auto", "mp4"), "auto"),
    "codec": combo(lambda c: ("auto", "h264"), "auto"),
}, output_node=True)  # fmt: skip
def save_video(ctx: Any, video: Video, filename_prefix: str, format: str, codec: str) -> tuple:
    """The video as an H.264 MP4, with the graph (`prompt`, `workflow` tags) and our parameters inside."""
    meta = _meta(video.pictures, video.fps)
    tags = ctx.comfy_text() | ({METADATA_KEY: json.dumps(meta, default=str)} if meta is not None else {})
    parameters = a1111_parameters(meta) if meta is not None else ""

    def write(path: Path) -> None:  # write_video writes whole or not at all
        write_video(list(video.pictures.images), video.fps, path, parameters, tags)

    return ({"images": [save_clip(ctx, video.pictures, meta, ".mp4", write)], "animated": [True]},)
