"""Turning a diffusers pipeline into a ready ImagePipeline: open the model (or recipe), apply the
recipe's name, task, defaults and LoRAs, set attention and memory mode, move it to the device;
then `describe` what the set-up model offers (its defaults and limits, `model_info`).

Apart from pipelines.run.image_pipeline so the class keeps to running requests; pipelines.weights.loading finds
and loads the raw diffusers pipeline, this module sets it up. It never imports image_pipeline (the
class is passed in as `cls`, the instance as `self`), so the two form no import cycle.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from pathlib import Path
from typing import Any

from devices import DeviceManager
from devices import compile as graph_compile
from devices import runtime as runtimes
from devices.attention import describe as describe_attention
from devices.manager import OFFLOAD_SAVERS, weights_placement
from devices.one_load import ONE_LOAD
from pipelines.control import controlnet as control
from pipelines.control import ip_adapter
from pipelines.imaging import hires
from pipelines.run import planning
from pipelines.run.backend import ModelInfo
from pipelines.run.options import PipelineOptions
from pipelines.sampling import samplers, vae_tiling
from pipelines.sampling.step_cache import StepCache
from pipelines.schema.errors import ModelLoadError
from pipelines.schema.request import GenerationRequest
from pipelines.video import family as video
from pipelines.weights import quantization, tiny_vae
from pipelines.weights.recipes import Recipe, open_model

log = logging.getLogger(__name__)

# Devices the DeviceManager knows but the pipelines cannot run on, and what to use instead (none today:
# the TPU runs through pipelines.run.xla_route, which refuses what it cannot run once the model is open).
NO_PIPELINES: dict[str, str] = {}


def read_vocabulary(source: str) -> dict[str, Any]:
    """A model folder's optional vocabulary.json: the words it knows, its default steps/CFG.

    The embedded model ships one (it only understands its own small world); for other models
    it is absent and the app shows no vocabulary.
    """
    path = Path(source) / "vocabulary.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return {}


def check_device(dm: DeviceManager, source: str) -> None:
    """ModelLoadError when the pipelines cannot run on the manager's device (NO_PIPELINES says why)."""
    if dm.backend in NO_PIPELINES:
        raise ModelLoadError(f"cannot load {source} on {dm.device}: {NO_PIPELINES[dm.backend]}")


def open_with(source: str, dm: DeviceManager, opts: PipelineOptions) -> tuple[Any, Recipe | None, str]:
    """`open_model` as every load of the app runs it (`load`, a device pool's replicas): one load at a time
    (devices.one_load), the video room's component classes imported first (a model folder may name the video
    room's own VAE class by its module, and diffusers loads only from a module already imported)."""
    with ONE_LOAD:
        video.import_components()
        return open_model(source, dm, opts.extra, opts.quantization, opts.base_model)


def load(cls: type, source: str | Path | None, device_manager: DeviceManager | None, opts: PipelineOptions) -> Any:
    """`cls.from_pretrained`: open `source` (folder, Hub id, .safetensors or recipe; default
    `opts.model_id`) and wrap it as `cls` on the manager's device."""
    source = str(source or opts.model_id)
    dm = device_manager or DeviceManager()
    check_device(dm, source)  # before the weights are read
    start = time.perf_counter()
    with ONE_LOAD:  # devices.one_load: module builds swap process-wide torch state
        pipe, recipe, weights = open_with(source, dm, opts)
        self = cls.from_loaded(pipe, dm, opts, weights, start, recipe)
    self.model_id = source  # what MODEL_ID said (a recipe name stays a name)
    return self


