"""Tiled VAE for large images: the decode (and an image-to-image's encode) in overlapping tiles.

The VAE's decode is the memory peak of a large image: its activations grow with the pixels, while
the denoiser works on latents 8x smaller a side. diffusers' `enable_tiling` bounds that peak by the
tile; it costs a little time and can leave faint seams, so it is used only where it pays:

| when | why |
|---|---|
| the image has more pixels than TILED_VAE_PIXELS (default 4 x the model's native area) | beyond the sizes a model is made for, the decode's peak outgrows the denoiser's |
| MEMORY_MODE balanced or max (or auto choosing them) turned it on at load | memory is short for any size (devices.manager) |

A VAE without `enable_tiling` (some families' autoencoders) decodes whole; the result says which ran. So does
a tiny autoencoder (TINY_VAE, `TINY_VAES`): its activations are small, and diffusers' tiled decode for it assumes
latents at 8x.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

# Tiny autoencoders (TINY_VAE): they always decode whole (the module's docstring says why), and they are cheap
# enough to decode every live preview, at any size (pipelines.sampling.preview)
TINY_VAES = ("AutoencoderTiny",)


def tiles(vae: Any) -> bool:
    """Whether this VAE can decode in tiles."""
    return callable(getattr(vae, "enable_tiling", None)) and type(vae).__name__ not in TINY_VAES


def keep_whole(pipe: Any, memory_savers: list[str]) -> list[str]:
    """The memory savers after a load, with the VAE's tiling taken back where it must decode whole (`TINY_VAES`)."""
    vae = getattr(pipe, "vae", None)
    if "vae_tiling" not in memory_savers or type(vae).__name__ not in TINY_VAES:
        return memory_savers
    vae.disable_tiling()
    return [saver for saver in memory_savers if saver != "vae_tiling"]


@contextlib.contextmanager
def applied(pipe: Any, size: tuple[int, int], threshold: int, memory_savers: list[str]) -> Iterator[bool]:
    """Tiling on for this call where `size` is above `threshold` pixels (and back off after);
    yields whether the VAE decodes in tiles (also when the memory mode turned it on at load)."""
    if "vae_tiling" in memory_savers:
        yield True
        return
    vae = getattr(pipe, "vae", None)
    wanted = size[0] * size[1] > threshold and tiles(vae)
    if not wanted:
        yield False
        return
    vae.enable_tiling()
    log.info("VAE tiling on for %dx%d (above %d pixels)", size[0], size[1], threshold)
    try:
        yield True
    finally:
        vae.disable_tiling()
