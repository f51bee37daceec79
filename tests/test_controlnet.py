"""ControlNet units: the schema part, the preprocessors, the embedded ControlNet placing shapes, every
family's ControlNet pipeline, metadata and PNG info, refusals. The A1111 API (webuiapi's units) is in
tests/test_a1111_api.py, the browser in tests/test_browser.py."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from models.eval_control import foreground, iou
from models.train.control import CONTROL_OUT, silhouette
from models.train.world import Scene, draw
from pipelines import GenerationRequest, ImagePipeline
from pipelines.control.controlnet import read_infotext
from pipelines.control.maps import detect
from pipelines.run.options import DEFAULT_MODEL
from pipelines.schema.control import ControlUnit
from pipelines.schema.errors import UnsupportedTaskError
from pipelines.schema.fields import RequestError
from tests.families import build
from tests.sync import Overlap

MODEL = CONTROL_OUT.name
# Shapes where the base model never puts them: a corner each (it draws them centred).
CORNERS = [
    Scene("red", "circle", "blue", 0.34, 0.27, 0.28, 0.0),
    Scene("yellow", "square", "purple", 0.32, 0.72, 0.7, 0.0),
    Scene("white", "triangle", "black", 0.36, 0.28, 0.7, 0.0),
    Scene("green", "circle", "orange", 0.3, 0.73, 0.27, 0.0),
]


@pytest.fixture(scope="module")
def pipeline():
    return ImagePipeline.from_pretrained(DEFAULT_MODEL)


def unit(scene: Scene, **fields) -> dict:
    return {"image": Image.fromarray(silhouette(scene)), "model": MODEL, **fields}


def run(pipeline, scene: Scene, seed: int = 5, **fields):
    return pipeline.generate(GenerationRequest(scene.prompt, steps=12, seed=seed, **fields))


def placement(image: Image.Image, scene: Scene) -> float:
    return iou(foreground(image, scene.background), silhouette(scene)[..., 0] > 127)


# ---------------------------------------------------------------- the schema part and the preprocessors
def test_a_unit_is_checked_by_the_schema_and_the_refusal_names_the_unit_and_its_field():
    picture = Image.new("RGB", (64, 64))
    request = GenerationRequest("a", controlnet=[{"image": picture, "model": "m [0123abcd]"}])
    assert request.controlnet[0].model_name == "m" and request.controlnet[0].weight == 1.0
    cases = [
        ({"image": picture}, "controlnet[0]: model: is required"),
        ({"image": picture, "model": "m", "weight": 3}, "controlnet[0]: weight: 3 is out of range 0..2"),
        ({"image": picture, "model": "m", "guidance_start": 0.6, "guidance_end": 0.5}, "controlnet[0]: guidance_end: starts at 0.6"),
        ({"image": picture, "model": "m", "module": "openpose_hand"}, "needs an annotator network this app does not run"),
        ({"image": picture, "model": "m", "control_mode": "loud"}, "control_mode: 'loud' is not one of Balanced"),
    ]  # fmt: skip
    for sent, said in cases:
        with pytest.raises(RequestError) as refused:
            GenerationRequest("a", controlnet=[{"image": picture, "model": "ok"}, sent])
        assert said.replace("[0]", "[1]") in str(refused.value)
        assert refused.value.field == "controlnet" and refused.value.sub == (1,)


def test_the_preprocessors_make_the_maps_controlnets_expect():
    picture = Image.new("RGB", (64, 64), (240, 240, 240))
    ImageDraw.Draw(picture).rectangle((16, 16, 47, 47), fill=(20, 20, 200))
    edges = np.asarray(detect(picture, "canny"))[..., 0] > 0
    assert edges[15, 20:44].all() and edges[47, 20:44].all() and not edges[30, 30] and not edges[2, 2]  # the border only
    faint = Image.new("RGB", (64, 64), (120, 120, 120))
    ImageDraw.Draw(faint).rectangle((16, 16, 47, 47), fill=(135, 135, 135))
    assert not np.asarray(detect(faint, "canny")).any() and np.asarray(detect(faint, "canny", a=10, b=30)).any()
    drawn = np.asarray(detect(picture, "scribble"))[..., 0]
    assert drawn[30, 30] == 255 and drawn[2, 2] == 0  # dark strokes on light paper: white on black
    soft = np.asarray(detect(picture, "softedge"))[..., 0]
    assert soft[15, 30] > 200 and soft[30, 30] == 0
    assert np.asarray(detect(picture, "tile", a=8)).std() < np.asarray(picture).std()  # detail blurred away
    assert detect(picture, "canny", resolution=128).size == (128, 128)
    assert detect(picture, "invert").getpixel((30, 30)) == (235, 235, 55)


# ---------------------------------------------------------------- the embedded ControlNet, as a user sees it
def test_a_silhouette_puts_the_shape_where_the_map_says_and_weight_zero_changes_nothing(pipeline):
    without, placed = [], []
    for i, scene in enumerate(CORNERS):
        plain = run(pipeline, scene, i)
        controlled = run(pipeline, scene, i, controlnet=[unit(scene)])
        without.append(placement(plain.images[0], scene))
        placed.append(placement(controlled.images[0], scene))
        assert controlled.metadata[0]["controlnet"][0]["model"] == MODEL
    assert np.mean(placed) >= 0.6 and np.mean(without) <= 0.35, (placed, without)
    assert f"ControlNet {MODEL} 11 MB" in pipeline.status()[0].weights  # what the status panel shows
    zero = run(pipeline, CORNERS[0], 0, controlnet=[unit(CORNERS[0], weight=0)])
    assert zero.images[0].tobytes() == run(pipeline, CORNERS[0], 0).images[0].tobytes()


def test_a_canny_map_of_a_picture_places_the_shape_and_units_run_in_img2img_and_inpaint(pipeline):
    scene = CORNERS[1]
    picture = draw(scene)  # what a user uploads: the canny preprocessor makes the map
    edges = run(pipeline, scene, 3, controlnet=[{"image": picture, "module": "canny", "model": MODEL}])
    assert placement(edges.images[0], scene) >= 0.5
    start = run(pipeline, CORNERS[0], 3).images[0]
    edit = run(pipeline, scene, 3, init_images=[start], strength=0.9, controlnet=[unit(scene)])
    plain_edit = run(pipeline, scene, 3, init_images=[start], strength=0.9)
    assert placement(edit.images[0], scene) > placement(plain_edit.images[0], scene) + 0.2
    mask = Image.new("L", (64, 64), 255)
    inpaint = run(pipeline, scene, 3, init_images=[start], inpaint={"mask": mask}, controlnet=[unit(scene)])
    assert placement(inpaint.images[0], scene) >= 0.5


def test_two_units_start_end_and_modes_run_and_what_cannot_is_said(pipeline):
    scene = CORNERS[2]
    late = run(pipeline, scene, 1, controlnet=[unit(scene, guidance_start=0.9)])
    full = run(pipeline, scene, 1, controlnet=[unit(scene)])
    assert placement(full.images[0], scene) > placement(late.images[0], scene)  # too late to place it
    two = run(pipeline, scene, 1, controlnet=[unit(scene), unit(scene, module="canny", control_mode="ControlNet is more important")])
    assert any("one switch per call" in w for w in two.warnings) and len(two.metadata[0]["controlnet"]) == 2


def test_units_are_written_as_a1111s_infotext_and_read_back(pipeline):
    from pipelines.pnginfo.read import parse_a1111
    from pipelines.pnginfo.write import a1111_parameters

    result = run(pipeline, CORNERS[0], controlnet=[unit(CORNERS[0], module="canny", weight=0.8, threshold_a=50)])
    text = a1111_parameters(result.metadata[0])
    assert f'ControlNet 0: "Module: canny, Model: {MODEL}, Weight: 0.8, Resize Mode: Crop and Resize' in text
    units = parse_a1111(text)["controlnet"]
    assert units == read_infotext(parse_a1111(text)["extra"])
    assert ControlUnit(image=Image.new("RGB", (8, 8)), **units[0]).threshold_a == 50


def test_refusals_name_what_can(pipeline, family_root):
    with pytest.raises(RequestError, match=f"no ControlNet named 'nope'; this server has: {MODEL}"):
        run(pipeline, CORNERS[0], controlnet=[unit(CORNERS[0], model="nope")])
    info = pipeline.model_info()
    assert MODEL in info.controlnets and info.controlnet_tasks == ("txt2img", "img2img", "inpaint")
    editor = ImagePipeline.from_pretrained(build("instruct-pix2pix", family_root / "instruct-pix2pix"))
    with pytest.raises(UnsupportedTaskError, match="has no ControlNet pipeline in diffusers; families with ControlNet: StableDiffusion, StableDiffusionXL"):
        editor.generate(GenerationRequest("make it red", steps=2, init_images=[Image.new("RGB", (32, 32))], controlnet=[unit(CORNERS[0])]))


# ---------------------------------------------------------------- every family with a ControlNet in diffusers
def tiny_controlnet(name: str, pipe):
    """A ControlNet for family `name` from its denoiser, as diffusers' tests make theirs; its zero
    convolutions randomised, so a unit changes the image (zero-initialised, it would not)."""
    import diffusers

    if name in ("sd15", "sdxl"):
        model = diffusers.ControlNetModel.from_unet(pipe.unet)
    else:  # the transformer's config, one block (and Flux one single block)
        cls = {"sd3": "SD3ControlNetModel", "flux": "FluxControlNetModel", "qwen-image": "QwenImageControlNetModel",
               "sana": "SanaControlNetModel"}[name]  # fmt: skip
        small = {"num_layers": 1, **({"num_single_layers": 1} if name == "flux" else {})}
        model = getattr(diffusers, cls).from_config({**pipe.transformer.config, **small})
    return randomised(model)


def randomised(model):
    """`model` with its zero convolutions (or projections) drawn at random: a unit changes the image."""
    import torch

    torch.manual_seed(0)
    for module_name, parameter in model.named_parameters():
        zero = "controlnet" in module_name and ("blocks" in module_name or "mid_block" in module_name or "x_embedder" in module_name)
        if zero or module_name.startswith("spatial_ch_projs"):  # the last: a union model's type-aware projection
            torch.nn.init.normal_(parameter, std=0.05)
    return model


def apart(a, b) -> float:
    """Mean absolute difference of two results' first images, in 0..255."""
    return float(np.abs(np.asarray(a.images[0], float) - np.asarray(b.images[0], float)).mean())


