"""A1111's prompt language on the embedded model: do weights, long prompts and prompt editing reach
the image? (`python -m models.eval --prompts --n 40`; pipelines.prompts.plan)

For each seed and a random shape and background (never red), the same request is made with:
- `a (red:W) {shape} ...` for W in 0.5, 1.0 (the plain prompt, bit-identical) and 1.5: the
  foreground's distance to pure red is measured (models.scoring's foreground pixels), and
  "away" counts the seeds where W = 0.5 moves it further from red than the plain prompt does;
  "kept red" counts the seeds where W = 1.5 is still classified red;
- a long prompt whose first window (14 tokens on this model) names no colour and whose colour
  is named only after it: "drawn" counts the seeds classified with that colour;
- `a [red:blue:0.5] {shape} ...`: "edit differs" counts the seeds where it differs from both the
  plain red and the plain blue image (mean pixel difference over 2/255): the switch reached the image.
"""

from __future__ import annotations

import argparse
import random
from typing import Any

import numpy as np

from models.scoring import classify
from models.train.world import COLORS, SHAPES

BACKGROUNDS = [c for c in COLORS if c not in ("red", "black", "white")]
FILLER = "a {shape} on a {background} background, a {shape} on a {background} background, "  # 14 tokens, no colour


def _red_distance(image: Any) -> float:
    """How far the shape's pixels are from pure red (the median of the pixels far from the background)."""
    pixels = np.asarray(image, dtype=np.float32)[..., :3]
    background = np.median(np.concatenate([pixels[:3].reshape(-1, 3), pixels[-3:].reshape(-1, 3)]), axis=0)
    far = np.sqrt(((pixels - background) ** 2).sum(-1)) > 60
    shape = np.median(pixels[far], axis=0) if far.sum() >= 4 else background
    return float(np.sqrt(((shape - np.array(COLORS["red"], np.float32)) ** 2).sum()))


def run(args: argparse.Namespace) -> dict[str, Any]:
    from devices import DeviceManager
    from pipelines import ImagePipeline
    from pipelines.run.options import DEFAULT_MODEL
    from pipelines.schema.request import GenerationRequest

    pipeline = ImagePipeline.from_pretrained(str(DEFAULT_MODEL), DeviceManager())  # the embedded model
    steps = args.steps or 20
    rng = random.Random(args.seed)
    counts = {"away": 0, "kept_red": 0, "plain_red": 0, "long_drawn": 0, "edit_differs": 0, "identical_at_1": 0}
    for i in range(args.n):
        shape, background = rng.choice(SHAPES), rng.choice(BACKGROUNDS)
        tail = f"{shape} on a {background} background"

        def image(prompt: str, seed: int = args.seed * 1000 + i) -> Any:
            request = GenerationRequest(prompt=prompt, steps=steps, seed=seed, guidance_scale=args.guidance)
            return pipeline.generate(request).images[0]

        plain, low, one, high = (image(f"a {w} {tail}") for w in ("red", "(red:0.5)", "(red:1.0)", "(red:1.5)"))
        counts["identical_at_1"] += np.array_equal(np.asarray(plain), np.asarray(one))
        counts["plain_red"] += classify(plain).color == "red"
        counts["away"] += _red_distance(low) > _red_distance(plain)
        counts["kept_red"] += classify(high).color == "red"
        color = rng.choice([c for c in ("red", "green", "blue", "yellow", "purple", "orange") if c != background])
        long = FILLER.format(shape=shape, background=background) + f"a {color} {tail}"
        counts["long_drawn"] += classify(image(long)).color == color
        edited, blue = (np.asarray(image(p), dtype=np.float32) for p in (f"a [red:blue:0.5] {tail}", f"a blue {tail}"))
        apart = [np.abs(edited - np.asarray(other, dtype=np.float32)).mean() > 2 for other in (plain, blue)]
        counts["edit_differs"] += all(apart)
    report = {key: value / args.n for key, value in counts.items()}
    report.update(n=args.n, steps=steps)
    print(f"embedded model, {args.n} seeds, {steps} steps")
    for key in counts:
        print(f"  {key:<15} {report[key] * 100:5.1f} %")
    return report
