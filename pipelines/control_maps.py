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
output size). Model-based preprocessors (depth, pose, segmentation) are refused by name: their
weights are not shipped and nothing here downloads at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageOps


class PreprocessorError(ValueError):
    """An unknown preprocessor, or one whose weights are not installed; the message lists the usable ones."""


@dataclass(frozen=True)
class Preprocessor:
    name: str
    run: Callable[[Image.Image, float, float], Image.Image]
    threshold_a: tuple[str, float] | None = None  # (label, default)
    threshold_b: tuple[str, float] | None = None


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
# A1111's names for the same maps (its clients send these); value: ours.
ALIASES = {
    "softedge_pidinet": "softedge", "softedge_hed": "softedge",
    "scribble_xdog": "scribble", "scribble_hed": "scribble", "invert (from white bg & black line)": "invert",
    "tile_resample": "tile", "blur_gaussian": "tile", "recolor_luminance": "grayscale",
}  # fmt: skip
# Preprocessors that need an annotator model we do not ship (A1111's names start so: depth_midas,
# openpose_full, seg_ofade20k, lineart_realistic, normal_bae): refused with this reason.
NEEDS_WEIGHTS = ("depth", "openpose", "seg", "lineart", "normal")


def resolve(name: str | None) -> Preprocessor:
    key = (name or "none").strip().lower()
    key = ALIASES.get(key, key)
    if key in PREPROCESSORS:
        return PREPROCESSORS[key]
    if key.split("_")[0] in NEEDS_WEIGHTS:
        raise PreprocessorError(
            f"preprocessor {name!r} needs an annotator model that is not installed (nothing is downloaded "
            f"at run time); run it elsewhere and send the map with preprocessor 'none', or use one of: "
            f"{', '.join(PREPROCESSORS)}"
        )
    raise PreprocessorError(f"unknown preprocessor {name!r}; choose one of: {', '.join(PREPROCESSORS)}")


def detect(image: Image.Image, name: str | None, resolution: int | None = None, a: float | None = None,
           b: float | None = None) -> Image.Image:
    """The map for `image`: resized so its shorter side is `resolution` (when given), then run."""
    pre = resolve(name)
    if resolution and resolution > 0 and min(image.size) != resolution:
        scale = resolution / min(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.Resampling.LANCZOS)
    a = pre.threshold_a[1] if a is None and pre.threshold_a else (a or 0)
    b = pre.threshold_b[1] if b is None and pre.threshold_b else (b or 0)
    return pre.run(image, a, b)