# Whose tiny denoiser adds the ControlNet's residuals: a one-block SD3 or Sana transformer skips them
# (SD3 adds none to its last, context-only block; Sana none to its first), so there only the call is seen.
ADDS_RESIDUALS = {"sd15", "sdxl", "flux", "qwen-image"}
# Where diffusers' ControlNet pipeline is the plain pipeline at weight 0. Flux's and Qwen-Image's are not
# (raw diffusers, zero-initialised ControlNet at scale 0: mean difference 0.15 and 0.05 of full scale).
WEIGHT_ZERO_IS_PLAIN = {"sd15", "sdxl", "sd3", "sana"}


@pytest.mark.parametrize("name", ["sd15", "sdxl", "sd3", "flux", "qwen-image", "sana"])
def test_every_family_with_a_diffusers_controlnet_runs_a_unit(name, family_root, tmp_path):
    path = build(name, family_root / name)
    pipeline = ImagePipeline.from_pretrained(path, controlnet_dir=tmp_path)
    tiny_controlnet(name, pipeline.pipe).save_pretrained(tmp_path / "tiny")
    calls = []
    pipeline.controlnets.get("tiny").register_forward_hook(lambda module, args, out: calls.append(1))
    picture = Image.new("RGB", (64, 64), "black")
    ImageDraw.Draw(picture).ellipse((16, 16, 40, 40), fill="white")
    sent = {"image": picture, "model": "tiny"}

    def run(**fields):
        return pipeline.generate(GenerationRequest("a red circle", steps=2, seed=3, width=64, height=64, **fields))

    plain, controlled = run(), run(controlnet=[sent])
    assert calls and controlled.images[0].size == (64, 64) and controlled.metadata[0]["controlnet"][0]["model"] == "tiny"
    if name in ADDS_RESIDUALS:
        assert apart(controlled, plain) > 1
    if name in WEIGHT_ZERO_IS_PLAIN:
        assert apart(run(controlnet=[{**sent, "weight": 0}]), plain) == 0


