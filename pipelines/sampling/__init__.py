"""The denoising loop's knobs: samplers, guidance end, step caches, tiled VAE and live previews.

Owns: A1111's sampler and schedule names mapped to diffusers' schedulers (`samplers`), classifier-free
guidance stopped early (`guidance`), step caches (`step_cache`), tiled VAE for large images
(`vae_tiling`), cheap previews from the latents (`preview`), regional prompts in the denoiser (`regional`).

May import: the schema only (and torch/diffusers lazily where a knob is applied).
"""
