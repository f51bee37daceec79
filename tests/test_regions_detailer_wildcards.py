"""Regional prompts, the detailer pass and wildcards (issue 59): what a Forge user relying on Regional Prompter,
ADetailer and Dynamic Prompts sees, on the embedded model and detector, through the pipeline, the engine and the
A1111 API of the app as `python app.py` builds it (raw HTTP as those extensions' clients send it, and `webuiapi`)."""

from __future__ import annotations

import base64
import io
import json

import httpx
import numpy as np
import pytest
import torch
from dynamicprompts.generators import CombinatorialPromptGenerator, RandomPromptGenerator
from dynamicprompts.wildcards import WildcardManager
from PIL import Image

from models.scoring import classify
from models.train.world import Scene, draw, prompt_for
from pipelines.run.options import DEFAULT_MODEL, DEFAULT_WILDCARD_DIR
from pipelines.schema.regions import Box, layout, split_prompt
from pipelines.schema.request import GenerationRequest, RequestError, item_seed
from tests.app_server import embedded_model_available, running_app

pytestmark = pytest.mark.skipif(not embedded_model_available(), reason="needs the embedded model")
LEFT, RIGHT = prompt_for("red", "circle", "blue"), prompt_for("green", "square", "white")
REGIONAL = f"{LEFT} ADDCOL {RIGHT}"


@pytest.fixture(scope="module")
def pipe():
    from pipelines import ImagePipeline

    return ImagePipeline.from_pretrained(DEFAULT_MODEL)


def halves(image: Image.Image) -> list[tuple[str, str, str]]:
    """Each half's (colour, shape, background), 4 px next to the seam left out (models/eval_regions.py)."""
    a = np.asarray(image.convert("RGB"))
    w = a.shape[1] // 2
    return [(c.color, c.shape, c.background) for c in (classify(a[:, : w - 4]), classify(a[:, w + 4 :]))]


# ---------------------------------------------------------------- the regional prompt's language
def test_regional_prompter_syntax_splits_and_lays_out_the_regions():
    split = split_prompt("a photo ADDBASE sunny ADDCOMM a cat ADDCOL a dog BREAK a bird")
    assert split.base == "a photo" and split.regions == ("sunny a cat", "sunny a dog", "sunny a bird")
    assert split_prompt("sky ADDROW sea").rows and not split_prompt("sky ADDCOL sea").rows
    assert layout("1,1", 2, "Columns") == [Box(0, 0, 0.5, 1), Box(0.5, 0, 1, 1)]
    assert layout("1,3", 2, "Rows") == [Box(0, 0, 1, 0.25), Box(0, 0.25, 1, 1)]
    assert layout("1,1", 3, "Columns")[2] == Box(2 / 3, 0, 1, 1)  # the default ratio with more regions: equal
    two_d = layout("1,1,1;2,1", 3, "Columns")  # a column split in two rows, then a wider undivided column
    assert two_d == [Box(0, 0, 1 / 3, 0.5), Box(0, 0.5, 1 / 3, 1), Box(1 / 3, 0, 1, 1)]
    with pytest.raises(ValueError, match="makes 2 regions but the prompt has 3"):
        layout("1,2", 3, "Columns")
    with pytest.raises(RequestError, match="region_ratios"):
        GenerationRequest("x", regions={"regional_prompts": True, "region_ratios": "1,,2"})


def test_a_prompt_written_with_addcol_turns_regions_on_and_a_plain_one_does_not():
    assert GenerationRequest(REGIONAL).regions.regional_prompts
    assert GenerationRequest("sky ADDROW sea").regions.region_split == "Rows"
    assert GenerationRequest(LEFT).regions is None


