"""The embedded model's card (`vocabulary.json`): the words it understands, its defaults and the sizes it
was trained at; the app reads it (the prompt hint, the size sliders, tiled VAE, the detailer's defaults).
Written by `export` (train.py) and `sizes-export` (sizes.py), so apart from both (no import cycle)."""

from __future__ import annotations

import json
from pathlib import Path

from .world import COLORS, IMAGE_SIZE, PROMPT_TEMPLATE, SHAPES


def write_vocabulary(folder: Path, sizes: tuple[tuple[int, int], ...] = ()) -> None:
    """The words this model understands (the app shows them beside the prompt box), and the sizes
    (width, height) it was fine-tuned at beyond 64² (models/train/sizes.py; the UI's size sliders)."""
    vocab = {
        "pattern": PROMPT_TEMPLATE,
        "colors": list(COLORS),
        "shapes": list(SHAPES),
        "loras": {"outline": "draws the shape as an outline instead of filled"},
        "examples": [
            PROMPT_TEMPLATE.format(color=c, shape=s, background=b)
            for c, s, b in [
                ("red", "circle", "blue"),
                ("yellow", "triangle", "purple"),
                ("white", "square", "black"),
                ("green", "circle", "orange"),
            ]
        ],
        "default_steps": 20,
        "default_guidance_scale": 4.0,
        # the VAE saw 64-px pictures only: larger ones decode in tiles of that size (its mid-block attention
        # mixes the scenes of a wider latent; regional prompts on 128x64: 19/24 halves right untiled, 23/24 tiled)
        "tiled_vae_pixels": IMAGE_SIZE * IMAGE_SIZE,
        # the detailer's defaults here (pipelines.schema.detailer): a small shape drawn wrong is re-drawn whole,
        # from a tight crop (60 small-shape scenes: 0.4 / 32 px kept ADetailer's faults, 0.9 / 8 px fixed them)
        "detailer": {"ad_denoising_strength": 0.9, "ad_inpaint_only_masked_padding": 8},
    }
    if sizes:
        sides = [side for size in sizes for side in size]
        vocab["sizes"] = {"min_side": min(sides), "max_side": max(sides), "buckets": [list(size) for size in sizes]}
    (folder / "vocabulary.json").write_text(json.dumps(vocab, indent=2) + "\n")
