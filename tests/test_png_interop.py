"""Images from other tools read back (tests/fixtures/pnginfo: real files, SOURCES.md says whose), a
fuzz of broken files, Send to Generate's mapping of other tools' values, and A1111 reading ours."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

from pipelines.pnginfo import files as pnginfo_files
from pipelines.pnginfo.read import parse_a1111, read_png_info
from pipelines.pnginfo.write import a1111_parameters, save_png
from pipelines.run.backend import ModelInfo
from pipelines.sampling.samplers import SAMPLERS, from_any
from pipelines.schema.request import spec
from pipelines.weights.hashing import lora_hash, short_hash
from tests.a1111_infotext import effective_schedule, get_sampler_and_scheduler, parse_generation_parameters
from ui.history import params_markdown
from ui.send import form_values, inpaint_values
from ui.studio import one_prompt_per_line

FIXTURES = Path(__file__).parent / "fixtures" / "pnginfo"
DUCK = {"prompt": "photo of a duck", "negative_prompt": "monochrome", "seed": 235284042, "steps": 15,
        "guidance_scale": 5.0, "width": 512, "height": 400, "sampler": "UniPC",
        "model": "realistic_realisticVisionV20_v20"}  # fmt: skip
FOOOCUS = {"prompt": "a smiling goldfish", "seed": 6952411511246973023, "steps": 30, "guidance_scale": 4.0,
           "width": 768, "height": 1280, "sampler": "DPM++ 2M SDE Karras", "schedule": "Karras",
           "model": "juggernautXL_v8Rundiffusion", "loras": {}}  # fmt: skip
COMFY_IMG2IMG = {"prompt": "photograph of victorian woman with wings, sky clouds, meadow grass",
                 "negative_prompt": "watermark, text", "seed": 280823642470253, "steps": 20, "guidance_scale": 8.0,
                 "sampler": "DPM++ 2M", "schedule": "Normal", "model": "v1-5-pruned-emaonly"}  # fmt: skip
DREAM = {"negative_prompt": "rendering, glowing eyes, skinny", "seed": 2980747362, "steps": 50, "guidance_scale": 5.0,
         "width": 512, "height": 768, "sampler": "LMS"}  # fmt: skip
SM = {"prompt": "(cat:1.2), by artist, detailed, [shaded]", "negative_prompt": "blurry, jpg artifacts", "seed": 124825529,
      "steps": 30, "guidance_scale": 7.0, "width": 640, "height": 896, "sampler": "DPM++ 2M Karras",
      "model": "ExampleMix7"}  # fmt: skip

MIKU = {"prompt": "general, masterpiece, best quality, amazing quality, \n1girl, solo, hatsune miku, #テスト",
        "width": 1024, "height": 1024}  # fmt: skip
MIKU_NEG = "bad quality, worst quality, worst detail, sketch, censor,"
STEALTH_NOTE = "read from the picture's hidden (stealth) metadata"

EXPECTED = {
    "a1111.png": ("a1111", {**DUCK, "model_hash": "c0d1994c73"}),
    "a1111_text_after_idat.png": ("a1111", DUCK),
    "a1111_exif_utf16be.jpg": ("a1111", DUCK),
    "a1111_exif_utf16le.webp": ("a1111", DUCK),
    "a1111_exif_ascii.jpg": ("a1111", DUCK),
    "a1111_xmp.webp": ("a1111", DUCK),
    "forge_exponential.png": ("a1111", {"prompt": "a lighthouse on a cliff, stormy sea", "seed": 987654321,
                                        "sampler": "DPM++ 2M SDE", "schedule": "Exponential", "steps": 24}),
    "fooocus.png": ("fooocus", {**FOOOCUS, "model_hash": "aeb7e9e689",
                                "styles": ("Fooocus V2", "Fooocus Enhance", "Fooocus Sharp")}),
    "fooocus.jpg": ("fooocus", FOOOCUS),
    "comfyui_img2img.png": ("comfyui", COMFY_IMG2IMG),
    "comfyui_workflow_only.png": ("comfyui", COMFY_IMG2IMG),
    "comfyui_unclip_2pass.png": ("comfyui", {
        "prompt": "(waifu, anime, exceptional, best aesthetic, new, newest, best quality, masterpiece, extremely detailed:1.2)",
        "seed": 1106257833005336, "steps": 26, "guidance_scale": 8.0, "width": 1280, "height": 704,
        "sampler": "UniPC", "schedule": "Normal", "model": "wd-1-5-beta2-aesthetic-unclip-h-fp32"}),
    "comfyui_flux_custom_advanced.png": ("comfyui", {
        "seed": 219670278747233, "steps": 20, "guidance_scale": 3.5, "width": 1024, "height": 1024,
        "sampler": "Euler", "schedule": "Simple", "model": "flux1-dev", "negative_prompt": ""}),
    "comfyui_kontext.webp": ("comfyui", {"seed": 972054013132814, "steps": 20, "guidance_scale": 2.5,
                                         "sampler": "Euler", "model": "flux1-kontext-dev"}),
    "comfyui_links.png": ("comfyui", {
        "prompt": "a castle on a hill, dramatic sky\ngolden hour", "negative_prompt": "watermark, text",
        "seed": 2**64 - 1, "steps": 28, "guidance_scale": 5.5, "width": 832, "height": 1216, "sampler": "Euler a",
        "schedule": "Karras", "model": "juggernautXL_v9", "loras": {"ink": 0.7, "detail": 0.5}}),
    "swarmui.png": ("swarmui", {
        "prompt": "a photo of a red fox in the snow,\nwinter morning", "negative_prompt": "blurry, lowres",
        "seed": 1765392857, "steps": 30, "guidance_scale": 6.5, "width": 1152, "height": 896,
        "sampler": "DPM++ 2M SDE Karras", "schedule": "Karras", "model": "sd_xl_base_1.0",
        "loras": {"pixel-art-xl": 0.8, "detail_tweaker": 1.0}}),
    "invokeai_metadata.png": ("invokeai", {
        "prompt": "digital artwork, oil painting. painterly brushstrokes, holidays,", "seed": 3293022630, "steps": 35,
        "guidance_scale": 8.0, "width": 1024, "height": 1024, "sampler": "Euler", "model": "juggernautXL"}),
    "invokeai_sd_metadata.png": ("invokeai", {
        **DREAM, "model": "deliberateForInvoke_v08",
        "model_hash": "56d1442a0feefd64836a19ac8e3527ec71c884fc962e246ddf67b03e42921272"}),
    "invokeai_dream.png": ("invokeai", DREAM),
    "invokeai_v5.png": ("invokeai", {
        **MIKU, "negative_prompt": MIKU_NEG, "seed": 3951921344, "steps": 24, "guidance_scale": 6.0, "sampler": "Euler a",
        "model": "waiIllustriousSDXL_v160",
        "model_hash": "blake3:7c1631b481e1566448f49db7e3b67a8a9d04742fa3c7d4548a0c81b619160c56"}),
    "novelai.png": ("novelai", {"prompt": "masterpiece, best quality,  cat, space, icon", "seed": 2253955223,
                                "steps": 50, "guidance_scale": 10.0, "sampler": "Euler a",
                                "model": "Stable Diffusion", "model_hash": "1D44365E"}),
    "novelai_curated.webp": ("novelai", {
        "prompt": "1girl, solo, hatsune miku, #テスト, very aesthetic, masterpiece, no text, -0.8::feet::, rating:general",
        "seed": 880673757, "steps": 23, "guidance_scale": 5.0, "width": 1024, "height": 1024, "sampler": "Euler a",
        "schedule": "Karras", "model": "NovelAI Diffusion V4.5", "model_hash": "C02D4F98"}),
    "hf_space.png": ("hf-space", {
        "prompt": MIKU["prompt"].replace("#テスト", "テスト"), "negative_prompt": MIKU_NEG, "seed": 443800072,
        "steps": 24, "guidance_scale": 5.5, "width": 1024, "height": 1024, "sampler": "DPM++ 2M Karras",
        "model": "WAI NSFW illustrious SDXL v16",
        "model_hash": "BDB59BAC77D94AE7A55FF893170F9554C3F349E48A1B73C0C17C0B7C6F4D41A2"}),
    "ruined_fooocus.png": ("ruined-fooocus", {
        **MIKU, "negative_prompt": MIKU_NEG, "seed": 2020047614, "steps": 30, "guidance_scale": 8.0,
        "sampler": "DPM++ 2M SDE Karras", "schedule": "Karras", "model": "waiNSFWIllustrious_v150", "clip_skip": 1,
        "model_hash": "BEFC694A296F75E996488EBF9F9DB8A1493BD059B6E704B975829E87D5AEB4FA"}),
    "civitai_upscale.jpg": ("civitai", {
        **MIKU, "negative_prompt": MIKU_NEG, "seed": 1311178179, "steps": 25, "guidance_scale": 5.0,
        "sampler": "Euler a", "model": "Illustrious"}),
    "comfyui_saveimage_plus.jpg": ("comfyui", {
        **MIKU, "prompt": MIKU["prompt"].removesuffix(", #テスト"), "negative_prompt": MIKU_NEG, "seed": 577723948579568, "steps": 20, "guidance_scale": 5.0,
        "sampler": "Euler a", "schedule": "Karras", "model": "waiIllustriousSDXL_v160"}),
    "comfy_image_saver.jpg": ("a1111", {"prompt": "unknown", "seed": 0, "steps": 20, "guidance_scale": 8.0,
                                        "sampler": "Euler", "schedule": "Simple", "model_hash": "217daae812"}),
    "a1111_stealth.png": ("a1111", {
        "prompt": "a circle", "negative_prompt": "a square", "seed": 2015833630, "steps": 20, "guidance_scale": 7.0,
        "width": 64, "height": 64, "sampler": "Euler", "model": "realisticVisionV51_v51VAE", "model_hash": "15012c538f",
        "clip_skip": 2}),
    "stability_matrix.png": ("stability-matrix", {**SM, "model_hash": "b899d188a1"}),
    "stability_matrix_json_only.png": ("stability-matrix", SM),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_tools_fields_are_read(name):
    source, expected = EXPECTED[name]
    info = read_png_info(FIXTURES / name)
    assert info["source"] == source and info["notes"] == ([STEALTH_NOTE] if "stealth" in name else [])
    got = {k: info["parameters"].get(k) for k in expected}
    for key in ("prompt", "negative_prompt"):  # tools end their prompts with spaces, commas, line ends
        if isinstance(got.get(key), str):
            got[key], expected = got[key].rstrip(", \n"), {**expected, key: expected[key].rstrip(", \n")}
    assert got == expected
    assert "{" not in info["parameters"].get("prompt", "")  # never a tool's JSON shown as the prompt


def test_every_fixture_is_listed_in_sources_and_small():
    sources = (FIXTURES / "SOURCES.md").read_text()
    images = [p for p in FIXTURES.iterdir() if p.suffix in (".png", ".jpg", ".webp")]
    assert images and all(f"`{p.name}`" in sources for p in images)
    assert all(p.stat().st_size < 12_000 for p in images)


def test_files_without_parameters_say_so(tmp_path):
    empty = tmp_path / "empty_file.png"  # sd-parsers' 0-byte bad image, made here: git-LFS rules take no empty file
    empty.write_bytes(b"")
    for path in (empty, FIXTURES / "bad_no_metadata.png"):
        with pytest.raises(ValueError):
            read_png_info(path)


# ----------------------------------------------------------------------------- fuzz


def chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_with(*chunks: bytes) -> bytes:
    base = (FIXTURES / "bad_no_metadata.png").read_bytes()
    return base[:-12] + b"".join(chunks) + base[-12:]  # before IEND


def text(key: str, value: str | bytes) -> bytes:
    return chunk(b"tEXt", key.encode() + b"\x00" + (value if isinstance(value, bytes) else value.encode()))


CYCLE = {"1": {"class_type": "KSampler", "inputs": {"seed": ["2", 0], "steps": ["1", 0], "cfg": ["9", 0],
          "sampler_name": ["2", 0], "scheduler": 5, "positive": ["3", 0], "negative": ["1", 0], "model": ["3", 0],
          "latent_image": ["3", 0]}},
         "2": {"inputs": {"value": ["1", 0], "seed": ["2", 0]}},
         "3": {"inputs": {"conditioning": ["3", 0], "model": ["3", 0], "text": ["3", 0], "samples": ["3", 0]}}}  # fmt: skip
ODD_JSON = ["[]", "[1, 2]", "42", '"text"', "null", "{}", '{"3": 5}', '{"3": {"inputs": []}}', "[" * 5000 + "]" * 5000,
            '{"sui_image_params": []}', '{"metadata_scheme": "fooocus", "resolution": 5, "loras": "x"}',
            '{"sui_image_params": {"seed": "abc", "loras": [1, null], "loraweights": "x"}}',
            '{"image": {"prompt": [1, {"prompt": 2}]}}', json.dumps(CYCLE),
            '{"1": {"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["404", 0], "guider": [1, 2, 3]}}}',
            '{"nodes": [1, {"id": 1, "type": "KSampler", "widgets_values": 7}], "links": [[1], "x"]}',
            '{"software": "RuinedFooocus", "loras": [[1], ["a", "b"], 5, [0.5, "x"]], "Prompt": 3, "clip_skip": 99}',
            '{"prompt": {"1": 5}}', '{"prompt": {"1": {"class_type": 5}}}', '{"Comment": "{"}', '{"Comment": "[]"}',
            '{"Comment": "{\\"uc\\": 5}", "Source": 7}', '{"prompt": "x", "resolution": [1], "seed": {}, "Model hash": 5}',
            '{"prompt": "x", "Styles": "[\'a", "styles": "\'"}', '{"1": {"class_type": "X"}, "extraMetadata": "{"}',
            '{"1": {"class_type": "X"}, "extraMetadata": "{\\"seed\\": \\"s\\"}"}']  # fmt: skip
KEYS = ["parameters", "prompt", "workflow", "invokeai_metadata", "sd-metadata", "Comment", "parameters-json", "smproj"]


def broken_files() -> list[tuple[str, bytes]]:
    cases = [(f"{key}={value[:30]}", png_with(text(key, value))) for key in KEYS for value in ODD_JSON]
    cases += [
        ("latin-1 tEXt", png_with(text("parameters", "caf\xe9 \xff\xfe\nSteps: x, Sampler: \x00, Seed: 1e999".encode("latin-1")))),
        ("bad iTXt", png_with(chunk(b"iTXt", b"parameters\x00\x01\x00\x00\x00garbage"))),
        ("bad zTXt", png_with(chunk(b"zTXt", b"parameters\x00\x00not zlib"))),
        ("no keyword", png_with(chunk(b"tEXt", b"no separator"))),
        ("Dream", png_with(text("Dream", '"unterminated -s -S'))),
        ("A1111 junk", png_with(text("parameters", 'x\nSteps: 1e999, Size: 9x, Seed: "\\q", Denoising strength: nan'))),
        ("chunk past end", png_with(struct.pack(">I", 1 << 30) + b"tEXt" + b"parameters\x00x")),
        ("signature only", b"\x89PNG\r\n\x1a\n"),
        ("not an image", b"GIF89a" + b"\x00" * 20),
        ("bad exif", png_with(chunk(b"eXIf", b"MM\x00*\x00\x00\x00\x08\xff\xff"))),
    ]
    for name in sorted(EXPECTED):
        data = (FIXTURES / name).read_bytes()
        cases += [(f"{name}[:{n}]", data[:n]) for n in range(0, len(data), max(1, len(data) // 9))]
        flipped = bytearray(data)
        for i in range(20, len(flipped), 97):
            flipped[i] ^= 0x5A
        cases.append((f"{name} flipped", bytes(flipped)))
    return cases


def test_no_file_raises_anything_but_value_error(tmp_path, monkeypatch):
    """Truncated, corrupted and hostile files: read_png_info returns what it could read or raises
    ValueError; the tab's table and the form take whatever it returned."""
    monkeypatch.setattr(pnginfo_files, "MAX_CHUNK", 4096)  # a "huge" chunk without writing 16 MB
    info = ModelInfo("m", 512, 512, 8, 1024, 1024 * 1024, 4, 20, 7.0, "Euler", samplers=("Euler", "Euler a"))
    files = [*broken_files(), ("huge", png_with(text("parameters", "x" * 5000)))]
    for i, (label, data) in enumerate(files):
        path = tmp_path / f"{i}.png"
        path.write_bytes(data)
        try:
            result = read_png_info(path)
        except ValueError:
            continue
        except Exception as exc:  # pragma: no cover - the failure this test exists for
            pytest.fail(f"{label}: {type(exc).__name__}: {exc}")
        params_markdown(result, form_values(result["parameters"], info)[1])
        inpaint_values(result["parameters"], info)


