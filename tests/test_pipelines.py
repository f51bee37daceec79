"""ImagePipeline on a tiny local model: loading, validation, seeds, batching, OOM, cancel, LoRA, img2img, metadata, CLI."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from devices import DeviceManager
from pipelines import (
    GenerationRequest,
    ImagePipeline,
    LoraError,
    ModelLoadError,
    OutOfMemoryError,
    read_metadata,
    save_images,
)
from pipelines.sampling.samplers import schedule_type
from pipelines.schema.request import RequestError, RequestLimits, validate
from pipelines.weights.hashing import lora_hash, short_hash

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle on a blue background"


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory, tiny_model_dir):
    """Two peft LoRAs for the tiny model, saved in diffusers format with save_lora_weights."""
    from diffusers import StableDiffusionPipeline
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    folder = tmp_path_factory.mktemp("loras")
    for name, seed in (("style_a", 1), ("style_b", 2)):
        pipe = StableDiffusionPipeline.from_pretrained(tiny_model_dir)
        torch.manual_seed(seed)
        pipe.unet.add_adapter(
            LoraConfig(r=4, lora_alpha=4, init_lora_weights=False, target_modules=["to_q", "to_k", "to_v", "to_out.0"])
        )
        StableDiffusionPipeline.save_lora_weights(
            folder, unet_lora_layers=get_peft_model_state_dict(pipe.unet), weight_name=f"{name}.safetensors"
        )
    return folder


@pytest.fixture(scope="module")
def pipeline(tiny_model_dir, lora_dir):
    return ImagePipeline.from_pretrained(tiny_model_dir, DeviceManager("cpu"), lora_dir=lora_dir, micro_batch=8)


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image).astype(np.int16)


def assert_same_image(a: Image.Image, b: Image.Image) -> None:
    """Same seed, same image. Batched kernels sum in another order than single ones, so a
    handful of pixels may differ by one 8-bit level (measured: at most 1 pixel of 1,024 at
    3 steps, none at 20); anything more is a seeding bug."""
    diff = np.abs(pixels(a) - pixels(b))
    assert diff.max() <= 1 and (diff > 0).mean() < 0.01, f"max diff {diff.max()}, {(diff > 0).sum()} pixels"


def with_micro_batch(pipeline: ImagePipeline, size: int) -> ImagePipeline:
    """The same loaded weights, with another MICRO_BATCH."""
    return ImagePipeline(pipeline.pipe, pipeline.dm, pipeline.options.updated(micro_batch=size), pipeline.source)


def request(**kwargs) -> GenerationRequest:
    kwargs.setdefault("prompt", PROMPT)
    kwargs.setdefault("steps", 3)
    kwargs.setdefault("seed", 7)
    return GenerationRequest(**kwargs)


# ---------------------------------------------------------------- loading
def test_loads_folder_on_manager_device(pipeline):
    assert pipeline.dm.device == torch.device("cpu")
    assert pipeline.diffusers_pipeline.unet.dtype == torch.float32
    assert pipeline.attention_applied["unet"] == "AttnProcessor2_0"
    assert pipeline.load_seconds > 0
    assert pipeline.default_size == (32, 32)


def test_missing_folder_is_one_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        ImagePipeline.from_pretrained(str(tmp_path / "nope"), DeviceManager("cpu"))
    with pytest.raises(ModelLoadError, match=r"no model_index\.json"):
        ImagePipeline.from_pretrained(str(tmp_path), DeviceManager("cpu"))


def test_offline_hub_id_says_how_to_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelLoadError) as err:
        ImagePipeline.from_pretrained("someone/not-cached-model", DeviceManager("cpu"))
    message = str(err.value)
    assert "could not be found locally" in message and "MODEL_ID" in message
    assert "\n" not in message


def test_hub_ids_with_dots_are_hub_ids_not_missing_files():
    """Was: the dot counted as a file suffix, so the sdxl-base, sd3.5 and FLUX.1 recipes' repositories were
    refused as missing files before any download was tried (online too)."""
    from pipelines.weights.loading import looks_like_path

    for hub_id in ("stabilityai/stable-diffusion-xl-base-1.0", "black-forest-labs/FLUX.1-dev", "Qwen/Qwen-Image"):
        assert not looks_like_path(hub_id), hub_id
    for path in ("model.safetensors", "flux1-dev-Q4_K_S.gguf", "./tiny", "~/models/x", "a/b/c", "C:\\models\\x"):
        assert looks_like_path(path), path


def test_single_file_must_be_safetensors(tmp_path):
    ckpt = tmp_path / "model.ckpt"
    ckpt.write_bytes(b"not really")
    with pytest.raises(ModelLoadError, match=r"only \.safetensors"):
        ImagePipeline.from_pretrained(str(ckpt), DeviceManager("cpu"))


# ---------------------------------------------------------------- validation: one test per rule
@pytest.mark.parametrize(
    ("changes", "field", "value"),
    [
        ({"prompt": ""}, "prompt", "must be non-empty text"),
        ({"prompt": "   "}, "prompt", "must be non-empty text"),
        ({"prompt": []}, "prompt", "empty list"),
        ({"prompt": [PROMPT, 3]}, "prompt[1]", "got 3"),
        ({"negative_prompt": 5}, "negative_prompt", "got 5"),
        ({"num_images": 0}, "num_images", "0 is out of range"),
        ({"num_images": 17}, "num_images", "17 is out of range 1..16 (MAX_BATCH)"),
        ({"num_images": 2.5}, "num_images", "2.5"),
        ({"prompt": [PROMPT] * 5, "num_images": 4}, "num_images", "20 images"),
        ({"steps": 0}, "steps", "0 is out of range"),
        ({"steps": 151}, "steps", "151"),
        ({"steps": "²"}, "steps", "'²'"),  # Python's int() reads "²" and "١٢"; a request's numbers are ASCII
        ({"steps": "١٢"}, "steps", "'١٢'"),
        ({"guidance_scale": float("nan")}, "guidance_scale", "nan"),
        ({"guidance_scale": -1.0}, "guidance_scale", "-1 is out of range"),
        ({"width": 33}, "width", "33"),
        ({"height": 36}, "height", "36"),
        ({"width": 0}, "width", "0"),
        ({"width": 4096, "height": 4096}, "width", "4096x4096"),
        ({"seed": 1.5}, "seed", "1.5"),
        ({"seed": 2**64}, "seed", str(2**64)),  # the generator takes 0..2^64-1
        ({"seed": "9" * 5000}, "seed", "must be a whole number"),  # never Python's "Exceeds the limit (4300 digits)"
        ({"init_images": []}, "init_images", "non-empty list"),
        ({"init_images": ["x.png"]}, "init_images[0]", "'x.png'"),
        ({"init_images": [Image.new("CMYK", (32, 32))]}, "init_images[0]", "'CMYK'"),
        ({"init_images": [Image.new("RGB", (32, 32))], "strength": 0.0}, "strength", "0 is out of range"),
        ({"init_images": [Image.new("RGB", (32, 32))], "strength": 1.5}, "strength", "1.5"),
        ({"loras": {"style_a": float("inf")}}, "loras['style_a']", "inf"),
        ({"loras": ["style_a"]}, "loras", "list"),
    ],
)
def test_validation_names_field_and_value(changes, field, value):
    """The schema (when the request is made) or the model's limits (validate) refuse it, naming the field."""
    with pytest.raises(RequestError) as err:
        validate(request(**changes), RequestLimits(size_multiple=8, max_batch=16, max_pixels=2048 * 2048))
    assert str(err.value).startswith(field + ":"), str(err.value)
    assert value in str(err.value)


