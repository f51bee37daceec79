"""How both evaluations (models/eval.py, models/eval_edit.py) judge images, and the labelled grid
they save: shared here so that neither imports the other for it (no import cycle).

Each generated image is classified without any learned model:
- background color: nearest palette color to the median of the outer 3-pixel ring;
- foreground color: nearest palette color to the median of the pixels that are clearly not
  background (far from the background color);
- shape: fill ratio of the foreground mask in its tightest bounding box over small rotations
  (circle ~0.79, square ~1.0, triangle <= 0.5; the rotation search keeps a slightly turned
  square a square);
- outline: more than 8 % of the shape's filled extent is background-colored (a ring).
The same classifier, run on the procedural training images themselves, is 100 % correct
(`classifier_self_check`), so errors it reports are the model's.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from models.train.world import COLORS, random_scene, render_batch

PALETTE_NAMES = list(COLORS)
PALETTE = np.array([COLORS[c] for c in PALETTE_NAMES], dtype=np.float32)


@dataclass
class Classification:
    color: str
    background: str
    shape: str
    outline: bool
    fill_ratio: float


def nearest_color(rgb: np.ndarray) -> str:
    return PALETTE_NAMES[int(np.argmin(((PALETTE - rgb) ** 2).sum(axis=1)))]


def _best_fill_ratio(ys: np.ndarray, xs: np.ndarray) -> float:
    """Mask pixels / area of their bounding box, maximised over rotations of -20..20 degrees."""
    best = 0.0
    cy, cx = ys.mean(), xs.mean()
    for degrees in range(-20, 21, 2):
        t = math.radians(degrees)
        u = (xs - cx) * math.cos(t) - (ys - cy) * math.sin(t)
        v = (xs - cx) * math.sin(t) + (ys - cy) * math.cos(t)
        area = (u.max() - u.min() + 1) * (v.max() - v.min() + 1)
        best = max(best, len(xs) / area)
    return best


def classify(image: Image.Image | np.ndarray) -> Classification:
    pixels = np.asarray(image, dtype=np.float32)[..., :3]
    ring = np.concatenate(
        [
            pixels[:3].reshape(-1, 3),
            pixels[-3:].reshape(-1, 3),
            pixels[:, :3].reshape(-1, 3),
            pixels[:, -3:].reshape(-1, 3),
        ]
    )
    background = nearest_color(np.median(ring, axis=0))
    bg_rgb = np.array(COLORS[background], dtype=np.float32)
    distance = np.sqrt(((pixels - bg_rgb) ** 2).sum(axis=-1))
    candidates = distance > 60
    if candidates.sum() < 4:
        return Classification("none", background, "none", False, 0.0)
    color = nearest_color(np.median(pixels[candidates], axis=0))
    fg_rgb = np.array(COLORS[color], dtype=np.float32)
    to_fg = ((pixels - fg_rgb) ** 2).sum(axis=-1)
    to_bg = ((pixels - bg_rgb) ** 2).sum(axis=-1)
    mask = to_fg < to_bg
    if mask.sum() < 4:  # the far pixels' colour is the background's own: no shape to judge
        return Classification("none", background, "none", False, 0.0)
    ys, xs = np.nonzero(mask)
    fill = _best_fill_ratio(ys.astype(np.float32), xs.astype(np.float32))
    # Fill each row between its outermost foreground pixels: a filled shape barely grows, an
    # outline (a ring) gains its whole inside.
    filled = np.zeros_like(mask)
    for y in np.unique(ys):
        row = np.nonzero(mask[y])[0]
        filled[y, row.min() : row.max() + 1] = True
    hollow = 1.0 - mask.sum() / max(1, filled.sum())
    outline = bool(hollow > 0.08)
    if outline:  # judge the shape by its filled outline
        fys, fxs = np.nonzero(filled)
        fill = _best_fill_ratio(fys.astype(np.float32), fxs.astype(np.float32))
    shape = "triangle" if fill < 0.64 else "circle" if fill < 0.9 else "square"
    return Classification(color, background, shape, outline, round(float(fill), 3))


def classifier_self_check(n: int = 300, seed: int = 0, size: int | tuple[int, int] = 64) -> float:
    """Accuracy of `classify` on the training data itself (filled and outlined) at `size`; should be 1.0."""
    rng = random.Random(seed)
    scenes = [random_scene(rng, outline=i % 2 == 1) for i in range(n)]
    correct = 0
    for scene, image in zip(scenes, render_batch(scenes, size), strict=True):
        c = classify(image)
        correct += (c.color, c.background, c.shape, c.outline) == (
            scene.color,
            scene.background,
            scene.shape,
            scene.outline,
        )
    return correct / n


def save_grid(images: list[Image.Image], labels: list[str], path: Path, columns: int = 8, scale: int = 2) -> None:
    """Images scaled up (nearest) in rows of `columns`, each with its label underneath."""
    side = images[0].width * scale
    rows = math.ceil(len(images) / columns)
    grid = Image.new("RGB", (columns * side, rows * (side + 14)), (255, 255, 255))
    pen = ImageDraw.Draw(grid)
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        x, y = (i % columns) * side, (i // columns) * (side + 14)
        grid.paste(image.resize((side, side), Image.Resampling.NEAREST), (x, y))
        pen.text((x + 2, y + side + 1), label, fill=(40, 40, 40))
    path.parent.mkdir(parents=True, exist_ok=True)
    grid.save(path)
