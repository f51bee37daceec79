"""A1111's two prompt scripts as script cells: the Prompt matrix and Prompts from file or textbox.

Both build the same `(cells, layout)` pair as the X/Y/Z plot (`engine.plots.plot_cells`), so
`engine.plots.run_script` runs them unchanged: every cell is an ordinary request, refused or run
like any other.

- Prompt matrix: the prompt's "|" parts turned on and off in every combination, one image each, on
  A1111's grid (the low bits of the combination pick the column, the high bits the row).
- Prompts from file or textbox: one request per line, a line optionally written as A1111's
  command-line options (`--prompt "a dog" --steps 3`). A1111 returns only the images for it, no
  grid: its layout is one row of unlabelled cells (legend off), and callers do not show a grid for
  it — they return the cells' images in line order.
"""

from __future__ import annotations

import logging
import math
import secrets
import shlex
from collections.abc import Callable
from typing import Any

from pipelines import GenerationRequest, from_any
from pipelines.schema.request import RANDOM_SEED_SPACE, RequestError, item_seed

from .plots import MAX_CELLS, Cell, Layout

log = logging.getLogger(__name__)
MAX_MATRIX_PARTS = 8  # 2**8 = 256 images: A1111 has no cap, but more is a mistyped prompt, not a grid
PROMPT_TYPES = ("positive", "negative")
DELIMITERS = {"comma": ", ", "space": " "}
POSITIONS = ("start", "end")
LINES_PROMPT = "(each line's prompt)"  # the request's prompt while its caller gave none beside the lines


