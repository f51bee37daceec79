"""The detailer's part of a request (`Detailer`, `Detailer2nd`): ADetailer's pass, its fields under ADetailer's names.

After the images are made, a detector finds regions in each (boxes or masks) and each region is
inpainted at the model's full resolution with its own prompt, strength, dilation and blur, in the
same job. Two passes at most, as ADetailer runs them; the second pass's fields are the first's with
ADetailer's `_2nd` suffix (its infotext's " 2nd"), derived here so they are declared once.
What runs it: pipelines.imaging.detailer.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from pydantic import Field, create_model

from pipelines.schema.fields import About, Flag, Range, Schema, Text

OFF = ("", "none")  # ad_model values that mean no pass (ADetailer's "None")
SECOND = "_2nd"
MAX_DILATE = 128
# Where a pass names none: the model's (its vocabulary's "detailer"), else ADetailer's, which suit SD faces
# at 512 px. The embedded model's are 0.9 and 8: at 128 px a wrongly drawn small shape needs re-drawing,
# and 32 px of padding would leave it as small in the crop as it was (docs/regions-detailer-wildcards.md).
ADETAILER_DEFAULTS = {"ad_denoising_strength": 0.4, "ad_inpaint_only_masked_padding": 32}


def model_defaults(vocabulary: dict[str, Any]) -> dict[str, Any]:
    """The pass's model-dependent defaults: the model's vocabulary's, else ADetailer's."""
    return {**ADETAILER_DEFAULTS, **{k: v for k, v in (vocabulary.get("detailer") or {}).items() if k in ADETAILER_DEFAULTS}}


class Pass(Schema):
    """What both passes answer: whether the pass runs, and its values under the first pass's names."""

    @property
    def on(self) -> bool:
        return str(self.plain()["ad_model"]).strip().lower() not in OFF

    def plain(self) -> dict[str, Any]:
        """The pass's values under the first pass's names (the second pass's without its suffix)."""
        return {name.removesuffix(SECOND): value for name, value in self.model_dump().items()}


class Detailer(Pass):
    """One detailer pass (ADetailer's `args` entry): on when `ad_model` names a detector."""

    ad_model: Annotated[str, Text(), About("Detector", infotext="ADetailer model")] = Field(
        "None", description="a detector of the server's (DETECTOR_DIR, models/detectors); None: no pass"
    )
    ad_prompt: Annotated[str | None, Text(), About("Detailer prompt", infotext="ADetailer prompt")] = Field(
        None, description="the regions' prompt; empty: the image's own; [PROMPT] stands for the image's"
    )
    ad_negative_prompt: Annotated[str | None, Text(), About("Detailer negative prompt", infotext="ADetailer negative prompt")] = Field(
        None, description="the regions' negative prompt; empty: the image's own"
    )  # fmt: skip
    ad_confidence: Annotated[float, Range(0.0, 1.0), About("Detection confidence", infotext="ADetailer confidence", step=0.01)] = Field(
        0.3, description="regions the detector is less sure of are left alone"
    )  # fmt: skip
    ad_mask_k_largest: Annotated[int, Range(0, 10, integer=True), About("Largest regions only", infotext="ADetailer mask only top k largest", step=1)] = Field(
        0, description="repaint only the k largest regions; 0: all"
    )  # fmt: skip
    ad_dilate_erode: Annotated[int, Range(-MAX_DILATE, MAX_DILATE, integer=True), About("Mask dilation", infotext="ADetailer dilate erode", step=1, unit="px")] = Field(
        4, description="grow (or, negative, shrink) each region's mask by this many pixels"
    )  # fmt: skip
    ad_mask_blur: Annotated[int, Range(0, 64, integer=True), About("Detailer mask blur", infotext="ADetailer mask blur", step=1, unit="px")] = Field(
        4, description="feathering inside each region's mask"
    )  # fmt: skip
    ad_denoising_strength: Annotated[float | None, Range(0.01, 1.0), About("Detailer strength", infotext="ADetailer denoising strength", step=0.01)] = Field(
        None, description="how much of each region is re-drawn; null: the model's (ADetailer's 0.4 where it names none)"
    )  # fmt: skip
    ad_inpaint_only_masked: Annotated[bool, Flag(), About("Inpaint only masked", infotext="ADetailer inpaint only masked")] = Field(
        True, description="render each region's box at the model's full resolution (else the whole picture)"
    )  # fmt: skip
    ad_inpaint_only_masked_padding: Annotated[int | None, Range(0, 256, integer=True), About("Detailer padding", infotext="ADetailer inpaint padding", step=1, unit="px")] = Field(
        None, description="pixels around each region's box rendered with it; null: the model's (ADetailer's 32 where it names none)"
    )  # fmt: skip


def _second(field: str, info: Any) -> tuple[Any, Any]:
    about = next(m for m in info.metadata if isinstance(m, About))
    about = dataclasses.replace(about, label=f"{about.label} (2nd)", infotext=f"{about.infotext} 2nd")
    metadata = [about if isinstance(m, About) else m for m in info.metadata]
    return Annotated[(info.annotation, *metadata)], Field(info.default, description=f"2nd pass: {info.description}")


# The second pass: the same fields with ADetailer's suffix ("ad_model_2nd", infotext "ADetailer model 2nd").
Detailer2nd: type[Pass] = create_model(  # type: ignore[call-overload]
    "Detailer2nd",
    __base__=Pass,
    __doc__="ADetailer's second pass: the first's fields, suffixed.",
    **{name + SECOND: _second(name, info) for name, info in Detailer.model_fields.items()},
)
