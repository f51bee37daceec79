"""PNG info read back: our files, A1111/Forge infotexts written by hand in A1111's format, ComfyUI graphs."""

from __future__ import annotations

import json

import pytest
from PIL import Image, PngImagePlugin

from pipelines.pnginfo.read import parse_a1111, parse_comfyui, read_png_info
from pipelines.pnginfo.write import a1111_parameters, png_info
from pipelines.weights.hashing import short_hash

# As A1111 writes them (modules/processing.py create_infotext; quoted values via infotext_utils.quote).
A1111_FULL = """masterpiece, a castle on a hill, (sunset:1.2) <lora:add_detail:0.6> <lora:castle_v2:1>
a second prompt line
Negative prompt: blurry, lowres
bad hands
Steps: 28, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 6.5, Seed: 3141592653, Size: 832x1216, \
Model hash: 31e35c80fc, Model: sd_xl_base_1.0, Denoising strength: 0.35, Clip skip: 2, \
Lora hashes: "add_detail: 7c6bad76eb54, castle_v2: 0123456789ab", TI hashes: "easyneg: c74b4e810b03", Version: v1.10.1"""
A1111_MINIMAL = "a cat\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 1, Size: 512x512, Model hash: abc, Model: x"
FORGE = (
    "portrait photo\nSteps: 25, Sampler: Euler, Schedule type: Simple, CFG scale: 1, Distilled CFG Scale: 3.5, "
    'Seed: 42, Size: 896x1152, Model hash: 2e1d2b1a, Model: flux1-dev-fp8, Version: "f2.0.1v1.10.1, previous"'
)


def test_a1111_infotext_with_quoted_values_multiline_negative_and_loras():
    p = parse_a1111(A1111_FULL)
    assert p["prompt"] == "masterpiece, a castle on a hill, (sunset:1.2)\na second prompt line"
    assert p["negative_prompt"] == "blurry, lowres\nbad hands"
    assert p["loras"] == {"add_detail": 0.6, "castle_v2": 1.0}
    assert (p["steps"], p["guidance_scale"], p["seed"]) == (28, 6.5, 3141592653)
    assert (p["width"], p["height"], p["sampler"]) == (832, 1216, "DPM++ 2M Karras")  # + "Schedule type: Karras"
    assert p["model"] == "sd_xl_base_1.0" and p["model_hash"] == "31e35c80fc" and p["strength"] == 0.35
    assert p["extra"]["Lora hashes"] == "add_detail: 7c6bad76eb54, castle_v2: 0123456789ab"
    assert p["extra"]["Schedule type"] == "Karras" and p["extra"]["Version"] == "v1.10.1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (A1111_MINIMAL, {"prompt": "a cat", "steps": 20, "sampler": "Euler a", "guidance_scale": 7.0, "seed": 1}),
        (
            FORGE,
            {"prompt": "portrait photo", "guidance_scale": 1.0, "seed": 42, "width": 896, "model": "flux1-dev-fp8"},
        ),
    ],
)
def test_other_a1111_style_infotexts(text, expected):
    parsed = parse_a1111(text)
    assert {k: parsed[k] for k in expected} == expected
    if text is FORGE:
        assert parsed["extra"]["Version"] == "f2.0.1v1.10.1, previous"
        assert parsed["extra"]["Distilled CFG Scale"] == "3.5"


def test_our_parameters_round_trip_with_commas_and_hashes():
    meta = {
        "prompt": "a red circle, on blue", "negative_prompt": "green, dark", "steps": 20,
        "sampler": "DPMSolverMultistepScheduler", "guidance_scale": 4.0, "seed": 7, "width": 64, "height": 64,
        "model": "tiny: shapes, v1", "loras": {"outline": 0.8}, "model_hash": "0123456789",
        "lora_hashes": {"outline": "abcdef0123"},
    }  # fmt: skip
    p = parse_a1111(a1111_parameters(meta))
    for key in ("prompt", "negative_prompt", "steps", "sampler", "guidance_scale", "seed", "width", "model", "loras"):
        assert p[key] == meta[key], key
    assert p["model_hash"] == "0123456789" and p["extra"]["Lora hashes"] == "outline: abcdef0123"


