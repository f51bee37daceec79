"""Inpainting and outpainting through the public API (GenerationRequest + Inpaint), on the embedded
model as `python app.py` serves it, and on the other backends (device pool, recipes).

What a user would notice: pixels they did not paint never change; the same seed gives the same
image; an empty or mismatched mask is answered clearly; the PNG says how it was made.
"""

from __future__ import annotations

import json
import random

import numpy as np
import pytest
from PIL import Image

from devices import DeviceManager
from engine import Caller, Preview, build_engine
from pipelines import GenerationRequest, ImagePipeline, save_images
from pipelines.imaging.inpaint import EMPTY_MASK_WARNING, binary_mask, extend_canvas, fill
from pipelines.pnginfo.read import parse_a1111, read_png_info
from pipelines.run.options import DEFAULT_MODEL
from pipelines.schema.errors import UnsupportedTaskError
from pipelines.schema.inpaint import Inpaint
from serving.pool import DevicePool
from tests.app_server import app_settings, embedded_model_available

pytestmark = pytest.mark.skipif(not embedded_model_available(), reason="needs the embedded model")

PROMPT = "a red square on a white background"


def scene(seed: int = 1) -> Image.Image:
    from models.train.world import draw, random_scene

    return draw(random_scene(random.Random(seed)))


def box_mask(box=(16, 16, 48, 48), size=(64, 64)) -> Image.Image:
    mask = Image.new("L", size, 0)
    mask.paste(255, box)
    return mask


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def request(mask=None, image=None, **kw) -> GenerationRequest:
    image = image or scene()
    spec = kw.pop("spec", {})
    kw = {"prompt": PROMPT, "steps": 8, "seed": 5, "strength": 1.0, **kw}
    return GenerationRequest(init_images=[image], inpaint=Inpaint(mask=mask or box_mask(size=image.size), **spec), **kw)


@pytest.fixture(scope="module")
def app_engine(tmp_path_factory):
    """The engine exactly as `python app.py` builds it (the embedded model with its editor beside it)."""
    engine = build_engine(app_settings(DEFAULT_MODEL, tmp_path_factory.mktemp("out")))
    yield engine
    engine.close()


@pytest.fixture(scope="module")
def embedded():
    return ImagePipeline.from_pretrained(DEFAULT_MODEL, DeviceManager("cpu"), memory_mode="off")


def test_the_app_inpaints_with_the_main_model_not_the_instruction_editor(app_engine):
    """python app.py routes images to the editor, which cannot inpaint: an inpaint must reach the main model."""
    assert app_engine.model_info().inpaint
    events = list(app_engine.submit(request(num_images=2), Caller(session="s")).events(timeout=300))
    assert any(isinstance(e, Preview) for e in events[:-1]), "no live preview of the inpaint"
    result = events[-1].result
    assert result.metadata[0]["model"] == "tiny-shapes" and result.seeds == [5, 6]
    outside = np.asarray(box_mask()) == 0
    for image in result.images:
        assert (pixels(image) == pixels(scene()))[outside].all()


@pytest.mark.parametrize(
    "spec",
    [{}, {"masked_content": "fill"}, {"inpaint_area": "only masked", "padding": 4}, {"mask_blur": 0}],
    ids=["defaults", "fill", "only-masked", "no-blur"],
)
def test_unpainted_pixels_stay_exactly_and_the_painted_box_changes(embedded, spec):
    original = scene()
    result = embedded.generate(request(strength=0.9, spec=spec))
    out, mask = pixels(result.images[0]), np.asarray(box_mask()) > 0
    assert result.images[0].size == original.size
    assert (out == pixels(original))[~mask].all()
    assert np.abs(out - pixels(original))[mask].mean() > 5
    meta = result.metadata[0]
    assert {k: meta[k] for k in ("mask_blur", "masked_content", "inpaint_area")} == {
        "mask_blur": spec.get("mask_blur", 4),
        "masked_content": spec.get("masked_content", "original"),
        "inpaint_area": spec.get("inpaint_area", "whole picture"),
    }


