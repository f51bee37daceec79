"""The core node classes: loaders, text, latents, KSampler(Advanced), pixels, uploads, saving.

Each is a small typed function over ComfyUI's types (`values`), declared with `registry.node`;
anything not declared here or in `nodes_more` is refused by name before anything runs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from PIL import Image, ImageOps

from .registry import (
    BATCH,
    CFG,
    CKPT,
    DENOISE,
    LORA_STRENGTH,
    SAMPLER,
    SCHEDULER,
    SEED,
    SIZE,
    SIZE0,
    STEPS,
    TEXT,
    In,
    combo,
    fits,
    link,
    node,
)
from .sampler import SamplerInputs, sample
from .values import RESAMPLE, Clip, Conditioning, Latent, Mask, Model, Pictures, Vae

# ------------------------------------------------------------------ loaders and text


@node("CheckpointLoaderSimple", "loaders", {"ckpt_name": CKPT}, ("MODEL", "CLIP", "VAE"))
def checkpoint_loader(ctx: Any, ckpt_name: str) -> tuple:
    """A model the server runs, by its name: the image model, or the video model (its text encoder and VAE with it)."""
    return Model(served(ctx, ckpt_name)), Clip(ckpt_name), Vae(ckpt_name)


def served(ctx: Any, name: str) -> str:
    """`name` if the server still runs it (the image model or the video model); ValueError if another was loaded since."""
    if name not in ctx.served():
        raise ValueError(f"{name} is no longer served (the models served now: {', '.join(ctx.served())})")
    return name


@node("VAELoader", "loaders", {"vae_name": combo(lambda c: c.served)}, ("VAE",))
def vae_loader(ctx: Any, vae_name: str) -> tuple:
    """The VAE of one of the server's models (the one it runs)."""
    return (Vae(vae_name),)


WEIGHT_DTYPES = ("default", "fp8_e4m3fn", "fp8_e4m3fn_fast", "fp8_e5m2")


@node("UNETLoader", "advanced/loaders", {"unet_name": combo(lambda c: c.served), "weight_dtype": combo(lambda c: WEIGHT_DTYPES)},
      ("MODEL",))  # fmt: skip
def unet_loader(ctx: Any, unet_name: str, weight_dtype: str) -> tuple:
    """A model the server runs, by its name (Wan's and Flux's graphs load theirs so; the video model for a video latent)."""
    if weight_dtype != "default":
        ctx.warn(f"node {ctx.node}: weight_dtype {weight_dtype} is not applied: the model runs at the server's dtype (DTYPE, QUANTIZATION)")
    return (Model(served(ctx, unet_name)),)


@node("LoraLoader", "loaders", {
    "model": link("MODEL"), "clip": link("CLIP"), "lora_name": combo(lambda c: c.loras),
    "strength_model": LORA_STRENGTH, "strength_clip": LORA_STRENGTH,
}, ("MODEL", "CLIP"))  # fmt: skip
def lora_loader(ctx: Any, model: Model, clip: Clip, lora_name: str, strength_model: float, strength_clip: float) -> tuple:
    """A LoRA on the model and its text encoder (one strength here: the model's)."""
    name = _lora_name(lora_name)
    if strength_clip != strength_model:
        ctx.warn(f"node {ctx.node}: the LoRA {name} runs at {strength_model:g} on the text encoder too (one strength per LoRA here)")
    return model.with_lora(name, strength_model), Clip(clip.name, (*clip.loras, (name, strength_model)), clip.last_layer)


def _lora_name(choice: str) -> str:
    for suffix in (".safetensors", ".pt", ".bin"):
        choice = choice.removesuffix(suffix)
    return choice


@node("CLIPSetLastLayer", "conditioning", {"clip": link("CLIP"), "stop_at_clip_layer": In("INT", -1, -12, -1, 1)}, ("CLIP",))
def clip_set_last_layer(ctx: Any, clip: Clip, stop_at_clip_layer: int) -> tuple:
    """The text encoder's last layer: -1 the last, -2 the one before (A1111's Clip skip 2), down to -12."""
    return (Clip(clip.name, clip.loras, stop_at_clip_layer),)


@node("CLIPTextEncode", "conditioning", {"text": TEXT, "clip": link("CLIP")}, ("CONDITIONING",))
def clip_text_encode(ctx: Any, text: str, clip: Clip) -> tuple:
    """A prompt, in our prompt language (A1111's weights, `[from:to:when]`, `<lora:name:w>`)."""
    return (Conditioning(text, clip),)


# ------------------------------------------------------------------ latents and samplers


@node("EmptyLatentImage", "latent", {"width": SIZE, "height": SIZE, "batch_size": BATCH}, ("LATENT",),
      check=fits("width", "height", "batch_size"))  # fmt: skip
