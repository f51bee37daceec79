"""The procedural world the embedded model is trained on: colors, shapes and how they are drawn.

The vocabulary and RGB values are fixed by the project (issue #4); the evaluation
(`models/eval.py`) and the app's vocabulary hint read them from here, so the words the
model was taught and the words we check are the same list.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import numpy as np
from PIL import Image, ImageDraw

COLORS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (40, 170, 60),
    "blue": (40, 80, 220),
    "yellow": (240, 210, 40),
    "orange": (245, 140, 30),
    "purple": (140, 60, 190),
    "white": (245, 245, 245),
    "black": (20, 20, 20),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle")
PROMPT_TEMPLATE = "a {color} {shape} on a {background} background"
IMAGE_SIZE = 64
SUPERSAMPLE = 4  # draw at 4x and downsample: anti-aliased but still sharp edges

# Geometry ranges, in fractions of the image side. The shape's extent stays within 30-70 %
# of the side; the centre moves a little; triangles turn by up to 15 degrees. Squares stay
# upright (the VAE saw them turned by up to 4 degrees), so that a bounding-box fill-ratio
# classifier tells them from circles: a square turned 10 degrees fills 0.75 of its box, like
# a circle (0.79), and one turned 45 degrees 0.5, like a triangle.
SIZE_RANGE = (0.34, 0.66)
MAX_OFFSET = 3 / 64
SQUARE_MAX_ROTATION = 0.0
VAE_SQUARE_MAX_ROTATION = 4.0  # the VAE's data: a little more variety than the model is asked for
TRIANGLE_MAX_ROTATION = 15.0
OUTLINE_WIDTH = 4 / 64


@dataclass(frozen=True)
class Scene:
    """One training image: what is drawn, where, and the prompt that describes it."""

    color: str
    shape: str
    background: str
    size: float  # fraction of the image side
    cx: float  # centre, fraction of the image side
    cy: float
    rotation: float  # degrees
    outline: bool = False

    @property
    def prompt(self) -> str:
        return PROMPT_TEMPLATE.format(color=self.color, shape=self.shape, background=self.background)


def prompt_for(color: str, shape: str, background: str) -> str:
    return PROMPT_TEMPLATE.format(color=color, shape=shape, background=background)


def random_scene(rng: random.Random, outline: bool = False, square_max_rotation: float = SQUARE_MAX_ROTATION) -> Scene:
    color = rng.choice(list(COLORS))
    background = rng.choice([c for c in COLORS if c != color])
    shape = rng.choice(SHAPES)
    max_rot = {"square": square_max_rotation, "triangle": TRIANGLE_MAX_ROTATION}.get(shape, 0.0)
    return Scene(
        color=color,
        shape=shape,
        background=background,
        size=rng.uniform(*SIZE_RANGE),
        cx=0.5 + rng.uniform(-MAX_OFFSET, MAX_OFFSET),
        cy=0.5 + rng.uniform(-MAX_OFFSET, MAX_OFFSET),
        rotation=rng.uniform(-max_rot, max_rot),
        outline=outline,
    )


def _polygon(scene: Scene, width: float, height: float) -> list[tuple[float, float]]:
    side = min(width, height)
    cx, cy = scene.cx * width, scene.cy * height
    half = scene.size * side / 2
    theta = math.radians(scene.rotation)
    if scene.shape == "square":
        corners = [(-half, -half), (half, -half), (half, half), (-half, half)]
    else:  # equilateral triangle pointing up, centroid at the centre, side = size
        radius = scene.size * side / math.sqrt(3)
        corners = [(radius * math.cos(math.radians(a)), radius * math.sin(math.radians(a))) for a in (-90, 30, 150)]
        # shift down so that the triangle's bounding box, not its centroid, is centred
        shift = (radius - radius / 2) / 2
        corners = [(x, y + shift) for x, y in corners]
    cos_t, sin_t = math.cos(theta), math.sin(theta)
    return [(cx + x * cos_t - y * sin_t, cy + x * sin_t + y * cos_t) for x, y in corners]


def draw(scene: Scene, size: int | tuple[int, int] = IMAGE_SIZE) -> Image.Image:
    """Render a scene as an RGB image of `size` x `size` pixels, or `(width, height)`: the shape's
    extent is a fraction of the shorter side, its centre a fraction of each side (one shape in the
    middle of a wide or tall picture, as a photographer frames it; the embedded model's size buckets)."""
    width, height = (size, size) if isinstance(size, int) else size
    big_w, big_h = width * SUPERSAMPLE, height * SUPERSAMPLE
    image = Image.new("RGB", (big_w, big_h), COLORS[scene.background])
    pen = ImageDraw.Draw(image)
    fg = COLORS[scene.color]
    width_px = max(1, round(OUTLINE_WIDTH * min(big_w, big_h))) if scene.outline else 0
    if scene.shape == "circle":
        r = scene.size * min(big_w, big_h) / 2
        box = [scene.cx * big_w - r, scene.cy * big_h - r, scene.cx * big_w + r, scene.cy * big_h + r]
        if width_px:
            pen.ellipse(box, outline=fg, width=width_px)
        else:
            pen.ellipse(box, fill=fg)
    else:
        points = _polygon(scene, big_w, big_h)
        if width_px:
            pen.polygon(points, outline=fg, width=width_px)
        else:
            pen.polygon(points, fill=fg)
    return image.resize((width, height), Image.Resampling.BOX)


def render_batch(scenes: list[Scene], size: int | tuple[int, int] = IMAGE_SIZE) -> np.ndarray:
    """Scenes → uint8 array (N, height, width, 3)."""
    return np.stack([np.asarray(draw(s, size)) for s in scenes])
