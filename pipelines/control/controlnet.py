"""ControlNet: units in a request, the models they name, and the pipeline that runs them.

What this module owns:
- the schema part (`ControlUnit`: a control image, its preprocessor, a model, weight, start/end as
  shares of the steps, control mode, resize mode; a request carries a list of them, `controlnet`),
  with A1111's ControlNet extension's names and defaults, since its clients send those;
- the models (`ControlNets`): folders and single files in CONTROLNET_DIR and the embedded
  `models/controlnets`, loaded once on the pipeline's device and dtype;
- the pipeline that runs them: the family's ControlNet twin built over the model's own components
  (`shared_twin`: every weight shared, none cast, the ControlNet added), by task (`TWINS`);
- each unit's map at the output size (`prepare`) and the call's arguments (`call_kwargs`);
- the infotext lines A1111 writes (`infotext`), read back by pipelines.pnginfo.read.

Control modes, as A1111 names them, and what runs (diffusers has no per-layer scales to pass):

| mode | what runs | why |
|---|---|---|
| Balanced | the unit at its weight on both halves of classifier-free guidance | A1111's default |
| My prompt is more important | the weight times 0.40 | the mean of A1111's layer factors 0.825^(12-i) for its 13 control outputs |
| ControlNet is more important | diffusers' `guess_mode`: control on the prompt's half only, layers scaled 0.1 to 1 | what A1111 does for this mode (control only where the prompt is) |

`guess_mode` is one switch per diffusers call: a unit asking for it turns it on for the call, and
the result says so when other units asked for another mode.

Union ControlNets (one model, many kinds of map) take each unit's **control type**, by
sd-webui-controlnet's names (its `union_control_type`); "Unknown" takes it from the preprocessor.
Each family's union numbers the types its own way:

| model class | models | types (the `control_mode` index) | why |
|---|---|---|---|
| `ControlNetUnionModel` (SDXL) | xinsir's ControlNet++ union / ProMax | OpenPose 0, Depth 1, Soft Edge 2, Hard Edge 3, Normal Map 4, Segmentation 5, Tile 6, Inpaint 7 (ProMax: 8 types, union: the first 6) | its training's numbering, which sd-webui-controlnet's list follows |
| `FluxControlNetModel` with `num_mode` | InstantX's and Shakker-Labs' FLUX.1-dev union | Hard Edge 0 (canny), Tile 1, Depth 2, OpenPose 4 | their numbering (3 blur, 5 gray, 6 low quality have no sd-webui-controlnet name) |

Units on one SDXL union model run as one call of it with a condition each (how ControlNet++ combines
maps); on several, as diffusers' `MultiControlNetUnionModel`. Qwen-Image's union reads the kind of
map from the map itself: it takes no type.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from PIL import Image, ImageOps

from devices.one_load import ONE_LOAD
from pipelines.control.maps import detect
from pipelines.schema.control import (
    CONTROL_MODES,
    CONTROL_TYPES,
    TYPE_OF_PREPROCESSOR,
    UNKNOWN,
    ControlUnit,
    model_name,
    resolve,
)
from pipelines.schema.fields import RequestError

log = logging.getLogger(__name__)

EMBEDDED_DIR = Path(__file__).resolve().parents[2] / "models" / "controlnets"
PROMPT_FIRST = sum(0.825 ** (12 - i) for i in range(13)) / 13  # A1111's soft injection, as one factor
# A union model's `control_mode` index of each type, by class (the table in the docstring says whose numbering)
UNION_MODES: dict[str, dict[str, int]] = {
    "ControlNetUnionModel": {name: i for i, name in enumerate(CONTROL_TYPES[1:])},
    "FluxControlNetModel": {"Hard Edge": 0, "Tile": 1, "Depth": 2, "OpenPose": 4},
}
SINGLE_FILE_SUFFIXES = (".safetensors", ".pth", ".ckpt")

# family -> its ControlNet pipelines in diffusers 0.42.1 (text-to-image, image-to-image, inpaint);
# None: diffusers has none for that task. SD3's and Qwen-Image's inpaint pipelines are for their
# inpainting ControlNets only (the mask goes to the ControlNet), so they are not offered for units.
TWINS: dict[str, tuple[str | None, str | None, str | None]] = {
    "StableDiffusionPipeline": ("StableDiffusionControlNetPipeline", "StableDiffusionControlNetImg2ImgPipeline", "StableDiffusionControlNetInpaintPipeline"),
    "StableDiffusionXLPipeline": ("StableDiffusionXLControlNetPipeline", "StableDiffusionXLControlNetImg2ImgPipeline", "StableDiffusionXLControlNetInpaintPipeline"),
    "StableDiffusion3Pipeline": ("StableDiffusion3ControlNetPipeline", None, None),
    "FluxPipeline": ("FluxControlNetPipeline", "FluxControlNetImg2ImgPipeline", "FluxControlNetInpaintPipeline"),
    "QwenImagePipeline": ("QwenImageControlNetPipeline", None, None),
    "SanaPipeline": ("SanaControlNetPipeline", None, None),
}  # fmt: skip
# The pipelines that run union models, where they are other classes (SDXL's); Flux's plain ones take both.
UNION_TWINS: dict[str, tuple[str, str, str]] = {
    "StableDiffusionXLPipeline": ("StableDiffusionXLControlNetUnionPipeline", "StableDiffusionXLControlNetUnionImg2ImgPipeline", "StableDiffusionXLControlNetUnionInpaintPipeline"),
}  # fmt: skip
# T2I-Adapters (a small network beside the UNet; TencentARC's): diffusers runs them in text-to-image only.
ADAPTER_TWINS = {"StableDiffusionPipeline": "StableDiffusionAdapterPipeline", "StableDiffusionXLPipeline": "StableDiffusionXLAdapterPipeline"}
TASK_INDEX = {"txt2img": 0, "img2img": 1, "inpaint": 2}
# A ControlNet model class -> the class that runs several at once (Sana has none: one unit).
MULTI = {
    "ControlNetModel": "MultiControlNetModel",
    "SD3ControlNetModel": "SD3MultiControlNetModel",
    "FluxControlNetModel": "FluxMultiControlNetModel",
    "QwenImageControlNetModel": "QwenImageMultiControlNetModel",
}


class ControlError(ValueError):
    """A unit this model cannot run (family, task, model); the message says what can."""




# ------------------------------------------------------------------ models
class ControlNets:
    """The ControlNets a server has: each folder (a diffusers ControlNet, its `config.json` naming the
    class) or single file in `folders`, by its name, and each of `refs` (CONTROLNET_MODELS: a Hub id, by
    the id, or a folder, by its name); loaded on first use on the manager's device and dtype, kept until
    `close` (a model switch drops them with the pipeline)."""

    def __init__(self, folders: list[Path | str | None], device_manager: Any, refs: tuple[str, ...] = ()):
        self.folders = list(dict.fromkeys([Path(f) for f in folders if f] + [EMBEDDED_DIR]))
        self.refs = refs
        self.dm = device_manager
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def files(self) -> dict[str, Path]:
        found: dict[str, Path] = {}
        for folder in self.folders:
            if not folder.is_dir():
                continue
            for path in sorted(folder.iterdir()):
                if (path / "config.json").is_file() or path.suffix in SINGLE_FILE_SUFFIXES:
                    found.setdefault(path.stem if path.is_file() else path.name, path)
        return found

    def sources(self) -> dict[str, Path | str]:
        """Every model by name: the folders' (`files`), then CONTROLNET_MODELS' (a Hub id: the id, a str)."""
        found: dict[str, Path | str] = dict(self.files())
        for ref in self.refs:
            folder = Path(ref)
            found.setdefault(*((folder.name, folder) if folder.is_dir() else (ref, ref)))
        return found

    def names(self) -> list[str]:
        return sorted(self.sources())

    def check(self, name: str) -> Path | str:
        source = self.sources().get(model_name(name))
        if source is None:
            offered = ", ".join(self.names()) or "none"
            raise ControlError(f"no ControlNet named {name!r}; this server has: {offered} (CONTROLNET_DIR, CONTROLNET_MODELS)")
        return source

    def class_of(self, name: str) -> str:
        """The diffusers class of model `name` (`_class_name`), nothing loaded."""
        return _class_name(self.check(name))

    def get(self, name: str) -> Any:
        key = model_name(name)
        with self._lock:
            if key not in self._loaded:
                self._loaded[key] = self._load(self.check(key))
            return self._loaded[key]

    def _load(self, source: Path | str) -> Any:
        import diffusers

        cls = getattr(diffusers, _class_name(source))
        with ONE_LOAD:  # each replica of a pool loads its own copy; one at a time (devices.one_load)
            if isinstance(source, Path) and source.is_file():  # A1111-style single files are SD 1.5 / SDXL ControlNets
                model = cls.from_single_file(str(source), torch_dtype=self.dm.dtype)
            else:  # a folder, or a Hub id (downloaded into the Hugging Face cache once)
                try:
                    model = cls.from_pretrained(source, torch_dtype=self.dm.dtype)
                except OSError as exc:
                    raise ControlError(f"ControlNet {source!r} could not be downloaded from the Hub: {exc}") from exc
        model.to(self.dm.device).eval()
        # Vanilla attention on NPU/MPS covers the ControlNet too. The model alone: the twin's other parts
        # are the pipeline's, set at its load (and its UNet may run an IP-Adapter's processors now).
        self.dm.apply_attention(model)
        log.info("loaded ControlNet %s (%s) on %s in %s", source, type(model).__name__, self.dm.device, self.dm.dtype_name)
        return model

    def loaded_bytes(self) -> dict[str, int]:
        """Weights' bytes of each loaded ControlNet (the status panel's line)."""
        return {n: sum(p.numel() * p.element_size() for p in m.parameters()) for n, m in self._loaded.items()}

    def describe(self) -> str:
        """ " · ControlNet shapes-silhouette 11 MB" for the status panel's weights line; "" when none is loaded."""
        loaded = self.loaded_bytes()
        return "".join(f" · ControlNet {name} {size / 2**20:.0f} MB" for name, size in sorted(loaded.items()))

    def close(self) -> None:
        with self._lock:
            self._loaded.clear()