# ---------------------------------------------------------------- the Latent method is exact per region
def test_latent_method_denoises_each_region_exactly_as_its_own_picture(pipe):
    """With regions that are the model's native 64x64, each half of a 128x64 regional run is, latent for
    latent, the 64x64 picture its own prompt makes from that half's noise."""
    from pipelines.prompts.weights import Encoder, call_embeds
    from pipelines.sampling.regional import Regional, RegionEmbeds

    p = pipe.pipe
    noise = torch.randn(1, 4, 16, 32, generator=torch.Generator().manual_seed(0))
    regional = Regional(layout("1,1", 2, "Columns"), 0.0, "Latent", step=4)
    regional.chunk = RegionEmbeds([{"prompt_embeds": call_embeds(Encoder(p, "clip"), [RIGHT], None, False)["prompt_embeds"]}], None, 1)
    common = {"output_type": "latent", "num_inference_steps": 6, "guidance_scale": 4.0}
    with regional.applied(p.unet):
        both = p(LEFT, width=128, height=64, latents=noise.clone(), **common).images
    left = p(LEFT, width=64, height=64, latents=noise[..., :16].clone(), **common).images
    right = p(RIGHT, width=64, height=64, latents=noise[..., 16:].clone(), **common).images
    assert torch.equal(both[..., :16], left) and torch.equal(both[..., 16:], right)
    assert not p.unet._diffusers_hook.hooks  # removed after
    plain = p(LEFT, width=128, height=64, latents=noise.clone(), **common).images
    assert not torch.equal(plain[..., 16:], right)


def test_two_regions_draw_two_scenes_where_one_joined_prompt_does_not(pipe):
    regional = pipe.generate(GenerationRequest(REGIONAL, width=128, height=64, seed=0, num_images=2))
    joined = pipe.generate(GenerationRequest(f"{LEFT} and {RIGHT}", width=128, height=64, seed=0, num_images=2))
    assert all(halves(image) == [("red", "circle", "blue"), ("green", "square", "white")] for image in regional.images)
    assert not any(halves(image)[1] == ("green", "square", "white") for image in joined.images)
    meta = regional.metadata[0]
    assert meta["regional_prompts"] and meta["region_method"] == "Latent" and meta["prompt"] == REGIONAL


def test_attention_method_runs_in_one_call_and_changes_the_picture(pipe):
    calls = []
    handle = pipe.pipe.unet.register_forward_hook(lambda *a: calls.append(1))
    try:
        attention = pipe.generate(GenerationRequest(REGIONAL, width=128, height=64, seed=0, steps=4,
                                                    regions={"regional_prompts": True, "region_method": "Attention"}))  # fmt: skip
    finally:
        handle.remove()
    plain = pipe.generate(GenerationRequest(LEFT, width=128, height=64, seed=0, steps=4))
    assert len(calls) == 4  # one denoiser call per step, not one per region
    assert not np.array_equal(np.asarray(attention.images[0]), np.asarray(plain.images[0]))
    assert all(type(p).__name__ != "_RegionalProcessor" for p in pipe.pipe.unet.attn_processors.values())


def test_regions_run_with_hires_fix_and_with_a_controlnet_unit(pipe):
    silhouette = draw(Scene("white", "circle", "black", 0.4, 0.5, 0.5, 0), 64).resize((128, 64))
    result = pipe.generate(GenerationRequest(REGIONAL, width=64, height=32, seed=1, steps=6, hires={"hires_fix": True},
                                             controlnet=[{"image": silhouette, "model": "shapes-silhouette", "module": "none"}]))  # fmt: skip
    assert result.images[0].size == (128, 64) and result.hires
    assert result.metadata[0]["regional_prompts"]


def test_regions_are_refused_where_the_family_cannot_take_them():
    from pipelines import ImagePipeline
    from pipelines.schema.errors import UnsupportedTaskError

    editor = ImagePipeline.from_pretrained(DEFAULT_MODEL.parent / "tiny-shapes-edit")
    with pytest.raises(UnsupportedTaskError, match="cannot take regional prompts here"):
        editor.generate(GenerationRequest("make it blue ADDCOL make it red", init_images=[draw(Scene("red", "circle", "blue", 0.5, 0.5, 0.5, 0))], steps=2))


