"""sd-webui-controlnet's API, as its clients use it: units in `alwayson_scripts`, and `/controlnet/*`.

A txt2img or img2img body carries units as `alwayson_scripts: {"controlnet": {"args": [unit, ...]}}`
(the `webuiapi` package's `ControlNetUnit.to_dict()`, or raw HTTP as the extension's wiki shows).
Each unit's keys are read into our `ControlUnit` (pipelines.control.controlnet); what the extension encodes
differently is converted here once:

| key | the extension sends | we take |
|---|---|---|
| `image` / `input_image` | base64, or `{"image": ..., "mask": ...}` | the image (decoded after its header is checked); none in img2img: the first init image, as the extension does |
| `resize_mode` | 0/1/2, or "Just Resize" / "Crop and Resize" / "Resize and Fill" (also the old "Scale to Fit (Inner Fit)", "Envelope (Outer Fit)") | our names |
| `control_mode` | 0/1/2 or the names | our names |
| `processor_res`, `threshold_a/b` | -1 for "the preprocessor's default" | 0 / null |
| `pixel_perfect` | true: the preprocessor at the output's resolution | processor_res 0 |
| `enabled` | false: the unit is skipped | skipped |
| `low_vram`, `hr_option`, `mask` | | ignored (a warning for a mask or an `hr_option` other than "Both") |

Routes (beside `/sdapi/v1`): `GET /controlnet/version`, `/controlnet/model_list`, `/controlnet/module_list`,
`POST /controlnet/detect` (maps of images by a preprocessor, as base64 PNGs).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PIL import Image

from pipelines import IP_ADAPTER_MODULE, ModelInfo, is_ip_unit
from pipelines import control_setting as setting
from pipelines.schema.control import ALIASES, CONTROL_MODES, PREPROCESSORS, RESIZE_MODES, PreprocessorError

from . import images
from .errors import WireError

VERSION = 2  # what the extension's /controlnet/version answers (clients check it is >= 2)
RESIZE_NAMES = {
    **{str(i): name for i, name in enumerate(RESIZE_MODES)},
    **{name.lower(): name for name in RESIZE_MODES},
    "scale to fit (inner fit)": "Crop and Resize", "envelope (outer fit)": "Resize and Fill", "inner fit": "Crop and Resize",
    "outer fit": "Resize and Fill", "resize": "Just Resize",
}  # fmt: skip
MODE_NAMES = {**{str(i): name for i, name in enumerate(CONTROL_MODES)}, **{name.lower(): name for name in CONTROL_MODES}}
COPIED = ("module", "model", "weight", "guidance_start", "guidance_end")


def script_args(payload: dict[str, Any], name: str, prefix: bool = False, what: str = "a list") -> list[Any] | None:
    """The `args` of the alwayson script `name` (any case; `prefix`: whose name starts with it, as Dynamic
    Prompts puts its version in its name), None where absent; the extensions read theirs here too."""
    scripts = payload.get("alwayson_scripts") or {}
    if not isinstance(scripts, dict):
        raise WireError(("alwayson_scripts",), "must be an object of script name -> {\"args\": [...]}")
    found = (lambda k: k.lower().startswith(name)) if prefix else (lambda k: k.lower() == name)
    entry = next((v for k, v in scripts.items() if isinstance(k, str) and found(k)), None)
    if entry is None:
        return None
    args = entry.get("args") if isinstance(entry, dict) else entry
    if not isinstance(args, list):
        raise WireError(("alwayson_scripts", name, "args"), f"must be {what}")
    return args


def unit_args(payload: dict[str, Any]) -> list[Any]:
    """The units a body carries (the script's name in any case), [] for none."""
    return script_args(payload, "controlnet", what="a list of units") or []


def other_scripts(payload: dict[str, Any]) -> list[str]:
    scripts = payload.get("alwayson_scripts") or {}
    return [k for k in scripts if isinstance(k, str) and k.lower() != "controlnet"] if isinstance(scripts, dict) else []


def units(payload: dict[str, Any], fallback: Image.Image | None, limits: Any, max_bytes: int, warnings: list[str]) -> list[dict[str, Any]]:
    """Our units' values from the body's enabled units (the schema checks them)."""
    out = []
    for i, raw in enumerate(unit_args(payload)):
        where = ("alwayson_scripts", "controlnet", "args", i)
        if not isinstance(raw, dict):
            raise WireError(where, "must be an object of the unit's fields")
        if raw.get("enabled", True) in (False, "false", 0):
            continue
        unit = {key: raw[key] for key in COPIED if raw.get(key) is not None}
        unit["image"] = _image(raw, where, fallback, limits, max_bytes)
        unit.update(_converted(raw, where))
        if raw.get("mask") or (isinstance(raw.get("image"), dict) and raw["image"].get("mask")):
            warnings.append(f"controlnet unit {i}: its mask is not supported here, ignored")
        if raw.get("hr_option") not in (None, "Both"):
            warnings.append(f"controlnet unit {i}: hr_option={raw['hr_option']!r}: units run in both hires passes here")
        out.append(unit)
    return out


def split(found: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """The body's units as our two fields: ControlNet units, and IP-Adapter units (module "ip-adapter*",
    as the extension and Forge send them) as image prompts, their weight the scale (the schema checks it)."""
    prompts = [{**{k: u[k] for k in ("image", "model") if k in u}, **({"scale": u["weight"]} if "weight" in u else {})}
               for u in found if is_ip_unit(u)]  # fmt: skip
    return {"controlnet": [u for u in found if not is_ip_unit(u)], "ip_adapter": prompts}


def _image(raw: dict[str, Any], where: tuple, fallback: Image.Image | None, limits: Any, max_bytes: int) -> Image.Image:
    value = raw.get("image") or raw.get("input_image")
    if isinstance(value, dict):
        value = value.get("image")
    if not value:
        if fallback is None:
            raise WireError((*where, "image"), "a control image is required (base64) in txt2img")
        return fallback
    data = images.from_base64(value, (*where, "image"), max_bytes)
    return images.open_bytes(data, (*where, "image"), limits.max_upload_pixels, max_bytes, "RGB")


def _converted(raw: dict[str, Any], where: tuple) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, table in (("resize_mode", RESIZE_NAMES), ("control_mode", MODE_NAMES)):
        value = raw.get(key)
        if value is None:
            continue
        name = table.get(str(value).strip().lower())
        if name is None:
            raise WireError((*where, key), f"{value!r} is not one of {', '.join(k for k in table if not k.isdigit())}")
        out[key] = name
    if raw.get("union_control_type") is not None:  # the schema checks it (pipelines.control.controlnet.CONTROL_TYPES)
        out["control_type"] = raw["union_control_type"]
    if raw.get("pixel_perfect") in (True, "true", 1):
        out["processor_res"] = 0
    elif raw.get("processor_res") is not None:
        out["processor_res"] = 0 if _negative(raw["processor_res"]) else raw["processor_res"]
    for key in ("threshold_a", "threshold_b"):
        if raw.get(key) is not None and not _negative(raw[key]):
            out[key] = raw[key]
    return out


def _setting(payload: dict[str, Any], name: str) -> Any:
    """`controlnet_<name>` of a detect body by the unit field's own rules; absent or -1: the default."""
    value = payload.get(f"controlnet_{name}")
    if value is None or _negative(value):
        return None
    try:
        return setting(name, value)
    except ValueError as exc:
        raise WireError((f"controlnet_{name}",), str(exc)) from None


def _negative(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value < 0


# ------------------------------------------------------------------ the /controlnet routes
def model_list(info: ModelInfo) -> dict[str, Any]:
    """The ControlNets, then the IP-Adapters (the extension lists both; a unit picks either)."""
    return {"model_list": [*info.controlnets, *info.ip_adapters]}


def module_list(info: ModelInfo) -> dict[str, Any]:
    """Our preprocessors (the model-based ones whose annotator is installed) and A1111's names for them,
    with their sliders as the extension describes them."""
    detail = {}
    for name, pre in PREPROCESSORS.items():
        sliders = [{"name": slider[0], "value": slider[1], "min": 0, "max": 255 if name != "tile" else 8}
                   for slider in (pre.threshold_a, pre.threshold_b) if slider]  # fmt: skip
        detail[name] = {"model_free": name == "none", "sliders": sliders}
    detail.update({name: {"model_free": False, "sliders": []} for name in info.annotators})
    detail[IP_ADAPTER_MODULE] = {"model_free": False, "sliders": []}  # the adapter's own encoder reads the picture
    usable = [*PREPROCESSORS, *info.annotators]
    names = [*usable, *(a for a, ours in ALIASES.items() if ours in usable and a not in usable), IP_ADAPTER_MODULE]
    return {"module_list": names, "module_detail": detail}


def detect_maps(payload: dict[str, Any], limits: Any, max_bytes: int, maker: Callable[..., Image.Image]) -> list[Image.Image]:
    """POST /controlnet/detect: each of `controlnet_input_images` (or `controlnet_images`) through the
    module, by `maker` (Engine.detect: a model-based module by its annotators)."""
    values = payload.get("controlnet_input_images") or payload.get("controlnet_images")
    if not isinstance(values, list) or not values:
        raise WireError(("controlnet_input_images",), "a list of at least one base64 image is required")
    module = payload.get("controlnet_module", "none")
    res, a, b = (_setting(payload, key) for key in ("processor_res", "threshold_a", "threshold_b"))
    out = []
    for i, value in enumerate(values):
        data = images.from_base64(value, ("controlnet_input_images", i), max_bytes)
        picture = images.open_bytes(data, ("controlnet_input_images", i), limits.max_upload_pixels, max_bytes, "RGB")
        try:
            out.append(maker(picture, module, res, a, b))
        except PreprocessorError as exc:
            raise WireError(("controlnet_module",), str(exc)) from None
    return out
