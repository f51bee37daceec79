"""Hires fix: generate at the model's size, enlarge, then re-denoise at a low strength (A1111's "Hires. fix").

A model asked for more than its native size repeats and breaks the subject; drawn at its size
and then enlarged and refined, it keeps the composition and gains detail. What this module owns:

- (the schema part, `Hires`, is pipelines.schema.hires's);
- the second pass's size (`target_size`: the factor, or A1111's resize-to width/height);
- the enlargement of the first pass's images (`enlarge`): a pixel upscaler or model (pipelines.imaging.upscalers)
  on the pictures, or a latent mode on their latents (the picture re-encoded by the VAE, interpolated;
  the image-to-image pipeline takes latents where its family does, `LATENT_FAMILIES`);
- the infotext lines A1111 writes for it (`infotext`), read back by pipelines.pnginfo.read.

The two passes run as one job in `ImagePipeline` (progress over both, Stop between them keeps the
first pass's images), each image with its own seed in both passes, as A1111 does.
"""

from __future__ import annotations

import math
import time
from typing import Any

import torch
import torch.nn.functional as F
from PIL import Image

from pipelines.imaging.upscalers import latent_mode
from pipelines.schema.hires import DEFAULT_UPSCALER, Hires

# Families whose image-to-image pipeline takes latents as `image` (a tensor with the VAE's latent
# channels is used as the start, not encoded again): where the latent modes work.
LATENT_FAMILIES = frozenset({"StableDiffusionPipeline", "StableDiffusionXLPipeline"})




def target_size(hires: Hires, first: tuple[int, int], step: int) -> tuple[int, int]:
    """(width, height) of the second pass: the resize-to sizes (one given: the other keeps the
    aspect ratio), else the first pass's size times the factor; rounded to the model's size step."""
    w, h = first
    if hires.hires_width and hires.hires_height:
        tw, th = hires.hires_width, hires.hires_height
    elif hires.hires_width:
        tw, th = hires.hires_width, h * hires.hires_width / w
    elif hires.hires_height:
        tw, th = w * hires.hires_height / h, hires.hires_height
    else:
        tw, th = w * hires.hires_scale, h * hires.hires_scale
    return max(step, round(tw / step) * step), max(step, round(th / step) * step)


def second_steps(hires: Hires, first_steps: int) -> int:
    """The second pass's steps: the asked ones (0: the first pass's), at least enough for one step to
    run after the strength cuts them (image-to-image runs int(steps x strength); 0 would denoise nothing)."""
    return max(hires.hires_steps or first_steps, math.ceil(1 / hires.hires_strength))


def enlarge_pictures(
    images: list[Image.Image], hires: Hires, size: tuple[int, int], upscalers: Any
) -> list[Image.Image]:
    """The first pass's pictures at `size` by a pixel upscaler or model; both resize sizes set: to
    cover `size`, then centre-cropped (A1111's "crop and resize", `Upscalers.cover`)."""
    return [upscalers.cover(image, hires.hires_upscaler, size) for image in images]