# ---------------------------------------------------------------- the detailer
def small_shape_request(seed: int, **extra) -> GenerationRequest:
    """A 128-px scene whose shape a ControlNet silhouette makes small: where the model draws it badly (a small
    square comes out round)."""
    silhouette = draw(Scene("white", "square", "black", 0.16, 0.3, 0.6, 0), 128)
    return GenerationRequest(prompt_for("red", "square", "blue"), width=128, height=128, seed=seed,
                             controlnet=[{"image": silhouette, "model": "shapes-silhouette", "module": "none"}], **extra)  # fmt: skip


def shape_of(image: Image.Image) -> tuple[str, str]:
    found = classify(np.asarray(image.crop((16, 54, 60, 98)).resize((64, 64), Image.Resampling.LANCZOS)))
    return found.color, found.shape


def test_the_embedded_detector_finds_each_shape_of_a_drawn_scene(pipe):
    scene = Image.new("RGB", (128, 128), (40, 80, 220))
    for part in (draw(Scene("red", "circle", "black", 0.2, 0.2, 0.3, 0), 128), draw(Scene("yellow", "square", "black", 0.15, 0.7, 0.7, 0), 128)):
        mask = np.asarray(part.convert("L")) > 20
        np.asarray(scene)  # the scene as drawn so far
        scene.paste(part, mask=Image.fromarray((mask * 255).astype(np.uint8)))
    found = pipe.detectors.detect("shapes-segformer", scene, 0.3)
    assert len(found) == 2 and all(r.score > 0.5 for r in found)
    centres = sorted(tuple(np.argwhere(np.asarray(r.mask) > 127).mean(axis=0).round()) for r in found)
    assert abs(centres[0][0] - 38) < 4 and abs(centres[0][1] - 26) < 4  # the circle (row, column)
    assert abs(centres[1][0] - 90) < 4 and abs(centres[1][1] - 90) < 4  # the square


def test_detailer_repairs_a_small_shape_and_leaves_every_other_pixel(pipe):
    from pipelines.imaging.detailer import dilated

    # Seed 2: one of the 6 seeds where the model (with the ControlNet retrained on the every-size base) draws the
    # small square round; models.eval --detailer measures how often over many scenes.
    before = pipe.generate(small_shape_request(2)).images[0]
    result = pipe.generate(small_shape_request(2, detailer={"ad_model": "shapes-segformer"}))
    after = result.images[0]
    assert shape_of(before) == ("red", "circle") and shape_of(after) == ("red", "square")
    regions = pipe.detectors.detect("shapes-segformer", before, 0.3)
    touched = np.zeros((128, 128), bool)
    for region in regions:
        touched |= np.asarray(dilated(region.mask, 4)) > 127
    diff = np.abs(np.asarray(before, int) - np.asarray(after, int)).max(axis=2)
    assert diff[touched].max() > 20 and diff[~touched].max() == 0
    meta = result.metadata[0]
    assert meta["ad_model"] == "shapes-segformer" and meta["ad_denoising_strength"] == 0.9  # the model's default
    assert result.detailer == "shapes-segformer: 1 region(s) in 1 of 1 image(s)" and "detailer" in result.timings


def test_detailer_stops_between_regions_and_counts_its_steps(pipe):
    seen = []
    calls = {"n": 0}

    def stop_in_the_pass():
        calls["n"] += 1
        return bool(seen) and seen[-1][1] == 9  # once the pass's bar (9 steps: 10 x 0.9) shows
    result = pipe.generate(small_shape_request(1, steps=10, detailer={"ad_model": "shapes-segformer"}),
                           progress=lambda step, total, image: seen.append((step, total)), should_cancel=stop_in_the_pass)  # fmt: skip
    assert (10, 10) in seen and any(total == 9 for _, total in seen)
    assert result.cancelled and len(result.images) == 1


def test_a_second_pass_runs_after_the_first_and_an_unknown_detector_is_refused(pipe):
    result = pipe.generate(small_shape_request(2, steps=6, detailer={"ad_model": "shapes-segformer"},
                                               detailer_2nd={"ad_model_2nd": "shapes-segformer", "ad_confidence_2nd": 0.99}))  # fmt: skip
    assert result.metadata[0]["ad_model_2nd"] == "shapes-segformer" and result.detailer.count("shapes-segformer") == 2
    info = pipe.model_info()
    assert info.detectors == ("shapes-segformer",)
    with pytest.raises(RequestError, match=r"no detector named 'face_yolov8n\.pt'; available: shapes-segformer"):
        info.accept(GenerationRequest("x", detailer={"ad_model": "face_yolov8n.pt"}))


