"""Model recipes: how to load a model that a bare `from_pretrained` cannot, in one small JSON file.

HiDream-E1 needs a pipeline file from its own repository (`custom_pipeline`), a Llama tokenizer
and text encoder from another repository (extra components), its own defaults (28 steps,
guidance 5, image guidance 4) and, for E1-Full, a LoRA. A recipe says all of that:

    {
      "name": "hidream-e1.1",
      "source": "HiDream-ai/HiDream-E1-1",            # folder, Hub id or .safetensors
      "custom_pipeline": "custom/pipeline_hidream_image_editing.py",   # runs code: see README
      "components": {"text_encoder_4": {"source": "meta-llama/Llama-3.1-8B-Instruct",
                                        "class": "transformers.LlamaForCausalLM",
                                        "kwargs": {"output_hidden_states": true}}},
      "dtype": "bfloat16",
      "loras": [{"path": "...safetensors", "scale": 1.0, "fuse": false}],
      "defaults": {"steps": 28, "guidance": 5.0, "image_guidance": 4.0},  # also "step_cache": "FirstBlockCache",
                                                                         # "step_cache_threshold": 0.08
      "task": "edit",                                  # text-to-image | edit | both | inpaint | video
      "inpaint_pipeline": "FluxKontextInpaintPipeline",  # optional: built with from_pipe for masks
      "notes": "shown in the UI",
      "quantization": {"transformer": {"method": "gguf", "file": "flux1-dev-Q4_K_S.gguf"},
                       "text_encoder_2": "torchao-int8wo"}   # see pipelines.weights.quantization
    }

Relative paths (custom pipeline, component sources, LoRAs) are relative to the recipe's folder.
`MODEL_ID` takes a recipe name (a file in `models/recipes/`) or a recipe path. Validation names
the bad field and runs before anything is downloaded or loaded.
"""

from __future__ import annotations

import importlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.sampling import step_cache
from pipelines.schema.errors import ModelLoadError
from pipelines.schema.request import spec as request_field
from pipelines.weights import quantization

log = logging.getLogger(__name__)

RECIPES_DIR = Path(__file__).resolve().parents[2] / "models" / "recipes"
TASKS = ("text-to-image", "edit", "both", "inpaint", "video")  # "inpaint": needs a mask (Flux Fill); "video": makes clips (Wan, LTX)
DTYPES = ("float32", "float16", "bfloat16")
# A recipe's defaults: its key -> the request field it is the model's default for, checked by that
# field's own rules (type and range: pipelines.schema.request).
DEFAULT_FIELDS = {
    "steps": "steps", "guidance": "guidance_scale", "image_guidance": "image_guidance_scale",
    "guidance_end": "guidance_end", "width": "width", "height": "height", "sampler": "sampler",
    "step_cache": "step_cache", "step_cache_threshold": "step_cache_threshold",
    "num_frames": "num_frames", "fps": "fps", "guidance_2": "guidance_scale_2",
}  # fmt: skip
_JSON_TYPES = {"whole": int, "number": float, "text": str, "choice": str}
TOP_KEYS = {
    "name", "description", "source", "pipeline_class", "custom_pipeline", "components", "dtype", "loras",
    "defaults", "task", "vocabulary", "notes", "$schema", "inpaint_pipeline", "quantization",
}  # fmt: skip


class RecipeError(ModelLoadError, ValueError):
    """A recipe that does not validate; the message names the file and the field."""


@dataclass(frozen=True)
class Component:
    """An extra pipeline component loaded from elsewhere (`name -> {source, class, kwargs}`)."""

    name: str
    source: str
    cls: str  # "transformers.LlamaForCausalLM", "diffusers.AutoencoderKL"...
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RecipeLora:
    path: str
    scale: float = 1.0
    fuse: bool = False  # fused into the weights at load (faster, not removable)


