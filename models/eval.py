"""Prompt-adherence evaluation of the embedded model (and of its outline LoRA).

    python -m models.eval --n 200                    # random prompts and seeds, default steps
    python -m models.eval --n 200 --lora outline     # the LoRA: are shapes drawn as outlines?
    python -m models.eval --grid models/tiny-shapes/samples.png
    python -m models.eval --edit --n 200             # the instruction editor (models/eval_edit.py)

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

import argparse
import json
import logging
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw

from models.train.world import COLORS, SHAPES, prompt_for, random_scene, render_batch

PALETTE_NAMES = list(COLORS)
PALETTE = np.array([COLORS[c] for c in PALETTE_NAMES], dtype=np.float32)
MODEL_DIR = Path(__file__).resolve().parent / "tiny-shapes"
LORA_DIR = Path(__file__).resolve().parent / "loras"


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


def classifier_self_check(n: int = 300, seed: int = 0) -> float:
    """Accuracy of `classify` on the training data itself (filled and outlined); should be 1.0."""
    rng = random.Random(seed)
    scenes = [random_scene(rng, outline=i % 2 == 1) for i in range(n)]
    correct = 0
    for scene, image in zip(scenes, render_batch(scenes), strict=True):
        c = classify(image)
        correct += (c.color, c.background, c.shape, c.outline) == (
            scene.color,
            scene.background,
            scene.shape,
            scene.outline,
        )
    return correct / n


def random_prompts(n: int, seed: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        color = rng.choice(PALETTE_NAMES)
        background = rng.choice([c for c in PALETTE_NAMES if c != color])
        items.append((color, rng.choice(SHAPES), background))
    return items


def evaluate(
    pipeline,
    n: int = 200,
    seed: int = 0,
    steps: int | None = None,
    guidance: float | None = None,
    loras: dict[str, float] | None = None,
    batch: int = 8,
) -> dict:
    """Generate `n` random (prompt, seed) pairs through our ImagePipeline and score them."""
    from pipelines import GenerationRequest

    vocab = pipeline.vocabulary
    steps = steps or vocab.get("default_steps", 20)
    guidance = guidance if guidance is not None else vocab.get("default_guidance_scale", 4.0)
    wanted = random_prompts(n, seed)
    seeds = random.Random(seed + 1)
    rows, images = [], []
    start = time.perf_counter()
    for i in range(0, n, batch):
        chunk = wanted[i : i + batch]
        result = pipeline.generate(
            GenerationRequest(
                prompt=[prompt_for(*w) for w in chunk],
                num_images=1,
                steps=steps,
                guidance_scale=guidance,
                seed=seeds.randrange(2**31 - 64),
                loras=loras or {},
            )
        )
        for (color, shape, background), image, s in zip(chunk, result.images, result.seeds, strict=True):
            c = classify(image)
            rows.append(
                {
                    "prompt": prompt_for(color, shape, background),
                    "seed": s,
                    **asdict(c),
                    "want": {"color": color, "shape": shape, "background": background},
                }
            )
            images.append(image)
    seconds = time.perf_counter() - start

    def rate(test) -> float:
        return sum(1 for r in rows if test(r)) / len(rows)

    return {
        "n": n,
        "steps": steps,
        "guidance_scale": guidance,
        "loras": loras or {},
        "foreground_color": rate(lambda r: r["color"] == r["want"]["color"]),
        "background_color": rate(lambda r: r["background"] == r["want"]["background"]),
        "shape": rate(lambda r: r["shape"] == r["want"]["shape"]),
        "all_three": rate(lambda r: (r["color"], r["shape"], r["background"]) == tuple(r["want"].values())),
        "outline": rate(lambda r: r["outline"]),
        "seconds_per_image": seconds / n,
        "rows": rows,
        "_images": images,
    }


def save_grid(images: list[Image.Image], labels: list[str], path: Path, columns: int = 8, scale: int = 2) -> None:
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m models.eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="default", help="model folder (default: tiny-shapes, or the editor)")
    parser.add_argument("--n", type=int, default=200, help="number of random (prompt, seed) pairs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--guidance", type=float, default=None)
    parser.add_argument("--lora", default=None, help="LoRA name in models/loras (scale --lora-scale)")
    parser.add_argument("--lora-scale", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--edit", action="store_true", help="evaluate the instruction editor (models/eval_edit.py)")
    parser.add_argument("--image-guidance", type=float, default=None, help="--edit: image guidance (model default)")
    parser.add_argument(
        "--guidance-end", type=float, default=None, help="--edit: share of the steps with guidance (model default)"
    )
    parser.add_argument("--json", default=None, help="write the figures (and per-image rows) here")
    parser.add_argument("--grid", default=None, help="save a labelled grid of the first 48 images here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from pipelines.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    import torch

    from devices import DeviceManager
    from pipelines import ImagePipeline

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.edit:
        from models.eval_edit import run

        report = run(args)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        return 0
    args.model = str(MODEL_DIR) if args.model == "default" else args.model
    pipeline = ImagePipeline.from_pretrained(args.model, DeviceManager(), lora_dir=LORA_DIR)
    loras = {args.lora: args.lora_scale} if args.lora else None
    print(f"classifier on training images: {classifier_self_check():.3f}")
    report = evaluate(pipeline, args.n, args.seed, args.steps, args.guidance, loras)
    images = report.pop("_images")
    print(
        f"model {args.model}, {args.n} random prompts/seeds, {report['steps']} steps, CFG {report['guidance_scale']}"
        + (f", LoRA {loras}" if loras else "")
    )
    for key in ("foreground_color", "background_color", "shape", "all_three", "outline"):
        print(f"  {key:<17} {report[key] * 100:5.1f} %")
    print(f"  {'seconds/image':<17} {report['seconds_per_image']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.grid:
        labels = [f"{r['want']['color']} {r['want']['shape'][:3]}/{r['want']['background']}" for r in report["rows"]]
        save_grid(images[:48], labels[:48], Path(args.grid))
        print(f"grid: {args.grid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
