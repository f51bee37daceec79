"""The pipeline layer's face: everything the layers above it (serving, engine, the front ends, the
CLIs) use from `pipelines`, by name. They import this package and `pipelines.schema`, nothing
deeper (an import-linter contract in pyproject.toml holds them to it).

The rooms behind it, from the bottom up (each room's docstring says what it owns; a second contract
keeps a room from importing one above it or a sibling beside it):

| room | owns |
|---|---|
| `schema` | the request schema, torch-free: fields, the request and its parts, errors, the CLI flags, the docs |
| `sampling` | samplers, guidance end, step caches, tiled VAE, live previews |
| `control` · `imaging` · `weights` | ControlNet, preprocessors, IP-Adapters · hires fix, inpaint, upscalers, grids · loading, recipes, catalog, LoRA, hashes, quantization, OpenVINO, the tiny VAE |
| `video` | video models' abilities (frames, fps, image-to-video), the frame-packed VAE, clip files written and read |
| `prompts` · `pnginfo` | A1111's prompt language, tokens, styles, embeddings · PNG metadata written and read |
| `run` | `ImagePipeline` and what it composes: set-up, traits, the diffusers call, steps, the backend contract |

`python -m pipelines` and `python -m pipelines.batch` are the layer's own command lines.

A name loads its room when first used (PEP 562's module `__getattr__`), so `import pipelines` and
`import pipelines.schema` load neither torch nor diffusers; `from pipelines import ImagePipeline` does.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> (module, its name there). The one list of what the layer offers the layers above it.
_FACE: dict[str, tuple[str, str]] = {
    # the schema (also importable from pipelines.schema)
    **{n: ("pipelines.schema.request", n) for n in ("GenerationRequest", "GenerationResult")},
    **{
        n: ("pipelines.schema.errors", n)
        for n in ("PipelineError", "ModelLoadError", "LoraError", "OutOfMemoryError", "UnsupportedTaskError")
    },
    # run: the pipeline, its settings, the backend contract every backend keeps
    "ImagePipeline": ("pipelines.run.image_pipeline", "ImagePipeline"),
    **{n: ("pipelines.run.options", n) for n in ("PipelineOptions", "DEFAULT_MODEL", "DEFAULT_LORA_DIR")},
    **{
        n: ("pipelines.run.backend", n)
        for n in ("GenerationBackend", "ModelInfo", "Capabilities", "ReplicaStatus", "CancelFn", "PreviewFn", "ProgressFn", "report_progress")
    },
    # PNG metadata
    **{n: ("pipelines.pnginfo.write", n) for n in ("save_images", "save_pngs", "save_png", "png_info", "a1111_parameters", "TEMP_SUFFIX", "save_clip", "save_clips")},
    **{n: ("pipelines.pnginfo.read", n) for n in ("read_metadata", "read_png_info", "parse_a1111")},
    "read_png_text": ("pipelines.pnginfo.files", "read_text"),
    "METADATA_KEY": ("pipelines.pnginfo.read", "JSON_KEY"),  # our JSON's key in a PNG's text chunks and a clip's tags
    # video: clips written and read (pipelines.video.files)
    **{n: ("pipelines.video.files", n) for n in ("write_video", "read_video", "read_frames", "is_video", "VideoInfo")},
    "VIDEO_FORMATS": ("pipelines.video.files", "FORMATS"),
    # control
    "Annotators": ("pipelines.control.annotators", "Annotators"),
    "detect": ("pipelines.control.maps", "detect"),
    "control_setting": ("pipelines.control.controlnet", "setting"),
    "control_settings": ("pipelines.control.controlnet", "settings_of"),
    "is_ip_unit": ("pipelines.control.ip_adapter", "is_ip_unit"),
    "IP_ADAPTER_MODULE": ("pipelines.control.ip_adapter", "MODULE"),
    # imaging
    **{n: ("pipelines.imaging.upscalers", n) for n in ("Upscalers", "UpscalerError", "MAX_FACTOR", "extras_size")},
    "upscale_extras": ("pipelines.imaging.upscalers", "extras"),
    "NO_UPSCALER": ("pipelines.imaging.upscalers", "NONE"),
    "LATENT_UPSCALERS": ("pipelines.imaging.upscalers", "LATENT"),
    **{n: ("pipelines.imaging.grid", n) for n in ("Grid", "draw_grid", "join_grids")},
    **{
        n: ("pipelines.imaging.inpaint", n)
        for n in ("EMPTY_MASK_WARNING", "INPAINT_FAMILIES", "binary_mask", "extend_canvas")
    },
    "inpaint_render_size": ("pipelines.imaging.inpaint", "render_size"),
    # prompts, sampling
    "token_summary": ("pipelines.prompts.tokens", "token_summary"),
    "Wildcards": ("pipelines.prompts.wildcards", "Wildcards"),
    "from_any": ("pipelines.sampling.samplers", "from_any"),
    "SAMPLERS_BY_NAME": ("pipelines.sampling.samplers", "BY_NAME"),
    "StepCache": ("pipelines.sampling.step_cache", "StepCache"),
    "step_cache_name": ("pipelines.sampling.step_cache", "canonical"),
    "STEP_CACHE_FAMILIES": ("pipelines.sampling.step_cache", "FAMILIES"),
    "NO_STEP_CACHE": ("pipelines.sampling.step_cache", "NONE"),
    # weights
    **{n: ("pipelines.weights.catalog", n) for n in ("ModelEntry", "list_models")},
    "find_model": ("pipelines.weights.catalog", "find"),
    "open_model": ("pipelines.run.model_setup", "open_with"),  # recipes.open_model as the app's loads run it
    "quantization_applied": ("pipelines.weights.quantization", "applied"),
    "quiet_load_progress_bars": ("pipelines.weights.loading", "quiet_load_progress_bars"),
}
__all__ = sorted(_FACE)


def __getattr__(name: str) -> Any:
    """`pipelines.NAME`: the face's name, its room imported on first use (PEP 562)."""
    if name not in _FACE:
        raise AttributeError(f"module 'pipelines' has no attribute {name!r}; its face offers: {', '.join(__all__)}")
    module, attr = _FACE[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
