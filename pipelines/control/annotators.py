"""Model-based ControlNet preprocessors ("annotators"): maps made by a network the user supplies.

Nothing downloads at run time: each annotator is a transformers model folder the user puts under
ANNOTATOR_DIR (downloaded by them, e.g. `hf download depth-anything/Depth-Anything-V2-Small-hf
--local-dir $ANNOTATOR_DIR/depth`). transformers loads and runs it (its `pipeline`, which reads the
model's own image processor), so any architecture it has for the task works.

| preprocessor | A1111 names also taken | folder | map | why |
|---|---|---|---|---|
| `depth` | depth_midas, depth_leres, depth_leres++, depth_zoe, depth_anything, depth_anything_v2 | `depth/`: a depth-estimation model (DPT/MiDaS, Depth Anything V1/V2, ZoeDepth, GLPN, ...) | relative depth, near white, stretched to 0..255 | depth ControlNets were trained on MiDaS's maps (inverse depth: near is bright); a metric model's depth (far is larger) is inverted to match |
| `normal` | normal_midas | `depth/` | A1111's normal_midas: x, y from the depth's Sobel gradient, a constant z, flat where the depth is below 0.4 of its range, normalised, as RGB | the normal ControlNet 1.0 reads; BAE's and DSINE's networks are not in transformers (refused) |
| `seg` | seg_ofade20k, seg_ufade20k, seg_ofcoco | `seg/`: a semantic-segmentation model (UperNet, Segformer, BEiT, ...) | each pixel in its class's ADE20K colour (pipelines.control.ade20k) | seg ControlNets were trained on ADE20K's palette; a model with other classes is painted by class number |
| `openpose` | openpose_full, dw_openpose_full (their bodies) | `pose/`: a COCO keypoint model (VitPose); `person/` (optional): an object detector for the people, else the whole picture is one person | OpenPose's body drawing (pipelines.control.openpose) | pose ControlNets were trained on OpenPose's drawing; VitPose's COCO keypoints map onto it (hands and faces are not drawn) |

Annotators run on the `DeviceManager`'s device in its dtype, load on first use (under ONE_LOAD), and
stay loaded: the pipeline's for units, the engine's for previews and A1111's `/controlnet/detect`.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from devices.one_load import ONE_LOAD
from pipelines.control import openpose
from pipelines.control.ade20k import PALETTE
from pipelines.schema.control import ANNOTATOR_TASKS as TASKS
from pipelines.schema.control import MODEL_BASED, PreprocessorError, missing

log = logging.getLogger(__name__)

METRIC = ("zoedepth", "depth_pro")  # model types whose output grows with distance (the others': inverse depth)
NORMAL_BACKGROUND = 0.4  # A1111's normal_midas default: flat below this share of the depth's range
# Each folder's loader: a transformers pipeline task, or "pose" (the keypoint model has no pipeline task).
# `person/` (optional): an object detector that finds the people whose poses are drawn.
PIPELINE_TASKS = {**TASKS, "pose": "pose", "person": "object-detection"}
PERSON_SCORE = 0.5  # a detection less sure than this is not a person


class AnnotatorError(PreprocessorError):
    """A model-based preprocessor whose model is not installed or does not load; the message says where it goes."""


class Annotators:
    """The annotator models under `folder`, loaded on first use on the manager's device and dtype."""

    def __init__(self, folder: Path | str | None, device_manager: Any):
        self.folder = Path(folder) if folder else None
        self.dm = device_manager
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def _has(self, kind: str) -> bool:
        """Whether the folder `kind` holds a model (its `config.json`)."""
        return self.folder is not None and (self.folder / kind / "config.json").is_file()

    def installed(self) -> list[str]:
        """The folders present, of those the preprocessors read."""
        return [kind for kind in TASKS if self._has(kind)]

    def names(self) -> list[str]:
        """The model-based preprocessors this server runs."""
        have = set(self.installed())
        return [name for name, pre in MODEL_BASED.items() if pre.folder in have]

    def run(self, name: str, image: Image.Image) -> Image.Image:
        """The map of `image` (RGB, its size) by the model-based preprocessor `name` (a key of MODEL_BASED)."""
        if name not in self.names():
            raise AnnotatorError(missing(name, self.folder))
        image = image.convert("RGB")
        if name == "seg":
            return self._segments(image)
        if name == "openpose":
            return openpose.draw(self._people(image), image.size)
        depth = self._depth(image)
        return normal_map(depth) if name == "normal" else depth_map(depth)

    def _pipe(self, kind: str) -> Any:
        with self._lock:
            if kind not in self._loaded:
                self._loaded[kind] = self._load(self.folder / kind, PIPELINE_TASKS[kind])  # type: ignore[operator]
            return self._loaded[kind]

    def _load(self, path: Path, task: str) -> Any:
        """transformers' pipeline for `task` over the model in `path`; for "pose" (no pipeline task in
        transformers) the keypoint model and its image processor."""
        import transformers

        with ONE_LOAD:  # transformers builds on the meta device too (devices.one_load)
            try:
                if task == "pose":
                    model = transformers.AutoModelForPoseEstimation.from_pretrained(path, dtype=self.dm.dtype)
                    pipe = (model.to(self.dm.device).eval(), transformers.AutoImageProcessor.from_pretrained(path))
                else:
                    pipe = transformers.pipeline(task, model=str(path), device=self.dm.device, dtype=self.dm.dtype)
            except (OSError, ValueError, KeyError) as exc:
                raise AnnotatorError(f"the {task} model in {path} does not load: {exc}") from exc
        log.info("loaded annotator %s (%s) on %s", path.name, task, self.dm.device)
        return pipe

    def _people(self, image: Image.Image) -> list[list[tuple[float, float] | None]]:
        """Each person's OpenPose points: their boxes from the detector in `person/` where there is one
        (else the whole picture is one person), their COCO keypoints from the model in `pose/`."""
        import torch

        boxes = self._person_boxes(image) or [[0.0, 0.0, float(image.width), float(image.height)]]
        model, processor = self._pipe("pose")
        inputs = processor(image, boxes=[boxes], return_tensors="pt").to(self.dm.device)
        with torch.no_grad():
            found = processor.post_process_pose_estimation(model(**inputs.to(model.dtype)), boxes=[boxes])[0]
        return [openpose.openpose_points(p["keypoints"].float().cpu().numpy(), p["scores"].float().cpu().numpy()) for p in found]

    def _person_boxes(self, image: Image.Image) -> list[list[float]]:
        """COCO boxes (x, y, width, height) of the people the `person/` detector finds; [] without one."""
        if not self._has("person"):
            return []
        found = self._pipe("person")(image, threshold=PERSON_SCORE)
        people = [f["box"] for f in found if f["label"].lower() == "person"]
        return [[b["xmin"], b["ymin"], b["xmax"] - b["xmin"], b["ymax"] - b["ymin"]] for b in people]

    def _depth(self, image: Image.Image) -> np.ndarray:
        """Inverse depth (near is larger) at the image's size, as float32."""
        pipe = self._pipe("depth")
        depth = pipe(image)["predicted_depth"].float().cpu().numpy().squeeze()
        return -depth if pipe.model.config.model_type in METRIC else depth

    def _segments(self, image: Image.Image) -> Image.Image:
        pipe = self._pipe("seg")
        ids = pipe.model.config.label2id
        out = np.zeros((image.height, image.width, 3), np.uint8)
        for segment in pipe(image, subtask="semantic"):
            out[np.asarray(segment["mask"]) > 127] = PALETTE[ids[segment["label"]] % len(PALETTE)]
        return Image.fromarray(out)


