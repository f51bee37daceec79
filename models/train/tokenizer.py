"""A CLIP BPE tokenizer whose vocabulary is written by us.

Every word of the model's world is one token (a BPE merge chain builds it from its letters);
any other word falls apart into letters, which the model simply has not learned to use.
It is a genuine `CLIPTokenizer`, so standard Stable Diffusion code loads it unchanged.
"""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path

from transformers import CLIPTokenizer

from .configs import MAX_TOKENS
from .world import COLORS, SHAPES

WORDS: tuple[str, ...] = ("a", "on", "background", *COLORS, *SHAPES)
BOS, EOS = "<|startoftext|>", "<|endoftext|>"


def build_vocab(words: tuple[str, ...] = WORDS) -> tuple[dict[str, int], list[str]]:
    """Return (vocab, merges) in CLIP's BPE format for `words` plus single characters."""
    vocab: dict[str, int] = {}

    def add(token: str) -> None:
        vocab.setdefault(token, len(vocab))

    alphabet = string.ascii_lowercase + string.digits + string.punctuation
    for ch in alphabet:
        add(ch)
    for ch in alphabet:
        add(ch + "</w>")
    merges: list[str] = []
    for word in words:
        pieces = [*word[:-1], word[-1] + "</w>"]
        current = pieces[0]
        for piece in pieces[1:]:
            merge = f"{current} {piece}"
            if merge not in merges:
                merges.append(merge)
            current += piece
            add(current)
    add(BOS)
    add(EOS)
    return vocab, merges


def build_tokenizer(words: tuple[str, ...] = WORDS, max_length: int = MAX_TOKENS) -> CLIPTokenizer:
    vocab, merges = build_vocab(words)
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file, merges_file = Path(tmp, "vocab.json"), Path(tmp, "merges.txt")
        vocab_file.write_text(json.dumps(vocab))
        merges_file.write_text("#version: 0.2\n" + "\n".join(merges) + "\n")
        tokenizer = CLIPTokenizer(str(vocab_file), str(merges_file), pad_token=EOS)
    tokenizer.model_max_length = max_length
    return tokenizer