@pytest.mark.parametrize("name", ["sdxl", "flux"])
def test_a_union_controlnet_takes_each_units_control_type(name, family_root, tmp_path):
    """A union model (SDXL's ControlNet++ class, Flux's with num_mode) runs the unit as the control type it
    names, or its preprocessor's; a type the model lacks, or a map of no known type, is refused naming the
    types it takes. On SDXL two units share one call of the union model."""
    import diffusers

    from pipelines.pnginfo.write import a1111_parameters

    path = build(name, family_root / name)
    pipeline = ImagePipeline.from_pretrained(path, controlnet_dir=tmp_path)
    if name == "sdxl":
        config = diffusers.ControlNetUnionModel.from_unet(pipeline.pipe.unet).config  # 6 types, as ControlNet++'s union
        width = config.block_out_channels[0]  # its condition transformer at the tiny UNet's width (320 in SDXL)
        model = diffusers.ControlNetUnionModel.from_config(config, num_trans_channel=width, num_proj_channel=width, num_trans_head=2)
    else:
        small = {"num_layers": 1, "num_single_layers": 1, "num_mode": 10}  # InstantX's union has 10 modes
        model = diffusers.FluxControlNetModel.from_config({**pipeline.pipe.transformer.config, **small})
    randomised(model).save_pretrained(tmp_path / "union")
    picture = Image.new("RGB", (64, 64), "black")
    ImageDraw.Draw(picture).ellipse((16, 16, 40, 40), outline="white", width=3)
    given = []  # the mode each call of the union model got (SDXL: control_type_idx, Flux: controlnet_mode)

    def record(module, args, kwargs):
        mode = kwargs.get("control_type_idx", kwargs.get("controlnet_mode"))
        given.append(mode if isinstance(mode, list) else int(mode.flatten()[0]))

    pipeline.controlnets.get("union").register_forward_pre_hook(record, with_kwargs=True)

    def run(*units: dict):
        given.clear()
        sent = [{"image": picture, "model": "union", **unit} for unit in units]
        return pipeline.generate(GenerationRequest("a red circle", steps=2, seed=3, width=64, height=64, controlnet=sent))

    depth = run({"control_type": "Depth"})
    assert given[0] == {"sdxl": [1], "flux": 2}[name]  # ControlNet++'s and InstantX's numbering of Depth
    edges = run({"control_type": "Hard Edge"})
    assert given[0] == {"sdxl": [3], "flux": 0}[name] and apart(depth, edges) > 0  # the type is the model's input
    assert apart(run({"module": "canny", "control_type": "Hard Edge"}), run({"module": "canny"})) == 0  # canny's type
    assert depth.metadata[0]["controlnet"][0]["control_type"] == "Depth"
    assert 'Union Control Type: Depth"' in a1111_parameters(depth.metadata[0])
    takes = {"sdxl": "OpenPose, Depth, Soft Edge, Hard Edge, Normal Map, Segmentation", "flux": "Hard Edge, Tile, Depth, OpenPose"}[name]
    with pytest.raises(RequestError, match=re.escape(f"controlnet[0]: control_type: union is a union ControlNet: name the kind of map ({takes}); preprocessor 'none'")):
        run({"module": "none"})
    missing = {"sdxl": "Tile", "flux": "Segmentation"}[name]
    with pytest.raises(RequestError, match=f"control_type: union takes .*, not {missing}"):
        run({"control_type": missing})
    if name == "sdxl":
        both = run({"control_type": "Depth"}, {"control_type": "Hard Edge", "weight": 0.5})
        assert given == [[1, 3], [1, 3]]  # one call per step, with both conditions
        assert type(pipeline.twins.control[1]).__name__ == "StableDiffusionXLControlNetUnionPipeline"
        assert type(pipeline.twins.control[1].controlnet).__name__ == "ControlNetUnionModel"  # one call, two conditions
        assert apart(both, depth) > 0.1  # the second condition steers too