def test_a_cut_png_keeps_the_chunks_before_the_cut(tmp_path):
    data = png_with(text("parameters", "a cat\nSteps: 5, Sampler: Euler, Seed: 3"), text("other", "y" * 100))
    path = tmp_path / "cut.png"
    path.write_bytes(data[: len(data) - 60])
    info = read_png_info(path)
    assert info["parameters"]["seed"] == 3 and any("cut short" in n for n in info["notes"])


def test_json_of_no_known_tool_is_shown_raw_not_as_a_prompt(tmp_path):
    path = tmp_path / "j.png"
    path.write_bytes(png_with(text("parameters", '{"someone": "else"}')))
    info = read_png_info(path)
    assert info["source"] == "unknown" and info["parameters"] == {} and "someone" in info["raw"]


def stealth_png(text: str | bytes, kind: str = "alpha", compressed: bool = True, size=(40, 30), length=None) -> bytes:
    """A picture with `text` hidden as the stealth-pnginfo extension hides it: signature, 32-bit length in
    bits, data (gzip for "comp"), in the lowest bits of alpha (one a pixel) or of r, g, b (three), column by
    column. `length` overrides the length written (a lying header)."""
    data = text.encode() if isinstance(text, str) else text
    data = gzip.compress(data) if compressed else data
    tag = {("alpha", True): b"stealth_pngcomp", ("alpha", False): b"stealth_pnginfo",
           ("rgb", True): b"stealth_rgbcomp", ("rgb", False): b"stealth_rgbinfo"}[kind, compressed]  # fmt: skip
    bits = np.unpackbits(np.frombuffer(tag + struct.pack(">I", length or len(data) * 8) + data, np.uint8))
    width, height = size
    pixels = np.full((height, width, 4), 200, np.uint8)
    columns = pixels.transpose(1, 0, 2)  # a view: column by column
    flat = columns[:, :, 3:] if kind == "alpha" else columns[:, :, :3]
    stream = flat.reshape(-1).copy()
    assert len(bits) <= len(stream), "picture too small for the text"
    stream[: len(bits)] = (stream[: len(bits)] & 0xFE) | bits
    flat[...] = stream.reshape(flat.shape)
    out = io.BytesIO()
    Image.fromarray(pixels, "RGBA").save(out, format="PNG")
    return out.getvalue()


