"""The axes of an X/Y/Z plot: which parameter each varies, and its values as A1111 writes them.

A1111's API clients name an axis by its index in A1111's own list (`AXES`: txt2img and img2img each
see the entries of their mode), so that list is kept in A1111's order, each entry mapped to the
request field it varies here, or to why it cannot vary here (refused when chosen, never ignored).
Our own fields A1111 has no axis for (guidance end, step cache, ...) are derived from the request
schema and follow A1111's entries, so a field added to the schema gets its axis without a change
here; each loaded LoRA's scale gets one too.

Values are A1111's: a comma list (CSV quoting for values holding commas), ranges for numbers
(`1-5`, `1-5 (+2)`, `10-20 [3]`), `512x768` for Size, and for Prompt S/R the first value is the
text searched in the prompts and each value (itself included) replaces it.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipelines.schema.fields import RequestError, decimal, whole
from pipelines.schema.request import fields, spec

MAX_VALUES = 100  # values of one axis: a plot is at most 100 x 100 x 100 requests before the engine's limits


@dataclass(frozen=True)
class AxisType:
    """One parameter a plot can vary.

    kind: how its values are read and applied — "whole" | "number" (a request field, ranges allowed),
    "choice" (a field's value from a list), "sampler", "schedule", "replace" (Prompt S/R), "size",
    "model" (a checkpoint switch), "lora" (one LoRA's scale), "unit" (the first ControlNet unit's weight or
    image prompt's scale), "nothing", "off" (A1111 has it, we do not: `why` says so).
    """

    name: str  # A1111's label where A1111 has the axis, else the schema's label
    kind: str
    field: str | None = None  # the request field it sets (kind whole/number/choice; "hires_steps": the hires fix's)
    why: str = ""
    labelled: bool = True  # a cell's label names the axis ("Steps: 20"); samplers, S/R and models show the value only
    lora: str = ""
    unit: str = ""  # kind "unit": the first ControlNet unit's or image prompt's attribute it sets ("weight")

    def label(self, value: Any) -> str:
        """The grid's legend for one value (A1111's `format_value_add_label` / `format_value`)."""
        if self.kind == "nothing":
            return ""
        if self.kind == "size":
            text = f"{value[0]}x{value[1]}"
        elif isinstance(value, float):
            text = repr(round(value, 8))  # A1111's: "CFG Scale: 7.0"
        else:
            text = "-1" if value is None else str(value)  # a seed kept random
        return f"{self.name}: {text}" if self.labelled else text


# A1111 1.10.1's axis_options, in its order: (label, mode, what it is here). mode: "" both, "t" txt2img
# only, "i" img2img only. A field name maps to that request field; "off:<why>" cannot vary here.
_NOT_HERE = "off:this server has no such parameter"
_A1111 = (
    ("Nothing", "", "nothing"),
    ("Seed", "", "seed"),
    ("Var. seed", "", "off:variation seeds are not offered here"),
    ("Var. strength", "", "off:variation seeds are not offered here"),
    ("Steps", "", "steps"),
    ("Hires steps", "t", "hires_steps"),
    ("CFG Scale", "", "guidance_scale"),
    ("Image CFG Scale", "i", "image_guidance_scale"),
    ("Prompt S/R", "", "replace"),
    ("Prompt order", "", "off:prompt order permutations are not offered here; use Prompt S/R"),
    ("Sampler", "t", "sampler"),
    ("Hires sampler", "t", "hires_sampler"),
    ("Sampler", "i", "sampler"),
    ("Checkpoint name", "", "model"),
    ("Negative Guidance minimum sigma", "", _NOT_HERE),
    ("Sigma Churn", "", _NOT_HERE),
    ("Sigma min", "", _NOT_HERE),
    ("Sigma max", "", _NOT_HERE),
    ("Sigma noise", "", _NOT_HERE),
    ("Schedule type", "", "schedule"),
    ("Schedule min sigma", "", _NOT_HERE),
    ("Schedule max sigma", "", _NOT_HERE),
    ("Schedule rho", "", _NOT_HERE),
    ("Beta schedule alpha", "", _NOT_HERE),
    ("Beta schedule beta", "", _NOT_HERE),
    ("Eta", "", _NOT_HERE),
    ("Clip skip", "", "clip_skip"),
    ("Denoising", "", "strength"),
    ("Initial noise multiplier", "", _NOT_HERE),
    ("Extra noise", "", _NOT_HERE),
    ("Hires upscaler", "t", "hires_upscaler"),
    ("Cond. Image Mask Weight", "i", _NOT_HERE),
    ("VAE", "", "off:the VAE is the model's own here"),
    ("Styles", "", "styles"),
    ("UniPC Order", "", _NOT_HERE),
    ("Face restore", "", _NOT_HERE),
    ("Token merging ratio", "", _NOT_HERE),
    ("Token merging ratio high-res", "", _NOT_HERE),
    ("Always discard next-to-last sigma", "", _NOT_HERE),
    ("SGM noise multiplier", "", _NOT_HERE),
    ("Refiner checkpoint", "", "off:refiners are not offered here"),
    ("Refiner switch at", "", "off:refiners are not offered here"),
    ("RNG source", "", _NOT_HERE),
    ("FP8 mode", "", _NOT_HERE),
    ("Size", "", "size"),
)
# sd-webui-controlnet's axes (appended to A1111's list by the extension) and the IP-Adapter's: the first unit's value.
_UNITS = (("[ControlNet] Weight", "controlnet", "weight"), ("[IP-Adapter] Scale", "ip_adapter", "scale"))
_VALUE_ONLY = {"sampler", "replace", "model", "choice"}  # A1111's format_value axes (and our choices)
# Fields that are not a plot's to vary: what the request is about, or how many images a cell makes.
_NOT_AXES = {"prompt", "negative_prompt", "num_images", "width", "height", "loras", "init_images", "inpaint", "mask"}


def _a1111_type(label: str, what: str) -> AxisType:
    if what.startswith("off:"):
        return AxisType(label, "off", why=what.removeprefix("off:"))
    if what in ("nothing", "replace", "size", "model", "sampler", "schedule"):
        return AxisType(label, what, labelled=what not in _VALUE_ONLY)
    kind = "names" if what == "styles" else spec(what).kind
    return AxisType(label, kind, field=what, labelled=what not in _VALUE_ONLY)


def axis_types(mode: str, loras: Sequence[str] = ()) -> list[AxisType]:
    """Every axis a plot of `mode` ("txt2img" | "img2img") offers, at A1111's index for A1111's axes:
    A1111's of that mode, the ControlNet extension's weight and the image prompt's scale, then our
    schema's fields A1111 lacks, then one per LoRA in `loras`. A1111's txt2img "Denoising" is the
    hires fix's strength."""
    letter = mode[0]
    own = [
        _a1111_type(label, "hires_strength" if what == "strength" and mode == "txt2img" else what)
        for label, m, what in _A1111
        if m in ("", letter)
    ]
    units = [AxisType(label, "unit", field=field, unit=attr) for label, field, attr in _UNITS]
    taken = {what for _, _, what in _A1111} | _NOT_AXES
    taken |= {s.name for s in fields() if s.path[0] == "hires"}  # A1111's Hires axes above; the rest are the form's
    tasks = {"txt2img": {"txt2img"}, "img2img": {"img2img", "inpaint"}}[mode]
    extra = [
        AxisType(s.about.label, s.kind, field=s.name, labelled=s.kind != "choice")
        for s in fields()
        if s.name not in taken and s.kind in ("whole", "number", "choice") and s.about.tasks & tasks
    ]
    return [*own, *units, *extra, *(AxisType(f"LoRA: {name}", "lora", lora=name) for name in loras)]


def find_axis(types: Sequence[AxisType], key: int | str) -> AxisType:
    """The axis `key` names: A1111's index (what its API clients send) or a label, any case."""
    if isinstance(key, bool):
        raise ValueError(f"{key!r} is not an axis")
    if isinstance(key, int) or (isinstance(key, str) and key.strip().isdigit()):
        index = int(key)
        if not 0 <= index < len(types):
            raise ValueError(f"axis {index} does not exist: 0..{len(types) - 1}")
        return types[index]
    wanted = str(key).strip().casefold()
    for axis in types:
        if axis.name.casefold() == wanted:
            return axis
    raise ValueError(f"unknown axis {str(key)[:60]!r}; axes: {', '.join(t.name for t in types if t.kind != 'off')}")


# ---------------------------------------------------------------- values
_INT_RANGE = re.compile(r"\s*([+-]?\s*\d+)\s*-\s*([+-]?\s*\d+)(?:\s*\(([+-]\d+)\s*\))?\s*")
_INT_COUNT = re.compile(r"\s*([+-]?\s*\d+)\s*-\s*([+-]?\s*\d+)\s*\[(\d+)\s*\]\s*")
_FLOAT = r"[+-]?\s*\d+(?:\.\d*)?"
_FLOAT_RANGE = re.compile(rf"\s*({_FLOAT})\s*-\s*({_FLOAT})(?:\s*\(([+-]\d+(?:\.\d*)?)\s*\))?\s*")
_FLOAT_COUNT = re.compile(rf"\s*({_FLOAT})\s*-\s*({_FLOAT})\s*\[(\d+)\s*\]\s*")
_SIZE = re.compile(r"\s*(\d+)\s*[xX×]\s*(\d+)\s*")


def split_values(text: str) -> list[str]:
    """A1111's value list: comma separated, CSV quoting for a value with a comma; blanks dropped."""
    rows = list(csv.reader(io.StringIO(text), skipinitialspace=True))
    return [item.strip() for row in rows for item in row if item.strip()]


def _num(text: str) -> str:
    return text.replace(" ", "")


def _count(n: int | str) -> int:
    """A range's number of values, refused beyond MAX_VALUES before any is made."""
    n = int(n)
    if n > MAX_VALUES:
        raise ValueError(f"{n} values, more than {MAX_VALUES}")
    return n


def _int_items(item: str) -> list[int]:
    """One item of an integer axis: a number, `a-b`, `a-b (+step)` or `a-b [count]`."""
    count = _INT_COUNT.fullmatch(item)
    if count:
        start, end, n = int(_num(count[1])), int(_num(count[2])), _count(count[3])
        return [int(start + (end - start) * i / (n - 1)) if n > 1 else start for i in range(n)]
    span = _INT_RANGE.fullmatch(item)
    if span:
        start, end, step = int(_num(span[1])), int(_num(span[2])), int(span[3] or 1)
        if step == 0:
            raise ValueError("a step of 0")
        values = range(start, end + 1, step) if step > 0 else range(start, end - 1, step)
        _count(len(values))  # counted before it is made: `1-1000000000` is refused, not built
        return list(values)
    return [whole(item)]


def _float_items(item: str) -> list[float]:
    """One item of a number axis: a number, `a-b` (step 1), `a-b (+step)` or `a-b [count]`."""
    count = _FLOAT_COUNT.fullmatch(item)
    if count:
        start, end, n = float(_num(count[1])), float(_num(count[2])), _count(count[3])
        return [round(start + (end - start) * i / (n - 1), 8) if n > 1 else start for i in range(n)]
    span = _FLOAT_RANGE.fullmatch(item)
    if span:
        start, end, step = float(_num(span[1])), float(_num(span[2])), float(span[3] or 1)
        if step == 0:
            raise ValueError("a step of 0")
        n = _count(max(0, int((end - start) / step + 1e-9) + 1))
        return [round(start + i * step, 8) for i in range(n)]
    return [decimal(item)]


def parse_values(axis: AxisType, values: str | Sequence[Any]) -> list[Any]:
    """The values of `axis` from A1111's text (or a list, as a picker gives), expanded and checked;
    ValueError naming the value otherwise."""
    if axis.kind == "off":
        raise ValueError(f"{axis.name} cannot vary here: {axis.why}")
    if axis.kind == "nothing":
        return [None]
    items = split_values(values) if isinstance(values, str) else [str(v).strip() for v in values if str(v).strip()]
    if not items:
        raise ValueError(f"{axis.name}: no values")
    out: list[Any] = []
    for item in items:
        out.extend(_read(axis, item))
        if len(out) > MAX_VALUES:
            raise ValueError(f"{axis.name}: more than {MAX_VALUES} values")
    if not out:  # `5-1` counts up from 5 to 1: nothing (a step down is written `5-1 (-1)`)
        raise ValueError(f"{axis.name}: no values in {str(values)[:60]!r} (a range down needs a negative step: 5-1 (-1))")
    return out


def _read(axis: AxisType, item: str) -> list[Any]:
    try:
        if axis.kind == "size":
            size = _SIZE.fullmatch(item)
            if not size:
                raise ValueError("expected WIDTHxHEIGHT, such as 512x768")
            return [(int(size[1]), int(size[2]))]
        if axis.kind == "whole":
            found = _int_items(item)
        elif axis.kind in ("number", "lora", "unit"):
            found = _float_items(item)
        else:
            return [item]
        if axis.field is not None and axis.kind != "unit":
            found = [spec(axis.field).parse(v) for v in found]  # a seed of -1 is None: random
        return found
    except (ValueError, RequestError) as exc:
        raise ValueError(f"{axis.name}: {item[:60]!r}: {_detail(exc)}") from None


def _detail(exc: Exception) -> str:
    return exc.detail if isinstance(exc, RequestError) else str(exc)
