"""ImagePipeline: a diffusers pipeline (+ LoRA) run through a DeviceManager, in batches.

`generate(request)` does, in order:
 1. validate the request (before any model work), the steps against the sampler's minimum included;
 2. pick the pipeline (text-to-image, or the image-to-image / inpainting twin built with
    `from_pipe`: no weights twice) and, for an inpaint, the mask's crop and start (pipelines.imaging.inpaint);
 3. activate the requested LoRAs;
 4. give image i the seed `seed + i` and its own CPU generator;
 5. denoise in micro-batches; on out-of-memory: empty the cache, halve, retry, warn;
 6. report progress from `callback_on_step_end`, stop through the pipeline's interrupt on cancel;
 7. collect images, per-image metadata, timings and peak memory.

Set-up lives apart: loading and recipes in pipelines.run.model_setup, step callbacks in
pipelines.run.callbacks, model and LoRA hashes in pipelines.weights.hashing.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from devices import DeviceManager
from pipelines.control import controlnet as control
from pipelines.control import ip_adapter
from pipelines.control.annotators import Annotators
from pipelines.imaging import hires, inpaint
from pipelines.imaging.inpaint import EMPTY_MASK_WARNING, INPAINT_FAMILIES
from pipelines.imaging.upscalers import Upscalers
from pipelines.prompts import styles
from pipelines.prompts.embeddings import Embeddings
from pipelines.prompts.plan import PromptPlan, PromptSwitch
from pipelines.prompts.syntax import parse
from pipelines.prompts.tokens import count_tokens
from pipelines.prompts.tokens import windows as token_windows
from pipelines.prompts.weights import kind_of
from pipelines.run import model_setup
from pipelines.run.backend import Capabilities, ModelInfo, ReplicaStatus
from pipelines.run.callbacks import (
    CallMonitor,
    CancelFn,
    Chained,
    Interrupted,
    LegacyCallback,
    PreviewFn,
    Previews,
    ProgressFn,
)
from pipelines.run.calls import call_kwargs, size_for
from pipelines.run.model_setup import read_vocabulary
from pipelines.run.options import PipelineOptions
from pipelines.run.traits import denoiser, inspect_pipeline, step_callback_style
from pipelines.sampling import samplers, step_cache, vae_tiling
from pipelines.sampling.guidance import DEFAULT_GUIDANCE_END, GuidanceCutoff, supports_guidance_end
from pipelines.sampling.preview import PreviewDecoder
from pipelines.sampling.step_cache import StepCache
from pipelines.schema.errors import OutOfMemoryError, UnsupportedTaskError
from pipelines.schema.fields import RequestError
from pipelines.schema.request import (
    FALLBACK_GUIDANCE,
    FALLBACK_IMAGE_GUIDANCE,
    FALLBACK_STEPS,
    GenerationRequest,
    GenerationResult,
    RequestLimits,
    item_seed,
    pin_seed,
    validate,
)
from pipelines.weights import hashing, quantization
from pipelines.weights.lora import LoraInfo, LoraManager
from pipelines.weights.recipes import Recipe

if TYPE_CHECKING:
    from devices.runtime import RuntimePlan
    from pipelines.weights.openvino import OpenVinoRuntime

log = logging.getLogger(__name__)

# Default pixel budget per image: the model's native area times this factor (MAX_PIXELS overrides).
# CPU and MPS get 4 (2x each side: a 64x64 model stops at 128x128, SD 1.5 at 1024x1024) because
# work grows faster than linearly with pixels and a CPU image at 4x area already takes minutes;
# accelerators get 9 (3x each side).
PIXEL_BUDGET_FACTOR = {"cpu": 4, "mps": 4}
DEFAULT_PIXEL_BUDGET_FACTOR = 9

# Out-of-memory messages of the backends that do not raise torch.OutOfMemoryError.
OOM_MARKERS = ("out of memory", "NPU out of memory", "MPS backend out of memory", "ACL_ERROR_RT_MEMORY_ALLOCATION")


def is_out_of_memory(exc: BaseException) -> bool:
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m.lower() in str(exc).lower() for m in OOM_MARKERS)


@dataclasses.dataclass
class _Plan:
    """One request's work, fixed before the first diffusers call (`ImagePipeline._plan`)."""

    pipe: Any
    request: GenerationRequest
    items: list[dict[str, Any]]  # the work items run here (a range of the request's, see `work_items`)
    first: int  # index of items[0] among the request's items
    accepted: frozenset[str]  # the parameters the diffusers call takes
    prompts: dict[str, str]  # the user's prompt -> the `prompt` argument (pipelines.prompts.weights)
    size: tuple[int, int]
    guidance_end: float
    warnings: list[str]
    prepared: dict[int, inpaint.Prepared] = dataclasses.field(default_factory=dict)  # by id(input image)
    cache: StepCache | None = None  # the step cache it runs with (pipelines.sampling.step_cache)
    texts: PromptPlan | None = None  # weighted and long prompts (pipelines.prompts.weights)
    control: dict[str, Any] = dataclasses.field(default_factory=dict)  # the units' and image prompts' arguments

    def finish(self, item: dict[str, Any], image: Any) -> Any:
        """An output as the user gets it: an inpaint pasted back into its original (pipelines.imaging.inpaint)."""
        prepared = self.prepared.get(id(item["image"]))
        return image if prepared is None else prepared.paste_back(image)