INFOTEXT = "a red fox\nNegative prompt: blur\nSteps: 12, Sampler: Euler a, CFG scale: 6, Seed: 77, Size: 40x30"


@pytest.mark.parametrize(("kind", "compressed"), [("alpha", True), ("alpha", False), ("rgb", True), ("rgb", False)])
def test_stealth_pnginfo_in_alpha_or_rgb_bits_is_read(tmp_path, kind, compressed):
    path = tmp_path / "s.png"
    path.write_bytes(stealth_png(INFOTEXT, kind, compressed))
    info = read_png_info(path)
    assert (info["source"], info["notes"]) == ("a1111", [STEALTH_NOTE])
    want = {"prompt": "a red fox", "negative_prompt": "blur", "seed": 77, "steps": 12, "sampler": "Euler a"}
    assert {k: info["parameters"][k] for k in want} == want


def test_novelais_stealth_json_is_read_as_its_chunks(tmp_path):
    chunks = {"Software": "NovelAI", "Source": "NovelAI Diffusion V4.5 C02D4F98", "Description": "a cat",
              "Comment": json.dumps({"prompt": "a cat", "uc": "dog", "steps": 28, "scale": 5.0, "seed": 9,
                                     "sampler": "k_euler_ancestral", "width": 40, "height": 30})}  # fmt: skip
    path = tmp_path / "n.png"
    path.write_bytes(stealth_png(json.dumps(chunks), size=(60, 60)))
    info = read_png_info(path)
    assert info["source"] == "novelai"
    want = {"prompt": "a cat", "negative_prompt": "dog", "seed": 9, "model": "NovelAI Diffusion V4.5"}
    assert {k: info["parameters"][k] for k in want} == want and info["parameters"]["model_hash"] == "C02D4F98"


