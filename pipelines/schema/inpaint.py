"""The inpaint's part of a request (`Inpaint`): the mask and A1111's inpaint options, bounds and defaults.

A request with one is an inpaint of each of its input images; every front end sends these fields
flat. What runs it (mask, fill, crop, paste-back, canvas): pipelines.imaging.inpaint.
"""

from __future__ import annotations

from typing import Annotated

from PIL import Image
from pydantic import Field

from pipelines.schema.fields import About, Choice, Flag, Picture, Range, Schema

MASKED_CONTENT = ("original", "fill")  # A1111's names (its "latent noise" / "latent nothing" are not offered)
INPAINT_AREAS = ("whole picture", "only masked")
MAX_MASK_BLUR = 64
MAX_PADDING = 256
MAX_EXTEND = 2048  # pixels added on one side by an outpaint
# The denoising strength an inpaint starts with (UI and APIs): diffusers' inpaint pipelines' own
# default, and Fooocus's. A1111's 0.75 keeps too much of what was painted over: on the embedded
# model, a new colour and shape in a masked box came out right in 40/48 scenes at 0.75 and 48/48
# at 1.0 (docs/embedded-models.md has the 200-scene evaluation).
DEFAULT_STRENGTH = 1.0


MASK_MODES = ("1", "L", "LA", "P", "RGB", "RGBA")  # a painted mask as any tool saves it (binary_mask reads each)
INPAINT = frozenset({"inpaint"})


class Inpaint(Schema):
    """What to repaint and how; a request with one is an inpaint of each of its input images (a
    nested part of the request schema, `pipelines.schema.request`: every front end sends these flat).

    `mask` has the input images' size; white (any non-black pixel, or alpha for RGBA) = repaint.
    Defaults are A1111's (mask blur 4, original content, whole picture, padding 32) except the
    denoising strength, which the request carries (`GenerationRequest.strength`).
    """

    mask: Annotated[Image.Image, Picture(modes=MASK_MODES), About("Mask", tasks=INPAINT, a1111="mask", openai="mask", cli="--mask")] = Field(
        description="what to repaint: white (any non-black pixel, or alpha) is repainted; the input image's size"
    )  # fmt: skip
    mask_blur: Annotated[int, Range(0, MAX_MASK_BLUR, integer=True), About("Mask blur", tasks=INPAINT, a1111="mask_blur", step=1, unit="px")] = Field(
        4, description="pixels of feathering inside the mask (the seam never reaches an unpainted pixel)"
    )  # fmt: skip
    masked_content: Annotated[str, Choice(MASKED_CONTENT), About("Masked content", tasks=INPAINT, a1111="inpainting_fill")] = Field(
        "original", description="what the model starts from under the mask: the picture, or a fill of its surroundings"
    )  # fmt: skip
    inpaint_area: Annotated[str, Choice(INPAINT_AREAS), About("Inpaint area", tasks=INPAINT, a1111="inpaint_full_res")] = Field(
        "whole picture", description="render the whole picture, or only the masked box at the model's full resolution"
    )  # fmt: skip
    padding: Annotated[int, Range(0, MAX_PADDING, integer=True), About("Only masked padding, pixels", tasks=INPAINT, a1111="inpaint_full_res_padding", step=1, unit="px")] = Field(
        32, description="pixels around the mask's box rendered with it (\"only masked\")"
    )  # fmt: skip
    invert_mask: Annotated[bool, Flag(), About("Invert mask", tasks=INPAINT, a1111="inpainting_mask_invert")] = Field(
        False, description="repaint everything but the mask"
    )  # fmt: skip

    @property
    def only_masked(self) -> bool:
        return self.inpaint_area == "only masked"


INPAINT_DEFAULTS = Inpaint(mask=Image.new("L", (8, 8)))  # the option defaults, read by forms that leave one out
