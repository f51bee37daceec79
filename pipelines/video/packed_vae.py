"""A video VAE made of an image VAE: each frame through the image VAE, 4 frames (and optionally 2x2 latent pixels)
packed into the channels of one latent, as Wan's causal 3-D VAE lays its latents out (a first latent frame of its
own, then one per 4 frames), so `WanPipeline` runs on it unchanged.

The embedded video model (models/tiny-shapes-video) uses it over the embedded image model's VAE: the frames
look as tiny-shapes draws them, and no video VAE had to be trained. With the image VAE's 4 channels at 4x
fewer pixels a side, a latent frame has 4 frames x 4 channels = 16 channels (`space` 1: `scale_factor_spatial`
4; `space` 2 packs 2x2 latent pixels too: 64 channels at 8x), `scale_factor_temporal` 4. The first frame's
latent holds it 4 times (decoded from their mean): a clip of k x 4 + 1 frames has k + 1 latent frames, as
with Wan's VAE.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from diffusers import AutoencoderKL
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_outputs import AutoencoderKLOutput
from diffusers.models.modeling_utils import ModelMixin

DECODE_FRAMES = 8


class _Packed:
    """What `vae.encode(...).latent_dist` offers the pipelines: the packed means (deterministic)."""

    def __init__(self, latents: torch.Tensor):
        self.latents = latents

    def mode(self) -> torch.Tensor:
        return self.latents

    def sample(self, generator: Any = None) -> torch.Tensor:
        return self.latents


class FramePackedVAE(ModelMixin, ConfigMixin):
    """An image `AutoencoderKL` applied frame by frame, its latents packed 4 frames and 2x2 pixels per latent."""

    _supports_gradient_checkpointing = False

    @register_to_config
    def __init__(
        self,
        image_vae_config: dict | None = None,
        frames_per_latent: int = 4,
        space: int = 2,
        z_dim: int = 64,
        latents_mean: list[float] | None = None,
        latents_std: list[float] | None = None,
        scale_factor_temporal: int = 4,
        scale_factor_spatial: int = 8,
    ):
        super().__init__()
        self.image_vae = AutoencoderKL(**(image_vae_config or {}))
        channels = self.image_vae.config.latent_channels * frames_per_latent * space * space
        if channels != z_dim:
            raise ValueError(f"z_dim {z_dim} is not {channels} (latent channels x frames per latent x space^2)")

    @classmethod
    def around(cls, image_vae: AutoencoderKL, frames_per_latent: int = 4, space: int = 2) -> FramePackedVAE:
        """A packed VAE over `image_vae`'s weights (its config kept, its weights copied)."""
        config = {k: v for k, v in image_vae.config.items() if not k.startswith("_")}
        z_dim = image_vae.config.latent_channels * frames_per_latent * space * space
        factor = 2 ** (len(image_vae.config.block_out_channels) - 1) * space
        packed = cls(config, frames_per_latent, space, z_dim, [0.0] * z_dim, [1.0] * z_dim, frames_per_latent, factor)
        packed.image_vae.load_state_dict(image_vae.state_dict())
        return packed

    def _groups(self, frames: int) -> list[list[int]]:
        """Frame indices per latent frame: the first alone (repeated), then runs of `frames_per_latent`."""
        n = self.config.frames_per_latent
        if (frames - 1) % n:
            raise ValueError(f"{frames} frames is not k x {n} + 1")
        return [[0] * n] + [list(range(1 + i * n, 1 + (i + 1) * n)) for i in range((frames - 1) // n)]

    def encode(self, x: torch.Tensor, return_dict: bool = True) -> Any:
        """(B, 3, F, H, W) in [-1, 1] -> packed latents (B, z_dim, 1 + (F - 1) / 4, H / 8, W / 8)."""
        b, _, f, h, w = x.shape
        flat = x.permute(0, 2, 1, 3, 4).reshape(b * f, 3, h, w)
        means = self.image_vae.encode(flat).latent_dist.mode()
        c, lh, lw = means.shape[1:]
        means = means.reshape(b, f, c, lh, lw)
        groups = [means[:, idx].reshape(b, -1, lh, lw) for idx in self._groups(f)]  # each (B, n*c, lh, lw)
        packed = torch.stack(groups, dim=1).flatten(0, 1)  # (B*L, n*c, lh, lw)
        packed = F.pixel_unshuffle(packed, self.config.space)
        latents = packed.reshape(b, len(groups), *packed.shape[1:]).permute(0, 2, 1, 3, 4)
        dist = _Packed(latents)
        return AutoencoderKLOutput(latent_dist=dist) if return_dict else (dist,)

    def decode(self, z: torch.Tensor, return_dict: bool = True) -> Any:
        """Packed latents -> frames (B, 3, 1 + (L - 1) x 4, H, W) in [-1, 1]; the first frame from its copies' mean."""
        from diffusers.models.autoencoders.vae import DecoderOutput

        b, _, latent_frames = z.shape[:3]
        n, c = self.config.frames_per_latent, self.image_vae.config.latent_channels
        flat = z.permute(0, 2, 1, 3, 4).flatten(0, 1)
        flat = F.pixel_shuffle(flat, self.config.space)  # (B*L, n*c, lh, lw)
        per_frame = flat.reshape(b, latent_frames, n, c, *flat.shape[2:])
        first = per_frame[:, :1].mean(dim=2)  # (B, 1, c, lh, lw)
        rest = per_frame[:, 1:].flatten(1, 2)  # (B, (L-1)*n, c, lh, lw)
        frames = torch.cat([first, rest], dim=1)
        count = frames.shape[1]
        flat_frames = frames.flatten(0, 1)  # decoded DECODE_FRAMES at a time: the peak stays one chunk's, whatever the length
        images = torch.cat([self.image_vae.decode(part).sample for part in flat_frames.split(DECODE_FRAMES)]).clamp(-1.0, 1.0)
        video = images.reshape(b, count, *images.shape[1:]).permute(0, 2, 1, 3, 4)
        return DecoderOutput(sample=video) if return_dict else (video,)