@pytest.mark.parametrize(
    ("data", "note"),
    [
        (lambda: stealth_png(INFOTEXT, length=1 << 31), "more than the picture holds"),  # a lying length
        (lambda: stealth_png(b"\x1f\x8b\x08\x00junk", compressed=False), None),
        (lambda: stealth_png(INFOTEXT)[:-300], "could not be decoded"),  # the pixel data cut short
        (lambda: stealth_png(INFOTEXT, length=len(gzip.compress(INFOTEXT.encode())) * 4), "ends early"),
    ],
    ids=["length past the picture", "gzip magic in plain text", "truncated pixels", "half the gzip stream"],
)
def test_broken_stealth_data_is_a_note_not_a_crash(tmp_path, data, note):
    path = tmp_path / "b.png"
    path.write_bytes(data())
    try:
        info = read_png_info(path)
    except ValueError as exc:  # nothing readable: the note says why
        assert note is None or note in str(exc), exc
        return
    assert note is None or any(note in n for n in info["notes"])


def test_a_huge_picture_is_not_decoded_for_stealth_data(tmp_path, monkeypatch):
    monkeypatch.setattr(pnginfo_files, "STEALTH_MAX_PIXELS", 100)
    path = tmp_path / "h.png"
    path.write_bytes(stealth_png(INFOTEXT))
    with pytest.raises(ValueError, match="not searched for hidden"):
        read_png_info(path)


