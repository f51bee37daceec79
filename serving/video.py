"""A video model beside the image models: video requests (`num_frames` set) go to it, the rest to the main backend.

`VideoRouter` is a `GenerationBackend` over two: the main one (the image model, with its editor) and a
video model's pool. `ModelInfo.video` describes the video model, so the Video tab and every API read its
defaults and limits (`ModelInfo.for_task("video")`) with no second code path.

Which video model: VIDEO_MODEL_ID (a folder, Hub id or recipe name); by default the embedded
`tiny-shapes-video` beside the embedded image model (29 MB with its refiner, loaded with it); VIDEO_MODEL_ID=none serves
no video. A main model that is itself a video model (MODEL_ID=a Wan folder) serves video requests on its own.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from pipelines import GenerationBackend, ModelInfo, ReplicaStatus
from pipelines.schema.request import GenerationRequest
from serving.routing import Beside

log = logging.getLogger(__name__)

MODELS = Path(__file__).resolve().parents[1] / "models"
EMBEDDED_T2I = MODELS / "tiny-shapes"
EMBEDDED_VIDEO = MODELS / "tiny-shapes-video"


def default_video(main_model: str, video_model_id: str) -> str | None:
    """The video model for `main_model` under VIDEO_MODEL_ID ("" = automatic, "none" = off)."""
    if video_model_id.lower() in ("none", "off"):
        return None
    if video_model_id:
        return video_model_id
    try:
        embedded = Path(main_model).resolve() == EMBEDDED_T2I.resolve() or main_model == EMBEDDED_T2I.name
    except OSError:
        embedded = False
    return str(EMBEDDED_VIDEO) if embedded and (EMBEDDED_VIDEO / "model_index.json").is_file() else None


class VideoRouter(Beside):
    """The video backend for video requests, the main backend for everything else."""

    def __init__(self, main: GenerationBackend, video: GenerationBackend):
        super().__init__(main, video)
        self.video = video

    def _for(self, request: GenerationRequest) -> GenerationBackend:
        """Video requests to the video model, unless the main model (switched to a Wan, say) makes clips itself."""
        if request.task != "video" or self.main.model_info().clips is not None:
            return self.main
        return self.video

    def model_info(self) -> ModelInfo:
        info = self.main.model_info()
        return info if info.clips is not None else dataclasses.replace(info, video=self.video.model_info())

    def status(self) -> list[ReplicaStatus]:
        rows = [dataclasses.replace(r, name=f"{r.name} (video)", role="video") for r in self.video.status()]
        return self.main.status() + rows

    def load_model(self, model_id: str, progress: Any = None) -> ModelInfo:
        """Switch the main model (declared when the main backend switches); the video model stays."""
        self.main.load_model(model_id, progress=progress)  # type: ignore[attr-defined]
        return self.model_info()
