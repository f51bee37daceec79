"""Wildcards and variants in prompts, by the Dynamic Prompts library (`dynamicprompts`, MIT): `{a|b|c}`,
`{2$$a|b|c}`, `__name__` (a line of WILDCARD_DIR/name.txt, nested folders `__folder/name__`).

A request's prompts are resolved once, before the request is split over replicas or checked against
the batch cap (the engine does at submit, `ImagePipeline.generate` for a request made directly):
- `random` (the default): each image its own pick, drawn with that image's seed (seed + k), so a seed
  gives the same prompt and the same image again;
- `combinatorial`: every combination of each prompt, each a prompt of its own with `num_images` images
  (in the library's order); more than the batch cap is refused by the cap's check;
- `off`: the text as written (`{` and `__` stay words).
The resolved request has one prompt per image (random) or per combination, `prompt_template` the
templates they came from (written to each image's metadata as Dynamic Prompts' "Template"), and
`wildcards` "off", so resolving it again changes nothing. The negative prompt is resolved once, with
the request's seed, and is the same for every image. A `__name__` the folder lacks is refused, naming
those it has; text the library cannot parse (an unclosed `{`) is refused, naming the column. With several
input images (image-to-image), every input gets the same picks.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from dynamicprompts.generators import CombinatorialPromptGenerator, RandomPromptGenerator
from dynamicprompts.wildcards import WildcardManager
from pyparsing import ParseBaseException

from pipelines.schema.request import GenerationRequest, RequestError, item_seed

SYNTAX = re.compile(r"\{[^{}]*\|[^{}]*\}|__[^_\s][^\s]*?__")  # a variant or a wildcard
WILDCARD = re.compile(r"__([^\s]+?)__")
GLOB = re.compile(r"[*?\[]")
MAX_COMBINATIONS = 10_000  # generated at most; the batch cap refuses what is over it


def has_syntax(text: str | None) -> bool:
    return bool(text) and bool(SYNTAX.search(text))


class Wildcards:
    """The wildcard files of one folder (WILDCARD_DIR), and the resolution of requests against them."""

    def __init__(self, folder: Path | None) -> None:
        self.folder = Path(folder) if folder else None
        self._manager = WildcardManager(self.folder if self.folder and self.folder.is_dir() else None)

    def names(self) -> tuple[str, ...]:
        """Every wildcard a prompt may name (`__name__`), sorted: what the UI and the API list."""
        return tuple(sorted(self._manager.get_collection_names()))

    def values(self, name: str) -> list[str]:
        return [str(v) for v in self._manager.get_values(name)]

    def _check(self, texts: Iterable[str], field: str) -> None:
        known = self.names()
        for text in texts:
            for name in WILDCARD.findall(text):
                if not GLOB.search(name) and name not in known:
                    where = f"in {self.folder} (WILDCARD_DIR)" if self.folder else "(WILDCARD_DIR is not set)"
                    raise RequestError(field, f"no wildcard __{name}__ {where}; available: {', '.join(known) or 'none'}")

    def resolve(self, request: GenerationRequest) -> GenerationRequest:
        """`request` with its prompts resolved (the module docstring); needs a pinned seed in random mode."""
        prompts = request.prompts
        negative = request.negative_prompt
        if request.wildcards == "off" or not (any(map(has_syntax, prompts)) or has_syntax(negative)):
            return request
        self._check(prompts, "prompt")
        self._check([negative or ""], "negative_prompt")
        if request.wildcards != "combinatorial" and request.seed is None:
            raise ValueError("wildcards: random picks need the request's seed pinned first")
        try:
            if request.wildcards == "combinatorial":
                resolved, templates = self._combinations(prompts, request.num_images)
            else:
                resolved, templates = self._random(request, prompts)
        except ParseBaseException as exc:  # an unclosed {, a bad $$ count: the caller's text
            raise RequestError("prompt", f"wildcards: {exc.msg} at column {exc.column} (wildcards=off sends it as written)") from None
        if has_syntax(negative):
            try:
                negative = RandomPromptGenerator(self._manager, seed=request.seed or 0).generate(negative, 1)[0]
            except ParseBaseException as exc:
                raise RequestError("negative_prompt", f"wildcards: {exc.msg} at column {exc.column}") from None
        single = len(resolved) == 1
        return request.replace(
            prompt=resolved[0] if single else resolved,
            prompt_template=templates[0] if single else templates,
            num_images=request.num_images if request.wildcards == "combinatorial" else 1,
            negative_prompt=negative,
            wildcards="off",
        )

    def _combinations(self, prompts: list[str], copies: int) -> tuple[list[str], list[str]]:
        resolved: list[str] = []
        templates: list[str] = []
        generator = CombinatorialPromptGenerator(self._manager)
        for template in prompts:
            found = generator.generate(template, max_prompts=MAX_COMBINATIONS) if has_syntax(template) else [template]
            resolved += [str(p) for p in found]
            templates += [template] * len(found)
        return resolved, templates

    def _random(self, request: GenerationRequest, prompts: list[str]) -> tuple[list[str], list[str]]:
        """One pick per image, in the order of the request's work items (pipelines.run.planning.work_items:
        prompt by prompt, then copy), each with that image's seed."""
        resolved: list[str] = []
        templates: list[str] = []
        for template in prompts:
            for _ in range(request.num_images):
                seed = item_seed(request.seed, len(resolved))
                text = RandomPromptGenerator(self._manager, seed=seed).generate(template, 1)[0] if has_syntax(template) else template
                resolved.append(str(text))
                templates.append(template)
        return resolved, templates