def _class_name(source: Path | str) -> str:
    """A ControlNet source's diffusers class: its `config.json`'s `_class_name` (a Hub id's config alone is
    fetched, into the Hugging Face cache); a single file is an SD 1.5 / SDXL ControlNetModel."""
    if isinstance(source, str):
        return _hub_config(source)["_class_name"]
    return "ControlNetModel" if source.is_file() else json.loads((source / "config.json").read_text())["_class_name"]


def _hub_config(repo: str) -> dict[str, Any]:
    """A Hub model's `config.json` (through the Hugging Face cache); ControlError saying why when it cannot
    be had (no network, HF_HUB_OFFLINE, a private or missing repo)."""
    import diffusers

    try:
        return dict(diffusers.ControlNetModel.load_config(repo))  # any model class reads a config.json so
    except (OSError, ValueError) as exc:
        raise ControlError(f"ControlNet {repo!r} could not be read from the Hub: {exc}") from exc


# ------------------------------------------------------------------ pipelines
def families() -> str:
    return ", ".join(name.removesuffix("Pipeline") for name in TWINS)


def tasks(family: str) -> tuple[str, ...]:
    """The tasks `family` runs units for."""
    twins = TWINS.get(family, (None, None, None))
    return tuple(task for task, i in TASK_INDEX.items() if twins[i])


