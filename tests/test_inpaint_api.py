"""/inpaint and /outpaint through gradio_client against the app as `python app.py` builds it
(the embedded tiny-shapes model, which inpaints, with its instruction editor beside it); and Send
to Inpaint's form values."""

from __future__ import annotations

import random

import numpy as np
import pytest
from gradio_client import Client, handle_file
from PIL import Image, ImageDraw

from pipelines.imaging.inpaint import EMPTY_MASK_WARNING
from pipelines.run.options import DEFAULT_MODEL
from tests.app_server import embedded_model_available, running_app

PROMPT = "a red circle on a blue background"
BOX = (16, 16, 40, 40)  # the mask's white box (x1, y1, x2, y2), inclusive


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if not embedded_model_available():
        pytest.skip("needs the embedded model (models/tiny-shapes)")
    with running_app(DEFAULT_MODEL, tmp_path_factory.mktemp("outputs")) as (demo, _):
        yield demo


@pytest.fixture(scope="module")
def client(server):
    return Client(server.local_url, verbose=False)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A 64x64 scene, its box mask, an all-black mask and a mask of another size."""
    from models.train.world import draw, random_scene

    folder = tmp_path_factory.mktemp("inputs")
    draw(random_scene(random.Random(1))).save(folder / "scene.png")
    mask = Image.new("L", (64, 64), 0)
    ImageDraw.Draw(mask).rectangle(BOX, fill=255)
    mask.save(folder / "mask.png")
    Image.new("L", (64, 64), 0).save(folder / "empty.png")
    Image.new("L", (48, 64), 255).save(folder / "small.png")
    return folder


def pixels(path) -> np.ndarray:
    with Image.open(path) as image:
        return np.asarray(image.convert("RGB")).astype(int)


def size(path) -> tuple[int, int]:
    with Image.open(path) as image:  # closed here: reading only the header leaves the file open
        return image.size


def inpaint(client: Client, files, mask: str = "mask.png", **kwargs):
    args = dict(prompt=PROMPT, num_images=2, steps=4, seed=3)
    return client.predict(
        handle_file(str(files / "scene.png")), handle_file(str(files / mask)), **{**args, **kwargs}, api_name="/inpaint"
    )


def test_inpaint_keeps_every_pixel_outside_the_mask(client, files):
    gallery, info = inpaint(client, files)
    assert len(gallery) == 2 and info["num_images"] == 2 and not info["warnings"]
    original = pixels(files / "scene.png")
    outside = np.ones((64, 64), dtype=bool)
    x1, y1, x2, y2 = BOX
    outside[y1 : y2 + 1, x1 : x2 + 1] = False
    for item in gallery:
        assert item["image"].endswith(".png")
        got = pixels(item["image"])
        assert got.shape == original.shape
        assert np.array_equal(got[outside], original[outside])
        assert not np.array_equal(got[~outside], original[~outside])  # the box was repainted


def test_a_mask_of_another_size_is_refused_naming_both(client, files):
    with pytest.raises(Exception, match="mask: 48x64 but the image is 64x64"):
        inpaint(client, files, mask="small.png")


def test_an_empty_mask_returns_the_original_with_the_warning(client, files):
    gallery, info = inpaint(client, files, mask="empty.png", num_images=1)
    assert info["warnings"] == [EMPTY_MASK_WARNING]
    assert np.array_equal(pixels(gallery[0]["image"]), pixels(files / "scene.png"))


def test_bad_inpaint_values_are_named(client, files):
    with pytest.raises(Exception, match="masked_content: 'latent noise' is not one of original, fill"):
        inpaint(client, files, masked_content="latent noise")
    with pytest.raises(Exception, match=r"mask_blur: 65 is out of range 0\.\.64"):
        inpaint(client, files, mask_blur=65)


def test_outpaint_right_extends_and_keeps_the_picture(client, files):
    gallery, _ = client.predict(
        handle_file(str(files / "scene.png")), right=32, prompt=PROMPT, steps=4, seed=5, api_name="/outpaint"
    )
    got = pixels(gallery[0]["image"])
    assert got.shape == (64, 96, 3)
    assert np.array_equal(got[:, :64], pixels(files / "scene.png"))
    with pytest.raises(Exception, match="outpaint right: 30 is not a multiple of"):
        client.predict(handle_file(str(files / "scene.png")), right=30, prompt=PROMPT, api_name="/outpaint")


def test_view_api_lists_inpaint_and_outpaint_with_named_parameters(client):
    from ui.fields import OUTPAINT_SIDES, PUBLISHED, parameters

    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    names = [p["parameter_name"] for p in api["/inpaint"]["parameters"]]
    assert names == ["image", "mask", *parameters("inpaint")]
    assert names[2 : 2 + len(PUBLISHED["inpaint"])] == list(PUBLISHED["inpaint"])  # positional callers' order
    names = [p["parameter_name"] for p in api["/outpaint"]["parameters"]]
    assert names == ["image", *OUTPAINT_SIDES, *parameters("inpaint")]


def test_send_to_inpaint_from_png_info_fills_the_form(server, tmp_path):
    """PNG info's Send to Inpaint: the picture in the editor, the parameters in the form, clamped.

    The parameters are given as PNG info parses them (`pipelines.pnginfo.read`: the keys of the result
    metadata), so this checks the form's side whatever the reader finds in a given file."""
    import gradio as gr

    from pipelines.pnginfo.write import png_info
    from ui.send import inpaint_updates

    meta = {"prompt": "a green square on a white background", "negative_prompt": "blurry", "steps": 12,
            "guidance_scale": 5.5, "seed": 4242, "width": 64, "height": 64, "strength": 0.8, "mask_blur": 99,
            "masked_content": "fill", "inpaint_area": "only masked", "padding": 12, "invert_mask": True}  # fmt: skip
    png = tmp_path / "inpainted.png"
    Image.new("RGB", (64, 64), "white").save(png, pnginfo=png_info(meta))
    form = server.tabs["inpaint"]["form"]
    out = inpaint_updates(meta, server.studio.info, str(png), form)
    assert out[form.c["editor"]]["value"] == str(png)
    values = form.values_of(out)
    assert values["prompt"] == meta["prompt"] and values["negative_prompt"] == "blurry"
    assert values["seed"] == "4242" and values["random_seed"] is False and values["steps"] == 12
    assert values["strength"] == 0.8 and values["mask_blur"] == 64  # clamped to MAX_MASK_BLUR
    assert (values["masked_content"], values["inpaint_area"], values["padding"], values["invert_mask"]) == (
        "fill", "only masked", 12, True,
    )  # fmt: skip
    # a plain text-to-image PNG: the inpaint's own defaults
    plain = inpaint_updates({"prompt": "x"}, server.studio.info, None, form)
    assert plain[form.c["editor"]] == gr.update()
    values = form.values_of(plain)
    assert (values["strength"], values["mask_blur"], values["masked_content"], values["invert_mask"]) == (
        1.0, 4, "original", False,
    )  # fmt: skip