def wrap(
    cls: type,
    pipe: Any,
    dm: DeviceManager,
    opts: PipelineOptions,
    source: str,
    start: float | None = None,
    recipe: Recipe | None = None,
) -> Any:
    """`cls.from_loaded`: a `cls` around a diffusers pipeline already in memory, with the recipe's
    LoRAs and defaults, attention, memory mode, then on the manager's device; the model hash starts
    in the background so the first result does not wait for a multi-GB read."""
    check_device(dm, source)  # a device pool's replicas come here without `load`
    start = time.perf_counter() if start is None else start
    pipe.set_progress_bar_config(disable=True)
    self = cls(pipe, dm, opts, source)
    if recipe is not None:
        apply_recipe(self, recipe)
    self.tiny_vae = tiny_vae.apply(pipe, self.traits.class_name, opts.tiny_vae)  # before the savers tile it
    applied = dm.apply_attention(pipe)
    self.memory_savers = vae_tiling.keep_whole(pipe, dm.set_memory_efficient_mode(pipe, opts.memory_mode))
    self.attention_applied = describe_attention(pipe, applied)  # read back after the memory savers
    self.weights = weights_placement(self.memory_savers)
    # counted once, here: later the weights may be out of reach (ZeroGPU offloads them to disk in the
    # parent process, where any tensor call raises), and the bytes do not depend on the device
    self.component_bytes = quantization.component_bytes(pipe)
    if dm.backend == "tpu":
        to_tpu(self)
    elif not set(OFFLOAD_SAVERS) & set(self.memory_savers):
        pipe.to(dm.device)
    setup_runtime(self)
    if self.xla is not None:
        xla_warm_up(self)
    else:
        compile_and_warm_up(self)
    self.load_seconds = time.perf_counter() - start
    # Not a daemon: the interpreter joins it before finalizing. A daemon thread still running at exit
    # (a batch rerun with nothing to make exits right after load) can be stopped inside a torch
    # destructor run by its garbage collection, and the process aborts ("terminate called without an
    # active exception", seen once in CI); waiting costs at most one read of the weights.
    threading.Thread(target=self.model_hash, name="model-hash").start()
    log.info(
        "loaded %s in %.2f s on %s (%s, attention %s)",
        source,
        self.load_seconds,
        dm.device,
        dm.dtype_name,
        dm.attention,
    )
    return self


def to_tpu(self: Any) -> None:
    """The TPU route (pipelines.run.xla_route, imported here only: it needs JAX): the set-up pipeline moved to
    JAX and compiled, or ModelLoadError with what the route cannot run. Step caches cannot be added there
    (xla_route says why): the model's abilities say so, and the UI hides them; LoRAs are patched into the
    compiled UNet's weights per request (xla_route.PatchedLoras)."""
    from pipelines.run import xla_route

    why = xla_route.load_refusal(self.pipe, self.dm, self.base_loras, self.memory_savers)
    if why:
        raise ModelLoadError(f"cannot load {self.source} on tpu: {why}")
    if self.recipe is not None and any(lora.fuse for lora in self.recipe.loras):
        self.pipe.unload_lora_weights()  # the fused weights stay; peft's emptied wrappers would break the compile
    self.xla = xla_route.install(self.pipe, self.dm)
    self.pipe.scheduler = self.xla.scheduler(self.pipe.scheduler)  # its timesteps on the CPU (xla_route says why)
    self.loras = xla_route.PatchedLoras(self.xla, self.dm, self.loras.lora_dir)  # LoRAs patched into the weights
    self.twins.shared = {"unet": self.pipe.unet, "vae": self.pipe.vae}
    self.traits = dataclasses.replace(self.traits, step_cache=False)
    self.default_step_cache = None


def xla_warm_up(self: Any) -> None:
    """Pay XLA's compile at load instead of in a user's first request: one image at the default size, 2
    steps (a request of another batch size or size compiles its own programs once, on first use)."""
    began = time.perf_counter()
    self.compile = self.xla.describe()
    for request in _warm_up_requests(self, 2)[:1]:
        self.generate(request)
    self.compile_seconds = time.perf_counter() - began
    self.compile += f" (warm-up {self.compile_seconds:.1f} s)"
    log.info("XLA warm-up done in %.1f s", self.compile_seconds)


def runtime_plan(self: Any) -> runtimes.RuntimePlan:
    """RUNTIME's plan for this device (devices.runtime), then what this model allows: OpenVINO converts
    plain float32 torch modules (quantized weights are torchao/GGUF tensor types it cannot trace; it
    picks its own precision per device). Asked for (RUNTIME=openvino) and not possible: ModelLoadError."""
    opts = self.options
    plan = runtimes.plan(
        self.dm.backend, opts.runtime, opts.openvino_device, shapes=opts.openvino_shapes, weights=opts.openvino_weights
    )
    why = _openvino_refusal(self) if plan.openvino else None
    if why:
        plan = runtimes.RuntimePlan("torch", why, error=f"RUNTIME=openvino: {why}")
    if plan.error and opts.runtime == "openvino":
        raise ModelLoadError(f"cannot load {self.source} as asked: {plan.error}")
    return plan