def twin_class(family: str, task: str) -> str:
    """The diffusers class that runs units for `family` and `task`; ControlError saying which can."""
    twins = TWINS.get(family)
    if twins is None:
        raise ControlError(f"{family} has no ControlNet pipeline in diffusers; families with ControlNet: {families()}")
    name = twins[TASK_INDEX[task]]
    if name is None:
        raise ControlError(f"{family} has no ControlNet pipeline for {task} in diffusers; with units it can do: {', '.join(tasks(family))}")
    return name


def union_modes(model: Any) -> dict[str, int] | None:
    """The control types a union ControlNet takes, with their `control_mode` index; None for a plain one.
    Flux's union is its plain class with `num_mode` set."""
    name = type(model).__name__
    if name == "ControlNetUnionModel":
        return {t: i for t, i in UNION_MODES[name].items() if i < model.config.num_control_type}
    if name == "FluxControlNetModel" and model.config.num_mode is not None:
        return {t: i for t, i in UNION_MODES[name].items() if i < model.config.num_mode}
    return None


def control_modes(units: tuple[ControlUnit, ...], models: list[Any]) -> list[int | None]:
    """Each unit's `control_mode` index for its model (None: not a union model); RequestError naming the
    unit where a union model gets no type or one it does not take."""
    out: list[int | None] = []
    for i, (unit, model) in enumerate(zip(units, models, strict=True)):
        modes = union_modes(model)
        wanted = unit.control_type if unit.control_type != UNKNOWN else TYPE_OF_PREPROCESSOR.get(resolve(unit.module).name)
        if modes is not None and wanted is None:
            raise RequestError("controlnet", f"control_type: {unit.model_name} is a union ControlNet: name the kind of map "
                               f"({', '.join(modes)}); preprocessor {unit.module!r} does not say", (i,))  # fmt: skip
        if modes is not None and wanted not in modes:
            raise RequestError("controlnet", f"control_type: {unit.model_name} takes {', '.join(modes)}, not {wanted}", (i,))
        out.append(None if modes is None else modes[wanted])  # type: ignore[index]
    return out


