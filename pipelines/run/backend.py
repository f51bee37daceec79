"""The one generation-backend interface the UI talks to, whatever runs behind it.

Three implementations exist:
- `serving.pool.DevicePool`: in-process replicas, one `ImagePipeline` per device (one device
  is a pool of one);
- `serving.ray_backend.RayBackend`: a Ray Serve deployment, one replica per accelerator;
- `pipelines.batch`: offline jobs over processes/machines with accelerate (not a live backend).

Every backend keeps the invariant of the whole project: image i of a request has the seed
`seed + i` (mod 2^64, `request.item_seed`) and is drawn from its own CPU generator, so it is the
same image whichever replica, process or device makes it (within the dtype's tolerance).

Optional abilities are declared, not guessed: a backend says in `capabilities` whether it streams
previews, switches models and counts prompt tokens, and has `load_model` / `count_tokens`
exactly when it declares them (tests/test_engine.py checks every backend class). A wrapper (the
EditRouter, the engine) forwards what the backends behind it declare, so a new wrapper cannot
silently drop an ability the way the editor router once dropped live previews.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

from pipelines.imaging import hires
from pipelines.imaging.upscalers import PIXEL
from pipelines.sampling.samplers import check_steps
from pipelines.schema.control import missing, resolve
from pipelines.schema.detailer import SECOND
from pipelines.schema.fields import shown
from pipelines.schema.request import (
    FALLBACK_IMAGE_GUIDANCE,
    GenerationRequest,
    GenerationResult,
    RequestError,
    RequestLimits,
    routes_to_editor,
    validate,
)
from pipelines.video.family import VideoAbilities

# progress(steps done, steps in all, index of the image being made[, note]): `note` says what holds the steps up
# (an OpenVINO conversion inside the request) and is passed only while there is one (`report_progress`), so a
# callable of the first three arguments keeps working.
ProgressFn = Callable[..., None]
CancelFn = Callable[[], bool]  # polled between denoising steps; True stops after the current step
PreviewFn = Callable[[int, list[Any]], None]  # (index of the first image, preview images of this chunk)


def report_progress(progress: ProgressFn, step: int, total: int, image: int, note: str = "") -> None:
    """`progress` called with the note only when there is one: how every backend's wire passes progress on."""
    if note:
        progress(step, total, image, note)
    else:
        progress(step, total, image)


@dataclass(frozen=True)
class Capabilities:
    """The optional abilities of a backend: what the UI and the APIs may offer with it."""

    previews: bool = False  # `generate(..., preview=fn)` calls fn with frames while it denoises
    switch_models: bool = False  # has `load_model(model_id, progress)`
    count_tokens: bool = False  # has `count_tokens(prompt)`


