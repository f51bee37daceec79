"""The TPU path: a diffusers pipeline run by torchax on JAX's devices (TPU chips, or XLA's CPU device here).

Route (issue 45, docs/devices.md "TPU"): torchax lowers torch ops to JAX, so the app's own stack
(torch 2.14.1, diffusers, transformers) runs unchanged and XLA compiles the denoiser for whatever
devices JAX lists. The other route, torch_xla, needs torch 2.9 and makes diffusers call
`xm.mark_step()` everywhere once it is importable. Both JAX and the nightly torchax live in a venv of
their own (requirements-tpu.txt): this module imports them ONLY inside functions, so `import devices`
never needs them, and `jax_devices_summary` answers "not installed" in the main venv.

What runs where: the UNet and the VAE decoder are `torchax.compile`d (one XLA program each, compiled
on the first call and reused: the cached call); the text encoder and the scheduler's arithmetic run
op by op on JAX arrays (small); the compiled UNet takes CPU tensors too (the app's schedulers keep
their timesteps on the CPU: pipelines.run.xla_route), moved to JAX before the call. The initial noise
is drawn on the CPU from per-image CPU generators, exactly as diffusers' `randn_tensor` draws it, so a
seed gives the CPU's image start on every device.

Data parallel: with a `Mesh` of N devices the weights are replicated on every device and the
latents' batch dimension is sharded (NamedSharding(mesh, P("data"))); XLA partitions the compiled
UNet/VAE programs along it, so N devices each denoise batch/N images. `shard_batch` also wraps the
compiled calls so that their batch inputs are sharded wherever they come from (the app's pipelines
draw the latents themselves); a batch that does not divide by N runs replicated (each device the
whole batch: the same images, no speed-up).

The stand-in (XLA_CPU_DEVICES, devices.options): JAX's CPU device counts as N TPU chips when the
entry point asks; `stand_in_environment` gives the variables JAX must find before it starts.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

NOT_INSTALLED = "jax/torchax are not installed (requirements-tpu.txt, its own venv)"
# XLA flags that cut the CPU compile of the tiny UNet ~4x with the same pixels (measured: docs/devices.md, TPU).
# They only affect XLA's CPU backend; a TPU compile ignores them.
FAST_CPU_COMPILE_FLAGS = ("--xla_backend_optimization_level=0", "--xla_llvm_disable_expensive_passes=true")
# XLA's CPU collectives wait for every device of an all-gather; should a wait never end, the process
# aborts after 120 s instead of hanging a test for ever (a real all-gather of the CFG batch takes
# milliseconds). CPU-only flags: a TPU ignores them.
CPU_COLLECTIVE_FLAGS = (
    "--xla_cpu_collective_call_warn_stuck_timeout_seconds=30",
    "--xla_cpu_collective_call_terminate_timeout_seconds=120",
)
BATCH_AXIS = "data"


def jax_devices_summary(allow_cpu: bool = False) -> tuple[bool, str, int, str]:
    """(available, reason, count, platform) of JAX's default backend, for the DeviceManager's `tpu` kind.

    `available` is True for TPU chips; JAX's CPU device counts only with `allow_cpu` (tests, CI: the
    stand-in this path is checked on), never for a device the app picks by itself.
    """
    try:
        import jax
        import torchax  # noqa: F401  (the bridge the path needs; absent = the path is absent)
    except ImportError:
        return False, NOT_INSTALLED, 0, ""
    try:
        found = jax.devices()
    except RuntimeError as exc:  # a TPU runtime that fails to initialise (libtpu, a chip held by another process)
        return False, f"JAX found no usable backend ({exc})", 0, ""
    platform = found[0].platform if found else ""
    if platform == "tpu" or (allow_cpu and platform == "cpu"):
        return True, f"{len(found)} {platform.upper()} device(s) visible ({found[0].device_kind})", len(found), platform
    return False, f"JAX sees no TPU (its devices: {len(found)} x {platform or 'none'})", len(found), platform


def xla_memory(index: int = 0) -> dict[str, int | None]:
    """Bytes in use, peak and limit of JAX device `index`; None where the backend keeps no such count (CPU)."""
    import jax

    stats = jax.devices()[index].memory_stats() or {}
    return {
        "allocated": stats.get("bytes_in_use"),
        "peak": stats.get("peak_bytes_in_use"),
        "total": stats.get("bytes_limit"),
    }


def host_threads(device_count: int) -> str:
    """PJRT_NPROC for N XLA CPU devices: the size of the CPU client's thread pool, which runs each
    device's program. PJRT sizes it by the cores (2 here); with a 2-device mesh both programs must run
    at once to meet in an all-gather, and one busy pool thread left the other waiting for ever (a
    deadlock seen in 7 of 11 runs here, in CI too; none in 4 runs at 8). Idle threads cost nothing."""
    return str(max(8, 4 * device_count))


def host_xla_flags(device_count: int, fast_compile: bool = True, current: str = "") -> str:
    """XLA_FLAGS for N XLA CPU devices; must be in the environment before JAX starts its backend."""
    flags = [f for f in current.split() if not f.startswith("--xla_force_host_platform_device_count")]
    flags.append(f"--xla_force_host_platform_device_count={device_count}")
    if device_count > 1:
        flags += [f for f in CPU_COLLECTIVE_FLAGS if f not in flags]
    if fast_compile:
        flags += [f for f in FAST_CPU_COMPILE_FLAGS if f not in flags]
    return " ".join(flags)


def stand_in_environment(device_count: int, env: Mapping[str, str]) -> dict[str, str]:
    """The variables that make XLA's CPU stand in for `device_count` TPU chips, from the entry point's
    `env` (kept where already set: PJRT_NPROC; extended: XLA_FLAGS). They must be in the process
    environment before JAX starts its backend: the entry point sets them, before anything imports JAX."""
    return {
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": host_xla_flags(device_count, True, env.get("XLA_FLAGS", "")),
        "PJRT_NPROC": env.get("PJRT_NPROC") or host_threads(device_count),
    }


def use_stand_in(device_count: int, environ: MutableMapping[str, str]) -> None:
    """XLA_CPU_DEVICES=N at an entry point (`app.py`, `python -m devices`): puts `stand_in_environment` into
    `environ` (the process's), before anything imports JAX, which reads it once when it starts; 0: nothing."""
    if device_count:
        environ.update(stand_in_environment(device_count, environ))


def call_env() -> Any:
    """torchax's environment: torch ops on `jax` tensors run on JAX while it is entered (thread-local)."""
    import torchax

    return torchax.default_env()


def enable_compile_cache(cache_dir: Path) -> int:
    """Turns on JAX's persistent compile cache in `cache_dir`; returns how many entries it already holds.

    Every program is cached (no minimum compile time or size): the op-by-op parts (text encoder,
    scheduler) are many small programs, and together they are a good part of the first call.
    """
    import jax

    cache_dir.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(cache_dir))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)
    return sum(1 for _ in cache_dir.iterdir())


