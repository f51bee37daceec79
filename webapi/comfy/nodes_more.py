"""The node classes beyond the core graph: ControlNet and the custom-sampling family (the nodes
Krita AI Diffusion and Flux-style graphs generate with). Registered in `registry.NODES` on import.

SamplerCustom(Advanced) puts a KSampler's inputs back together from its parts — RandomNoise (the
seed), KSamplerSelect (the sampler), BasicScheduler (scheduler, steps, denoise), CFGGuider or
BasicGuider (model, conditionings, CFG; BasicGuider's is 1: no classifier-free guidance) — and
runs as KSampler does (`sampler.sample`).
"""

from __future__ import annotations

from typing import Any

from .registry import CFG, DENOISE, SAMPLER, SCHEDULER, SEED, STEPS, In, combo, link, node
from .sampler import SamplerInputs, sample
from .values import Clip, Conditioning, Control, Guider, Latent, Model, Noise, Pictures, Sigmas

STRENGTH = In("FLOAT", 1.0, 0.0, 2.0, 0.01)  # ControlUnit.weight's range
PERCENT = In("FLOAT", 0.0, 0.0, 1.0, 0.001)


@node("ControlNetLoader", "loaders", {"control_net_name": combo(lambda c: c.controlnets)}, ("CONTROL_NET",))
def controlnet_loader(ctx: Any, control_net_name: str) -> tuple:
    """One of the model's ControlNets (CONTROLNET_DIR and the embedded ones)."""
    return (control_net_name,)


def _controlled(cond: Conditioning, control: Control) -> Conditioning:
    return Conditioning(cond.text, cond.clip, (*cond.controls, control))


@node("ControlNetApply", "conditioning/controlnet", {
    "conditioning": link("CONDITIONING"), "control_net": link("CONTROL_NET"), "image": link("IMAGE"), "strength": STRENGTH,
}, ("CONDITIONING",))  # fmt: skip
def controlnet_apply(ctx: Any, conditioning: Conditioning, control_net: str, image: Pictures, strength: float) -> tuple:
    """A ControlNet with its control image (a ready map: no preprocessor runs here)."""
    return (_controlled(conditioning, Control(control_net, image.images[0], strength)),)


@node("ControlNetApplyAdvanced", "conditioning/controlnet", {
    "positive": link("CONDITIONING"), "negative": link("CONDITIONING"), "control_net": link("CONTROL_NET"),
    "image": link("IMAGE"), "strength": STRENGTH, "start_percent": PERCENT, "end_percent": In("FLOAT", 1.0, 0.0, 1.0, 0.001),
    "vae": link("VAE", optional=True),
}, ("CONDITIONING", "CONDITIONING"), output_names=("positive", "negative"))  # fmt: skip
def controlnet_apply_advanced(ctx: Any, positive: Conditioning, negative: Conditioning, control_net: str, image: Pictures,
                              strength: float, start_percent: float, end_percent: float, vae: Any = None) -> tuple:  # fmt: skip
    """A ControlNet over a window of the steps (on both conditionings in ComfyUI; one unit here)."""
    control = Control(control_net, image.images[0], strength, start_percent, end_percent)
    return _controlled(positive, control), negative


@node("RandomNoise", "sampling/custom_sampling/noise", {"noise_seed": SEED}, ("NOISE",))
def random_noise(ctx: Any, noise_seed: int) -> tuple:
    """The starting noise's seed."""
    return (Noise(noise_seed),)


@node("KSamplerSelect", "sampling/custom_sampling/samplers", {"sampler_name": SAMPLER}, ("SAMPLER",))
def ksampler_select(ctx: Any, sampler_name: str) -> tuple:
    """A sampler by ComfyUI's name."""
    return (sampler_name,)


@node("BasicScheduler", "sampling/custom_sampling/schedulers", {
    "model": link("MODEL"), "scheduler": SCHEDULER, "steps": STEPS, "denoise": DENOISE,
}, ("SIGMAS",))  # fmt: skip
def basic_scheduler(ctx: Any, model: Model, scheduler: str, steps: int, denoise: float) -> tuple:
    """The steps' schedule."""
    return (Sigmas(scheduler, steps, denoise),)


@node("CFGGuider", "sampling/custom_sampling/guiders", {
    "model": link("MODEL"), "positive": link("CONDITIONING"), "negative": link("CONDITIONING"), "cfg": CFG,
}, ("GUIDER",))  # fmt: skip
def cfg_guider(ctx: Any, model: Model, positive: Conditioning, negative: Conditioning, cfg: float) -> tuple:
    """Classifier-free guidance between two conditionings."""
    return (Guider(model, positive, negative, cfg),)


@node("BasicGuider", "sampling/custom_sampling/guiders", {"model": link("MODEL"), "conditioning": link("CONDITIONING")}, ("GUIDER",))
def basic_guider(ctx: Any, model: Model, conditioning: Conditioning) -> tuple:
    """One conditioning, no classifier-free guidance (CFG 1)."""
    return (Guider(model, conditioning, Conditioning("", Clip(model.name)), 1.0),)


@node("SamplerCustomAdvanced", "sampling/custom_sampling", {
    "noise": link("NOISE"), "guider": link("GUIDER"), "sampler": link("SAMPLER"), "sigmas": link("SIGMAS"),
    "latent_image": link("LATENT"),
}, ("LATENT", "LATENT"), output_names=("output", "denoised_output"))  # fmt: skip
def sampler_custom_advanced(ctx: Any, noise: Noise, guider: Guider, sampler: str, sigmas: Sigmas, latent_image: Latent) -> tuple:
    """A KSampler put together from its parts."""
    g = guider
    done = sample(ctx, SamplerInputs(g.model, g.positive, g.negative, latent_image, noise.seed, sigmas.steps, g.cfg,
                                     sampler, sigmas.scheduler, sigmas.denoise))  # fmt: skip
    return done, done


@node("SamplerCustom", "sampling/custom_sampling", {
    "model": link("MODEL"), "add_noise": In("BOOLEAN", True), "noise_seed": SEED, "cfg": CFG,
    "positive": link("CONDITIONING"), "negative": link("CONDITIONING"), "sampler": link("SAMPLER"),
    "sigmas": link("SIGMAS"), "latent_image": link("LATENT"),
}, ("LATENT", "LATENT"), output_names=("output", "denoised_output"))  # fmt: skip
def sampler_custom(ctx: Any, model: Model, add_noise: bool, noise_seed: int, cfg: float, positive: Conditioning,
                   negative: Conditioning, sampler: str, sigmas: Sigmas, latent_image: Latent) -> tuple:  # fmt: skip
    """SamplerCustomAdvanced with the model, seed and CFG as inputs."""
    done = sample(ctx, SamplerInputs(model, positive, negative, latent_image, noise_seed, sigmas.steps, cfg, sampler,
                                     sigmas.scheduler, sigmas.denoise))  # fmt: skip
    return done, done
