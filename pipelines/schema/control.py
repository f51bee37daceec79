"""ControlNet's part of a request (`ControlUnit`) and the names a unit may use.

A unit's fields, bounds and choices are A1111's ControlNet extension's (its clients send those);
the preprocessors are listed here by name and parameters (what a client may send and a form offers),
while the code that makes each map is pipelines.control.maps's and the models' pipelines.control.controlnet's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from PIL import Image
from pydantic import Field, model_validator

from pipelines.schema.fields import About, Choice, Picture, Range, Schema, Text, refuse

CONTROL_MODES = ("Balanced", "My prompt is more important", "ControlNet is more important")
RESIZE_MODES = ("Just Resize", "Crop and Resize", "Resize and Fill")
UNKNOWN = "Unknown"  # a unit's control type when it names none: its preprocessor's (TYPE_OF_PREPROCESSOR)
CONTROL_TYPES = (UNKNOWN, "OpenPose", "Depth", "Soft Edge", "Hard Edge", "Normal Map", "Segmentation", "Tile", "Inpaint")
# The map each preprocessor makes, as a control type (sd-webui-controlnet's own inference).
TYPE_OF_PREPROCESSOR = {
    "canny": "Hard Edge", "invert": "Hard Edge", "softedge": "Soft Edge", "scribble": "Soft Edge", "depth": "Depth",
    "normal": "Normal Map", "seg": "Segmentation", "tile": "Tile", "openpose": "OpenPose",
}  # fmt: skip


class PreprocessorError(ValueError):
    """An unknown preprocessor, or one whose weights are not installed; the message lists the usable ones."""


@dataclass(frozen=True)
class Preprocessor:
    name: str
    threshold_a: tuple[str, float] | None = None  # (label, default)
    threshold_b: tuple[str, float] | None = None
    folder: str | None = None  # a model-based one's: its model's folder in ANNOTATOR_DIR (a key of ANNOTATOR_TASKS)

    @property
    def model_based(self) -> bool:
        """Made by an annotator model from ANNOTATOR_DIR (pipelines.control.annotators), not by code (pipelines.control.maps)."""
        return self.folder is not None


PREPROCESSORS: dict[str, Preprocessor] = {
    p.name: p
    for p in (
        Preprocessor("none"),
        Preprocessor("canny", ("Canny low threshold", 100), ("Canny high threshold", 200)),
        Preprocessor("softedge"),
        Preprocessor("scribble", ("Threshold", 127)),
        Preprocessor("invert"),
        Preprocessor("tile", ("Down sampling rate", 4)),
        Preprocessor("grayscale"),
    )
}
# Made by an annotator model the user supplies (run by pipelines.control.annotators): the folder in ANNOTATOR_DIR
# it reads, and the transformers task of the model that goes there. normal is made from the depth model's depth.
ANNOTATOR_TASKS = {"depth": "depth-estimation", "seg": "image-segmentation", "pose": "keypoint-detection (VitPose)"}
MODEL_BASED: dict[str, Preprocessor] = {
    name: Preprocessor(name, folder=folder)
    for name, folder in (("depth", "depth"), ("normal", "depth"), ("seg", "seg"), ("openpose", "pose"))
}
# A1111's names for the same maps (its clients send these); value: ours.
ALIASES = {
    "softedge_pidinet": "softedge", "softedge_hed": "softedge",
    "scribble_xdog": "scribble", "scribble_hed": "scribble", "invert (from white bg & black line)": "invert",
    "tile_resample": "tile", "blur_gaussian": "tile", "recolor_luminance": "grayscale",
    "depth_midas": "depth", "depth_leres": "depth", "depth_leres++": "depth", "depth_zoe": "depth",
    "depth_anything": "depth", "depth_anything_v2": "depth", "normal_midas": "normal",
    "seg_ofade20k": "seg", "seg_ufade20k": "seg", "seg_ofcoco": "seg",
    "openpose_full": "openpose", "dw_openpose_full": "openpose",  # their bodies (hands and faces are not drawn)
}  # fmt: skip
# A1111's preprocessors whose networks transformers does not have (openpose_full, lineart_realistic,
# mlsd, normal_bae, ...): refused with this reason.
NOT_RUN = ("openpose", "dw", "lineart", "mlsd", "normal", "shuffle", "mediapipe", "densepose", "anime")


def missing(name: str, root: Path | None) -> str:
    """Why the model-based preprocessor `name` cannot run: where its model goes (`root`: ANNOTATOR_DIR's value)."""
    folder = MODEL_BASED[name].folder
    where = f"{root / folder}" if root else f"ANNOTATOR_DIR/{folder}"
    return (
        f"preprocessor {name!r} needs a transformers {ANNOTATOR_TASKS[folder]} model in {where} (ANNOTATOR_DIR; "
        f"nothing is downloaded at run time): put one there (docs/controlnet.md#model-based-preprocessors), or send "
        f"a ready map with preprocessor 'none'"
    )


def resolve(name: str | None) -> Preprocessor:
    """The preprocessor `name` (ours or A1111's) names; PreprocessorError listing the usable ones."""
    key = (name or "none").strip().lower()
    key = ALIASES.get(key, key)
    if key in PREPROCESSORS or key in MODEL_BASED:
        return PREPROCESSORS.get(key) or MODEL_BASED[key]
    usable = f"{', '.join(PREPROCESSORS)}, and with models in ANNOTATOR_DIR {', '.join(MODEL_BASED)}"
    if key.split("_")[0] in NOT_RUN:
        raise PreprocessorError(
            f"preprocessor {name!r} needs an annotator network this app does not run (nothing is downloaded at "
            f"run time); run it elsewhere and send the map with preprocessor 'none', or use one of: {usable}"
        )
    raise PreprocessorError(f"unknown preprocessor {name!r}; choose one of: {usable}")


class ControlUnit(Schema):
    """One ControlNet unit (A1111's ControlNet extension's names and defaults, but `processor_res`)."""

    image: Annotated[Image.Image, Picture(), About("Control image", a1111="image")] = Field(
        description="the picture the map is made from (or the map itself, with preprocessor none)"
    )
    module: Annotated[str, Text(), About("Preprocessor", a1111="module")] = Field(
        "none", description="canny, softedge, scribble, invert, tile, grayscale or none (pipelines.control.maps); "
        "depth, normal or seg with a model in ANNOTATOR_DIR (pipelines.control.annotators)"
    )
    model: Annotated[str, Text(required=True), About("Model", a1111="model")] = Field(
        description="a ControlNet of the server's (CONTROLNET_DIR, models/controlnets); A1111's \" [hash]\" suffix is ignored"
    )
    weight: Annotated[float, Range(0.0, 2.0), About("Control weight", a1111="weight", step=0.05)] = Field(
        1.0, description="how strongly the map steers (0: not at all)"
    )
    guidance_start: Annotated[float, Range(0.0, 1.0), About("Starting control step", a1111="guidance_start", step=0.01)] = Field(
        0.0, description="share of the steps before the unit starts"
    )  # fmt: skip
    guidance_end: Annotated[float, Range(0.0, 1.0), About("Ending control step", a1111="guidance_end", step=0.01)] = Field(
        1.0, description="share of the steps after which the unit stops"
    )
    control_mode: Annotated[str, Choice(CONTROL_MODES), About("Control mode", a1111="control_mode")] = Field(
        "Balanced", description="what wins where prompt and map disagree (pipelines.control.controlnet)"
    )
    resize_mode: Annotated[str, Choice(RESIZE_MODES), About("Resize mode", a1111="resize_mode")] = Field(
        "Crop and Resize", description="how the map meets the output's size: stretch, cover and crop, or fit and pad"
    )
    processor_res: Annotated[int, Range(0, 4096, integer=True), About("Preprocessor resolution", a1111="processor_res", step=8)] = Field(
        0, description="the shorter side the picture is resized to before the preprocessor; 0: the output's shorter side"
    )  # fmt: skip
    threshold_a: Annotated[float | None, Range(0.0, 1024.0), About("Threshold A", a1111="threshold_a")] = Field(
        None, description="the preprocessor's first parameter (canny: low threshold); null: its default"
    )
    threshold_b: Annotated[float | None, Range(0.0, 1024.0), About("Threshold B", a1111="threshold_b")] = Field(
        None, description="the preprocessor's second parameter (canny: high threshold); null: its default"
    )
    control_type: Annotated[str, Choice(CONTROL_TYPES), About("Control type", a1111="union_control_type")] = Field(
        UNKNOWN, description="for a union ControlNet, which kind of map this is; Unknown: the preprocessor's "
        "(canny: Hard Edge, depth: Depth; pipelines.control.controlnet)"
    )  # fmt: skip

    @model_validator(mode="after")
    def _checked(self) -> ControlUnit:
        if self.guidance_start >= self.guidance_end:
            raise refuse(
                f"starts at {self.guidance_start:g} of the steps but ends at {self.guidance_end:g}: it would never run",
                field=("guidance_end",),
            )
        try:
            resolve(self.module)
        except PreprocessorError as exc:
            raise refuse(str(exc), field=("module",)) from None
        return self

    @property
    def model_name(self) -> str:
        return model_name(self.model)


def model_name(name: str) -> str:
    """A1111 lists models as "name [hash]" and its clients send that back: the name alone."""
    name = name.strip()
    return name.rsplit(" [", 1)[0] if name.endswith("]") and " [" in name else name