def make_mesh(count: int) -> Any:
    """A 1-D `Mesh` named "data" over JAX's first `count` devices; ValueError when fewer are visible."""
    import jax
    import numpy as np
    from jax.sharding import Mesh

    found = jax.devices()
    if len(found) < count:
        raise ValueError(
            f"a {count}-device mesh needs {count} JAX devices, {len(found)} visible "
            f"(on CPU: XLA_FLAGS=--xla_force_host_platform_device_count={count} before JAX starts)"
        )
    return Mesh(np.array(found[:count]), (BATCH_AXIS,))


@dataclass
class JaxPipeline:
    """A diffusers pipeline whose modules live on JAX devices; `mesh` None = JAX's default device."""

    pipe: Any
    env: Any
    mesh: Any = None


def to_jax(pipe: Any) -> JaxPipeline:
    """Moves `pipe`'s modules to JAX (in place) and compiles its UNet and VAE decoder with torchax."""
    import torchax
    from torchax import CompileOptions

    env = torchax.default_env()
    static = {"static_argnames": ("return_dict",)}  # a Python bool: part of the program, not an input
    with env:
        pipe.to("jax")
        pipe.unet = torchax.compile(pipe.unet, CompileOptions(jax_jit_kwargs=static))
        pipe.vae = torchax.compile(pipe.vae, CompileOptions(methods_to_compile=["decode"], jax_jit_kwargs=static))
    _drop_decode_generator(pipe.vae)
    # an instance attribute: JittableModule calls self.forward (shard_batch wraps this one in turn)
    pipe.unet.forward = _cpu_inputs_to_jax(pipe.unet.forward, env)
    return JaxPipeline(pipe, env)


def _cpu_inputs_to_jax(call: Any, env: Any) -> Any:
    """`call` (a compiled module's) with its CPU tensor arguments moved to JAX first: the jitted program
    takes JAX tensors only (torchax asserts), and the route keeps the scheduler's timesteps on the CPU
    (pipelines.run.xla_route.cpu_timesteps), so the UNet's `timestep` arrives there. A 0-d tensor: the copy
    is a few bytes per step."""
    import torch

    def moved(value: Any) -> Any:
        return value.to("jax") if isinstance(value, torch.Tensor) and value.device.type == "cpu" else value

    def on_jax(*args: Any, **kwargs: Any) -> Any:
        with env:
            return call(*[moved(a) for a in args], **{k: moved(v) for k, v in kwargs.items()})

    return on_jax


def _drop_decode_generator(vae: Any) -> None:
    """diffusers passes `generator=` (CPU generators) to `vae.decode`; AutoencoderKL ignores it, but a
    jitted function cannot take it as an input, so the compiled decode is called without it."""
    jitted = vae.decode

    def decode(z: Any, return_dict: bool = True, generator: Any = None) -> Any:
        return jitted(z, return_dict=return_dict)

    vae.decode = decode


