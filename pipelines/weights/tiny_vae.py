"""TINY_VAE: a tiny autoencoder (TAESD: diffusers' `AutoencoderTiny`) in place of the model's own VAE.

Why: on a CPU the VAE is a large share of a few-step request, and TAESD (2.4 M parameters against SD 1.5 VAE's
84 M) decodes an order of magnitude faster (measured: docs/performance.md#a-tiny-vae-tiny_vae). FastSD CPU offers
it as its "tiny autoencoder", SD.Next as the Tiny VAE type. The price: a little softer detail than the full VAE.

`TINY_VAE` is read once at load (PipelineOptions.tiny_vae):
- "" (default): the model's own VAE;
- `auto`: the tiny autoencoder made for the model's latents, by family (`AUTO`), where it fits; else the model's
  VAE stays, and the status panel says why (a VAE of another kind, latents of another size, the Hub unreachable);
- a folder or a Hub id: that `AutoencoderTiny`, refused at load (ModelLoadError naming both) where its latents do
  not fit the model's; a model whose VAE is of another kind (a video model's, a DC-AE) keeps it, and says why.

It decodes and encodes (image-to-image, inpaint, hires fix) for every task of the model. With OpenVINO its encoder
and decoder run as graphs as AutoencoderKL's do (pipelines.weights.openvino).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.schema.errors import ModelLoadError

log = logging.getLogger(__name__)

# The pipeline class's family (longest prefix first) -> madebyollin's tiny autoencoder for its latents, the ones
# diffusers' AutoencoderTiny documentation loads.
AUTO = (
    ("StableDiffusionXL", "madebyollin/taesdxl"),
    ("StableDiffusion3", "madebyollin/taesd3"),
    ("StableDiffusion", "madebyollin/taesd"),  # SD 1.x / 2.x, their image-to-image, inpaint, InstructPix2Pix
    ("Flux", "madebyollin/taef1"),
)
FULL_VAES = ("AutoencoderKL",)  # the VAEs a tiny one stands in for (video and DC-AE VAEs have other latents)


@dataclass(frozen=True)
class TinyVae:
    """What TINY_VAE gave this model: the tiny autoencoder's name, or why the model's own VAE stays."""

    name: str = ""  # "taesd": the tiny autoencoder in use ("" for the model's own VAE)
    skipped: str = ""  # why the model's own VAE stays where TINY_VAE asked for a tiny one

    def describe(self) -> str:
        """The status panel's VAE line."""
        if self.name:
            return f"tiny: {self.name} (TINY_VAE)"
        return f"the model's own ({self.skipped})" if self.skipped else "the model's own"


def auto_source(class_name: str) -> str | None:
    """The Hub id of the tiny autoencoder made for a pipeline class's latents, None where none is known."""
    return next((ref for family, ref in AUTO if class_name.startswith(family)), None)


def scale_of(config: Any) -> int:
    """An AutoencoderTiny's pixels per latent: one upsampling between each of its decoder's blocks."""
    return int(config["upsampling_scaling_factor"]) ** (len(config["decoder_block_out_channels"]) - 1)


def misfit(pipe: Any, config: Any) -> str | None:
    """Why an AutoencoderTiny with `config` cannot decode the latents of this pipeline's AutoencoderKL, None where
    it can."""
    vae = pipe.vae
    ours, theirs = (vae.config.latent_channels, pipe.vae_scale_factor), (config["latent_channels"], scale_of(config))
    if ours != theirs:
        return (
            f"it decodes {theirs[0]}-channel latents at {theirs[1]}x; this model's are {ours[0]}-channel at {ours[1]}x"
        )
    return None


def apply(pipe: Any, class_name: str, setting: str) -> TinyVae:
    """TINY_VAE on a loaded pipeline: its VAE replaced by the tiny autoencoder `setting` names (see the module)."""
    if not setting:
        return TinyVae()
    ref = auto_source(class_name) if setting == "auto" else setting
    if ref is None:
        return TinyVae(skipped=f"no tiny autoencoder is known for {class_name}")
    kind = type(getattr(pipe, "vae", None)).__name__
    if kind not in FULL_VAES:
        return TinyVae(skipped=f"the model's VAE is a {kind}; a tiny autoencoder stands in for {', '.join(FULL_VAES)}")
    try:
        tiny = _load(pipe, ref)
    except (OSError, ValueError) as exc:
        if setting != "auto":
            raise ModelLoadError(f"TINY_VAE={setting}: {exc}") from None
        log.warning("TINY_VAE=auto: %s stays with its own VAE: %s", class_name, exc)
        return TinyVae(skipped=f"{ref}: {str(exc).splitlines()[0]}")
    pipe.register_modules(vae=tiny)
    name = Path(ref).name if Path(ref).expanduser().is_dir() else ref.split("/")[-1]
    log.info("TINY_VAE: %s decodes and encodes in place of the model's VAE", ref)
    return TinyVae(name=name)


def _load(pipe: Any, ref: str) -> Any:
    """The AutoencoderTiny at `ref` in the model's VAE's dtype, or ValueError where it does not fit the latents
    (read from its config first: a misfit downloads no weights)."""
    from diffusers import AutoencoderTiny

    config = AutoencoderTiny.load_config(ref)
    if config.get("_class_name") != "AutoencoderTiny":
        raise ValueError(f"{ref} holds a {config.get('_class_name')}, not an AutoencoderTiny")
    why = misfit(pipe, config)
    if why:
        raise ValueError(f"{ref} does not fit this model: {why}")
    return AutoencoderTiny.from_pretrained(ref, torch_dtype=pipe.vae.dtype).to(pipe.vae.device).eval()
