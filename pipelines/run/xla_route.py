"""The TPU route of ImagePipeline: a loaded pipeline moved to JAX and compiled by torchax, and what it refuses.

Owns the pipeline side of the `tpu` device kind (the device side, JAX and torchax themselves, is
devices/xla.py). Imported only when a model loads on `tpu`, so `import pipelines` never needs JAX.

How a request runs there (docs/devices.md, "TPU"): the UNet and the VAE decoder are `torchax.compile`d
(one XLA program per input shape, compiled on first use: each new batch size or image size compiles
once, then the cached program runs); the text encoder, the VAE encoder (image-to-image, inpaint) and
the scheduler's arithmetic run op by op on JAX arrays; the initial noise is drawn on the CPU from the
request's CPU generators (diffusers' `randn_tensor`), so a seed gives the CPU's image. The whole request
runs inside torchax's environment (`context`), previews and progress included.

Several chips: `PREFERRED_DEVICE=tpu` serves ONE replica over a mesh of every visible chip, its batch
sharded (devices.xla.shard_batch); `tpu:0` is one chip. Why one replica, not a pool of one per chip:
the compiled programs and the weights' placement are the mesh's, so one load and one compile serve
every chip, where a pool would compile and hold a copy per chip, and torchax's environment is one
per process. A batch that does not divide by the chips runs replicated (same images, no speed-up).

Refused here, with the reason (`load_refusal`, `request_refusal`): families without a UNet and an
AutoencoderKL (only the UNet families are compiled), a pool of single chips other than the first,
weight offload, a recipe's LoRAs that are not fused, and per request LoRAs, step caches, ControlNet,
IP-Adapter and regional Attention: each changes modules inside the compiled UNet, whose program was
traced once with the weights as its inputs (peft's adapter layers or a hook added later would be
silently left out of it, or served stale). Also refused, for what torchax cannot run op by op:
5 samplers (NO_TPU_SAMPLERS) and inpainting (WHY_INPAINT). A recipe's fused LoRAs run: they are in the
weights before the compile (peft's emptied wrappers are removed first, in pipelines.run.model_setup).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from devices import xla
from devices.manager import OFFLOAD_SAVERS
from pipelines.sampling.step_cache import NONE as NO_STEP_CACHE
from pipelines.schema.errors import LoraError
from pipelines.schema.request import GenerationRequest

log = logging.getLogger(__name__)

WHY_COMPILED = "the TPU route runs a UNet compiled once by torchax with its weights as inputs"
# Samplers whose step indexes a CPU tensor of the scheduler (alphas_cumprod) with the JAX timestep, which torchax
# cannot do ("'Tensor' object has no attribute '_env'", measured on every offered sampler of the embedded model);
# the other 16 (DPM++, DPM2, Euler, Heun, LMS, UniPC, DEIS and their Karras forms) run.
NO_TPU_SAMPLERS = ("DDIM", "PLMS", "LCM", "TCD", "DDPMScheduler")
WHY_SAMPLER = "its step indexes a CPU tensor of the scheduler with a JAX timestep, which torchax cannot do"
# diffusers' inpainting pipeline over a plain (4-channel) UNet blends with `torch.tensor([noise_timestep])` of a JAX
# scalar, which torchax cannot build ("Tensor.item() cannot be called on meta tensors")
WHY_INPAINT = "diffusers' inpainting pipeline builds torch.tensor([timestep]) from a JAX scalar, which torchax cannot"
REQUEST_REFUSALS = {
    "loras": f"LoRAs cannot be switched per request on tpu: {WHY_COMPILED}; peft's adapter layers added "
    "later are not in that program (fuse a LoRA into the model with a recipe's `fuse: true` instead)",
    "step_cache": f"step caches skip blocks inside the denoiser, and {WHY_COMPILED}",
    "controlnet": f"ControlNet adds residuals inside the denoiser, and {WHY_COMPILED}; not available on tpu",
    "ip_adapter": f"IP-Adapter swaps the denoiser's attention processors, and {WHY_COMPILED}; not available on tpu",
    "regions": f"regional prompts' Attention mode changes the denoiser's cross-attention, and {WHY_COMPILED}",
}


@dataclass
class XlaRoute:
    """One pipeline on JAX: the compiled pipeline and torchax's environment, on `chips` devices."""

    jax_pipe: xla.JaxPipeline
    chips: int
    platform: str

    def context(self) -> Any:
        """What a request runs inside: torchax's environment (thread-local: entered by the request's thread)."""
        return self.jax_pipe.env

    def describe(self) -> str:
        """For the status panel's compile line."""
        where = f"a mesh of {self.chips} {self.platform} devices, batch sharded" if self.chips > 1 else f"1 {self.platform} device"
        return f"XLA through torchax on {where}: UNet and VAE decoder compiled per shape, text encoder op by op"