def check_kinds(family: str, task: str, classes: list[str]) -> None:
    """ControlError, before any work, for units whose models cannot run together here: T2I-Adapters
    outside text-to-image on SD/SDXL or beside ControlNets, SDXL union models on another family or beside
    plain ones (diffusers runs each kind in its own pipelines)."""
    twin_class(family, task)
    kinds = {"T2IAdapter" if c == "T2IAdapter" else "union" if c == "ControlNetUnionModel" else "plain" for c in classes}
    if "T2IAdapter" in kinds and len(kinds) > 1:
        raise ControlError("diffusers runs T2I-Adapters and ControlNets in different pipelines: send units of one kind")
    if "T2IAdapter" in kinds and (task != "txt2img" or family not in ADAPTER_TWINS):
        can = ", ".join(f.removesuffix("Pipeline") for f in ADAPTER_TWINS)
        raise ControlError(f"T2I-Adapters run in text-to-image only, on {can} (diffusers); this is {family}, {task}")
    if "union" in kinds and family not in UNION_TWINS:
        raise ControlError(f"ControlNetUnionModel is an SDXL union ControlNet; {family} cannot run it")
    if "union" in kinds and len(kinds) > 1:
        raise ControlError("diffusers runs union and plain ControlNets in different pipelines: send units of one kind")


def build_twin(pipe: Any, family: str, task: str, models: list[Any]) -> Any:
    """The family's ControlNet pipeline for `task` over `pipe` (every weight shared), running `models`."""
    import diffusers

    classes = [type(m).__name__ for m in models]
    check_kinds(family, task, classes)  # the kinds together (ImagePipeline checked them from config.json already)
    if "ControlNetUnionModel" in classes:
        return _union_twin(pipe, family, task, models)
    if "T2IAdapter" in classes:
        return _adapter_twin(pipe, family, task, models)
    controlnet = models[0]
    if len(models) > 1:
        multi = MULTI.get(type(models[0]).__name__)
        if multi is None or len({type(m) for m in models}) > 1:
            raise ControlError(f"{type(models[0]).__name__} runs one unit at a time in diffusers; send one unit")
        controlnet = getattr(diffusers, multi)(models)
    twin = shared_twin(getattr(diffusers, twin_class(family, task)), pipe, controlnet=controlnet)
    twin.set_progress_bar_config(disable=True)
    return twin


def _union_twin(pipe: Any, family: str, task: str, models: list[Any]) -> Any:
    """SDXL's union pipeline (`check_kinds` passed): one union model takes every unit as a condition of
    one call; several run as diffusers' MultiControlNetUnionModel (one condition each)."""
    import diffusers
    from diffusers.models.controlnets import MultiControlNetUnionModel

    controlnet = models[0] if all(m is models[0] for m in models) else MultiControlNetUnionModel(models)
    twin = shared_twin(getattr(diffusers, UNION_TWINS[family][TASK_INDEX[task]]), pipe, controlnet=controlnet)
    twin.set_progress_bar_config(disable=True)
    return twin