# ---------------------------------------------------------------- wildcards
def test_wildcards_follow_dynamic_prompts_own_semantics(pipe):
    manager = WildcardManager(DEFAULT_WILDCARD_DIR)
    template = "a {red|blue} __shape__ on a {2$$white|black|green} background"
    combos = pipe.wildcards.resolve(GenerationRequest(template, seed=3, wildcards="combinatorial"))
    assert combos.prompts == [str(p) for p in CombinatorialPromptGenerator(manager).generate(template, max_prompts=10_000)]
    assert combos.prompt_template == (template,) * len(combos.prompts) and combos.wildcards == "off"
    picks = pipe.wildcards.resolve(GenerationRequest(template, seed=3, num_images=4))
    assert picks.prompts == [str(RandomPromptGenerator(manager, seed=item_seed(3, k)).generate(template, 1)[0]) for k in range(4)]
    assert picks.num_images == 1 and picks.total_images == 4
    assert pipe.wildcards.resolve(picks) is picks  # resolved once
    off = GenerationRequest("a {red|blue} __shape__", wildcards="off", seed=1)
    assert pipe.wildcards.resolve(off) is off
    with pytest.raises(RequestError, match=r"no wildcard __hat__ in .*; available: colour, scene, shape"):
        pipe.wildcards.resolve(GenerationRequest("a __hat__", seed=1))


def test_a_seed_reproduces_the_same_resolved_prompt_and_image(pipe):
    first = pipe.generate(GenerationRequest("__scene__", seed=11, num_images=3, steps=4))
    again = pipe.generate(GenerationRequest("__scene__", seed=12, num_images=2, steps=4))  # images 2-3 of the first
    assert [m["prompt"] for m in first.metadata][1:] == [m["prompt"] for m in again.metadata]
    assert np.array_equal(np.asarray(first.images[1]), np.asarray(again.images[0]))
    assert all(m["prompt_template"] == "__scene__" and "__" not in m["prompt"] for m in first.metadata)


# ---------------------------------------------------------------- through the app's A1111 API
@pytest.fixture(scope="module")
def app(tmp_path_factory):
    with running_app(DEFAULT_MODEL, tmp_path_factory.mktemp("outputs")) as (demo, _):
        yield demo.local_url.rstrip("/")


def test_a1111_takes_regional_prompter_adetailer_and_dynamic_prompts_as_their_clients_send_them(app):
    body = {
        "prompt": REGIONAL.replace("ADDCOL", "BREAK"), "width": 128, "height": 64, "seed": 0, "batch_size": 4,
        "alwayson_scripts": {
            "Regional Prompter": {"args": [True, False, "Matrix", "Horizontal", "Mask", "Prompt", "1,1", "0.2", False, False, False, "Latent"]},
            "ADetailer": {"args": [True, False, {"ad_model": "shapes-segformer", "ad_prompt": "[PROMPT]", "ad_confidence": 0.5}]},
            "Dynamic Prompts v2.17.1": {"args": [False, False]},
        },
    }  # fmt: skip
    with httpx.Client(base_url=app, timeout=120) as http:
        answer = http.post("/sdapi/v1/txt2img", json=body).json()
        models = http.get("/adetailer/v1/ad_model").json()
        info_back = http.post("/sdapi/v1/png-info", json={"image": answer["images"][0]}).json()
    info = json.loads(answer["info"])
    assert not any("alwayson" in w for w in info["warnings"]), info["warnings"]
    images = [Image.open(io.BytesIO(base64.b64decode(b))) for b in answer["images"]]
    right = [halves(image) == [("red", "circle", "blue"), ("green", "square", "white")] for image in images]
    assert sum(right) >= 3, right  # 88 % of 60 scenes in the evaluation
    text = info["infotexts"][0]
    assert "RP Active: True" in text and "RP Matrix submode: Columns" in text and "ADetailer model: shapes-segformer" in text
    assert models == {"ad_model": ["None", "shapes-segformer"]}
    assert info_back["parameters"]["ADetailer model"] == "shapes-segformer" and info_back["parameters"]["RP Active"] == "True"