def test_validation_runs_before_any_model_work(pipeline, monkeypatch):
    ran: list[str] = []

    def forbidden(name):
        def run(*_a, **_k):
            ran.append(name)
            raise AssertionError(f"the model ran ({name})")

        return run

    # Python looks `__call__` up on the class, never on the instance: patch the pipeline's class, and
    # the forward of every network in it (an instance's `forward` is what nn.Module.__call__ runs).
    monkeypatch.setattr(type(pipeline.pipe), "__call__", forbidden("pipeline __call__"))
    for name, component in pipeline.pipe.components.items():
        if isinstance(component, torch.nn.Module):
            monkeypatch.setattr(component, "forward", forbidden(f"{name}.forward"))
    with pytest.raises(ValueError, match="width: 33 is not a multiple of 8"):
        pipeline.generate(request(width=33))
    assert ran == []


def test_unknown_lora_is_a_clear_error(pipeline):
    with pytest.raises(LoraError, match="unknown LoRA 'nope'; available: style_a, style_b"):
        pipeline.generate(request(loras={"nope": 1.0}))


# ---------------------------------------------------------------- seeds and batches
def test_each_image_of_a_batch_is_reproduced_by_its_seed(pipeline):
    batch = pipeline.generate(request(num_images=4, seed=100))
    assert batch.seeds == [100, 101, 102, 103]
    assert [m["seed"] for m in batch.metadata] == batch.seeds
    single = pipeline.generate(request(num_images=1, seed=102))
    assert_same_image(batch.images[2], single.images[0])
    assert np.abs(pixels(batch.images[0]) - pixels(batch.images[1])).mean() > 5