def empty_latent(ctx: Any, width: int, height: int, batch_size: int) -> tuple:
    """An empty canvas: a sampler on it draws from text (its size down to the model's multiple, as a latent is)."""
    step = ctx.size_multiple()
    if width % step or height % step:
        ctx.warn(f"node {ctx.node}: {width}x{height} runs as {width // step * step}x{height // step * step} (multiples of {step})")
    return (Latent(max(step, width // step * step), max(step, height // step * step), batch_size),)


KSAMPLER_INPUTS = {
    "model": link("MODEL"), "seed": SEED, "steps": STEPS, "cfg": CFG, "sampler_name": SAMPLER,
    "scheduler": SCHEDULER, "positive": link("CONDITIONING"), "negative": link("CONDITIONING"),
    "latent_image": link("LATENT"), "denoise": DENOISE,
}  # fmt: skip


@node("KSampler", "sampling", KSAMPLER_INPUTS, ("LATENT",))
def ksampler(ctx: Any, model: Model, seed: int, steps: int, cfg: float, sampler_name: str, scheduler: str,
             positive: Conditioning, negative: Conditioning, latent_image: Latent, denoise: float) -> tuple:  # fmt: skip
    """Denoise the latent with our samplers (one engine job when its pixels are needed)."""
    given = SamplerInputs(model, positive, negative, latent_image, seed, steps, cfg, sampler_name, scheduler, denoise)
    return (sample(ctx, given),)


@node("KSamplerAdvanced", "sampling", {
    "model": link("MODEL"), "add_noise": combo(lambda c: ("enable",)), "noise_seed": SEED, "steps": STEPS,
    "cfg": CFG, "sampler_name": SAMPLER, "scheduler": SCHEDULER, "positive": link("CONDITIONING"),
    "negative": link("CONDITIONING"), "latent_image": link("LATENT"), "start_at_step": In("INT", 0, 0, 10000),
    "end_at_step": In("INT", 10000, 0, 10000), "return_with_leftover_noise": combo(lambda c: ("disable",)),
}, ("LATENT",))  # fmt: skip
def ksampler_advanced(ctx: Any, model: Model, add_noise: str, noise_seed: int, steps: int, cfg: float,
                      sampler_name: str, scheduler: str, positive: Conditioning, negative: Conditioning,
                      latent_image: Latent, start_at_step: int, end_at_step: int,
                      return_with_leftover_noise: str) -> tuple:  # fmt: skip
    """KSampler with a step window: starting at step k of n runs as denoise (n - k) / n."""
    end = min(end_at_step, steps)
    if end < steps:
        ctx.warn(f"node {ctx.node}: end_at_step {end_at_step} < steps: every step to the end runs here")
    denoise = 1.0 if latent_image.empty else max(0.01, (steps - min(start_at_step, steps - 1)) / steps)
    run_steps = max(1, round(steps * denoise)) if denoise < 1.0 else steps
    given = SamplerInputs(model, positive, negative, latent_image, noise_seed, run_steps, cfg, sampler_name, scheduler, denoise)
    return (sample(ctx, given),)


@node("LatentUpscale", "latent", {
    "samples": link("LATENT"), "upscale_method": combo(lambda c: c.latent_methods, "nearest-exact"),
    "width": SIZE0, "height": SIZE0, "crop": combo(lambda c: ("disabled", "center")),
}, ("LATENT",), check=fits("width", "height"))  # fmt: skip
def latent_upscale(ctx: Any, samples: Latent, upscale_method: str, width: int, height: int, crop: str) -> tuple:
    """Enlarge the latent to width x height (0: keep the aspect ratio)."""
    if width == 0 and height == 0:
        return (samples,)
    width = width or round(samples.width * height / samples.height)
    height = height or round(samples.height * width / samples.width)
    return (_enlarged(samples, width, height, upscale_method),)


@node("LatentUpscaleBy", "latent", {
    "samples": link("LATENT"), "upscale_method": combo(lambda c: c.latent_methods, "nearest-exact"),
    "scale_by": In("FLOAT", 1.5, 0.01, 8.0, 0.01),
}, ("LATENT",))  # fmt: skip
def latent_upscale_by(ctx: Any, samples: Latent, upscale_method: str, scale_by: float) -> tuple:
    """Enlarge the latent by a factor."""
    width, height = round(samples.width * scale_by / 8) * 8, round(samples.height * scale_by / 8) * 8
    ctx.check_size(width, height)
    return (_enlarged(samples, width, height, upscale_method),)


def _enlarged(samples: Latent, width: int, height: int, method: str) -> Latent:
    start = samples.start.resize((width, height), RESAMPLE[method]) if samples.start is not None else None
    return replace(samples, width=width, height=height, upscale_method=method, start=start)


@node("SetLatentNoiseMask", "latent/inpaint", {"samples": link("LATENT"), "mask": link("MASK")}, ("LATENT",))
def set_latent_noise_mask(ctx: Any, samples: Latent, mask: Mask) -> tuple:
    """Redraw only under the mask."""
    return (replace(samples, mask=mask),)


# ------------------------------------------------------------------ pixels


@node("VAEDecode", "latent", {"samples": link("LATENT"), "vae": link("VAE")}, ("IMAGE",))
def vae_decode(ctx: Any, samples: Latent, vae: Vae) -> tuple:
    """The latent's pictures (this is where a sampler's request runs)."""
    return (ctx.pictures(samples),)


@node("VAEEncode", "latent", {"pixels": link("IMAGE"), "vae": link("VAE")}, ("LATENT",))
def vae_encode(ctx: Any, pixels: Pictures, vae: Vae) -> tuple:
    """Pictures as a latent, for image-to-image."""
    width, height = pixels.images[0].size
    return (Latent(width, height, len(pixels.images), pixels=pixels),)


@node("VAEEncodeForInpaint", "latent/inpaint", {
    "pixels": link("IMAGE"), "vae": link("VAE"), "mask": link("MASK"), "grow_mask_by": In("INT", 6, 0, 64),
}, ("LATENT",))  # fmt: skip
def vae_encode_for_inpaint(ctx: Any, pixels: Pictures, vae: Vae, mask: Mask, grow_mask_by: int) -> tuple:
    """Pictures and the region to redraw (grown by `grow_mask_by` pixels)."""
    from PIL import ImageFilter

    grown = mask.image.filter(ImageFilter.MaxFilter(2 * grow_mask_by + 1)) if grow_mask_by else mask.image
    width, height = pixels.images[0].size
    return (Latent(width, height, len(pixels.images), pixels=pixels, mask=Mask(grown)),)


def upload_state(ctx: Any, values: dict[str, Any]) -> tuple[int, int]:
    """An upload's size and time: the same name uploaded again (overwrite) is another picture."""
    found = ctx.upload_path(values["image"]).stat()
    return found.st_size, found.st_mtime_ns


@node("LoadImage", "image", {"image": combo(lambda c: c.uploads)}, ("IMAGE", "MASK"), fingerprint=upload_state)
def load_image(ctx: Any, image: str) -> tuple:
    """An uploaded picture (POST /upload/image) and the mask of its transparent pixels."""
    picture = ctx.upload(image)
    rgb = picture.convert("RGB")
    alpha = picture.getchannel("A") if "A" in picture.getbands() else Image.new("L", picture.size, 255)
    return Pictures((rgb,)), Mask(ImageOps.invert(alpha))


@node("LoadImageMask", "mask", {"image": combo(lambda c: c.uploads), "channel": combo(lambda c: ("alpha", "red", "green", "blue"))},
      ("MASK",), fingerprint=upload_state)  # fmt: skip
def load_image_mask(ctx: Any, image: str, channel: str) -> tuple:
    """One channel of an uploaded picture as a mask (alpha inverted: transparent is redrawn)."""
    picture = ctx.upload(image).convert("RGBA")
    band = picture.getchannel({"alpha": "A", "red": "R", "green": "G", "blue": "B"}[channel])
    return (Mask(ImageOps.invert(band) if channel == "alpha" else band),)


@node("ImageScale", "image/upscaling", {
    "image": link("IMAGE"), "upscale_method": combo(lambda c: ("nearest-exact", "bilinear", "area", "bicubic", "lanczos")),
    "width": SIZE0, "height": SIZE0, "crop": combo(lambda c: ("disabled", "center")),
}, ("IMAGE",), check=fits("width", "height"))  # fmt: skip
def image_scale(ctx: Any, image: Pictures, upscale_method: str, width: int, height: int, crop: str) -> tuple:
    """Resize pictures (Pillow; a side of 0 keeps the aspect ratio)."""
    first = image.images[0]
    if width == 0 and height == 0:
        return (image,)
    width = width or round(first.width * height / first.height)
    height = height or round(first.height * width / first.width)
    resample = RESAMPLE[upscale_method]
    out = tuple(
        ImageOps.fit(im, (width, height), resample) if crop == "center" else im.resize((width, height), resample)
        for im in image.images
    )
    return (Pictures(out, image.metadata, image.seeds),)


@node("UpscaleModelLoader", "loaders", {"model_name": combo(lambda c: c.upscale_models)}, ("UPSCALE_MODEL",))
def upscale_model_loader(ctx: Any, model_name: str) -> tuple:
    """One of the server's upscaler models (UPSCALER_DIR)."""
    return (model_name,)


@node("ImageUpscaleWithModel", "image/upscaling", {"upscale_model": link("UPSCALE_MODEL"), "image": link("IMAGE")}, ("IMAGE",))
def image_upscale_with_model(ctx: Any, upscale_model: str, image: Pictures) -> tuple:
    """Enlarge pictures with an upscaler model, at its own factor."""
    return (Pictures(tuple(ctx.upscale(list(image.images), upscale_model)), image.metadata, image.seeds),)


@node("SaveImage", "image", {"images": link("IMAGE"), "filename_prefix": In("STRING", "ComfyUI")}, output_node=True)
def save_image(ctx: Any, images: Pictures, filename_prefix: str) -> tuple:
    """Write PNGs to the server's outputs (History shows them) with the graph and our parameters."""
    return ctx.save(images, filename_prefix, temp=False)


@node("PreviewImage", "image", {"images": link("IMAGE")}, output_node=True)
def preview_image(ctx: Any, images: Pictures) -> tuple:
    """Show pictures without keeping them (a temporary file for /view)."""
    return ctx.save(images, "ComfyUI_temp", temp=True)
