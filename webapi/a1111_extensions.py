"""The A1111 extensions built in, as their clients send them in `alwayson_scripts`, and ADetailer's own routes.

- **ADetailer** (`"ADetailer": {"args": [enable, skip_img2img, {ad_model, ad_prompt, ...}, {...}]}`; the
  leading flags are optional, as in its older versions; `skip_img2img` skips image-to-image, a pass with
  `ad_tab_enable: false` is off): the first two passes' dictionaries, by ADetailer's own key names, which
  are our fields' (pipelines.schema.detailer); a pass's keys our schema lacks are said in the warnings. `GET /adetailer/v1/version`, `/adetailer/v1/ad_model` (the server's detectors).
- **Regional Prompter** (`"Regional Prompter": {"args": [active, debug, mode, matrix submode, mask submode,
  prompt submode, ratios, base ratios, use base, use common, use negative common, calc mode, ...]}`, its
  README's order): Matrix mode; its split by the schema's names (Columns, Rows, and the older Horizontal,
  Vertical: pipelines.schema.regions.SPLIT_ALIASES).
  "use base" / "use common" without the keyword in the prompt make its first part the base / common
  prompt, as Regional Prompter does. Mask and Prompt modes are refused by name.
- **Dynamic Prompts** (`"Dynamic Prompts v2.17.1": {"args": [enabled, combinatorial, ...]}`): off, or
  combinatorial; wildcards are on (random) without it.
"""

from __future__ import annotations

import re
from typing import Any

from pipelines.schema.detailer import SECOND, Detailer
from pipelines.schema.regions import BASE, COMMON, SEPARATORS

from .a1111_controlnet import script_args
from .errors import WireError

ADETAILER_VERSION = "24.11.1"  # the ADetailer whose API this speaks (its `args` layout)
HANDLED = ("adetailer", "regional prompter", "dynamic prompts")


def handled(name: str) -> bool:
    return name.lower().startswith(HANDLED)


def adetailer(payload: dict[str, Any], task: str, warnings: list[str]) -> dict[str, Any]:
    """Our flat detailer fields from ADetailer's args: its first two passes (a third and later are said)."""
    args = script_args(payload, "adetailer", prefix=True)
    if not args:
        return {}
    flags = [a for a in args[:2] if isinstance(a, bool)]
    if flags and not flags[0]:
        return {}  # ADetailer switched off
    if len(flags) > 1 and flags[1] and task != "txt2img":
        return {}  # its skip_img2img
    passes = [a for a in args if isinstance(a, dict) and a.get("ad_tab_enable", True) not in (False, "false", 0)]
    if len(passes) > 2:
        warnings.append(f"alwayson_scripts.ADetailer: {len(passes)} passes, the first 2 run here")
    known = set(Detailer.model_fields)
    flat: dict[str, Any] = {}
    for number, values in enumerate(passes[:2]):
        suffix = "" if number == 0 else SECOND
        for key, value in values.items():
            if key in known:
                flat[key + suffix] = value
            elif key != "ad_tab_enable" and value not in (None, "", False, 0):
                warnings.append(f"alwayson_scripts.ADetailer: {key} is not supported here, ignored")
    return flat


def regional_prompter(payload: dict[str, Any], prompt: str, warnings: list[str]) -> tuple[dict[str, Any], str]:
    """Our flat region fields from Regional Prompter's positional args, and the prompt with its base/common
    keyword where the args ask for one the prompt does not write."""
    args = script_args(payload, "regional prompter", prefix=True)
    if not args or not _flag(args[0]):
        return {}, prompt
    get = lambda i, default: args[i] if len(args) > i and args[i] not in (None, "") else default  # noqa: E731
    mode = str(get(2, "Matrix"))
    if mode.lower() != "matrix":
        raise WireError(("alwayson_scripts", "Regional Prompter", "args", 2), f"{mode!r} mode is not supported here: Matrix is")
    flat = {"regional_prompts": True, "region_split": get(3, "Columns"), "region_ratios": str(get(6, "1,1")),
            "region_method": str(get(11, "Attention")).capitalize()}  # fmt: skip
    base = _number(get(7, ""))
    if base is not None:
        flat["region_base_ratio"] = base
    if _flag(get(8, False)) and BASE not in prompt:
        prompt = _first_part(prompt, BASE)
    if _flag(get(9, False)) and COMMON not in prompt:
        prompt = _first_part(prompt, COMMON)
    return flat, prompt


def dynamic_prompts(payload: dict[str, Any]) -> dict[str, Any]:
    args = script_args(payload, "dynamic prompts", prefix=True)
    if not args:
        return {}
    if not _flag(args[0]):
        return {"wildcards": "off"}
    return {"wildcards": "combinatorial" if len(args) > 1 and _flag(args[1]) else "random"}


def _first_part(prompt: str, keyword: str) -> str:
    """The prompt with its first region separator made `keyword` (Regional Prompter's "use base/common")."""
    return SEPARATORS.sub(f" {keyword} ", prompt, count=1)


def _flag(value: Any) -> bool:
    return value is True or (isinstance(value, str) and value.strip().lower() == "true") or value == 1


def _number(value: Any) -> float | None:
    """Regional Prompter's base ratio: a number, or text of one (its per-region lists: the first)."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    found = re.match(r"\s*(\d+(?:\.\d+)?)", str(value))
    return float(found.group(1)) if found else None


def ad_models(detectors: tuple[str, ...]) -> dict[str, list[str]]:
    """`GET /adetailer/v1/ad_model`: ADetailer's answer shape, "None" first as in its dropdown."""
    return {"ad_model": ["None", *detectors]}