def _stretch(values: np.ndarray) -> np.ndarray:
    low, high = float(values.min()), float(values.max())
    return (values - low) / (high - low) if high > low else np.zeros_like(values)


def depth_map(depth: np.ndarray) -> Image.Image:
    """Inverse depth stretched to 0..255, grey as RGB (MiDaS's annotator: near white, far black)."""
    return Image.fromarray((_stretch(depth) * 255).round().astype(np.uint8)).convert("RGB")


def normal_map(depth: np.ndarray, background: float = NORMAL_BACKGROUND) -> Image.Image:
    """A1111's normal_midas from inverse depth: Sobel x and y, z = 2π, zero slope where the stretched
    depth is below `background`, each pixel's vector normalised to 0..255."""
    import cv2

    x = cv2.Sobel(depth.astype(np.float32), cv2.CV_32F, 1, 0, ksize=3)
    y = cv2.Sobel(depth.astype(np.float32), cv2.CV_32F, 0, 1, ksize=3)
    flat = _stretch(depth) < background
    x[flat], y[flat] = 0, 0
    normal = np.stack([x, y, np.full_like(x, np.pi * 2.0)], axis=2)
    normal /= np.linalg.norm(normal, axis=2, keepdims=True)
    return Image.fromarray((normal * 127.5 + 127.5).clip(0, 255).astype(np.uint8))
