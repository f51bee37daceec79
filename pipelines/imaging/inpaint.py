"""Inpainting and outpainting: the mask, the masked content, the crop and the paste-back.

diffusers' inpaint pipelines denoise where the mask is white; what they leave to the caller,
and what an A1111, Forge or InvokeAI user expects, lives here:

- the mask: any painted pixel counts (a grey brush stroke too; RGBA masks by their alpha), and
  "invert mask" repaints everything *but* the strokes;
- masked content "fill": the masked area is first painted over with the colours around it
  (A1111's fill: blurs of decreasing radius), so the model does not start from what was there;
- inpaint area "only masked": the mask's bounding box plus `padding`, grown to the render's
  aspect ratio (diffusers' `VaeImageProcessor.get_crop_region`), is rendered at the model's
  size and scaled back into place: small regions get the model's full resolution;
- paste-back: every pixel outside the mask is the original's, bit for bit. The mask blur
  feathers the seam *inside* the mask only (the blurred mask is clipped to the mask), so an
  inpaint never changes a pixel the user did not paint, and an outpaint keeps the original
  picture exactly.

`extend_canvas` turns an outpaint (extend left/up/right/down) into an inpaint: a larger canvas
whose new border repeats the picture's edge pixels, and a mask over the new border.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageFilter

from pipelines.schema.inpaint import MAX_EXTEND, Inpaint


def binary_mask(mask: Image.Image, invert: bool = False) -> Image.Image:
    """The mask as "L" 0/255: any painted pixel is 255 (by alpha for RGBA/LA masks, as Gradio's
    ImageEditor layers and A1111's alpha masks are)."""
    if mask.mode in ("RGBA", "LA") or (mask.mode == "P" and "transparency" in mask.info):
        values = np.asarray(mask.convert("RGBA"))[..., 3]
    else:
        values = np.asarray(mask.convert("L"))
    painted = values > 0
    if invert:
        painted = ~painted
    return Image.fromarray(np.where(painted, 255, 0).astype(np.uint8), mode="L")


def is_empty(mask: Image.Image) -> bool:
    """Nothing to repaint (a binary mask)."""
    return mask.getbbox() is None


def fill(image: Image.Image, mask: Image.Image) -> Image.Image:
    """A1111's masked content "fill": the masked area painted with the colours around it.

    Blurs of decreasing radius of the unmasked pixels are stacked over each other; the last,
    unblurred layer puts every unmasked pixel back as it was.
    """
    keep = Image.new("RGBa", image.size)
    keep.paste(image.convert("RGBA").convert("RGBa"), mask=Image.eval(mask, lambda v: 255 - v))
    out = Image.new("RGBA", image.size)
    for radius, repeats in ((256, 1), (64, 1), (16, 2), (4, 4), (2, 2), (0, 1)):
        blurred = keep.filter(ImageFilter.GaussianBlur(radius)).convert("RGBA")
        for _ in range(repeats):
            out.alpha_composite(blurred)
    return out.convert("RGB")


def paste_alpha(mask: Image.Image, blur: int) -> Image.Image:
    """How much of the generated image each pixel takes: the blurred mask clipped to the mask, so
    the feathered seam lies inside what was painted and every other pixel stays the original's."""
    if blur == 0:
        return mask
    blurred = np.asarray(mask.filter(ImageFilter.GaussianBlur(blur)))
    return Image.fromarray(np.minimum(blurred, np.asarray(mask)), mode="L")


def crop_region(mask: Image.Image, padding: int, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """The "only masked" crop (x1, y1, x2, y2): the mask's box plus `padding`, grown to `size`'s aspect
    ratio inside the image (diffusers' own helper, as its pipelines' `padding_mask_crop` uses it)."""
    from diffusers.image_processor import VaeImageProcessor  # here: the request module imports this one

    return tuple(int(v) for v in VaeImageProcessor.get_crop_region(mask, size[0], size[1], pad=padding))


def render_size(box: tuple[int, int], native: tuple[int, int], step: int) -> tuple[int, int]:
    """A (width, height) of `box`'s aspect ratio at the model's native area, on its size step."""
    scale = math.sqrt(native[0] * native[1] / (box[0] * box[1]))
    return tuple(max(step, round(side * scale / step) * step) for side in box)  # type: ignore[return-value]


def size_for(inpaint: Inpaint, mask: Image.Image, asked: tuple[int, int] | None, native: tuple[int, int], step: int):
    """The render size of an "only masked" inpaint: the request's width x height, else the padded
    mask box's aspect ratio at the model's native area."""
    if asked is not None:
        return asked
    x1, y1, x2, y2 = mask.getbbox() or (0, 0, *mask.size)
    pad = inpaint.padding
    box = (min(x2 + pad, mask.width) - max(x1 - pad, 0), min(y2 + pad, mask.height) - max(y1 - pad, 0))
    return render_size(box, native, step)


@dataclass(frozen=True)
class Prepared:
    """One input image made ready for the diffusers call, and what puts the result back."""

    original: Image.Image  # the user's image (RGB)
    image: Image.Image  # what the model starts from, at the render size
    mask: Image.Image  # the model's mask, at the render size
    alpha: Image.Image  # paste-back weights at the original's size (`paste_alpha`)
    box: tuple[int, int, int, int]  # the rendered region of the original (all of it for "whole picture")

    def paste_back(self, generated: Image.Image) -> Image.Image:
        """The generated image scaled into its region of the original; outside the mask, the original."""
        x1, y1, x2, y2 = self.box
        region = generated.convert("RGB").resize((x2 - x1, y2 - y1), Image.Resampling.LANCZOS)
        canvas = self.original.copy()
        canvas.paste(region, (x1, y1))
        return Image.composite(canvas, self.original, self.alpha)


def prepare(image: Image.Image, mask: Image.Image, inpaint: Inpaint, size: tuple[int, int]) -> Prepared:
    """`image` and its binary `mask` as the model gets them at `size` (width, height)."""
    original = image.convert("RGB")
    start = fill(original, mask) if inpaint.masked_content == "fill" else original
    box = crop_region(mask, inpaint.padding, size) if inpaint.only_masked else (0, 0, *original.size)
    blurred = mask.filter(ImageFilter.GaussianBlur(inpaint.mask_blur)) if inpaint.mask_blur else mask
    return Prepared(
        original=original,
        image=start.crop(box).resize(size, Image.Resampling.LANCZOS),
        mask=blurred.crop(box).resize(size, Image.Resampling.BILINEAR),
        alpha=paste_alpha(mask, inpaint.mask_blur),
        box=box,
    )


def extend_canvas(
    image: Image.Image, left: int = 0, up: int = 0, right: int = 0, down: int = 0, step: int = 8
) -> tuple[Image.Image, Image.Image]:
    """An outpaint as an inpaint: (canvas, mask). The canvas is `image` grown by the given pixels
    per side, the new border repeating the picture's edge pixels (a start the model blends from);
    the mask covers exactly the new border. Each amount must be a multiple of the model's `step`,
    so the new canvas stays on the model's size grid where the picture was."""
    amounts = {"left": left, "up": up, "right": right, "down": down}
    for name, value in amounts.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EXTEND:
            raise ValueError(f"outpaint {name}: must be a whole number of pixels in 0..{MAX_EXTEND}, got {value!r}")
        if value % step:
            raise ValueError(f"outpaint {name}: {value} is not a multiple of {step} (this model's size step)")
    if not any(amounts.values()):
        raise ValueError("outpaint: extend at least one side by some pixels")
    pixels = np.asarray(image.convert("RGB"))
    canvas = np.pad(pixels, ((up, down), (left, right), (0, 0)), mode="edge")
    mask = np.full(canvas.shape[:2], 255, dtype=np.uint8)
    mask[up : up + pixels.shape[0], left : left + pixels.shape[1]] = 0
    return Image.fromarray(canvas), Image.fromarray(mask, mode="L")


# Which families inpaint (and so outpaint), for the refusal message and the docs; the code reads
# each pipeline's own abilities (pipelines.run.traits.inpaint_twin), not this text.
INPAINT_FAMILIES = (
    "Stable Diffusion 1.x/2.x, SDXL, SD3/3.5, Flux (dev/schnell, Kontext, Fill), Qwen-Image and Qwen-Image-Edit "
    "(InstructPix2Pix, PixArt, Sana and HiDream have no inpainting pipeline in diffusers)"
)
EMPTY_MASK_WARNING = "the mask is empty: nothing to repaint, so the original image is returned"


def metadata(inpaint: Inpaint) -> dict[str, object]:
    """What a PNG records of an inpaint (pipelines.pnginfo.write writes A1111's names for them)."""
    return {
        "mask_blur": inpaint.mask_blur,
        "masked_content": inpaint.masked_content,
        "inpaint_area": inpaint.inpaint_area,
        "padding": inpaint.padding,
        "invert_mask": inpaint.invert_mask,
    }