# ---------------------------------------------------------------- Prompt matrix
def prompt_matrix_cells(
    base: GenerationRequest,
    put_at_start: bool = False,
    different_seeds: bool = False,
    prompt_type: str = "positive",
    delimiter: str = "comma",
    margin: int = 0,
) -> tuple[list[Cell], Layout]:
    """A1111's Prompt matrix of `base`: every combination of the chosen prompt's "|" parts.

    Combination k includes variable part j when bit j of k is set (k=0 is the first part alone), as
    A1111 orders its images, so a grid reads the same in both. The seed is drawn once when the
    request has none: every cell shares it (A1111's default), or cell k gets seed + k. ValueError for
    a prompt without parts, too many parts, or an unknown option; RequestError for a cell the schema
    refuses."""
    if prompt_type not in PROMPT_TYPES:
        raise ValueError(f"prompt_type must be one of {', '.join(PROMPT_TYPES)}, got {prompt_type!r}")
    if delimiter not in DELIMITERS:
        raise ValueError(f"delimiter must be one of {', '.join(DELIMITERS)}, got {delimiter!r}")
    text = base.prompts[0] if prompt_type == "positive" else base.negative_prompt or ""
    parts = text.split("|")
    n = len(parts) - 1
    if n == 0:
        raise ValueError("the prompt has no | parts to combine")
    if n > MAX_MATRIX_PARTS:
        raise ValueError(
            f"{n} | parts make {2**n} images, more than {2**MAX_MATRIX_PARTS}: use at most {MAX_MATRIX_PARTS} parts"
        )
    head = parts[0].rstrip()  # A1111 keeps it raw; "a cat | hat" still joins as "a cat, hat"
    variable = [part.strip().strip(",") for part in parts[1:]]
    seed = base.seed if base.seed is not None else secrets.randbelow(RANDOM_SEED_SPACE)
    rows = 1 << (n // 2)
    cols = 2**n // rows
    field = "prompt" if prompt_type == "positive" else "negative_prompt"
    cells = []
    for k in range(2**n):
        chosen = [part for j, part in enumerate(variable) if k >> j & 1 and part]
        pieces = [*chosen, head] if put_at_start else [head, *chosen]
        changes = {field: DELIMITERS[delimiter].join(p for p in pieces if p), "num_images": 1}
        changes["seed"] = item_seed(seed, k) if different_seeds else seed
        cells.append(Cell((k % cols, k // cols, 0), base.replace(**changes)))
    horizontal = variable[: math.ceil(n / 2)]
    vertical = variable[math.ceil(n / 2) :]
    layout = Layout(
        [_active(horizontal, c) for c in range(cols)],
        [_active(vertical, r) for r in range(rows)],
        [""],
        [("Script", "Prompt matrix"), ("Prompt matrix", text)],
        legend=True,
        margin=margin,
    )
    return cells, layout


def _active(parts: list[str], bits: int) -> str:
    """One column's or row's label: the parts it includes ("+hat +scarf"), "-" for none.

    Our grid takes one text per column (A1111 stacks every part, greying the excluded ones)."""
    included = [f"+{part}" for j, part in enumerate(parts) if bits >> j & 1]
    return " ".join(included) or "-"


# ---------------------------------------------------------------- Prompts from file or textbox
def _flag(value: str) -> bool:
    """A1111's bool options: exactly "true" is True, anything else False."""
    return value == "true"


# A1111's options (its `prompt_tags`, plus denoising_strength): name -> how its value is read.
_TYPES: dict[str, Callable[[str], Any]] = {
    "prompt": str, "negative_prompt": str, "styles": str, "sampler_name": str,
    "seed": int, "steps": int, "width": int, "height": int, "batch_size": int, "n_iter": int,
    "cfg_scale": float, "denoising_strength": float,
    # accepted and ignored here: what they set has no counterpart in our requests
    "outpath_samples": str, "outpath_grids": str, "prompt_for_display": str, "sd_model": str,
    "subseed": int, "seed_resize_from_h": int, "seed_resize_from_w": int, "sampler_index": int,
    "subseed_strength": float,
    "restore_faces": _flag, "tiling": _flag, "do_not_save_samples": _flag, "do_not_save_grid": _flag,
}  # fmt: skip
_IGNORED = frozenset(
    {
        "outpath_samples", "outpath_grids", "prompt_for_display", "subseed", "subseed_strength",
        "seed_resize_from_h", "seed_resize_from_w", "sampler_index", "restore_faces", "tiling",
        "do_not_save_samples", "do_not_save_grid", "sd_model",
    }
)  # fmt: skip
_RENAMED = {"steps": "steps", "cfg_scale": "guidance_scale", "width": "width", "height": "height",
            "denoising_strength": "strength"}  # fmt: skip


def prompts_from_text_cells(
    base: GenerationRequest,
    text: str,
    iterate_seed: bool = False,
    same_seed: bool = False,
    position: str = "start",
    base_prompt: str | None = None,
) -> tuple[list[Cell], Layout]:
    """A1111's "Prompts from file or textbox": one cell per non-blank line of `text`, at (i, 0, 0).

    `base_prompt` is the text joined to each line's prompt (None: base's own). A1111's clients send
    an empty prompt beside the lines, which a request cannot hold: they pass "" here and any prompt
    in `base`, and a line then needs a prompt of its own.

    A line's options change a copy of `base`; its prompt is joined to base's (before it for "start",
    after it for "end"). Seeds as A1111: one seed drawn for all lines when iterating or sharing it
    and `base` has none (otherwise each line draws its own); iterating adds base's image count per
    line; a line's --seed wins. ValueError naming the line for a value the schema refuses."""
    if position not in POSITIONS:
        raise ValueError(f"position must be one of {', '.join(POSITIONS)}, got {position!r}")
    lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not lines:
        raise ValueError("no prompts: one per line")
    if len(lines) > MAX_CELLS:
        raise ValueError(f"{len(lines)} lines, more than {MAX_CELLS}: split the list")
    seed = base.seed
    if (iterate_seed or same_seed) and seed is None:
        seed = secrets.randbelow(RANDOM_SEED_SPACE)
    cells = []
    for i, (number, line) in enumerate(lines):
        line_seed = item_seed(seed, i * base.num_images) if iterate_seed and seed is not None else seed
        options = _options(line, number)
        if base_prompt == "" and "prompt" not in options:
            raise ValueError(f"line {number}: no prompt (--prompt), and the request has none")
        changes = {"seed": line_seed, **_changes(base, options, position, base_prompt)}
        try:
            request = base.replace(**changes)
        except RequestError as exc:
            raise ValueError(f"line {number}: {exc}") from exc
        cells.append(Cell((i, 0, 0), request))
    layout = Layout(
        [f"{i + 1}" for i in range(len(cells))], [""], [""], [("Script", "Prompts from file or textbox")], legend=False
    )
    return cells, layout


def _options(line: str, number: int) -> dict[str, Any]:
    """A line's options: its A1111 options when it has "--" and they parse, else the line as the prompt.

    A1111 logs a line it cannot parse and uses the whole line as the prompt; so do we."""
    if "--" not in line:
        return {"prompt": line}
    try:
        options = _parse(shlex.split(line))
    except ValueError as exc:
        log.warning("prompts from text, line %d: %s; the whole line is the prompt", number, exc)
        return {"prompt": line}
    for name in sorted(options.keys() & _IGNORED):
        log.info("prompts from text, line %d: --%s does nothing here, ignored", number, name)
    return options


def _parse(tokens: list[str]) -> dict[str, Any]:
    """A1111's `cmdargs`: `--name value` pairs; --prompt and --negative_prompt take every token up
    to the next `--x`. ValueError for anything else (A1111's assert or IndexError)."""
    out: dict[str, Any] = {}
    pos = 0
    while pos < len(tokens):
        token = tokens[pos]
        if not token.startswith("--"):
            raise ValueError(f"{token!r} is not an option (--name value)")
        name = token[2:]
        if name not in _TYPES:
            raise ValueError(f"unknown option --{name}")
        if pos + 1 >= len(tokens):
            raise ValueError(f"--{name} has no value")
        if name in ("prompt", "negative_prompt"):
            words = [tokens[pos + 1]]  # the first word is taken as it is, as A1111 does
            pos += 2
            while pos < len(tokens) and not tokens[pos].startswith("--"):
                words.append(tokens[pos])
                pos += 1
            out[name] = " ".join(words)
            continue
        out[name] = _TYPES[name](tokens[pos + 1])  # int("x") and float("x") raise ValueError
        pos += 2
    return out


def _changes(base: GenerationRequest, options: dict[str, Any], position: str, base_prompt: str | None) -> dict[str, Any]:
    """The request fields a line's options set (our names), its prompts joined to base's."""
    changes: dict[str, Any] = {_RENAMED[name]: value for name, value in options.items() if name in _RENAMED}
    prompt = base.prompts[0] if base_prompt is None else base_prompt
    for name, base_text in (("prompt", prompt), ("negative_prompt", base.negative_prompt or "")):
        if name in options:
            line_text = options[name]
            joined = f"{line_text} {base_text}" if position == "start" else f"{base_text} {line_text}"
            changes[name] = joined if line_text and base_text else line_text
    if "seed" in options:
        changes["seed"] = options["seed"]  # a negative one is random (the schema's -1)
    if "sampler_name" in options:
        changes["sampler"] = from_any(options["sampler_name"]).sampler or None
    if "batch_size" in options or "n_iter" in options:
        changes["num_images"] = options.get("batch_size", base.num_images) * options.get("n_iter", 1)
    if "styles" in options:
        changes["styles"] = tuple(name.strip() for name in options["styles"].split(",") if name.strip())
    return changes
