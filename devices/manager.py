"""DeviceManager: the one object every layer asks for device, dtype, attention and memory.

Selection (auto): CUDA/ROCm -> NPU -> XPU -> MPS -> CPU. TPU (after NPU in the report) and Vulkan
(between MPS and CPU) are used only when asked for (devices.backends.ASKED_ONLY says why). A
requested device that is not usable falls back to the best available one with a warning naming the request, the reason
and the choice (kept in `fallback_reason`); strict options (PREFERRED_DEVICE_STRICT=1) raise instead.

dtype policy (override: `dtype=` or TORCH_DTYPE):

| backend | dtype | why |
|---|---|---|
| cuda / rocm | bfloat16 if `is_bf16_supported()`, else float16 | bf16 keeps fp32's range (no fp16 overflow / NaN in VAEs); pre-Ampere GPUs lack it |
| npu | bfloat16 if `torch.npu.is_bf16_supported()`, else float16 | Ascend 910B+ runs bf16 natively; 310-class chips only fp16 |
| tpu | bfloat16 | the TPU's matrix units compute in bf16; fp32 matmuls run as several bf16 passes (slower), fp16 is not native; fp32 stays available (TORCH_DTYPE) for exact comparisons |
| xpu | bfloat16 | Intel GPUs (Arc, Data Center Max) support bf16 in their matrix engines |
| mps | float32 | fp16 on MPS gives black/NaN images in several pipelines (diffusers #4480 and the MPS notes); bf16 needs macOS 14+ and falls back to slow kernels; Apple's unified memory makes fp32 affordable |
| cpu | float32 | CPU fp16 matmuls are emulated and slow; bf16 only pays on AMX/AVX512-BF16 CPUs and costs accuracy |
| vulkan | float32 | torch's Vulkan backend stores fp32 tensors as fp16 textures itself where it can; asking it for fp16 too gains nothing and loses the ops that only take fp32 |

Attention policy (override: DIFFUSERS_ATTENTION_TYPE=vanilla|sdpa|npu): NPU and MPS use
"vanilla" (plain matmul-softmax: SDPA on these backends has had numerical and memory bugs and
is not the fused kernel there), and so does Vulkan (it has matmul and softmax but no SDPA); everything else uses "sdpa". Vanilla is slower at large sizes
(3.9x at 4,096 tokens on CPU), so the override stays available. `npu` selects Ascend's
fused attention (diffusers' AttnProcessorNPU / `_native_npu` backend); only on an NPU, and only
when asked for.

Seeds: `create_generator` returns a CPU generator. diffusers' `randn_tensor` draws the initial
noise on the CPU and moves it, so one seed gives the same image start on every backend.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import platform
import warnings
from pathlib import Path
from typing import Any

import torch

from . import attention as _attention
from . import backends, memory, runtime
from .options import DeviceOptions

log = logging.getLogger(__name__)

# torch's device type per backend where it differs: ROCm is HIP behind torch.cuda; torchax names its
# privateuse1 device "jax" (the TPU, or any JAX device).
DEVICE_TYPES = {"rocm": "cuda", "tpu": "jax"}
ATTENTION_POLICY = {"npu": "vanilla", "mps": "vanilla", "vulkan": "vanilla"}
MEMORY_LEVELS = ("off", "auto", "balanced", "max", "group", "group-leaf")
# MEMORY_MODE=group / group-leaf: diffusers' group offload, by block or by leaf module.
GROUP_OFFLOAD = {"group": "block_level", "group-leaf": "leaf_level"}
# Group offload's `use_stream` (copy the next group while this one computes) where the backend has
# streams: CUDA/ROCm, XPU and torch_npu do; MPS has no stream API (diffusers refuses use_stream there).
OFFLOAD_STREAMS = {"cuda": True, "rocm": True, "xpu": True, "npu": True, "mps": False}
OFFLOAD_SAVERS = ("model_cpu_offload", "group_offload_block", "group_offload_leaf")


class DeviceFallbackWarning(UserWarning):
    """The requested device could not be used; another one was chosen."""


class DeviceManager:
    """Detects the device at construction (never at import) and answers for it.

    Nothing is read from the environment: `DeviceManager()` is the automatic device with the
    policy's dtype and attention. The variables (PREFERRED_DEVICE, TORCH_DTYPE, ...) are read by an
    entry point into `DeviceSettings`, which gives the options (`DeviceSettings.options_for`,
    `DeviceOptions.for_device`).

    Args:
        preferred_device: auto | cpu | cuda[:N] | rocm | npu[:N] | xpu[:N] | mps; None is "auto".
            Case-insensitive, whitespace-tolerant.
        dtype: torch dtype or its name; None: the dtype table.
        attention: vanilla | sdpa | npu; None: the policy.
        options: everything at once (then the three above are not used), with PREFERRED_DEVICE_STRICT.
    """

    def __init__(
        self,
        preferred_device: str | None = None,
        dtype: str | torch.dtype | None = None,
        attention: str | None = None,
        *,
        options: DeviceOptions | None = None,
    ):
        self.options = options or DeviceOptions.resolve(preferred_device, dtype, attention)
        self.requested = str(self.options.device)
        self.fallback_reason: str | None = None
        self._sampled_peak: int | None = None  # the CPU's peak since reset_peak_memory, from samples
        self._kernel_peak = False  # whether the kernel's own CPU peak (VmHWM) restarted there too
        self.backend, index = self._select()
        self.device = torch.device(DEVICE_TYPES.get(self.backend, self.backend), index)
        self.device_name = backends.device_name(self.backend, index or 0)
        self.dtype = self.options.dtype or self._default_dtype()
        self.attention = self.options.attention or ATTENTION_POLICY.get(self.backend, "sdpa")
        if self.attention == "npu":
            if self.backend != "npu":
                raise ValueError(
                    f"DIFFUSERS_ATTENTION_TYPE=npu selects Ascend's fused attention, but the device is {self.device}; "
                    "use vanilla or sdpa here"
                )
            _attention.check_npu_attention()
        log.info(
            "device %s (%s, %s), dtype %s, attention %s",
            self.device,
            self.backend,
            self.device_name,
            self.dtype_name,
            self.attention,
        )

    @property
    def dtype_name(self) -> str:
        """The dtype as reports, metadata and the UI name it: "bfloat16", not "torch.bfloat16"."""
        return dtype_name(self.dtype)

    # ------------------------------------------------------------------ selection
    def _select(self) -> tuple[str, int | None]:
        request = self.options.device
        if request.kind == "auto":
            return self._best_available()
        status = backends.probe(request.kind, self.options.xla_cpu_devices > 0)
        problem = None
        if not status.available:
            problem = status.reason
        elif request.kind == "rocm" and status.name != "rocm":
            problem = "torch is a CUDA build, not a ROCm (HIP) build"
        elif request.index is not None and request.index >= status.device_count:
            problem = f"{request} requested but {status.device_count} device(s) visible"
        if problem is None:
            index = request.index if request.index is not None else (0 if status.name in backends.INDEXED else None)
            if status.name in backends.ASKED_ONLY:
                log.warning("%s: %s", status.name, backends.ASKED_ONLY[status.name])
            return status.name, index
        backend, index = self._best_available()
        chosen = backend if index is None else f"{backend}:{index}"
        message = f"PREFERRED_DEVICE={request} is not usable: {problem}; using {chosen} instead"
        if self.options.strict:
            raise RuntimeError(message.replace("; using", " (PREFERRED_DEVICE_STRICT=1); would use"))
        self.fallback_reason = problem
        warnings.warn(message, DeviceFallbackWarning, stacklevel=3)
        log.warning(message)
        return backend, index

    @staticmethod
    def _best_available() -> tuple[str, int | None]:
        for kind in backends.PRIORITY:
            if kind in backends.ASKED_ONLY:
                continue
            status = backends.probe(kind)
            if status.available:
                return status.name, (0 if status.name in backends.INDEXED else None)
        return "cpu", None  # unreachable: the CPU probe is always available

    def _default_dtype(self) -> torch.dtype:
        if self.backend == "tpu":
            return torch.bfloat16
        if self.backend in ("cuda", "rocm", "npu", "xpu"):
            return torch.bfloat16 if backends.supports_bf16(self.backend) else torch.float16
        return torch.float32  # cpu, mps: see the table in the module docstring

    # ------------------------------------------------------------------ policies
    def apply_attention(self, pipe: Any) -> dict[str, str]:
        """Apply this manager's attention type to every component; returns what was set."""
        return _attention.apply_attention(pipe, self.attention)

    def attention_context(self):
        """Context every pipeline call runs in (vanilla: any SDPA call takes the math kernel)."""
        return _attention.call_context(self.attention)

    def create_generator(self, seed: int) -> torch.Generator:
        """A CPU generator: the same seed gives the same initial noise on every backend."""
        return torch.Generator(device="cpu").manual_seed(int(seed))

    # ------------------------------------------------------------------ memory
    def memory_stats(self) -> dict[str, Any]:
        stats: dict[str, Any] = {"backend": self.backend, "device_name": self.device_name}
        stats.update(memory.device_memory(self.backend, self.device))
        stats.update(memory.host_memory())
        if self._sampled_peak is not None:
            self._sampled_peak = max(self._sampled_peak, stats["allocated"] or 0)
            kernel = (stats["peak"] or 0) if self._kernel_peak else 0
            stats["peak"] = max(kernel, self._sampled_peak)
        return stats

    def format_memory(self) -> str:
        s = self.memory_stats()
        h = memory.human_bytes
        if self.backend == "cpu":
            return f"RAM: process {h(s['allocated'])} (peak {h(s['peak'])}), {h(s['free'])} free of {h(s['total'])}"
        return (
            f"{self.backend.upper()}: {h(s['allocated'])} allocated, {h(s['reserved'])} reserved, "
            f"peak {h(s['peak'])}, {h(s['free'])} free of {h(s['total'])} | host RSS {h(s['host_rss'])}"
        )

    def empty_cache(self) -> None:
        memory.empty_cache(self.backend, self.device)

    def synchronize(self) -> None:
        memory.synchronize(self.backend, self.device)

    def reset_peak_memory(self) -> None:
        """Start a new peak. On the CPU the peak is also sampled from here on (at every `memory_stats`,
        every denoising step and after the decode): where the kernel keeps its old VmHWM through the
        reset (CI's did), the samples are the peak, which can miss a spike between two samples but
        never reports one from before the reset; elsewhere the kernel's mark, never below them."""
        reset = memory.reset_peak(self.backend, self.device)
        self._kernel_peak, self._sampled_peak = reset, None
        if self.backend == "cpu":
            self._sampled_peak = memory.resident_bytes()

    def sample_peak(self) -> None:
        """A sample for the CPU peak this manager keeps (see reset_peak_memory), taken at each
        denoising step and after the decode; nothing on accelerators, which keep their own."""
        if self._sampled_peak is not None:
            self._sampled_peak = max(self._sampled_peak, memory.resident_bytes())

    def set_memory_efficient_mode(self, pipe: Any, level: str = "auto") -> list[str]:
        """Enable memory savers and return their names.

        off: nothing. balanced: VAE slicing + tiling, and attention slicing only when attention is
        vanilla (slicing swaps every processor for SlicedAttnProcessor, the sliced vanilla path;
        with sdpa/npu it would silently replace the chosen kernel, which is already memory-lean;
        never on MPS, where slicing gives black images). max: balanced + model CPU offload (accelerators only).
        group / group-leaf: balanced + group offload by block / by leaf module (`enable_group_offload`;
        accelerators only, refused on CPU with the reason).
        auto: max when the weights need > 90 % of free device memory, balanced above 50 %,
        else nothing (savers cost speed, so they are used only when memory is short).
        """
        level = level.strip().lower()
        if level not in MEMORY_LEVELS:
            raise ValueError(f"invalid memory level {level!r}; valid values: {', '.join(MEMORY_LEVELS)}")
        if level == "auto":
            level = self._auto_memory_level(pipe)
        enabled: list[str] = []
        if level == "off":
            return enabled
        vae = getattr(pipe, "vae", None)
        for saver in ("slicing", "tiling"):
            fn = getattr(vae, f"enable_{saver}", None)
            if fn is not None:
                fn()
                enabled.append(f"vae_{saver}")
        if self.attention == "vanilla" and self.backend != "mps" and hasattr(pipe, "enable_attention_slicing"):
            pipe.enable_attention_slicing()  # the sliced form of the vanilla math path
            if _sliced(pipe):  # transformer pipelines (SD3, PixArt...) accept the call and slice nothing
                enabled.append("attention_slicing")
        elif hasattr(pipe, "enable_attention_slicing"):
            log.info(
                "attention slicing skipped: it would replace %s attention (fused SDPA is already memory-lean)",
                self.attention,
            )
        if level == "max" and self.backend not in ("cpu", "tpu") and hasattr(pipe, "enable_model_cpu_offload"):
            pipe.enable_model_cpu_offload(device=self.device)
            enabled.append("model_cpu_offload")
        if level in GROUP_OFFLOAD:
            enabled.append(self.enable_group_offload(pipe, GROUP_OFFLOAD[level]))
        log.info("memory-efficient mode %s: %s", level, enabled or "nothing")
        return enabled

    def group_offload_refusal(self) -> str | None:
        """Why group offload cannot run on this device, or None when it can."""
        if self.backend == "cpu":
            return "group offload keeps weights in CPU RAM and moves them to the device per block; on cpu they are already there"
        if self.backend == "tpu":
            return "the TPU route compiles the UNet with its weights on the device (pipelines.run.xla_route)"
        return None

    def enable_group_offload(self, pipe: Any, offload_type: str = "block_level") -> str:
        """diffusers' group offload of every model component: weights live in CPU RAM and each group
        (a block, or a leaf module) is moved onto the device just before it runs; with streams the next
        group is copied while this one computes. Less device memory than model CPU offload (one block,
        not one whole model, on the device) at the price of a copy per group per step."""
        refusal = self.group_offload_refusal()
        if refusal is not None:
            raise ValueError(f"MEMORY_MODE=group: {refusal}")
        stream = OFFLOAD_STREAMS.get(self.backend, False)
        block = offload_type == "block_level"
        pipe.enable_group_offload(
            onload_device=self.device,
            offload_type=offload_type,
            num_blocks_per_group=1 if block else None,
            use_stream=stream,
        )
        log.info("group offload (%s, streams %s) onto %s", offload_type, stream, self.device)
        return "group_offload_block" if block else "group_offload_leaf"

    def _auto_memory_level(self, pipe: Any) -> str:
        free = self.memory_stats()["free"]
        weights = model_bytes(pipe)
        if not free or not weights:
            return "off"
        share = weights / free
        return "max" if share > 0.9 else "balanced" if share > 0.5 else "off"

    # ------------------------------------------------------------------ weights
    @staticmethod
    def load_safetensors(path: str | Path) -> dict[str, torch.Tensor]:
        """Load a .safetensors file to CPU (move later): never unpickles, clear errors."""
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"safetensors file not found: {path}")
        try:
            return load_file(str(path), device="cpu")
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise ValueError(f"{path} is not a valid safetensors file: {exc}") from exc

    # ------------------------------------------------------------------ reports
    def report(self) -> dict[str, Any]:
        import diffusers

        return {
            "requested": self.requested,
            "device": str(self.device),
            "backend": self.backend,
            "device_name": self.device_name,
            "dtype": self.dtype_name,
            "attention": self.attention,
            "fallback_reason": self.fallback_reason,
            "backends": {
                s.name: {"available": s.available, "reason": s.reason, "device_count": s.device_count}
                for s in backends.probe_all(self.options.xla_cpu_devices > 0).values()
            },
            "memory": self.memory_stats(),
            "openvino": _openvino_report(),
            "versions": {
                "torch": torch.__version__,
                "diffusers": diffusers.__version__,
                "python": platform.python_version(),
            },
        }

    def describe(self) -> str:
        r = self.report()
        lines = [
            f"Device:    {r['device']} ({r['backend']}, {r['device_name']})",
            f"Requested: {r['requested']}"
            + (f"  -> fell back: {r['fallback_reason']}" if r["fallback_reason"] else ""),
            f"dtype:     {r['dtype']}",
            f"Attention: {r['attention']}",
            f"Memory:    {self.format_memory()}",
            "Backends:",
        ]
        for name, b in r["backends"].items():
            lines.append(f"  {name:<6} {'yes' if b['available'] else 'no ':<4} {b['reason']}")
        ov = r["openvino"]
        lines.append(f"OpenVINO:  {ov['reason']}")
        for d in ov["devices"]:
            memory = f", {d['memory_total'] / 2**30:.1f} GiB" if d["memory_total"] else ""
            lines.append(f"  {d['name']:<6} {d['full_name']}{memory}")
        v = r["versions"]
        lines.append(f"Versions:  torch {v['torch']}, diffusers {v['diffusers']}, python {v['python']}")
        return "\n".join(lines)

    def to_json(self) -> str:
        return json.dumps(self.report(), indent=2)

    def __repr__(self) -> str:
        return f"DeviceManager(device={self.device}, backend={self.backend}, dtype={self.dtype}, attention={self.attention})"