def test_json_parameters_of_each_shape_go_to_their_reader(tmp_path):
    """Hugging Face Space JSON by other key spellings; Ruined Fooocus' LoRAs; Fooocus' A1111 scheme's styles."""
    cases = [
        ({"prompt": "a", "cfg_scale": 4, "steps": 9, "width": 64, "height": 32, "sampler": "dpmpp_2m", "scheduler": "karras"},
         "hf-space", {"guidance_scale": 4.0, "steps": 9, "width": 64, "height": 32, "sampler": "DPM++ 2M Karras"}),
        ({"software": "RuinedFooocus", "Prompt": "a", "loras": [[0.7, "ink.safetensors"], ["None", 1.0]]},
         "ruined-fooocus", {"prompt": "a", "loras": {"ink": 0.7, "None": 1.0}}),
        ({"prompt": {"1": {"class_type": "KSampler", "inputs": {"seed": 5, "sampler_name": "euler"}}}},
         "comfyui", {"seed": 5, "sampler": "Euler"}),
    ]  # fmt: skip
    for data, source, expected in cases:
        path = tmp_path / "j.png"
        path.write_bytes(png_with(text("parameters", json.dumps(data))))
        info = read_png_info(path)
        assert info["source"] == source and {k: info["parameters"].get(k) for k in expected} == expected


# ----------------------------------------------------------------------------- the table


def test_a_multi_line_prompt_keeps_the_table_shape():
    info = read_png_info(FIXTURES / "swarmui.png")
    table = params_markdown(info).split("\n\n")[1].split("\n")
    rows = [k for k, v in info["parameters"].items() if v not in ("", {}, None)]
    assert len(table) == 2 + len(rows)
    assert all(line.replace("\\|", "").count("|") == 3 for line in table)  # two cells a row, pipes escaped
    assert "in the snow,<br>winter morning" in table[2]
    lora = params_markdown({"source": "a1111", "parameters": {"prompt": "a <lora:x:1> | b"}})
    assert "&lt;lora:x:1&gt; \\| b" in lora


# ----------------------------------------------------------------------------- Send to Generate

_SHAPE = ("m", 512, 512, 8, 1024, 1024 * 1024, 4, 20, 7.0, "DPM++ 2M")
ALL = ModelInfo(*_SHAPE, samplers=tuple(s.name for s in SAMPLERS))
NO_KARRAS = ModelInfo("m", 512, 512, 8, 1024, 1024 * 1024, 4, 20, 7.0, "Euler",
                      samplers=("Euler", "Euler a", "DPM++ 2M", "DDIM", "UniPC"))  # fmt: skip


@pytest.mark.parametrize(
    ("sampler", "schedule", "expected"),
    [
        ("DPM++ 2M", "Karras", "DPM++ 2M Karras"), ("DPM++ 2M Karras", None, "DPM++ 2M Karras"),
        ("DPM++ 2M", "Automatic", "DPM++ 2M Karras"), ("DPM++ 2M", None, "DPM++ 2M"), ("Euler", "Automatic", "Euler"),
        ("DPM++ 2M SDE", "Automatic", "DPM++ 2M SDE"), ("DPM++ 2M SDE", "Exponential", "DPM++ 2M SDE"),
        ("Euler a", "Align Your Steps", "Euler a"), ("Euler", "SGM Uniform", "Euler"), ("Euler", "Beta", "Euler"),
        ("euler_ancestral", "karras", "Euler a"), ("euler", "normal", "Euler"), ("dpmpp_2m", "karras", "DPM++ 2M Karras"),
        ("dpmpp_2m_sde_gpu", "karras", "DPM++ 2M SDE Karras"), ("dpmpp_sde_gpu", "exponential", "DPM++ SDE"),
        ("uni_pc_bh2", "normal", "UniPC"), ("uni_pc", "simple", "UniPC"), ("lcm", "sgm_uniform", "LCM"),
        ("ddim", "ddim_uniform", "DDIM"), ("dpm_2_ancestral", "karras", "DPM2 a Karras"), ("heun", "normal", "Heun"),
        ("lms", "karras", "LMS Karras"), ("k_euler_ancestral", None, "Euler a"), ("k_dpmpp_2m", None, "DPM++ 2M"),
        ("dpmpp_2m_k", None, "DPM++ 2M Karras"), ("dpmpp_2m_sde_k", None, "DPM++ 2M SDE Karras"),
        ("kdpm_2_a", None, "DPM2 a"), ("unipc", None, "UniPC"), ("sample_dpmpp_2m", "normal", "DPM++ 2M"),
        ("k_dpm_2", None, "DPM2"), ("DPM++ 2M SDE Karras", None, "DPM++ 2M SDE Karras"), ("deis", None, "DEIS"),
    ],
)  # fmt: skip
def test_every_tools_sampler_name_maps_to_ours(sampler, schedule, expected):
    values, _ = form_values({"sampler": sampler, "schedule": schedule}, ALL)
    assert values["sampler"] == expected


