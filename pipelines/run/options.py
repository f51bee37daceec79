"""Pipeline options: the pipeline layer's variables (MODEL_ID, LORA_DIR, MAX_BATCH, ... QUANTIZATION,
BASE_MODEL), declared once here as `PipelineOptions` (docs/settings.md lists them, generated from
it). An entry point reads them once (`PipelineOptions.from_env(os.environ)`) and passes the object
down; below that nothing reads the environment. `PipelineOptions()` is the defaults; arguments
override fields (`updated`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field

from config import Accepts, Lower, Refused, Section, setting
from devices.compile import COMPILE_MODES
from devices.manager import MEMORY_LEVELS
from devices.runtime import OPENVINO_DEVICES, RUNTIMES, SHAPES, STATIC_BELOW_BYTES, WEIGHTS, parse_openvino_device
from pipelines.schema.request import STEP_CACHES, spec

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = REPO_ROOT / "models" / "tiny-shapes"
DEFAULT_LORA_DIR = REPO_ROOT / "models" / "loras"
DEFAULT_UPSCALER_DIR = REPO_ROOT / "models" / "upscalers"
DEFAULT_CONTROLNET_DIR = REPO_ROOT / "models" / "controlnets"
DEFAULT_IPADAPTER_DIR = REPO_ROOT / "models" / "ip_adapters"
DEFAULT_ANNOTATOR_DIR = REPO_ROOT / "models" / "annotators"  # none shipped: the user's models go here
DEFAULT_DETECTOR_DIR = REPO_ROOT / "models" / "detectors"
DEFAULT_WILDCARD_DIR = REPO_ROOT / "models" / "wildcards"
DEFAULT_EMBEDDINGS_DIR = REPO_ROOT / "embeddings"  # where A1111 keeps them
DEFAULT_STYLES_FILE = REPO_ROOT / "styles.csv"  # where A1111 keeps it
DEFAULT_OPENVINO_CACHE = Path.home() / ".cache" / "diffusion-anywhere" / "openvino"
PATH_FIELDS = (
    "model_id", "lora_dir", "upscaler_dir", "controlnet_dir", "ipadapter_dir", "annotator_dir", "embeddings_dir",
    "styles_file", "detector_dir", "wildcard_dir",
    "base_model", "openvino_cache",
)  # fmt: skip  # files or folders here


HUB_ID = re.compile(r"[\w.-]+/[\w.-]+")


def _model_refs(value: Any) -> Any:
    """CONTROLNET_MODELS: comma-separated Hub ids and folders, each checked for its shape at start (a
    download waits for first use); a folder made absolute, so it means the same on a Ray replica."""
    if not isinstance(value, str):
        return value
    refs = []
    for ref in (part.strip() for part in value.split(",") if part.strip()):
        folder = Path(ref).expanduser()
        if folder.is_dir():
            refs.append(str(folder.resolve()))
        elif HUB_ID.fullmatch(ref):
            refs.append(ref)
        else:
            raise ValueError(f"{ref!r} is neither a folder nor a Hub id (owner/name)")
    return tuple(refs)


ModelRefs = Annotated[
    tuple[str, ...],
    BeforeValidator(_model_refs),
    Accepts("comma-separated Hub ids (owner/name) and folders", invalid=("not an id", "owner/")),
]


def _tiny_vae(value: Any) -> Any:
    """TINY_VAE: "", auto, or one Hub id or folder (made absolute, as CONTROLNET_MODELS' are)."""
    if not isinstance(value, str) or value.strip().lower() in ("", "auto"):
        return value.strip().lower() if isinstance(value, str) else value
    (ref,) = _model_refs(value.strip())
    return ref


TinyVaeRef = Annotated[
    str, BeforeValidator(_tiny_vae), Accepts("auto, a Hub id (owner/name) or a folder", invalid=("not an id",))
]


def _step_cache(value: Any) -> Any:
    """STEP_CACHE in any capitalisation ("firstblockcache" -> "FirstBlockCache")."""
    from pipelines.sampling.step_cache import canonical

    return (canonical(value) or value.strip()) if isinstance(value, str) else value


def _quantization(value: Any) -> Any:
    """Checked at start (pipelines.weights.quantization), not when the model loads minutes later."""
    if isinstance(value, str) and value.strip():
        from pipelines.weights.quantization import parse_setting

        try:
            parse_setting(value.strip())
        except ValueError as exc:
            raise Refused(str(exc).partition(": ")[2] or str(exc)) from None  # without "QUANTIZATION=...: "
    return value.strip() if isinstance(value, str) else value


def _threshold_bounds() -> dict[str, float]:
    """STEP_CACHE_THRESHOLD's range is the request field's one range (pipelines.schema.request's schema)."""
    bound = spec("step_cache_threshold").value
    return {"gt" if bound.low_open else "ge": bound.low, "le": bound.high}


def _openvino_device(value: Any) -> Any:
    """OPENVINO_DEVICE in any capitalisation ("gpu.1" -> "GPU.1")."""
    return parse_openvino_device(value) if isinstance(value, str) else value


OpenVinoDevice = Annotated[
    str, BeforeValidator(_openvino_device),
    Accepts(OPENVINO_DEVICES, invalid=("gpu:0", "tpu")),
]
StepCache = Annotated[Literal[STEP_CACHES] | None, BeforeValidator(_step_cache)]
Quantization = Annotated[
    str,
    BeforeValidator(_quantization),
    Accepts("component=method[:file], comma-separated (e.g. transformer=torchao-int8wo)", invalid=("int8", "vae=x")),
]


class PipelineOptions(Section, title="Pipeline"):
    """How pipelines are loaded and what one request may ask of them."""

    model_id: str = setting(
        "MODEL_ID", str(DEFAULT_MODEL),
        "diffusers folder, Hub id, .safetensors or .gguf file, or a recipe name/path (docs/models.md)",
        shown="`models/tiny-shapes`",
    )  # fmt: skip
    lora_dir: Path = setting(
        "LORA_DIR", DEFAULT_LORA_DIR, "folder of .safetensors LoRAs offered in the UI (others are refused)",
        shown="`models/loras`",
    )  # fmt: skip
    upscaler_dir: Path = setting(
        "UPSCALER_DIR", DEFAULT_UPSCALER_DIR,
        "folder of upscaler models (ESRGAN, Real-ESRGAN, SwinIR, HAT, DAT, Compact ...; .safetensors/.pth, loaded "
        "by spandrel) for hires fix and the Upscale tab, beside the embedded ones (docs/upscaling.md)",
        shown="`models/upscalers`",
    )  # fmt: skip
    controlnet_dir: Path = setting(
        "CONTROLNET_DIR", DEFAULT_CONTROLNET_DIR,
        "folder of ControlNets for ControlNet units: diffusers folders (config.json + weights) or A1111-style single "
        "SD/SDXL files, beside the embedded ones (docs/controlnet.md)",
        shown="`models/controlnets`",
    )  # fmt: skip
    controlnet_models: ModelRefs = setting(
        "CONTROLNET_MODELS", (),
        "ControlNets, union ControlNets or T2I-Adapters by Hub id (owner/name, downloaded into the Hugging Face "
        "cache on first use) or folder, offered beside CONTROLNET_DIR's (docs/controlnet.md#models)",
        shown="none",
    )  # fmt: skip
    ipadapter_dir: Path = setting(
        "IPADAPTER_DIR", DEFAULT_IPADAPTER_DIR,
        "folder of IP-Adapters for image prompts: one folder each, its weights (ip_adapter.safetensors) beside an "
        "image_encoder/ folder, beside the embedded ones (docs/controlnet.md)",
        shown="`models/ip_adapters`",
    )  # fmt: skip
    annotator_dir: Path = setting(
        "ANNOTATOR_DIR", DEFAULT_ANNOTATOR_DIR,
        "folder of annotator models for the model-based ControlNet preprocessors: depth/ (a transformers "
        "depth-estimation model: DPT/MiDaS, Depth Anything) for depth and normal, seg/ (a transformers semantic "
        "segmentation model, ADE20K) for seg, pose/ (VitPose) and optionally person/ (an object detector) for "
        "openpose; nothing is downloaded (docs/controlnet.md#model-based-preprocessors)",
        shown="`models/annotators`",
    )  # fmt: skip
    detector_dir: Path = setting(
        "DETECTOR_DIR", DEFAULT_DETECTOR_DIR,
        "folder of the detailer's detectors: transformers object-detection or semantic/instance-segmentation "
        "model folders (config.json + weights + preprocessor); the embedded shapes-segformer lives here; "
        "nothing is downloaded (docs/regions-detailer-wildcards.md)",
        shown="`models/detectors`",
    )  # fmt: skip
    wildcard_dir: Path = setting(
        "WILDCARD_DIR", DEFAULT_WILDCARD_DIR,
        "folder of wildcard files: `__name__` in a prompt is a random line of NAME.txt (sub-folders: "
        "`__folder/name__`; .yaml/.json collections too), Dynamic Prompts' format (docs/regions-detailer-wildcards.md)",
        shown="`models/wildcards`",
    )  # fmt: skip
    tiled_vae_pixels: int | None = setting(
        "TILED_VAE_PIXELS", None,
        "decode and encode images larger than this (width x height) in tiles, so the VAE's memory peak stays "
        "bounded (docs/upscaling.md#tiled-vae)", shown="4 x the model's native area", ge=1,
    )  # fmt: skip
    embeddings_dir: Path = setting(
        "EMBEDDINGS_DIR", DEFAULT_EMBEDDINGS_DIR,
        "folder of textual-inversion embeddings (.safetensors, .pt, .bin), used in prompts by file name",
        shown="`embeddings`",
    )  # fmt: skip
    styles_file: Path = setting(
        "STYLES_FILE", DEFAULT_STYLES_FILE, "A1111's styles.csv (name, prompt, negative_prompt): the styles offered",
        shown="`styles.csv`",
    )  # fmt: skip
    max_batch: int = setting("MAX_BATCH", 16, "most images per request", ge=1)
    max_pixels: int | None = setting(
        "MAX_PIXELS", None, "most pixels per image, width x height",
        shown="the model's native area (its card's largest trained square) x 4 on CPU/MPS, x 9 on CUDA/ROCm/NPU/XPU", ge=1,
    )  # fmt: skip
    max_side: int | None = setting(
        "MAX_SIDE", None, "largest width or height", shown="4 x the model's native side", ge=1
    )
    micro_batch: int = setting(
        "MICRO_BATCH", 8, "most images denoised together (halves itself after out-of-memory)", ge=1
    )
    preview_every: int = setting(
        "PREVIEW_EVERY", 5, "steps between live previews (measured: docs/performance.md#live-previews)", ge=1
    )
    memory_mode: Annotated[Literal[MEMORY_LEVELS], Lower] = setting(
        "MEMORY_MODE", "auto",
        "memory savers: balanced = VAE slicing/tiling (attention slicing only with vanilla attention); max = "
        "+ model CPU offload; group / group-leaf = + group offload by block / leaf module, accelerators only "
        "(docs/compile-and-offload.md)",
    )  # fmt: skip
    compile: Annotated[Literal[COMPILE_MODES], Lower] = setting(
        "COMPILE", "auto",
        "graph compile of the denoiser at load, with a warm-up; auto = per device (inductor on CUDA/ROCm/XPU, "
        "torchair on Ascend when installed, off on CPU/MPS; off on ZeroGPU) (docs/compile-and-offload.md)",
    )  # fmt: skip
    tiny_vae: TinyVaeRef = setting(
        "TINY_VAE", "",
        "a tiny autoencoder (TAESD, diffusers' AutoencoderTiny) decodes and encodes in place of the model's VAE: "
        "an order of magnitude faster on a CPU, detail a little softer; auto = the one made for the model's family "
        "(SD 1.x/2.x, SDXL, SD3, Flux: madebyollin's) where it fits, else a Hub id or folder "
        "(docs/performance.md#a-tiny-vae-tiny_vae)",
        shown="none (the model's own VAE)",
    )  # fmt: skip
    runtime: Annotated[Literal[RUNTIMES], Lower] = setting(
        "RUNTIME", "auto",
        "what runs the networks: torch, or openvino (the denoiser, VAE and text encoders as OpenVINO graphs, "
        "converted at first load and cached on disk); auto = openvino on the CPU when requirements-openvino.txt "
        "is installed, torch elsewhere (docs/performance.md#openvino)",
    )  # fmt: skip
    openvino_device: OpenVinoDevice = setting(
        "OPENVINO_DEVICE", "CPU",
        "with the OpenVINO runtime: CPU, an Intel GPU (GPU, GPU.1) or NPU (static shapes: one graph per batch "
        "and size), or AUTO; `python -m devices` lists what OpenVINO sees",
    )  # fmt: skip
    openvino_shapes: Annotated[Literal[SHAPES], Lower] = setting(
        "OPENVINO_SHAPES", "auto",
        "with the OpenVINO runtime: dynamic (one compiled graph for every batch and size) or static (one per "
        "batch and size, compiled on first use: faster per step, memory per shape); auto = static on the NPU, "
        f"which needs it, and elsewhere static for a network of up to {STATIC_BELOW_BYTES // 2**20} MiB of weights "
        "(1.5x faster a call on the embedded UNet), dynamic above (little faster, a copy of the weights a shape)",
    )  # fmt: skip
    openvino_weights: Annotated[Literal[WEIGHTS], Lower] = setting(
        "OPENVINO_WEIGHTS", "fp32",
        "with the OpenVINO runtime: the graphs' weights as converted (fp32), or compressed by NNCF to int8 "
        "(~0.25x the memory) or int4 (~0.15x), decompressed on the fly (memory, not time); or w8a8: the "
        "denoiser's weights and activations in int8, calibrated on the first request, for CPUs with int8 "
        "instructions (VNNI/AMX: faster; images a little apart from fp32's); each kept in the graph cache. "
        "fp32 by default (docs/performance.md#int8-weights)",
    )  # fmt: skip
    openvino_cache: Path = setting(
        "OPENVINO_CACHE", DEFAULT_OPENVINO_CACHE,
        "where converted OpenVINO graphs are kept, so a restart reads them instead of converting",
        shown="`~/.cache/diffusion-anywhere/openvino`",
    )  # fmt: skip
    step_cache: StepCache = setting(
        "STEP_CACHE", None,
        "the step cache of requests that name none (any capitalisation); off, with a log warning, on models "
        "without one (docs/step-caching.md)",
        shown="none (or the recipe's)",
    )  # fmt: skip
    step_cache_threshold: float | None = setting(
        "STEP_CACHE_THRESHOLD", None, "the threshold of FirstBlockCache and MagCache",
        shown="the method's (0.05 / 0.06)", **_threshold_bounds(),
    )  # fmt: skip
    quantization: Quantization = setting(
        "QUANTIZATION", "",
        "quantized components of every model the app loads (switches and EDIT_MODEL_ID too: per-model "
        "quantization belongs in a recipe; docs/quantization.md)",
    )  # fmt: skip
    base_model: str = setting(
        "BASE_MODEL",
        "",
        "with MODEL_ID=<file>.gguf: the diffusers folder or Hub id that gives the rest of the pipeline",
    )
    extra: dict = Field(default_factory=dict, description="passed to diffusers' from_pretrained (not a variable)")

    def updated(self, **overrides: Any) -> PipelineOptions:
        """These options with fields replaced by the non-None `overrides` (checked as a variable's
        value is); unknown keywords are diffusers' `from_pretrained` arguments and go to `extra`."""
        known = set(type(self).model_fields)
        extra = {k: v for k, v in overrides.items() if k not in known}
        chosen = {k: v for k, v in overrides.items() if k in known and v is not None}
        if not chosen and not extra:
            return self
        return type(self)(**{**dict(self), **chosen, "extra": {**self.extra, **extra}})

    def with_absolute_paths(self) -> PipelineOptions:
        """The options for another process (a Ray replica): the paths that exist here made absolute,
        since that process does not share our working directory."""
        paths = {k: _absolute(str(getattr(self, k))) for k in PATH_FIELDS}
        if self.quantization:  # a gguf file named in QUANTIZATION
            from pipelines.weights.quantization import parse_setting

            parts = [(r.component, r.method, _absolute(r.file)) for r in parse_setting(self.quantization)]
            paths["quantization"] = ",".join(f"{c}={m}:{f}" if f else f"{c}={m}" for c, m, f in parts)
        return self.updated(**paths)


def _absolute(file: str) -> str:
    """A file of this machine as an absolute path; a URL or a missing file as it is."""
    return str(Path(file).resolve()) if file and Path(file).exists() else file
