"""Regional prompts in the denoiser: each region of the picture follows its own prompt (Regional Prompter's two modes).

Both methods work on a UNet called with `encoder_hidden_states` and a guidance batch laid out as
[unconditional, conditional] (SD 1.x/2.x, SDXL and their image-to-image, inpaint and ControlNet twins);
the pipeline itself encodes region 0's prompt, and this module adds the others. Weights are the
regions' boxes at the resolution in use, one region per pixel (they tile the picture); a base prompt
(before ADDBASE) is blended into every region by the base ratio.

- **Latent** (MultiDiffusion-style, Bar-Tal et al. 2023): a forward hook on the denoiser runs the
  conditional half once more per extra region, with that region's embeddings, and blends the
  conditional predictions by the regions' weights. A sampler's step is affine in the prediction, so this
  equals blending each region's own next latents. Cost: one denoiser call per region (the
  unconditional half once). Any attention backend; every denoiser argument of the batch (ControlNet
  residuals, IP-Adapter embeddings, SDXL's time ids) is sliced along with it.
- **Attention** (Regional Prompter's "Attention"): one denoiser call. A forward pre-hook hands the
  UNet all regions' embeddings side by side; every cross-attention runs its own processor (the device's
  choice, vanilla on NPU/MPS included) once per region and blends the outputs by the regions' weights at
  that layer's resolution (the output projection is linear, so blending after it is exact).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from pipelines.schema.regions import Box

FAMILIES = ("SD 1.x/2.x", "SDXL")  # what the refusal names: UNets with CLIP embeddings
HOOK = "regional_prompts"
CONTEXT = 0  # latent cells of context around a region's own cells in its window (docs: measured)


@dataclass
class RegionEmbeds:
    """One micro-batch's conditional embeddings of each region after the first, and of the base."""

    regions: list[dict[str, torch.Tensor]]  # per extra region: "prompt_embeds" (B, L, D) [, "pooled" (B, P)]
    base: dict[str, torch.Tensor] | None = None  # the base prompt's, when the prompt has one
    batch: int = 0  # images in the micro-batch (B)