def test_random_seed_is_reported_and_reproducible(pipeline):
    first = pipeline.generate(request(seed=None))
    again = pipeline.generate(request(seed=first.seeds[0]))
    assert np.array_equal(pixels(first.images[0]), pixels(again.images[0]))


def test_several_prompts_times_images(pipeline):
    result = pipeline.generate(request(prompt=[PROMPT, "a green square on a white background"], num_images=2))
    other = "a green square on a white background"
    assert [m["prompt"] for m in result.metadata] == [PROMPT, PROMPT, other, other]
    assert len(result.images) == 4 and len(set(result.seeds)) == 4


def test_micro_batches_progress_and_timings(pipeline):
    small = with_micro_batch(pipeline, 2)
    calls = []
    result = small.generate(request(num_images=5, steps=3), progress=lambda s, t, i: calls.append((s, t, i)))
    assert len(result.images) == 5
    assert sorted({i for _, _, i in calls}) == [0, 2, 4]  # three micro-batches
    assert calls[-1][0] == calls[-1][1] == 9  # 3 chunks x 3 steps, counted over the whole request
    t = result.timings
    assert t["total"] >= t["encode"] + t["denoise"] > 0 and t["steps_per_second"] > 0
    reference = pipeline.generate(request(num_images=5, steps=3))
    for a, b in zip(result.images, reference.images, strict=True):
        assert_same_image(a, b)


