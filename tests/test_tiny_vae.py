"""TINY_VAE (pipelines.weights.tiny_vae): a tiny autoencoder decodes and encodes in place of the model's VAE.

The models are tests.tiny_model's random SD pipeline (latents 4 x 16 x 16 for 32 px: 2x) and random
AutoencoderTiny folders built here: one that fits (2x), one that does not (4x). Random weights draw noise, so the
tests check which autoencoder drew the pixels (against the same pipeline run by diffusers with it), not how they
look; the speed is measured in docs/performance.md#a-tiny-vae-tiny_vae.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from devices import DeviceManager
from models.eval_hires import psnr
from pipelines import GenerationRequest, ImagePipeline, a1111_parameters
from pipelines.run.options import PipelineOptions
from pipelines.schema.errors import ModelLoadError
from pipelines.weights import tiny_vae

REQUEST = GenerationRequest(prompt="a red circle", steps=4, seed=3, num_images=2)


def save_tiny_vae(path, blocks: int):
    """A random AutoencoderTiny folder decoding 4-channel latents at 2 ** (blocks - 1) x."""
    from diffusers import AutoencoderTiny

    torch.manual_seed(1)
    AutoencoderTiny(
        encoder_block_out_channels=(16,) * blocks, decoder_block_out_channels=(16,) * blocks,
        num_encoder_blocks=(1,) * blocks, num_decoder_blocks=(1,) * blocks,
    ).save_pretrained(path)  # fmt: skip
    return path


@pytest.fixture(scope="module")
def fitting(tmp_path_factory):
    return save_tiny_vae(tmp_path_factory.mktemp("tiny-vae") / "taesd-tiny", blocks=2)


def load(model, **options) -> ImagePipeline:
    return ImagePipeline.from_pretrained(str(model), DeviceManager("cpu"), PipelineOptions(runtime="torch", **options))


def pixels(result) -> np.ndarray:
    return np.stack([np.asarray(image.convert("RGB"), dtype=np.float32) for image in result.images])


def test_the_tiny_autoencoder_draws_the_pixels_and_the_image_says_so(tiny_model_dir, fitting):
    full = load(tiny_model_dir)
    tiny = load(tiny_model_dir, tiny_vae=str(fitting))
    assert type(tiny.pipe.vae).__name__ == "AutoencoderTiny" and type(full.pipe.vae).__name__ == "AutoencoderKL"
    got = tiny.generate(REQUEST)
    # the same request run by diffusers itself with the tiny autoencoder: the same pixels
    raw = tiny.pipe(prompt=[REQUEST.prompt] * 2, num_inference_steps=4, guidance_scale=got.metadata[0]["guidance_scale"],
                    generator=[torch.Generator().manual_seed(3 + i) for i in range(2)], output_type="pil")  # fmt: skip
    assert np.abs(pixels(got) - pixels(raw)).max() <= 1
    assert np.abs(pixels(got) - pixels(full.generate(REQUEST))).mean() > 5  # the model's own VAE draws others
    assert tiny.status()[0].vae == "tiny: taesd-tiny (TINY_VAE)" and full.status()[0].vae == "the model's own"
    assert ", VAE: taesd-tiny" in a1111_parameters(got.metadata[0])  # A1111's infotext names it, as A1111 does
    assert got.metadata[0]["vae"] == "taesd-tiny" and "vae" not in full.generate(REQUEST).metadata[0]


def test_image_to_image_encodes_with_the_tiny_autoencoder(tiny_model_dir, fitting):
    tiny = load(tiny_model_dir, tiny_vae=str(fitting))
    start = Image.linear_gradient("L").resize(tiny.default_size).convert("RGB")
    edit = REQUEST.replace(init_images=[start], strength=0.5, num_images=1)
    out = tiny.generate(edit)
    assert out.images[0].size == tiny.default_size and out.metadata[0]["vae"] == "taesd-tiny"


def test_a_tiny_autoencoder_for_other_latents_is_refused_naming_both(tiny_model_dir, tmp_path):
    other = save_tiny_vae(tmp_path / "four-x", blocks=3)
    with pytest.raises(ModelLoadError, match=r"4-channel latents at 4x; this model's are 4-channel at 2x"):
        load(tiny_model_dir, tiny_vae=str(other))


def test_auto_keeps_the_models_vae_where_none_can_be_had_and_says_why(tiny_model_dir):
    """TINY_VAE=auto picks madebyollin/taesd for an SD pipeline; offline (the tests' Hub is unreachable) the
    model loads with its own VAE and the status panel says why."""
    assert tiny_vae.auto_source("StableDiffusionPipeline") == "madebyollin/taesd"
    assert tiny_vae.auto_source("StableDiffusionXLImg2ImgPipeline") == "madebyollin/taesdxl"
    assert tiny_vae.auto_source("FluxPipeline") == "madebyollin/taef1"
    assert tiny_vae.auto_source("WanPipeline") is None
    model = load(tiny_model_dir, tiny_vae="auto")
    assert type(model.pipe.vae).__name__ == "AutoencoderKL"
    assert model.status()[0].vae.startswith("the model's own (madebyollin/taesd: ")
    assert model.generate(REQUEST.replace(num_images=1)).images


def test_a_model_whose_vae_is_another_kind_keeps_it_and_the_video_model_beside_is_left_alone(fitting):
    """A named tiny autoencoder stands in for an AutoencoderKL only: a pipeline with another kind of VAE (a video
    model's 3-D one) keeps it and says why, and the app's video model beside the main one gets no TINY_VAE."""
    from types import SimpleNamespace

    from engine.backends import _video_options

    video_like = SimpleNamespace(vae=torch.nn.Conv3d(4, 4, 1))
    kept = tiny_vae.apply(video_like, "WanPipeline", str(fitting))
    assert isinstance(video_like.vae, torch.nn.Conv3d) and not kept.name
    assert kept.describe() == "the model's own (the model's VAE is a Conv3d; a tiny autoencoder stands in for AutoencoderKL)"
    assert _video_options(PipelineOptions(tiny_vae=str(fitting))).tiny_vae == ""


@pytest.mark.openvino
def test_openvino_runs_the_tiny_autoencoder_as_graphs_at_every_size(tiny_model_dir, fitting, tmp_path):
    """Its decoder and encoder convert as AutoencoderKL's do, give torch's pixels, and serve other sizes and
    batches from the same graphs."""
    pytest.importorskip("openvino")
    torch_model = load(tiny_model_dir, tiny_vae=str(fitting))
    ov_model = ImagePipeline.from_pretrained(
        str(tiny_model_dir), DeviceManager("cpu"),
        PipelineOptions(runtime="openvino", openvino_cache=tmp_path, tiny_vae=str(fitting)),
    )  # fmt: skip
    hooks = ov_model.runtime.hooks
    assert hooks["vae.decoder"].kind == "DecoderTiny" and hooks["vae.decoder"].dynamic
    start = Image.linear_gradient("L").convert("RGB")
    ov_model.generate(REQUEST.replace(init_images=[start.resize((32, 32))], strength=0.5, num_images=1))
    converted = ov_model.runtime.conversions  # the load's warm-up and the first image-to-image request's
    edit = REQUEST.replace(init_images=[start.resize((48, 64))], strength=0.5, width=48, height=64)
    for asked in (REQUEST, REQUEST.replace(width=48, height=64, num_images=3), edit):
        for a, b in zip(pixels(ov_model.generate(asked)), pixels(torch_model.generate(asked)), strict=True):
            assert psnr(a.astype(np.uint8), b.astype(np.uint8)) >= 40
    assert ov_model.runtime.conversions == converted, ov_model.runtime_description
    assert "vae.decoder converted" in ov_model.runtime_description or "vae.decoder disk" in ov_model.runtime_description


def test_previews_of_a_large_image_come_from_the_first_request(tiny_model_dir, fitting):
    """With a tiny autoencoder every preview is decoded by it, at any size (as A1111's TAESD previews are); the
    model's own VAE previews large latents only once a finished image has fitted the linear projection."""
    big = REQUEST.replace(width=96, height=96, steps=10, num_images=1)  # 48 x 48 latents: over VAE_MAX_TOKENS
    seen: dict[str, list] = {"tiny": [], "own": []}
    for key, options in (("tiny", {"tiny_vae": str(fitting)}), ("own", {})):
        model = load(tiny_model_dir, max_pixels=96 * 96, **options)
        model.generate(big, preview=lambda first, images, key=key: seen[key].extend(images))
    assert seen["tiny"] and all(image.size == (96, 96) for image in seen["tiny"])
    assert not seen["own"]


def test_python_app_py_with_tiny_vae_says_so_in_the_status_and_each_images_parameters(tiny_model_dir, fitting, tmp_path):
    """TINY_VAE set as `python app.py` reads it: the status API names the tiny autoencoder, and an A1111 client's
    image carries `VAE: taesd-tiny` in its infotext."""
    import httpx
    from gradio_client import Client

    from tests.app_server import running_app

    with running_app(tiny_model_dir, tmp_path, env={"TINY_VAE": str(fitting), "ALLOW_MODEL_SWITCH": "0"}) as (demo, _):
        url = demo.local_url.rstrip("/")
        reply = httpx.post(f"{url}/sdapi/v1/txt2img", json={"prompt": "a red circle", "steps": 4, "seed": 3}, timeout=120)
        reply.raise_for_status()
        infotext = json.loads(reply.json()["info"])["infotexts"][0]
        status = Client(url, verbose=False).predict(api_name="/status")
    assert ", VAE: taesd-tiny" in infotext, infotext
    assert status["vae"] == "tiny: taesd-tiny (TINY_VAE)" and status["replicas"][0]["vae"] == status["vae"]