def test_invert_repaints_everything_but_the_strokes(embedded):
    original = scene()
    result = embedded.generate(request(spec={"invert_mask": True}, prompt="a red circle on a black background"))
    kept = np.asarray(box_mask()) > 0
    assert (pixels(result.images[0]) == pixels(original))[kept].all()
    assert np.abs(pixels(result.images[0]) - pixels(original))[~kept].mean() > 5


def test_an_empty_mask_returns_the_original_with_a_warning(embedded):
    original = scene()
    for mask, invert in ((Image.new("L", (64, 64), 0), False), (Image.new("L", (64, 64), 255), True)):
        result = embedded.generate(request(mask, spec={"invert_mask": invert}, num_images=2))
        assert result.warnings == [EMPTY_MASK_WARNING]
        assert all((pixels(im) == pixels(original)).all() for im in result.images) and result.seeds == [5, 6]


def test_a_mask_of_another_size_is_refused_naming_both_sizes(embedded):
    with pytest.raises(ValueError, match="mask: 64x48 but input image 0 is 64x64"):
        embedded.generate(request(box_mask(size=(64, 48))))
    with pytest.raises(ValueError, match="masked_content"):
        embedded.generate(request(spec={"masked_content": "latent noise"}))
    with pytest.raises(ValueError, match="needs the input image"):
        embedded.generate(GenerationRequest(prompt=PROMPT, inpaint=Inpaint(mask=box_mask())))


def test_same_seed_same_image_alone_in_a_batch_and_on_a_pool_of_two(embedded):
    batch = embedded.generate(request(num_images=4))
    alone = embedded.generate(request(seed=7))
    assert np.abs(pixels(alone.images[0]) - pixels(batch.images[2])).max() <= 1
    pool = DevicePool.from_pretrained(DEFAULT_MODEL, "cpu,cpu")
    try:
        split = pool.generate(request(num_images=4))
    finally:
        pool.close()
    assert split.seeds == batch.seeds == [5, 6, 7, 8]
    for a, b in zip(split.images, batch.images, strict=True):
        assert np.abs(pixels(a) - pixels(b)).max() <= 1


def test_outpaint_extends_the_canvas_and_keeps_the_picture(embedded):
    original = scene()
    canvas, mask = extend_canvas(original, right=32, step=embedded.size_multiple)
    assert canvas.size == (96, 64) and binary_mask(mask).getbbox() == (64, 0, 96, 64)
    result = embedded.generate(request(mask, image=canvas, prompt="a blue circle on a green background"))
    assert result.images[0].size == (96, 64)
    assert (pixels(result.images[0])[:, :64] == pixels(original)).all()
    with pytest.raises(ValueError, match="outpaint left: 12 is not a multiple of 8"):
        extend_canvas(original, left=12, step=8)
    with pytest.raises(ValueError, match="extend at least one side"):
        extend_canvas(original, step=8)


def test_fill_paints_the_masked_area_with_its_surroundings():
    original = scene()
    mask = box_mask((8, 8, 56, 56))
    filled = pixels(fill(original, binary_mask(mask)))
    assert (filled == pixels(original))[np.asarray(mask) == 0].all()
    background = pixels(original)[0, 0]
    assert np.abs(filled[24:40, 24:40] - background).max() < 40, "the old shape shows through the fill"


def test_brush_strokes_count_by_alpha_and_any_grey():
    layer = Image.new("RGBA", (8, 8), (0, 0, 0, 0))
    layer.putpixel((2, 3), (255, 255, 255, 90))
    assert binary_mask(layer).getbbox() == (2, 3, 3, 4)
    grey = Image.new("L", (8, 8), 0)
    grey.putpixel((5, 5), 40)
    assert binary_mask(grey).getbbox() == (5, 5, 6, 6)


