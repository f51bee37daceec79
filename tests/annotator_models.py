"""Tiny annotator models (pipelines.control.annotators) written locally: a DPT depth estimator (random weights)
and a Segformer whose classifier answers one ADE20K class everywhere, each a transformers folder with
its image processor, laid out as ANNOTATOR_DIR expects (`depth/`, `seg/`)."""

from __future__ import annotations

from pathlib import Path

SEG_CLASS = 12  # ADE20K's "person": its colour (150, 5, 61) is what the seg map must be painted in


def write_depth(folder: Path) -> Path:
    import torch
    from transformers import DPTConfig, DPTForDepthEstimation, DPTImageProcessor

    torch.manual_seed(0)
    config = DPTConfig(
        hidden_size=32, num_hidden_layers=4, num_attention_heads=4, intermediate_size=37, image_size=32,
        patch_size=8, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[16, 16, 16, 16], fusion_hidden_size=16,
    )  # fmt: skip
    DPTForDepthEstimation(config).eval().save_pretrained(folder / "depth")
    DPTImageProcessor(size={"height": 32, "width": 32}, keep_aspect_ratio=False).save_pretrained(folder / "depth")
    return folder / "depth"


def write_seg(folder: Path) -> Path:
    import torch
    from transformers import SegformerConfig, SegformerForSemanticSegmentation, SegformerImageProcessor

    torch.manual_seed(0)
    config = SegformerConfig(
        num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[8, 16], patch_sizes=[7, 3],
        strides=[4, 2], num_attention_heads=[1, 2], mlp_ratios=[2, 2], decoder_hidden_size=16, num_labels=150,
    )  # fmt: skip
    model = SegformerForSemanticSegmentation(config).eval()
    with torch.no_grad():  # every pixel is SEG_CLASS, whatever the picture
        model.decode_head.classifier.weight.zero_()
        model.decode_head.classifier.bias.zero_()
        model.decode_head.classifier.bias[SEG_CLASS] = 10.0
    model.save_pretrained(folder / "seg")
    SegformerImageProcessor(size={"height": 32, "width": 32}).save_pretrained(folder / "seg")
    return folder / "seg"


def write_pose(folder: Path) -> Path:
    """A VitPose with COCO's 17 keypoints (random weights) and its image processor, as `pose/`."""
    import torch
    from transformers import VitPoseBackboneConfig, VitPoseConfig, VitPoseForPoseEstimation, VitPoseImageProcessor

    torch.manual_seed(0)
    backbone = VitPoseBackboneConfig(image_size=[64, 48], patch_size=[8, 8], hidden_size=32, num_hidden_layers=2,
                                     num_attention_heads=4, intermediate_size=37, out_indices=[2])  # fmt: skip
    VitPoseForPoseEstimation(VitPoseConfig(backbone_config=backbone, num_labels=17)).eval().save_pretrained(folder / "pose")
    VitPoseImageProcessor(size={"height": 64, "width": 48}).save_pretrained(folder / "pose")
    return folder / "pose"


PERSON_BOX = (0, 0, 40, 59)  # xmin, ymin, xmax, ymax on an 80x60 picture: where write_person's detector sees one


def write_person(folder: Path) -> Path:
    """A YOLOS person detector whose one detection is always a person in the picture's left half
    (PERSON_BOX on an 80x60 picture), as `person/`."""
    import math

    import torch
    from transformers import YolosConfig, YolosForObjectDetection, YolosImageProcessor

    torch.manual_seed(0)
    config = YolosConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=37, image_size=[32, 32],
                         patch_size=8, num_detection_tokens=1, num_labels=1, id2label={0: "person"}, label2id={"person": 0})  # fmt: skip
    model = YolosForObjectDetection(config).eval()
    logit = lambda p: math.log(p / (1 - p))  # noqa: E731
    with torch.no_grad():  # the class: a person, surely; the box: centre (0.25, 0.5), size (0.5, 1) of the picture
        model.class_labels_classifier.layers[-1].weight.zero_()
        model.class_labels_classifier.layers[-1].bias.copy_(torch.tensor([10.0, 0.0]))
        model.bbox_predictor.layers[-1].weight.zero_()
        model.bbox_predictor.layers[-1].bias.copy_(torch.tensor([logit(0.25), logit(0.5), logit(0.5), logit(0.999)]))
    model.save_pretrained(folder / "person")
    YolosImageProcessor(size={"shortest_edge": 32, "longest_edge": 64}).save_pretrained(folder / "person")
    return folder / "person"