def _adapter_twin(pipe: Any, family: str, task: str, models: list[Any]) -> Any:
    """diffusers' T2I-Adapter pipeline for the family (text-to-image; `check_kinds` passed), the adapters as
    one MultiAdapter."""
    import diffusers

    adapter = models[0] if len(models) == 1 else diffusers.MultiAdapter(models)
    twin = shared_twin(getattr(diffusers, ADAPTER_TWINS[family]), pipe, adapter=adapter)
    twin.set_progress_bar_config(disable=True)
    return twin


def shared_twin(cls: Any, pipe: Any, **extra: Any) -> Any:
    """`cls` built over `pipe`'s components (and its plain config values, `requires_safety_checker`),
    plus `extra`. Not `cls.from_pipe`: it ends with `to(dtype)`, float32 unless told, which would cast the
    shared modules in place (a bfloat16 model upcast on the GPU) and raises for quantized ones."""
    expected, optional = cls._get_signature_keys(cls)
    names = {*expected, *optional}
    parts = {name: module for name, module in pipe.components.items() if name in names}
    parts.update({k: v for k, v in pipe.config.items() if k in names and k not in parts and not isinstance(v, list | tuple)})
    parts.update(extra)
    parts.update({name: None for name in expected if name not in parts})  # a component the model does not have
    return cls(**parts)


def fit(image: Image.Image, size: tuple[int, int], mode: str) -> Image.Image:
    """The map at the output's size, by A1111's resize modes."""
    if mode == "Just Resize":
        return image.resize(size, Image.Resampling.LANCZOS)
    if mode == "Resize and Fill":
        return ImageOps.pad(image, size, Image.Resampling.LANCZOS, color=(0, 0, 0))
    return ImageOps.fit(image, size, Image.Resampling.LANCZOS)


def prepare(unit: ControlUnit, size: tuple[int, int], annotators: Any = None) -> Image.Image:
    """A unit's map at `size` (width, height): the preprocessor at its resolution (a model-based one by
    `annotators`, pipelines.control.annotators), then fitted."""
    resolution = unit.processor_res or min(size)
    image = unit.image.convert("RGB")
    control = detect(image, unit.module, resolution, unit.threshold_a, unit.threshold_b, annotators)
    return fit(control, size, unit.resize_mode)


def call_kwargs(units: tuple[ControlUnit, ...], maps: list[Image.Image], accepted: frozenset[str], task: str,
                modes: list[int | None]) -> tuple[dict[str, Any], list[str]]:  # fmt: skip
    """The diffusers arguments that run `units` (their maps prepared; `modes`: their union models' control
    modes, `control_modes`), and warnings for what cannot."""
    warnings: list[str] = []
    one = len(units) == 1
    weights = [u.weight * (PROMPT_FIRST if u.control_mode == CONTROL_MODES[1] else 1.0) for u in units]
    if "adapter_conditioning_scale" in accepted:  # a T2I-Adapter pipeline
        kwargs = {"image": maps[0] if one else maps, "adapter_conditioning_scale": weights[0] if one else weights,
                  **_adapter_span(units, accepted, warnings)}  # fmt: skip
    else:
        key = "control_image" if "control_image" in accepted else "image"
        kwargs = {key: maps[0] if one else maps, "controlnet_conditioning_scale": weights[0] if one else weights,
                  **_union_kwargs(units, modes, warnings)}  # fmt: skip
        if "control_guidance_start" in accepted:
            kwargs["control_guidance_start"] = [u.guidance_start for u in units]
            kwargs["control_guidance_end"] = [u.guidance_end for u in units]
        elif any(u.guidance_start > 0 or u.guidance_end < 1 for u in units):
            warnings.append("this family's ControlNet pipeline runs units over all steps: start/end were not applied")
    kinds = {u.control_mode for u in units}
    if CONTROL_MODES[2] in kinds:
        if "guess_mode" in accepted:
            kwargs["guess_mode"] = True
            if len(kinds) > 1:
                warnings.append("'ControlNet is more important' is one switch per call in diffusers: it applied to every unit")
        else:
            warnings.append("this pipeline has no guess mode: 'ControlNet is more important' ran as Balanced")
    return kwargs, warnings


