"""The TPU route of ImagePipeline: a loaded pipeline moved to JAX and compiled by torchax, and what it refuses.

Owns the pipeline side of the `tpu` device kind (the device side, JAX and torchax themselves, is
devices/xla.py). Imported only when a model loads on `tpu`, so `import pipelines` never needs JAX.

How a request runs there (docs/devices.md, "TPU"): the UNet and the VAE decoder are `torchax.compile`d
(one XLA program per input shape, compiled on first use: each new batch size or image size compiles
once, then the cached program runs); the text encoder, the VAE encoder (image-to-image, inpaint) and
the scheduler's arithmetic on the latents run op by op on JAX arrays; the scheduler's timesteps stay on
the CPU (`cpu_timesteps`, diffusers' own choice for torch_xla), so its step indexes its CPU tensors with
a CPU timestep and only the UNet's timestep input crosses to JAX (devices.xla). The initial noise is
drawn on the CPU from the request's CPU generators (diffusers' `randn_tensor`), so a seed gives the
CPU's image. The whole request runs inside torchax's environment (`context`), previews and progress
included. Every offered sampler (DDIM, PLMS, LCM, TCD and DDPM included) and inpainting (diffusers'
inpainting twin over the model's 4-channel UNet) run, within 1/255 of CPU float32 on the embedded model
(1 chip and a 2-chip mesh; docs/devices.md has the table).

Several chips: `PREFERRED_DEVICE=tpu` serves ONE replica over a mesh of every visible chip, its batch
sharded (devices.xla.shard_batch); `tpu:0` is one chip. Why one replica, not a pool of one per chip:
the compiled programs and the weights' placement are the mesh's, so one load and one compile serve
every chip, where a pool would compile and hold a copy per chip, and torchax's environment is one
per process. A batch that does not divide by the chips runs replicated (same images, no speed-up).

LoRAs per request (the API's, the LoRA tab's) run by weight patching (`PatchedLoras`, as A1111 and
Forge do): the LoRA's delta is added into the UNet weights the compiled program takes as inputs, and the
model's own weights are put back for the next request without it (no recompile; within 1/255 of CPU
peft, the model's own images back bit for bit). Read: the UNet's LoRA layers in any form diffusers reads
(diffusers/peft, kohya/A1111 with alphas); text encoder parts, DoRA and per-layer patterns are refused
when loaded, with what they hold.

Refused here, with the reason (`load_refusal`, `request_refusal`): families without a UNet and an
AutoencoderKL (only the UNet families are compiled), a pool of single chips other than the first,
weight offload, a recipe's LoRAs that are not fused (peft's adapter layers, loaded before the compile),
and step caches, ControlNet, IP-Adapter and regional Attention: each changes modules inside the
compiled UNet, whose program was traced once with the weights as its inputs (a hook or module added
later would be silently left out of it, or served stale). A recipe's fused LoRAs run: they are in the
weights before the compile (peft's emptied wrappers are removed first, in pipelines.run.model_setup).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import math
from dataclasses import dataclass
from typing import Any

from devices import xla
from devices.manager import OFFLOAD_SAVERS
from pipelines.sampling.step_cache import NONE as NO_STEP_CACHE
from pipelines.schema.errors import LoraError
from pipelines.schema.request import GenerationRequest
from pipelines.weights.lora import LoraManager

log = logging.getLogger(__name__)

WHY_COMPILED = "the TPU route runs a UNet compiled once by torchax with its weights as inputs"
REQUEST_REFUSALS = {
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

    def scheduler(self, scheduler: Any) -> Any:
        """A scheduler a request runs with (the model's at load, a sampler's per request), its timesteps on the CPU."""
        return cpu_timesteps(scheduler)

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
        return (
            f"the recipe's LoRAs {sorted(base_loras)} are not fused: peft's adapter layers in the UNet are not "
            f"in the program torchax compiles ({WHY_COMPILED}); fuse them with the recipe's `fuse: true`, or "
            "name them per request (patched into the weights)"
        )
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


def request_refusal(request: GenerationRequest) -> str | None:
    """Why this request cannot run on the TPU route, or None (checked with the request's other refusals).
    Every sampler the UNet families offer runs on the route (their timesteps on the CPU: `cpu_timesteps`),
    inpaint and LoRAs too."""
    regions = request.regions
    asked = {
        "step_cache": request.step_cache not in (None, NO_STEP_CACHE),
        "controlnet": bool(request.controlnet),
        "ip_adapter": bool(request.ip_adapter),
        "regions": regions is not None and bool(regions.regional_prompts) and regions.region_method == "Attention",
    }
    return next((REQUEST_REFUSALS[name] for name, on in asked.items() if on), None)


def cpu_timesteps(scheduler: Any) -> Any:
    """`scheduler` (the model's, or a request's sampler) with its timesteps on the CPU, whatever device the
    pipeline asks for: diffusers' own choice for XLA (its pipelines pass `timestep_device = "cpu"` when
    torch_xla imports, which it never does here). The step then indexes the scheduler's CPU tensors
    (alphas_cumprod, sigmas) with a CPU timestep, which torchax cannot do with a JAX one (DDIM, PLMS, LCM,
    TCD, DDPM: "'Tensor' object has no attribute '_env'"), and the inpaint pipeline's
    `torch.tensor([timestep])` builds from a CPU scalar (of a JAX one: "Tensor.item() cannot be called on
    meta tensors"). Only the UNet's input crosses to JAX (devices.xla.to_jax). Wrapped on the instance: the
    class, and the schedulers the app builds from its config, are left as they are."""
    own = scheduler.set_timesteps

    @functools.wraps(own)  # keeps the signature diffusers reads (`timesteps`, `sigmas` accepted or not)
    def set_timesteps(*args: Any, device: Any = None, **kwargs: Any) -> Any:
        return own(*args, device="cpu", **kwargs)

    scheduler.set_timesteps = set_timesteps
    return scheduler


@dataclass(frozen=True)
class LowRank:
    """One layer of a LoRA, kept as read (its two small matrices, not their product: a full delta per layer
    would hold as much as the UNet's weights per LoRA): the delta at scale 1 is `scale * up @ down`."""

    up: Any  # (out, rank), numpy float32
    down: Any  # (rank, in x kernel)
    scale: float  # lora_alpha / r, as peft scales it
    shape: tuple[int, ...]  # the weight's

    def delta(self) -> Any:
        return (self.scale * (self.up @ self.down)).reshape(self.shape)


class PatchedLoras(LoraManager):
    """LoRAs on the TPU route by weight patching, as A1111 and Forge do: each LoRA is read once into its
    layers' low-rank pairs (`LowRank`, on the CPU); `activate` puts into the compiled UNet's weights (the inputs of its
    program, `params`) the model's own weights plus each active LoRA's delta times its scale, and the
    model's own weights back when none is active. Nothing inside the program changes, so nothing
    recompiles, and the weights kept from load come back bit for bit (JAX arrays are never changed in
    place). The UNet's part of a LoRA in any form diffusers reads is read (diffusers/peft, kohya/A1111 with
    their alphas, peft metadata's lora_alpha and r); text encoder parts, DoRA and per-layer rank or alpha
    patterns are refused when loaded, saying which (`lora_layers`)."""

    def __init__(self, route: XlaRoute, dm: Any, lora_dir: Any):
        super().__init__(route.jax_pipe.pipe, dm, lora_dir)
        self.unet = route.jax_pipe.pipe.unet
        self.base = dict(self.unet.params)  # as loaded (and placed on the mesh): what a request without LoRAs runs
        self.layers: dict[str, dict[str, LowRank]] = {}  # per LoRA: weight name -> its pair
        self.active: dict[str, float] | None = {}  # None: unknown (a patch failed midway, or an active LoRA was re-read)
        self.patched: set[str] = set()  # weights that differ from `base` now

    def load(self, path: Any, name: str | None = None, allow_outside: bool = False) -> str:
        resolved = self._check_path(self.resolve(path), allow_outside)
        if not resolved.is_file():
            raise LoraError(f"LoRA file not found: {resolved.name}")
        name = name or resolved.stem
        self.layers[name] = lora_layers(resolved, self.base, type(self.pipe).lora_state_dict)
        self._loaded[name] = resolved
        if self.active is not None and name in self.active:
            self.active = None  # its old weights are patched in: the next activation sets every one again
        log.info("LoRA %s read from %s for weight patching (%d layers)", name, resolved, len(self.layers[name]))
        return name

    def unload(self, name: str) -> None:
        if name not in self._loaded:
            raise LoraError(f"LoRA {name!r} is not loaded (loaded: {', '.join(self._loaded) or 'none'})")
        self.activate({n: s for n, s in (self.active or {}).items() if n != name})
        del self._loaded[name], self.layers[name]

    def activate(self, scales: dict[str, float]) -> None:
        """The UNet's weights for exactly these LoRAs at these scales (reading each from LORA_DIR on first use)."""
        self.load_named(scales)
        if scales == self.active:
            return
        self.active = None  # until every weight is set: should one fail, the next activation sets them all
        wanted = {w for lora in scales for w in self.layers[lora]}
        for weight in self.patched - wanted:
            self.unet.params[weight] = self.base[weight]
            self.patched.discard(weight)
        for weight in wanted:
            pairs = [(self.layers[lora][weight], scale) for lora, scale in scales.items() if weight in self.layers[lora]]
            self.unet.params[weight] = xla.add_to_weight(self.base[weight], sum(p.delta() * scale for p, scale in pairs))
            self.patched.add(weight)
        self.active = dict(scales)


def lora_layers(path: Any, weights: dict[str, Any], loader: Any) -> dict[str, LowRank]:
    """{UNet weight name: its LoRA pair, whose delta at scale 1 is (lora_alpha / r) * lora_B @ lora_A} of a LoRA
    file in any form diffusers reads (`loader`: the pipeline class's `lora_state_dict`, which converts kohya's and
    A1111's names and gives their `.alpha`s; peft metadata gives lora_alpha and r), as numpy float32; or
    LoraError saying what it holds that weight patching does not read. The scale is peft's, so a patched
    weight is the one `fuse_lora` makes on the CPU."""
    from diffusers.utils import convert_unet_state_dict_to_peft

    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="lora-read") as outside:
        # torchax's environment is thread-local and a request reads its LoRAs inside it; diffusers' conversion
        # runs on plain CPU tensors, so in a thread of its own
        state, alphas, metadata = outside.submit(_read, loader, path).result()
    pairs = convert_unet_state_dict_to_peft({k[len("unet.") :]: v for k, v in state.items() if k.startswith("unet.")})
    alpha_of = _alphas_by_layer(alphas)
    why = _unread(state, pairs, metadata)
    if why:
        raise LoraError(f"{path.name} cannot be patched into the weights on tpu: {why}")
    layers = {}
    for key in (k for k in pairs if k.endswith(".lora_A.weight")):
        layer = key[: -len(".lora_A.weight")]
        down = pairs[key].reshape(pairs[key].shape[0], -1)  # (rank, in x kernel)
        up = pairs[f"{layer}.lora_B.weight"].reshape(-1, down.shape[0])  # (out, rank)
        weight = f"{layer}.weight"
        shape = tuple(weights[weight].shape) if weight in weights else (0,)
        if shape[0] != up.shape[0] or math.prod(shape[1:]) != down.shape[1]:
            raise LoraError(f"{path.name} is not a LoRA for this model: no layer {layer} of its shape")
        rank = float(metadata.get("unet.r", down.shape[0]))
        alpha = alpha_of.get(layer, float(metadata.get("unet.lora_alpha", rank)))
        layers[weight] = LowRank(up, down, alpha / rank, shape)
    return layers


def _alphas_by_layer(alphas: dict[str, float]) -> dict[str, float]:
    """kohya's alphas by the UNet layer they scale, in peft's names: diffusers keys them by the layer
    (`unet.<layer>.alpha`) or by its down weight in the old attention-processor names
    (`unet.<...>.processor.to_k_lora.down.weight.alpha`), which peft's conversion renames as it renames the weights."""
    from diffusers.utils import convert_unet_state_dict_to_peft

    by_layer = {}
    for key, alpha in alphas.items():
        if key.startswith("unet."):
            (renamed,) = convert_unet_state_dict_to_peft({key[len("unet.") : -len(".alpha")]: None})
            by_layer[renamed.removesuffix(".lora_A.weight")] = alpha
    return by_layer


def _read(loader: Any, path: Any) -> tuple[dict[str, Any], dict[str, float], dict[str, Any]]:
    """The file through diffusers (`loader`), its tensors as numpy float32, alphas and metadata as dicts."""
    state, alphas, metadata = loader(str(path), return_lora_metadata=True)
    arrays = {key: value.float().numpy() for key, value in state.items()}
    return arrays, {k: float(v) for k, v in (alphas or {}).items()}, dict(metadata or {})


def _unread(state: dict[str, Any], pairs: dict[str, Any], metadata: dict[str, Any]) -> str | None:
    """What in a LoRA (`state` as diffusers read it, `pairs` its UNet part in peft's names) weight patching does
    not read (per-layer rank or alpha patterns, DoRA's magnitudes, biases: not one plain delta per weight;
    text encoder parts: they would patch a module outside the compiled UNet), or None."""
    if metadata.get("unet.alpha_pattern") or metadata.get("unet.rank_pattern"):
        return "its peft metadata sets ranks or alphas per layer (rank_pattern, alpha_pattern), which is not read on tpu"
    others = [k for k in state if not k.startswith("unet.")]
    if others:
        return f"only the UNet's LoRA layers are read (it has {others[0]!r}, a text encoder's)"
    odd = [k for k in pairs if not k.endswith((".lora_A.weight", ".lora_B.weight"))]
    if odd or not pairs:
        return f"only the UNet's LoRA pairs are read (it has {odd[0]!r}: DoRA's or a bias)" if odd else "it has no UNet layers"
    unpaired = [k for k in pairs if k.endswith(".lora_A.weight") and k.replace("lora_A", "lora_B") not in pairs]
    return f"{unpaired[0]} has no lora_B" if unpaired else None
