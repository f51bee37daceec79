"""A1111's prompt language, read into weighted pieces: what a prompt from A1111, Forge, Civitai or
SillyTavern means before it reaches a text encoder.

The behaviour restated here is the one A1111's wiki ("Features", attention/emphasis) documents
(A1111's own parser is AGPL and not copied):

| written            | means                                          |
|--------------------|------------------------------------------------|
| `(text)`           | text's weight x 1.1; nesting multiplies: `((a))` = 1.21 |
| `[text]`           | text's weight / 1.1                            |
| `(text:1.5)`       | text's weight x 1.5 (any number, 0 and negative included) |
| `\\(` `\\)` `\\[` `\\]` `\\\\` | the character itself, no weight       |
| `BREAK` (a word, capitals) | starts a new chunk of the text encoder's window |
| an unclosed `(` / `[` | weights the rest of the prompt, as if closed at the end |
| a `)` / `]` / `:1.5)` with nothing open | plain text |

Adjacent pieces of the same weight are merged. A prompt without any of this is `plain`: it goes to
the pipeline as the text it is (bit-identical to before this module).
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass

EMPHASIS = 1.1  # `(x)` multiplies by this, `[x]` divides by it
_TOKEN = re.compile(
    r"""\\[()\[\]\\]            # an escaped bracket or backslash: the character itself
      |[(\[]                   # an opening bracket
      |:\s*([+-]?[.\d]+)\s*\)  # `:weight)`, closing a round bracket with that weight
      |[)\]]                   # a closing bracket
      |[^\\()\[\]:]+           # text
      |[\\:]                   # a lone backslash or colon: text
    """,
    re.VERBOSE,
)
_BREAK = re.compile(r"\s*\bBREAK\b\s*")


@dataclass(frozen=True)
class Piece:
    """A run of prompt text and its weight; `text` is None for a BREAK."""

    text: str | None
    weight: float = 1.0

    @property
    def is_break(self) -> bool:
        return self.text is None


@dataclass(frozen=True)
class Parsed:
    """A prompt read as weighted pieces."""

    source: str
    pieces: tuple[Piece, ...]

    @property
    def weighted(self) -> bool:
        return any(not p.is_break and p.weight != 1.0 for p in self.pieces)

    @property
    def has_break(self) -> bool:
        return any(p.is_break for p in self.pieces)

    @property
    def text(self) -> str:
        """The words without the syntax (a BREAK as a space): what an encoder that takes no weights gets."""
        return "".join(" " if p.is_break else p.text for p in self.pieces)

    @property
    def plain(self) -> bool:
        """Nothing to do: no weight, no BREAK and no syntax character, so the text is the prompt as written."""
        return not self.weighted and not self.has_break and self.text == self.source


@functools.lru_cache(maxsize=512)  # a prompt is read several times per request: parse it once
def parse(prompt: str) -> Parsed:
    """`prompt`'s weighted pieces, as A1111 reads them (the table above)."""
    runs: list[list] = []  # [text | None, weight]
    round_open: list[int] = []
    square_open: list[int] = []

    def scale(start: int, factor: float) -> None:
        for run in runs[start:]:
            if run[0] is not None:
                run[1] *= factor

    for match in _TOKEN.finditer(prompt):
        token, weight = match.group(0), match.group(1)
        if token.startswith("\\") and len(token) == 2:
            runs.append([token[1], 1.0])
        elif token == "(":
            round_open.append(len(runs))
        elif token == "[":
            square_open.append(len(runs))
        elif weight is not None and round_open and _number(weight) is not None:
            scale(round_open.pop(), _number(weight))
        elif token == ")" and round_open:
            scale(round_open.pop(), EMPHASIS)
        elif token == "]" and square_open:
            scale(square_open.pop(), 1 / EMPHASIS)
        else:
            for i, part in enumerate(_BREAK.split(token)):
                if i:
                    runs.append([None, -1.0])
                runs.append([part, 1.0])
    for start in round_open:
        scale(start, EMPHASIS)
    for start in square_open:
        scale(start, 1 / EMPHASIS)
    return Parsed(prompt, _merged(runs))


def _number(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:  # "1.2.3": A1111's pattern matches it, but it is no number: plain text
        return None
    return value if math.isfinite(value) else None  # 400 nines: an infinite weight would give NaN images


def _merged(runs: list[list]) -> tuple[Piece, ...]:
    """Adjacent runs of one weight joined, empty text dropped (a prompt of nothing is one empty piece)."""
    out: list[Piece] = []
    for text, weight in runs:
        if text is None:
            out.append(Piece(None, -1.0))
        elif not text:
            continue
        elif out and not out[-1].is_break and out[-1].weight == weight:
            out[-1] = Piece(out[-1].text + text, weight)
        else:
            out.append(Piece(text, weight))
    return tuple(out) or (Piece("", 1.0),)