# ---------------------------------------------------------------- out of memory
def _raise_oom_times(monkeypatch, unet, times: int):
    real = unet.forward
    state = {"left": times, "batches": []}

    def forward(sample, *args, **kwargs):
        state["batches"].append(sample.shape[0])
        if state["left"] > 0:
            state["left"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real(sample, *args, **kwargs)

    monkeypatch.setattr(unet, "forward", forward)
    return state


def test_out_of_memory_halves_the_batch_and_warns(pipeline, monkeypatch):
    reference = pipeline.generate(request(num_images=4))
    state = _raise_oom_times(monkeypatch, pipeline.pipe.unet, 1)
    result = pipeline.generate(request(num_images=4))
    assert len(result.images) == 4 and result.seeds == reference.seeds
    assert any("batch split into 2 chunks" in w for w in result.warnings)
    assert state["batches"][0] == 8 and 4 in state["batches"]  # CFG doubles: 4 images -> 8, then 2 -> 4
    for a, b in zip(result.images, reference.images, strict=True):
        assert_same_image(a, b)
    pipeline.micro_batch_limit.clear()


def test_out_of_memory_at_one_image_is_a_clear_error_keeping_results(pipeline, monkeypatch):
    small = with_micro_batch(pipeline, 1)
    real = pipeline.pipe.unet.forward
    calls = {"n": 0}

    def forward(sample, *args, **kwargs):  # the first image (3 steps) fits, then memory runs out
        calls["n"] += 1
        if calls["n"] > 3:
            raise RuntimeError("NPU out of memory. Tried to allocate 1.00 GiB")
        return real(sample, *args, **kwargs)

    monkeypatch.setattr(pipeline.pipe.unet, "forward", forward)
    with pytest.raises(OutOfMemoryError, match="smaller width/height") as err:
        small.generate(request(num_images=3))
    assert len(err.value.partial.images) == 1 and err.value.partial.seeds == [7]


# ---------------------------------------------------------------- cancel
def test_cancel_returns_what_finished(pipeline):
    small = with_micro_batch(pipeline, 1)
    steps = []
    result = small.generate(
        request(num_images=4, steps=3),
        progress=lambda s, t, i: steps.append(s),
        should_cancel=lambda: len(steps) >= 5,  # during the second image
    )
    assert result.cancelled is True
    assert len(result.images) == 1 and result.seeds == [7]
    assert any("cancelled" in w for w in result.warnings)
    assert len(steps) == 5  # stopped within a step, no further denoising
    after = pipeline.generate(request())
    assert not after.cancelled and len(after.images) == 1


# ---------------------------------------------------------------- LoRA
def test_lora_round_trip(pipeline):
    base = pixels(pipeline.generate(request()).images[0])
    zero = pixels(pipeline.generate(request(loras={"style_a": 0.0})).images[0])
    full = pixels(pipeline.generate(request(loras={"style_a": 1.0})).images[0])
    assert np.array_equal(zero, base)
    assert np.abs(full - base).mean() > 1.0
    mixed = pixels(pipeline.generate(request(loras={"style_a": 0.7, "style_b": 0.5})).images[0])
    assert not np.array_equal(mixed, full)
    assert {i.name for i in pipeline.list_loras() if i.loaded} == {"style_a", "style_b"}
    assert np.array_equal(pixels(pipeline.generate(request()).images[0]), base)  # no loras -> base
    pipeline.unload_lora("style_a")
    pipeline.unload_lora("style_b")
    assert pipeline.loras.loaded == []
    assert np.array_equal(pixels(pipeline.generate(request()).images[0]), base)


def test_lora_refuses_pickles_and_outside_paths(pipeline, tmp_path, lora_dir):
    (lora_dir / "evil.bin").write_bytes(b"pickle")
    with pytest.raises(LoraError, match=r"only \.safetensors"):
        pipeline.load_lora(lora_dir / "evil.bin")
    outside = tmp_path / "style_a.safetensors"
    outside.write_bytes((lora_dir / "style_a.safetensors").read_bytes())
    with pytest.raises(LoraError, match="outside the LoRA folder"):
        pipeline.load_lora(outside)
    assert pipeline.load_lora(outside, name="outside", allow_outside=True) == "outside"
    pipeline.unload_lora("outside")


def test_lora_for_another_model_leaves_pipeline_usable(pipeline, lora_dir):
    from safetensors.torch import save_file

    bad = lora_dir / "other_model.safetensors"
    save_file(
        {
            "unet.down_blocks.9.attentions.0.proj_in.lora_A.weight": torch.randn(4, 999),
            "unet.down_blocks.9.attentions.0.proj_in.lora_B.weight": torch.randn(999, 4),
        },
        str(bad),
    )
    try:
        with pytest.raises(LoraError, match="not a LoRA for this model"):
            pipeline.load_lora(bad)
        assert "other_model" not in pipeline.loras.loaded
        assert len(pipeline.generate(request(num_images=2)).images) == 2
    finally:
        bad.unlink()


# ---------------------------------------------------------------- image-to-image
def test_img2img_batch_over_input_images(pipeline):
    inputs = [Image.new("RGB", (32, 32), c) for c in ("red", "green", "blue")]
    result = pipeline.generate(request(init_images=inputs, strength=0.5, steps=4, num_images=1))
    assert len(result.images) == 3 and result.inputs == inputs
    assert all(m["strength"] == 0.5 and "image_guidance_scale" not in m for m in result.metadata)
    assert pipeline.twins.img2img.unet is pipeline.pipe.unet  # from_pipe: weights shared, not reloaded
    assert result.seeds == [7, 8, 9]
    # a random tiny VAE does not reproduce colors, but the input must steer the output
    same_seed = pipeline.generate(request(init_images=[inputs[2], inputs[0]], strength=0.5, steps=4, seed=9))
    assert_same_image(same_seed.images[0], result.images[2])
    assert np.abs(pixels(same_seed.images[1]) - pixels(result.images[2])).mean() > 2


def test_instruction_edit_pipeline_uses_its_image_guidance(tmp_path):
    from diffusers import StableDiffusionInstructPix2PixPipeline

    from tests.tiny_model import save_tiny_pix2pix

    edit = ImagePipeline.from_pretrained(save_tiny_pix2pix(tmp_path / "pix2pix"), DeviceManager("cpu"))
    assert isinstance(edit.diffusers_pipeline, StableDiffusionInstructPix2PixPipeline)
    inputs = [Image.new("RGB", (32, 32), "red"), Image.new("RGB", (32, 32), "blue")]
    low = edit.generate(request(prompt="make it green", init_images=inputs, image_guidance_scale=1.0, steps=3))
    high = edit.generate(request(prompt="make it green", init_images=inputs, image_guidance_scale=3.0, steps=3))
    assert len(low.images) == 2 and edit.twins.img2img is None  # the pipeline itself edits: no from_pipe
    assert np.abs(pixels(low.images[0]) - pixels(high.images[0])).mean() > 0.5


# ---------------------------------------------------------------- metadata
def test_png_metadata_round_trip(pipeline, tmp_path):
    result = pipeline.generate(request(num_images=2, negative_prompt="blurry", loras={"style_a": 0.8}))
    paths = save_images(result, tmp_path)
    meta = read_metadata(paths[1])
    params = meta["parameters"]
    assert params == {
        "prompt": PROMPT,
        "negative_prompt": "blurry",
        "steps": 3,
        "sampler": "DPM++ 2M",
        "schedule": schedule_type("DPM++ 2M", pipeline.pipe.scheduler.config),  # always written: never "Automatic"
        "guidance_scale": pipeline.default_guidance,  # none asked: the model's (its pipeline's own 7.5 here)
        "seed": 8,
        "width": 32,
        "height": 32,
        "model": "model",
        "loras": {"style_a": 0.8},
        "model_hash": short_hash(pipeline.source + "/unet/diffusion_pytorch_model.safetensors"),
    }
    assert meta["json"]["lora_hashes"] == {"style_a": lora_hash(pipeline.loras.available()["style_a"])}
    assert meta["json"]["device"] == "cpu" and meta["json"]["dtype"] == "float32"
    assert meta["json"]["attention"] == "sdpa" and meta["json"]["timings"]["total"] > 0
    with Image.open(paths[1]) as png:
        assert "<lora:style_a:0.8>" in png.text["parameters"]
        assert np.array_equal(pixels(png.convert("RGB")), pixels(result.images[1]))
    pipeline.unload_lora("style_a")


# ---------------------------------------------------------------- CLI
@pytest.mark.slow  # 65 s: command-line starts on 2 shared cores
def test_cli_end_to_end(tiny_model_dir, lora_dir, tmp_path):
    out = tmp_path / "out"
    env = {**os.environ, "LORA_DIR": str(lora_dir), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipelines",
            PROMPT,
            "--num-images",
            "3",
            "--out",
            str(out),
            "--model",
            str(tiny_model_dir),
            "--lora",
            f"{lora_dir / 'style_a.safetensors'}:0.5",
            "--seed",
            "42",
            "--steps",
            "2",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    assert "3 image(s) in" in run.stdout and "it/s" in run.stdout and "peak memory" in run.stdout
    assert "cpu float32" in run.stdout
    files = sorted(out.glob("*.png"))
    assert len(files) == 3
    assert [read_metadata(f)["parameters"]["seed"] for f in files] == [42, 43, 44]
    assert read_metadata(files[0])["parameters"]["loras"] == {"style_a": 0.5}
    assert "denoising" in run.stderr  # the tqdm bar
    bad = subprocess.run(
        [sys.executable, "-m", "pipelines", PROMPT, "--model", str(tiny_model_dir), "--steps", "0"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and "steps: 0 is out of range 1..150" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert math.isfinite(float(run.stdout.split(" in ")[1].split(" s")[0]))


def test_guidance_rescale_changes_a_guided_image_and_is_recorded(pipeline, tmp_path):
    """`guidance_rescale` (the request schema's newest field): another image than plain guidance's, the
    same image at 0, "CFG rescale: 0.7" in the PNG and read back from it, so Send to Generate restores it."""
    from pipelines.pnginfo.read import read_png_info

    base = dict(prompt=PROMPT, steps=3, seed=11, width=32, height=32, guidance_scale=7.0)
    plain = pipeline.generate(GenerationRequest(**base))
    zero = pipeline.generate(GenerationRequest(**base, guidance_rescale=0))
    rescaled = pipeline.generate(GenerationRequest(**base, guidance_rescale=0.7))
    assert np.array_equal(pixels(plain.images[0]), pixels(zero.images[0]))  # 0 is none
    assert not np.array_equal(pixels(plain.images[0]), pixels(rescaled.images[0]))
    assert "guidance_rescale" not in plain.metadata[0] and rescaled.metadata[0]["guidance_rescale"] == 0.7
    path = save_images(rescaled, tmp_path)[0]
    read = read_png_info(path)
    assert "CFG rescale: 0.7" in read["raw"] and read["parameters"]["guidance_rescale"] == 0.7
    edit = pipeline.generate(GenerationRequest(**base, init_images=[rescaled.images[0]], guidance_rescale=0.7))
    assert any("has no guidance rescale" in w for w in edit.warnings)  # diffusers' img2img twin takes none: said
    assert "guidance_rescale" not in edit.metadata[0]  # and not recorded as if it ran
