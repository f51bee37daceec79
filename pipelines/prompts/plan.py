"""What a request's prompts become in its diffusers calls: A1111's prompt language end to end.

Per prompt, in this order: its text at each step (`prompt_schedule`: editing and alternation),
then each text's weights and BREAKs (`prompt_syntax`), encoded in windows by the pipeline's CLIPs
(`prompt_weights`). A plain prompt that fits the window goes to the pipeline untouched.

| pipeline                                        | weights, BREAK, any length | editing, alternation |
|-------------------------------------------------|----------------------------|----------------------|
| SD 1.x/2.x, SDXL, their image-to-image, InstructPix2Pix | yes                | yes: the step callback swaps the embeddings (`PromptSwitch`) |
| SD3 / SD3.5 text-to-image                       | on its two CLIPs (T5 gets the words)  | yes |
| SD and SDXL inpainting, SD3 image-to-image      | yes                        | no: the first step's text, with a warning |
| every other family (T5 / LLM encoders)          | no: the words without the syntax, with a warning | no: the first step's text, with a warning |
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from pipelines.prompts.schedule import parse as parse_schedule
from pipelines.prompts.schedule import scheduled, text_at
from pipelines.prompts.syntax import parse
from pipelines.prompts.tokens import fit_prompt, truncation_warnings
from pipelines.prompts.weights import POOLED, Encoder, call_embeds, clip_layer, deepest, kind_of
from pipelines.sampling.guidance import LAYOUTS


def first_steps(kwargs: dict[str, Any]) -> int:
    """How many steps the call denoises: an image-to-image call runs `strength` of them (diffusers'
    `get_timesteps`), which is what a share in `[from:to:0.5]` is of."""
    steps = int(kwargs.get("num_inference_steps") or 1)
    strength = kwargs.get("strength")
    return max(1, min(int(steps * strength), steps)) if isinstance(strength, float) else steps


class PromptPlan:
    """One request's prompts, for each of its diffusers calls (pipelines.run.planning)."""

    def __init__(
        self, pipe: Any, params: frozenset[str], steps: int, words: Callable[[str], str] = str, clip_skip: int = 1
    ) -> None:
        self.pipe, self.steps = pipe, max(1, steps)  # the request's steps: when a first text ends
        self.words = words  # ComfyUI's `embedding:name` as the embedding's word (pipelines.prompts.embeddings)
        self.kind = kind_of(pipe, params)
        self.clip_skip = max(1, clip_skip)  # A1111's Clip skip: encoded here (diffusers' own fails on transformers 5)
        self.encoder = Encoder(pipe, self.kind, self.clip_skip) if self.kind else None
        self.switches = self.kind != "" and type(pipe).__name__ in LAYOUTS  # its step loop reads embeds back
        self._tokenizers = [tokenizer for tokenizer, _, _ in self.encoder.pairs()] if self.encoder else []

    def text(self, prompt: str) -> str:
        """The `prompt` argument for `prompt`: itself where this plan encodes it, else the first step's
        words without the syntax, cut to the widest encoder window (pipelines.prompts.tokens)."""
        prompt = self.words(prompt)
        if self.kind:
            return prompt
        return fit_prompt(self.pipe, parse(text_at(parse_schedule(prompt), 1, self.steps)).text)

    @property
    def skips(self) -> bool:
        """Whether the request's Clip skip changes the layer this pipeline's CLIPs give."""
        penultimate = self.encoder is not None and self.encoder.pairs()[0][2]
        return clip_layer(self.clip_skip, penultimate) != clip_layer(1, penultimate)

    def warnings(self, prompts: list[str], negative: str | None) -> list[str]:
        """Said before the run: the syntax this pipeline cannot take, where a prompt is cut, and a
        Clip skip it has no CLIP for."""
        name = type(self.pipe).__name__
        out = []
        if self.clip_skip > 1 and not self.kind:
            out.append(f"{name} has no CLIP text encoder whose layer can be chosen here: Clip skip {self.clip_skip} was ignored")
        encoders = [encoder for _, encoder, _ in self.encoder.pairs()] if self.encoder else []
        most = min((deepest(encoder) for encoder in encoders), default=self.clip_skip)
        if self.clip_skip > most:
            out.append(f"Clip skip {self.clip_skip}: {name}'s text encoder has {most - 1} layers; Clip skip {most} "
                       "(its embeddings) was used")  # fmt: skip
        for prompt in dict.fromkeys([*prompts, *([negative] if negative else [])]):
            if scheduled(prompt) and not self.switches:
                out.append(
                    f"{name} cannot change its prompt between steps here (SD, SDXL and SD3 text-to-image, "
                    f"SD/SDXL image-to-image and InstructPix2Pix can): [from:to:when] and [a|b] ran their "
                    f"first step's text"
                )
            words = parse(text_at(parse_schedule(prompt), 1, self.steps))
            if not self.kind and not words.plain:
                out.append(
                    f"{name}'s text encoders take no A1111 weights or BREAK here (only SD 1.x/2.x, SDXL and "
                    f"SD3's CLIPs do): sent as plain text: {words.text[:80]!r}"
                )
            if self.kind in ("", "sd3") and prompt in prompts:  # CLIPs read it whole here; T5 still cuts
                cut = truncation_warnings(self.pipe, words.text)
                out += [w for w in cut if not (self.kind and w.startswith("prompt cut by CLIP"))]
        return out

    def _needs_embeds(self, texts: list[str]) -> bool:
        """A prompt with syntax, or longer than a window: diffusers would read it literally or cut it; or
        a Clip skip that changes the layer (`clip_layer`)."""
        if self.encoder is not None and self.skips:
            return True
        for text in texts:
            if not parse(text).plain:
                return True
            for tokenizer in self._tokenizers:
                count = len(tokenizer(text, add_special_tokens=False, verbose=False).input_ids)
                if count > tokenizer.model_max_length - 2:
                    return True
        return False

    def apply(self, kwargs: dict[str, Any]) -> tuple[dict[str, Any], PromptSwitch | None]:
        """`kwargs` of one diffusers call with its prompts as this plan takes them, and the step
        callback that changes them between steps where a prompt is edited or alternates."""
        negative = kwargs.get("negative_prompt")
        negative = self.words(negative[0]) if negative else None
        if negative is not None:
            kwargs["negative_prompt"] = [self.text(negative)] * len(kwargs["negative_prompt"])
        if not self.kind:
            return kwargs, None
        if "prompt" not in kwargs or not self._needs_embeds([*kwargs["prompt"], *([negative] if negative else [])]):
            return kwargs, None
        prompts = kwargs.pop("prompt")
        kwargs.pop("negative_prompt", None)
        zero = self.kind == "clip2" and not negative and bool(self.pipe.config.get("force_zeros_for_empty_prompt"))
        switch = PromptSwitch(self.encoder, prompts, negative, zero, first_steps(kwargs))
        kwargs.update(call_embeds(self.encoder, *switch.texts_at(1, switch.steps), zero))
        return kwargs, switch if self.switches and switch.changes else None