def _openvino_refusal(self: Any) -> str | None:
    """Why this loaded model keeps torch although the device could have OpenVINO, or None."""
    quantized, dtype = quantization.applied(self.pipe), self.dm.dtype_name
    if self.clips is not None:
        return "video models stay torch: their 3-D VAEs and transformers are not converted (pipelines.weights.openvino)"
    if quantized:
        return f"quantized weights ({quantized}) stay torch"
    if dtype != "float32":
        return f"OpenVINO takes float32 weights and picks its precision per device (TORCH_DTYPE gave {dtype})"
    return None


def setup_runtime(self: Any) -> None:
    """The runtime (devices.runtime): with OpenVINO, a hook on each network (pipelines.weights.openvino); the
    graphs are converted by the warm-up in `compile_and_warm_up`, or read from OPENVINO_CACHE."""
    plan = runtime_plan(self)
    log.info("runtime %s", plan.describe())
    self.runtime_plan = plan
    if not plan.openvino:
        return
    from pipelines.weights.openvino import OpenVinoRuntime

    try:
        self.runtime = OpenVinoRuntime(plan, self.options.openvino_cache)
    except ValueError as exc:  # OPENVINO_DEVICE names a device OpenVINO does not see
        raise ModelLoadError(f"cannot load {self.source}: {exc}") from None
    self.runtime.install(self.pipe)
    self.runtime.on_activity = _activity_shower(self)
    if self.default_step_cache is not None:
        log.warning("%s: step caches hook torch blocks OpenVINO does not run; no default step cache", self.model_name)
        self.default_step_cache = None


def _activity_shower(self: Any) -> Any:
    """The replica's activity line shows a conversion while it runs, then what it showed before; inside a
    request, the request's progress shows it too (callbacks.RequestProgress.note)."""
    before = ["idle"]

    def show(text: str) -> None:
        if self.request_progress is not None:
            self.request_progress.note(text)
        elif text:
            before[0], self.activity = self.activity, text
        else:
            self.activity = before[0]

    return show


def compile_plan(self: Any) -> graph_compile.CompilePlan:
    """COMPILE's plan for this device (devices.compile), off where the weights are offloaded: offload
    hooks move weights in and out on every call, which graph capture would either break on or freeze;
    off under OpenVINO, which compiles the networks itself."""
    if self.runtime is not None:
        return graph_compile.CompilePlan(False, None, "the OpenVINO runtime compiles the networks instead")
    plan = graph_compile.plan(self.dm.backend, self.options.compile)
    if plan.enabled and self.weights != "on device":
        return graph_compile.CompilePlan(
            False, None, f"weights use {self.weights}; offload hooks and compile are not combined"
        )
    return plan


def compile_and_warm_up(self: Any, steps: int = 2) -> None:
    """Compile the denoiser where the plan says so, then pay the compile now instead of in a user's
    first request: warm-up requests at the default size with 1 and 2 images, `steps` steps each.
    Two, because torch specializes a dimension of size 1: a denoiser that sees batch 1 (Flux has no
    CFG doubling) recompiles at batch 2 (measured: 8.5 s on the tiny Flux on CPU); new image sizes
    did not recompile (dynamic shapes). Progress is logged and shown as the replica's activity;
    `self.compile` keeps what happened for the status panel. A compile that fails falls back to
    eager with a warning: compile is on by default on GPUs, and a graph break in one family must
    not stop the app from starting."""
    plan = compile_plan(self)
    self.compile = plan.describe()
    self.compile_seconds = 0.0
    if not plan.enabled:
        log.info("%s", self.compile)
        if self.runtime is not None:
            convert_at_load(self, steps)
        return
    began = time.perf_counter()
    try:
        self.compile = "compiled: " + graph_compile.compile_denoiser(self.pipe, plan)
        for request in _warm_up_requests(self, steps):

            def progress(step: int, total: int, _image: int, images: int = request.num_images) -> None:
                log.info(
                    "compile warm-up (%d image(s)): step %d/%d, %.1f s",
                    images,
                    step,
                    total,
                    time.perf_counter() - began,
                )

            self.generate(request, progress=progress)
    except Exception as exc:
        graph_compile.undo_compile(self.pipe)
        self.compile = f"compile failed, running eager: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        log.warning("%s", self.compile, exc_info=True)
        return
    self.compile_seconds = time.perf_counter() - began
    self.compile += f" (warm-up {self.compile_seconds:.1f} s)"
    log.info("compile warm-up done in %.1f s", self.compile_seconds)


