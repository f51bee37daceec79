"""A1111's styles: named prompt and negative-prompt snippets from a `styles.csv` (STYLES_FILE).

The file is A1111's own (its UI writes it; style packs are shared in it): CSV with the header
`name,prompt,negative_prompt`. Applied as A1111's wiki ("Styles") describes, each style in the
order asked:

| the style's text          | the result                                        |
|---------------------------|---------------------------------------------------|
| has `{prompt}`            | the style's text with the prompt in that place    |
| has none                  | the prompt, ", ", the style's text (each stripped; an empty one left out) |

The negative prompt takes the style's negative the same way. A name the file does not have is left
out, as A1111 leaves it out (a client's preset may name its own server's styles), but the result
says so, naming the styles there are.
"""

from __future__ import annotations

import csv
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from pipelines.schema.fields import shown

log = logging.getLogger(__name__)

MAX_BYTES = 4 << 20  # a style pack is kilobytes; a bigger file is not one


@dataclass(frozen=True)
class Style:
    name: str
    prompt: str
    negative_prompt: str


def read(path: Path) -> dict[str, Style]:
    """The styles of `path` by name (none where it does not exist); a row without a name is skipped."""
    path = Path(path)
    if not path.is_file():
        return {}
    if path.stat().st_size > MAX_BYTES:
        log.warning("styles file %s is over %d bytes: not read", path, MAX_BYTES)
        return {}
    with path.open(encoding="utf-8-sig", newline="") as f:
        rows = list(csv.DictReader(f, skipinitialspace=True))  # "name, prompt, negative_prompt" too
    styles = {}
    for row in rows:
        name = (row.get("name") or "").strip()
        if name:
            prompt = row.get("prompt") or row.get("text") or ""  # `text`: A1111's first format
            styles[name] = Style(name, prompt, row.get("negative_prompt") or "")
    log.info("%d style(s) read from %s", len(styles), path)
    return styles


def merge(style: str, text: str) -> str:
    """`text` with `style` applied (the table above)."""
    if "{prompt}" in style:
        return style.replace("{prompt}", text)
    return ", ".join(part for part in (text.strip(), style.strip()) if part)


def unknown_warning(offered: Collection[str], names: tuple[str, ...]) -> str:
    """What a result says of style names this server does not have (they are left out, as A1111
    leaves them out, but not silently)."""
    missing = ", ".join(shown(n, 80) for n in names)
    return (
        f"style(s) {missing} not in this server's styles (STYLES_FILE): ignored; styles: {', '.join(offered) or 'none'}"
    )


def apply(styles: Mapping[str, Style], names: tuple[str, ...], prompt: str, negative: str) -> tuple[str, str]:
    """(prompt, negative) with the styles `names` applied in order."""
    for name in names:
        style = styles[name]
        prompt, negative = merge(style.prompt, prompt), merge(style.negative_prompt, negative)
    return prompt, negative
