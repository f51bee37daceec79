"""Inpainting and outpainting evaluation of the embedded model `tiny-shapes`.

    python -m models.eval --inpaint --n 200 [--grid PATH] [--json PATH]
    python -m models.eval --outpaint --n 100 [--extend right=32] [--grid PATH] [--json PATH]
    # other settings than the defaults (to compare them):
    python -m models.eval --inpaint --n 200 --strength 0.75 --masked-content fill --inpaint-area "only masked"

Everything runs at the app's defaults unless asked otherwise: `pipelines.schema.inpaint.DEFAULT_STRENGTH`,
`Inpaint`'s defaults (mask blur 4, original content, whole picture, padding 32) and the model's
default steps and guidance. One request per scene (a request has one mask), seed `seed + i`.

Inpaint: random scenes of the training world (`random_scene`, drawn by `draw`); the mask is the
shape's bounding box, computed from the scene's geometry (circle: centre +- size/2; square and
triangle: the corners of `_polygon`), every pixel the shape touches, dilated by `MASK_DILATION`
pixels and clamped to the image. The prompt asks for another shape colour and/or shape on the
same background (the new colour is never the background's; at least one of colour and shape
differs from the scene's). Judged by models.scoring's classifier (no learned model):
- asked colour, asked shape, both at once, the background kept, and all three;
- outside the mask the output must equal the input: the mean and max absolute difference in
  /255 units over every pixel outside the mask, and over the pixels outside the mask dilated by
  3 x mask blur (beyond any feathered band; with the inside-only feathering both must be 0).

Outpaint: random scenes widened by `pipelines.imaging.inpaint.extend_canvas` (64 -> 96 px: right 32, and
left 16 + right 16), prompted with the scene's own prompt. A scene's new area counts as
background when BOTH hold:
- the median colour of the new area's pixels is nearest, among the palette `COLORS`, to the
  scene's background colour, and
- at least 90 % of the new area's pixels lie within `NEAR_BACKGROUND` (60, Euclidean RGB
  distance) of the background colour (the classifier's own "not background" threshold).
The original 64 px must be unchanged: max absolute difference 0.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter

from models.scoring import PALETTE_NAMES, classify, nearest_color, save_grid
from models.train.world import COLORS, IMAGE_SIZE, SHAPES, Scene, _polygon, draw, prompt_for, random_scene

MASK_DILATION = 4  # pixels around the shape's bounding box
NEAR_BACKGROUND = 60.0  # RGB distance to the background colour that still counts as background
NEAR_SHARE = 0.9  # share of the new area's pixels that must be that near
OUTPAINTS = {"right 32": {"right": 32}, "left 16 + right 16": {"left": 16, "right": 16}}


def shape_box(scene: Scene, side: int = IMAGE_SIZE) -> tuple[int, int, int, int]:
    """(x0, y0, x1, y1), x1 and y1 exclusive: every pixel the drawn shape touches (its exact extent
    from the scene's geometry, widened to whole pixels)."""
    if scene.shape == "circle":
        r = scene.size * side / 2
        x0, x1, y0, y1 = scene.cx * side - r, scene.cx * side + r, scene.cy * side - r, scene.cy * side + r
    else:
        points = _polygon(scene, side, side)
        xs, ys = [p[0] for p in points], [p[1] for p in points]
        x0, x1, y0, y1 = min(xs), max(xs), min(ys), max(ys)
    return math.floor(x0), math.floor(y0), math.ceil(x1), math.ceil(y1)


def box_mask(scene: Scene, dilation: int = MASK_DILATION, side: int = IMAGE_SIZE) -> Image.Image:
    """The inpaint mask ("L", 255 = repaint): the shape's box grown by `dilation`, clamped to the image."""
    x0, y0, x1, y1 = shape_box(scene, side)
    mask = np.zeros((side, side), dtype=np.uint8)
    mask[max(0, y0 - dilation) : min(side, y1 + dilation), max(0, x0 - dilation) : min(side, x1 + dilation)] = 255
    return Image.fromarray(mask, mode="L")


def new_target(rng: random.Random, scene: Scene) -> tuple[str, str]:
    """(colour, shape) to ask for: a colour other than the background, and not the scene's own
    colour and shape both."""
    while True:
        color = rng.choice([c for c in PALETTE_NAMES if c != scene.background])
        shape = rng.choice(SHAPES)
        if (color, shape) != (scene.color, scene.shape):
            return color, shape


def inpaint_items(n: int, seed: int) -> list[dict]:
    """`n` (scene, drawn image, mask, wanted attributes, prompt) items."""
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        scene = random_scene(rng)
        color, shape = new_target(rng, scene)
        want = {"color": color, "shape": shape, "background": scene.background}
        items.append(
            {"scene": scene, "image": draw(scene), "mask": box_mask(scene), "want": want, "prompt": prompt_for(**want)}
        )
    return items


def grow(mask: Image.Image, pixels: int) -> Image.Image:
    """`mask` dilated by `pixels` (a square neighbourhood)."""
    return mask.filter(ImageFilter.MaxFilter(2 * pixels + 1)) if pixels else mask


def abs_diff(a: Image.Image, b: Image.Image) -> np.ndarray:
    """|a - b| per pixel and channel, in /255 units (uint8 steps)."""
    return np.abs(np.asarray(a.convert("RGB"), dtype=np.int16) - np.asarray(b.convert("RGB"), dtype=np.int16))


def outside(diff: np.ndarray, mask: Image.Image) -> np.ndarray:
    """The rows of `diff` (H, W, 3) where `mask` is 0, as (N, 3)."""
    return diff[np.asarray(mask) == 0]


def _settings(pipeline, steps, guidance) -> tuple[int, float]:
    vocab = pipeline.vocabulary
    steps = steps or int(vocab.get("default_steps", 20))
    guidance = guidance if guidance is not None else float(vocab.get("default_guidance_scale", 4.0))
    return steps, guidance


def _inpaint_options(options: dict | None) -> dict:
    from pipelines.schema.inpaint import Inpaint

    defaults = {name: info.default for name, info in Inpaint.model_fields.items() if name != "mask"}
    return {**defaults, **(options or {})}


def _generate(pipeline, image, mask, prompt, steps, guidance, strength, options, seed) -> Image.Image:
    from pipelines import GenerationRequest
    from pipelines.schema.inpaint import Inpaint

    result = pipeline.generate(
        GenerationRequest(
            prompt=prompt, init_images=[image], strength=strength, steps=steps, guidance_scale=guidance,
            seed=seed, num_images=1, inpaint=Inpaint(mask=mask, **options),
        )
    )  # fmt: skip
    return result.images[0]


def _judge_inpaint(item: dict, out: Image.Image, seed: int, band: int, sums: dict) -> dict:
    """One inpaint's row (what was asked, what the classifier sees); adds its differences outside
    the mask (and outside the mask grown by `band`) to `sums` ([sum, count, max] each)."""
    diff = abs_diff(out, item["image"])
    for key, mask in (("mask", item["mask"]), ("band", grow(item["mask"], band))):
        values = outside(diff, mask)
        total = sums[key]
        total[0] += float(values.sum())
        total[1] += values.size
        total[2] = max(total[2], int(values.max()) if values.size else 0)
    c = classify(out)
    return {
        "prompt": item["prompt"],
        "seed": seed,
        "source": {"color": item["scene"].color, "shape": item["scene"].shape},
        "want": item["want"],
        "got": {"color": c.color, "shape": c.shape, "background": c.background},
        "outside_mask_max": int(outside(diff, item["mask"]).max(initial=0)),
    }


def evaluate_inpaint(
    pipeline,
    n: int = 200,
    seed: int = 0,
    steps: int | None = None,
    guidance: float | None = None,
    strength: float | None = None,
    options: dict | None = None,
) -> dict:
    """Inpaint `n` random scenes (new colour and/or shape in the shape's box) and score them."""
    from pipelines.schema.inpaint import DEFAULT_STRENGTH

    steps, guidance = _settings(pipeline, steps, guidance)
    strength = DEFAULT_STRENGTH if strength is None else strength
    options = _inpaint_options(options)
    band = 3 * options["mask_blur"]
    items = inpaint_items(n, seed)
    rows, outputs = [], []
    sums = {"mask": [0.0, 0, 0], "band": [0.0, 0, 0]}  # sum, count, max
    start = time.perf_counter()
    for i, item in enumerate(items):
        out = _generate(
            pipeline, item["image"], item["mask"], item["prompt"], steps, guidance, strength, options, seed + i
        )
        rows.append(_judge_inpaint(item, out, seed + i, band, sums))
        outputs.append(out)
    seconds = time.perf_counter() - start

    def rate(test) -> float:
        return round(sum(1 for r in rows if test(r["got"], r["want"])) / len(rows), 4)

    return {
        "n": n,
        "seed": seed,
        "steps": steps,
        "guidance_scale": guidance,
        "strength": strength,
        "inpaint": options,
        "mask_dilation": MASK_DILATION,
        "color": rate(lambda g, w: g["color"] == w["color"]),
        "shape": rate(lambda g, w: g["shape"] == w["shape"]),
        "color_and_shape": rate(lambda g, w: (g["color"], g["shape"]) == (w["color"], w["shape"])),
        "background_kept": rate(lambda g, w: g["background"] == w["background"]),
        "all_three": rate(lambda g, w: g == w),
        "outside_mask_mean": sums["mask"][0] / max(1, sums["mask"][1]),
        "outside_mask_max": sums["mask"][2],
        "band_px": band,
        "outside_band_mean": sums["band"][0] / max(1, sums["band"][1]),
        "outside_band_max": sums["band"][2],
        "seconds_per_image": round(seconds / n, 4),
        "rows": rows,
        "_images": [(it["image"], out) for it, out in zip(items, outputs, strict=True)],
    }


def judge_outpaint(scene: Scene, output: Image.Image, mask: Image.Image, original: Image.Image, box) -> dict:
    """One outpaint's verdict: is the new area the background (see the module's docstring), and
    is the original picture (at `box` in the output) unchanged."""
    pixels = np.asarray(output.convert("RGB"), dtype=np.float32)
    new = pixels[np.asarray(mask) > 0]
    bg = np.array(COLORS[scene.background], dtype=np.float32)
    median = nearest_color(np.median(new, axis=0))
    near = float((np.sqrt(((new - bg) ** 2).sum(-1)) <= NEAR_BACKGROUND).mean())
    kept = abs_diff(output.crop(box), original)
    return {
        "prompt": scene.prompt,
        "background": scene.background,
        "median_color": median,
        "near_share": round(near, 4),
        "is_background": median == scene.background and near >= NEAR_SHARE,
        "original_max_diff": int(kept.max()),
    }


def evaluate_outpaint(
    pipeline,
    n: int = 100,
    seed: int = 0,
    extend: dict | None = None,
    steps: int | None = None,
    guidance: float | None = None,
    strength: float | None = None,
    options: dict | None = None,
) -> dict:
    """Widen `n` random scenes by `extend` (extend_canvas's left/up/right/down) and score them."""
    from pipelines.imaging.inpaint import extend_canvas
    from pipelines.schema.inpaint import DEFAULT_STRENGTH

    steps, guidance = _settings(pipeline, steps, guidance)
    strength = DEFAULT_STRENGTH if strength is None else strength
    options = _inpaint_options(options)
    extend = extend or {"right": 32}
    rng = random.Random(seed)
    scenes = [random_scene(rng) for _ in range(n)]
    rows, images = [], []
    start = time.perf_counter()
    for i, scene in enumerate(scenes):
        original = draw(scene)
        canvas, mask = extend_canvas(original, **extend, step=pipeline.size_multiple)
        out = _generate(pipeline, canvas, mask, scene.prompt, steps, guidance, strength, options, seed + i)
        left, up = extend.get("left", 0), extend.get("up", 0)
        box = (left, up, left + original.width, up + original.height)
        rows.append({**judge_outpaint(scene, out, mask, original, box), "seed": seed + i})
        images.append((original, out))
    seconds = time.perf_counter() - start
    return {
        "n": n,
        "seed": seed,
        "extend": extend,
        "size": list(images[0][1].size),
        "steps": steps,
        "guidance_scale": guidance,
        "strength": strength,
        "inpaint": options,
        "background": round(sum(r["is_background"] for r in rows) / n, 4),
        "median_is_background": round(sum(r["median_color"] == r["background"] for r in rows) / n, 4),
        "near_share_median": float(np.median([r["near_share"] for r in rows])),
        "originals_unchanged": round(sum(r["original_max_diff"] == 0 for r in rows) / n, 4),
        "original_max_diff": max(r["original_max_diff"] for r in rows),
        "seconds_per_image": round(seconds / n, 4),
        "rows": rows,
        "_images": images,
    }


def parse_extend(text: str) -> dict[str, int]:
    """ "left=16,right=16" -> {"left": 16, "right": 16}."""
    out = {}
    for part in text.split(","):
        side, _, value = part.partition("=")
        out[side.strip()] = int(value)
    return out


def _square(image: Image.Image, side: int) -> Image.Image:
    """`image` centred on a white square of `side` (save_grid draws square cells)."""
    canvas = Image.new("RGB", (side, side), (255, 255, 255))
    canvas.paste(image, ((side - image.width) // 2, (side - image.height) // 2))
    return canvas


def save_pairs_grid(pairs, labels: list[str], path: Path, count: int = 24) -> None:
    """(input, output) pairs side by side, each output labelled; square cells of the widest side."""
    side = max(max(a.width, a.height, b.width, b.height) for a, b in pairs[:count])
    images, names = [], []
    for (a, b), label in list(zip(pairs, labels, strict=True))[:count]:
        images += [_square(a, side), _square(b, side)]
        names += ["input", label]
    save_grid(images, names, path, columns=8, scale=2)


def _options_from(args) -> dict:
    keys = {"masked_content": args.masked_content, "inpaint_area": args.inpaint_area, "mask_blur": args.mask_blur}
    return {k: v for k, v in keys.items() if v is not None}


def print_inpaint(report: dict) -> None:
    print(
        f"inpaint: {report['n']} scenes, {report['steps']} steps, CFG {report['guidance_scale']}, "
        f"strength {report['strength']}, {report['inpaint']}"
    )
    for key in ("color", "shape", "color_and_shape", "background_kept", "all_three"):
        print(f"  {key:<28} {report[key] * 100:5.1f} %")
    print(f"  {'outside mask: mean / max':<28} {report['outside_mask_mean']:.4f} / {report['outside_mask_max']} (/255)")
    band = f"outside mask + {report['band_px']} px"
    print(f"  {band:<28} {report['outside_band_mean']:.4f} / {report['outside_band_max']} (/255)")
    print(f"  {'seconds/image':<28} {report['seconds_per_image']:.3f}")


def print_outpaint(name: str, report: dict) -> None:
    print(f"outpaint {name} ({report['size'][0]}x{report['size'][1]}): {report['n']} scenes, {report['steps']} steps")
    print(f"  {'new area is background':<28} {report['background'] * 100:5.1f} %")
    print(f"  {'  median colour background':<28} {report['median_is_background'] * 100:5.1f} %")
    print(f"  {'  near share (median)':<28} {report['near_share_median'] * 100:5.1f} %")
    print(
        f"  {'originals unchanged':<28} {report['originals_unchanged'] * 100:5.1f} % (max diff {report['original_max_diff']})"
    )
    print(f"  {'seconds/image':<28} {report['seconds_per_image']:.3f}")


def run(args) -> dict:
    """`python -m models.eval --inpaint` and/or `--outpaint`: printed and returned (images left out),
    as {"inpaint": figures} and {"outpaint": {variant: figures}}."""
    from devices import DeviceManager
    from pipelines import ImagePipeline

    model = str(Path(__file__).resolve().parent / "tiny-shapes") if args.model == "default" else args.model
    pipeline = ImagePipeline.from_pretrained(model, DeviceManager())
    common = {"steps": args.steps, "guidance": args.guidance, "strength": args.strength, "options": _options_from(args)}
    report, pairs, labels = {}, [], []
    if args.inpaint:
        r = evaluate_inpaint(pipeline, args.n, args.seed, **common)
        pairs += r.pop("_images")[:24]
        print_inpaint(r)
        labels += [
            ("ok " if row["got"] == row["want"] else "X ") + f"{row['want']['color']} {row['want']['shape'][:3]}"
            for row in r["rows"][:24]
        ]
        report["inpaint"] = r
    if args.outpaint:
        report["outpaint"] = {}
        for name, extend in ({args.extend: parse_extend(args.extend)} if args.extend else OUTPAINTS).items():
            r = evaluate_outpaint(pipeline, args.n, args.seed, extend, **common)
            pairs += r.pop("_images")[:12]
            print_outpaint(name, r)
            labels += [("ok " if row["is_background"] else "X ") + name[:14] for row in r["rows"][:12]]
            report["outpaint"][name] = r
    if args.grid and pairs:
        save_pairs_grid(pairs, labels, Path(args.grid), count=len(pairs))
        print(f"grid: {args.grid}")
    return report
