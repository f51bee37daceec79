"""Model-based ControlNet preprocessors (pipelines.control.annotators): depth, normal and seg maps made by a
transformers model from ANNOTATOR_DIR, and the refusal that says where the model goes when absent."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, ImageDraw

from devices import DeviceManager
from pipelines.control.ade20k import PALETTE
from pipelines.control.annotators import Annotators, normal_map
from pipelines.control.maps import detect
from pipelines.schema.control import PreprocessorError, resolve
from pipelines.schema.request import GenerationRequest
from tests.annotator_models import PERSON_BOX, SEG_CLASS, write_depth, write_person, write_pose, write_seg


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("annotators")
    write_depth(root)
    write_seg(root)
    write_pose(root)
    return root


def picture() -> Image.Image:
    image = Image.new("RGB", (80, 60), (30, 30, 160))
    ImageDraw.Draw(image).ellipse((20, 10, 60, 50), fill=(230, 200, 40))
    return image


def test_a1111_names_resolve_and_what_is_not_run_is_refused_by_name():
    assert {resolve(n).name for n in ("depth_midas", "depth_anything_v2", "depth_zoe", "depth")} == {"depth"}
    assert resolve("normal_midas").name == "normal" and resolve("seg_ofade20k").name == "seg"
    assert all(resolve(n).model_based for n in ("depth", "normal", "seg")) and not resolve("canny").model_based
    assert resolve("openpose_full").name == "openpose" and resolve("dw_openpose_full").name == "openpose"
    for name in ("openpose_hand", "lineart_realistic", "normal_bae", "mlsd"):
        with pytest.raises(PreprocessorError, match="needs an annotator network this app does not run"):
            resolve(name)
    # The schema takes a model-based unit (the server's models are checked when it is served, below)
    assert GenerationRequest("a", controlnet=[{"image": picture(), "model": "m", "module": "depth_midas"}])


def test_without_the_model_the_refusal_says_where_it_goes(tmp_path):
    with pytest.raises(PreprocessorError, match="ANNOTATOR_DIR/depth"):
        detect(picture(), "depth_midas")
    empty = Annotators(tmp_path, DeviceManager())
    assert empty.names() == []
    with pytest.raises(PreprocessorError, match=f"depth-estimation model in {tmp_path / 'depth'}"):
        detect(picture(), "normal_midas", annotators=empty)


def test_the_depth_map_is_the_models_depth_stretched_at_the_pictures_size(folder):
    from transformers import pipeline

    annotators = Annotators(folder, DeviceManager())
    assert annotators.names() == ["depth", "normal", "seg", "openpose"]
    made = np.asarray(detect(picture(), "depth_midas", annotators=annotators))
    raw = pipeline("depth-estimation", model=str(folder / "depth"))(picture())["predicted_depth"].numpy()
    expected = (raw - raw.min()) / (raw.max() - raw.min()) * 255
    assert made.shape == (60, 80, 3) and (made[..., 0] == made[..., 2]).all()  # grey, the picture's size
    assert np.abs(made[..., 0].astype(float) - expected).max() <= 1.0
    assert made.min() == 0 and made.max() == 255
    resized = detect(picture(), "depth", resolution=30, annotators=annotators)  # the unit's processor_res
    assert resized.size == (40, 30)


def test_normals_follow_the_depths_slope_and_the_background_is_flat():
    depth = np.tile(np.linspace(0.0, 1.0, 64, dtype=np.float32), (32, 1))  # nearer to the right
    normal = np.asarray(normal_map(depth)).astype(int)
    background, slope = normal[16, 8], normal[16, 48]  # below 0.4 of the range: flat, facing the viewer
    assert abs(background[0] - 128) <= 1 and abs(background[1] - 128) <= 1 and background[2] == 255
    assert slope[0] > 128 and abs(slope[1] - 128) <= 1 and 128 < slope[2] < 255


def test_the_seg_map_is_painted_in_ade20k_colours(folder):
    annotators = Annotators(folder, DeviceManager())
    made = np.asarray(detect(picture(), "seg_ofade20k", annotators=annotators))
    assert made.shape == (60, 80, 3)
    assert (made.reshape(-1, 3) == PALETTE[SEG_CLASS]).all()  # the class the model answers, in its colour


def test_the_openpose_drawing_is_openposes_from_coco_keypoints():
    """A standing figure in COCO's order: OpenPose's colours at its points (the nose red, the neck between
    the shoulders orange), its limbs at 60 %, and an unsure keypoint left out."""
    from pipelines.control.openpose import COLORS, draw, openpose_points

    coco = np.array([[40, 10], [44, 5], [36, 5], [47, 10], [33, 10], [52, 24], [28, 24], [56, 40], [24, 40],
                     [58, 54], [22, 54], [48, 56], [32, 56], [48, 76], [32, 76], [48, 94], [32, 94]], float)  # fmt: skip
    scores = np.ones(17)
    scores[15] = 0.1  # the left ankle: not sure
    points = openpose_points(coco, scores)
    assert points[1] == (40.0, 24.0) and points[13] is None  # the neck; OpenPose's left ankle
    made = np.asarray(draw([points], (80, 100))).astype(int)
    assert tuple(made[10, 40]) == COLORS[0] and tuple(made[24, 40]) == COLORS[1]  # nose, neck
    assert tuple(made[24, 46]) == tuple(int(c * 0.6) for c in COLORS[1])  # the neck-to-left-shoulder limb
    assert not made[94, 48].any() and made[94, 32].any()  # the unsure ankle not drawn, the other one drawn


def pose_of(folder, image: Image.Image, box: list[float]) -> Image.Image:
    """The OpenPose map of the person in `box` (COCO x, y, w, h), by transformers' own VitPose run."""
    import torch
    from transformers import AutoImageProcessor, AutoModelForPoseEstimation

    from pipelines.control.openpose import draw, openpose_points

    model = AutoModelForPoseEstimation.from_pretrained(folder / "pose")
    processor = AutoImageProcessor.from_pretrained(folder / "pose")
    with torch.no_grad():
        outputs = model(**processor(image, boxes=[[box]], return_tensors="pt"))
    (person,) = processor.post_process_pose_estimation(outputs, boxes=[[box]])[0]
    return draw([openpose_points(person["keypoints"].numpy(), person["scores"].numpy())], image.size)


def test_the_openpose_map_is_the_keypoint_models_people_drawn(folder, tmp_path):
    """`openpose` runs the VitPose in pose/ on the whole picture when there is no person/ detector, and on
    each person the detector finds when there is one; it draws what transformers' own post-processing finds."""
    import shutil

    image = picture()
    made = detect(image, "openpose_full", annotators=Annotators(folder, DeviceManager()))
    assert np.asarray(made).any()  # this tiny model is sure of 7 of its 17 keypoints here: a figure is drawn
    assert made.size == (80, 60) and np.array_equal(np.asarray(made), np.asarray(pose_of(folder, image, [0.0, 0.0, 80.0, 60.0])))
    shutil.copytree(folder / "pose", tmp_path / "pose")
    write_person(tmp_path)
    found = detect(image, "openpose", annotators=Annotators(tmp_path, DeviceManager()))
    x0, y0, x1, y1 = PERSON_BOX
    expected = pose_of(folder, image, [float(x0), float(y0), float(x1 - x0), float(y1 - y0)])
    assert np.array_equal(np.asarray(found), np.asarray(expected)) and not np.array_equal(np.asarray(found), np.asarray(made))