def test_send_to_inpaint_from_a_generated_png(server, client):
    """Send to Inpaint under a gallery: the result's PNG as the editor's picture, its prompt and seed in the form."""
    from ui.inpaint_tab import send_image

    gallery, _ = client.predict(prompt=PROMPT, num_images=1, steps=2, seed=77, api_name="/generate")
    path = gallery[0]["image"]
    tab, tabs = server.tabs["inpaint"], object()
    out = send_image(server.studio, path, tab, tabs)
    assert out[tab["editor"]]["value"] == path and out[tabs].selected == "inpaint"
    values = tab["form"].values_of(out)
    assert (values["prompt"], values["seed"], values["random_seed"], values["strength"]) == (PROMPT, "77", False, 1.0)


def test_rest_callers_name_what_they_send_and_the_rest_is_the_default(server, files):
    """A plain REST call that names its values (Gradio's `/gradio_api/call/v2/<endpoint>`) may leave out
    every parameter added since it was written: each takes its default (the model's). A positional call
    sends the parameters in the endpoint's order (`ui.fields.call_order`): the values /inpaint was first
    published with are enough (`ui.positional`), and so is any shorter list."""
    from tests.test_reliability import rest_call, rest_result, rest_upload
    from ui.fields import parameters

    url = server.local_url
    image, mask = rest_upload(url, files / "scene.png")[0], rest_upload(url, files / "mask.png")[0]
    first = {"image": image, "mask": mask, "prompt": PROMPT, "steps": 2, "seed": 3}  # the first callers' names
    kind, data = rest_result(url, "inpaint", rest_call(url, "v2/inpaint", first))
    assert kind == "complete" and data[1]["seeds"] == [3], data
    outpaint = {name: value for name, value in first.items() if name != "mask"}
    kind, data = rest_result(url, "outpaint", rest_call(url, "v2/outpaint", {**outpaint, "right": 32}))
    assert kind == "complete" and data[1]["num_images"] == 1, data
    assert size(data[0][0]["image"]["path"]) == (96, 64)  # the server is this process: its file is here
    values = {"prompt": PROMPT, "steps": 2, "seed": 4}
    positional = [image, mask, *(values.get(name, "") for name in parameters("inpaint"))]
    kind, data = rest_result(url, "inpaint", rest_call(url, "inpaint", positional))
    assert kind == "complete" and data[1]["seeds"] == [4], data
    first_published = positional[: 2 + parameters("inpaint").index("guidance_end")]  # before the step cache came
    kind, data = rest_result(url, "inpaint", rest_call(url, "inpaint", first_published))
    assert kind == "complete" and data[1]["seeds"] == [4] and data[1]["num_images"] == 1, data
    kind, data = rest_result(url, "outpaint", rest_call(url, "outpaint", [image, 0, 0, 32, 0, PROMPT]))
    assert kind == "complete" and size(data[0][0]["image"]["path"]) == (96, 64), data