def test_the_png_records_the_inpaint_as_a1111_does_and_reads_it_back(embedded, tmp_path):
    result = embedded.generate(request(spec={"inpaint_area": "only masked", "padding": 8, "invert_mask": False}))
    path = save_images(result, tmp_path)[0]
    info = read_png_info(path)
    assert "Mask blur: 4, Masked content: original, Inpaint area: Only masked, Masked area padding: 8" in info["raw"]
    params = info["parameters"]
    assert (params["strength"], params["mask_blur"], params["inpaint_area"], params["padding"]) == (
        1.0, 4, "only masked", 8,
    )  # fmt: skip
    # an A1111 inpaint: it leaves out what is at its default (whole picture, no padding)
    a1111 = parse_a1111(
        "a cat\nSteps: 20, Seed: 1, Denoising strength: 0.75, Mask blur: 8, Mask mode: Inpaint not masked"
    )
    assert (a1111["mask_blur"], a1111["inpaint_area"], a1111["invert_mask"]) == (8, "whole picture", True)
    assert "masked_content" not in a1111 and "padding" not in a1111


def test_a_model_that_cannot_inpaint_says_which_families_can(tmp_path):
    from serving.editing import EMBEDDED_EDITOR

    editor = ImagePipeline.from_pretrained(str(EMBEDDED_EDITOR), DeviceManager("cpu"), memory_mode="off")
    assert not editor.model_info().inpaint
    with pytest.raises(UnsupportedTaskError, match=r"cannot inpaint.*Stable Diffusion.*SDXL.*Flux.*Qwen-Image"):
        editor.generate(request())


def test_a_recipe_names_an_inpainting_pipeline_or_checkpoint(tmp_path, tiny_model_dir):
    """`pipeline_class` loads an inpainting checkpoint as such (task "inpaint": it needs a mask);
    `inpaint_pipeline` names the class built with from_pipe for masks."""
    native = tmp_path / "tiny-inpaint.json"
    native.write_text(json.dumps({"name": "tiny-inpaint", "source": str(tiny_model_dir),
                                  "pipeline_class": "StableDiffusionInpaintPipeline", "task": "inpaint"}))  # fmt: skip
    pipe = ImagePipeline.from_pretrained(str(native), DeviceManager("cpu"), memory_mode="off")
    info = pipe.model_info()
    assert (info.inpaint, info.text_to_image, info.image_to_image) == (True, False, False)
    with pytest.raises(UnsupportedTaskError, match="inpainting model: it needs an input image and a mask"):
        pipe.generate(GenerationRequest(prompt="a cat", steps=2, seed=1))
    image = Image.new("RGB", (32, 32), (200, 30, 30))
    result = pipe.generate(request(box_mask((8, 8, 24, 24), (32, 32)), image=image, steps=2, prompt="a cat"))
    assert (pixels(result.images[0])[0] == (200, 30, 30)).all()
    named = tmp_path / "tiny-named.json"
    named.write_text(json.dumps({"name": "tiny-named", "source": str(tiny_model_dir),
                                 "inpaint_pipeline": "StableDiffusionPAGInpaintPipeline"}))  # fmt: skip
    pipe = ImagePipeline.from_pretrained(str(named), DeviceManager("cpu"), memory_mode="off")
    assert pipe.traits.inpaint == "StableDiffusionPAGInpaintPipeline"
    assert type(pipe.twins.inpaint_pipeline()).__name__ == "StableDiffusionPAGInpaintPipeline"


def test_the_command_line_inpaints_and_outpaints(tmp_path):
    from engine.__main__ import main

    scene().save(tmp_path / "in.png")
    box_mask().save(tmp_path / "mask.png")
    common = ["--init-image", str(tmp_path / "in.png"), "--steps", "4", "--seed", "3"]
    assert main([PROMPT, *common, "--mask", str(tmp_path / "mask.png"), "--out", str(tmp_path / "a")]) == 0
    assert main(["a white background", *common, "--outpaint", "0,0,32,0", "--out", str(tmp_path / "b")]) == 0
    (inpainted,), (outpainted,) = (list((tmp_path / d).glob("*.png")) for d in "ab")
    kept = np.asarray(box_mask()) == 0
    assert (pixels(Image.open(inpainted)) == pixels(scene()))[kept].all()
    assert read_png_info(inpainted)["parameters"]["mask_blur"] == 4
    assert (pixels(Image.open(outpainted))[:, :64] == pixels(scene())).all()
    assert main(["x", *common, "--outpaint", "0,0,30,0", "--out", str(tmp_path / "c")]) == 2
