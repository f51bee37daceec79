"""The embedded default model: loads offline as a plain diffusers pipeline, follows prompts, LoRA works."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from devices import DeviceManager
from models.eval import classifier_self_check, classify, evaluate
from models.train.world import Scene, draw
from pipelines import GenerationRequest, ImagePipeline
from pipelines.run.options import DEFAULT_LORA_DIR, DEFAULT_MODEL
from pipelines.schema.request import nest

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle on a blue background"


@pytest.fixture(scope="module")
def embedded():
    return ImagePipeline.from_pretrained(DEFAULT_MODEL, DeviceManager("cpu"), lora_dir=DEFAULT_LORA_DIR)


def test_plain_diffusers_loads_it_offline():
    code = (
        "from diffusers import DiffusionPipeline\n"
        f"pipe = DiffusionPipeline.from_pretrained({str(DEFAULT_MODEL)!r})\n"
        "names = sorted(k for k, v in pipe.components.items() if v is not None)\n"
        "assert names == ['scheduler', 'text_encoder', 'tokenizer', 'unet', 'vae'], names\n"
        "import torch\n"
        "image = pipe('a red circle on a blue background', num_inference_steps=8,\n"
        "             generator=torch.Generator().manual_seed(0)).images[0]\n"
        "print(type(pipe).__name__, image.size)\n"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.strip().endswith("StableDiffusionPipeline (64, 64)")


def test_model_and_lora_fit_in_50_mb():
    files = [p for p in DEFAULT_MODEL.rglob("*") if p.is_file()] + list(DEFAULT_LORA_DIR.glob("*.safetensors"))
    assert sum(p.stat().st_size for p in files) <= 50 * 2**20
    assert not list(DEFAULT_MODEL.rglob("*.bin")) and not list(DEFAULT_MODEL.rglob("*.pt"))


def test_classifier_is_exact_on_training_images():
    assert classifier_self_check(200, seed=3) == 1.0


def test_classifier_is_exact_at_every_size_the_model_was_trained_at():
    buckets = [tuple(b) for b in json.loads((DEFAULT_MODEL / "vocabulary.json").read_text())["sizes"]["buckets"]]
    assert {(64, 64), (128, 128), (128, 64), (64, 128)} <= set(buckets)
    for size in buckets:
        assert classifier_self_check(40, seed=5, size=size) == 1.0, size


def test_the_size_sliders_stop_at_the_sizes_the_card_names_and_beyond_them_a_warning(embedded):
    from ui.form import model_props

    info = embedded.model_info()
    assert info.trained_sides == (64, 128) and info.max_side > 128  # hires fix still reaches 256
    for name in ("width", "height"):
        props = model_props(name, info, "generate")
        assert (props["minimum"], props["maximum"], props["value"]) == (64, 128, 64), props
    beyond = embedded.generate(GenerationRequest(PROMPT, steps=2, seed=1, width=192, height=96))
    assert any("outside the sizes this model was trained at (64-128 px a side)" in w for w in beyond.warnings)
    inside = embedded.generate(GenerationRequest(PROMPT, steps=2, seed=1, width=128, height=64))
    assert not any("outside the sizes" in w for w in inside.warnings), inside.warnings
    hires = GenerationRequest.parse(nest({"prompt": PROMPT, "steps": 2, "seed": 1, "width": 128, "height": 128,
                                          "hires_fix": True, "hires_upscaler": "Lanczos", "hires_steps": 1}))
    upscaled = embedded.generate(hires)  # 256 x 256 by hires fix: the way past the trained sizes, said nothing of
    assert upscaled.images[0].size == (256, 256) and not any("outside the sizes" in w for w in upscaled.warnings)


@pytest.mark.slow  # ~40 s on 2 cores
@pytest.mark.parametrize("size", [(128, 128), (128, 64), (64, 128), (96, 96)])
def test_draws_the_asked_scene_at_every_trained_size(embedded, size):
    """What a newcomer sees moving the size sliders: one shape, the asked colour on the asked background
    (16 fixed scenes; before the fine-tune about half were right at these sizes; the goal 0.9 is measured
    on 150 by `models.eval --width W --height H`: a sample of 16 ranges 0.75-0.94 over seeds at 128²)."""
    report = evaluate(embedded, n=16, seed=1, size=size)
    assert report["all_three"] >= 0.8, {k: v for k, v in report.items() if k not in ("rows", "_images")}


@pytest.mark.slow  # 43 s on 2 shared cores
def test_follows_prompts_on_a_fixed_sample(embedded):
    """A small fixed sample with thresholds a little under the goals (90/90/90/75 %)."""
    report = evaluate(embedded, n=40, seed=2024)
    assert report["foreground_color"] >= 0.85, report
    assert report["background_color"] >= 0.85, report
    assert report["shape"] >= 0.85, report
    assert report["all_three"] >= 0.65, report
    assert report["outline"] <= 0.1  # the base model draws filled shapes


def test_outline_lora_scale_zero_is_base_and_one_draws_outlines(embedded):
    request = dict(
        prompt=[
            "a red circle on a blue background",
            "a yellow square on a black background",
            "a white triangle on a green background",
            "a orange circle on a purple background",
        ],
        steps=embedded.vocabulary["default_steps"],
        seed=77,
    )
    base = embedded.generate(GenerationRequest(**request))
    zero = embedded.generate(GenerationRequest(**request, loras={"outline": 0.0}))
    full = embedded.generate(GenerationRequest(**request, loras={"outline": 1.0}))
    for a, b in zip(base.images, zero.images, strict=True):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert [classify(im).outline for im in base.images] == [False] * 4
    assert sum(classify(im).outline for im in full.images) >= 3
    colors = [(classify(im).color, classify(im).background) for im in full.images]
    assert (
        sum(
            c == w
            for c, w in zip(
                colors, [("red", "blue"), ("yellow", "black"), ("white", "green"), ("orange", "purple")], strict=True
            )
        )
        >= 3
    )


def test_image_to_image_keeps_the_input_layout(embedded):
    scene = Scene("red", "square", "blue", size=0.5, cx=0.5, cy=0.5, rotation=0.0)
    result = embedded.generate(
        GenerationRequest(
            prompt="a red square on a blue background",
            init_images=[draw(scene), draw(scene)],
            strength=0.5,
            steps=embedded.vocabulary["default_steps"],
            seed=5,
        )
    )
    for image in result.images:
        c = classify(image)
        assert (c.color, c.shape, c.background) == ("red", "square", "blue")
    assert isinstance(result.inputs[0], Image.Image)