@dataclasses.dataclass
class _Finished:
    """What the micro-batch loop finished (`ImagePipeline._denoise`), and how it split the batch."""

    micro: int  # the micro-batch size in use (the last one after out-of-memory splits)
    images: list[Any] = dataclasses.field(default_factory=list)
    metas: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    inputs: list[Any] = dataclasses.field(default_factory=list)
    timings: list[dict[str, float]] = dataclasses.field(default_factory=list)
    cancelled: bool = False
    oom_splits: int = 0


class ImagePipeline:
    """Loads a diffusers pipeline through a DeviceManager and runs validated, batched requests."""

    def __init__(self, pipe: Any, device_manager: DeviceManager, options: PipelineOptions, source: str):
        self.pipe = pipe
        self._own_scheduler: Any = None  # the model's own while a request runs with another swapped in
        self.dm = device_manager
        self.options = options
        self.source = source
        self.model_name = Path(source).name or source
        self.model_id = source
        self.load_seconds = 0.0
        self.attention_applied: dict[str, str] = {}
        self.memory_savers: list[str] = []
        self.weights = "on device"  # where the weights live (devices.manager.weights_placement)
        self.component_bytes: dict[str, int] = {}  # per component, weights' real bytes (counted at load)
        self.compile = "no compile"  # what devices.compile did, for the status panel
        self.compile_seconds = 0.0  # the warm-up that paid the compile at load
        self.runtime: OpenVinoRuntime | None = None  # None: torch runs the networks (pipelines.weights.openvino)
        self.runtime_plan: RuntimePlan | None = None  # what RUNTIME chose at load, and why (devices.runtime)
        self.loras = LoraManager(pipe, device_manager, options.lora_dir)
        self._img2img: Any = None
        self._inpaint: Any = None  # the inpainting twin, built on first use (`_pipeline_for`)
        self._lock = threading.RLock()  # one generation at a time per pipeline
        self._micro_batch_limit: dict[tuple[int, int], int] = {}  # learned from out-of-memory errors
        self.traits = inspect_pipeline(pipe)
        self.recipe: Recipe | None = None
        self.default_step_cache = model_setup.default_step_cache(self, options.step_cache, options.step_cache_threshold)
        self._mag_ratios: dict[tuple[int, str], list[float]] = {}  # MagCache calibrations (pipelines.sampling.step_cache)
        self.base_loras: dict[str, float] = {}  # a recipe's LoRAs that stay on (not fused)
        self.embeddings = Embeddings(pipe, options.embeddings_dir)  # before the tokenizers are copied
        self.styles = styles.read(options.styles_file)
        self._token_windows = token_windows(pipe, private=True)  # counted beside a running generation
        self.prompt_weighting = kind_of(pipe, self.traits.params)  # "": prompts go as plain text
        self.vocabulary = read_vocabulary(source)
        self.default_image_guidance = float(self.vocabulary.get("default_image_guidance", FALLBACK_IMAGE_GUIDANCE))
        self.default_guidance_end = float(self.vocabulary.get("default_guidance_end", DEFAULT_GUIDANCE_END))
        self.activity = "idle"  # what it does now, for the status panel
        self._previews = PreviewDecoder(pipe)
        self.upscalers = Upscalers([options.upscaler_dir], device_manager)  # hires fix's (pipelines.imaging.upscalers)
        self.controlnets = control.ControlNets([options.controlnet_dir], device_manager, options.controlnet_models)
        self.annotators = Annotators(options.annotator_dir, device_manager)  # units' depth/normal/seg maps
        self._control: tuple[tuple[str, ...], Any] | None = None  # (task and models, the ControlNet twin)
        self.ip_adapters = ip_adapter.IpAdapters([options.ipadapter_dir])
        self._ip = ip_adapter.Loaded(pipe, self.ip_adapters, self._reset_attention, self.traits.class_name)  # in the denoiser every task shares

    def _reset_attention(self, slicing: bool) -> None:
        """The device's attention on every processor again, sliced too if `slicing` and the memory mode
        slices it. Around IP-Adapter loads: diffusers' load re-creates each processor's class without
        arguments (a sliced one cannot be), and its unload puts diffusers' default back."""
        self.dm.apply_attention(self.pipe)
        if slicing and "attention_slicing" in self.memory_savers:
            self.pipe.enable_attention_slicing()

    @property
    def _tiled_vae_pixels(self) -> int:
        """Images above this many pixels are decoded in tiles: TILED_VAE_PIXELS, else 4 x the native area."""
        w, h = self.default_size
        return self.options.tiled_vae_pixels or 4 * w * h

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(
        cls,
        source: str | Path | None = None,
        device_manager: DeviceManager | None = None,
        options: PipelineOptions | None = None,
        **overrides: Any,
    ) -> ImagePipeline:
        """Load `source` (folder, Hub id or .safetensors; default `options.model_id`) onto the manager's
        device. `overrides` replace fields of `options` (default: PipelineOptions(), not the environment)."""
        return model_setup.load(cls, source, device_manager, (options or PipelineOptions()).updated(**overrides))

    @classmethod
    def from_loaded(
        cls,
        pipe: Any,
        dm: DeviceManager,
        opts: PipelineOptions,
        source: str,
        start: float | None = None,
        recipe: Recipe | None = None,
    ) -> ImagePipeline:
        """Wrap a diffusers pipeline already in memory (a device pool copies one per device):
        the recipe's LoRAs and defaults, attention, memory mode, then onto the manager's device."""
        return model_setup.wrap(cls, pipe, dm, opts, source, start, recipe)

    @property
    def diffusers_pipeline(self) -> Any:
        """The underlying diffusers pipeline (for benchmarks against raw diffusers)."""
        return self.pipe

    @property
    def default_steps(self) -> int:
        """The steps a request naming none gets: the vocabulary's or recipe's, else FALLBACK_STEPS
        (diffusers' signature defaults, often 50, are too many for a first image)."""
        return int(self.vocabulary.get("default_steps", FALLBACK_STEPS))

    @property
    def default_guidance(self) -> float:
        """The guidance a request naming none gets: the vocabulary's or recipe's, else the pipeline's own."""
        own = self.traits.default_guidance or FALLBACK_GUIDANCE
        return float(self.vocabulary.get("default_guidance_scale", own))

    @property
    def vae_scale_factor(self) -> int:
        return int(getattr(self.pipe, "vae_scale_factor", 8))

    @property
    def size_multiple(self) -> int:
        """Width/height step: VAE factor x latent packing or patch size, at least 8 (pipelines.run.traits)."""
        return self.traits.size_step

    @property
    def default_size(self) -> tuple[int, int]:
        """(width, height) the model was trained at."""
        return self.traits.default_size

    @property
    def max_pixels(self) -> int:
        """Largest width x height accepted: MAX_PIXELS, else native area x the device's factor."""
        if self.options.max_pixels:
            return self.options.max_pixels
        w, h = self.default_size
        return w * h * PIXEL_BUDGET_FACTOR.get(self.dm.backend, DEFAULT_PIXEL_BUDGET_FACTOR)

    def render_size(self, request: GenerationRequest) -> tuple[int, int]:
        """(width, height) a request renders at (pipelines.run.calls.size_for)."""
        return size_for(request, self.traits)

    @property
    def limits(self) -> RequestLimits:
        """What `validate` enforces here: the model's size step, MAX_BATCH, the pixel and side caps."""
        return RequestLimits(self.size_multiple, self.options.max_batch, self.max_pixels, self.max_side)

    @property
    def max_side(self) -> int:
        """Largest width or height accepted: MAX_SIDE, else 4 x the native side (room for wide
        and tall formats inside the pixel budget)."""
        side = self.options.max_side or 4 * max(self.default_size)
        return max(self.size_multiple, side - side % self.size_multiple)

    def model_hash(self) -> str | None:
        """A1111's short hash of the checkpoint (or denoiser weights); started in the background at load,
        so a multi-GB model's first result does not wait for it (a cached result when already done)."""
        return hashing.model_hash(self.source)

    def model_info(self) -> ModelInfo:
        """Defaults and limits of the loaded model, as the UI and the API enforce them."""
        return model_setup.describe(self)

    @property
    def own_scheduler(self) -> Any:
        """The model's own scheduler, also while a request runs with another sampler swapped in: what
        the model offers and defaults to must not follow another caller's request (a request naming
        the running one's sampler would read as "the model's own" and lose it)."""
        return self._own_scheduler if self._own_scheduler is not None else self.pipe.scheduler

    @property
    def scheduler_name(self) -> str:
        """The model's own sampler, by its A1111 name where one exists (else the scheduler class)."""
        return samplers.current(self.own_scheduler).name

    # ------------------------------------------------------------------ as a GenerationBackend
    capabilities = Capabilities(previews=True, switch_models=False, count_tokens=True)

    @property
    def concurrency(self) -> int:
        """One generation at a time: a pipeline is one device (serving.pool spreads over several)."""
        return 1

    def status(self) -> list[ReplicaStatus]:
        dm = self.dm
        return [
            ReplicaStatus(
                name=str(dm.device),
                device=str(dm.device),
                backend=dm.backend,
                device_name=dm.device_name,
                dtype=dm.dtype_name,
                attention=dm.attention,
                busy=self.activity != "idle",
                activity=self.activity,
                memory=dm.memory_stats(),
                attention_components=dict(self.attention_applied),
                weights=self.weights + self.controlnets.describe(),
                compile=self.compile,
                runtime=self.runtime_description,
                quantization=quantization.applied(self.pipe),
            )
        ]

    def close(self) -> None:
        """Drop the weights (and OpenVINO's compiled graphs) and give the device memory back."""
        self.pipe = self._img2img = self._inpaint = self._control = self._ip = None
        self.controlnets.close()
        self.runtime = None
        self.dm.empty_cache()

    @property
    def runtime_description(self) -> str:
        """What runs the networks, for the status panel: torch and why, or each network's OpenVINO graph."""
        if self.runtime is not None:
            return self.runtime.describe()
        return self.runtime_plan.describe() if self.runtime_plan is not None else "torch"

    def count_tokens(self, prompt: str) -> list:
        """Prompt tokens per text encoder against what it keeps (the UI's token counter)."""
        return count_tokens(self._token_windows, parse(prompt).text, chunked=bool(self.prompt_weighting))

    # ------------------------------------------------------------------ LoRA
    def load_lora(self, path: str | Path, name: str | None = None, allow_outside: bool = False) -> str:
        with self._lock:
            return self.loras.load(path, name, allow_outside)

    def unload_lora(self, name: str) -> None:
        with self._lock:
            self.loras.unload(name)

    def list_loras(self) -> list[LoraInfo]:
        return self.loras.list()

    # ------------------------------------------------------------------ generation
    def check_task(self, request: GenerationRequest) -> None:
        """Refuse what this model cannot do, with a message that says what it can do."""
        t = self.traits
        if request.hires is not None:  # RequestError naming the hires field (the engine asked this at submit too)
            hires.check(request, self.model_info())
        if request.step_cache not in (None, step_cache.NONE) and self.runtime is not None:
            raise UnsupportedTaskError(
                f"step caches skip torch blocks inside the denoiser, which the OpenVINO runtime runs as one graph, "
                f"so {request.step_cache} cannot be used here (a server with RUNTIME=torch can)"
            )
        if request.step_cache not in (None, step_cache.NONE) and not t.step_cache:
            raise UnsupportedTaskError(
                f"{self.model_name} ({t.class_name}) has no step cache: diffusers gives its "
                f"{type(denoiser(self.pipe)).__name__} none, so {request.step_cache} cannot be used. "
                f"Families with step caching: {step_cache.FAMILIES}"
            )
        if request.controlnet:
            self._check_control(request)
        if request.ip_adapter:
            self._check_image_prompts(request)
        if request.inpaint is not None or t.inpaint_native:
            return self._check_inpaint(request)
        if request.init_images is None and not t.text_to_image:
            raise UnsupportedTaskError(
                f"{self.model_name} ({t.class_name}) is an image-editing model: it needs an input image "
                "(use the Edit tab or pass images); it cannot generate from a prompt alone"
            )
        if request.init_images is not None and not (t.edit or t.image_to_image):
            raise UnsupportedTaskError(
                f"{self.model_name} ({t.class_name}) does text-to-image only: diffusers has no image-to-image "
                "pipeline for this family, so it cannot edit images"
            )
        if request.loras and not t.lora:
            raise UnsupportedTaskError(f"{t.class_name} has no LoRA loader in diffusers; LoRAs cannot be used with it")

    def _check_control(self, request: GenerationRequest) -> None:
        """Units need this family's ControlNet pipeline for the task, and models this server has."""
        try:
            control.twin_class(self.traits.class_name, request.task)
        except control.ControlError as exc:
            raise UnsupportedTaskError(f"{self.model_name}: {exc}") from None
        for i, unit in enumerate(request.controlnet):
            try:
                self.controlnets.check(unit.model)
            except control.ControlError as exc:
                raise RequestError("controlnet", str(exc), (i,)) from None
        try:  # the models' kinds together (T2I-Adapters, union models): their config.json, nothing loaded
            classes = [self.controlnets.class_of(unit.model) for unit in request.controlnet]
            control.check_kinds(self.traits.class_name, request.task, classes)
        except control.ControlError as exc:
            raise UnsupportedTaskError(f"{self.model_name}: {exc}") from None

    def _check_image_prompts(self, request: GenerationRequest) -> None:
        """Image prompts need a family diffusers loads IP-Adapters into and adapters this server has."""
        try:
            ip_adapter.check_family(self.traits.class_name, len(request.ip_adapter))
        except ip_adapter.IpAdapterError as exc:
            raise UnsupportedTaskError(f"{self.model_name}: {exc}") from None
        for i, prompt in enumerate(request.ip_adapter):
            try:
                self.ip_adapters.check(prompt.model)
            except ip_adapter.IpAdapterError as exc:
                raise RequestError("ip_adapter", str(exc), (i,)) from None

    def _check_inpaint(self, request: GenerationRequest) -> None:
        """An inpaint needs a model that inpaints; a model that only inpaints needs a mask."""
        t = self.traits
        if request.inpaint is None:
            raise UnsupportedTaskError(
                f"{self.model_name} ({t.class_name}) is an inpainting model: it needs an input image and a mask "
                "(use Inpaint, or the /inpaint API)"
            )
        if not t.inpaint:
            raise UnsupportedTaskError(
                f"{self.model_name} ({t.class_name}) cannot inpaint: diffusers has no inpainting pipeline for this "
                f"family. Families that inpaint and outpaint: {INPAINT_FAMILIES}"
            )
        if request.loras and not t.lora:
            raise UnsupportedTaskError(f"{t.class_name} has no LoRA loader in diffusers; LoRAs cannot be used with it")

    def _pipeline_for(self, request: GenerationRequest) -> Any:
        if request.controlnet:
            return self._control_pipeline(request)
        if request.inpaint is not None:
            return self._inpaint_pipeline()
        if request.init_images is None or self.traits.image_to_image != "from_pipe":
            return self.pipe  # text-to-image, or already an image-to-image / instruction-edit pipeline
        if self._img2img is None:
            from diffusers import AutoPipelineForImage2Image

            self._img2img = AutoPipelineForImage2Image.from_pipe(self.pipe)  # shares every weight
            self._img2img.set_progress_bar_config(disable=True)
        return self._img2img

    def _inpaint_pipeline(self) -> Any:
        """This pipeline where it takes a mask itself, else its inpainting twin (`traits.inpaint`, or a
        recipe's `inpaint_pipeline`) built with `from_pipe`: every weight shared, built once."""
        if self.traits.inpaint_native:
            return self.pipe
        if self._inpaint is None:
            import diffusers

            self._inpaint = getattr(diffusers, self.traits.inpaint).from_pipe(self.pipe)
            self._inpaint.set_progress_bar_config(disable=True)
        return self._inpaint

    def _control_pipeline(self, request: GenerationRequest) -> Any:
        """The family's ControlNet twin for the task and the units' models (pipelines.control.controlnet): built over
        this model's own components (`control.shared_twin`: no weights copied, none cast), kept while the
        next request asks for the same."""
        key = (request.task, *(unit.model_name for unit in request.controlnet))
        if self._control is None or self._control[0] != key:
            models = [self.controlnets.get(unit.model) for unit in request.controlnet]
            twin = control.build_twin(self.pipe, self.traits.class_name, request.task, models)
            self._control = (key, twin)
        return self._control[1]

    @staticmethod
    def work_items(request: GenerationRequest, seed: int) -> list[dict[str, Any]]:
        """Every image of a request in order (input image, prompt, copy), item i with seed `seed + i`.

        The order and the seeds are what make a request splittable: any contiguous range of
        these items gives the same images wherever it runs (`generate(item_range=...)`).
        """
        items: list[dict[str, Any]] = []
        for image in request.init_images or [None]:
            for prompt in request.prompts:
                for _ in range(request.num_images):
                    items.append({"prompt": prompt, "image": image, "seed": item_seed(seed, len(items))})
        return items

    def generate(
        self,
        request: GenerationRequest,
        progress: ProgressFn | None = None,
        should_cancel: CancelFn | None = None,
        preview: PreviewFn | None = None,
        item_range: tuple[int, int] | None = None,
    ) -> GenerationResult:
        """Run a request; returns what finished (also when cancelled). The first four parameters are the
        `GenerationBackend` contract's, in its order (wrappers pass them positionally).

        `preview(first_image, images)` receives cheap previews of the chunk being denoised every
        PREVIEW_EVERY steps (pipelines.sampling.preview), where the model's latents allow one.

        `item_range=(start, stop)` runs only those work items (see `work_items`): how a device
        pool or a batch job splits one request without changing any image. It needs a fixed
        seed, and the batch cap then applies to the range, not to the whole request.
        """
        count = None
        if item_range is not None:
            start, stop = item_range
            if request.seed is None:
                raise ValueError("item_range: needs a fixed seed (the seeds of the items depend on it)")
            if not 0 <= start < stop <= request.total_images:
                raise ValueError(f"item_range: {item_range} is not a range inside 0..{request.total_images}")
            count = stop - start
        validate(request, self.limits, count=count)
        samplers.check_steps(
            request.sampler or self.scheduler_name,
            request.steps or self.default_steps,
            samplers.minima(self.own_scheduler),
        )
        self.check_task(request)
        request = self._styled(pin_seed(request).with_defaults(self))
        if request.inpaint is not None and inpaint.is_empty(
            inpaint.binary_mask(request.inpaint.mask, request.inpaint.invert_mask)
        ):
            return self._unchanged(request, item_range)
        scheduler = samplers.build(self.own_scheduler, request.sampler) if request.sampler else None
        count_now = count if count is not None else request.total_images

        def report(step: int, total: int, image: int) -> None:
            self.activity = f"{count_now} image(s), step {step}/{total}"
            if progress is not None:
                progress(step, total, image)

        with self._lock:  # one generation per replica: the sampler swap is seen by this request only
            self.activity = f"{count_now} image(s), starting"
            own = self.pipe.scheduler
            if scheduler is not None:
                self._own_scheduler = own  # first: a reader never sees the swapped one as the model's
                self._use_scheduler(scheduler)
            run = functools.partial(hires.run, self) if request.hires is not None else self._generate
            try:
                return run(request, report, should_cancel, item_range, preview)
            finally:
                self._use_scheduler(own)
                self._own_scheduler = None
                self.activity = "idle"

    def _unchanged(self, request: GenerationRequest, item_range: tuple[int, int] | None) -> GenerationResult:
        """An inpaint with an empty mask: each input image back as it was, with a warning (no model work)."""
        items = self.work_items(request, request.seed)
        if item_range is not None:
            items = items[item_range[0] : item_range[1]]
        images = [item["image"].convert("RGB") for item in items]
        metas = [self._metadata(request, item, *image.size) for item, image in zip(items, images, strict=True)]
        inputs = [item["image"] for item in items]
        return self._result(images, metas, inputs, [], [EMPTY_MASK_WARNING], False)

    def _generate(
        self,
        request: GenerationRequest,
        progress: ProgressFn | None,
        should_cancel: CancelFn | None,
        item_range: tuple[int, int] | None = None,
        preview: PreviewFn | None = None,
        items: list[dict[str, Any]] | None = None,
        first: int = 0,
    ) -> GenerationResult:
        """Steps 2-7 of a validated request, under the lock: plan it, denoise it, assemble the result.
        `items` (and the index of the first, `first`): run these work items instead of the request's
        own (a hires pass pairs each enlarged image with its own prompt and seed, pipelines.imaging.hires)."""
        plan = self._plan(request, item_range, items, first)
        steps = self._steps_for(request, plan.accepted)
        sampler = request.sampler or self.scheduler_name
        with (
            step_cache.applied(denoiser(plan.pipe), plan.cache, steps, self._mag_ratios, sampler) as cache,
            vae_tiling.applied(self.pipe, plan.size, self._tiled_vae_pixels, self.memory_savers) as tiled,
        ):
            finished = self._denoise(plan, progress, should_cancel, preview)
        result = self._assemble(plan, finished, cache)
        result.vae_tiling = tiled
        return result

    def _styled(self, request: GenerationRequest) -> GenerationRequest:
        """`request` with its styles applied to the prompt(s) and the negative (pipelines.prompts.styles); the
        result records the prompt that ran, as A1111's does. Names this server lacks stay in `styles`
        for the warning (`_request_warnings`)."""
        known = tuple(name for name in request.styles if name in self.styles)
        if not known:
            return request
        styled = [styles.apply(self.styles, known, p, request.negative_prompt or "") for p in request.prompts]
        prompt = [p for p, _ in styled] if isinstance(request.prompt, list) else styled[0][0]
        unknown = tuple(name for name in request.styles if name not in self.styles)  # said in the result
        return request.replace(prompt=prompt, negative_prompt=styled[0][1], styles=unknown)

    def _plan(
        self,
        request: GenerationRequest,
        item_range: tuple[int, int] | None,
        items: list[dict[str, Any]] | None = None,
        first: int = 0,
    ) -> _Plan:
        """Steps 2-4: the pipeline and its LoRAs, one seed per image, and what this pipeline takes,
        all fixed before the first diffusers call."""
        # 2-3. pipeline and LoRAs
        self._ip.use(request.ip_adapter)  # into the shared UNet (before a twin is built over it), or out
        pipe = self._pipeline_for(request)
        scales = {**self.base_loras, **request.loras}
        self.loras.activate(scales)
        if request.ip_adapter:
            self._ip.lend(pipe)
        if self.runtime is not None:  # a new LoRA or IP-Adapter set gets its own graphs (pipelines.weights.openvino)
            self.runtime.use_loras(self.loras.key(scales))
            self.runtime.use_ip_adapters(self._ip.key(request.ip_adapter))
        # 4. one seed per image
        size = size_for(request, self.traits)
        if items is None:
            items = self.work_items(request, request.seed)  # generate() pinned the seed
            if item_range is not None:
                first = item_range[0]
                items = items[item_range[0] : item_range[1]]
        accepted = frozenset(inspect.signature(pipe.__call__).parameters)
        warnings = self._request_warnings(request, pipe, accepted)
        guidance_end = self._guidance_end(request, pipe, warnings)
        texts = PromptPlan(pipe, accepted, request.steps, self.embeddings.words)
        warnings += texts.warnings(request.prompts, request.negative_prompt)
        prompts = {p: texts.text(p) for p in request.prompts}  # metadata keeps the prompt as written
        plan = _Plan(pipe, request, items, first, accepted, prompts, size, guidance_end, warnings, texts=texts)
        plan.cache = self._step_cache_for(request, warnings)
        if request.inpaint is not None:
            self._plan_inpaint(plan)
        if request.controlnet:
            maps = [control.prepare(unit, plan.size, self.annotators) for unit in request.controlnet]
            models = [self.controlnets.get(unit.model) for unit in request.controlnet]
            modes = control.control_modes(request.controlnet, models)
            plan.control, said = control.call_kwargs(request.controlnet, maps, accepted, request.task, modes)
            plan.warnings += said
        if request.ip_adapter and "ip_adapter_image" not in accepted:
            raise UnsupportedTaskError(
                f"{type(pipe).__name__} takes no image prompts in diffusers: send the image prompts without the units, or the "
                f"units in text-to-image"
            )
        plan.control.update(ip_adapter.call_kwargs(request.ip_adapter))
        return plan

    def _plan_inpaint(self, plan: _Plan) -> None:
        """Each input image's start, mask and paste-back (pipelines.imaging.inpaint); "only masked" renders the
        masked crop at the request's size, else at the crop's aspect ratio at the model's native area."""
        request, spec = plan.request, plan.request.inpaint
        mask = inpaint.binary_mask(spec.mask, spec.invert_mask)
        if spec.only_masked:
            asked = (request.width, request.height) if request.width and request.height else None
            plan.size = inpaint.size_for(spec, mask, asked, self.default_size, self.size_multiple)
        for image in request.init_images:
            plan.prepared[id(image)] = inpaint.prepare(image, mask, spec, plan.size)

    def _denoise(
        self, plan: _Plan, progress: ProgressFn | None, should_cancel: CancelFn | None, preview: PreviewFn | None
    ) -> _Finished:
        """Steps 5-6: the items in micro-batches (halved on out-of-memory), progress and cancel
        through the step callback. A chunk interrupted by cancel is dropped: it is only partly denoised."""
        items = plan.items
        out = _Finished(micro=min(len(items), self.options.micro_batch, self._micro_batch_limit.get(plan.size, 10**6)))
        self.dm.reset_peak_memory()
        done = 0
        steps_done = 0
        while done < len(items):
            if should_cancel is not None and should_cancel():
                out.cancelled = True
                break
            chunk = items[done : done + out.micro]
            steps_per_call = self._steps_for(plan.request, plan.accepted)
            total_steps = steps_done + steps_per_call * -(-(len(items) - done) // out.micro)
            call, switch = self._chunk_kwargs(plan, chunk)
            first = plan.first + done
            timer = CallMonitor(
                plan.pipe, self.dm, progress, should_cancel, steps_done, total_steps, first, steps_per_call
            )
            try:
                output, timing = self._call(plan.pipe, call, timer, preview, first, plan.guidance_end, switch)
            except Exception as exc:
                if not is_out_of_memory(exc):
                    raise
                # what finished so far, for OutOfMemoryError (nothing was cancelled yet)
                partial = functools.partial(
                    self._result, out.images, out.metas, out.inputs, out.timings, plan.warnings, False
                )
                out.micro = self._shrink_after_oom(exc, out.micro, plan.size, partial)
                out.oom_splits += 1
                continue
            if timer.cancelled:
                out.cancelled = True
                break
            out.timings.append(timing)
            steps_done += steps_per_call
            for item, image in zip(chunk, output.images, strict=True):
                image = plan.finish(item, image)
                out.images.append(image)
                out.inputs.append(item["image"])
                rescale = plan.request.guidance_rescale if "guidance_rescale" in plan.accepted else None  # what ran
                out.metas.append(self._metadata(plan.request, item, *image.size, plan.guidance_end, rescale))
            done += len(chunk)
        return out

    def _chunk_kwargs(self, plan: _Plan, chunk: list[dict[str, Any]]) -> tuple[dict[str, Any], PromptSwitch | None]:
        """The diffusers call of one micro-batch: its own CPU generators, its prompts as the encoders take
        them (pipelines.prompts.plan), and the step callback that changes them between steps, if any."""
        generators = [self.dm.create_generator(item["seed"]) for item in chunk]
        fitted = [{**item, "prompt": plan.prompts[item["prompt"]]} for item in chunk]
        if not plan.prepared:
            kwargs = call_kwargs(self.traits, plan.accepted, plan.request, fitted, plan.size, generators)
            return plan.texts.apply({**kwargs, **plan.control})
        prepared = [plan.prepared[id(item["image"])] for item in chunk]
        fitted = [{**item, "image": p.image} for item, p in zip(fitted, prepared, strict=True)]
        kwargs = call_kwargs(self.traits, plan.accepted, plan.request, fitted, plan.size, generators)
        kwargs["mask_image"] = [p.mask for p in prepared]
        return plan.texts.apply({**kwargs, **plan.control})

    def _step_cache_for(self, request: GenerationRequest, warnings: list[str]) -> StepCache | None:
        """The request's step cache ("none": off), else the model's default (STEP_CACHE, the recipe's);
        check_task refused a named one where the model has none."""
        default = self.default_step_cache
        if request.step_cache is None:  # the model's default, at the request's threshold where it gives one
            if default is None or default.threshold is None or request.step_cache_threshold is None:
                return default
            return StepCache(default.method, request.step_cache_threshold)
        cache = StepCache.of(request.step_cache, request.step_cache_threshold)
        if cache is not None and cache.threshold is None and request.step_cache_threshold is not None:
            warnings.append(f"{cache.method} has no threshold; step_cache_threshold was ignored")
        return cache

    def _assemble(self, plan: _Plan, out: _Finished, cache: step_cache.Applied | None = None) -> GenerationResult:
        """Step 7: what finished, with its metadata and timings, and warnings for what did not go as asked;
        the step cache it ran with in the result and in each image's metadata."""
        warnings, items = plan.warnings, plan.items
        width, height = plan.size
        if out.oom_splits:
            chunks = -(-len(items) // out.micro)
            warnings.append(f"out of memory: batch split into {chunks} chunks of at most {out.micro} image(s)")
        if out.cancelled:
            warnings.append(f"cancelled: {len(out.images)} of {len(items)} image(s) finished")
        if out.images and out.images[0].size != (width, height) and not plan.prepared:
            w, h = out.images[0].size
            warnings.append(f"{self.traits.class_name} produced {w}x{h} instead of the requested {width}x{height}")
        result = self._result(out.images, out.metas, out.inputs, out.timings, warnings, out.cancelled)
        if cache is not None:
            result.step_cache = cache.label
            for meta in result.metadata:
                meta.update(cache.metadata())
        return result

    def _call(
        self,
        pipe: Any,
        call: dict[str, Any],
        timer: CallMonitor,
        preview: PreviewFn | None,
        first: int,
        guidance_end: float = DEFAULT_GUIDANCE_END,
        switch: PromptSwitch | None = None,
    ):
        """One diffusers call with the step callback (previews, the prompt switch, guidance end); returns
        (output, phase timings)."""
        callback = timer
        if preview is not None:
            callback = Previews(timer, self._previews, preview, first, self.options.preview_every)
        style = step_callback_style(inspect.signature(pipe.__call__).parameters)  # a twin's may differ (SD's T2I-Adapter)
        if style == "on_step_end":
            call["callback_on_step_end"] = callback
            changers = [c for c in (switch, GuidanceCutoff(pipe, guidance_end) if guidance_end < 1.0 else None) if c]
            if changers:
                chained = Chained(callback, *changers)
                call["callback_on_step_end"] = chained
                call["callback_on_step_end_tensor_inputs"] = chained.tensor_inputs
        elif style == "legacy":  # PixArt: callback(step, timestep, latents), no interrupt flag
            call["callback"] = LegacyCallback(pipe, callback)
            call["callback_steps"] = 1
        output = None
        try:
            timer.begin()
            with self.dm.attention_context():
                output = pipe(**call)
        except Interrupted:
            pass  # a legacy-callback pipeline stopped by Stop: timer.cancelled says so
        finally:
            timing = timer.finish()
            pipe._interrupt = False
        if timer.progress is not None and not timer.cancelled:
            timer.progress(timer.base + timer.call_steps, timer.total, timer.first_image)  # done == total
        if preview is not None and output is not None:
            callback.learn(output.images)
        return output, timing

    def _use_scheduler(self, scheduler: Any) -> None:
        """Point this replica's pipelines (and the image-to-image one built from it) at `scheduler`."""
        self.pipe.scheduler = scheduler
        for twin in (self._img2img, self._inpaint, self._control[1] if self._control else None):
            if twin is not None:
                twin.scheduler = scheduler

    def _shrink_after_oom(self, exc: Exception, micro: int, size: tuple[int, int], partial) -> int:
        """The halved micro-batch after an out-of-memory error, or OutOfMemoryError (with what
        finished) when one image at a time does not fit either."""
        self.dm.empty_cache()
        if micro == 1:
            raise OutOfMemoryError(
                f"out of memory at {size[0]}x{size[1]} even with one image at a time on {self.dm.device}; "
                "try a smaller width/height, or MEMORY_MODE=max to offload weights",
                partial(),
            ) from exc
        self._micro_batch_limit[size] = micro // 2
        log.warning("out of memory at micro-batch %d; retrying with %d", micro, micro // 2)
        return micro // 2

    def _steps_for(self, request: GenerationRequest, accepted: set[str]) -> int:
        """Denoising steps one call runs: image-to-image skips the first (1 - strength) of them."""
        if request.init_images is None or "strength" not in accepted:
            return request.steps
        return max(1, int(request.steps * request.strength))

    def _stops_guidance(self, pipe: Any) -> bool:
        """Whether `pipe` can turn guidance off mid-run: it is known to pipelines.sampling.guidance and reads
        its tensors back from `callback_on_step_end`."""
        return self.traits.step_callback == "on_step_end" and supports_guidance_end(pipe)

    def _guidance_end(self, request: GenerationRequest, pipe: Any, warnings: list[str]) -> float:
        """The share of the steps to guide: the request's, else the model's default; 1.0 (every
        step) where this pipeline cannot stop guidance, with a warning if the request asked."""
        end = request.guidance_end if request.guidance_end is not None else self.default_guidance_end
        if end >= 1.0:
            return 1.0
        if not self._stops_guidance(pipe):
            if request.guidance_end is not None:
                warnings.append(f"{type(pipe).__name__} cannot stop guidance early; guidance end was ignored")
            return 1.0
        return end

    def _request_warnings(self, request: GenerationRequest, pipe: Any, accepted: frozenset[str]) -> list[str]:
        """What the user asked for that this model will not do as asked, said before it runs."""
        warnings: list[str] = []
        if request.negative_prompt and "negative_prompt" not in accepted:
            warnings.append(f"{type(pipe).__name__} has no negative prompt; it was ignored")
        if self.traits.guidance == "none" and request.guidance_scale:
            warnings.append(f"{type(pipe).__name__} takes no guidance; the guidance value was ignored")
        if request.guidance_rescale and "guidance_rescale" not in accepted:
            warnings.append(f"{type(pipe).__name__} has no guidance rescale; {request.guidance_rescale:g} was ignored")
        if self.traits.step_callback == "none":
            warnings.append(f"{type(pipe).__name__} reports no steps: no progress, and Stop waits for the end")
        if request.styles:  # the ones `_styled` could not apply
            warnings.append(styles.unknown_warning(self.styles, request.styles))
        return warnings

    def _metadata(
        self,
        request: GenerationRequest,
        item: dict,
        width: int,
        height: int,
        guidance_end: float = 1.0,
        rescale: float | None = None,
    ) -> dict[str, Any]:
        meta = {
            "prompt": item["prompt"],
            "negative_prompt": request.negative_prompt or "",
            "steps": request.steps,
            "sampler": request.sampler or self.scheduler_name,
            "schedule": samplers.schedule_type(request.sampler or self.scheduler_name, self.pipe.scheduler.config),
            "guidance_scale": request.guidance_scale,
            "seed": item["seed"],
            "width": width,
            "height": height,
            "model": self.model_name,
            "loras": dict(request.loras),
            "device": str(self.dm.device),
            "dtype": self.dm.dtype_name,
            "attention": self.dm.attention,
            "attention_components": dict(self.attention_applied),
        }
        if request.init_images is not None and self.traits.image_guidance:
            meta["image_guidance_scale"] = request.image_guidance_scale
        takes_strength = (
            not self.traits.edit or request.inpaint is not None
        )  # an instruction editor's inpaint twin does
        if request.init_images is not None and takes_strength:
            meta["strength"] = request.strength
        if guidance_end < 1.0:
            meta["guidance_end"] = guidance_end
        if rescale:
            meta["guidance_rescale"] = rescale  # only where it ran (0: none, what A1111 leaves out)
        if request.inpaint is not None:
            meta.update(inpaint.metadata(request.inpaint))
        if request.controlnet:
            meta["controlnet"] = [control.describe(unit) for unit in request.controlnet]
        if request.ip_adapter:
            meta["ip_adapter"] = [ip_adapter.describe(prompt) for prompt in request.ip_adapter]
        quantized = quantization.applied(self.pipe)
        if quantized:  # which weights made the image: a quantized model's output differs from the plain one's
            meta["quantization"] = quantized
        return meta

    def _result(self, images, metas, inputs, timings, warnings, cancelled) -> GenerationResult:
        total = {k: sum(t[k] for t in timings) for k in ("encode", "denoise", "decode", "total")}
        steps = sum(t["steps"] for t in timings)
        total["steps_per_second"] = steps / total["denoise"] if total["denoise"] > 0 else 0.0
        for meta in metas:
            meta["timings"] = {k: round(v, 4) for k, v in total.items()}
            meta.update(hashing.result_hashes(self.source, self.loras.available(), meta.get("loras", {})))
            embeddings = self.embeddings.used(meta["prompt"], meta.get("negative_prompt", ""))
            if embeddings:
                meta["ti_hashes"] = embeddings
        return GenerationResult(
            images=images,
            seeds=[m["seed"] for m in metas],
            metadata=metas,
            timings=total,
            peak_memory=self.dm.memory_stats()["peak"],
            device=str(self.dm.device),
            dtype=self.dm.dtype_name,
            attention=self.dm.attention,
            warnings=warnings,
            cancelled=cancelled,
            inputs=inputs,
            attention_components=dict(self.attention_applied),
        )