def convert_at_load(self: Any, steps: int) -> None:
    """Pay OpenVINO's conversions (or its disk-cache reads) at load instead of in a user's first request:
    one warm-up request converts the text encoder, denoiser and VAE decoder (the VAE encoder converts on
    the first image-to-image request). Progress is logged and shown as the replica's activity."""
    began = time.perf_counter()
    for request in _warm_up_requests(self, steps)[:1]:
        self.generate(request)
    log.info("OpenVINO ready in %.1f s: %s", time.perf_counter() - began, self.runtime.describe())


def _warm_up_requests(self: Any, steps: int) -> list[GenerationRequest]:
    """Requests with 1 and 2 images the model can run: text-to-image, or an edit of a blank image for
    edit-only models; none for inpaint-only models (the first user request compiles there)."""
    from PIL import Image

    traits = self.traits
    if self.clips is not None:
        log.info("warm-up skipped: a video model's clip at its default size is a request of its own; the first request compiles")
        return []
    if traits.inpaint_native or not (traits.text_to_image or traits.edit or traits.image_to_image):
        log.info("compile warm-up skipped: %s needs a mask; the first request compiles", traits.class_name)
        return []
    # not one flat colour: a flat image makes the VAE's group norms divide by a near-zero variance, and
    # a graph checked on it (pipelines.weights.openvino) would be checked on rounding noise
    image = None if traits.text_to_image else [Image.linear_gradient("L").resize(self.default_size).convert("RGB")]
    return [
        GenerationRequest(
            prompt="a red circle on a blue background", num_images=n, steps=steps, seed=0, init_images=image
        )
        for n in sorted({1, min(2, self.options.max_batch)})
    ]


def apply_recipe(self: Any, recipe: Recipe) -> None:
    """Name, task, defaults (size, sampler, image guidance), LoRAs (fused, or always active) of
    `recipe` onto the ImagePipeline `self`."""
    self.recipe = recipe
    self.model_name = recipe.name
    self.vocabulary = {**self.vocabulary, **recipe.ui_vocabulary()}
    d = recipe.defaults
    self.traits = dataclasses.replace(self.traits, **_trait_changes(self.traits, recipe))
    if self.clips is not None:  # a video recipe's frames and fps (pipelines.video.family)
        self.clips = self.twins.clips = video.abilities(self.pipe, self.vocabulary)
    if "image_guidance" in d:
        self.default_image_guidance = float(d["image_guidance"])
    if "guidance_end" in d:
        self.default_guidance_end = float(d["guidance_end"])
        if not planning.stops_guidance(self, self.pipe):
            log.warning(
                "%s: %s cannot stop guidance early; guidance_end is ignored", recipe.name, type(self.pipe).__name__
            )
    if "sampler" in d:
        self.pipe.scheduler = samplers.build(self.pipe.scheduler, d["sampler"])
    if "step_cache" in d and self.options.step_cache is None:  # STEP_CACHE, when set, wins (as TORCH_DTYPE)
        self.default_step_cache = default_step_cache(self, d["step_cache"], d.get("step_cache_threshold"))
    for lora in recipe.loras:
        name = self.loras.load(recipe.resolve(lora.path), allow_outside=True)
        if lora.fuse:  # merged into the weights: no per-step LoRA cost, cannot be switched off
            self.pipe.fuse_lora(adapter_names=[name], lora_scale=lora.scale)
            self.loras.unload(name)
        else:
            self.base_loras[name] = lora.scale
    log.info("recipe %s applied (task %s, defaults %s, LoRAs %d)", recipe.name, recipe.task, d, len(recipe.loras))


