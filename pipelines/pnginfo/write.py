"""PNG metadata written: an A1111-compatible `parameters` chunk plus our JSON chunk (read back in pipelines.pnginfo.read).

A1111's format (read by A1111, SD.Next, ComfyUI loaders, Civitai):

    a red circle on a blue background <lora:outline:0.8>
    Negative prompt: blurry
    Steps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 4.0, Seed: 7, Size: 64x64, Model hash: 0123456789,
    Model: tiny-shapes, Lora hashes: "outline: 0123456789ab"

`Schedule type` is always written (samplers.schedule_type: Karras, or the A1111 schedule that
spaces timesteps as the model's scheduler does): A1111 reads a missing one as "Automatic".

A step cache (pipelines.sampling.step_cache) adds `Step cache: FirstBlockCache 0.05`: A1111 keeps fields it
does not know in its "extra" text, and the image is only reproduced with the same cache.

The `diffusion_anywhere` chunk holds the full metadata dict (device, dtype, attention, timings).
"""

from __future__ import annotations

import json
import os
import secrets
import time
from pathlib import Path
from typing import Any

from PIL import Image, PngImagePlugin

from pipelines.control import controlnet as control
from pipelines.control import ip_adapter
from pipelines.imaging import hires
from pipelines.pnginfo.read import JSON_KEY
from pipelines.pnginfo.read import read_metadata as read_metadata  # re-exported: callers read our PNGs back from here
from pipelines.sampling.step_cache import CALIBRATION, StepCache
from pipelines.schema.request import GenerationResult
from pipelines.video.files import write_video


def _quote(value: Any) -> str:
    """A1111's `quote`: a value holding a comma, colon or newline is written as a JSON string."""
    text = str(value)
    return json.dumps(text, ensure_ascii=False) if any(c in text for c in ',:\n"') else text


def a1111_parameters(meta: dict[str, Any]) -> str:
    """A1111's infotext, in its field order; hashes (`Model hash`, `Lora hashes`) when known."""
    from pipelines.sampling.samplers import BY_NAME, schedule_type

    prompt = meta["prompt"] + "".join(f" <lora:{n}:{s:g}>" for n, s in meta.get("loras", {}).items())
    sampler = meta.get("sampler", "")
    # Always an explicit schedule: A1111 reads none as "Automatic" (Karras for DPM++ 2M)
    schedule = "Karras" if sampler.endswith(" Karras") else meta.get("schedule") or schedule_type(sampler)
    sampler = BY_NAME[sampler].a1111[0] if sampler in BY_NAME else sampler
    fields = [
        ("Steps", meta["steps"]),
        ("Sampler", sampler),
        ("Schedule type", schedule),
        ("CFG scale", meta["guidance_scale"]),
        ("Image CFG scale", meta.get("image_guidance_scale")),  # A1111's name, for instruct-pix2pix models
        ("Guidance end", meta.get("guidance_end")),  # written only when guidance stopped early
        ("Seed", meta["seed"]),
        ("Size", f"{meta['width']}x{meta['height']}"),
        ("Model hash", meta.get("model_hash")),
        ("Model", meta.get("model", "")),
        ("VAE", meta.get("vae")),  # A1111's: the VAE other than the model's own (TINY_VAE)
        *([("Denoising strength", meta.get("strength"))] if "strength" in meta else hires.infotext(meta)[:1]),
        *inpaint_fields(meta),
        *hires.infotext(meta)[1:],  # A1111's order: the strength, then the Hires fields
        ("Step cache", step_cache_text(meta)),  # ours (A1111 has none): keeps the image reproducible
        ("Video refiner", meta.get("refiner")),  # ours: a video model's refine pass (pipelines.video.refine)
        ("Video refiner strength", meta.get("refiner_strength")),
        # sd-webui-controlnet's "ControlNet 0" lines: the units, then the image prompts as IP-Adapter units
        *control.infotext([*(meta.get("controlnet") or []), *ip_adapter.infotext_units(meta)]),
    ]
    fields += _schema_fields(meta, {key for key, _ in fields})
    hashes = meta.get("lora_hashes") or {}
    if hashes:
        fields.append(("Lora hashes", ", ".join(f"{n}: {h}" for n, h in hashes.items())))
    embeddings = meta.get("ti_hashes") or {}
    if embeddings:  # the textual-inversion embeddings the prompts used (pipelines.prompts.embeddings)
        fields.append(("TI hashes", ", ".join(f"{n}: {h}" for n, h in embeddings.items())))
    fields += [tuple(pair) for pair in meta.get("script", ())]  # a script's grid: "Script: X/Y/Z plot", its axes
    lines = [prompt]
    if meta.get("negative_prompt"):
        lines.append(f"Negative prompt: {meta['negative_prompt']}")
    lines.append(", ".join(f"{k}: {_quote(v)}" for k, v in fields if v is not None and v != ""))
    return "\n".join(lines)


