"""The inpaint/outpaint evaluation (models/eval_inpaint.py) on a handful of scenes of the embedded
model: what must always hold (pixels outside the mask, the outpainted originals, the report's
keys), not the model-quality rates (those need the full n; docs/embedded-models.md)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from models import eval_inpaint as ev
from models.train.world import COLORS, draw, random_scene

STEPS = 4


@pytest.fixture(scope="module")
def pipeline():
    import torch

    from devices import DeviceManager
    from pipelines import ImagePipeline

    torch.set_num_threads(1)
    return ImagePipeline.from_pretrained(str(ev.Path(ev.__file__).parent / "tiny-shapes"), DeviceManager("cpu"))


def test_the_mask_covers_the_drawn_shape_and_its_margin():
    rng = random.Random(3)
    for _ in range(200):
        scene = random_scene(rng)
        pixels = np.asarray(draw(scene)).astype(int)
        touched = np.abs(pixels - np.array(COLORS[scene.background])).sum(-1) > 0
        x0, y0, x1, y1 = ev.shape_box(scene)
        ys, xs = np.nonzero(touched)
        assert (x0, y0, x1, y1) == (xs.min(), ys.min(), xs.max() + 1, ys.max() + 1)
        mask = np.asarray(ev.box_mask(scene)) > 0
        assert mask[touched].all()
        assert mask[max(0, y0 - 4) : y1 + 4, max(0, x0 - 4) : x1 + 4].all() and mask.sum() == (
            (min(64, x1 + 4) - max(0, x0 - 4)) * (min(64, y1 + 4) - max(0, y0 - 4))
        )


def test_the_asked_attributes_differ_and_keep_the_background():
    for item in ev.inpaint_items(300, seed=5):
        want, scene = item["want"], item["scene"]
        assert want["background"] == scene.background and want["color"] != scene.background
        assert (want["color"], want["shape"]) != (scene.color, scene.shape)


def test_inpaint_keeps_every_pixel_outside_the_mask(pipeline):
    report = ev.evaluate_inpaint(pipeline, n=6, seed=0, steps=STEPS)
    assert {
        "n", "steps", "guidance_scale", "strength", "inpaint", "color", "shape", "color_and_shape",
        "background_kept", "all_three", "outside_mask_mean", "outside_mask_max", "outside_band_mean",
        "outside_band_max", "band_px", "seconds_per_image", "rows",
    } <= set(report)  # fmt: skip
    assert report["strength"] == 1.0 and report["inpaint"]["mask_blur"] == 4 and report["band_px"] == 12
    assert report["outside_mask_max"] == 0 and report["outside_mask_mean"] == 0.0
    assert report["outside_band_max"] == 0
    assert len(report["rows"]) == 6 and all(r["outside_mask_max"] == 0 for r in report["rows"])
    for rate in ("color", "shape", "color_and_shape", "background_kept", "all_three"):
        assert 0 <= report[rate] <= 1
    assert len(report["_images"]) == 6


@pytest.mark.parametrize("extend", [{"right": 32}, {"left": 16, "right": 16}])
def test_outpaint_keeps_the_original_picture(pipeline, extend):
    report = ev.evaluate_outpaint(pipeline, n=4, seed=0, extend=extend, steps=STEPS)
    assert report["size"] == [96, 64]
    assert report["original_max_diff"] == 0 and report["originals_unchanged"] == 1.0
    assert {"background", "median_is_background", "near_share_median", "rows"} <= set(report)
    assert all(r["original_max_diff"] == 0 for r in report["rows"])


def test_a_new_area_of_the_background_colour_counts_and_another_does_not():
    from PIL import Image

    scene = random_scene(random.Random(0))
    original = draw(scene)
    canvas = Image.new("RGB", (96, 64), COLORS[scene.background])
    canvas.paste(original, (0, 0))
    mask = Image.new("L", (96, 64), 0)
    mask.paste(255, (64, 0, 96, 64))
    assert ev.judge_outpaint(scene, canvas, mask, original, (0, 0, 64, 64))["is_background"]
    other = next(c for c in COLORS if c != scene.background)
    canvas.paste(COLORS[other], (64, 0, 96, 64))
    verdict = ev.judge_outpaint(scene, canvas, mask, original, (0, 0, 64, 64))
    assert not verdict["is_background"] and verdict["original_max_diff"] == 0


def test_the_command_line_writes_the_report(tmp_path):
    import json

    from models.eval import main

    out = tmp_path / "r.json"
    args = ["--n", "2", "--steps", "2", "--threads", "1", "--json", str(out), "--grid", str(tmp_path / "g.png")]
    assert main(["--inpaint", "--outpaint", "--extend", "right=16", *args]) == 0
    report = json.loads(out.read_text())
    assert report["inpaint"]["n"] == 2 and report["outpaint"]["right=16"]["size"] == [80, 64]
    assert (tmp_path / "g.png").exists()
