"""The pipeline a request runs on (step 2 of `ImagePipeline.generate`): the model's own, or a twin for its
task built over the same components with diffusers' `from_pipe` (image-to-image, inpaint) or over them
with the ControlNets added (pipelines.control.controlnet): no weight loaded twice, none cast.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipelines.control import controlnet as control
from pipelines.run.traits import PipelineTraits
from pipelines.schema.request import GenerationRequest
from pipelines.video import family


class Twins:
    """One model's pipelines by task, each built on first use and kept; they share one scheduler."""

    def __init__(self, pipe: Any, traits: Callable[[], PipelineTraits], controlnets: control.ControlNets):
        self.pipe = pipe
        self._traits = traits  # the model's, read at use: a recipe changes them after the twins are made
        self.controlnets = controlnets
        self.img2img: Any = None
        self.inpaint: Any = None  # the inpainting twin, built on first use (`for_request`)
        self.control: tuple[tuple[str, ...], Any] | None = None  # (task and models, the ControlNet twin)
        self.clips: family.VideoAbilities | None = None  # a video model's (set by its ImagePipeline)
        self.image_to_video: Any = None  # a video model's image-to-video twin (pipelines.video.family)
        # components every `from_pipe` twin takes as they are: the TPU route's compiled UNet and VAE
        # (pipelines.run.xla_route), which `from_pipe`'s own type check would leave out
        self.shared: dict[str, Any] = {}

    @property
    def traits(self) -> PipelineTraits:
        return self._traits()

    def for_request(self, request: GenerationRequest) -> Any:
        if self.clips is not None:
            return self.video_pipeline(request)
        if request.controlnet:
            return self.control_pipeline(request)
        if request.inpaint is not None:
            return self.inpaint_pipeline()
        if request.init_images is None or self.traits.image_to_image != "from_pipe":
            return self.pipe  # text-to-image, or already an image-to-image / instruction-edit pipeline
        if self.img2img is None:
            from diffusers import AutoPipelineForImage2Image

            self.img2img = AutoPipelineForImage2Image.from_pipe(self.pipe, **self.shared)  # shares every weight
            self.img2img.set_progress_bar_config(disable=True)
        return self.img2img

    def video_pipeline(self, request: GenerationRequest) -> Any:
        """A video model's own pipeline, or for a first frame its image-to-video twin (built once)."""
        if not request.init_images or self.clips.image_to_video == self.traits.class_name:
            return self.pipe
        if self.image_to_video is None:
            self.image_to_video = family.video_twin(self.pipe, self.clips)
        return self.image_to_video

    def inpaint_pipeline(self) -> Any:
        """This pipeline where it takes a mask itself, else its inpainting twin (`traits.inpaint`, or a
        recipe's `inpaint_pipeline`) built with `from_pipe`: every weight shared, built once."""
        if self.traits.inpaint_native:
            return self.pipe
        if self.inpaint is None:
            import diffusers

            self.inpaint = getattr(diffusers, self.traits.inpaint).from_pipe(self.pipe, **self.shared)
            self.inpaint.set_progress_bar_config(disable=True)
        return self.inpaint

    def control_pipeline(self, request: GenerationRequest) -> Any:
        """The family's ControlNet twin for the task and the units' models: built over this model's own
        components (`control.shared_twin`), kept while the next request asks for the same."""
        key = (request.task, *(unit.model_name for unit in request.controlnet))
        if self.control is None or self.control[0] != key:
            models = [self.controlnets.get(unit.model) for unit in request.controlnet]
            twin = control.build_twin(self.pipe, self.traits.class_name, request.task, models)
            self.control = (key, twin)
        return self.control[1]

    def use_scheduler(self, scheduler: Any) -> None:
        """Point the model's pipeline and every twin built from it at `scheduler`."""
        self.pipe.scheduler = scheduler
        for twin in (self.img2img, self.inpaint, self.image_to_video, self.control[1] if self.control else None):
            if twin is not None:
                twin.scheduler = scheduler

    def close(self) -> None:
        self.pipe = self.img2img = self.inpaint = self.control = self.image_to_video = None