def test_controlnet_models_offers_folders_by_name_and_hub_ids_by_id(tmp_path):
    """CONTROLNET_MODELS: a folder outside CONTROLNET_DIR runs under its folder's name (the same weights,
    the same image); a Hub id is listed by its id and, where the Hub cannot be reached (the tests run with
    HF_HUB_OFFLINE=1), refused before any work, saying so. A value that is neither is refused at start."""
    import shutil

    from config import SettingsError
    from pipelines.run.options import PipelineOptions

    shutil.copytree(CONTROL_OUT, tmp_path / "my-silhouette")
    refs = PipelineOptions.from_env({"CONTROLNET_MODELS": f"{tmp_path / 'my-silhouette'}, someone/controlnet-x"}).controlnet_models
    assert refs == (str(tmp_path / "my-silhouette"), "someone/controlnet-x")
    with pytest.raises(SettingsError, match="CONTROLNET_MODELS='not an id' is not valid: expected comma-separated Hub ids"):
        PipelineOptions.from_env({"CONTROLNET_MODELS": "not an id"})
    pipeline = ImagePipeline.from_pretrained(DEFAULT_MODEL, controlnet_models=refs)
    assert {"my-silhouette", "someone/controlnet-x", MODEL} <= set(pipeline.model_info().controlnets)
    scene = CORNERS[0]
    mine, embedded = run(pipeline, scene, controlnet=[unit(scene, model="my-silhouette")]), run(pipeline, scene, controlnet=[unit(scene)])
    assert mine.images[0].tobytes() == embedded.images[0].tobytes()
    with pytest.raises(UnsupportedTaskError, match="'someone/controlnet-x' could not be read from the Hub"):
        run(pipeline, scene, controlnet=[unit(scene, model="someone/controlnet-x")])


