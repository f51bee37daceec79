"""The embedded instruction editor `tiny-shapes-edit`: loading, one edit of each kind judged by the
evaluation's classifier (no learned model), determinism, and the app sending edits to it."""

from __future__ import annotations

import random

import numpy as np
import pytest

from devices import DeviceManager
from models.eval import classify
from models.eval_edit import EDITOR_DIR, edit_item, evaluate_edits, judge, make_inputs, rates
from models.train.edit_world import KINDS, conflict_pair
from models.train.world import Scene, draw
from pipelines import GenerationRequest, ImagePipeline
from serving.editing import EMBEDDED_T2I, EditRouter, default_editor

SCENES = {  # two inputs per kind of edit, drawn from the world
    "a": Scene("red", "circle", "blue", 0.5, 0.5, 0.5, 0.0),
    "b": Scene("yellow", "triangle", "purple", 0.45, 0.52, 0.49, 5.0),
}


# measured on these 24 with the shipped weights: all 1.0
EDITED_MIN, KEPT_MIN, ALL_MIN, BY_KIND_MIN = 0.85, 0.85, 0.8, 0.7
CONFLICTS, CANNOT_APPLY_KEPT_MIN = 12, 0.6  # measured 0.83 (previous weights 0.75, before phase 3 0.5); partners 1.0


@pytest.fixture(scope="module")
def editor():
    return ImagePipeline.from_pretrained(str(EDITOR_DIR), DeviceManager("cpu"))


def edit(editor, instruction, scene, seed=0, **kw):
    return editor.generate(GenerationRequest(prompt=instruction, init_images=[draw(scene)], seed=seed, **kw)).images[0]


def test_the_editor_loads_as_an_instruction_editor_with_its_vocabulary(editor):
    info = editor.model_info()
    assert info.edit and info.image_guidance and not info.text_to_image
    assert info.pipeline_class == "StableDiffusionInstructPix2PixPipeline"
    assert "make the shape {value}" in info.vocabulary["instructions"]["color"]
    assert info.default_image_guidance == editor.default_image_guidance
    assert sum(f.stat().st_size for f in EDITOR_DIR.rglob("*") if f.is_file()) <= 35 * 2**20


@pytest.mark.slow  # 43 s on 2 shared cores
def test_edits_of_every_kind_change_that_attribute_and_keep_the_rest(editor):
    """24 random (drawn input, instruction) pairs of the evaluation, judged by its classifier and
    mask overlap. Thresholds sit below the measured figures (docs/embedded-models.md) and far above what an editor
    that returns its input (nothing edited) or redraws from scratch (nothing kept) would get."""
    items = make_inputs(24, seed=11)
    assert {item["kind"] for item in items} == set(KINDS)
    info = editor.model_info()
    rows, _ = evaluate_edits(editor, items, info.default_steps, info.default_guidance, editor.default_image_guidance, 0)
    got = rates(rows)
    unedited = rates([judge(it["image"], it["image"], it["source"], it["kind"], it["value"]) for it in items])
    assert unedited["edited_right"] < 0.3  # the check can fail: returning the input edits nothing
    assert got["edited_right"] >= EDITED_MIN, got
    assert min(got["kept"].values()) >= KEPT_MIN, got
    assert got["iou_ok"] >= KEPT_MIN, got
    assert got["all"] >= ALL_MIN, got
    assert min(got["by_kind"].values()) >= BY_KIND_MIN, got


@pytest.mark.slow  # 68 s on 2 shared cores
def test_an_instruction_that_cannot_apply_keeps_the_image_and_one_that_can_edits_it(editor):
    """"make the background yellow" on a yellow shape cannot be drawn in this world (its two
    colours always differ): the result must be the input, not a yellow square. The same scene with
    a colour that applies must change, so an editor that keeps everything fails."""
    rng = random.Random(21)
    pairs = [conflict_pair(rng) for _ in range(CONFLICTS)]
    items = [edit_item(e) for pair in pairs for e in pair]
    info = editor.model_info()
    rows, _ = evaluate_edits(editor, items, info.default_steps, info.default_guidance, editor.default_image_guidance, 0)
    cannot, can = rows[0::2], rows[1::2]
    assert not any(r["applies"] for r in cannot) and all(r["applies"] for r in can)
    assert rates(cannot)["all"] >= CANNOT_APPLY_KEPT_MIN, [r["got"] for r in cannot]
    assert rates(can)["all"] >= ALL_MIN, [(r["want"], r["got"]) for r in can]


