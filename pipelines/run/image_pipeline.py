"""ImagePipeline: a diffusers pipeline (+ LoRA) run through a DeviceManager, in batches.

`generate(request)` does, in order, each step in its own module of this room:
 1. validate the request (before any model work), the steps against the sampler's minimum included,
    and refuse what this model cannot do (`checks`);
 2. pick the pipeline: text-to-image, or the image-to-image / inpainting / ControlNet twin built
    over the same weights (`twins`);
 3. plan: the LoRAs, one seed `seed + i` per image, the prompts as the encoders take them, an
    inpaint's crops, the control arguments, the step cache, the warnings (`planning`);
 4. denoise in micro-batches with their own CPU generators; on out-of-memory: empty the cache,
    halve, retry, warn; progress, previews and Stop through the step callback (`denoise`);
 5. collect images, per-image metadata, timings and peak memory (`results`).

A hires request runs steps 2-5 twice (pipelines.imaging.hires). Set-up lives apart: loading and
recipes in `model_setup`, step callbacks in `callbacks`, model and LoRA hashes in pipelines.weights.hashing.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from devices import DeviceManager
from pipelines.control import controlnet as control
from pipelines.control import ip_adapter
from pipelines.control.annotators import Annotators
from pipelines.imaging import detailer, hires, inpaint
from pipelines.imaging.upscalers import Upscalers
from pipelines.prompts import styles
from pipelines.prompts.embeddings import Embeddings
from pipelines.prompts.syntax import parse
from pipelines.prompts.tokens import count_tokens
from pipelines.prompts.tokens import windows as token_windows
from pipelines.prompts.weights import kind_of
from pipelines.prompts.wildcards import Wildcards
from pipelines.run import checks, denoise, model_setup, planning, results
from pipelines.run.backend import Capabilities, ModelInfo, ReplicaStatus
from pipelines.run.callbacks import CancelFn, PreviewFn, ProgressFn, RequestProgress
from pipelines.run.calls import size_for
from pipelines.run.model_setup import read_vocabulary
from pipelines.run.options import PipelineOptions
from pipelines.run.traits import denoiser, inspect_pipeline
from pipelines.run.twins import Twins
from pipelines.sampling import few_step, samplers, step_cache, vae_tiling
from pipelines.sampling.guidance import DEFAULT_GUIDANCE_END
from pipelines.sampling.preview import PreviewDecoder
from pipelines.schema.request import (
    FALLBACK_GUIDANCE,
    FALLBACK_IMAGE_GUIDANCE,
    FALLBACK_STEPS,
    GenerationRequest,
    GenerationResult,
    RequestLimits,
    pin_seed,
    validate,
)
from pipelines.video import family as video
from pipelines.video import refine
from pipelines.weights import hashing, quantization
from pipelines.weights.lora import LoraInfo, LoraManager
from pipelines.weights.recipes import Recipe
from pipelines.weights.tiny_vae import TinyVae

if TYPE_CHECKING:
    from devices.runtime import RuntimePlan
    from pipelines.run.xla_route import XlaRoute
    from pipelines.weights.openvino import OpenVinoRuntime

log = logging.getLogger(__name__)

# Default pixel budget per image: the model's native area times this factor (MAX_PIXELS overrides).
# CPU and MPS get 4 (2x each side: a 64x64 model stops at 128x128, SD 1.5 at 1024x1024) because
# work grows faster than linearly with pixels and a CPU image at 4x area already takes minutes;
# accelerators get 9 (3x each side).
PIXEL_BUDGET_FACTOR = {"cpu": 4, "mps": 4}
DEFAULT_PIXEL_BUDGET_FACTOR = 9


def _helper_device(dm: DeviceManager) -> DeviceManager:
    """Where the model's helpers run (upscalers, annotators, detectors, ControlNets): its own device, or the
    host CPU on a TPU, whose route (pipelines.run.xla_route) compiles the model's own UNet and VAE only."""
    return DeviceManager("cpu") if dm.backend == "tpu" else dm


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
        self.tiny_vae = TinyVae()  # TINY_VAE: a tiny autoencoder in place of the VAE (pipelines.weights.tiny_vae)
        self.xla: XlaRoute | None = None  # the TPU route (pipelines.run.xla_route): set at load on `tpu`
        self.loras = LoraManager(pipe, device_manager, options.lora_dir)
        self._lock = threading.RLock()  # one generation at a time per pipeline
        self.micro_batch_limit: dict[tuple[int, int], int] = {}  # learned from out-of-memory errors
        self.traits = inspect_pipeline(pipe)
        self.recipe: Recipe | None = None
        self.default_step_cache = model_setup.default_step_cache(self, options.step_cache, options.step_cache_threshold)
        self._mag_ratios: dict[tuple[int, str], list[float]] = {}  # MagCache calibrations (sampling.step_cache)
        self.base_loras: dict[str, float] = {}  # a recipe's LoRAs that stay on (not fused)
        self.embeddings = Embeddings(pipe, options.embeddings_dir)  # before the tokenizers are copied
        self.styles = styles.read(options.styles_file)
        self._token_windows = token_windows(pipe, private=True)  # counted beside a running generation
        self.prompt_weighting = kind_of(pipe, self.traits.params)  # "": prompts go as plain text
        self.vocabulary = read_vocabulary(source)
        # a video model's clips (pipelines.video.family); its vocabulary may name the size it was trained at
        self.clips = video.abilities(pipe, self.vocabulary) if video.makes_clips(pipe) else None
        # a refine pass of its clips that its vocabulary names (pipelines.video.refine: the embedded model's)
        self.refiner_spec = refine.read_spec(self.vocabulary, source) if self.clips is not None else None
        self.refiner = refine.load(self.refiner_spec, device_manager) if self.refiner_spec is not None else None
        if "default_width" in self.vocabulary:
            size = (int(self.vocabulary["default_width"]), int(self.vocabulary["default_height"]))
            self.traits = dataclasses.replace(self.traits, default_size=size)
        self.default_image_guidance = float(self.vocabulary.get("default_image_guidance", FALLBACK_IMAGE_GUIDANCE))
        self.default_guidance_end = float(self.vocabulary.get("default_guidance_end", DEFAULT_GUIDANCE_END))
        self.activity = "idle"  # what it does now, for the status panel
        self.request_progress: RequestProgress | None = None  # the running request's (model_setup's runtime notes)
        self.preview_decoder = PreviewDecoder(pipe)
        helpers = _helper_device(device_manager)
        self.upscalers = Upscalers([options.upscaler_dir], helpers)  # hires fix's (pipelines.imaging.upscalers)
        self.controlnets = control.ControlNets([options.controlnet_dir], helpers, options.controlnet_models)
        self.annotators = Annotators(options.annotator_dir, helpers)  # units' depth/normal/seg maps
        self.twins = Twins(pipe, lambda: self.traits, self.controlnets)  # each task's pipeline (run.twins)
        self.twins.clips = self.clips
        self.ip_adapters = ip_adapter.IpAdapters([options.ipadapter_dir])
        self.wildcards = Wildcards(options.wildcard_dir)  # {a|b} and __name__ in prompts (pipelines.prompts.wildcards)
        self.detectors = detailer.Detectors(options.detector_dir, helpers)  # the detailer's (pipelines.imaging.detailer)
        self.ip_loaded = ip_adapter.Loaded(
            pipe, self.ip_adapters, self._reset_attention, self.traits.class_name
        )  # in the denoiser every task shares

    def _reset_attention(self, slicing: bool) -> None:
        """The device's attention on every processor again, sliced too if `slicing` and the memory mode
        slices it. Around IP-Adapter loads: diffusers' load re-creates each processor's class without
        arguments (a sliced one cannot be), and its unload puts diffusers' default back."""
        self.dm.apply_attention(self.pipe)
        if slicing and "attention_slicing" in self.memory_savers:
            self.pipe.enable_attention_slicing()

    @property
    def _tiled_vae_pixels(self) -> int:
        """Images above this many pixels are decoded in tiles: TILED_VAE_PIXELS, else the model's vocabulary's
        (the embedded model's VAE, trained at 64 px only, decodes larger pictures in tiles of that size: its
        mid-block attention mixes two scenes of a wider latent), else 4 x the native area."""
        w, h = self.default_size
        return self.options.tiled_vae_pixels or int(self.vocabulary.get("tiled_vae_pixels", 4 * w * h))

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
    def trained_sides(self) -> tuple[int, int] | None:
        """(shortest, longest) side the model was trained at, where its card says (an embedded model's
        vocabulary "sizes"): the UI's size sliders stop there and hires fix draws beyond."""
        sizes = self.vocabulary.get("sizes")
        return (int(sizes["min_side"]), int(sizes["max_side"])) if sizes else None

    @property
    def max_pixels(self) -> int:
        """Largest width x height accepted: MAX_PIXELS, else the native area (the largest square the card
        names as trained, where it does) x the device's factor: room for hires fix x2 on CPU."""
        if self.options.max_pixels:
            return self.options.max_pixels
        w, h = self.default_size
        area = max(w * h, self.trained_sides[1] ** 2) if self.trained_sides else w * h
        return area * PIXEL_BUDGET_FACTOR.get(self.dm.backend, DEFAULT_PIXEL_BUDGET_FACTOR)

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

    def build_sampler(self, name: str, overrides: dict[str, Any] | None = None) -> Any:
        """The sampler `name` built from the model's own scheduler, for a request or its hires pass (on the TPU
        route its timesteps kept on the CPU: pipelines.run.xla_route.cpu_timesteps)."""
        scheduler = samplers.build(self.own_scheduler, name, overrides)
        return scheduler if self.xla is None else self.xla.scheduler(scheduler)

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
                vae=self.tiny_vae.describe(),
            )
        ]

    def close(self) -> None:
        """Drop the weights (and OpenVINO's compiled graphs) and give the device memory back."""
        self.twins.close()
        self.pipe = self.ip_loaded = None
        self.controlnets.close()
        self.runtime = self.xla = None
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

    def few_step_names(self, request: GenerationRequest) -> list[str]:
        """What a few-step kind is recognised by (pipelines.sampling.few_step): the request's LoRAs, the
        recipe's, the model's name and source."""
        recipe = [lora.path for lora in self.recipe.loras] if self.recipe else []
        return [*(request.loras or {}), *recipe, self.model_name, str(self.source)]

    # ------------------------------------------------------------------ LoRA
    def load_lora(self, path: str | Path, name: str | None = None, allow_outside: bool = False) -> str:
        with self._lock:  # on the TPU route, a PatchedLoras (pipelines.run.xla_route): read for weight patching
            return self.loras.load(path, name, allow_outside)

    def unload_lora(self, name: str) -> None:
        with self._lock:
            self.loras.unload(name)

    def list_loras(self) -> list[LoraInfo]:
        return self.loras.list()

    # ------------------------------------------------------------------ generation

    work_items = staticmethod(planning.work_items)  # every image of a request, item i with seed `seed + i`
    check_task = checks.check_task  # step 1's refusals (pipelines.run.checks)

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
        request, few = self._checked(request, count)
        if request.inpaint is not None and inpaint.is_empty(
            inpaint.binary_mask(request.inpaint.mask, request.inpaint.invert_mask)
        ):
            return results.unchanged(self, request, item_range)
        overrides = dict(few.scheduler_options) if few else None
        scheduler = self.build_sampler(request.sampler, overrides) if request.sampler else None
        count_now = count if count is not None else request.total_images
        report = RequestProgress(self, progress, count_now, item_range[0] if item_range else 0)
        with self._lock:  # one generation per replica: the sampler swap is seen by this request only
            report.begin()
            self.request_progress = report  # an OpenVINO conversion inside it shows in its progress
            own = self.pipe.scheduler
            if scheduler is not None:
                self._own_scheduler = own  # first: a reader never sees the swapped one as the model's
                self.twins.use_scheduler(scheduler)
            try:
                with self.xla.context() if self.xla is not None else contextlib.nullcontext():
                    return self._on_runtime(request, report, should_cancel, item_range, preview)
            finally:
                self.twins.use_scheduler(own)
                self._own_scheduler = None
                self.activity, self.request_progress = "idle", None

    def _checked(self, request: GenerationRequest, count: int | None) -> tuple[GenerationRequest, few_step.FewStep | None]:
        """Step 1: wildcards resolved, a few-step model's or LoRA's sampler and steps applied where the request
        left them to the model, then every refusal before model work; the request with its defaults filled."""
        request = self.wildcards.resolve(pin_seed(request))  # the engine's already were (a no-op then)
        few = few_step.find(self.few_step_names(request))
        request = few_step.apply(few, request) if few else request
        validate(request, self.limits, count=count)
        samplers.check_steps(
            request.sampler or self.scheduler_name,
            request.steps or self.default_steps,
            samplers.minima(self.own_scheduler),
        )
        self.check_task(request)
        if self.clips is not None:
            request = self.clips.accept(request)  # the model's fps where the request names none
        request = planning.styled(self, request.with_defaults(self))
        if few:
            few_step.check(few, request, request.sampler or self.scheduler_name)
        return request, few

    def _on_runtime(self, request: GenerationRequest, progress: ProgressFn, should_cancel: CancelFn | None,
                    item_range: tuple[int, int] | None, preview: PreviewFn | None) -> GenerationResult:  # fmt: skip
        """`_passes` on the runtime the request can run on: with RUNTIME=auto, a request OpenVINO cannot run
        (checks.torch_needed) runs on the torch modules, and its info says why."""
        why = checks.torch_needed(self, request)
        if why is None or self.runtime is None or self.runtime.plan.strict:
            return self._passes(request, progress, should_cancel, item_range, preview)
        with self.runtime.torch_only(why):
            result = self._passes(request, progress, should_cancel, item_range, preview)
        result.warnings.append(f"runtime: torch for this request ({why}); RUNTIME=auto runs OpenVINO otherwise")
        return result

    def _passes(self, request: GenerationRequest, progress: ProgressFn, should_cancel: CancelFn | None,
                item_range: tuple[int, int] | None, preview: PreviewFn | None) -> GenerationResult:  # fmt: skip
        """Steps 2-5, with hires fix's second pass and then the detailer's passes where the request has them."""
        run = functools.partial(hires.run, self) if request.hires is not None else self._generate
        result = run(request, progress, should_cancel, item_range, preview)
        return detailer.run(self, request, result, progress, should_cancel, preview) if detailer.passes(request) else result

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
        """Steps 2-5 of a validated request, under the lock: plan it, denoise it, assemble the result.
        `items` (and the index of the first, `first`): run these work items instead of the request's
        own (a hires pass pairs each enlarged image with its own prompt and seed, pipelines.imaging.hires)."""
        plan = planning.plan(self, request, item_range, items, first)
        steps = denoise.steps_for(self, request, plan.accepted)
        sampler = request.sampler or self.scheduler_name
        regional = plan.regional.applied(denoiser(plan.pipe)) if plan.regional else contextlib.nullcontext()
        with (
            step_cache.applied(denoiser(plan.pipe), plan.cache, steps, self._mag_ratios, sampler) as cache,
            vae_tiling.applied(self.pipe, plan.size, self._tiled_vae_pixels, self.memory_savers) as tiled,
            regional,
        ):
            finished = denoise.denoise(self, plan, progress, should_cancel, preview)
        result = results.assemble(self, plan, finished, cache)
        result.vae_tiling = tiled
        return result
