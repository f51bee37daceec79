"""A generated part of a docs page: the text between its two marker lines, written anew.

The pages' generators (tests/architecture_page.py, tests/suite_report.py) share this one rule.
"""

from __future__ import annotations

import re
from pathlib import Path


def with_part(page: Path, text: str, begin: str, end: str, body: str) -> str:
    """`text` (the page's) with what stands between the lines `begin` and `end` replaced by `body`."""
    pattern = re.compile(re.escape(begin) + r"\n.*?" + re.escape(end), re.S)
    if not pattern.search(text):
        raise SystemExit(f"{page}: no generated part (a line {begin!r} ... {end!r})")
    return pattern.sub(lambda _: f"{begin}\n{body}\n{end}", text)