def load_refusal(pipe: Any, dm: Any, base_loras: dict[str, float], savers: list[str]) -> str | None:
    """Why this loaded pipeline cannot move to the TPU route, or None."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    index = dm.options.device.index
    if index not in (None, 0):
        return (
            f"tpu:{index}: one chip other than the first is not served; PREFERRED_DEVICE=tpu serves every chip as "
            "one replica (a mesh, the batch sharded), tpu:0 the first alone"
        )
    unet, vae = getattr(pipe, "unet", None), getattr(pipe, "vae", None)
    if not isinstance(unet, UNet2DConditionModel) or not isinstance(vae, AutoencoderKL):
        return (
            f"{type(pipe).__name__} has no UNet2DConditionModel + AutoencoderKL: the TPU route compiles those "
            "(the SD 1.x/2.x and SDXL families); transformer families (SD3, Flux, video models) are not ported "
            "(beside the embedded model: VIDEO_MODEL_ID=none serves it without its video model)"
        )
    offloaded = set(OFFLOAD_SAVERS) & set(savers)
    if offloaded:
        return f"{', '.join(sorted(offloaded))} moves weights per call; the compiled programs take them on the device"
    if base_loras:
        return f"the recipe's LoRAs {sorted(base_loras)} are not fused: {REQUEST_REFUSALS['loras']}"
    return None


def install(pipe: Any, dm: Any) -> XlaRoute:
    """Moves `pipe` (on the CPU, set up) to JAX and compiles its UNet and VAE decoder; over every chip
    when the request names none (`tpu`), batch-sharded."""
    available, reason, count, platform = xla.jax_devices_summary(allow_cpu=True)
    if not available:  # the DeviceManager chose tpu, so JAX answered before: it cannot have gone
        raise RuntimeError(f"the TPU route found no JAX device: {reason}")
    jax_pipe = xla.to_jax(pipe)
    chips = count if dm.options.device.index is None else 1
    if chips > 1:
        xla.shard_batch(jax_pipe, xla.make_mesh(chips))
    route = XlaRoute(jax_pipe, chips, platform.upper())
    log.info("%s", route.describe())
    return route


def request_refusal(request: GenerationRequest, sampler: str) -> str | None:
    """Why this request cannot run on the TPU route, or None (checked with the request's other refusals);
    `sampler`: the one it runs with (its own, else the model's)."""
    if sampler in NO_TPU_SAMPLERS:
        return f"the sampler {sampler} cannot run on tpu: {WHY_SAMPLER}; choose DPM++ 2M, Euler a, UniPC or another"
    if request.inpaint is not None:
        return f"inpaint cannot run on tpu yet: {WHY_INPAINT}"
    regions = request.regions
    asked = {
        "loras": bool(request.loras),
        "step_cache": request.step_cache not in (None, NO_STEP_CACHE),
        "controlnet": bool(request.controlnet),
        "ip_adapter": bool(request.ip_adapter),
        "regions": regions is not None and bool(regions.regional_prompts) and regions.region_method == "Attention",
    }
    return next((REQUEST_REFUSALS[name] for name, on in asked.items() if on), None)


def refuse_lora_load() -> None:
    """A LoRA loaded into a pipeline on the TPU route (the LoRA tab, the API): LoraError with the reason."""
    raise LoraError(REQUEST_REFUSALS["loras"])