@dataclass
class ReplicaStatus:
    """One row of the status panel / `/status`: one device (or remote replica) and what it does."""

    name: str  # "cuda:0", "cpu#1", "ray:<replica id>"
    device: str  # torch device string
    backend: str  # cuda | rocm | npu | xpu | mps | cpu
    device_name: str
    dtype: str
    attention: str
    healthy: bool = True
    busy: bool = False
    activity: str = "idle"  # e.g. "4 image(s), step 5/20"
    error: str | None = None  # why it was marked unhealthy
    memory: dict[str, Any] = field(default_factory=dict)  # DeviceManager.memory_stats()
    attention_components: dict[str, str] = field(default_factory=dict)  # per component, what runs
    weights: str = "on device"  # on device | CPU offload (model) | group offload (block|leaf)
    compile: str = "no compile"  # what devices.compile did (or why not)
    runtime: str = "torch"  # what runs the networks: torch and why, or OpenVINO per network (devices.runtime)
    quantization: dict[str, str] = field(default_factory=dict)  # per component, what the loader made (quantization)
    vae: str = "the model's own"  # or the tiny autoencoder TINY_VAE put in its place (pipelines.weights.tiny_vae)
    role: str = "main"  # "main" serves every request; "editor" / "video" the Edit / Video tab beside it (EditRouter, VideoRouter)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ModelInfo:
    """What the UI needs to know of the loaded model: one typed description, one set of limits.

    Built by `ImagePipeline.model_info()`; a remote backend returns its replicas' copy. Holds no
    server paths (it is shown to clients).
    """

    model_name: str
    default_width: int
    default_height: int
    size_multiple: int  # width/height step
    max_side: int  # largest width or height accepted
    max_pixels: int  # largest width x height accepted
    max_batch: int  # most images per request
    default_steps: int
    default_guidance: float
    scheduler: str  # the model's own sampler, by its A1111 name where one exists
    samplers: tuple[str, ...] = ()  # every sampler this model can use (pipelines.sampling.samplers)
    min_steps: dict[str, int] = field(default_factory=dict)  # fewest steps per sampler, its own too (samplers.minima)
    loras: tuple[str, ...] = ()
    embeddings: dict[str, dict[str, int]] = field(default_factory=dict)  # name -> vectors, shape (pipelines.prompts.embeddings)
    embeddings_skipped: dict[str, str] = field(default_factory=dict)  # name -> why it does not fit this model
    styles: dict[str, dict[str, str]] = field(default_factory=dict)  # name -> its texts (pipelines.prompts.styles)
    vocabulary: dict[str, Any] = field(default_factory=dict)  # embedded models: pattern, words, examples
    examples: tuple[str, ...] = ()
    pipeline_class: str = ""
    text_to_image: bool = True
    edit: bool = False  # an instruction editor (input image + instruction)
    image_to_image: bool = True
    inpaint: bool = False  # repaints a masked region (pipelines.imaging.inpaint); outpainting is an inpaint too
    guidance_label: str = "CFG scale"  # what the guidance slider drives on this model
    image_guidance: bool = False  # takes image_guidance_scale (InstructPix2Pix)
    default_image_guidance: float = FALLBACK_IMAGE_GUIDANCE
    guidance_end: bool = False  # can stop guidance before the last step (pipelines.sampling.guidance)
    default_guidance_end: float = 1.0
    notes: str = ""  # a recipe's notes for the user
    lora_supported: bool = True
    attention: dict[str, str] = field(default_factory=dict)  # per component, what runs
    step_cache: bool = False  # offers step caches (pipelines.sampling.step_cache); the UI disables the choice where not
    default_step_cache: str = "none"  # what a request naming none gets (STEP_CACHE or the recipe's)
    default_step_cache_threshold: float | None = None
    quantization: dict[str, str] = field(default_factory=dict)  # per component, what quantization ran
    component_bytes: dict[str, int] = field(default_factory=dict)  # per component, weights' real bytes
    upscalers: tuple[str, ...] = tuple(PIXEL)  # what hires fix may enlarge with (pipelines.imaging.upscalers), latent modes last
    controlnets: tuple[str, ...] = ()  # the ControlNets units may name (pipelines.control.controlnet)
    annotators: tuple[str, ...] = ()  # the model-based preprocessors units may name (pipelines.control.annotators)
    controlnet_tasks: tuple[str, ...] = ()  # the tasks this family runs units for (pipelines.control.controlnet.TWINS)
    ip_adapters: tuple[str, ...] = ()  # the IP-Adapters image prompts may name; none where the family takes none
    detectors: tuple[str, ...] = ()  # the detailer's detectors (DETECTOR_DIR, pipelines.imaging.detailer)
    wildcards: tuple[str, ...] = ()  # the wildcards prompts may name as __name__ (WILDCARD_DIR, pipelines.prompts.wildcards)
    editor: ModelInfo | None = None  # the model serving edits, when it is another one (serving.editing)
    video: ModelInfo | None = None  # the model serving video requests, when it is another one (serving.video)
    clips: VideoAbilities | None = None  # this model makes clips: its frames and fps (pipelines.video.family)
    trained_sides: tuple[int, int] | None = None  # (shortest, longest) side trained at, where the card says; the UI's sliders stop there

    @property
    def side_bounds(self) -> tuple[int, int]:
        """The size sliders' (least, most) side: the sides trained at where the card says (hires fix
        draws beyond), else the size step to the largest accepted side."""
        low, high = self.trained_sides or (self.size_multiple, self.max_side)
        return low, min(high, self.max_side)

    @property
    def limits(self) -> RequestLimits:
        """The limits `validate(request, limits)` enforces for this model on its device."""
        return RequestLimits(self.size_multiple, self.max_batch, self.max_pixels, self.max_side)

    @property
    def for_edits(self) -> ModelInfo:
        """The model the Edit tab's requests go to: its defaults, samplers and limits."""
        return self.editor or self

    @property
    def for_video(self) -> ModelInfo:
        """The model video requests go to (the Video tab's): a video model beside this one, else this one."""
        return self.video or self

    def for_task(self, task: str) -> ModelInfo:
        """The model that runs a request of `task` (txt2img | img2img | inpaint | video), whose defaults and
        limits apply: the routing rule is `pipelines.schema.request.routes_to_editor`'s, video to `for_video`."""
        if task == "video":
            return self.for_video
        return self.for_edits if routes_to_editor(task) else self

    def serving(self, request: GenerationRequest) -> ModelInfo:
        """The model that runs `request` (`for_task` of its task)."""
        return self.for_task(request.task)

    def accept(self, request: GenerationRequest) -> GenerationRequest:
        """`request` as this model takes it, or RequestError naming the field: within its limits
        (`validate`), a sampler it offers (its own one named: none) and the steps that sampler needs,
        LoRAs it has. The engine asks this of every request, so every front end gets the same answer."""
        validate(request, self.limits)
        if request.sampler is not None and request.sampler not in self.samplers:
            raise RequestError(
                "sampler", f"{shown(request.sampler, 80)} is not available; available: {', '.join(self.samplers)}"
            )
        unknown = [name for name in request.loras if name not in self.loras]
        if unknown:
            offered = ", ".join(self.loras) or "none"
            raise RequestError("loras", f"unknown LoRA {shown(unknown[0], 80)}; available: {offered}", (unknown[0],))
        check_steps(request.sampler or self.scheduler, request.steps or self.default_steps, self.min_steps)
        if (request.num_frames is not None) != (self.clips is not None):
            raise RequestError("num_frames", _video_mismatch(self, request))
        if self.clips is not None:
            request = self.clips.accept(request)
        if request.hires is not None:
            hires.check(request, self)
        if request.controlnet:
            self._accept_units(request)
        for i, prompt in enumerate(request.ip_adapter):
            if prompt.model_name not in self.ip_adapters:
                offered = ", ".join(self.ip_adapters) or f"none for {self.pipeline_class or self.model_name} (IPADAPTER_DIR)"
                raise RequestError("ip_adapter", f"model: no IP-Adapter named {shown(prompt.model, 80)}; available: {offered}", (i,))
        for part, name in ((request.detailer, "detailer"), (request.detailer_2nd, "detailer_2nd")):
            if part is not None and part.on:
                self._accept_pass(part.plain()["ad_model"], name)
        if request.sampler is not None and request.sampler == self.scheduler:
            request = request.model_copy(update={"sampler": None})  # the model's own: nothing to swap
        return request

    def _accept_pass(self, name: str, part: str) -> None:
        """A detailer pass inpaints each region with a detector this server has."""
        where = (part, "ad_model" + (SECOND if part.endswith(SECOND) else ""))
        if not self.inpaint:
            raise RequestError(where, f"{self.model_name} ({self.pipeline_class}) cannot inpaint, which the detailer does to each region")
        if name not in self.detectors:
            offered = ", ".join(self.detectors) or "none (DETECTOR_DIR)"
            raise RequestError(where, f"no detector named {shown(name, 80)}; available: {offered}")

    def _accept_units(self, request: GenerationRequest) -> None:
        """ControlNet units: a task this family runs them for, models this server has."""
        if request.task not in self.controlnet_tasks:
            can = f"units for {', '.join(self.controlnet_tasks)} only" if self.controlnet_tasks else "no ControlNet pipeline in diffusers"
            raise RequestError("controlnet", f"{self.pipeline_class or self.model_name} has {can}; this request is {request.task}")
        for i, unit in enumerate(request.controlnet):
            if unit.model_name not in self.controlnets:
                offered = ", ".join(self.controlnets) or "none (CONTROLNET_DIR)"
                raise RequestError("controlnet", f"model: no ControlNet named {shown(unit.model, 80)}; available: {offered}", (i,))
            pre = resolve(unit.module)
            if pre.model_based and pre.name not in self.annotators:
                raise RequestError("controlnet", f"module: {missing(pre.name, None)}", (i,))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _video_mismatch(model: ModelInfo, request: GenerationRequest) -> str:
    """Why `model` cannot serve `request`: a video request to an image model, or the other way round."""
    name = f"{model.model_name} ({model.pipeline_class})" if model.pipeline_class else model.model_name
    if model.clips is None:
        return f"{name} makes images, not clips; a video model (VIDEO_MODEL_ID, the Video tab) serves num_frames"
    return f"{name} makes clips: a request to it names num_frames (1 for a still frame)"


@runtime_checkable
class GenerationBackend(Protocol):
    """What the app needs from whatever generates images.

    `generate` has `ImagePipeline.generate`'s contract: validate first (ValueError naming the
    field), then run; returns what finished, also when cancelled; raises `PipelineError`
    subclasses with a user-facing message. `preview` is called only where `capabilities.previews`.

    Declared in `capabilities`, and present only then:
        load_model(model_id: str, progress: Callable[[float, str], None] | None) -> ModelInfo
        count_tokens(prompt: str) -> list  (pipelines.prompts.tokens)
    """

    @property
    def capabilities(self) -> Capabilities:
        """The optional abilities this backend has (and forwards, for a wrapper)."""
        ...

    @property
    def concurrency(self) -> int:
        """How many generations may run at once (one per healthy replica)."""
        ...

    def generate(
        self,
        request: GenerationRequest,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        preview: PreviewFn | None = None,
    ) -> GenerationResult: ...

    def model_info(self) -> ModelInfo:
        """The loaded model's defaults and limits (the same on every replica)."""
        ...

    def status(self) -> list[ReplicaStatus]:
        """One entry per replica, cheap enough to call every 2 s."""
        ...

    def close(self) -> None:
        """Release the replicas (devices, actors)."""
        ...
