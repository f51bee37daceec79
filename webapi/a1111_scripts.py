"""A1111's selectable scripts through its API: `script_name` + `script_args` as A1111 orders them.

Three scripts, by A1111's lower-case names: "x/y/z plot", "prompt matrix" and "prompts from file or
textbox". Each turns the request into cells (`engine.plots`, `engine.prompt_scripts`) that run
through the engine like any request. The answer is A1111's: the grid first, then the sub-grids
and the cell images where the script's options ask (the X/Y/Z plot) or always (the prompt matrix);
"prompts from file" returns the lines' images only.

A1111's argument lists, documented in docs/scripts.md:
- X/Y/Z plot (18): x_type, x_values, x_values_dropdown, y_type, y_values, y_values_dropdown, z_type,
  z_values, z_values_dropdown, draw_legend, include_lone_images, include_sub_grids, no_fixed_seeds,
  vary_seeds_x, vary_seeds_y, vary_seeds_z, margin_size, csv_mode. Releases before 1.7 send 15 (no
  vary_seeds_*), also taken. An axis type is its index in A1111's list for the tab (engine.axes).
- Prompt matrix (5): put_at_start, different_seeds, prompt_type, variations_delimiter, margin_size.
- Prompts from file or textbox (4): checkbox_iterate, checkbox_iterate_batch, prompt_position, prompt_txt
  (3 in older releases, without prompt_position).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.axes import AxisType, axis_types, find_axis
from engine.plots import MAX_MARGIN, Cell, Layout, named_plot
from engine.prompt_scripts import LINES_PROMPT, prompt_matrix_cells, prompts_from_text_cells
from pipelines import GenerationRequest, GenerationResult, ModelInfo

from .errors import WireError

XYZ, MATRIX, FROM_TEXT = "x/y/z plot", "prompt matrix", "prompts from file or textbox"
SCRIPTS = (MATRIX, FROM_TEXT, XYZ)  # A1111's order in /sdapi/v1/scripts
_CHOICE_KINDS = {"sampler", "schedule", "model", "names", "choice"}  # A1111's dropdown axes


@dataclass(frozen=True)
class Script:
    """A script's cells, their layout, and what the answer includes besides the grid."""

    name: str
    cells: list[Cell]
    layout: Layout
    grid: bool = True  # "prompts from file" has none
    sub_grids: bool = False
    lone_images: bool = False


def find(name: str) -> str:
    """A1111 matches the script's title without case; an unknown one is a 422 naming the script."""
    wanted = name.strip().casefold()
    if wanted not in SCRIPTS:
        raise WireError(("script_name",), f"Script '{name[:80]}' not found; scripts here: {', '.join(SCRIPTS)}")
    return wanted


PLACEHOLDER = LINES_PROMPT  # the request's prompt while A1111's client sent none beside the lines


def needs_no_prompt(payload: dict[str, Any]) -> bool:
    """"Prompts from file" with an empty prompt (what webuiapi sends): the lines carry the prompts."""
    name = str(payload.get("script_name") or "").strip().casefold()
    return name == FROM_TEXT and not str(payload.get("prompt") or "").strip()


def readable(payload: dict[str, Any]) -> dict[str, Any]:
    """The body the request is read from: with PLACEHOLDER as its prompt where `needs_no_prompt`."""
    return {**payload, "prompt": PLACEHOLDER} if needs_no_prompt(payload) else payload


def build(name: str, args: Any, request: GenerationRequest, mode: str, model: ModelInfo, no_prompt: bool = False) -> Script:
    """The script `name` run on `request` with A1111's `script_args`; 422 naming the argument if wrong.
    `no_prompt`: the caller sent none (`needs_no_prompt`), `request` holds PLACEHOLDER."""
    if not isinstance(args, list):
        raise WireError(("script_args",), "must be a list (the script's arguments in A1111's order)")
    try:
        if name == XYZ:
            return _xyz(args, request, mode, model)
        if name == MATRIX:
            a = _padded(args, 5, [False, False, "positive", "comma", 0])
            cells, layout = prompt_matrix_cells(request, bool(a[0]), bool(a[1]), str(a[2]), str(a[3]), _int(a[4]))
            return Script(name, cells, layout, lone_images=True)
        a = args if len(args) != 3 else [*args[:2], "start", args[2]]
        a = _padded(a, 4, [False, False, "start", ""])
        cells, layout = prompts_from_text_cells(
            request, str(a[3] or ""), bool(a[0]), bool(a[1]), str(a[2]), "" if no_prompt else None
        )
        return Script(name, cells, layout, grid=False, lone_images=True)
    except WireError:
        raise
    except ValueError as exc:
        raise WireError(("script_args",), str(exc)) from None


def _padded(args: list[Any], count: int, defaults: list[Any]) -> list[Any]:
    return [*args[:count], *defaults[len(args) :]]


def _int(value: Any) -> int:
    try:
        return max(0, min(MAX_MARGIN, int(value or 0)))
    except (TypeError, ValueError):
        raise ValueError(f"margin_size: {str(value)[:40]!r} is not a number of pixels") from None