@dataclass(frozen=True)
class Recipe:
    name: str
    source: str
    path: Path | None = None  # the recipe file (relative paths are relative to its folder)
    description: str = ""
    pipeline_class: str | None = None
    custom_pipeline: str | None = None
    components: tuple[Component, ...] = ()
    dtype: str | None = None
    loras: tuple[RecipeLora, ...] = ()
    defaults: dict[str, Any] = field(default_factory=dict)
    task: str = "both"
    vocabulary: dict[str, Any] = field(default_factory=dict)
    notes: str = ""
    inpaint_pipeline: str | None = None  # a diffusers class built from the model with from_pipe for inpainting
    quantization: tuple[quantization.Request, ...] = ()  # per component (pipelines.weights.quantization)

    def resolve(self, value: str) -> str:
        """A path relative to the recipe's folder, or `value` unchanged (a Hub id)."""
        if self.path is None or Path(value).is_absolute():
            return value
        local = self.path.parent / value
        return str(local) if local.exists() or value.startswith(".") or "/" not in value else value

    def ui_vocabulary(self) -> dict[str, Any]:
        """What the UI shows for this model: vocabulary and notes, plus the recipe's defaults
        under the names the app reads (`read_vocabulary`)."""
        out = dict(self.vocabulary)
        if self.notes:
            out["notes"] = self.notes
        names = {"steps": "default_steps", "guidance": "default_guidance_scale", "num_frames": "default_num_frames",
                 "fps": "default_fps", "guidance_2": "default_guidance_scale_2"}  # fmt: skip
        out.update({names[k]: v for k, v in self.defaults.items() if k in names})
        return out


def _fail(where: str, message: str) -> RecipeError:
    return RecipeError(f"recipe {where}: {message}")


def _check_type(where: str, key: str, value: Any, kind: type | tuple) -> None:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        name = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _fail(where, f"{key}: expected {name}, got {value!r}")


def _components(where: str, raw: Any) -> tuple[Component, ...]:
    _check_type(where, "components", raw, dict)
    out = []
    for name, spec in raw.items():
        key = f"components.{name}"
        _check_type(where, key, spec, dict)
        unknown = set(spec) - {"source", "class", "kwargs"}
        if unknown:
            raise _fail(where, f"{key}: unknown field(s) {', '.join(sorted(unknown))} (source, class, kwargs)")
        for required in ("source", "class"):
            if not isinstance(spec.get(required), str) or not spec[required].strip():
                raise _fail(where, f"{key}.{required}: required text")
        if spec["class"].split(".")[0] not in ("transformers", "diffusers") or "." not in spec["class"]:
            raise _fail(where, f"{key}.class: {spec['class']!r} must be transformers.<Class> or diffusers.<Class>")
        kwargs = spec.get("kwargs", {})
        _check_type(where, f"{key}.kwargs", kwargs, dict)
        out.append(Component(name, spec["source"], spec["class"], dict(kwargs)))
    return tuple(out)


def _loras(where: str, raw: Any) -> tuple[RecipeLora, ...]:
    _check_type(where, "loras", raw, list)
    out = []
    for i, item in enumerate(raw):
        key = f"loras[{i}]"
        _check_type(where, key, item, dict)
        if not isinstance(item.get("path"), str) or not item["path"].endswith(".safetensors"):
            raise _fail(where, f"{key}.path: a .safetensors file is required")
        scale, fuse = item.get("scale", 1.0), item.get("fuse", False)
        _check_type(where, f"{key}.scale", scale, float)
        _check_type(where, f"{key}.fuse", fuse, bool)
        out.append(RecipeLora(item["path"], float(scale), fuse))
    return tuple(out)


def _defaults(where: str, raw: Any) -> dict[str, Any]:
    _check_type(where, "defaults", raw, dict)
    for key, value in raw.items():
        if key not in DEFAULT_FIELDS:
            raise _fail(where, f"defaults.{key}: unknown (known: {', '.join(DEFAULT_FIELDS)})")
        field = request_field(DEFAULT_FIELDS[key])
        _check_type(where, f"defaults.{key}", value, _JSON_TYPES[field.kind])
        try:
            field.parse(value)
        except ValueError as exc:
            raise _fail(where, f"defaults.{key}: {exc}") from None
        if key == "step_cache" and value not in step_cache.METHODS:  # written as the method's own name
            raise _fail(where, f"defaults.step_cache: {value!r} is not one of {', '.join(step_cache.METHODS)}")
    return dict(raw)