def default_step_cache(self: Any, method: str | None, threshold: float | None) -> StepCache | None:
    """The step cache of requests that name none (STEP_CACHE or a recipe's): none where the model has
    no cache, with a warning, so that a server-wide STEP_CACHE does not refuse every request there."""
    cache = StepCache.of(method, threshold)
    if cache is not None and not self.traits.step_cache:
        name, cls = self.model_name, self.traits.class_name
        log.warning("%s (%s) has no step cache; %s is not used by default", name, cls, cache.label)
        return None
    return cache


def _trait_changes(traits: Any, recipe: Recipe) -> dict[str, Any]:
    """What a recipe's task and default size change in the pipeline's traits."""
    d = recipe.defaults
    changes: dict[str, Any] = {}
    if recipe.task == "edit":
        changes["text_to_image"] = False
    elif recipe.task == "text-to-image":
        changes.update(edit=False, image_to_image="")
    elif recipe.task == "inpaint":
        changes.update(text_to_image=False, edit=False, image_to_image="")
    if recipe.inpaint_pipeline:
        changes["inpaint"] = recipe.inpaint_pipeline
    if "width" in d or "height" in d:
        w, h = traits.default_size
        changes["default_size"] = (d.get("width", w), d.get("height", h))
    return changes


def describe(self: Any) -> ModelInfo:
    """`ImagePipeline.model_info`: the loaded model's defaults and limits, as the UI and the API
    enforce them (the vocabulary's and recipe's defaults over diffusers' signature defaults)."""
    vocab, traits = self.vocabulary, self.traits
    w, h = self.default_size
    stops_guidance = planning.stops_guidance(self, self.pipe)
    return ModelInfo(
        model_name=self.model_name,
        default_width=w,
        default_height=h,
        size_multiple=self.size_multiple,
        max_side=self.max_side,
        max_pixels=self.max_pixels,
        trained_sides=self.trained_sides,
        max_batch=self.options.max_batch,
        default_steps=self.default_steps,
        default_guidance=self.default_guidance,
        scheduler=self.scheduler_name,
        samplers=tuple(s.name for s in samplers.offered(self.own_scheduler)),
        min_steps=samplers.minima(self.own_scheduler),
        loras=tuple(sorted(self.loras.available())),
        embeddings={n: {"vectors": e.vectors, "shape": e.width} for n, e in self.embeddings.loaded.items()},
        embeddings_skipped=dict(self.embeddings.skipped),
        styles={n: {"prompt": s.prompt, "negative_prompt": s.negative_prompt} for n, s in self.styles.items()},
        vocabulary=dict(vocab),
        examples=tuple(vocab.get("examples") or ()),
        pipeline_class=traits.class_name,
        text_to_image=traits.text_to_image,
        edit=traits.edit,
        image_to_image=bool(traits.image_to_image),
        inpaint=bool(traits.inpaint),
        guidance_label=traits.guidance_label,
        lora_supported=traits.lora,
        image_guidance=traits.image_guidance,
        default_image_guidance=self.default_image_guidance,
        guidance_end=stops_guidance,
        default_guidance_end=self.default_guidance_end if stops_guidance else 1.0,  # what a request gets
        notes=str(vocab.get("notes", "")),
        attention=dict(self.attention_applied),
        step_cache=traits.step_cache,
        default_step_cache=self.default_step_cache.method if self.default_step_cache else "none",
        default_step_cache_threshold=self.default_step_cache.threshold if self.default_step_cache else None,
        quantization=quantization.applied(self.pipe),
        component_bytes=dict(self.component_bytes),
        upscalers=tuple(self.upscalers.names(latent=traits.class_name in hires.LATENT_FAMILIES)),
        controlnets=tuple(self.controlnets.names()),
        annotators=tuple(self.annotators.names()),
        detectors=self.detectors.names(),
        wildcards=self.wildcards.names(),
        controlnet_tasks=control.tasks(traits.class_name),
        ip_adapters=tuple(self.ip_adapters.names()) if traits.class_name in ip_adapter.FAMILIES else (),
        clips=self.clips,
    )
