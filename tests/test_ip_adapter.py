"""IP-Adapter image prompts: the schema part, the embedded adapter carrying a reference's colour, scale 0
and no image prompt exact, every task and ControlNet beside it, several adapters, PNG info, refusals,
SDXL. The A1111 API (an IP-Adapter unit through webuiapi) is in tests/test_a1111_api.py; every front
end's field in tests/test_fields.py."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from models.eval_control import foreground, iou
from models.eval_ip_adapter import cases
from models.scoring import classify
from models.train.control import CONTROL_OUT, silhouette
from models.train.ip_adapter import IP_ADAPTER_OUT, build_encoder, colourless_prompt, initial_adapter, write_adapter
from models.train.world import draw
from pipelines import GenerationRequest, ImagePipeline
from pipelines.pnginfo.read import parse_a1111
from pipelines.pnginfo.write import a1111_parameters
from pipelines.run.options import DEFAULT_MODEL
from pipelines.schema.errors import UnsupportedTaskError
from pipelines.schema.fields import RequestError
from tests.families import build

ADAPTER = IP_ADAPTER_OUT.name
PAIRS = cases(8, seed=41)  # (scene, reference of the scene's colour): a stream neither training nor the eval drew


@pytest.fixture(scope="module")
def pipeline():
    return ImagePipeline.from_pretrained(DEFAULT_MODEL, runtime="torch")


def prompt(reference, **fields) -> dict:
    return {"image": draw(reference), "model": ADAPTER, **fields}


def run(pipeline, scene, seed: int = 5, **fields):
    return pipeline.generate(GenerationRequest(colourless_prompt(scene, False), steps=12, seed=seed, **fields))


def same(a, b) -> bool:
    return all(x.tobytes() == y.tobytes() for x, y in zip(a.images, b.images, strict=True))


def test_an_image_prompt_is_checked_by_the_schema_and_the_refusal_names_it():
    picture = Image.new("RGB", (64, 64))
    with pytest.raises(RequestError, match=r"ip_adapter\[0\]: scale: 3 is out of range 0..2"):
        GenerationRequest("a circle", ip_adapter=[{"image": picture, "model": ADAPTER, "scale": 3}])
    with pytest.raises(RequestError, match=r"ip_adapter\[1\]: model: is required"):
        GenerationRequest("a circle", ip_adapter=[{"image": picture, "model": ADAPTER}, {"image": picture}])
    with pytest.raises(RequestError, match=r"ip_adapter\[0\]: module: is not a field of a unit"):
        GenerationRequest("a circle", ip_adapter=[{"image": picture, "model": ADAPTER, "module": "canny"}])
    with pytest.raises(RequestError, match="at most 4 units, got 5"):
        GenerationRequest("a circle", ip_adapter=[{"image": picture, "model": ADAPTER}] * 5)


def test_the_references_colour_carries_over_and_scale_0_or_none_changes_nothing(pipeline):
    """A prompt naming no colour: the shape takes the reference's colour; scale 0 is the image of no
    image prompt bit for bit, and so is a plain request after one (the adapter is unloaded)."""
    carried = [run(pipeline, s, ip_adapter=[prompt(r)]).images[0] for s, r in PAIRS]
    assert sum(classify(image).color == s.color for image, (s, _) in zip(carried, PAIRS, strict=True)) >= 6
    scene, reference = PAIRS[0]
    plain = run(pipeline, scene)
    assert same(run(pipeline, scene, ip_adapter=[prompt(reference, scale=0)]), plain)
    assert same(run(pipeline, scene), plain)
    assert pipeline.ip_loaded.names == () and pipeline.pipe.image_encoder is None  # nothing left in the UNet


def test_two_image_prompts_run_two_adapters_each_at_its_own_scale(pipeline):
    (scene, first), (_, second) = PAIRS[1], PAIRS[2]
    one = run(pipeline, scene, ip_adapter=[prompt(first)])
    assert same(run(pipeline, scene, ip_adapter=[prompt(first), prompt(second, scale=0)]), one)
    assert not same(run(pipeline, scene, ip_adapter=[prompt(first), prompt(second, scale=1)]), one)


def test_image_prompts_run_in_img2img_and_inpaint_and_beside_controlnet_units(pipeline):
    scene, reference = PAIRS[3]
    start = draw(scene)
    for fields in ({"init_images": [start], "strength": 0.9},
                   {"init_images": [start], "inpaint": {"mask": Image.new("L", (64, 64), 255)}}):  # fmt: skip
        plain = run(pipeline, scene, **fields)
        assert not same(run(pipeline, scene, ip_adapter=[prompt(reference)], **fields), plain)
    hits = 0
    for s, r in PAIRS:  # colour from the picture, place from the map (by chance: colour 1 in 8 alone)
        image = run(pipeline, s, ip_adapter=[prompt(r)], controlnet=[{"image": Image.fromarray(silhouette(s)), "model": CONTROL_OUT.name}]).images[0]
        judged = classify(image)
        hits += judged.color == s.color and iou(foreground(image, judged.background), silhouette(s)[..., 0] > 127) >= 0.5
    assert hits >= 5  # 5 of 8 with the shipped adapter (the eval: colour 78 %, IoU 0.63 over 100)


def test_image_prompts_are_written_as_a1111s_ip_adapter_units_and_read_back(pipeline):
    scene, reference = PAIRS[4]
    result = run(pipeline, scene, ip_adapter=[prompt(reference, scale=0.7)])
    assert result.metadata[0]["ip_adapter"] == [{"model": ADAPTER, "scale": 0.7}]
    text = a1111_parameters(result.metadata[0])
    assert 'ControlNet 0: "Module: ip-adapter, Model: shapes-colour, Weight: 0.7"' in text
    read = parse_a1111(text)
    assert read["ip_adapter"] == [{"model": ADAPTER, "scale": 0.7}] and "controlnet" not in read


def test_refusals_name_what_can(pipeline, family_root):
    scene, reference = PAIRS[5]
    with pytest.raises(RequestError, match=f"no IP-Adapter named 'nope'; this server has: {ADAPTER}"):
        run(pipeline, scene, ip_adapter=[prompt(reference, model="nope")])
    info = pipeline.model_info()
    assert info.ip_adapters == (ADAPTER,)
    pixart = ImagePipeline.from_pretrained(build("pixart-sigma", family_root / "pixart-sigma"))
    assert pixart.model_info().ip_adapters == ()
    with pytest.raises(UnsupportedTaskError, match="takes no image prompts here; families with IP-Adapter: StableDiffusion, StableDiffusionXL, Flux, StableDiffusion3"):
        pixart.generate(GenerationRequest("a circle", steps=2, ip_adapter=[prompt(reference)]))


def test_sdxl_runs_an_image_prompt_from_an_adapter_folder(family_root, tmp_path):
    """A random adapter for a tiny SDXL in IPADAPTER_DIR (the layout h94's files take beside their
    encoder): it changes the image, scale 0 does not."""
    pipeline = ImagePipeline.from_pretrained(build("sdxl", family_root / "sdxl"), ipadapter_dir=tmp_path, runtime="torch")
    encoder, _ = build_encoder()
    state = initial_adapter(pipeline.pipe.unet, torch.Generator().manual_seed(0))
    state["image_proj"]["proj.weight"].normal_(std=1.0)  # a random adapter that visibly steers
    write_adapter(tmp_path / "tiny-xl", state, encoder)
    assert pipeline.model_info().ip_adapters == ("shapes-colour", "tiny-xl")
    reference = draw(PAIRS[6][1])

    def go(**fields):
        return pipeline.generate(GenerationRequest("a red circle", steps=2, seed=3, width=64, height=64, **fields))

    plain = go()
    steered = go(ip_adapter=[{"image": reference, "model": "tiny-xl"}])
    assert np.abs(np.asarray(steered.images[0], float) - np.asarray(plain.images[0], float)).mean() > 1
    assert same(go(ip_adapter=[{"image": reference, "model": "tiny-xl", "scale": 0}]), plain)


def flux_adapter(transformer, generator: torch.Generator) -> dict[str, dict[str, torch.Tensor]]:
    """A random IP-Adapter for a tiny Flux transformer, in the keys diffusers' Flux loader reads (as
    diffusers' tests make theirs): an image projection to 4 tokens of the text's width, and an image
    key/value for each double-stream block."""
    from diffusers.models.embeddings import ImageProjection
    from diffusers.models.transformers.transformer_flux import FluxIPAdapterAttnProcessor

    from models.train.ip_adapter import EMBED_DIM

    width = transformer.config.joint_attention_dim
    hidden = transformer.config.num_attention_heads * transformer.config.attention_head_dim
    layers = {}
    for key in range(len(transformer.transformer_blocks)):
        processor = FluxIPAdapterAttnProcessor(hidden_size=hidden, cross_attention_dim=width, scale=1.0)
        for name, value in processor.state_dict().items():  # to_k_ip.0.weight -> 0.to_k_ip.weight
            part, _, rest = name.partition(".0.")
            layers[f"{key}.{part}.{rest}"] = torch.randn(value.shape, generator=generator) * 0.5
    projection = ImageProjection(cross_attention_dim=width, image_embed_dim=EMBED_DIM, num_image_text_embeds=4)
    image_proj = {name: value.detach().clone() for name, value in projection.state_dict().items()}
    image_proj = {name.replace("image_embeds.", "proj."): value for name, value in image_proj.items()}
    return {"image_proj": image_proj, "ip_adapter": layers}


def test_flux_runs_an_image_prompt_through_its_transformer(family_root, tmp_path):
    """Flux's IP-Adapter (XLabs' layout, its CLIP encoder beside it): the picture steers the image, another
    picture steers it elsewhere, scale 0 and a request without one give the plain image; Flux's ControlNet
    image-to-image has no image prompts in diffusers and says so."""
    from tests.test_controlnet import tiny_controlnet

    folders = {"ipadapter_dir": tmp_path / "ip", "controlnet_dir": tmp_path / "cn"}
    pipeline = ImagePipeline.from_pretrained(build("flux", family_root / "flux"), runtime="torch", **folders)
    encoder, _ = build_encoder()
    write_adapter(tmp_path / "ip" / "tiny-flux", flux_adapter(pipeline.pipe.transformer, torch.Generator().manual_seed(0)), encoder)
    tiny_controlnet("flux", pipeline.pipe).save_pretrained(tmp_path / "cn" / "tiny")
    assert "tiny-flux" in pipeline.model_info().ip_adapters

    def go(picture=None, **fields):
        prompts = [{"image": picture, "model": "tiny-flux", **fields}] if picture else []
        return pipeline.generate(GenerationRequest("a red circle", steps=2, seed=3, width=64, height=64, ip_adapter=prompts))

    def apart(a, b) -> float:
        return float(np.abs(np.asarray(a.images[0], float) - np.asarray(b.images[0], float)).mean())

    plain = go()
    red, blue = Image.new("RGB", (64, 64), "red"), draw(PAIRS[6][1])
    steered = go(red)
    assert apart(steered, plain) > 0.5 and apart(go(blue), steered) > 0.1
    assert same(go(red, scale=0), plain) and same(go(), plain)  # scale 0, and unloaded after
    with pytest.raises(UnsupportedTaskError, match="FluxControlNetImg2ImgPipeline takes no image prompts"):
        pipeline.generate(GenerationRequest("a red circle", steps=2, width=64, height=64, init_images=[red],
                                            controlnet=[{"image": red, "model": "tiny"}], ip_adapter=[{"image": red, "model": "tiny-flux"}]))  # fmt: skip


def write_sd3_adapter(folder, transformer) -> None:
    """A random IP-Adapter for a tiny SD3 transformer in InstantX's layout as diffusers reads it (its
    time-aware image projection and a joint-attention processor per block), beside a tiny SigLIP encoder
    and its image processor."""
    from diffusers.models.attention_processor import SD3IPAdapterJointAttnProcessor2_0
    from diffusers.models.embeddings import IPAdapterTimeImageProjection
    from safetensors.torch import save_file
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    torch.manual_seed(0)
    encoder = SiglipVisionModel(SiglipVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                                                   num_attention_heads=4, image_size=32, patch_size=8))  # fmt: skip
    hidden = transformer.config.attention_head_dim * transformer.config.num_attention_heads
    projection = IPAdapterTimeImageProjection(embed_dim=32, output_dim=hidden, hidden_dim=64, heads=1, num_queries=4, timestep_in_dim=32)
    flat = {f"image_proj.{k}": v for k, v in projection.state_dict().items()}
    for i in range(len(transformer.attn_processors)):
        processor = SD3IPAdapterJointAttnProcessor2_0(hidden_size=hidden, ip_hidden_states_dim=hidden,
                                                      head_dim=transformer.config.attention_head_dim, timesteps_emb_dim=64)  # fmt: skip
        flat.update({f"ip_adapter.{i}.{k}": torch.randn(v.shape) * 0.3 for k, v in processor.state_dict().items()})
    folder.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in flat.items()}, str(folder / "ip_adapter.safetensors"))
    encoder.save_pretrained(folder / "image_encoder")
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder / "image_encoder")


def test_sd3_runs_one_image_prompt_and_says_it_takes_one(family_root, tmp_path):
    """SD3's IP-Adapter (InstantX's layout, SigLIP): the picture steers, scale 0 and none give the plain
    image; two image prompts are refused, as diffusers loads one adapter into SD3."""
    pipeline = ImagePipeline.from_pretrained(build("sd3", family_root / "sd3"), ipadapter_dir=tmp_path, runtime="torch")
    write_sd3_adapter(tmp_path / "tiny-sd3", pipeline.pipe.transformer)
    assert "tiny-sd3" in pipeline.model_info().ip_adapters

    def go(*prompts: dict):
        return pipeline.generate(GenerationRequest("a red circle", steps=2, seed=3, width=64, height=64, ip_adapter=list(prompts)))

    plain, red = go(), Image.new("RGB", (64, 64), "red")
    steered = go({"image": red, "model": "tiny-sd3"})
    assert np.abs(np.asarray(steered.images[0], float) - np.asarray(plain.images[0], float)).mean() > 0.5
    assert same(go({"image": red, "model": "tiny-sd3", "scale": 0}), plain) and same(go(), plain)
    with pytest.raises(UnsupportedTaskError, match="takes 1 image prompt at a time"):
        go({"image": red, "model": "tiny-sd3"}, {"image": red, "model": "tiny-sd3"})


def test_the_evaluation_command_writes_its_figures(tmp_path):
    """`python -m models.eval --ip-adapter` as docs/controlnet.md runs it, on 2 cases and 4 steps."""
    import json

    from models.eval import main

    assert main(["--ip-adapter", "--n", "2", "--steps", "4", "--json", str(tmp_path / "ip.json")]) == 0
    report = json.loads((tmp_path / "ip.json").read_text())
    assert report["n"] == 2 and report["scale_0_identical"] is True
    assert 0 <= report["colour_match"] <= 1 and report["time_ratio"] > 0