def test_a_t2i_adapter_unit_runs_in_text_to_image_and_says_what_it_cannot(family_root, tmp_path):
    """A T2I-Adapter in CONTROLNET_DIR is a unit's model like a ControlNet: its map steers, weight 0 is the
    plain image, the ending step is its conditioning factor, two run as one MultiAdapter; image-to-image
    and a mix with a ControlNet are refused, saying why."""
    import diffusers

    pipeline = ImagePipeline.from_pretrained(build("sd15", family_root / "sd15"), controlnet_dir=tmp_path)
    torch.manual_seed(0)
    channels = list(pipeline.pipe.unet.config.block_out_channels)
    diffusers.T2IAdapter(in_channels=3, channels=channels, num_res_blocks=1, downscale_factor=8).save_pretrained(tmp_path / "t2i")
    tiny_controlnet("sd15", pipeline.pipe).save_pretrained(tmp_path / "cn")
    picture = Image.new("RGB", (64, 64), "black")
    ImageDraw.Draw(picture).ellipse((16, 16, 40, 40), fill="white")

    def run(*units: dict, **fields):
        sent = [{"image": picture, "model": "t2i", **unit} for unit in units]
        return pipeline.generate(GenerationRequest("a red circle", steps=4, seed=3, width=64, height=64, controlnet=sent, **fields))

    plain, steered = run(), run({})
    assert type(pipeline.twins.control[1]).__name__ == "StableDiffusionAdapterPipeline" and apart(steered, plain) > 1
    assert apart(run({"weight": 0}), plain) == 0
    half = run({"guidance_end": 0.5})  # SD's adapter pipeline has no conditioning factor (SDXL's has)
    assert apart(half, steered) == 0 and any("ending control step was not applied" in w for w in half.warnings)
    both = run({}, {"weight": 0.5, "guidance_start": 0.25})
    assert type(pipeline.twins.control[1].adapter).__name__ == "MultiAdapter" and apart(both, steered) > 0
    assert any("starting control step was not applied" in w for w in both.warnings)
    with pytest.raises(UnsupportedTaskError, match="T2I-Adapters run in text-to-image only"):
        run({}, init_images=[picture])
    with pytest.raises(UnsupportedTaskError, match="T2I-Adapters and ControlNets in different pipelines"):
        run({}, {"model": "cn"})


def test_a_pool_of_two_cpu_replicas_gives_the_single_replicas_images_with_a_unit(pipeline, monkeypatch):
    """CPU_REPLICAS=2: a request of 4 images with a unit is split over the replicas (each loads the
    ControlNet on its own device, the two loads forced to overlap) and the seeds give the one-replica
    images; after it, a module built anywhere in the process still has real weights."""
    import accelerate

    from devices.options import DeviceSettings
    from pipelines.run.options import PipelineOptions
    from serving.pool import DevicePool

    pool = DevicePool.from_pretrained(str(DEFAULT_MODEL), "cpu", PipelineOptions(), DeviceSettings(cpu_replicas=2))
    register = torch.nn.Module.register_parameter
    overlap = Overlap(accelerate.init_empty_weights)
    monkeypatch.setattr(accelerate, "init_empty_weights", overlap)
    try:
        scene = CORNERS[3]
        four = GenerationRequest(scene.prompt, steps=8, seed=21, num_images=4, controlnet=[unit(scene)])
        pooled = pool.generate(four)
        assert overlap.threads == 2  # each replica built its ControlNet inside the swap
        assert torch.nn.Linear(2, 2).weight.device.type == "cpu"  # not "meta": the swap was undone
        single = pipeline.generate(four)
        assert pooled.seeds == single.seeds == [21, 22, 23, 24]
        for a, b in zip(pooled.images, single.images, strict=True):
            assert np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max() <= 2
        assert placement(pooled.images[0], scene) >= 0.5
    finally:
        torch.nn.Module.register_parameter = register  # a failure here must not break every later test
        pool.close()