def test_an_edit_is_the_same_for_the_same_seed(editor):
    first = np.asarray(edit(editor, "make the background white", SCENES["a"], seed=5))
    again = np.asarray(edit(editor, "make the background white", SCENES["a"], seed=5))
    other = np.asarray(edit(editor, "make the background white", SCENES["a"], seed=6))
    assert np.array_equal(first, again)
    assert not np.array_equal(first, other)


def test_the_embedded_model_gets_the_embedded_editor_and_edits_go_to_it(editor, tiny_model_dir):
    assert default_editor(str(EMBEDDED_T2I), "") == str(EDITOR_DIR)
    assert default_editor(str(tiny_model_dir), "") is None  # another model edits by itself
    assert default_editor(str(EMBEDDED_T2I), "none") is None
    main = ImagePipeline.from_pretrained(str(EMBEDDED_T2I), DeviceManager("cpu"))
    router = EditRouter(main, editor)
    info = router.model_info()
    assert info.text_to_image and info.editor is not None and info.for_edits.edit
    made = router.generate(GenerationRequest(prompt="a red circle on a blue background", seed=1, steps=4))
    edited = router.generate(GenerationRequest(prompt="make the background black", init_images=[draw(SCENES["a"])]))
    assert made.metadata[0]["model"] == "tiny-shapes"
    assert edited.metadata[0]["model"] == "tiny-shapes-edit"
    assert classify(edited.images[0]).background == "black"
    assert [(r.name, r.role) for r in router.status()] == [("cpu", "main"), ("cpu (editor)", "editor")]
    from engine import Engine
    from ui.demo import _header

    header = _header(Engine(router), info)  # one device serves, not "2 replicas": the editor sits beside it
    assert "`cpu`" in header and "replicas" not in header


def test_after_a_switch_to_another_model_edits_go_to_it_and_back(editor, tiny_model_dir):
    from serving.pool import DevicePool

    router = EditRouter(DevicePool.from_pretrained(str(EMBEDDED_T2I), devices="cpu", memory_mode="off"), editor)
    router.load_model(str(tiny_model_dir))
    assert router.model_info().editor is None  # the tiny SD model's own image-to-image serves the Edit tab
    image = draw(SCENES["a"]).resize((32, 32))
    edited = router.generate(GenerationRequest(prompt="a cat", init_images=[image], steps=2, seed=0))
    assert edited.metadata[0]["model"] == tiny_model_dir.name
    router.load_model(str(EMBEDDED_T2I))
    assert router.model_info().editor.model_name == "tiny-shapes-edit"


def test_an_edit_png_records_its_image_guidance_and_send_to_edit_restores_it(editor, tmp_path):
    """A1111's "Image CFG scale" (its instruct-pix2pix field), not the "Denoising strength" an
    instruction editor never takes; read back, it fills the Edit tab's slider, clamped to its range,
    and PNG info checks it against the model that edits, not the main one."""
    from pipelines.pnginfo.read import read_png_info
    from pipelines.pnginfo.write import a1111_parameters, png_info
    from ui.send import form_values, model_for

    request = GenerationRequest(prompt="make it green", init_images=[draw(SCENES["a"])], steps=2, seed=1,
                                image_guidance_scale=1.8)  # fmt: skip
    meta = editor.generate(request).metadata[0]
    assert meta["image_guidance_scale"] == 1.8 and "strength" not in meta
    assert "Image CFG scale: 1.8" in a1111_parameters(meta) and "Denoising strength" not in a1111_parameters(meta)
    path = tmp_path / "edit.png"
    draw(SCENES["a"]).save(path, pnginfo=png_info(meta))
    params = read_png_info(path)["parameters"]
    info = editor.model_info()
    values, notes = form_values(params, info)
    assert values["image_guidance_scale"] == 1.8 and notes == []
    assert form_values({**params, "image_guidance_scale": 25.0}, info)[0]["image_guidance_scale"] == 10.0
    assert form_values({"prompt": "x"}, info)[0]["image_guidance_scale"] == editor.default_image_guidance
    t2i = ImagePipeline.from_pretrained(str(EMBEDDED_T2I), DeviceManager("cpu"))
    main = t2i.model_info()
    values, notes = form_values(params, main)  # a text-to-image model edits by strength: a note, not a value
    assert values["image_guidance_scale"] == main.default_image_guidance
    assert any("image guidance 1.8 is for instruction editors" in n for n in notes)
    router_info = EditRouter(t2i, editor).model_info()
    assert model_for(params, router_info).model_name == "tiny-shapes-edit"  # PNG info checks an edit against the editor
    assert model_for({"prompt": "x", "seed": 1}, router_info).model_name == "tiny-shapes"
