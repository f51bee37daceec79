"""OpenPose maps from COCO keypoints: what pose ControlNets read.

Pose ControlNets (lllyasviel's `control_v11p_sd15_openpose`, the SDXL and union ones) were trained on
OpenPose's body drawing: 18 keypoints (COCO's 17 and a neck between the shoulders), 17 limbs as
ellipses in OpenPose's colours at 60 % brightness, each keypoint a dot in its own colour, on black.
A keypoint model (transformers' VitPose, pipelines.control.annotators) gives COCO's 17 in COCO's order; this
module reorders them and draws as ControlNet 1.1's annotator (`draw_bodypose`) does. Body only: hands
and faces are not drawn.
"""

from __future__ import annotations

import math

import numpy as np
from PIL import Image

# OpenPose's keypoint i is COCO's COCO_INDEX[i]; the neck (None) is the shoulders' midpoint.
# OpenPose: nose, neck, r/l shoulder-elbow-wrist, r/l hip-knee-ankle, r/l eye, r/l ear.
COCO_INDEX = (0, None, 6, 8, 10, 5, 7, 9, 12, 14, 16, 11, 13, 15, 2, 1, 4, 3)
LIMBS = (
    (1, 2), (1, 5), (2, 3), (3, 4), (5, 6), (6, 7), (1, 8), (8, 9), (9, 10), (1, 11), (11, 12), (12, 13),
    (1, 0), (0, 14), (14, 16), (0, 15), (15, 17),
)  # fmt: skip
COLORS = (
    (255, 0, 0), (255, 85, 0), (255, 170, 0), (255, 255, 0), (170, 255, 0), (85, 255, 0), (0, 255, 0),
    (0, 255, 85), (0, 255, 170), (0, 255, 255), (0, 170, 255), (0, 85, 255), (0, 0, 255), (85, 0, 255),
    (170, 0, 255), (255, 0, 255), (255, 0, 170), (255, 0, 85),
)  # fmt: skip
MIN_SCORE = 0.3  # a keypoint less sure than this is not drawn (the annotators' threshold)
STICK, DOT = 4, 4  # limb half-width and dot radius, in pixels, as ControlNet 1.1 draws at 512 px


def openpose_points(keypoints: np.ndarray, scores: np.ndarray) -> list[tuple[float, float] | None]:
    """One person's COCO keypoints (17 x 2, x y) and scores as OpenPose's 18 (None: not sure enough)."""
    sure = [tuple(map(float, keypoints[i])) if scores[i] >= MIN_SCORE else None for i in range(len(keypoints))]
    out: list[tuple[float, float] | None] = []
    for index in COCO_INDEX:
        if index is not None:
            out.append(sure[index])
        elif sure[5] is not None and sure[6] is not None:  # the neck: between the shoulders
            out.append(((sure[5][0] + sure[6][0]) / 2, (sure[5][1] + sure[6][1]) / 2))
        else:
            out.append(None)
    return out


def draw(people: list[list[tuple[float, float] | None]], size: tuple[int, int]) -> Image.Image:
    """The OpenPose map of `people` (each OpenPose's 18 points) at `size` (width, height)."""
    import cv2

    canvas = np.zeros((size[1], size[0], 3), np.uint8)
    for points in people:
        for (a, b), color in zip(LIMBS, COLORS, strict=False):
            if points[a] is None or points[b] is None:
                continue
            (x0, y0), (x1, y1) = points[a], points[b]
            length = math.hypot(x1 - x0, y1 - y0)
            angle = math.degrees(math.atan2(y0 - y1, x0 - x1))
            centre = (int((x0 + x1) / 2), int((y0 + y1) / 2))
            polygon = cv2.ellipse2Poly(centre, (int(length / 2), STICK), int(angle), 0, 360, 1)
            cv2.fillConvexPoly(canvas, polygon, [int(c * 0.6) for c in color])
    for points in people:
        for point, color in zip(points, COLORS, strict=True):
            if point is not None:
                cv2.circle(canvas, (int(point[0]), int(point[1])), DOT, color, thickness=-1)
    return Image.fromarray(canvas)