class PromptSwitch:
    """A `callback_on_step_end` that gives the next step its prompts' text where it changes: the
    embeddings of the conditional copy (and the negative's copies) of the guidance batch are
    replaced, in the layout `pipelines.sampling.guidance` knows for the pipeline."""

    def __init__(self, encoder: Encoder, prompts: list[str], negative: str | None, zero: bool, steps: int) -> None:
        self.encoder, self.zero, self.steps = encoder, zero, steps
        self.prompts = [parse_schedule(p) for p in prompts]
        self.negative = parse_schedule(negative) if negative else None
        self.changes = any(scheduled(p) for p in [*prompts, *([negative] if negative else [])])
        self.current: tuple | None = None

    def texts_at(self, step: int, steps: int) -> tuple[list[str], str | None]:
        texts = [text_at(p, step, steps) for p in self.prompts]
        return texts, None if self.negative is None else text_at(self.negative, step, steps)

    @property
    def tensor_inputs(self) -> list[str]:
        return ["prompt_embeds", *([POOLED[self.encoder.kind]] if self.encoder.kind in POOLED else [])]

    def __call__(self, pipe: Any, step: int, _timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        total = pipe.num_timesteps
        if step + 2 > total:
            return {}
        texts = self.texts_at(step + 2, total)
        if self.current is None:
            self.current = self.texts_at(1, total)
        if texts == self.current:
            return {}
        self.current = texts
        layout = LAYOUTS[type(pipe).__name__]
        found = call_embeds(self.encoder, *texts, self.zero)
        guided = pipe.do_classifier_free_guidance

        def batch(positive: torch.Tensor, negative: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            if not guided:
                return positive.to(like)
            copies = [negative] * layout.chunks
            copies[layout.conditional] = positive
            return torch.cat(copies).to(like)

        out = {
            "prompt_embeds": batch(found["prompt_embeds"], found["negative_prompt_embeds"], tensors["prompt_embeds"])
        }
        if self.encoder.kind in POOLED:
            name = POOLED[self.encoder.kind]
            out[name] = batch(found["pooled_prompt_embeds"], found["negative_pooled_prompt_embeds"], tensors[name])
        return out
