"""Weighted prompts of any length for CLIP text encoders, as A1111 encodes them, passed to diffusers
as `prompt_embeds`.

diffusers encodes one window (77 tokens for CLIP: 75 of prompt between BOS and EOS) and drops the
rest; a prompt written for A1111 or Forge is often longer, and weighted (`pipelines.prompts.syntax`).
Here, restating A1111's documented behaviour:

1. Chunks. The pieces' tokens fill chunks of the window's prompt length (75). A chunk that fills
   up moves its words after its last comma to the next chunk when that comma is within the last 20
   tokens (A1111's comma backtrack, so a phrase is not split); BREAK closes a chunk early. Each
   chunk is `BOS, its tokens, EOS, padding`: the tokenizer's own layout for a prompt that fits.
2. Each chunk is encoded on its own (the layer the pipeline uses: the last hidden state for SD,
   the penultimate of both CLIPs for SDXL; a request's Clip skip picks an earlier one: `clip_layer`);
   each token's vector is multiplied by its weight, and the chunk is rescaled so its mean is what
   it was before weighting (A1111's "original" emphasis).
3. The chunks are joined along the tokens (77 x k). The prompt and the negative prompt are padded
   to the same number of chunks with the encoding of an empty chunk, as classifier-free guidance
   needs one length. SDXL's pooled embedding is the second CLIP's for the first chunk.

A prompt that is `plain` and fits the window is not touched at all (the pipeline encodes it): its
images are bit-identical to before, and it costs nothing more.

| kind    | pipelines (read from the pipeline: `kind_of`) | layer |
|---------|------------------------------------------------|-------|
| `clip`  | one `CLIPTextModel` (SD 1.x/2.x, their img2img, inpaint, InstructPix2Pix) | last hidden state |
| `clip2` | `CLIPTextModel` + `CLIPTextModelWithProjection` taking pooled embeds (SDXL) | penultimate, both |
| `sd3`   | two `CLIPTextModelWithProjection` + T5 (SD3, SD3.5) | the CLIPs' penultimate, weighted and chunked, widened to T5's features; then T5's sequence of the words without the syntax; pooled: both CLIPs' |
| ``      | anything else (T5 / LLM encoders, or CLIPs that give only a pooled vector: Flux, Qwen-Image, ...) | the syntax is removed, with a warning |
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from pipelines.prompts.syntax import Parsed, parse

log = logging.getLogger(__name__)

COMMA_BACKTRACK = 20  # A1111's default: a comma this close to a full chunk's end moves the rest on
# The kinds with a pooled embedding, and its name in the step loop (`callback_on_step_end`)
POOLED = {"clip2": "add_text_embeds", "sd3": "pooled_prompt_embeds"}


def kind_of(pipe: Any, params: frozenset[str]) -> str:
    """How `pipe`'s prompts can be weighted here: "clip", "clip2", "sd3" or "" (see the table above)."""
    if not {"prompt_embeds", "negative_prompt_embeds"} <= params:
        return ""
    names = [type(getattr(pipe, name, None)).__name__ for name in ("text_encoder", "text_encoder_2", "text_encoder_3")]
    if names == ["CLIPTextModel", "NoneType", "NoneType"]:
        return "clip"
    if names == ["CLIPTextModel", "CLIPTextModelWithProjection", "NoneType"] and "pooled_prompt_embeds" in params:
        return "clip2"
    clips = ["CLIPTextModelWithProjection", "CLIPTextModelWithProjection"]
    if names[:2] == clips and names[2] in ("T5EncoderModel", "NoneType") and "prompt_3" in params:
        return "sd3"
    return ""


@dataclass(frozen=True)
class Chunk:
    """One window's token ids (BOS ... EOS, padding) and each token's weight."""

    ids: tuple[int, ...]
    weights: tuple[float, ...]
    used: int  # BOS, the tokens and EOS: what the tokenizer's attention mask covers


def chunks(parsed: Parsed, tokenizer: Any, convert: Callable[[str], str] = str) -> list[Chunk]:
    """`parsed`'s tokens in windows of `tokenizer.model_max_length` (step 1 above). `convert`: a
    multi-vector embedding's word as its tokens (diffusers' `maybe_convert_prompt`)."""
    size = int(tokenizer.model_max_length) - 2
    comma = _single_id(tokenizer, ",")
    done: list[tuple[list[int], list[float]]] = []
    ids: list[int] = []
    weights: list[float] = []
    last_comma = -1

    def close() -> None:
        nonlocal ids, weights, last_comma
        done.append((ids, weights))
        ids, weights, last_comma = [], [], -1

    for piece in parsed.pieces:
        if piece.is_break:
            close()
            continue
        for token in tokenizer(convert(piece.text), add_special_tokens=False, verbose=False).input_ids:
            if token == comma:  # a comma that overflows the window starts the next one: nothing to move
                last_comma = len(ids)
            elif len(ids) == size and last_comma != -1 and size - last_comma <= COMMA_BACKTRACK:
                keep = last_comma + 1
                moved = ids[keep:], weights[keep:]
                ids, weights = ids[:keep], weights[:keep]
                close()
                ids, weights = list(moved[0]), list(moved[1])
            if len(ids) == size:
                close()
            ids.append(token)
            weights.append(piece.weight)
    if ids or not done:
        close()
    return [_framed(tokenizer, i, w, size) for i, w in done]