@torch.inference_mode()
def enlarge_latents(
    pipe: Any, images: list[Image.Image], hires: Hires, size: tuple[int, int], dm: Any
) -> list[torch.Tensor]:
    """The first pass's images as latents at `size` / the VAE's factor, by a latent mode: each picture
    encoded by the VAE (its mean, scaled as the pipeline scales latents), then interpolated."""
    mode, antialias = latent_mode(hires.hires_upscaler)
    vae = pipe.vae
    factor = int(getattr(pipe, "vae_scale_factor", 8))
    config = vae.config
    out = []
    for image in images:
        pixels = pipe.image_processor.preprocess(image).to(dm.device, vae.dtype)
        latent = vae.encode(pixels).latent_dist.mode()
        latent = (latent - (getattr(config, "shift_factor", None) or 0.0)) * config.scaling_factor
        latent = F.interpolate(
            latent.float(), size=(size[1] // factor, size[0] // factor), mode=mode,
            antialias=antialias and mode in ("bilinear", "bicubic"),
        )  # fmt: skip
        out.append(latent.to(vae.dtype))
    return out


def metadata(hires: Hires, first_size: tuple[int, int], size: tuple[int, int], steps: int) -> dict[str, Any]:
    """What an image's metadata records of its hires pass (flat field names, read back by PNG info)."""
    meta: dict[str, Any] = {
        "hires_fix": True,
        "hires_upscaler": hires.hires_upscaler,
        "hires_strength": hires.hires_strength,
        "hires_first_size": list(first_size),
    }
    if hires.hires_width or hires.hires_height:
        meta["hires_width"], meta["hires_height"] = size
    else:
        meta["hires_scale"] = hires.hires_scale
    if hires.hires_steps:
        meta["hires_steps"] = steps
    for name in ("hires_prompt", "hires_negative_prompt", "hires_sampler"):
        if getattr(hires, name):
            meta[name] = getattr(hires, name)
    return meta


def infotext(meta: dict[str, Any]) -> list[tuple[str, Any]]:
    """A1111's infotext fields of a hires image, in its order (A1111's `Size` is the first pass's)."""
    if not meta.get("hires_fix"):
        return []
    resize = f"{meta['hires_width']}x{meta['hires_height']}" if meta.get("hires_width") else None
    return [
        ("Denoising strength", meta.get("hires_strength")),
        ("Hires prompt", meta.get("hires_prompt")),
        ("Hires negative prompt", meta.get("hires_negative_prompt")),
        ("Hires upscale", meta.get("hires_scale")),
        ("Hires resize", resize),
        ("Hires steps", meta.get("hires_steps")),
        ("Hires upscaler", meta.get("hires_upscaler")),
        ("Hires sampler", meta.get("hires_sampler")),
    ]


def read_infotext(out: dict[str, Any], extra: dict[str, str]) -> None:
    """A hires image's fields from A1111's names (pipelines.pnginfo.read): any of `Hires upscale`,
    `Hires resize`, `Hires upscaler` marks one; numbers the schema's infotext keys already gave."""
    if not {"Hires upscale", "Hires resize", "Hires upscaler"} & set(extra):
        return
    out["hires_fix"] = True
    for key, name in (("Hires upscaler", "hires_upscaler"), ("Hires prompt", "hires_prompt"),
                      ("Hires negative prompt", "hires_negative_prompt"), ("Hires sampler", "hires_sampler")):  # fmt: skip
        if extra.get(key):
            out[name] = extra[key]
    width, _, height = extra.get("Hires resize", "").partition("x")
    if width.strip().isdigit() and height.strip().isdigit():
        out["hires_width"], out["hires_height"] = int(width), int(height)
    if "hires_strength" not in out and "strength" in out:
        out["hires_strength"] = out["strength"]


def check(request: Any, info: Any) -> None:
    """RequestError (naming the field) for a hires request the model serving it cannot run: a model
    without image-to-image, an upscaler it does not offer, a second pass beyond its size limits, a
    sampler it lacks. `info` is the model's `ModelInfo`; the engine asks at submit, the pipeline again."""
    from pipelines.sampling.samplers import check_steps
    from pipelines.schema.fields import RequestError, shown

    hires = request.hires
    if not (info.text_to_image and info.image_to_image) or info.edit:
        raise RequestError(
            ("hires", "hires_fix"),
            f"{info.model_name} ({info.pipeline_class}) has no image-to-image pipeline in diffusers for the second pass",
        )
    if hires.hires_upscaler not in info.upscalers and latent_mode(hires.hires_upscaler) is None:
        offered = ", ".join(info.upscalers)
        raise RequestError(
            ("hires", "hires_upscaler"), f"{shown(hires.hires_upscaler, 80)} is not available; available: {offered}"
        )
    first = (request.width or info.default_width, request.height or info.default_height)
    width, height = target_size(hires, first, info.size_multiple)
    field = ("hires", "hires_width" if hires.hires_width or hires.hires_height else "hires_scale")
    if max(width, height) > info.max_side or width * height > info.max_pixels:
        raise RequestError(
            field,
            f"the second pass would be {width}x{height}, beyond this model's limits on this device "
            f"(largest side {info.max_side}, {info.max_pixels} pixels: MAX_SIDE, MAX_PIXELS)",
        )
    if hires.hires_sampler and hires.hires_sampler not in info.samplers:
        offered = ", ".join(info.samplers)
        raise RequestError(
            ("hires", "hires_sampler"), f"{shown(hires.hires_sampler, 80)} is not available; available: {offered}"
        )
    steps = second_steps(hires, request.steps or info.default_steps)
    check_steps(hires.hires_sampler or request.sampler or info.scheduler, steps, info.min_steps)


class _Progress:
    """Both passes' progress as one: the first pass's total grown by the second's expected share
    (its steps x strength, per image as the first's), then the second's steps after the first's."""

    def __init__(self, progress: Any, share: float):
        self.progress, self.share, self.first_total = progress, share, 0

    def first(self, step: int, total: int, image: int) -> None:
        self.first_total = total
        if self.progress is not None:
            self.progress(step, total + max(1, round(total * self.share)), image)

    def second(self, step: int, total: int, image: int) -> None:
        if self.progress is not None:
            self.progress(self.first_total + step, self.first_total + total, image)


def run(self: Any, request: Any, progress: Any, should_cancel: Any, item_range: Any, preview: Any) -> Any:
    """`ImagePipeline._generate` of a hires request (under its lock, the sampler already swapped):
    the first pass, the enlargement, the second pass over the same items with the same seeds."""
    hires, warnings = request.hires, []
    first_request = request.replace(hires=None)
    first_size = self.render_size(first_request)
    size = target_size(hires, first_size, self.size_multiple)
    steps = second_steps(hires, request.steps)
    both = _Progress(progress, max(1, int(steps * hires.hires_strength)) / request.steps)
    first = self._generate(first_request, both.first, should_cancel, item_range, preview)
    if first.cancelled or not first.images or (should_cancel is not None and should_cancel()):
        first.warnings.append("stopped before the hires pass: these are the first pass's images")
        first.cancelled = True
        return first
    start = time.perf_counter()
    self.activity = f"{len(first.images)} image(s), enlarging with {hires.hires_upscaler}"
    starts = _enlarged(self, first.images, hires, size, warnings)
    enlarge_seconds = time.perf_counter() - start
    second_request = first_request.replace(
        init_images=first.images, strength=hires.hires_strength, steps=steps, width=size[0], height=size[1],
        prompt=hires.hires_prompt or first_request.prompt,
        negative_prompt=hires.hires_negative_prompt or first_request.negative_prompt,
    )  # fmt: skip
    items = [
        {"prompt": hires.hires_prompt or meta["prompt"], "image": image, "seed": meta["seed"]}
        for meta, image in zip(first.metadata, starts, strict=True)
    ]
    swapped = _use_sampler(self, hires.hires_sampler)
    offset = item_range[0] if item_range else 0
    second = self._generate(second_request, both.second, should_cancel, None, preview, items=items, first=offset)
    if swapped is not None:
        self.twins.use_scheduler(swapped)
    return _joined(self, first, second, hires, first_size, size, steps, enlarge_seconds, warnings)


def _enlarged(
    self: Any, images: list[Image.Image], hires: Hires, size: tuple[int, int], warnings: list[str]
) -> list[Any]:
    """The second pass's starts: latents by a latent mode where the family takes them, else pictures
    (a latent mode elsewhere falls back to Lanczos, said in the result: A1111 clients send "Latent" by default)."""
    if latent_mode(hires.hires_upscaler) is not None:
        if self.traits.class_name in LATENT_FAMILIES:
            with self.dm.attention_context():
                return list(enlarge_latents(self.pipe, images, hires, size, self.dm))
        warnings.append(
            f"{hires.hires_upscaler}: {self.traits.class_name} cannot start image-to-image from latents here; Lanczos used"
        )
        hires = hires.model_copy(update={"hires_upscaler": DEFAULT_UPSCALER})
    return enlarge_pictures(images, hires, size, self.upscalers)


def _use_sampler(self: Any, name: str | None) -> Any:
    """Swap in the second pass's sampler; returns the scheduler to put back (None: nothing swapped)."""
    if not name:
        return None
    current = self.pipe.scheduler
    if self._own_scheduler is None:
        self._own_scheduler = current  # what the model offers must not follow this request's swap
    self.twins.use_scheduler(self.build_sampler(name))
    return current


def _joined(self: Any, first: Any, second: Any, hires: Hires, first_size: tuple[int, int], size: tuple[int, int],
            steps: int, enlarge_seconds: float, warnings: list[str]) -> Any:  # fmt: skip
    """One result of both passes: the second's images (the first's where Stop came during the second),
    each with the first pass's metadata plus the hires fields, both passes' timings."""
    done = len(second.images)
    images = second.images + first.images[done:]
    own = metadata(hires, first_size, size, steps)
    metas = [{**m, **own} for m in first.metadata[:done]] + first.metadata[done:]
    timings = {k: first.timings[k] + second.timings.get(k, 0.0) for k in ("encode", "denoise", "decode", "total")}
    timings["total"] += enlarge_seconds
    timings.update(steps_per_second=first.timings["steps_per_second"], first_pass=first.timings["total"],
                   hires=second.timings.get("total", 0.0) + enlarge_seconds)  # fmt: skip
    for meta in metas:
        meta["timings"] = {k: round(v, 4) for k, v in timings.items()}
    result = second
    result.images, result.metadata, result.timings = images, metas, timings
    result.inputs = [None] * len(images)
    result.warnings = first.warnings + warnings + [w for w in second.warnings if w not in first.warnings]
    if done < len(first.images):
        result.warnings.append(
            f"stopped during the hires pass: {len(first.images) - done} first-pass image(s) returned as they were"
        )
    result.hires = f"{first_size[0]}x{first_size[1]} -> {size[0]}x{size[1]}, {hires.hires_upscaler}, strength {hires.hires_strength:g}"
    result.vae_tiling = first.vae_tiling or second.vae_tiling
    return result
