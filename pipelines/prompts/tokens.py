"""Prompt length against each text encoder's window: a token counter and "your prompt was cut" warnings.

CLIP sees 77 tokens (75 of prompt between BOS and EOS); T5, Gemma, Qwen2 and Llama encoders
see the pipeline's `max_sequence_length` (a `__call__` argument whose default differs per
pipeline: SD3 256, Flux 512, PixArt-Σ and Sana 300, Qwen-Image 1024, HiDream 128). diffusers
drops what does not fit with at most a log line; users should see it in the result instead.

Approximations, on purpose (counting must stay cheap and generic): a pipeline's fixed template
around the prompt (Qwen-Image's system prompt, which it drops again; Sana's "complex human
instruction", which it adds to the window) is not counted, and HiDream pads its CLIPs to 128
rather than 77, which this does not know.
"""

from __future__ import annotations

import copy
import inspect
import logging
import re
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

TOKENIZERS = ("tokenizer", "tokenizer_2", "tokenizer_3", "tokenizer_4")
_SUFFIX = re.compile(r"(TextModelWithProjection|TextModel|EncoderModel|ForConditionalGeneration|ForCausalLM|Model)$")
MAX_DROPPED_CHARS = 60


@dataclass(frozen=True)
class TokenCount:
    """How many prompt tokens one encoder gets, of how many it keeps."""

    component: str  # the tokenizer's component name: tokenizer, tokenizer_2...
    label: str  # the text encoder, as people call it: CLIP, T5, Gemma2, Qwen2_5_VL, Llama
    count: int
    limit: int

    @property
    def cut(self) -> bool:
        return self.count > self.limit


def _label(pipe: Any, component: str, tokenizer: Any) -> str:
    encoder = getattr(pipe, component.replace("tokenizer", "text_encoder"), None)
    name = type(encoder).__name__ if encoder is not None else type(tokenizer).__name__.replace("TokenizerFast", "")
    return _SUFFIX.sub("", name).replace("Tokenizer", "") or name


def _limit(pipe: Any, tokenizer: Any) -> int:
    """Prompt tokens kept: CLIP's window minus BOS/EOS, else the pipeline's max_sequence_length."""
    if "CLIP" in type(tokenizer).__name__:
        return int(tokenizer.model_max_length) - 2
    try:
        param = inspect.signature(pipe.__call__).parameters.get("max_sequence_length")
    except (TypeError, ValueError):
        param = None
    if param is not None and isinstance(param.default, int):
        return param.default - (1 if "T5" in type(tokenizer).__name__ else 0)  # T5 appends </s>
    return int(min(tokenizer.model_max_length, 10**6))


@dataclass(frozen=True)
class Window:
    """One text encoder's window: its tokenizer and how many prompt tokens it keeps."""

    component: str
    label: str
    limit: int
    tokenizer: Any


def windows(pipe: Any, private: bool = False) -> list[Window]:
    """The windows of `pipe`'s text encoders. `private`: with copies of the tokenizers, for counting
    in another thread while the pipeline encodes (a fast tokenizer is not safe to share)."""
    if isinstance(pipe, list):
        return pipe
    found = [(name, getattr(pipe, name, None)) for name in TOKENIZERS]
    out = []
    for name, tok in found:
        if tok is None or not callable(tok):
            continue
        limit, label = _limit(pipe, tok), _label(pipe, name, tok)
        out.append(Window(name, label, limit, copy.deepcopy(tok) if private else tok))
    return out


def _ids(tokenizer: Any, prompt: str) -> list[int]:
    return list(tokenizer(prompt, add_special_tokens=False, truncation=False, verbose=False).input_ids)


def count_tokens(pipe: Any, prompt: str, chunked: bool = False) -> list[TokenCount]:
    """One count per text encoder of `pipe` (or of its `windows`); none without tokenizers.
    `chunked`: the CLIP encoders take the prompt in windows (pipelines.prompts.weights), so they do not
    cut it and the limit shown is the windows it fills, as A1111's counter shows (80/150)."""
    out = []
    for w in windows(pipe):
        count = len(_ids(w.tokenizer, prompt))
        limit = w.limit * max(1, -(-count // w.limit)) if chunked and w.label == "CLIP" else w.limit
        out.append(TokenCount(w.component, w.label, count, limit))
    return out


def truncation_warnings(pipe: Any, prompt: str) -> list[str]:
    """A warning per encoder that cuts `prompt`, saying where and what was dropped."""
    warnings = []
    for w in windows(pipe):
        ids = _ids(w.tokenizer, prompt)
        if len(ids) <= w.limit:
            continue
        dropped = w.tokenizer.decode(ids[w.limit :], skip_special_tokens=True).strip()
        if len(dropped) > MAX_DROPPED_CHARS:
            dropped = dropped[:MAX_DROPPED_CHARS].rstrip() + "…"
        warnings.append(
            f'prompt cut by {w.label} ({w.component}) after {w.limit} of {len(ids)} tokens: dropped "{dropped}"'
        )
    return warnings


def token_summary(counts: list[TokenCount]) -> str:
    """ "CLIP 12/75 · T5 14/255", with ⚠️ on an encoder that will cut the prompt (A1111's counter)."""
    return " · ".join(f"{c.label} {c.count}/{c.limit}" + (" ⚠️ cut" if c.cut else "") for c in counts)


def fit_prompt(pipe: Any, prompt: str) -> str:
    """`prompt` cut to the widest window among the encoders (each encoder still cuts to its own).

    Passing more than any encoder can see is not harmless everywhere: Qwen-Image-Edit's
    processor then builds image-token positions that no longer match (a RuntimeError deep in
    the text encoder). What is cut is reported by `truncation_warnings`.
    """
    found = windows(pipe)
    if not found:
        return prompt
    widest = max(found, key=lambda w: w.limit)
    ids = _ids(widest.tokenizer, prompt)
    if len(ids) <= widest.limit:
        return prompt
    return widest.tokenizer.decode(ids[: widest.limit], skip_special_tokens=True)
