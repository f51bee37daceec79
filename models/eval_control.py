"""Evaluation of the embedded ControlNet (docs/controlnet.md has the figures).

    python -m models.eval --control --n 100      # placement by a silhouette and by a canny map, and the time

Scenes come from an RNG stream the training never drew, with the shape anywhere in the frame
(`models.train.control.offcentre_scene`), which the base model alone never draws. For each scene the
embedded model runs at one seed: without a unit, with the scene's silhouette (preprocessor none), and
with the canny map of the scene's picture (preprocessor canny, as a user uploading the picture gets).
Each image is judged by its silhouette IoU against the scene's (foreground: pixels far from the
background colour models.scoring classifies) and by models.scoring's colour and background. Weight 0
is checked to give the unit-less image bit for bit; time is one unit's and two units' against none.
"""

from __future__ import annotations

import random
import time
from typing import Any

import numpy as np
from PIL import Image

from models.scoring import classify
from models.train.control import CONTROL_OUT, offcentre_scene, silhouette
from models.train.world import COLORS, draw

FOREGROUND_DISTANCE = 60.0  # RGB distance from the background colour that counts as the shape


def foreground(image: Image.Image, background: str) -> np.ndarray:
    pixels = np.asarray(image.convert("RGB"), dtype=np.float32)
    return np.linalg.norm(pixels - np.array(COLORS[background], dtype=np.float32), axis=-1) > FOREGROUND_DISTANCE


def iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return float(np.logical_and(a, b).sum() / union) if union else 1.0


def _judge(images: list[Image.Image], scenes: list[Any]) -> dict[str, float]:
    ious, colours = [], []
    for image, scene in zip(images, scenes, strict=True):
        judged = classify(image)
        target = silhouette(scene)[..., 0] > 127
        ious.append(iou(foreground(image, judged.background), target))
        colours.append(judged.color == scene.color and judged.background == scene.background)
    return {"iou": float(np.mean(ious)), "colour_and_background": float(np.mean(colours))}


def run_control(args: Any) -> dict[str, Any]:
    from devices import DeviceManager
    from pipelines import GenerationRequest, ImagePipeline
    from pipelines.run.options import DEFAULT_MODEL

    pipeline = ImagePipeline.from_pretrained(DEFAULT_MODEL, DeviceManager("cpu"), runtime="torch")
    rng = random.Random(f"eval-control-{args.seed}")
    scenes = [offcentre_scene(rng) for _ in range(args.n)]
    steps, name = args.steps or 20, CONTROL_OUT.name

    def run(units_of) -> tuple[list[Image.Image], float]:
        images, start = [], time.perf_counter()
        for i, scene in enumerate(scenes):
            request = GenerationRequest(scene.prompt, steps=steps, seed=args.seed + i, controlnet=units_of(scene))
            images += pipeline.generate(request).images
        return images, time.perf_counter() - start

    plain, plain_s = run(lambda s: [])
    sil = lambda s: {"image": Image.fromarray(silhouette(s)), "model": name}  # noqa: E731
    placed, placed_s = run(lambda s: [sil(s)])
    edges, _ = run(lambda s: [{"image": draw(s), "module": "canny", "model": name}])
    two, two_s = run(lambda s: [sil(s), {"image": draw(s), "module": "canny", "model": name}])
    zero = [pipeline.generate(GenerationRequest(s.prompt, steps=steps, seed=args.seed + i,
                                                controlnet=[{**sil(s), "weight": 0}])).images[0]
            for i, s in enumerate(scenes[:8])]  # fmt: skip
    report = {
        "n": args.n, "steps": steps, "without": _judge(plain, scenes), "silhouette": _judge(placed, scenes),
        "canny": _judge(edges, scenes), "two_units": _judge(two, scenes),
        "weight_0_identical": all(a.tobytes() == b.tobytes() for a, b in zip(zero, plain[:8], strict=True)),
        "time_ratio_one_unit": placed_s / plain_s, "time_ratio_two_units": two_s / plain_s,
        "interleaved": {n: timing(pipeline, scenes[:12], steps, n, name) for n in (1, 4)},
    }  # fmt: skip
    print(f"{args.n} off-centre scenes, {steps} steps; silhouette IoU and colour+background right:")
    for key in ("without", "silhouette", "canny", "two_units"):
        print(f"  {key:<11} IoU {report[key]['iou']:.3f}   colour+background {report[key]['colour_and_background']:.3f}")
    print(f"  weight 0 identical to no unit: {report['weight_0_identical']}")
    print(f"  time against none: one unit {report['time_ratio_one_unit']:.2f}x, two units {report['time_ratio_two_units']:.2f}x")
    for n, ratios in report["interleaved"].items():
        print(f"  {n} image(s), medians of interleaved runs: one unit {ratios['one']:.2f}x, two units {ratios['two']:.2f}x")
    if args.grid:
        _grid(args.grid, scenes[:8], [plain, placed, edges])
    return report


def timing(pipeline: Any, scenes: list[Any], steps: int, images: int, name: str) -> dict[str, float]:
    """Seconds of one request with one and two units against none, as ratios of medians over `scenes`,
    the three kinds interleaved so that a slower minute of the machine weighs on each alike."""
    import statistics

    from pipelines import GenerationRequest

    def units(scene: Any, count: int) -> list[dict[str, Any]]:
        both = [{"image": Image.fromarray(silhouette(scene)), "model": name},
                {"image": draw(scene), "module": "canny", "model": name}]  # fmt: skip
        return both[:count]

    seconds: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for i, scene in enumerate([scenes[0], *scenes]):  # the first round warms up, not counted
        for count in seconds:
            start = time.perf_counter()
            pipeline.generate(GenerationRequest(scene.prompt, steps=steps, seed=1, num_images=images, controlnet=units(scene, count)))
            if i:
                seconds[count].append(time.perf_counter() - start)
    median = {count: statistics.median(values) for count, values in seconds.items()}
    return {"one": median[1] / median[0], "two": median[2] / median[0], "seconds_none": median[0]}


def _grid(path: str, scenes: list[Any], rows: list[list[Image.Image]]) -> None:
    """Maps, then each row's first images: without, silhouette, canny."""
    maps = [Image.fromarray(silhouette(s)) for s in scenes]
    all_rows = [maps, *[r[: len(scenes)] for r in rows]]
    canvas = Image.new("RGB", (64 * len(scenes), 64 * len(all_rows)))
    for y, row in enumerate(all_rows):
        for x, image in enumerate(row):
            canvas.paste(image.resize((64, 64)), (64 * x, 64 * y))
    canvas.save(path)