def _xyz(args: list[Any], request: GenerationRequest, mode: str, model: ModelInfo) -> Script:
    if len(args) == 15:  # before A1111 1.7: no "vary seeds" flags
        args = [*args[:13], False, False, False, *args[13:]]
    a = _padded(args, 18, [1, "", None, 0, "", None, 0, "", None, True, False, False, False, False, False, False, 0, False])
    types = axis_types(mode, model.loras)
    named: dict[str, Any] = {}
    for i, letter in enumerate("xyz"):
        kind, text, dropdown = a[3 * i : 3 * i + 3]
        named[f"{letter}_type"] = 0 if kind is None else kind
        named[f"{letter}_values"] = _values(types, kind, text, dropdown, bool(a[17]))
    named.update(legend=bool(a[9]), include_lone_images=bool(a[10]), include_sub_grids=bool(a[11]),
                 keep_random_seeds=bool(a[12]), vary_seeds=[bool(v) for v in a[13:16]], margin=_int(a[16]))  # fmt: skip
    cells, layout, options = named_plot(request, mode, model.loras, named)
    return Script(XYZ, cells, layout, sub_grids=options.include_sub_grids, lone_images=options.include_lone_images)


def _values(types: Sequence[AxisType], kind: Any, text: Any, dropdown: Any, csv_mode: bool) -> Any:
    """An axis's values: A1111 reads a picker axis's from its list unless `csv_mode`; a client that
    sends the text only is read from the text (A1111 would fail on the missing list)."""
    try:
        axis_type = find_axis(types, 0 if kind is None else kind)
    except ValueError:
        return text  # named_plot refuses the axis, naming it
    if axis_type.kind in _CHOICE_KINDS and not csv_mode and isinstance(dropdown, list) and dropdown:
        return [str(v) for v in dropdown]
    return str(text or "")


def script_info_fields(info: dict[str, Any], result: GenerationResult, grids: int) -> dict[str, Any]:
    """A1111's `info` for a script's answer: the images after the grids are the ones its lists describe
    (A1111 lists no prompt or seed for a grid, and `index_of_first_image` is 1 after one), each with
    the prompt it was made with (a prompt matrix or a file's lines differ from the request's)."""
    metas, seeds = result.metadata[grids:], result.seeds[grids:]
    out = {**info, "index_of_first_image": 1 if grids else 0, "all_seeds": seeds, "all_subseeds": seeds,
           "all_prompts": [m.get("prompt", "") for m in metas],
           "all_negative_prompts": [m.get("negative_prompt") or "" for m in metas]}  # fmt: skip
    if info.get("prompt") == PLACEHOLDER:
        out["prompt"] = metas[0].get("prompt", "") if metas else ""
    return out


# ---------------------------------------------------------------- listings
def scripts() -> dict[str, list[str]]:
    """/sdapi/v1/scripts: the selectable scripts of each tab."""
    return {"txt2img": list(SCRIPTS), "img2img": list(SCRIPTS)}


def _arg(label: str, value: Any, choices: list[str] | None = None, low: Any = None, high: Any = None, step: Any = None) -> dict:
    return {"label": label, "value": value, "minimum": low, "maximum": high, "step": step, "choices": choices}


def script_info(model: ModelInfo) -> list[dict[str, Any]]:
    """/sdapi/v1/script-info: each script's arguments (labels, defaults, choices) per tab; the X/Y/Z
    plot's axis choices are the labels at A1111's indices, which is how clients find an index."""
    out = []
    for img2img in (False, True):
        labels = [t.name for t in axis_types("img2img" if img2img else "txt2img", model.loras)]
        axis_args = []
        for i, name in enumerate("XYZ"):
            axis_args += [_arg(f"{name} type", "Seed" if i == 0 else "Nothing", labels), _arg(f"{name} values", ""),
                          _arg(f"{name} values", None)]  # fmt: skip
        flags = ["Draw legend", "Include Sub Images", "Include Sub Grids", "Keep -1 for seeds", "Vary seeds for X",
                 "Vary seeds for Y", "Vary seeds for Z"]  # fmt: skip
        xyz = [*axis_args, *(_arg(f, f == "Draw legend") for f in flags), _arg("Grid margins (px)", 0, None, 0, MAX_MARGIN, 2),
               _arg("Use text inputs instead of dropdowns", False)]  # fmt: skip
        matrix = [_arg("Put variable parts at start of prompt", False), _arg("Use different seed for each picture", False),
                  _arg("Select prompt", "positive", ["positive", "negative"]),
                  _arg("Select joining char", "comma", ["comma", "space"]), _arg("Grid margins (px)", 0, None, 0, MAX_MARGIN, 2)]  # fmt: skip
        from_text = [_arg("Iterate seed every line", False), _arg("Use same random seed for all lines", False),
                     _arg("Insert prompts at the", "start", ["start", "end"]), _arg("List of prompt inputs", "")]  # fmt: skip
        for name, args in ((MATRIX, matrix), (FROM_TEXT, from_text), (XYZ, xyz)):
            out.append({"name": name, "is_alwayson": False, "is_img2img": img2img, "args": args})
    return out