def test_style_names_go_back_to_the_form_once():
    """A PNG's styles (Fooocus, SD.Next's infotext) are chosen where the server's styles file has them,
    except one whose text the prompt already holds (the tool wrote the styled prompt)."""
    styles = {"ink": {"prompt": "{prompt}, ink drawing", "negative_prompt": ""},
              "night": {"prompt": "at night", "negative_prompt": ""},
              "clean": {"prompt": "", "negative_prompt": "blurry"}}  # fmt: skip
    info = ModelInfo(*_SHAPE, samplers=("DPM++ 2M",), styles=styles)
    params = {"prompt": "a red circle, ink drawing", "negative_prompt": "blurry", "styles": ["ink", "night", "clean", "Fooocus V2"]}
    values, notes = form_values(params, info)
    assert values["styles"] == ["night"]  # "clean" (a negative-only style) is in the negative already
    assert "not in this server's styles file: Fooocus V2" in " ".join(notes)
    assert "already in the prompt, not chosen again: ink" in " ".join(notes)
    assert form_values({"prompt": "a red circle"}, info)[0]["styles"] == []


def test_a_sampler_this_model_lacks_keeps_the_models_and_says_why():
    values, notes = form_values({"sampler": "DPM++ 2M", "schedule": "Karras"}, NO_KARRAS)
    assert values["sampler"] == "DPM++ 2M" and "sampler DPM++ 2M Karras is not available here" in notes[0]
    values, notes = form_values({"sampler": "dpmpp_3m_sde_gpu", "schedule": "karras"}, NO_KARRAS)
    assert values["sampler"] == "Euler" and "no sampler of this app matches it" in notes[0] and "Euler" in notes[0]
    values, notes = form_values({"sampler": "DPM2", "schedule": None}, NO_KARRAS)
    assert values["sampler"] == "Euler" and "this model cannot use it" in notes[0]
    values, notes = form_values({"sampler": "Euler", "schedule": "Exponential"}, NO_KARRAS)
    assert values["sampler"] == "Euler" and "schedule Exponential is not offered" in notes[0]
    _, notes = form_values({"sampler": "DPM++ 2M SDE", "schedule": "Automatic"}, ALL)
    assert notes == ["schedule Automatic (Exponential for DPM++ 2M SDE in A1111) is not offered here; "
                     "DPM++ 2M SDE runs its own schedule"]  # fmt: skip


def _seed(values: dict) -> int | None:
    """The seed a form sends for Send to Generate's seed box and Random seed switch (`ui.form.Form.read`)."""
    return None if values["random_seed"] else spec("seed").parse(values["seed"])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_fixture_fills_the_form_with_a_sampler_we_offer(name):
    values, _notes = form_values(read_png_info(FIXTURES / name)["parameters"], ALL)
    assert values["sampler"] in ALL.samplers
    assert "\n" not in values["prompt"] and isinstance(one_prompt_per_line(values["prompt"]), str)
    assert _seed(values) == EXPECTED[name][1].get("seed")


@pytest.mark.parametrize("seed", [0, 1, 2**32, 2**63 + 5, 2**64 - 1])
def test_64_bit_seeds_are_sent_and_accepted_exactly(seed):
    values, notes = form_values({"prompt": "x", "seed": seed}, ALL)
    assert (values["seed"], values["random_seed"], notes) == (str(seed), False, [])
    assert _seed(values) == seed


@pytest.mark.parametrize("seed", [-1, 2**64, "12"])
def test_a_seed_outside_the_range_is_random(seed):
    values, notes = form_values({"prompt": "x", "seed": seed}, ALL)
    assert values["random_seed"] is True and _seed(values) is None
    assert seed == -1 or notes


def test_a_multi_line_prompt_is_sent_as_one_prompt():
    params = parse_a1111("a castle,\n  on a hill\n\nat dusk\nNegative prompt: blurry\nSteps: 4, Sampler: Euler, Seed: 2")
    values, notes = form_values(params, ALL)
    assert values["prompt"] == "a castle, on a hill at dusk" and "3 lines were joined" in notes[0]
    assert one_prompt_per_line(values["prompt"]) == "a castle, on a hill at dusk"  # one prompt: one image


