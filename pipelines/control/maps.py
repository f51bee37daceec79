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
model the user puts in ANNOTATOR_DIR (pipelines.control.annotators); where it is absent they are refused,
saying where it goes. The ones whose networks transformers does not have (lineart, mlsd, normal_bae,
openpose's hands and faces) are refused by name. Nothing here downloads at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from pipelines.schema.control import PREPROCESSORS, PreprocessorError, missing, resolve


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


# The code that makes each built-in map, by the name pipelines.schema.control lists it under.
RUNNERS: dict[str, Callable[[Image.Image, float, float], Image.Image]] = {
    "none": passthrough, "canny": canny, "softedge": softedge, "scribble": scribble, "invert": invert,
    "tile": tile, "grayscale": grayscale,
}  # fmt: skip
assert RUNNERS.keys() == PREPROCESSORS.keys(), "every built-in preprocessor the schema names has its code here"






def detect(image: Image.Image, name: str | None, resolution: int | None = None, a: float | None = None,
           b: float | None = None, annotators: Any = None) -> Image.Image:
    """The map for `image`: resized so its shorter side is `resolution` (when given), then run (a
    model-based preprocessor by `annotators`, pipelines.control.annotators.Annotators)."""
    pre = resolve(name)
    if resolution and resolution > 0 and min(image.size) != resolution:
        scale = resolution / min(image.size)
        image = image.resize((max(1, round(image.width * scale)), max(1, round(image.height * scale))),
                             Image.Resampling.LANCZOS)
    if pre.model_based:
        if annotators is None:
            raise PreprocessorError(missing(pre.name, None))
        return annotators.run(pre.name, image)  # AnnotatorError is a PreprocessorError
    a = pre.threshold_a[1] if a is None and pre.threshold_a else (a or 0)
    b = pre.threshold_b[1] if b is None and pre.threshold_b else (b or 0)
    return RUNNERS[pre.name](image, a, b)
