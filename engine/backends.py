"""Building the backend the app serves, from its settings: the one place that decides what runs.

`build_backend(settings)` is what `python app.py`, the Space, the CLI and the tests call, so they
all serve the same thing:
- GENERATION_BACKEND=local (default): a `DevicePool`, one replica per device of PREFERRED_DEVICE (with
  PARALLEL, one replica per group of devices that splits each image: serving.parallel);
- GENERATION_BACKEND=ray: a `RayBackend` on Ray Serve;
and, where an instruction editor serves the Edit tab (EDIT_MODEL_ID, or the embedded editor beside
the embedded model), an `EditRouter` with the editor beside the main backend; where a video model serves
the Video tab (VIDEO_MODEL_ID, or the embedded video model beside the embedded model), a `VideoRouter`; on ZeroGPU
(SPACES_ZERO_GPU=true) all of it wrapped in a `ZeroGPUBackend` (engine.zerogpu), which runs each
generation in a `spaces.GPU` worker.
"""

from __future__ import annotations

import logging

from devices import DeviceManager
from pipelines import Annotators, GenerationBackend, PipelineOptions, Upscalers, Wildcards
from serving.editing import EditRouter, default_editor
from serving.parallel import parallel_pool, process_pool
from serving.pool import DevicePool
from serving.video import VideoRouter, default_video

from .jobs import Admission, Engine, Switching
from .settings import AppSettings

log = logging.getLogger(__name__)


def _video_options(options: PipelineOptions) -> PipelineOptions:
    """The video model's options. RUNTIME=openvino is for the image models: a video model stays torch (its 3-D VAE
    and transformer are not converted), so it loads under auto, which keeps torch and says why, instead of
    refusing the whole app. TINY_VAE is for the image models too (a video model's VAE is 3-D): it keeps its own."""
    options = options.updated(tiny_vae="")
    return options.updated(runtime="auto") if options.runtime == "openvino" else options


def build_backend(settings: AppSettings, model: str | None = None, devices: str | None = None) -> GenerationBackend:
    """The backend for `settings` (`model` / `devices` override MODEL_ID / PREFERRED_DEVICE, as the
    command line's --model / --device do)."""
    model = model or settings.pipeline.model_id
    if settings.generation_backend == "ray":
        return _ray(settings, model)
    backend: GenerationBackend = _main_pool(settings, model, devices)
    editor = default_editor(model, settings.edit_model_id)
    if editor is not None:
        edits = DevicePool.from_pretrained(editor, devices, settings.pipeline, settings.devices)
        backend = EditRouter(backend, edits, automatic=not settings.edit_model_id)
    video = default_video(model, settings.video_model_id)
    if video is not None:
        backend = VideoRouter(backend, DevicePool.from_pretrained(video, devices, _video_options(settings.pipeline), settings.devices))
    if settings.zero_gpu:
        from .zerogpu import ZeroGPUBackend  # imports `spaces`, only on ZeroGPU

        backend = ZeroGPUBackend(backend, settings.zero_gpu_duration)
    return backend


def _main_pool(settings: AppSettings, model: str, devices: str | None) -> GenerationBackend:
    """The main model's pool: a replica per device (REPLICA_PROCESSES: each in a process of its own), or with
    PARALLEL a replica per group of devices (the editor and video models beside it keep a replica per device,
    in the app's process)."""
    if settings.devices.parallel is not None:
        return parallel_pool(model, settings.pipeline, settings.devices, devices)
    if settings.devices.replica_processes:
        return process_pool(model, settings.pipeline, settings.devices, devices)
    return DevicePool.from_pretrained(model, devices, settings.pipeline, settings.devices)


def _ray(settings: AppSettings, model: str) -> GenerationBackend:
    """The Ray backend with every pipeline option (the whole PipelineOptions goes to the replicas, see
    serving.ray_backend) and the devices' dtype and attention; what Ray cannot honour was refused by
    the settings (engine.settings: the local pool's device variables, EDIT_MODEL_ID)."""
    from serving.ray_backend import RayBackend, device_options  # Ray is optional (requirements-ray.txt)

    return RayBackend.start(
        model=model,
        address=settings.ray_address,
        replicas=settings.ray_replicas,
        device=settings.ray_device,
        cpus_per_replica=settings.ray_cpus_per_replica,
        device_options=device_options(settings.devices),
        options=settings.pipeline,
    )


def build_engine(settings: AppSettings, backend: GenerationBackend | None = None, **overrides: str | None) -> Engine:
    """The engine the app runs: `backend` (default: `build_backend(settings, **overrides)`) with the
    settings' admission limits and model-switching policy."""
    backend = backend or build_backend(settings, **overrides)
    admission = Admission(settings.queue_size, settings.queue_per_user, settings.effective_time_budget)
    switching = Switching(settings.model_switch_allowed, settings.models_dir)
    dm = standalone_device(settings, backend)
    upscalers = Upscalers([settings.pipeline.upscaler_dir], dm)
    annotators = Annotators(settings.pipeline.annotator_dir, dm)
    return Engine(backend, admission, switching, upscalers, annotators, Wildcards(settings.pipeline.wildcard_dir))


def standalone_device(settings: AppSettings, backend: GenerationBackend) -> DeviceManager:
    """Where the engine's own model passes run (the Upscale tab's upscalers, map previews' annotators):
    the first replica's device; the CPU where the generations run elsewhere (Ray replicas, ZeroGPU's
    workers: the main process has no GPU of its own; a TPU, whose route compiles the model's own networks only)."""
    remote = settings.generation_backend == "ray" or settings.zero_gpu
    device = "cpu" if remote or backend.status()[0].backend == "tpu" else backend.status()[0].device
    return DeviceManager(options=settings.devices.options_for(device))