def test_the_step_cache_an_image_ran_with_is_sent_back():
    """Our PNG's `Step cache` fills the form (the seed reproduces the image only with that cache); a
    PNG without one sets none, with a note where the server's default is a cache; a model without
    step caches sends none and says the run is uncached."""
    from pipelines.pnginfo.write import a1111_parameters

    cached = ModelInfo(*_SHAPE, samplers=("Euler",), step_cache=True, default_step_cache="TaylorSeer")
    meta = {"prompt": "x", "steps": 4, "seed": 2, "guidance_scale": 3.0, "width": 64, "height": 64, "sampler": "Euler",
            "step_cache": "FirstBlockCache", "step_cache_threshold": 0.3}  # fmt: skip
    params = parse_a1111(a1111_parameters(meta))
    values, notes = form_values(params, cached)
    assert (values["step_cache"], values["step_cache_threshold"], notes) == ("FirstBlockCache", 0.3, [])
    values, _ = form_values(parse_a1111(a1111_parameters({**meta, "step_cache": "TaylorSeer"})), cached)
    assert values["step_cache"] == "TaylorSeer"
    values, notes = form_values(parse_a1111("x\nSteps: 4, Sampler: Euler, Seed: 2"), cached)
    assert values["step_cache"] == "none" and "made without a step cache" in notes[0] and "TaylorSeer" in notes[0]
    values, notes = form_values(params, ModelInfo(*_SHAPE))
    assert values["step_cache"] == "none" and "FirstBlockCache 0.3; m has none" in notes[0]
    assert "step_cache" not in parse_a1111("x\nSteps: 4, Sampler: Euler, Step cache: TeaCache 2")  # not ours
    values, notes = form_values(parse_a1111(a1111_parameters({**meta, "step_cache_threshold": 0.005})), cached)
    assert values["step_cache_threshold"] == 0.01 and "0.005 raised to 0.01" in notes[0]  # the slider's lowest
    calibration = {**meta, "step_cache": "MagCache", "step_cache_threshold": 0.06, "step_cache_calibration": True}
    text = a1111_parameters(calibration)
    assert "Step cache: MagCache 0.06 (calibration run)" in text
    values, notes = form_values(parse_a1111(text), cached)  # it skipped nothing: reproduced uncached
    assert values["step_cache"] == "none" and any("calibration run" in n for n in notes)


# ----------------------------------------------------------------------------- A1111 reads ours


def lora_file(path: Path, metadata: dict | None = None) -> Path:
    save_file({"lora_down.weight": torch.arange(12.0).reshape(3, 4)}, str(path), metadata=metadata)
    return path


def test_lora_hash_is_a1111s_addnet_hash(tmp_path):
    path = lora_file(tmp_path / "outline.safetensors")
    data = path.read_bytes()
    header = int.from_bytes(data[:8], "little")
    assert lora_hash(path) == hashlib.sha256(data[8 + header :]).hexdigest()[:12]
    assert lora_hash(path) != hashlib.sha256(data).hexdigest()[:12]  # not the whole file's (AutoV2)
    own = lora_file(tmp_path / "own.safetensors", {"sshs_model_hash": "feedbeefcafe0123456789"})
    assert lora_hash(own) == "feedbeefcafe"  # kohya's hash in the file's metadata wins, as in A1111
    pt = tmp_path / "old.pt"
    pt.write_bytes(b"hello")
    assert lora_hash(pt) == hashlib.sha256(b"hello").hexdigest()[:12]


@pytest.mark.parametrize("sampler", [s.name for s in SAMPLERS])
def test_every_sampler_is_written_with_an_explicit_schedule_type(sampler):
    fields = parse_generation_parameters(a1111_parameters({
        "prompt": "p", "steps": 3, "sampler": sampler, "guidance_scale": 2.0, "seed": 1, "width": 8, "height": 8}))  # fmt: skip
    assert "Schedule type" in a1111_parameters({"prompt": "p", "steps": 3, "sampler": sampler,
                                                "guidance_scale": 2.0, "seed": 1, "width": 8, "height": 8})  # fmt: skip
    a1111_sampler, label = get_sampler_and_scheduler(fields["Sampler"], fields["Schedule type"])
    if sampler.endswith(" Karras"):
        assert effective_schedule(a1111_sampler, label) == "Karras"
    elif a1111_sampler == fields["Sampler"] and sampler in ("DPM++ 2M", "DPM++ SDE", "DPM2", "DPM2 a"):
        assert effective_schedule(a1111_sampler, label) != "Karras"  # was: read as Automatic = Karras


