"""Text shown to people: the info line under a result, the model's vocabulary, refusals."""

from __future__ import annotations

import logging
from typing import Any

import gradio as gr

from pipelines import GenerationResult, ModelInfo

log = logging.getLogger("diffusion_anywhere")


def refuse(message: str) -> gr.Error:
    """A refused request: one log line, the message to the caller, no traceback anywhere."""
    log.info("refused: %s", message)
    return gr.Error(message, print_exception=False)


def info_line(result: GenerationResult) -> str:
    t = result.timings
    peak = f"{result.peak_memory / 2**20:.1f} MiB" if result.peak_memory else "n/a"
    made = f"{len(result.images)} image(s)"
    if result.clips:
        made = f"{len(result.clips)} clip(s) of {len(result.clips[0])} frames at {result.fps:g} fps"
    text = (
        f"{made} in {t['total']:.2f} s · {t['steps_per_second']:.1f} it/s · "
        f"peak {peak} · {result.device} · {result.dtype} · {result.attention} attention"
    )
    if result.attention_components:
        text += " (" + ", ".join(f"{k}: {v}" for k, v in result.attention_components.items()) + ")"
    if result.step_cache:
        text += f" · step cache {result.step_cache}"
    if result.hires:
        text += f" · hires {result.hires}"
    if result.detailer:
        text += f" · detailer {result.detailer}"
    if result.vae_tiling:
        text += " · tiled VAE"
    if result.warnings:
        text += " · ⚠️ " + "; ".join(result.warnings)
    return text


def _words(vocab: dict[str, Any]) -> str:
    return f"colors: {', '.join(vocab.get('colors', []))}  \nshapes: {', '.join(vocab.get('shapes', []))}"


def embeddings_markdown(info: ModelInfo) -> str:
    """The textual-inversion embeddings a prompt may name (EMBEDDINGS_DIR), and those that do not fit."""
    if not info.embeddings and not info.embeddings_skipped:
        return ""
    loaded = ", ".join(f"`{n}` ({e['vectors']} vector{'s' * (e['vectors'] != 1)})" for n, e in info.embeddings.items())
    text = f"<small>Embeddings (write the name in a prompt): {loaded or 'none'}"
    if info.embeddings_skipped:
        text += "; not for this model: " + ", ".join(f"`{n}`" for n in info.embeddings_skipped)
    return text + "</small>"


def vocabulary_markdown(vocab: dict[str, Any]) -> str:
    parts = []
    if vocab.get("pattern"):
        parts.append(
            f"**This model only knows its own small world.** Prompt pattern: `{vocab['pattern']}`  \n{_words(vocab)}"
        )
    if vocab.get("instructions"):  # an embedded instruction editor (tiny-shapes-edit)
        kinds = "  \n".join(
            f"{kind}: " + " · ".join(f"`{p}`" for p in patterns) for kind, patterns in vocab["instructions"].items()
        )
        parts.append(
            f"**This editor only knows its own small world.** Instructions, one change each:  \n{kinds}  \n"
            + _words(vocab)
        )
    if vocab.get("notes"):  # a recipe's notes
        parts.append(f"ℹ️ {vocab['notes']}")
    return "\n\n".join(parts)