def test_webuiapi_wildcard_batch_is_one_pick_per_image(app):
    import webuiapi

    port = int(app.rsplit(":", 1)[1])
    client = webuiapi.WebUIApi(host="127.0.0.1", port=port, steps=4)
    result = client.txt2img(prompt="a {red|blue} circle on a __colour__ background", seed=5, batch_size=3, width=64, height=64)
    prompts = result.info["all_prompts"]
    assert len(prompts) == 3 and all("{" not in p and "__" not in p for p in prompts)
    assert all("Template: " in text for text in result.info["infotexts"])


def test_a_region_leaves_the_calls_own_embeddings_as_they_are():
    """The region's embeddings replace the conditional rows in a copy: diffusers reuses its prompt_embeds every
    step, so writing into them would give region 0 the last region's prompt from the second step on."""
    from pipelines.sampling.regional import _call

    own = torch.zeros(2, 154, 8)  # a long prompt: two CLIP windows
    region = {"prompt_embeds": torch.ones(1, 77, 8)}
    seen = []
    _call(lambda *a, **k: seen.append(k["encoder_hidden_states"]) or (torch.zeros(2, 4, 8, 8),), (torch.zeros(2, 4, 8, 8), 1),
          {"encoder_hidden_states": own}, own, region, 1, (0, 8, 0, 8), (8, 8))  # fmt: skip
    assert own.abs().sum() == 0 and seen[0][1, :77].eq(1).all() and seen[0][0].eq(0).all()


def test_three_columns_off_the_unets_step_with_a_controlnet_unit(pipe):
    """Region edges that fall between the UNet's down-sampled cells: the windows are cut on whole cells, so
    ControlNet's residuals at every resolution match (a 1:1:1 split of 128 px)."""
    silhouette = draw(Scene("white", "circle", "black", 0.4, 0.5, 0.5, 0), 64).resize((128, 64))
    result = pipe.generate(GenerationRequest(f"{LEFT} ADDCOL {RIGHT} ADDCOL {LEFT}", width=128, height=64, seed=1, steps=3,
                                             controlnet=[{"image": silhouette, "model": "shapes-silhouette", "module": "none"}]))  # fmt: skip
    assert result.images[0].size == (128, 64)
    with pytest.raises(RequestError, match="region 2 is less than one latent cell"):
        pipe.generate(GenerationRequest(f"{LEFT} ADDCOL {RIGHT}", width=64, height=64, steps=2,
                                        regions={"regional_prompts": True, "region_ratios": "40,1"}))  # fmt: skip


def test_wildcard_text_the_library_cannot_parse_is_refused_naming_the_prompt(pipe):
    with pytest.raises(RequestError, match=r"prompt: wildcards: .* at column"):
        pipe.wildcards.resolve(GenerationRequest("a {red|blue} cat {", seed=1))


def test_a_split_request_gives_the_same_prompts_and_images(pipe):
    """Regions, wildcard picks and the detailer pass per image: a range of the items on another replica (what a
    device pool does) gives those images bit for bit."""
    from pipelines import ImagePipeline

    replica = ImagePipeline.from_pretrained(DEFAULT_MODEL)
    request = GenerationRequest(f"a {{red|blue}} circle on a __colour__ background ADDCOL {RIGHT}", width=128, height=64,
                                seed=7, num_images=4, steps=6, detailer={"ad_model": "shapes-segformer"})  # fmt: skip
    whole = pipe.generate(request)
    part = replica.generate(request, item_range=(2, 4))
    assert [m["prompt"] for m in whole.metadata[2:]] == [m["prompt"] for m in part.metadata]
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(whole.images[2:], part.images, strict=True))
    assert len({m["prompt"] for m in whole.metadata}) > 1  # the picks differ between images
