"""Image-to-video for a video model with no image input of its own (AnimateDiff): its first frame kept.

AnimateDiff is an image UNet with motion modules. The first frame is kept as diffusers' SD inpainting keeps the
unmasked latents of a 4-channel UNet: after each step the clip's first latent frame is replaced by the image's
latent noised to the level of the step that comes next (the image's own latent after the last), so the motion
modules carry the picture into the frames after it. A `callback_on_step_end` changer
(pipelines.run.callbacks.Chained)."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

# video pipelines whose image-to-video keeps the first frame this way (pipelines.video.family)
KEEPS_FIRST_FRAME = frozenset({"AnimateDiffPipeline"})


class FirstFrame:
    """Keeps latent frame 0 of one clip on the path of `image` (a PIL image at the clip's size); the noise mixed
    into it is drawn from `generator` (the clip's seed), once."""

    tensor_inputs: ClassVar[list[str]] = ["latents"]

    def __init__(self, image: Any, generator: torch.Generator):
        self.image, self.generator = image, generator
        self.latent: torch.Tensor | None = None
        self.noise: torch.Tensor | None = None

    def _encode(self, pipe: Any, like: torch.Tensor) -> None:
        vae = pipe.vae
        height, width = like.shape[-2] * pipe.vae_scale_factor, like.shape[-1] * pipe.vae_scale_factor
        pixels = pipe.video_processor.preprocess(self.image, height=height, width=width)
        with torch.no_grad():
            latent = vae.encode(pixels.to(vae.device, vae.dtype)).latent_dist.mode() * vae.config.scaling_factor
        self.latent = latent.to(like.device, like.dtype)
        self.noise = torch.randn(self.latent.shape, generator=self.generator).to(like.device, like.dtype)

    def __call__(self, pipe: Any, step: int, _timestep: Any, tensors: dict[str, Any]) -> dict[str, Any]:
        latents = tensors["latents"]  # (batch, channels, frames, height, width)
        if self.latent is None:
            self._encode(pipe, latents)
        timesteps = pipe.scheduler.timesteps
        kept = self.latent
        if step + 1 < len(timesteps):
            kept = pipe.scheduler.add_noise(self.latent, self.noise, timesteps[step + 1 : step + 2])
        latents = latents.clone()
        latents[:, :, 0] = kept.expand(latents.shape[0], -1, -1, -1)
        return {"latents": latents}