def _union_kwargs(units: tuple[ControlUnit, ...], modes: list[int | None], warnings: list[str]) -> dict[str, Any]:
    """`control_mode` where a union model runs; a control type on plain models is said to be unused."""
    if any(mode is not None for mode in modes):
        return {"control_mode": modes[0] if len(units) == 1 else modes}
    if any(u.control_type != UNKNOWN for u in units):
        warnings.append("control type is for union ControlNets; these units' models are not: it was not used")
    return {}


def _adapter_span(units: tuple[ControlUnit, ...], accepted: frozenset[str], warnings: list[str]) -> dict[str, Any]:
    """A T2I-Adapter call's `adapter_conditioning_factor` (SDXL's pipeline has it, SD's not): the share of
    the steps, from the first, the adapters run for (one for the call: the latest unit's end); a later
    start cannot be had."""
    if any(u.guidance_start > 0 for u in units):
        warnings.append("T2I-Adapters run from the first step in diffusers: the starting control step was not applied")
    if "adapter_conditioning_factor" not in accepted:
        if any(u.guidance_end < 1 for u in units):
            warnings.append("this T2I-Adapter pipeline runs over all steps: the ending control step was not applied")
        return {}
    if len({u.guidance_end for u in units}) > 1:
        warnings.append("T2I-Adapters stop together in diffusers: every unit ran to the latest ending control step")
    return {"adapter_conditioning_factor": max(u.guidance_end for u in units)}


# ------------------------------------------------------------------ metadata
INFOTEXT_KEYS = (
    ("Module", "module"), ("Model", "model"), ("Weight", "weight"), ("Resize Mode", "resize_mode"),
    ("Processor Res", "processor_res"), ("Threshold A", "threshold_a"), ("Threshold B", "threshold_b"),
    ("Guidance Start", "guidance_start"), ("Guidance End", "guidance_end"), ("Control Mode", "control_mode"),
    ("Union Control Type", "control_type"),
)  # fmt: skip


def describe(unit: ControlUnit) -> dict[str, Any]:
    """A unit's settings without its image (what metadata and history keep); a control type only where
    one was named (most units are for plain ControlNets)."""
    out = {field: getattr(unit, field) for _, field in INFOTEXT_KEYS}
    return {**out, "control_type": None if unit.control_type == UNKNOWN else unit.control_type}


def infotext(units: list[dict[str, Any]]) -> list[tuple[str, str]]:
    """A1111's lines: `ControlNet 0: "Module: canny, Model: ..., Weight: 1, ..."`, for the units'
    settings (metadata's `controlnet`, then its image prompts as IP-Adapter units)."""
    out = []
    for i, unit in enumerate(units):
        parts = [f"{label}: {_text(unit.get(field))}" for label, field in INFOTEXT_KEYS if unit.get(field) is not None]
        out.append((f"ControlNet {i}", ", ".join(parts)))  # quoted as A1111 quotes a value with commas
    return out


def _text(value: Any) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def setting(name: str, value: Any) -> Any:
    """One of a unit's settings (not its image) from a caller's raw value, by its field's value type;
    PydanticCustomError (a ValueError) naming the problem when refused."""
    return ControlUnit.model_fields[name].metadata[0].parse(value)


def settings_of(raw: dict[str, Any]) -> dict[str, Any]:
    """A unit's settings as read from text (PNG info), each by its field's own rules; a value the field
    refuses is left out (the form keeps its own)."""
    out = {}
    for name, value in raw.items():
        if name not in dict(INFOTEXT_KEYS).values():
            continue
        try:
            out[name] = setting(name, value)
        except ValueError:
            continue  # malformed in the PNG: the form keeps its value
    return out


def read_infotext(fields: dict[str, str]) -> list[dict[str, Any]]:
    """The units' settings from A1111's `ControlNet N` lines (their images are not in a PNG)."""
    units = []
    labels = dict(INFOTEXT_KEYS)
    for i in range(16):
        text = fields.get(f"ControlNet {i}")
        if text is None:
            break
        unit: dict[str, Any] = {}
        for part in text.strip().strip('"').split(", "):
            label, sep, value = part.partition(": ")
            if sep and label in labels:
                unit[labels[label]] = value
        units.append(unit)
    return units