def _schema_fields(meta: dict[str, Any], written: set[str]) -> list[tuple[str, Any]]:
    """Every other request field the metadata holds and the schema names an infotext key for
    ("Clip skip"), after the fields above: a field added to the schema is recorded without a change here."""
    from pipelines.schema.request import fields

    return [(s.about.infotext, meta[s.name]) for s in fields() if s.about.infotext not in (None, *written) and s.name in meta]


def step_cache_text(meta: dict[str, Any]) -> str | None:
    """ "FirstBlockCache 0.05", "TaylorSeer": the step cache an image was made with, None for none."""
    method = meta.get("step_cache")
    if not method:
        return None
    label = StepCache(method, meta.get("step_cache_threshold")).label  # read back by StepCache.from_label
    return f"{label} {CALIBRATION}" if meta.get("step_cache_calibration") else label


def inpaint_fields(meta: dict[str, Any]) -> list[tuple[str, Any]]:
    """An inpaint's settings under A1111's names: `Mask blur`, `Masked content`, `Inpaint area` (and
    `Masked area padding` with "Only masked", as A1111 writes it), `Mask mode` when inverted."""
    if "mask_blur" not in meta:
        return []
    only_masked = meta.get("inpaint_area") == "only masked"
    return [
        ("Mask blur", meta["mask_blur"]),
        ("Masked content", meta.get("masked_content")),
        ("Inpaint area", "Only masked" if only_masked else "Whole picture"),
        ("Masked area padding", meta.get("padding") if only_masked else None),
        ("Mask mode", "Inpaint not masked" if meta.get("invert_mask") else None),
    ]


def png_info(meta: dict[str, Any], extra: dict[str, str] | None = None) -> PngImagePlugin.PngInfo:
    """The PNG text chunks of one image: A1111's `parameters`, our JSON, then `extra` (ComfyUI's
    `prompt` and `workflow` for an image made by a ComfyUI graph)."""
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", a1111_parameters(meta))
    info.add_text(JSON_KEY, json.dumps(meta, default=str))
    for key, text in (extra or {}).items():
        info.add_text(key, text)
    return info


TEMP_SUFFIX = ".part"  # files being written; never read, listed or pruned as outputs


def save_png(image: Image.Image, meta: dict[str, Any], path: str | Path, extra: dict[str, str] | None = None) -> Path:
    """Write one PNG with its metadata atomically: a temporary file in the same folder, then a rename.

    A process killed mid-write leaves only a `*.part` file, never a truncated PNG under the final
    name, and readers never see a half-written image.
    """
    path = Path(path)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(4)}{TEMP_SUFFIX}")
    try:
        image.save(temp, format="PNG", pnginfo=png_info(meta, extra))
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return path


def save_clip(clip: list[Image.Image], fps: float, meta: dict[str, Any], path: str | Path) -> Path:
    """One clip of a video result as a file (MP4, WebP, GIF or a zip of PNGs, by `path`'s suffix) with its
    metadata inside as a PNG has it: A1111's infotext and our JSON (PNG info reads both back)."""
    return write_video(clip, fps, path, a1111_parameters(meta), {JSON_KEY: json.dumps(meta, default=str)})


def save_clips(result: GenerationResult, out: str | Path) -> list[Path]:
    """Every clip of a video result: `out` a file name (clip.mp4: the first clip there, the next as clip-1.mp4 ...)
    or a folder (an MP4 per clip, named as `save_pngs` names its posters)."""
    out = Path(out)
    if out.suffix.lower() in (".mp4", ".webp", ".gif", ".zip"):
        names = [out if i == 0 else out.with_name(f"{out.stem}-{i}{out.suffix}") for i in range(len(result.clips))]
    else:
        stamp, request_id = time.strftime("%Y%m%d-%H%M%S"), secrets.token_hex(8)
        names = [out / f"{stamp}-{request_id}-{i:02d}-{m['seed']}.mp4" for i, m in enumerate(result.metadata)]
    return [save_clip(c, result.fps, m, n) for c, m, n in zip(result.clips, result.metadata, names, strict=True)]


def save_images(
    result: GenerationResult, out_dir: str | Path, prefix: str | None = None, extra: dict[str, str] | None = None
) -> list[Path]:
    """Write each image of a result as PNG with its metadata; returns the paths (`save_pngs`)."""
    return save_pngs(result.images, result.metadata, out_dir, prefix, extra)


def save_pngs(
    images: list[Image.Image], metadata: list[dict[str, Any]], out_dir: str | Path, prefix: str | None = None,
    extra: dict[str, str] | None = None,
) -> list[Path]:  # fmt: skip
    """Write each image as PNG with its metadata (and `extra` text chunks); returns the paths.

    Names are `<prefix>-<request id>-<index>-<seed>.png`: the random request id keeps two requests
    with the same seed in the same second from overwriting each other, and makes names unguessable.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    stamp = prefix or time.strftime("%Y%m%d-%H%M%S")
    request_id = secrets.token_hex(8)
    return [
        save_png(image, meta, out / f"{stamp}-{request_id}-{i:02d}-{meta['seed']}.png", extra)
        for i, (image, meta) in enumerate(zip(images, metadata, strict=True))
    ]
