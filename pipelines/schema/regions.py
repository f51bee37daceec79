"""Regional prompts' part of a request (`Regions`): Regional Prompter's matrix of regions, each with its own prompt.

The prompt carries the regions as Regional Prompter writes them: `ADDCOL` / `ADDROW` (or `BREAK`)
between the regions' prompts in reading order, an optional base prompt before `ADDBASE` (blended into
every region by `region_base_ratio`) and a common prompt before `ADDCOMM` (prefixed to every region's).
`region_ratios` is Regional Prompter's "Divide Ratio": `1,2` is two bands of 1:2 along the main split;
`1,2,1;2,1,1` two bands (each group's first number its share, the rest its cells across).

Torch-free like the rest of the schema: the layout (`layout`) and the prompt's split (`split_prompt`)
are plain arithmetic; what runs the regions is pipelines.sampling.regional.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field, field_validator

from pipelines.schema.fields import About, Choice, Flag, Range, Schema, Text, refuse

SPLITS = ("Columns", "Rows")  # Regional Prompter's "Main splitting" (its Matrix submodes)
SPLIT_ALIASES = {"horizontal": "Columns", "vertical": "Rows"}  # its names before 2023, in old PNGs and API clients
METHODS = ("Latent", "Attention")  # Regional Prompter's "Calc mode"
BASE, COMMON, COLUMN, ROW = "ADDBASE", "ADDCOMM", "ADDCOL", "ADDROW"
SEPARATORS = re.compile(r"\b(?:ADDCOL|ADDROW|BREAK)\b")
KEYWORDS = re.compile(r"\b(?:ADDCOL|ADDROW|ADDBASE|ADDCOMM)\b")
MAX_REGIONS = 16
DEFAULT_RATIOS = "1,1"
_RATIOS = re.compile(r"^\s*\d+(?:\.\d+)?(?:\s*,\s*\d+(?:\.\d+)?)*(?:\s*;\s*\d+(?:\.\d+)?(?:\s*,\s*\d+(?:\.\d+)?)*)*\s*$")


class Regions(Schema):
    """Several prompts, each for its own part of the picture (Regional Prompter's Matrix mode).

    In a request only when on: `regional_prompts`, or a prompt written with `ADDCOL`/`ADDROW`
    (`pipelines.schema.request.nest` and `GenerationRequest` turn it on for such a prompt)."""

    regional_prompts: Annotated[bool, Flag(), About("Regional prompts", infotext="RP Active")] = Field(
        False, description="split the picture into regions, each drawn from its own part of the prompt (ADDCOL / ADDROW / BREAK)"
    )  # fmt: skip
    region_split: Annotated[str, Choice(SPLITS, tuple(SPLIT_ALIASES.items())), About("Main splitting", infotext="RP Matrix submode")] = Field(
        "Columns", description="the regions side by side (Columns) or stacked (Rows); with ';' in the ratios, the bands' direction"
    )  # fmt: skip
    region_ratios: Annotated[str, Text(), About("Divide ratio", infotext="RP Ratios")] = Field(
        DEFAULT_RATIOS, description="the regions' shares: '1,2' two bands 1:2; '1,2,1;1,1' bands with cells (each group: its share, then its cells')"
    )  # fmt: skip
    region_base_ratio: Annotated[float, Range(0.0, 1.0), About("Base ratio", infotext="RP Base Ratios", step=0.05)] = Field(
        0.2, description="how much of the base prompt (before ADDBASE) every region takes; 0 without one"
    )  # fmt: skip
    region_method: Annotated[str, Choice(METHODS), About("Calc mode", infotext="RP Calc Mode")] = Field(
        "Latent", description="Latent: each region denoised with its prompt and blended by its area (one denoiser call per region, any SD/SDXL); Attention: one call, cross-attention masked per region"
    )  # fmt: skip

    @field_validator("region_ratios")
    @classmethod
    def _ratios(cls, value: str) -> str:
        if not _RATIOS.match(value or ""):
            raise refuse(f"{value!r} is not a divide ratio: numbers separated by ',' (and ';' between bands), e.g. 1,1 or 1,2;1,1,1")
        if any(float(x) <= 0 for x in re.split(r"[,;]", value)):
            raise refuse(f"{value!r}: every share must be more than 0")
        return value.strip()


@dataclass(frozen=True)
class Box:
    """One region: fractions of the picture's width and height, left/top inclusive."""

    left: float
    top: float
    right: float
    bottom: float


@dataclass(frozen=True)
class Split:
    """A prompt split the way Regional Prompter reads it."""

    base: str | None  # before ADDBASE
    regions: tuple[str, ...]  # each with the common prompt (before ADDCOMM) in front
    rows: bool  # written with ADDROW (and no ADDCOL): the regions are stacked


def split_prompt(prompt: str) -> Split:
    """The base, the regions' prompts (common part prefixed) and the keyword's direction."""
    base = None
    if BASE in prompt:
        base, prompt = (part.strip() for part in prompt.split(BASE, 1))
    common = ""
    if COMMON in prompt:
        common, prompt = (part.strip() for part in prompt.split(COMMON, 1))
    rows = ROW in prompt and COLUMN not in prompt
    parts = [part.strip(" ,") for part in SEPARATORS.split(prompt)]
    regions = tuple(" ".join(p for p in (common, part) if p).strip() for part in parts)
    return Split(base or None, regions, rows)


def is_regional(prompt: str) -> bool:
    """A prompt written for Regional Prompter (a keyword only it reads)."""
    return bool(KEYWORDS.search(prompt))


def layout(ratios: str, count: int, split: str) -> list[Box]:
    """The regions' boxes in reading order. A 1-D ratio list that is the default but does not match
    `count` means equal shares (Regional Prompter's users leave "1,1" for three columns and mean it)."""
    groups = [[float(x) for x in group.split(",")] for group in ratios.split(";")]
    if len(groups) == 1:
        shares = groups[0]
        if len(shares) != count and ratios.strip() == DEFAULT_RATIOS:
            shares = [1.0] * count
        cells = [(s, [1.0]) for s in shares]
    else:
        cells = [(g[0], g[1:] or [1.0]) for g in groups]
    found = sum(len(sub) for _, sub in cells)
    if found != count:
        raise ValueError(f"the divide ratio {ratios!r} makes {found} regions but the prompt has {count} (ADDCOL/ADDROW/BREAK)")
    boxes = []
    total = sum(s for s, _ in cells)
    start = 0.0
    for share, sub in cells:
        end = start + share / total
        across, subtotal = 0.0, sum(sub)
        for part in sub:
            stop = across + part / subtotal
            boxes.append(Box(across, start, stop, end) if split == "Rows" else Box(start, across, end, stop))
            across = stop
        start = end
    return boxes
