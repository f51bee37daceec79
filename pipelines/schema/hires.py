"""The hires fix's part of a request (`Hires`): A1111's "Hires. fix" fields, their bounds and defaults.

Nested in the request as the inpaint's options are; every front end sends its fields flat under
A1111's names (`enable_hr`, `hr_scale`, `hr_upscaler`, ...). What runs it: pipelines.imaging.hires.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from pipelines.schema.fields import About, Flag, Range, Schema, Text

TXT2IMG = frozenset({"txt2img"})
MAX_SCALE = 4.0
# The second pass's default strength: on the embedded model (64 prompts x 10 steps, 64 -> 128 px),
# Lanczos then 0.3 kept the asked scene in 0.92 of the images, 0.6 in 0.80 (the more is re-drawn,
# the more the subject breaks as it does at 128 px directly; docs/upscaling.md). A1111's 0.7 suits
# its latent modes on SD; A1111 clients send their own value anyway.
HIRES_STRENGTH = 0.3
DEFAULT_UPSCALER = "Lanczos"


class Hires(Schema):
    """The second pass of a text-to-image request (A1111's names and defaults, but the strength).

    Present in a request only when on: a front end's flat values carry `hires_fix` (A1111's
    `enable_hr`), and `pipelines.schema.request.nest` leaves the part out when it is off."""

    hires_fix: Annotated[bool, Flag(), About("Hires. fix", tasks=TXT2IMG, a1111="enable_hr")] = Field(
        False, description="draw at the model's size, enlarge, then refine: a larger image without a repeated subject"
    )  # fmt: skip
    hires_upscaler: Annotated[str, Text(), About("Upscaler", tasks=TXT2IMG, a1111="hr_upscaler", infotext="Hires upscaler")] = Field(
        DEFAULT_UPSCALER, description="Lanczos, Nearest, an upscaler model of the server's (UPSCALER_DIR), or a latent mode (\"Latent\", ...)"
    )  # fmt: skip
    hires_scale: Annotated[float, Range(1.0, MAX_SCALE), About("Upscale by", tasks=TXT2IMG, a1111="hr_scale", infotext="Hires upscale", step=0.05)] = Field(
        2.0, description="the second pass's size as a factor of the first's (unless resize width/height are set)"
    )  # fmt: skip
    hires_width: Annotated[int, Range(0, 16384, integer=True), About("Resize width to", tasks=TXT2IMG, a1111="hr_resize_x", step=8, unit="px")] = Field(
        0, description="the second pass's width; 0: from the factor (or from the height, keeping the aspect ratio)"
    )  # fmt: skip
    hires_height: Annotated[int, Range(0, 16384, integer=True), About("Resize height to", tasks=TXT2IMG, a1111="hr_resize_y", step=8, unit="px")] = Field(
        0, description="the second pass's height; 0: from the factor (or from the width); both set: enlarged to cover, then centre-cropped"
    )  # fmt: skip
    hires_steps: Annotated[int, Range(0, 150, integer=True), About("Hires steps", tasks=TXT2IMG, a1111="hr_second_pass_steps", infotext="Hires steps", step=1)] = Field(
        0, description="the second pass's steps before the strength cuts them (as image-to-image does); 0: the first pass's"
    )  # fmt: skip
    hires_strength: Annotated[float, Range(0.01, 1.0), About("Denoising strength", tasks=TXT2IMG, a1111="denoising_strength", infotext="Denoising strength", step=0.01)] = Field(
        HIRES_STRENGTH, description="how much of the enlarged image the second pass re-draws (low keeps the composition)"
    )  # fmt: skip
    hires_prompt: Annotated[str | None, Text(), About("Hires prompt", tasks=TXT2IMG, a1111="hr_prompt")] = Field(
        None, description="the second pass's prompt; empty: the first pass's"
    )
    hires_negative_prompt: Annotated[str | None, Text(), About("Hires negative prompt", tasks=TXT2IMG, a1111="hr_negative_prompt")] = Field(
        None, description="the second pass's negative prompt; empty: the first pass's"
    )  # fmt: skip
    hires_sampler: Annotated[str | None, Text(), About("Hires sampler", tasks=TXT2IMG, a1111="hr_sampler_name")] = Field(
        None, description="the second pass's sampler (an A1111 name the model offers); empty: the first pass's"
    )  # fmt: skip


HIRES_DEFAULTS = Hires()  # what a form shows before the user changes it
