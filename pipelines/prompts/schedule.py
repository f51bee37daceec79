"""A1111's prompt editing and alternation: which text a prompt is at each denoising step.

Restated from A1111's wiki ("Features": prompt editing, alternating words), not copied:

| written            | at step s of N                                                   |
|--------------------|------------------------------------------------------------------|
| `[from:to:when]`   | `from` up to step `when`, `to` after it                          |
| `[to:when]`        | nothing up to `when`, then `to`                                  |
| `[from::when]`     | `from` up to `when`, then nothing                                |
| `[a\\|b\\|c]`        | `a` at step 1, `b` at 2, `c` at 3, `a` at 4...                   |

`when` with a decimal point is a share of the steps (`0.5` of 20 is step 10), without one a step
number; it is capped at N. They nest (`[a:[b|c]:0.5]`) and may hold weights (`[(red:1.5):blue:5]`),
which `pipelines.prompts.syntax` reads in each step's text afterwards. Square brackets that are none
of these (`[blurry]`, `[a:b]`) are left as written: they are A1111's de-emphasis.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Union


@dataclass(frozen=True)
class Edit:
    before: tuple[Node, ...]
    after: tuple[Node, ...]
    when: str  # as written: "0.5" (a share) or "10" (a step)

    def switch_step(self, steps: int) -> int:
        """The last step that shows `before`."""
        value = float(self.when)
        return min(steps, int(value * steps if "." in self.when else value))


@dataclass(frozen=True)
class Alternate:
    options: tuple[tuple[Node, ...], ...]


Node = Union[str, Edit, Alternate]  # noqa: UP007 (a forward reference in a runtime alias)


@functools.lru_cache(maxsize=512)  # read at each step of a call: parse it once
def parse(prompt: str) -> tuple[Node, ...]:
    """`prompt` as text and the edits and alternations in it."""
    nodes, _ = _Parser(prompt).sequence(0, inside=0)
    return nodes


def scheduled(prompt: str) -> bool:
    """Whether `prompt` changes from step to step."""
    return "[" in prompt and any(not isinstance(node, str) for node in parse(prompt))


def text_at(nodes: tuple[Node, ...], step: int, steps: int) -> str:
    """The prompt's text at `step` (1-based) of `steps`."""
    out = []
    for node in nodes:
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, Edit):
            out.append(text_at(node.before if step <= node.switch_step(steps) else node.after, step, steps))
        else:
            out.append(text_at(node.options[(step - 1) % len(node.options)], step, steps))
    return "".join(out)


def schedule(prompt: str, steps: int) -> list[tuple[int, str]]:
    """(last step, text) runs covering steps 1..`steps`; one run for a prompt that does not change."""
    if not scheduled(prompt):
        return [(steps, prompt)]
    nodes = parse(prompt)
    runs: list[tuple[int, str]] = []
    for step in range(1, max(1, steps) + 1):
        text = text_at(nodes, step, steps)
        if runs and runs[-1][1] == text:
            runs[-1] = (step, text)
        else:
            runs.append((step, text))
    return runs


class _Parser:
    """One prompt's brackets, each read once (`_done`, by opening position): a run of unclosed or
    plain `[` costs one pass, not one per bracket."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._done: dict[int, tuple[tuple[Node, ...] | None, int]] = {}
        self._closed = _closed_brackets(text)  # a `[` never closed is text at once, without a scan

    def sequence(self, i: int, inside: int) -> tuple[tuple[Node, ...], int]:
        """Nodes from `i` to the end, or (`inside` that many brackets) to a `:`, `|` or `]` outside
        parentheses. Brackets deeper than MAX_DEPTH are text (a prompt cannot exhaust the stack)."""
        text, nodes, literal = self.text, [], []
        depth = 0  # round brackets open in this part: their `:1.5)` is a weight, not a separator
        while i < len(text):
            char = text[i]
            if char == "\\" and i + 1 < len(text):
                literal.append(text[i : i + 2])
                i += 2
                continue
            if inside and depth == 0 and char in ":|]":
                break
            if char == "[" and inside < MAX_DEPTH:
                found, end = self.bracket(i, inside + 1)
                if found is not None:
                    if literal:
                        nodes.append("".join(literal))
                        literal = []
                    nodes.extend(found)
                    i = end
                    continue
            depth += 1 if char == "(" else -1 if char == ")" and depth else 0
            literal.append(char)
            i += 1
        if literal:
            nodes.append("".join(literal))
        return tuple(nodes), i

    def bracket(self, start: int, depth: int) -> tuple[tuple[Node, ...] | None, int]:
        """What the `[` at `start` opens and the index after its `]`: an edit, an alternation, or the
        plain bracket as text around its parts (de-emphasis, read later); None when it is never closed."""
        if start not in self._closed:
            return None, start
        if start not in self._done:  # a bracket's depth is fixed by the text before it: one answer
            self._done[start] = self._bracket(start, depth)
        return self._done[start]

    def _bracket(self, start: int, depth: int) -> tuple[tuple[Node, ...] | None, int]:
        parts: list[tuple[Node, ...]] = []
        separators: list[str] = []
        i = start + 1
        while True:
            part, i = self.sequence(i, inside=depth)
            parts.append(part)
            if i >= len(self.text):
                return None, start  # never closed: the `[` is text
            if self.text[i] == "]":
                break
            separators.append(self.text[i])
            i += 1
        end = i + 1
        if separators and set(separators) == {"|"}:
            return (Alternate(tuple(parts)),), end
        when = "".join(p for p in parts[-1] if isinstance(p, str)).strip() if len(parts[-1]) <= 1 else ""
        if set(separators) == {":"} and len(parts) in (2, 3) and _is_number(when):
            before = parts[0] if len(parts) == 3 else ()
            after = parts[1] if len(parts) == 3 else parts[0]
            return (Edit(before, after, when),), end
        group: list[Node] = ["["]
        for k, part in enumerate(parts):
            group.extend([*([separators[k - 1]] if k else []), *part])
        return (*group, "]"), end


def _closed_brackets(text: str) -> set[int]:
    """Where a `[` opens that a later `]` closes (escaped ones are text), in one pass."""
    open_at, closed, i = [], set(), 0
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "[":
            open_at.append(i)
        elif text[i] == "]" and open_at:
            closed.add(open_at.pop())
        i += 1
    return closed


MAX_DEPTH = 16  # nested brackets read as editing/alternation; deeper ones are text
_NUMBER = re.compile(r"[+-]?(?:[0-9]{1,9}(?:\.[0-9]{0,9})?|\.[0-9]{1,9})")


def _is_number(text: str) -> bool:
    """A step or share as A1111 writes one (signed, decimal, at most 9 digits each side: no inf, no 1e400)."""
    return _NUMBER.fullmatch(text) is not None