def test_send_to_generate_restores_a_pngs_units_settings(pipeline):
    from pipelines.pnginfo.read import parse_a1111
    from ui.send import form_values

    text = ('a red circle on a blue background\nSteps: 12, Sampler: Euler, CFG scale: 4, Seed: 5, Size: 64x64, Model: tiny-shapes, '
            f'ControlNet 0: "Module: canny, Model: {MODEL}, Weight: 0.8, Resize Mode: Just Resize, Processor Res: 64, '
            'Threshold A: 50, Threshold B: 150, Guidance Start: 0.1, Guidance End: 0.9, Control Mode: My prompt is more important"')  # fmt: skip
    values, notes = form_values(parse_a1111(text), pipeline.model_info())
    assert values["controlnet"] == [{"module": "canny", "model": MODEL, "weight": 0.8, "resize_mode": "Just Resize",
                                     "processor_res": 64, "threshold_a": 50.0, "threshold_b": 150.0, "guidance_start": 0.1,
                                     "guidance_end": 0.9, "control_mode": "My prompt is more important"}]  # fmt: skip
    assert any("add their control images" in note for note in notes)


def test_the_panel_restores_a1111_module_names_and_takes_a_sent_picture_in_a_free_unit():
    """Send to Generate: A1111's "depth_midas" shows as our "depth" where offered, and one this server does
    not offer leaves the form's own. Send to ControlNet: the first unit without an image gets the picture."""
    import gradio as gr

    from ui import control_panel

    with gr.Blocks():
        panel = control_panel.build("", [MODEL], "ControlNet", ["none", "canny", "depth"])
    first, second = panel.units
    out = panel.fill([{"module": "depth_midas", "weight": 0.5}, {"module": "seg_ofade20k", "weight": 0.7}])
    assert out[first.settings["module"]]["value"] == "depth" and out[first.settings["weight"]]["value"] == 0.5
    assert second.settings["module"] not in out and out[second.settings["weight"]]["value"] == 0.7
    picture = Image.new("RGB", (8, 8))
    sent = panel.receive("made.png", [picture, None])
    assert sent[second.image]["value"] == "made.png" and sent[second.enabled]["value"] is True and first.image not in sent
    assert sent[panel.tabs].selected == 1 and sent[panel.accordion].open is True
    sent = panel.receive("made.png", [picture, picture])  # every unit has one: the first is replaced
    assert sent[first.image]["value"] == "made.png" and sent[panel.tabs].selected == 0


def test_an_endpoints_base64_unit_image_is_checked_before_it_is_decoded():
    """`/generate`'s `controlnet` arrives as JSON: base64 images are decoded after the pixel check, and a
    path is never opened (a caller does not name files on the server)."""
    import base64
    import io

    from engine.inputs import Limits
    from tests.test_fields import MODEL
    from ui.uploads import InputError, unit_images

    def b64(image: Image.Image) -> str:
        buffer = io.BytesIO()
        image.save(buffer, format="PNG")
        return base64.b64encode(buffer.getvalue()).decode()

    limits = Limits(MODEL, 2000, 16, 100 * 100)
    (got,) = unit_images([{"image": "data:image/png;base64," + b64(Image.new("RGB", (64, 48), "red")), "model": MODEL}], "controlnet", limits)
    assert got["image"].size == (64, 48) and got["image"].getpixel((0, 0)) == (255, 0, 0)
    with pytest.raises(InputError, match=r"controlnet\[0\].image: 200x200 = 40000 pixels, more than the limit of 10000"):
        unit_images([{"image": b64(Image.new("RGB", (200, 200))), "model": MODEL}], "controlnet", limits)
    with pytest.raises(InputError, match="expected a base64-encoded image"):
        unit_images([{"image": str(DEFAULT_MODEL / "samples.png"), "model": MODEL}], "controlnet", limits)