def shard_batch(jp: JaxPipeline, mesh: Any) -> None:
    """Data parallel over `mesh`: replicates the compiled modules' weights on every device (the latents
    are sharded per call, in `generate`). The text encoder's weights stay where they are: its
    outputs are small and JAX copies them to the mesh."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec
    from torchax.interop import jax_view, torch_view

    replicated = NamedSharding(mesh, PartitionSpec())
    for module in (jp.pipe.unet, jp.pipe.vae):
        for store in (module.params, module.buffers):
            for name, value in store.items():
                store[name] = torch_view(jax.device_put(jax_view(value), replicated))
    jp.mesh = mesh
    unet, vae = jp.pipe.unet, jp.pipe.vae
    unet.forward = _batch_sharded(unet.forward, mesh)  # an instance attribute: JittableModule calls self.forward
    vae.decode = _batch_sharded(vae.decode, mesh)


def _batch_sharded(call: Any, mesh: Any) -> Any:
    """`call` with its tensor arguments placed on `mesh`: batch-sharded where their first dimension
    divides by the mesh's size, replicated otherwise (a placement that is already right costs nothing)."""

    def sharded(*args: Any, **kwargs: Any) -> Any:
        placed = [on_mesh(mesh, a) for a in args]
        return call(*placed, **{k: on_mesh(mesh, v) for k, v in kwargs.items()})

    return sharded


def on_mesh(mesh: Any, value: Any) -> Any:
    """A torchax tensor placed on `mesh` (see _batch_sharded); anything else as it is."""
    import jax
    import torch
    from jax.sharding import NamedSharding, PartitionSpec
    from torchax.interop import jax_view, torch_view

    if not isinstance(value, torch.Tensor) or value.device.type != "jax":
        return value
    split = value.ndim > 0 and value.shape[0] % mesh.size == 0
    spec = PartitionSpec(BATCH_AXIS) if split else PartitionSpec()
    return torch_view(jax.device_put(jax_view(value), NamedSharding(mesh, spec)))


def initial_latents(pipe: Any, seeds: list[int], height: int, width: int, dtype: Any) -> Any:
    """The noise `pipe` would draw for these seeds (one CPU generator per image), on the CPU."""
    import torch
    from diffusers.utils.torch_utils import randn_tensor

    channels = pipe.unet.config.in_channels
    shape = (len(seeds), channels, height // pipe.vae_scale_factor, width // pipe.vae_scale_factor)
    generators = [torch.Generator("cpu").manual_seed(seed) for seed in seeds]
    return randn_tensor(shape, generator=generators, device=torch.device("cpu"), dtype=dtype)


def _place_latents(jp: JaxPipeline, latents: Any) -> Any:
    """The CPU latents as a JAX tensor: on the default device, or batch-sharded over the mesh."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec
    from torchax.interop import torch_view

    if jp.mesh is None:
        with jp.env:
            return latents.to("jax")
    if latents.shape[0] % jp.mesh.size:
        raise ValueError(f"a batch of {latents.shape[0]} does not split over {jp.mesh.size} devices")
    array = jax.numpy.asarray(latents.float().numpy()).astype(_jax_dtype(latents.dtype))
    return torch_view(jax.device_put(array, NamedSharding(jp.mesh, PartitionSpec(BATCH_AXIS))))


def _jax_dtype(dtype: Any) -> Any:
    import jax.numpy as jnp
    import torch

    return {torch.float32: jnp.float32, torch.bfloat16: jnp.bfloat16, torch.float16: jnp.float16}[dtype]


def generate(jp: JaxPipeline, prompts: list[str], seeds: list[int], **call: Any) -> Any:
    """Runs the pipeline on JAX for one image per (prompt, seed); returns float images (N, H, W, 3) in [0, 1].

    `call` is passed to the pipeline (num_inference_steps, guidance_scale, height, width); the noise
    is drawn on the CPU with the seeds, as the CPU pipeline would draw it.
    """
    import numpy as np

    if len(prompts) != len(seeds):
        raise ValueError(f"{len(prompts)} prompts but {len(seeds)} seeds: one seed per image")
    pipe = jp.pipe
    height, width = call.get("height", 512), call.get("width", 512)
    latents = initial_latents(pipe, seeds, height, width, pipe.text_encoder.dtype)
    with jp.env:
        placed = _place_latents(jp, latents)
        images = pipe(prompts, latents=placed, output_type="np", **call).images
    return np.asarray(images, dtype=np.float32)


def xla_environment(env: Mapping[str, str]) -> dict[str, str]:
    """JAX's own variables that shaped an XLA run (the check reports them), from the entry point's `env`."""
    return {name: env.get(name, "") for name in ("XLA_FLAGS", "JAX_PLATFORMS")}


def add_to_weight(base: Any, delta: Any) -> Any:
    """`base` (a JAX weight of a compiled module, torchax's view) plus `delta` (a numpy array of its shape), as a
    new JAX weight placed as `base` is (one device, or replicated over the mesh); `base` itself is left as
    it is, so putting it back restores the weight bit for bit (pipelines.run.xla_route.PatchedLoras)."""
    import jax
    import jax.numpy as jnp
    from torchax.interop import jax_view, torch_view

    weight = jax_view(base)
    added = jax.device_put(jnp.asarray(delta, dtype=jnp.float32), weight.sharding)
    return torch_view((weight.astype(jnp.float32) + added).astype(weight.dtype))
