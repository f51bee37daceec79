"""The moving-shapes world the embedded video model is trained on: one shape of the image world
(models.train.world: its colours, shapes and drawing) crossing a plain background in a named
direction, at constant speed, for the clip's frames.

"a red circle moving left on a blue background": the shape's centre goes from right of the middle
to left of it; "a red circle on a blue background" (no direction) stays put. The evaluation
(models.eval_video) reads the same tables, so the words taught and the words checked are one list.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import numpy as np

from models.train.world import COLORS, SHAPES, TRIANGLE_MAX_ROTATION, Scene, draw

# direction -> unit step of the centre (x right, y down: image coordinates)
DIRECTIONS: dict[str, tuple[int, int]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
STILL = ""  # no direction in the prompt: the shape stays where it is
VIDEO_PROMPT = "a {color} {shape} moving {direction} on a {background} background"
STILL_PROMPT = "a {color} {shape} on a {background} background"
FRAME_SIZE = 64  # pixels, square (the image world's size)
NUM_FRAMES = 17  # the clip length it is trained at: 4k+1 (Wan's VAE packs 4 frames per latent frame)
FPS = 8  # 17 frames at 8 fps: a two-second clip
SIZE_RANGE = (0.26, 0.36)  # the shape's extent, a fraction of the side: small enough to travel
TRAVEL = 0.44  # how far the centre moves over the clip, a fraction of the side
STILL_SHARE = 0.15  # of the training clips


@dataclass(frozen=True)
class Clip:
    """One training clip: a scene (its first frame) and where the shape goes."""

    scene: Scene
    direction: str  # a key of DIRECTIONS, or STILL

    @property
    def prompt(self) -> str:
        s = self.scene
        template = VIDEO_PROMPT if self.direction else STILL_PROMPT
        return template.format(color=s.color, shape=s.shape, background=s.background, direction=self.direction)

    def centre(self, t: float) -> tuple[float, float]:
        """The shape's centre at time t in 0..1 (fractions of the side)."""
        if not self.direction:
            return self.scene.cx, self.scene.cy
        dx, dy = DIRECTIONS[self.direction]
        return self.scene.cx + dx * TRAVEL * (t - 0.5), self.scene.cy + dy * TRAVEL * (t - 0.5)

    def frame(self, index: int, num_frames: int = NUM_FRAMES, size: int = FRAME_SIZE):
        """Frame `index` of `num_frames` as a PIL image."""
        cx, cy = self.centre(index / max(1, num_frames - 1))
        return draw(dataclasses.replace(self.scene, cx=cx, cy=cy), size)


def prompt_for(color: str, shape: str, background: str, direction: str = STILL) -> str:
    template = VIDEO_PROMPT if direction else STILL_PROMPT
    return template.format(color=color, shape=shape, background=background, direction=direction)


def random_clip(rng: random.Random, still_share: float = STILL_SHARE) -> Clip:
    color = rng.choice(list(COLORS))
    background = rng.choice([c for c in COLORS if c != color])
    shape = rng.choice(SHAPES)
    rotation = rng.uniform(-TRIANGLE_MAX_ROTATION, TRIANGLE_MAX_ROTATION) if shape == "triangle" else 0.0
    direction = STILL if rng.random() < still_share else rng.choice(list(DIRECTIONS))
    jitter = 0.04  # the path's middle moves a little off the centre
    scene = Scene(
        color=color,
        shape=shape,
        background=background,
        size=rng.uniform(*SIZE_RANGE),
        cx=0.5 + rng.uniform(-jitter, jitter),
        cy=0.5 + rng.uniform(-jitter, jitter),
        rotation=rotation,
    )
    return Clip(scene, direction)


def render_clip(clip: Clip, num_frames: int = NUM_FRAMES, size: int = FRAME_SIZE) -> np.ndarray:
    """A clip as uint8 (num_frames, size, size, 3)."""
    return np.stack([np.asarray(clip.frame(i, num_frames, size)) for i in range(num_frames)])


WORDS: tuple[str, ...] = ("moving", *DIRECTIONS)  # the words the video world adds to the image world's
