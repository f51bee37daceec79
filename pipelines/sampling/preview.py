"""Cheap previews of images while they denoise, from the latents the step callback sees.

Two decoders, chosen per call by the latent's size:
- small latents (at most VAE_MAX_TOKENS positions, e.g. 16x16 for the embedded model), or any latents
  when the VAE is a tiny autoencoder (TINY_VAE): the VAE itself. Exact, and cheap at that size
  (measured in benchmarks: see README "Live previews").
- larger ones: a linear latent -> RGB projection (one 3 x (C+1) matrix) fitted by least squares on
  this pipeline's own finished images: after each finished batch the last step's latents and the
  decoded images are paired. So it fits whatever VAE the model has, with no per-family tables; the
  first large generation after a load shows progress only, later ones show previews.
A video's latents (batch, channels, frames, height, width), small ones, are decoded by the VAE into a
strip of STRIP_FRAMES frames per clip. Latents that are not such a grid (Flux-style packed sequences) get
no preview; the UI then shows progress only.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch
from PIL import Image

from pipelines.sampling.vae_tiling import TINY_VAES

log = logging.getLogger(__name__)

VAE_MAX_TOKENS = 32 * 32
STRIP_FRAMES = 5  # a clip's preview: this many of its frames, side by side


class PreviewDecoder:
    """Turns step latents into small PIL images for one diffusers pipeline."""

    def __init__(self, pipe: Any):
        self.pipe = pipe
        self.projection: torch.Tensor | None = None  # (C + 1, 3)

    def available(self, latents: Any) -> bool:
        return isinstance(latents, torch.Tensor) and latents.ndim == 4

    def decode(self, latents: torch.Tensor) -> list[Image.Image] | None:
        if isinstance(latents, torch.Tensor) and latents.ndim == 5:
            return self._clip_strips(latents)
        if not self.available(latents):
            return None
        vae = getattr(self.pipe, "vae", None)
        small = latents.shape[-1] * latents.shape[-2] <= VAE_MAX_TOKENS
        if vae is not None and (small or type(vae).__name__ in TINY_VAES):  # as A1111's TAESD previews
            return self._with_vae(latents)
        if self.projection is None or self.projection.shape[0] != latents.shape[1] + 1:
            return None
        return self._with_projection(latents)

    @torch.no_grad()
    def _with_vae(self, latents: torch.Tensor) -> list[Image.Image]:
        vae = self.pipe.vae
        config = vae.config
        scaled = latents.to(vae.dtype) / getattr(config, "scaling_factor", 1.0)
        shift = getattr(config, "shift_factor", None)
        if shift:
            scaled = scaled + shift
        pixels = vae.decode(scaled, return_dict=False)[0]
        return _to_pil((pixels.float().clamp(-1, 1) + 1) / 2)

    @torch.no_grad()
    def _clip_strips(self, latents: torch.Tensor) -> list[Image.Image] | None:
        """A video's latents (B, C, frames, h, w), small ones only: each clip's frames decoded by its VAE (Wan's
        normalisation undone: `latents_mean` / `latents_std`), STRIP_FRAMES of them side by side."""
        vae, (h, w) = getattr(self.pipe, "vae", None), latents.shape[-2:]
        config = getattr(vae, "config", None)
        if vae is None or h * w > VAE_MAX_TOKENS or getattr(config, "latents_mean", None) is None:
            return None
        mean = torch.tensor(config.latents_mean).view(1, -1, 1, 1, 1)
        std = torch.tensor(config.latents_std).view(1, -1, 1, 1, 1)
        video = vae.decode((latents.float().cpu() * std + mean).to(vae.dtype), return_dict=False)[0]  # B, 3, F, H, W
        picks = np.linspace(0, video.shape[2] - 1, min(STRIP_FRAMES, video.shape[2])).round().astype(int).tolist()
        strips = torch.cat([video[:, :, i] for i in picks], dim=-1)  # B, 3, H, W x picks
        return _to_pil((strips.float().clamp(-1, 1) + 1) / 2)

    def _with_projection(self, latents: torch.Tensor) -> list[Image.Image]:
        x = latents.float().cpu().permute(0, 2, 3, 1)  # B, h, w, C
        ones = torch.ones(*x.shape[:-1], 1)
        rgb = torch.cat([x, ones], dim=-1) @ self.projection  # B, h, w, 3
        return _to_pil(rgb.clamp(0, 1).permute(0, 3, 1, 2))

    def learn(self, latents: torch.Tensor, images: list[Image.Image]) -> None:
        """Fit the projection from finished images and the latents they came from (least squares)."""
        if not self.available(latents) or latents.shape[-1] * latents.shape[-2] <= VAE_MAX_TOKENS:
            return
        h, w = latents.shape[-2:]
        x = latents.float().cpu().permute(0, 2, 3, 1).reshape(-1, latents.shape[1])
        x = torch.cat([x, torch.ones(x.shape[0], 1)], dim=1)
        small = [np.asarray(im.convert("RGB").resize((w, h), Image.BILINEAR), dtype=np.float32) / 255 for im in images]
        y = torch.from_numpy(np.stack(small).reshape(-1, 3))
        if x.shape[0] != y.shape[0]:
            return
        self.projection = torch.linalg.lstsq(x, y).solution
        log.debug("preview projection fitted on %d positions", x.shape[0])


def _to_pil(batch: torch.Tensor) -> list[Image.Image]:
    arrays = (batch.permute(0, 2, 3, 1).cpu().numpy() * 255).round().astype("uint8")
    return [Image.fromarray(a) for a in arrays]