def test_a_model_that_cannot_inpaint_turns_the_buttons_off_with_the_reason(server):
    import dataclasses

    from ui.inpaint_tab import updates

    info = server.studio.info
    assert info.inpaint  # the embedded model inpaints
    tab = server.tabs["inpaint"]
    out = updates(dataclasses.replace(info, inpaint=False, model_name="no-inpaint"), tab)
    assert out[tab["run"]]["interactive"] is False and out[tab["outpaint"]]["interactive"] is False
    assert out[tab["unavailable"]]["visible"] is True and "no-inpaint" in out[tab["unavailable"]]["value"]
    assert out[tab["left"]]["step"] == info.size_multiple
    out = updates(info, tab)
    assert out[tab["run"]]["interactive"] is True and out[tab["unavailable"]]["visible"] is False


def test_inpaint_uploads_are_checked_before_decoding(client, files, tmp_path, monkeypatch):
    """A picture over MAX_UPLOAD_PIXELS (a few KB on disk) is refused from its header, never decoded."""
    from PIL import ImageFile

    big = tmp_path / "big.png"
    Image.new("1", (5000, 5000)).save(big)
    decodes = []
    real_load = ImageFile.ImageFile.load
    monkeypatch.setattr(ImageFile.ImageFile, "load", lambda self: decodes.append(self.size) or real_load(self))
    with pytest.raises(Exception, match=r"image: 5000x5000 = 25000000 pixels, more than the limit"):
        client.predict(handle_file(str(big)), handle_file(str(big)), prompt=PROMPT, api_name="/inpaint")
    with pytest.raises(Exception, match=r"mask: 5000x5000 = 25000000 pixels, more than the limit"):
        client.predict(handle_file(str(files / "scene.png")), handle_file(str(big)), prompt=PROMPT, api_name="/inpaint")
    with pytest.raises(Exception, match=r"image: 5000x5000 = 25000000 pixels, more than the limit"):
        client.predict(handle_file(str(big)), right=32, prompt=PROMPT, api_name="/outpaint")
    assert (5000, 5000) not in decodes


def test_an_inpaint_png_round_trips_through_png_info_into_the_form(server, client, files):
    """The PNG an /inpaint returns records its settings as A1111 does; PNG info reads them, and Send
    to Inpaint puts them back in the form."""
    from pipelines.pnginfo.read import read_png_info
    from ui.send import inpaint_updates

    asked = dict(strength=0.9, mask_blur=6, masked_content="fill", inpaint_area="only masked", padding=8)
    gallery, _ = inpaint(client, files, num_images=1, **asked)
    read = read_png_info(gallery[0]["image"])
    assert "Mask blur: 6, Masked content: fill, Inpaint area: Only masked, Masked area padding: 8" in read["raw"]
    form = server.tabs["inpaint"]["form"]
    values = form.values_of(inpaint_updates(read["parameters"], server.studio.info, gallery[0]["image"], form))
    assert {k: values[k] for k in asked} == asked and values["seed"] == "3"