def _single_id(tokenizer: Any, text: str) -> int | None:
    ids = tokenizer(text, add_special_tokens=False).input_ids
    return ids[0] if len(ids) == 1 else None


def _framed(tokenizer: Any, ids: list[int], weights: list[float], size: int) -> Chunk:
    """BOS, the tokens, EOS, then padding to the window: the tokenizer's layout for a prompt that fits."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rest = size - len(ids)
    framed = [tokenizer.bos_token_id, *ids, tokenizer.eos_token_id, *([pad] * rest)]
    return Chunk(tuple(framed), (1.0, *weights, 1.0, *([1.0] * rest)), len(ids) + 2)


def emphasized(z: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """`z` (tokens x features) with each token's vector times its weight, rescaled to `z`'s own mean."""
    if bool((weights == 1.0).all()):
        return z
    mean = z.float().mean()
    weighted = z.float() * weights[:, None].to(z.device)
    return (weighted * (mean / weighted.mean())).to(z.dtype)


@dataclass
class Encoded:
    """One prompt's embeddings, joined chunks (1 x 77k x features), and SDXL's pooled (1 x features)."""

    embeds: torch.Tensor
    pooled: torch.Tensor | None
    empty_chunk: torch.Tensor  # an empty prompt's chunk, to pad a shorter prompt of the same call


class Encoder:
    """Encodes one request's prompts (each distinct text once, over all its calls and steps)."""

    def __init__(self, pipe: Any, kind: str, clip_skip: int = 1) -> None:
        self.pipe, self.kind, self.clip_skip = pipe, kind, max(1, clip_skip)
        self._done: dict[str, Encoded] = {}
        self._empty: dict[int, Any] = {}

    def encode(self, prompt: str) -> Encoded:
        if prompt not in self._done:
            self._done[prompt] = self._encode(parse(prompt))
        return self._done[prompt]

    def pairs(self) -> list[tuple[Any, Any, bool]]:
        """(tokenizer, text encoder, penultimate layer?) of each CLIP the pipeline uses."""
        pipe = self.pipe
        if self.kind == "clip":
            return [(pipe.tokenizer, pipe.text_encoder, False)]  # SD 1.x/2.x: the last hidden state
        return [(pipe.tokenizer, pipe.text_encoder, True), (pipe.tokenizer_2, pipe.text_encoder_2, True)]

    @torch.no_grad()
    def _encode(self, parsed: Parsed) -> Encoded:
        per_encoder, pooled = [], []
        for tokenizer, encoder, penultimate in self.pairs():
            parts = chunks(parsed, tokenizer, self._convert(tokenizer))
            states = [self._run(encoder, chunk, penultimate) for chunk in parts]
            per_encoder.append(
                [emphasized(z, torch.tensor(c.weights)) for (z, _), c in zip(states, parts, strict=True)]
            )
            pooled.append(states[0][1])  # each CLIP's, for the first chunk
        count = max(len(found) for found in per_encoder)
        joined = []
        for (tokenizer, encoder, penultimate), found in zip(self.pairs(), per_encoder, strict=True):
            empty = self._empty_chunk(tokenizer, encoder, penultimate)
            joined.append(torch.cat([*found, *([empty] * (count - len(found)))], dim=0))
        embeds = torch.cat(joined, dim=-1)[None]
        empty = torch.cat([self._empty_chunk(t, e, p) for t, e, p in self.pairs()], dim=-1)
        if self.kind == "sd3":
            return self._with_t5(parsed, embeds, torch.cat(pooled, dim=-1), empty)
        return Encoded(embeds, pooled[-1] if self.kind == "clip2" else None, empty)  # SDXL: the second CLIP's

    def _with_t5(self, parsed: Parsed, clip: torch.Tensor, pooled: torch.Tensor, empty: torch.Tensor) -> Encoded:
        """SD3: the CLIPs' windows widened to T5's features, then T5's sequence for the words without the
        syntax (T5 takes no weights), from the pipeline's own `encode_prompt` (T5 absent: its zeros)."""
        full, *_ = self.pipe.encode_prompt(
            "", "", parsed.text, do_classifier_free_guidance=False
        )  # its CLIP part unused
        window = int(self.pipe.tokenizer.model_max_length)
        t5 = full[:, window:]
        widen = t5.shape[-1] - clip.shape[-1]
        clip, empty = (torch.nn.functional.pad(t, (0, widen)) for t in (clip, empty))
        return Encoded(torch.cat([clip, t5.to(clip)], dim=1), pooled, empty)

    def _convert(self, tokenizer: Any) -> Callable[[str], str]:
        """Textual-inversion words as their tokens, as diffusers' encode_prompt does (pipelines.prompts.embeddings)."""
        from diffusers.loaders import TextualInversionLoaderMixin  # not at import: settings load without diffusers

        if not isinstance(self.pipe, TextualInversionLoaderMixin):
            return str
        special = set(tokenizer.all_special_tokens)
        words = [word for word in tokenizer.added_tokens_encoder if word not in special]
        if not words:  # no embedding loaded: nothing to expand (and no long-text tokenizer warning)
            return str
        return lambda text: self.pipe.maybe_convert_prompt(text, tokenizer) if any(w in text for w in words) else text

    def _empty_chunk(self, tokenizer: Any, encoder: Any, penultimate: bool) -> torch.Tensor:
        cached = self._empty.get(id(encoder))
        if cached is None:
            cached = self._run(encoder, chunks(parse(""), tokenizer)[0], penultimate)[0]
            self._empty[id(encoder)] = cached
        return cached

    def _run(self, encoder: Any, chunk: Chunk, penultimate: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One chunk through `encoder`: (tokens x features) of the pipeline's layer, and the pooled output."""
        device = self.pipe._execution_device  # diffusers' own answer, offload hooks included
        ids = torch.tensor([chunk.ids], device=device)
        mask = None
        if getattr(encoder.config, "use_attention_mask", False):  # as diffusers' encode_prompt does
            mask = (torch.arange(len(chunk.ids), device=device) < chunk.used).long()[None]
        layer = min(clip_layer(self.clip_skip, penultimate), deepest(encoder))
        out = encoder(ids, attention_mask=mask, output_hidden_states=layer != 1)
        pooled = out[0] if penultimate and self.kind in POOLED else None
        if layer == 1:
            return out[0][0].to(encoder.dtype), pooled
        z = out.hidden_states[-layer][0]
        if not penultimate:  # SD 1.x/2.x: A1111 (and diffusers' clip_skip) normalise an earlier layer as the last
            z = encoder.final_layer_norm(z)
        return z.to(encoder.dtype), pooled


def deepest(encoder: Any) -> int:
    """The furthest layer from the last a CLIP has (its embeddings' output): its layers + 1."""
    return int(encoder.config.num_hidden_layers) + 1


def clip_layer(clip_skip: int, penultimate: bool) -> int:
    """Which hidden state a CLIP gives, counted from the last (1): A1111's "Clip skip" (CLIP_stop_at_last_layers).
    Pipelines that read the second-to-last (SDXL, SD3) keep it for 1 and 2, as A1111 does; deeper
    skips go on from there (A1111's `sdxl_clip_l_skip`)."""
    return max(2, clip_skip) if penultimate else clip_skip


def call_embeds(encoder: Encoder, prompts: list[str], negative: str | None, zero_negative: bool) -> dict[str, Any]:
    """The diffusers arguments replacing `prompt` and `negative_prompt` for one micro-batch: every
    prompt and the negative padded to one number of chunks (step 3). `zero_negative`: SDXL's
    `force_zeros_for_empty_prompt` with no negative prompt (zeros, as the pipeline itself gives)."""
    encoded = [encoder.encode(p) for p in prompts]
    negative_encoded = None if zero_negative else encoder.encode(negative or "")
    count = max(e.embeds.shape[1] for e in (*encoded, *([negative_encoded] if negative_encoded else [])))

    def padded(e: Encoded) -> torch.Tensor:
        width = e.empty_chunk.shape[0]
        missing = (count - e.embeds.shape[1]) // width
        return torch.cat([e.embeds, *([e.empty_chunk[None]] * missing)], dim=1)

    embeds = torch.cat([padded(e) for e in encoded])
    negative_embeds = (
        torch.zeros_like(embeds) if negative_encoded is None else padded(negative_encoded).expand_as(embeds)
    )
    out: dict[str, Any] = {"prompt_embeds": embeds, "negative_prompt_embeds": negative_embeds.contiguous()}
    if encoder.kind in POOLED:
        pooled = torch.cat([e.pooled for e in encoded])
        out["pooled_prompt_embeds"] = pooled
        out["negative_pooled_prompt_embeds"] = (
            torch.zeros_like(pooled)
            if negative_encoded is None
            else negative_encoded.pooled.expand_as(pooled).contiguous()
        )
    return out
