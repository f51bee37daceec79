"""ControlNet preprocessors: a picture in, the map a ControlNet was trained on out.

Only preprocessors that need no downloaded weights are built in; their names are the ones A1111's
ControlNet extension uses, so its API clients send them unchanged (`module` in a unit).

| name | map | parameters (A1111's `threshold_a` / `threshold_b`) | why this way |
|---|---|---|---|
| `none` | the image as given | - | the user already has a map (a silhouette, a pose render) |
| `canny` | OpenCV's Canny edges of the colour image, white on black | low, high threshold (100, 200) | the standard; ControlNet canny models were trained on exactly this |
| `softedge` | Sobel gradient magnitude of a blurred grey image, normalised | - | HED/PiDiNet need weights; a soft gradient is what their models tolerate |
| `scribble` | dark strokes on light paper become white on black, thresholded | threshold (127) | people draw dark on white; scribble models expect white on black |
| `invert` | the image inverted | - | A1111's "invert (from white bg & black line)" |
| `tile` | the image shrunk by a factor, then enlarged back (blur of detail) | factor (4) | tile/blur models add detail back to a soft image |
| `grayscale` | the image in grey | - | recolor models |

Every map comes back as an RGB image of the asked size (`processor_res` is the shorter side the
image is resized to before detection, as in A1111; the pipeline then resizes the map to the
output size). Model-based preprocessors (`depth`, `normal`, `seg`, `openpose`) run a transformers
model the user puts in ANNOTATOR_DIR (pipelines.annotators); where it is absent they are refused,
saying where it goes. The ones whose networks transformers does not have (lineart, mlsd, normal_bae,
openpose's hands and faces) are refused by name. Nothing here downloads at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps


class PreprocessorError(ValueError):
    """An unknown preprocessor, or one whose weights are not installed; the message lists the usable ones."""


@dataclass(frozen=True)
class Preprocessor:
    name: str
    run: Callable[[Image.Image, float, float], Image.Image] | None  # None: an annotator model's (`model_based`)
    threshold_a: tuple[str, float] | None = None  # (label, default)
    threshold_b: tuple[str, float] | None = None
    folder: str | None = None  # a model-based one's: its model's folder in ANNOTATOR_DIR (a key of ANNOTATOR_TASKS)

    @property
    def model_based(self) -> bool:
        """Made by an annotator model from ANNOTATOR_DIR (pipelines.annotators), not by code here."""
        return self.run is None


def _gray(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("L"))


def canny(image: Image.Image, low: float = 100, high: float = 200) -> Image.Image:
    import cv2  # opencv-python-headless: the Canny every ControlNet canny model was trained on

    # On the colour image, as A1111's annotator does: OpenCV takes the strongest channel's gradient, so a
    # red shape on blue (nearly equal in grey) still has its edges.
    edges = cv2.Canny(np.ascontiguousarray(np.asarray(image.convert("RGB"))), float(low), float(high))
    return Image.fromarray(edges).convert("RGB")


def softedge(image: Image.Image, _a: float = 0, _b: float = 0) -> Image.Image:
    import cv2

    gray = cv2.GaussianBlur(_gray(image).astype(np.float32), (3, 3), 0)
    magnitude = np.hypot(cv2.Sobel(gray, cv2.CV_32F, 1, 0), cv2.Sobel(gray, cv2.CV_32F, 0, 1))
    peak = float(magnitude.max()) or 1.0
    return Image.fromarray((magnitude / peak * 255).clip(0, 255).astype(np.uint8)).convert("RGB")


def scribble(image: Image.Image, threshold: float = 127, _b: float = 0) -> Image.Image:
    gray = _gray(image)
    if gray.mean() > 127:  # dark strokes on light paper: the usual drawing
        gray = 255 - gray
    return Image.fromarray(np.where(gray > threshold, 255, 0).astype(np.uint8)).convert("RGB")


def invert(image: Image.Image, _a: float = 0, _b: float = 0) -> Image.Image:
    return ImageOps.invert(image.convert("RGB"))


def tile(image: Image.Image, factor: float = 4, _b: float = 0) -> Image.Image:
    rgb = image.convert("RGB")
    small = (max(1, round(rgb.width / max(1.0, factor))), max(1, round(rgb.height / max(1.0, factor))))
    return rgb.resize(small, Image.Resampling.BOX).resize(rgb.size, Image.Resampling.BICUBIC)


def grayscale(image: Image.Image, _a: float = 0, _b: float = 0) -> Image.Image:
    return image.convert("L").convert("RGB")


def passthrough(image: Image.Image, _a: float = 0, _b: float = 0) -> Image.Image:
    return image.convert("RGB")


PREPROCESSORS: dict[str, Preprocessor] = {
    p.name: p
    for p in (
        Preprocessor("none", passthrough),
        Preprocessor("canny", canny, ("Canny low threshold", 100), ("Canny high threshold", 200)),
        Preprocessor("softedge", softedge),
        Preprocessor("scribble", scribble, ("Threshold", 127)),
        Preprocessor("invert", invert),
        Preprocessor("tile", tile, ("Down sampling rate", 4)),
        Preprocessor("grayscale", grayscale),
    )
}
# Made by an annotator model the user supplies (run by pipelines.annotators): the folder in ANNOTATOR_DIR
# it reads, and the transformers task of the model that goes there. normal is made from the depth model's depth.
ANNOTATOR_TASKS = {"depth": "depth-estimation", "seg": "image-segmentation", "pose": "keypoint-detection (VitPose)"}
MODEL_BASED: dict[str, Preprocessor] = {
    name: Preprocessor(name, None, folder=folder)
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


def detect(image: Image.Image, name: str | None, resolution: int | None = None, a: float | None = None,
           b: float | None = None, annotators: Any = None) -> Image.Image:
    """The map for `image`: resized so its shorter side is `resolution` (when given), then run (a
    model-based preprocessor by `annotators`, pipelines.annotators.Annotators)."""
    pre = resolve(name)
    if resolution and resolution > 0 and min(image.size) != resolution:
        scale = resolution / min(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.Resampling.LANCZOS)
    if pre.run is None:
        if annotators is None:
            raise PreprocessorError(missing(pre.name, None))
        return annotators.run(pre.name, image)  # AnnotatorError is a PreprocessorError
    a = pre.threshold_a[1] if a is None and pre.threshold_a else (a or 0)
    b = pre.threshold_b[1] if b is None and pre.threshold_b else (b or 0)
    return pre.run(image, a, b)