@dataclass
class Regional:
    """The regions of one request and the hooks that draw them (`applied`)."""

    boxes: Sequence[Box]
    base_ratio: float
    method: str  # "Latent" | "Attention"
    chunk: RegionEmbeds | None = None  # set before each diffusers call (pipelines.run.denoise)
    _latent: tuple[int, int] = (0, 0)  # the latent's (h, w) in the current call (attention method)
    _length: int = 0  # each region's token count side by side (attention method)
    step: int = 1  # the UNet's size step in latent cells (2 ** its down-samplings): windows are multiples

    def weights(self, height: int, width: int, like: torch.Tensor) -> torch.Tensor:
        """(R, 1, height, width): 1 where each region's box covers a cell's centre; every cell in one region."""
        ys = (torch.arange(height, dtype=torch.float32) + 0.5) / height
        xs = (torch.arange(width, dtype=torch.float32) + 0.5) / width
        owner = torch.zeros(height, width, dtype=torch.long)
        for index, box in enumerate(self.boxes):
            inside = ((ys >= box.top) & (ys < box.bottom))[:, None] & ((xs >= box.left) & (xs < box.right))[None, :]
            owner[inside] = index
        weights = F.one_hot(owner, len(self.boxes)).permute(2, 0, 1)[:, None].float()
        return weights.to(device=like.device, dtype=like.dtype)

    @contextlib.contextmanager
    def applied(self, denoiser: Any) -> Iterator[None]:
        """The method's hook on `denoiser` (diffusers' own hook registry) for the duration; removed, and
        the attention processors restored, after."""
        from diffusers.hooks import HookRegistry

        registry = HookRegistry.check_if_exists_or_initialize(denoiser)
        original = dict(denoiser.attn_processors) if self.method == "Attention" else None
        try:
            if original is not None:
                denoiser.set_attn_processor({name: _wrap(self, name, p) for name, p in original.items()})
            registry.register_hook(_hook(self), HOOK)
            yield
        finally:
            registry.remove_hook(HOOK, recurse=False)
            if original is not None:
                denoiser.set_attn_processor(original)

    def owners(self, height: int, width: int) -> list[tuple[int, int, int, int]]:
        """Each region's cells (top, bottom, left, right) on a `height` x `width` latent: the boxes' edges
        rounded to cells, so the regions tile it."""
        return [
            (round(b.top * height), round(b.bottom * height), round(b.left * width), round(b.right * width))
            for b in self.boxes
        ]

    # ------------------------------------------------------------------ latent method
    def windowed(self, forward: Any, args: tuple, kwargs: dict) -> Any:
        """The denoiser's whole prediction: each region's window (its cells and CONTEXT around them,
        grown to the UNet's size step) denoised with its prompt, its own cells kept; the base prompt's
        prediction over the whole latent blended in by the base ratio."""
        assert self.chunk is not None
        sample = args[0] if args else kwargs["sample"]
        height, width = sample.shape[-2:]
        own = kwargs.get("encoder_hidden_states") if len(args) < 3 else args[2]
        prompts = [None, *self.chunk.regions]  # None: the call's own embeddings (region 0)
        out = None  # the prediction's shape is the first call's (an inpaint UNet takes 9 channels, gives 4)
        for embeds, (top, bottom, left, right) in zip(prompts, self.owners(height, width), strict=True):
            window = _window(top, bottom, left, right, height, width, self.step)
            prediction = _call(forward, args, kwargs, own, embeds, self.chunk.batch, window, (height, width))
            if out is None:
                out = torch.zeros(sample.shape[0], prediction.shape[1], height, width, dtype=prediction.dtype, device=prediction.device)
            y0, x0 = window[0], window[2]
            out[..., top:bottom, left:right] = prediction[..., top - y0 : bottom - y0, left - x0 : right - x0]
        if self.chunk.base is not None:
            whole = (0, height, 0, width)
            base = _call(forward, args, kwargs, own, self.chunk.base, self.chunk.batch, whole, (height, width))
            out = self.base_ratio * base + (1 - self.base_ratio) * out
        return (out,)

    # ------------------------------------------------------------------ attention method
    def concat(self, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        """All regions' embeddings side by side in the conditional rows (the unconditional repeated), so
        each cross-attention can take its region's slice (`_RegionalProcessor`)."""
        assert self.chunk is not None
        sample = args[0] if args else kwargs["sample"]
        self._latent = tuple(sample.shape[-2:])
        hidden = kwargs["encoder_hidden_states"]
        batch, count = self.chunk.batch, self._count
        extra = [e["prompt_embeds"] for e in self.chunk.regions] + ([self.chunk.base["prompt_embeds"]] if self.chunk.base else [])
        length = max(hidden.shape[1], *(e.shape[1] for e in extra))
        own = _pad(hidden, length)
        rows = [own[-batch:], *(_pad(e.to(hidden), length) for e in extra)]
        conditional = torch.cat(rows, dim=1)
        if hidden.shape[0] > batch:  # guided: the unconditional rows take the same slice in every region
            unconditional = own[: hidden.shape[0] - batch].repeat(1, count, 1)
            conditional = torch.cat([unconditional, conditional])
        self._length = length
        return args, {**kwargs, "encoder_hidden_states": conditional}

    @property
    def _count(self) -> int:
        assert self.chunk is not None
        return 1 + len(self.chunk.regions) + (1 if self.chunk.base is not None else 0)

    def attend(self, processor: Any, attn: Any, hidden: torch.Tensor, context: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        """One cross-attention: `processor` once per region's slice of `context`, blended at this resolution."""
        text, rest = (context[0], context[1:]) if isinstance(context, tuple) else (context, None)
        count, length = self._count, self._length
        outs = []
        for index in range(count):
            piece = text[:, index * length : (index + 1) * length]
            outs.append(processor(attn, hidden, (piece, *rest) if rest is not None else piece, *args, **kwargs))
        tokens = outs[0].shape[1] if outs[0].dim() == 3 else outs[0].shape[-2] * outs[0].shape[-1]
        height, width = _grid(tokens, self._latent)
        weights = self.weights(height, width, outs[0])  # (R, 1, h, w)
        regions = len(self.boxes)
        if outs[0].dim() == 3:
            weights = weights.flatten(2).transpose(1, 2)  # (R, h*w, 1)
        blended = sum(w * o for w, o in zip(weights, outs[:regions], strict=True))
        if count > regions:
            blended = self.base_ratio * outs[-1] + (1 - self.base_ratio) * blended
        return blended


class _RegionalProcessor:
    """A cross-attention's processor wrapped: regions' slices while a regional call runs, else itself."""

    def __init__(self, regional: Regional, processor: Any) -> None:
        self.regional, self.processor = regional, processor

    def __call__(self, attn: Any, hidden_states: torch.Tensor, encoder_hidden_states: Any = None, *args: Any, **kwargs: Any):
        if encoder_hidden_states is None or self.regional.chunk is None:
            return self.processor(attn, hidden_states, encoder_hidden_states, *args, **kwargs)
        return self.regional.attend(self.processor, attn, hidden_states, encoder_hidden_states, *args, **kwargs)


def _wrap(regional: Regional, name: str, processor: Any) -> Any:
    return _RegionalProcessor(regional, processor) if name.endswith("attn2.processor") else processor


def _hook(regional: Regional) -> Any:
    """The diffusers `ModelHook` of `regional`'s method: the whole forward (Latent) or its arguments (Attention)."""
    from diffusers.hooks import ModelHook

    class Hook(ModelHook):
        def new_forward(self, module: Any, *args: Any, **kwargs: Any) -> Any:
            if regional.chunk is None or regional.method == "Attention":
                if regional.chunk is not None:
                    args, kwargs = regional.concat(args, kwargs)
                return self.fn_ref.original_forward(*args, **kwargs)
            out = regional.windowed(self.fn_ref.original_forward, args, kwargs)
            return out if not kwargs.get("return_dict", True) else _Output(out[0])

    return Hook()


@dataclass
class _Output:
    """What a UNet returns with `return_dict=True` (`.sample`), for callers that ask for it."""

    sample: torch.Tensor

    def __getitem__(self, index: int) -> torch.Tensor:
        return (self.sample,)[index]


def _window(top: int, bottom: int, left: int, right: int, height: int, width: int, step: int) -> tuple[int, int, int, int]:
    """A region's window: its cells with CONTEXT cells around, its edges on the UNet's step (so every down-sampled
    map, ControlNet's residuals too, is cut on whole cells), inside the latent."""
    def grown(low: int, high: int, size: int) -> tuple[int, int]:
        low, high = max(0, low - CONTEXT), min(size, high + CONTEXT)
        return low - low % step, min(size, -(-high // step) * step)

    y0, y1 = grown(top, bottom, height)
    x0, x1 = grown(left, right, width)
    return y0, y1, x0, x1


def _call(forward: Any, args: tuple, kwargs: dict, own: Any, embeds: dict | None, batch: int, window: tuple, latent: tuple) -> torch.Tensor:
    """The denoiser on `window` of every spatial argument, the conditional rows with `embeds` (None: as called)."""
    args = tuple(_crop(a, window, latent) for a in args)
    kwargs = {k: _crop(v, window, latent) for k, v in kwargs.items()}
    if embeds is not None:
        hidden = _pad(own, embeds["prompt_embeds"].shape[1]).clone()  # a copy: the call's own stay as they are
        hidden[-batch:] = _pad(embeds["prompt_embeds"].to(hidden), hidden.shape[1])
        if len(args) > 2:  # encoder_hidden_states given by position
            args = (*args[:2], hidden, *args[3:])
        else:
            kwargs["encoder_hidden_states"] = hidden
        added = kwargs.get("added_cond_kwargs")
        if "pooled" in embeds and isinstance(added, dict) and "text_embeds" in added:
            text = added["text_embeds"].clone()
            text[-batch:] = embeds["pooled"].to(text)
            kwargs["added_cond_kwargs"] = {**added, "text_embeds": text}
    kwargs["return_dict"] = False
    return forward(*args, **kwargs)[0]


def _crop(value: Any, window: tuple, latent: tuple) -> Any:
    """`value`'s part inside `window` where it is a map over the latent (the sample, ControlNet's residuals at
    every resolution); anything else as it is."""
    if isinstance(value, torch.Tensor):
        if value.dim() != 4:
            return value
        scale = _scale(value.shape[-2:], latent)
        if scale is None:
            return value
        y0, y1, x0, x1 = window
        return value[..., y0 // scale : math.ceil(y1 / scale), x0 // scale : math.ceil(x1 / scale)]
    if isinstance(value, dict):
        return {k: _crop(v, window, latent) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_crop(v, window, latent) for v in value)
    return value


def _scale(size: Any, latent: tuple) -> int | None:
    """k where a map of `size` is the latent down-sampled by 2^k (rounding up, as the UNet does); None if it is not one."""
    for k in range(8):
        scale = 2**k
        if tuple(size) == (math.ceil(latent[0] / scale), math.ceil(latent[1] / scale)):
            return scale
    return None


def _grid(tokens: int, latent: tuple[int, int]) -> tuple[int, int]:
    """A layer's (h, w) from its token count and the latent's shape (each down-sampling halves, rounding up)."""
    height, width = latent
    while height * width > tokens and height > 1:
        height, width = math.ceil(height / 2), math.ceil(width / 2)
    if height * width != tokens:
        raise ValueError(f"regional attention: {tokens} tokens do not match a latent of {latent}")
    return height, width


def _pad(embeds: torch.Tensor, length: int) -> torch.Tensor:
    """Embeddings made `length` tokens long by repeating their last token (CLIP's end/padding token)."""
    if embeds.shape[1] >= length:
        return embeds
    return torch.cat([embeds, embeds[:, -1:].expand(-1, length - embeds.shape[1], -1)], dim=1)
