"""Evaluation of the embedded IP-Adapter (docs/controlnet.md has the figures).

    python -m models.eval --ip-adapter --n 100    # the reference's colour carried over, scale 0, the time

Each case draws, from an RNG stream the training never drew, a target colour and a reference picture
of a scene with that colour (any shape, place, background). The embedded model then runs at one seed
with a prompt that names no colour ("a circle"): without an image prompt (what colour the model picks
alone: the baseline), with the reference at scale 1, and with the reference plus the embedded
ControlNet's silhouette unit (the two combined: colour from the picture, place from the map). The
shape's colour is read by models.scoring's classifier; chance is 1 in 8. Scale 0 is checked to give
the image of no image prompt bit for bit; time is one image prompt's against none.
"""

from __future__ import annotations

import random
import statistics
import time
from dataclasses import replace
from typing import Any

import numpy as np
from PIL import Image

from models.eval_control import foreground, iou
from models.scoring import classify
from models.train.control import CONTROL_OUT, offcentre_scene, silhouette
from models.train.ip_adapter import IP_ADAPTER_OUT, colourless_prompt
from models.train.world import COLORS, draw, random_scene


def cases(n: int, seed: int) -> list[tuple[Any, Any]]:
    """(scene to make, reference with the scene's colour): the scene's shape and place, the colour only
    in the reference."""
    rng = random.Random(f"eval-ip-adapter-{seed}")
    out = []
    for _ in range(n):
        scene = offcentre_scene(rng)
        reference = random_scene(rng)
        background = rng.choice([c for c in COLORS if c != scene.color])
        out.append((scene, replace(reference, color=scene.color, background=background)))
    return out


def run_ip_adapter(args: Any) -> dict[str, Any]:
    from devices import DeviceManager
    from pipelines import GenerationRequest, ImagePipeline
    from pipelines.run.options import DEFAULT_MODEL

    pipeline = ImagePipeline.from_pretrained(DEFAULT_MODEL, DeviceManager("cpu"), runtime="torch")
    pairs = cases(args.n, args.seed)
    steps, name = args.steps or 20, IP_ADAPTER_OUT.name

    def run(fields_of) -> list[Image.Image]:
        return [
            pipeline.generate(GenerationRequest(colourless_prompt(s, False), steps=steps, seed=args.seed + i, **fields_of(s, r))).images[0]
            for i, (s, r) in enumerate(pairs)
        ]  # fmt: skip

    prompt = lambda r, scale=1.0: [{"image": draw(r), "model": name, "scale": scale}]  # noqa: E731
    unit = lambda s: [{"image": Image.fromarray(silhouette(s)), "model": CONTROL_OUT.name}]  # noqa: E731
    alone = run(lambda s, r: {})
    carried = run(lambda s, r: {"ip_adapter": prompt(r)})
    both = run(lambda s, r: {"ip_adapter": prompt(r), "controlnet": unit(s)})
    zero = [  # the first 8 cases at scale 0
        pipeline.generate(GenerationRequest(colourless_prompt(s, False), steps=steps, seed=args.seed + i, ip_adapter=prompt(r, 0.0))).images[0]
        for i, (s, r) in enumerate(pairs[:8])
    ]  # fmt: skip
    report = {
        "n": args.n, "steps": steps,
        "colour_match_without": _colour_rate(alone, pairs), "colour_match": _colour_rate(carried, pairs),
        "with_controlnet": {"colour_match": _colour_rate(both, pairs), "iou": _iou(both, pairs), "iou_image_prompt_alone": _iou(carried, pairs)},
        "scale_0_identical": all(a.tobytes() == b.tobytes() for a, b in zip(zero, alone, strict=False)),
        "time_ratio": timing(pipeline, pairs[:12], steps, name),
    }  # fmt: skip
    print(f"{args.n} references, prompts naming no colour, {steps} steps; the shape's colour is the reference's:")
    print(f"  without an image prompt {report['colour_match_without']:.2f} (chance 0.125)   with {report['colour_match']:.2f}")
    both_r = report["with_controlnet"]
    print(f"  with the ControlNet silhouette too: colour {both_r['colour_match']:.2f}, IoU {both_r['iou']:.3f} "
          f"(image prompt alone: IoU {both_r['iou_image_prompt_alone']:.3f})")  # fmt: skip
    print(f"  scale 0 identical to no image prompt: {report['scale_0_identical']}")
    print(f"  time against none (medians, interleaved): {report['time_ratio']:.2f}x")
    if args.grid:
        _grid(args.grid, pairs[:8], [alone, carried, both])
    return report


def _colour_rate(images: list[Image.Image], pairs: list[tuple[Any, Any]]) -> float:
    return float(np.mean([classify(image).color == s.color for image, (s, _) in zip(images, pairs, strict=True)]))


def _iou(images: list[Image.Image], pairs: list[tuple[Any, Any]]) -> float:
    scores = [iou(foreground(image, classify(image).background), silhouette(s)[..., 0] > 127) for image, (s, _) in zip(images, pairs, strict=True)]
    return float(np.mean(scores))


def timing(pipeline: Any, pairs: list[tuple[Any, Any]], steps: int, name: str) -> float:
    """One image prompt's seconds against none, as a ratio of medians, the two interleaved."""
    from pipelines import GenerationRequest

    seconds: dict[bool, list[float]] = {False: [], True: []}
    for i, (s, r) in enumerate([pairs[0], *pairs]):  # the first round warms up, not counted
        for with_prompt in seconds:
            fields = {"ip_adapter": [{"image": draw(r), "model": name}]} if with_prompt else {}
            start = time.perf_counter()
            pipeline.generate(GenerationRequest(colourless_prompt(s, False), steps=steps, seed=1, **fields))
            if i:
                seconds[with_prompt].append(time.perf_counter() - start)
    return statistics.median(seconds[True]) / statistics.median(seconds[False])


def _grid(path: str, pairs: list[tuple[Any, Any]], rows: list[list[Image.Image]]) -> None:
    """References, then each row's first images: alone, with the image prompt, with the ControlNet too."""
    all_rows = [[draw(r) for _, r in pairs], *[row[: len(pairs)] for row in rows]]
    canvas = Image.new("RGB", (64 * len(pairs), 64 * len(all_rows)))
    for y, row in enumerate(all_rows):
        for x, image in enumerate(row):
            canvas.paste(image.resize((64, 64)), (64 * x, 64 * y))
    canvas.save(path)
