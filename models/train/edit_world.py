"""The instruction-editing world of `tiny-shapes-edit`: one scene, one instruction, one result.

Three kinds of edit, each changing one attribute of a tiny-shapes scene and keeping the others
(colours, shape, size, position):
- "color": the shape's colour ("make the shape red", "turn the circle blue", ...);
- "background": the background colour ("change the background to black", ...);
- "shape": the shape itself, same centre and size ("turn it into a triangle", ...).
An instruction that cannot apply keeps the image: the attribute already has that value ("make
it red" when it is red), or the new colour would equal the other one (a blue shape on a blue
background cannot be drawn in this world, whose scenes always differ in the two colours).

The phrasings are the vocabulary the model was taught; the app shows the patterns and the
examples, and the evaluation (`models/eval.py --edit`) draws from the same lists.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

from .world import COLORS, SHAPES, Scene, random_scene

KINDS: tuple[str, ...] = ("color", "background", "shape")
PHRASINGS: dict[str, tuple[str, ...]] = {
    "color": (
        "make the shape {value}",
        "make it {value}",
        "turn the {shape} {value}",
        "color it {value}",
        "paint the {shape} {value}",
        "change the color to {value}",
    ),
    "background": (
        "change the background to {value}",
        "make the background {value}",
        "turn the background {value}",
        "paint the background {value}",
    ),
    "shape": (
        "turn it into a {value}",
        "make it a {value}",
        "change the shape to a {value}",
        "turn the {shape} into a {value}",
    ),
}
WORDS: tuple[str, ...] = ("make", "the", "shape", "it", "turn", "color", "paint", "change", "to", "into")
EXAMPLES: tuple[str, ...] = (
    "make the shape red",
    "turn the circle blue",
    "change the background to black",
    "make the background white",
    "turn it into a triangle",
    "make it a square",
)


@dataclass(frozen=True)
class Edit:
    """One training or evaluation example: the scene, the instruction and the scene it asks for."""

    source: Scene
    kind: str
    value: str
    instruction: str
    target: Scene

    @property
    def applies(self) -> bool:
        return self.target != self.source


def apply(scene: Scene, kind: str, value: str) -> Scene:
    """The scene after the edit; the scene itself when the edit cannot apply."""
    if kind == "color":
        ok = value not in (scene.color, scene.background)
        return dataclasses.replace(scene, color=value) if ok else scene
    if kind == "background":
        ok = value not in (scene.background, scene.color)
        return dataclasses.replace(scene, background=value) if ok else scene
    if kind == "shape":
        if value == scene.shape:
            return scene
        return dataclasses.replace(scene, shape=value, rotation=0.0)  # same centre and size, upright
    raise ValueError(f"unknown edit kind {kind!r}")


def instruction_for(kind: str, value: str, scene: Scene, rng: random.Random) -> str:
    return rng.choice(PHRASINGS[kind]).format(value=value, shape=scene.shape)


def random_edit(rng: random.Random, noop_fraction: float = 0.1, kind: str | None = None) -> Edit:
    """A random scene and instruction; about `noop_fraction` of them cannot apply (kept image)."""
    scene = random_scene(rng)
    kind = kind or rng.choice(KINDS)
    current = {"color": scene.color, "background": scene.background, "shape": scene.shape}[kind]
    choices = list(SHAPES) if kind == "shape" else list(COLORS)
    if rng.random() < noop_fraction:
        blocked = [current] if kind == "shape" else [scene.color, scene.background]
        value = rng.choice(blocked)
    else:
        other = {"color": scene.background, "background": scene.color}.get(kind)
        value = rng.choice([c for c in choices if c not in (current, other)])
    return Edit(scene, kind, value, instruction_for(kind, value, scene, rng), apply(scene, kind, value))


def conflict_pair(rng: random.Random) -> tuple[Edit, Edit]:
    """A colour or background instruction naming the other region's colour ("make the background
    yellow" on a yellow shape), which cannot apply and keeps the image, and beside it the same
    scene and kind with a colour that applies ("make the background red"). The first is the
    hardest case to learn: the model must compare the instruction's colour with the image's other
    colour. The second keeps it from learning the wrong rule those alone also fit ("the named
    colour goes to the other region": with extra conflicts alone, some background edits went to
    the shape). The editor's last training phase draws extra such pairs."""
    scene = random_scene(rng)
    kind = rng.choice(("color", "background"))
    current, other = (scene.color, scene.background) if kind == "color" else (scene.background, scene.color)
    value = rng.choice([c for c in COLORS if c not in (current, other)])
    applies = Edit(scene, kind, value, instruction_for(kind, value, scene, rng), apply(scene, kind, value))
    return Edit(scene, kind, other, instruction_for(kind, other, scene, rng), scene), applies
