"""Graph compile policy: whether the denoiser is compiled on this device, with which backend, and why.

COMPILE=auto|on|off (PipelineOptions.compile, read once by the app's settings). `auto` follows the
table; `on` asks for it where the table says off (CPU, MPS: measure first, see
docs/compile-and-offload.md); `off` never compiles. Whatever the setting, a device whose backend
cannot be had (Ascend without torchair) stays off, and the reason is reported.

| backend | auto | compiler | why |
|---|---|---|---|
| cuda / rocm | on | inductor | Triton kernels fuse the denoiser's norms, activations and attention glue; the compile is paid once at load |
| xpu | on | inductor | inductor generates Triton kernels for Intel GPUs too (torch >= 2.5) |
| npu | on when torchair is installed | torchair (`get_npu_backend`) | inductor on Ascend was reported several times slower; torchair (Ascend's graph mode) ~8-10 % faster on a 910B |
| npu without torchair | off | - | inductor is slower there, so no compile beats a slow one |
| mps | off (on: asked) | inductor | inductor's Metal support is young; no measurement here says it pays |
| cpu | off (on: asked) | inductor | measured on this 2-core CPU: the first call costs tens of seconds of C++ compile per shape for a tiny gain or a loss (docs/compile-and-offload.md) |
| vulkan | off (always) | - | inductor generates no Vulkan code |
| tpu | off (always) | - | torch.compile does not target JAX; the TPU path compiles the UNet and VAE with torchax (XLA) itself (devices/xla.py) |

What is compiled: `compile_repeated_blocks(fullgraph=True)` where the denoiser declares
`_repeated_blocks` (diffusers 0.42.1: UNet2DConditionModel -> BasicTransformerBlock, Flux,
Qwen-Image; regional compile: one small graph reused by every block, compiled in seconds),
else the whole denoiser with `Module.compile` (in place: the pipeline keeps its module type).
`dynamic=True` so that the batch sizes and image sizes the UI offers reuse one graph instead of
recompiling for each new shape.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from .backends import installed

log = logging.getLogger(__name__)

COMPILE_MODES = ("auto", "on", "off")
AUTO_ON = {"cuda": "inductor", "rocm": "inductor", "xpu": "inductor", "npu": "torchair"}
ASKED_ONLY = {
    "cpu": "off by default on CPU: the compile costs more than it saves here (COMPILE=on to ask)",
    "mps": "off by default on MPS: inductor's Metal support is unmeasured here (COMPILE=on to ask)",
}
NEVER = {
    "vulkan": "no compile on vulkan: inductor generates no Vulkan code",
    "tpu": "no torch.compile on tpu: XLA compiles the UNet and VAE through torchax (devices/xla.py)",
}
NO_TORCHAIR = "Ascend without torchair: inductor is several times slower on NPU, so no compile (install torchair)"


@dataclass(frozen=True)
class CompilePlan:
    """What `plan` decided: `compiler` is the torch.compile backend name, None when off; `reason` says why."""

    enabled: bool
    compiler: str | None
    reason: str

    def describe(self) -> str:
        return f"compile {self.compiler}: {self.reason}" if self.enabled else f"no compile: {self.reason}"


def parse_compile(value: str | None) -> str:
    """COMPILE's value; ValueError listing the valid ones."""
    text = (value or "auto").strip().lower() or "auto"
    if text not in COMPILE_MODES:
        raise ValueError(f"invalid compile mode {value!r}; valid values: {', '.join(COMPILE_MODES)}")
    return text


def torchair_available() -> bool:
    """Whether torchair (Ascend's torch.compile backend) can be imported; never imports it here."""
    return installed("torchair")


def plan(backend: str, mode: str = "auto") -> CompilePlan:
    """The table above for one backend and COMPILE setting."""
    mode = parse_compile(mode)
    if mode == "off":
        return CompilePlan(False, None, "COMPILE=off")
    if backend in NEVER:
        return CompilePlan(False, None, NEVER[backend])
    if backend == "npu":
        if not torchair_available():
            return CompilePlan(False, None, NO_TORCHAIR)
        return CompilePlan(True, "torchair", "Ascend graph mode (torchair)")
    if backend in AUTO_ON:
        return CompilePlan(True, AUTO_ON[backend], f"inductor on {backend}" + (" (COMPILE=on)" if mode == "on" else ""))
    if mode == "on":
        return CompilePlan(True, "inductor", f"COMPILE=on on {backend} (off by default there)")
    return CompilePlan(False, None, ASKED_ONLY.get(backend, f"off by default on {backend}"))


def _backend(compiler: str) -> Any:
    """The object torch.compile takes as `backend`: a name, or torchair's NPU backend."""
    if compiler != "torchair":
        return compiler
    import torchair

    return torchair.get_npu_backend(compiler_config=torchair.CompilerConfig())


def denoiser_of(pipe: Any) -> tuple[str, torch.nn.Module]:
    """(name, module) of the pipeline's denoiser: its transformer or UNet."""
    for name in ("transformer", "unet", "prior"):
        module = getattr(pipe, name, None)
        if isinstance(module, torch.nn.Module):
            return name, module
    raise ValueError(f"{type(pipe).__name__} has no transformer or UNet to compile")


def compile_denoiser(pipe: Any, compile_plan: CompilePlan, dynamic: bool | None = True) -> str:
    """Compile the denoiser in place as `compile_plan` says; returns what was done (for the status panel).

    Regional where the model declares repeated blocks (fullgraph: a graph break inside a block is
    a bug to see, not a silent slowdown), else the whole module (fullgraph off: pipelines' glue
    around the denoiser may break graphs and still run).
    """
    if not compile_plan.enabled:
        return compile_plan.describe()
    name, module = denoiser_of(pipe)
    backend = _backend(compile_plan.compiler)
    if getattr(module, "_repeated_blocks", None):
        module.compile_repeated_blocks(fullgraph=True, dynamic=dynamic, backend=backend)
        done = f"{name} repeated blocks ({', '.join(module._repeated_blocks)}), {compile_plan.compiler}"
    else:
        module.compile(dynamic=dynamic, backend=backend)
        done = f"whole {name}, {compile_plan.compiler}"
    log.info("compiled %s (dynamic=%s)", done, dynamic)
    return done


def undo_compile(pipe: Any) -> None:
    """Back to eager after a failed compile: drop what `Module.compile` set on the denoiser and its blocks."""
    _, module = denoiser_of(pipe)
    for submodule in module.modules():
        if getattr(submodule, "_compiled_call_impl", None) is not None:
            submodule._compiled_call_impl = None