def _openvino_report() -> dict[str, Any]:
    """The devices OpenVINO sees (Intel CPU, GPU, NPU; devices.runtime), for RUNTIME=openvino's OPENVINO_DEVICE."""
    found, reason = runtime.openvino_devices()
    return {"reason": reason, "devices": [dataclasses.asdict(d) for d in found]}


def _sliced(pipe: Any) -> bool:
    return any(
        type(p).__name__ == "SlicedAttnProcessor"
        for c in getattr(pipe, "components", {}).values()
        for p in (getattr(c, "attn_processors", None) or {}).values()
    )


def weights_placement(savers: list[str]) -> str:
    """Where a pipeline's weights live, from `set_memory_efficient_mode`'s answer (the status panel's words)."""
    if "group_offload_block" in savers:
        return "group offload (block)"
    if "group_offload_leaf" in savers:
        return "group offload (leaf)"
    if "model_cpu_offload" in savers:
        return "CPU offload (model)"
    return "on device"


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def model_bytes(pipe: Any) -> int:
    """Bytes of all weights of a pipeline's torch modules."""
    components = getattr(pipe, "components", {}) or {}
    total = 0
    for component in components.values():
        if isinstance(component, torch.nn.Module):
            total += sum(p.numel() * p.element_size() for p in component.parameters())
    return total