def parse(data: Any, where: str = "<recipe>", path: Path | None = None) -> Recipe:
    """A validated Recipe from decoded JSON; RecipeError naming the first bad field."""
    _check_type(where, "recipe", data, dict)
    unknown = set(data) - TOP_KEYS
    if unknown:
        raise _fail(where, f"unknown field(s) {', '.join(sorted(unknown))}")
    for key in ("name", "source"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise _fail(where, f"{key}: required text")
    for key in ("description", "pipeline_class", "custom_pipeline", "dtype", "notes", "inpaint_pipeline"):
        if data.get(key) is not None:
            _check_type(where, key, data[key], str)
    if data.get("pipeline_class") and data.get("custom_pipeline"):
        raise _fail(where, "pipeline_class and custom_pipeline: give one, not both")
    if data.get("dtype") is not None and data["dtype"] not in DTYPES:
        raise _fail(where, f"dtype: {data['dtype']!r} is not one of {', '.join(DTYPES)}")
    task = data.get("task", "both")
    if task not in TASKS:
        raise _fail(where, f"task: {task!r} is not one of {', '.join(TASKS)}")
    vocabulary = data.get("vocabulary", {})
    _check_type(where, "vocabulary", vocabulary, dict)
    try:
        quant = quantization.parse_spec(data["quantization"], "quantization") if "quantization" in data else ()
    except ValueError as exc:
        raise _fail(where, str(exc)) from None
    return Recipe(
        name=data["name"], source=data["source"], path=path, description=data.get("description") or "",
        pipeline_class=data.get("pipeline_class"), custom_pipeline=data.get("custom_pipeline"),
        components=_components(where, data.get("components", {})), dtype=data.get("dtype"),
        loras=_loras(where, data.get("loras", [])), defaults=_defaults(where, data.get("defaults", {})),
        task=task, vocabulary=vocabulary, notes=data.get("notes") or "",
        inpaint_pipeline=data.get("inpaint_pipeline"), quantization=quant,
    )  # fmt: skip


def find(model_id: str, recipes_dir: Path = RECIPES_DIR) -> Path | None:
    """The recipe file `model_id` names (a .json path, or a name in the recipes folder), else None."""
    path = Path(model_id).expanduser()
    if path.suffix == ".json":
        if not path.is_file():
            raise RecipeError(f"recipe {model_id}: file not found")
        return path
    if "/" in model_id or "\\" in model_id:
        return None
    candidate = recipes_dir / f"{model_id}.json"
    return candidate if candidate.is_file() else None


def load(path: Path) -> Recipe:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise RecipeError(f"recipe {path.name}: not readable JSON: {exc}") from exc
    return parse(data, path.name, path.resolve())


def available(recipes_dir: Path = RECIPES_DIR) -> dict[str, Path]:
    """Recipe name -> file, for the model picker."""
    return {p.stem: p for p in sorted(recipes_dir.glob("*.json"))} if recipes_dir.is_dir() else {}


def _class(dotted: str) -> Any:
    module, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise RecipeError(f"component class {dotted}: not found ({exc})") from exc


def load_components(recipe: Recipe, dtype: Any) -> dict[str, Any]:
    """The recipe's extra components, loaded (models in `dtype`; tokenizers and processors as they are)."""
    import torch

    loaded = {}
    for c in recipe.components:
        cls = _class(c.cls)
        kwargs = dict(c.kwargs)
        if isinstance(cls, type) and issubclass(cls, torch.nn.Module):
            kwargs.setdefault("dtype", dtype)
        log.info("recipe %s: loading %s (%s) from %s", recipe.name, c.name, c.cls, c.source)
        try:
            loaded[c.name] = cls.from_pretrained(recipe.resolve(c.source), **kwargs)
        except Exception as exc:
            raise ModelLoadError(
                f"recipe {recipe.name}: component {c.name} ({c.cls}) could not be loaded from {c.source}: "
                f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            ) from exc
    return loaded


def pipeline_kwargs(recipe: Recipe, dtype: Any) -> dict[str, Any]:
    """`from_pretrained` keyword arguments: the extra components and the custom pipeline."""
    kwargs = load_components(recipe, dtype)
    if recipe.custom_pipeline:
        custom = recipe.resolve(recipe.custom_pipeline)
        if not Path(custom).exists():
            raise RecipeError(f"recipe {recipe.name}: custom_pipeline {recipe.custom_pipeline} not found ({custom})")
        log.warning("recipe %s runs code from %s (custom_pipeline)", recipe.name, custom)
        kwargs["custom_pipeline"] = custom
        kwargs["trust_remote_code"] = True  # naming a custom_pipeline in a recipe is that trust decision
    return kwargs


def dtype_for(recipe: Recipe | None, dm: Any) -> Any:
    """The recipe's dtype hint, unless TORCH_DTYPE was set or the device is the CPU/MPS (float32 there,
    for the reasons in the DeviceManager's table)."""
    import torch

    if recipe is None or recipe.dtype is None or dm.options.dtype is not None or dm.backend in ("cpu", "mps"):
        return dm.dtype
    return getattr(torch, recipe.dtype)


def _check_quantized_components(recipe: Recipe, plan: Any) -> None:
    """A recipe's extra component is loaded by `components` and handed to diffusers whole, so a
    quantization asked for it would be silently ignored: refused instead."""
    extra = {c.name for c in recipe.components}
    for r in plan.requests:
        if r.component in extra:
            raise RecipeError(
                f"recipe {recipe.name}: {r.where}: {r.component} is loaded by the recipe's components, which "
                "quantization does not reach (only the base model's own components can be quantized)"
            )


def open_model(
    model_id: str, dm: Any, extra: dict[str, Any] | None = None, quantize: str = "", base_model: str = ""
) -> tuple[Any, Recipe | None, str]:
    """(diffusers pipeline, recipe or None, the weights' source) for a MODEL_ID: a recipe name or
    file, or anything `load_diffusers_pipeline` takes; `quantize` (QUANTIZATION) over the recipe's
    quantization, and a MODEL_ID=<file>.gguf completed by `base_model` (pipelines.weights.quantization)."""
    from pipelines.weights.loading import load_diffusers_pipeline

    extra = dict(extra or {})
    path = find(model_id)
    recipe = load(path) if path is not None else None
    try:
        settings = quantization.parse_setting(quantize) if quantize else ()
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    if recipe is None and model_id.endswith(".gguf"):
        if not base_model:
            raise ModelLoadError(
                f"MODEL_ID={model_id}: a .gguf file holds one model; set BASE_MODEL to the "
                "diffusers folder or Hub id that gives the rest of the pipeline"
            )
        settings = quantization.merged((quantization.Request("transformer", "gguf", model_id, "MODEL_ID"),), settings)
        model_id = base_model
    requests = quantization.merged(recipe.quantization if recipe else (), settings)
    plan = quantization.check(requests, dm.backend)  # refused here, before anything is downloaded
    if recipe is None:
        kwargs = {**extra, **quantization.load_kwargs(plan, model_id, dm.dtype)}
        pipe = load_diffusers_pipeline(model_id, dm.dtype, **kwargs)
        if plan:
            quantization.after_load(pipe, plan, dm.dtype)
        return pipe, None, quantization.denoiser_file(plan) or model_id
    _check_quantized_components(recipe, plan)
    dtype = dtype_for(recipe, dm)
    kwargs = {**extra, **pipeline_kwargs(recipe, dtype)}
    if recipe.pipeline_class:
        kwargs["pipeline_class"] = recipe.pipeline_class
    source = recipe.resolve(recipe.source)
    plan = quantization.resolve_files(plan, recipe.resolve)
    kwargs.update(quantization.load_kwargs(plan, source, dtype))
    log.info("recipe %s: loading %s", recipe.name, source)
    pipe = load_diffusers_pipeline(source, dtype, **kwargs)
    if plan:
        quantization.after_load(pipe, plan, dtype)
    return pipe, recipe, quantization.denoiser_file(plan) or source