COMFY = {
    "3": {"class_type": "KSampler", "inputs": {"seed": 156680208700286, "steps": 20, "cfg": 8, "sampler_name": "euler",
          "scheduler": "normal", "denoise": 1, "model": ["10", 0], "positive": ["6", 0], "negative": ["7", 0],
          "latent_image": ["5", 0]}},
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "v1-5-pruned-emaonly.safetensors"}},
    "5": {"class_type": "EmptyLatentImage", "inputs": {"width": 512, "height": 768, "batch_size": 1}},
    "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "beautiful scenery, purple galaxy bottle", "clip": ["10", 1]}},
    "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "text, watermark", "clip": ["10", 1]}},
    "10": {"class_type": "LoraLoader", "inputs": {"lora_name": "styles/ink.safetensors", "strength_model": 0.7,
           "strength_clip": 1, "model": ["4", 0], "clip": ["4", 1]}},
}  # fmt: skip


def test_comfyui_graph():
    p = parse_comfyui(COMFY)
    assert p["prompt"] == "beautiful scenery, purple galaxy bottle" and p["negative_prompt"] == "text, watermark"
    assert (p["seed"], p["steps"], p["guidance_scale"]) == (156680208700286, 20, 8.0)
    assert (p["width"], p["height"]) == (512, 768) and (p["sampler"], p["schedule"]) == ("Euler", "Normal")
    assert p["model"] == "v1-5-pruned-emaonly" and p["loras"] == {"ink": 0.7}


def test_read_png_info_for_each_source(tmp_path):
    image = Image.new("RGB", (8, 8))
    ours = tmp_path / "ours.png"
    meta = {"prompt": "p", "steps": 3, "guidance_scale": 2.0, "seed": 5, "width": 8, "height": 8}
    image.save(ours, pnginfo=png_info(meta))
    a1111, comfy, plain = tmp_path / "a1111.png", tmp_path / "comfy.png", tmp_path / "plain.png"
    for path, key, text in ((a1111, "parameters", A1111_FULL), (comfy, "prompt", json.dumps(COMFY))):
        info = PngImagePlugin.PngInfo()
        info.add_text(key, text)
        image.save(path, pnginfo=info)
    image.save(plain)
    assert read_png_info(ours)["source"] == "diffusion-anywhere" and read_png_info(ours)["parameters"]["seed"] == 5
    assert read_png_info(a1111)["source"] == "a1111" and read_png_info(a1111)["parameters"]["steps"] == 28
    assert read_png_info(comfy)["source"] == "comfyui"
    with pytest.raises(ValueError, match="no generation parameters"):
        read_png_info(plain)


def test_short_hash_is_a1111s_autov2(tmp_path):
    f = tmp_path / "w.safetensors"
    f.write_bytes(b"hello")
    assert short_hash(f) == "2cf24dba5f"  # sha256("hello")[:10]


@pytest.mark.parametrize(
    ("styles", "expected"),
    [
        ("\"['Fooocus V2', 'Fooocus Sharp']\"", ("Fooocus V2", "Fooocus Sharp")),  # Fooocus' A1111 scheme
        ('"Cinematic; Film noir, dark"', ("Cinematic", "Film noir, dark")),  # SD.Next: "; ".join, quoted
        ("Cinematic", ("Cinematic",)),
        ('"[]"', None),
    ],
)
def test_style_names_are_read_back_from_an_infotext(styles, expected):
    """The prompt in the infotext is the styled one that ran (A1111's, SD.Next's, ours); the names, where
    the tool wrote them, come back as the `styles` field."""
    fields = parse_a1111(f"a cat, cinematic\nSteps: 5, Sampler: Euler, Styles: {styles}, Seed: 1")
    assert fields.get("styles") == expected and fields["prompt"] == "a cat, cinematic" and fields["seed"] == 1