def test_a1111_reads_every_field_of_our_png_as_we_ran_it(tmp_path):
    loras = {"outline": lora_file(tmp_path / "outline.safetensors"), "ink, v2": lora_file(tmp_path / "ink.safetensors")}
    checkpoint = tmp_path / "model.safetensors"
    checkpoint.write_bytes(b"weights")
    meta = {
        "prompt": "a red circle, on blue: (glossy:1.2)", "negative_prompt": "green, dark", "steps": 20,
        "sampler": "DPM++ 2M Karras", "schedule": "Karras", "guidance_scale": 4.5, "seed": 2**64 - 1, "width": 64,
        "height": 48, "model": "tiny: shapes, v1", "loras": {"outline": 0.8, "ink, v2": 1.0},
        "model_hash": short_hash(checkpoint), "lora_hashes": {n: lora_hash(p) for n, p in loras.items()},
    }  # fmt: skip
    path = save_png(Image.new("RGB", (64, 48)), meta, tmp_path / "ours.png")
    with Image.open(path) as image:
        res = parse_generation_parameters(image.text["parameters"])
    assert res["Prompt"] == "a red circle, on blue: (glossy:1.2) <lora:outline:0.8> <lora:ink, v2:1>"
    assert res["Negative prompt"] == "green, dark"
    assert (res["Steps"], res["CFG scale"], res["Seed"]) == ("20", "4.5", str(2**64 - 1))
    assert (res["Size-1"], res["Size-2"]) == ("64", "48")
    assert get_sampler_and_scheduler(res["Sampler"], res["Schedule type"]) == ("DPM++ 2M", "Automatic")
    assert effective_schedule("DPM++ 2M", "Automatic") == "Karras"
    assert from_any("DPM++ 2M", "Automatic").sampler == "DPM++ 2M Karras"  # A1111's re-saved PNG reads back alike
    assert res["Model"] == "tiny: shapes, v1" and res["Model hash"] == short_hash(checkpoint)
    assert res["Model hash"] == hashlib.sha256(b"weights").hexdigest()[:10]
    assert res["Lora hashes"] == ", ".join(f"{n}: {lora_hash(p)}" for n, p in loras.items())


def test_a_plain_dpm_sampler_is_not_read_as_karras_by_a1111():
    text = a1111_parameters({"prompt": "p", "steps": 3, "sampler": "DPM++ 2M", "schedule": "SGM Uniform",
                             "guidance_scale": 2.0, "seed": 1, "width": 8, "height": 8})  # fmt: skip
    res = parse_generation_parameters(text)
    assert get_sampler_and_scheduler(res["Sampler"], res["Schedule type"]) == ("DPM++ 2M", "SGM Uniform")
    ours = parse_a1111(text)
    assert (ours["sampler"], ours["schedule"]) == ("DPM++ 2M", "SGM Uniform")
    assert from_any(ours["sampler"], ours["schedule"]).note is None


def diamond_graph(depth: int) -> dict:
    """A graph whose every node links twice to the next: 2^depth paths through `depth` nodes."""
    graph = {"1": {"class_type": "KSampler", "inputs": {"sampler_name": "euler", "positive": ["10", 0]}}}
    for k in range(10, 10 + depth):
        graph[str(k)] = {"inputs": {"conditioning_1": [str(k + 1), 0], "conditioning_2": [str(k + 1), 0]}}
    graph[str(10 + depth)] = {"inputs": {"text": ["100", 0]}}
    for k in range(100, 100 + depth):
        graph[str(k)] = {"inputs": {"string_a": [str(k + 1), 0], "string_b": [str(k + 1), 0], "delimiter": ","}}
    graph[str(100 + depth)] = {"inputs": {"value": "ab"}}
    return graph


def _read_or_none(path: Path) -> dict | None:
    try:
        return read_png_info(path)
    except ValueError:  # "no generation parameters": a refusal is an answer too
        return None


@pytest.mark.parametrize(
    ("chunks", "check"),
    [
        # 2^30 paths, a 2^31-character prompt if expanded: capped
        ({"prompt": json.dumps(diamond_graph(30))}, lambda info: len(info["parameters"]["prompt"]) == 1 << 16),
        # A1111's pattern alone is quadratic on such a line: read as the prompt
        (
            {"parameters": "p\n" + "word " * 200_000},
            lambda info: info["parameters"]["prompt"].startswith("p\nword word"),
        ),
        ({"parameters": "p\n" + "Key: v, " * 100_000}, lambda info: info["parameters"]["extra"] == {"Key": "v"}),
        ({"XML:com.adobe.xmp": "<x:parameters>" * 100_000}, lambda info: info is None),
    ],
    ids=["diamond graph", "1 MB prompt line", "100k fields", "unclosed XMP tags"],
)
def test_hostile_metadata_is_read_without_blowing_up(tmp_path, chunks, check):
    """Each is read (or refused) as it should be. A reader that walked the graph's paths or
    backtracked quadratically would take hours on these (pytest's timeout fails it); they take well
    under a second. No timing is asserted: a slow machine reads them the same way."""
    path = tmp_path / "h.png"
    path.write_bytes(
        png_with(*(chunk(b"iTXt", k.encode() + b"\x00\x00\x00\x00\x00" + v.encode()) for k, v in chunks.items()))
    )
    info = _read_or_none(path)
    assert check(info), info and {k: str(v)[:80] for k, v in info["parameters"].items()}


def test_a_jpeg_comment_and_windows_paths_in_a_graph(tmp_path):
    Image.new("RGB", (1, 1)).save(tmp_path / "c.jpg", comment=b"a cat\nSteps: 3, Sampler: Euler, Seed: 9")
    assert read_png_info(tmp_path / "c.jpg")["parameters"]["seed"] == 9
    graph = {"1": {"class_type": "KSampler", "inputs": {"sampler_name": "euler", "model": ["2", 0]}},
             "2": {"inputs": {"lora_name": "styles\\ink.safetensors", "strength_model": 0.5, "model": ["3", 0]}},
             "3": {"inputs": {"ckpt_name": "SDXL\\juggernaut.safetensors"}}}  # fmt: skip
    path = tmp_path / "w.png"
    path.write_bytes(png_with(text("prompt", json.dumps(graph))))
    params = read_png_info(path)["parameters"]
    assert (params["model"], params["loras"]) == ("juggernaut", {"ink": 0.5})
