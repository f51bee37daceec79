"""Evaluation of regional prompts and of the detailer pass on the embedded model (figures: docs/regions-detailer-wildcards.md).

    python -m models.eval --regions --n 60                  # two columns on 128x64, each its own scene
    python -m models.eval --regions --n 60 --method Attention
    python -m models.eval --regions --n 60 --method joined  # the same two scenes joined as one prompt
    python -m models.eval --detailer --n 60                 # small shapes repaired, pixels outside kept

`--regions`: each scene is two random "a {colour} {shape} on a {background} background" prompts, the
left one and the right one, on a 128x64 canvas split into two columns (`ADDCOL`), seed i for scene i.
Each half is judged by models.scoring's classifier without the 4 pixels next to the seam (the VAE
blends the two backgrounds there; the shapes world never draws a shape within 11 % of an edge).
A scene is right when both halves have colour, shape and background right. Time is against one plain
128x64 generation of the same joined prompt (medians over the scenes, after a warm-up).

`--detailer`: each scene is one random prompt drawn at 128x128 with a small silhouette (10-19 % of the
side, anywhere) for the embedded ControlNet, which is where the embedded model draws its shape badly;
the same request is run without and with the detailer pass (the embedded detector `shapes-segformer`).
The shape is judged on a crop of twice its silhouette's box around it: colour and kind right, before and
after. Outside the detected regions dilated by `ad_dilate_erode` (what the pass may touch) the two
images must be equal within 1/255.
"""

from __future__ import annotations

import random
import statistics
import time
from typing import Any

import numpy as np
from PIL import Image

from models.scoring import classify
from models.train.world import COLORS, SHAPES, Scene, draw, prompt_for

SEAM = 4  # pixels left out on each side of the seam
SMALL = (0.10, 0.19)  # the detailer scenes' silhouette side, fraction of 128 px


def _scene(rng: random.Random) -> tuple[str, str, str]:
    colour = rng.choice(list(COLORS))
    return colour, rng.choice(SHAPES), rng.choice([c for c in COLORS if c != colour])


def _pipeline(args: Any):
    from devices import DeviceManager
    from pipelines import ImagePipeline

    return ImagePipeline.from_pretrained(device_manager=DeviceManager(), **({"runtime": args.runtime} if args.runtime else {}))


def run_regions(args: Any) -> dict[str, Any]:
    from pipelines import GenerationRequest

    pipeline = _pipeline(args)
    method = args.method or "Latent"
    rng = random.Random(args.seed)
    right = halves = 0
    times: list[float] = []
    plain: list[float] = []
    pipeline.generate(GenerationRequest("a red circle on a blue background", width=128, height=64, seed=0))  # warm-up
    for i in range(args.n):
        scenes = [_scene(rng), _scene(rng)]
        joined = f"{prompt_for(*scenes[0])} and {prompt_for(*scenes[1])}"
        if method == "joined":
            request = GenerationRequest(joined, width=128, height=64, seed=i)
        else:
            regional = f"{prompt_for(*scenes[0])} ADDCOL {prompt_for(*scenes[1])}"
            request = GenerationRequest(regional, width=128, height=64, seed=i, regions={"regional_prompts": True, "region_method": method})
        start = time.perf_counter()
        image = np.asarray(pipeline.generate(request).images[0])
        times.append(time.perf_counter() - start)
        if method != "joined":
            start = time.perf_counter()
            pipeline.generate(GenerationRequest(joined, width=128, height=64, seed=i))
            plain.append(time.perf_counter() - start)
        good = [_judge(half, want) for half, want in zip((image[:, : 64 - SEAM], image[:, 64 + SEAM :]), scenes, strict=True)]
        halves += sum(good)
        right += all(good)
    report = {"method": method, "n": args.n, "both_right": right / args.n, "halves_right": halves / (2 * args.n),
              "seconds": statistics.median(times)}  # fmt: skip
    if plain:
        report["plain_seconds"] = statistics.median(plain)
        report["time_ratio"] = report["seconds"] / report["plain_seconds"]
    print(report)
    return report


def _judge(pixels: np.ndarray, want: tuple[str, str, str]) -> bool:
    found = classify(pixels)
    return (found.color, found.shape, found.background) == want


def run_detailer(args: Any) -> dict[str, Any]:
    from pipelines import GenerationRequest
    from pipelines.imaging.detailer import dilated

    pipeline = _pipeline(args)
    rng = random.Random(args.seed)
    before_ok = after_ok = 0
    worst_outside = 0
    detected = 0
    pass_values = {"ad_model": "shapes-segformer"}
    if args.strength is not None:
        pass_values["ad_denoising_strength"] = args.strength
    if args.padding is not None:
        pass_values["ad_inpaint_only_masked_padding"] = args.padding
    for i in range(args.n):
        colour, shape, background = _scene(rng)
        side = rng.uniform(*SMALL)
        cx, cy = (rng.uniform(side / 2 + 0.05, 1 - side / 2 - 0.05) for _ in range(2))
        silhouette = draw(Scene("white", shape, "black", side, cx, cy, 0.0), 128)
        base = {"prompt": prompt_for(colour, shape, background), "width": 128, "height": 128, "seed": i,
                "controlnet": [{"image": silhouette, "model": "shapes-silhouette", "module": "none"}]}  # fmt: skip
        before = pipeline.generate(GenerationRequest(**base)).images[0]
        after_result = pipeline.generate(GenerationRequest(**base, detailer=pass_values))
        after = after_result.images[0]
        box = silhouette.convert("L").point(lambda v: 255 if v > 127 else 0).getbbox()
        before_ok += _shape_right(before, box, colour, shape)
        after_ok += _shape_right(after, box, colour, shape)
        values = after_result.metadata[0]
        regions = pipeline.detectors.detect("shapes-segformer", before, values["ad_confidence"])
        detected += bool(regions)
        touched = np.zeros((128, 128), bool)
        for region in regions:
            touched |= np.asarray(dilated(region.mask, values["ad_dilate_erode"])) > 127
        diff = np.abs(np.asarray(before, np.int16) - np.asarray(after, np.int16)).max(axis=2)
        worst_outside = max(worst_outside, int(diff[~touched].max()) if (~touched).any() else 0)
    report = {"n": args.n, "shape_and_colour_before": before_ok / args.n, "shape_and_colour_after": after_ok / args.n,
              "detected": detected / args.n, "max_diff_outside": worst_outside, "pass": pass_values}  # fmt: skip
    print(report)
    return report


def _shape_right(image: Image.Image, box: tuple[int, int, int, int], colour: str, shape: str) -> bool:
    """The shape's colour and kind on a crop of twice its silhouette's box (its background at the crop's border)."""
    x0, y0, x1, y1 = box
    w, h = x1 - x0, y1 - y0
    crop = image.crop((max(0, x0 - w // 2), max(0, y0 - h // 2), min(128, x1 + w // 2), min(128, y1 + h // 2)))
    found = classify(np.asarray(crop.resize((64, 64), Image.Resampling.LANCZOS)))
    return (found.color, found.shape) == (colour, shape)
