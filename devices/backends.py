"""Probing torch's backends, one small function per backend, read at call time.

Nothing here caches: every probe calls torch's own functions (`torch.cuda.is_available`,
`torch.version.hip`, `torch.xpu.is_available`, `torch.backends.mps.is_available`, an
`import torch_npu`, `torch.is_vulkan_available`, JAX's device list for the TPU), so tests can simulate a backend by patching those, and a process that
gains a device (e.g. ZeroGPU) sees it on the next DeviceManager.
"""

from __future__ import annotations

import importlib.util
import logging
import platform
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType

import torch

log = logging.getLogger(__name__)

# Detection order (the report's order, and auto-selection's). CUDA and ROCm share torch.cuda, so
# they are one probe.
PRIORITY = ("cuda", "npu", "tpu", "xpu", "mps", "vulkan", "cpu")

INDEXED = ("cuda", "rocm", "npu", "tpu", "xpu")  # backends with several devices, whose torch.device carries an index

# Backends in the order that auto-selection passes over: used only when asked for by name.
# | backend | why not automatic |
# |---|---|
# | vulkan | experimental: torch's Vulkan backend (mobile-oriented, built only from source with USE_VULKAN=1) lacks ops diffusers needs (group norm, SDPA, many views and in-place ops); asking for it runs what it can and fails on the first missing op |
# | tpu | the TPU route (pipelines.run.xla_route) runs the UNet families only (SD 1.x/2.x, SDXL) and refuses step caches, ControlNet, IP-Adapter and regional Attention: chosen by itself, a TPU VM would refuse the models and features the CPU serves |
ASKED_ONLY = {
    "tpu": "not chosen automatically: the TPU route runs the UNet families (SD 1.x/2.x, SDXL) and refuses "
    "step caches, ControlNet, IP-Adapter and regional Attention (docs/devices.md); PREFERRED_DEVICE=tpu to use it",
    "vulkan": "experimental, not chosen automatically: torch's Vulkan backend lacks ops diffusers needs "
    "(group norm, scaled_dot_product_attention, in-place views); PREFERRED_DEVICE=vulkan to try it",
}


@dataclass(frozen=True)
class BackendStatus:
    """Whether a backend can be used here, and if not, why (a sentence for humans)."""

    name: str  # cuda | rocm | npu | xpu | mps | cpu
    available: bool
    reason: str
    device_count: int = 0


def _probe_cuda() -> BackendStatus:
    name = "rocm" if getattr(torch.version, "hip", None) else "cuda"
    if not torch.cuda.is_available():
        if name == "rocm":
            return BackendStatus(name, False, "torch is a ROCm build but no AMD GPU is visible")
        if getattr(torch.version, "cuda", None) is None:
            return BackendStatus(name, False, "torch was built without CUDA (a CPU-only wheel)")
        return BackendStatus(name, False, "no CUDA GPU visible (check the driver and CUDA_VISIBLE_DEVICES)")
    count = torch.cuda.device_count()
    return BackendStatus(name, count > 0, f"{count} device(s) visible", count)


def npu_module() -> ModuleType | None:
    """The `torch.npu` namespace, present only once torch_npu has been imported."""
    return getattr(torch, "npu", None)


def _probe_npu() -> BackendStatus:
    try:
        importlib.import_module("torch_npu")
    except ImportError:
        return BackendStatus("npu", False, "torch_npu is not installed (see requirements-npu.txt)")
    except Exception as exc:  # e.g. OSError: libhccl.so missing when the CANN runtime is absent
        return BackendStatus(
            "npu", False, f"torch_npu failed to import ({exc}); is the CANN toolkit installed and sourced?"
        )
    npu = npu_module()
    if npu is None or not npu.is_available():
        return BackendStatus(
            "npu", False, "torch_npu is installed but no NPU visible (check ASCEND_RT_VISIBLE_DEVICES)"
        )
    count = npu.device_count()
    return BackendStatus("npu", count > 0, f"{count} device(s) visible", count)


def _probe_xpu() -> BackendStatus:
    xpu = getattr(torch, "xpu", None)
    if xpu is None:
        return BackendStatus("xpu", False, "this torch has no XPU support")
    if not xpu.is_available():
        return BackendStatus("xpu", False, "no Intel XPU visible")
    count = xpu.device_count()
    return BackendStatus("xpu", count > 0, f"{count} device(s) visible", count)


def _probe_mps() -> BackendStatus:
    mps = getattr(torch.backends, "mps", None)
    if mps is None or not mps.is_built():
        return BackendStatus("mps", False, "this torch was built without MPS (Apple Silicon only)")
    if not mps.is_available():
        return BackendStatus("mps", False, "MPS is built but not available (needs macOS 12.3+ on Apple Silicon)")
    return BackendStatus("mps", True, "Apple GPU available", 1)


def _probe_tpu(xla_cpu: bool = False) -> BackendStatus:
    """TPU chips as JAX lists them, through torchax (devices/xla.py; jax and torchax are imported there,
    lazily: in a venv without them this is one failed import). JAX's CPU device is not a TPU, unless
    `xla_cpu` (XLA_CPU_DEVICES) lets it stand in."""
    from .xla import jax_devices_summary

    available, reason, count, _platform = jax_devices_summary(allow_cpu=xla_cpu)
    if available:
        reason += f" ({ASKED_ONLY['tpu']})"
    return BackendStatus("tpu", available, reason, count if available else 0)


def _probe_vulkan() -> BackendStatus:
    if not torch.is_vulkan_available():
        return BackendStatus("vulkan", False, "this torch was built without Vulkan (USE_VULKAN=1 source builds only)")
    return BackendStatus("vulkan", True, f"Vulkan available ({ASKED_ONLY['vulkan']})", 1)


def _probe_cpu() -> BackendStatus:
    return BackendStatus("cpu", True, "always available", 1)


PROBES: dict[str, Callable[[], BackendStatus]] = {
    "cuda": _probe_cuda,
    "npu": _probe_npu,
    "tpu": _probe_tpu,
    "xpu": _probe_xpu,
    "mps": _probe_mps,
    "vulkan": _probe_vulkan,
    "cpu": _probe_cpu,
}


def installed(package: str) -> bool:
    """Whether `package` can be imported, without importing it (torchair, openvino: seconds and hundreds of MB)."""
    try:
        return importlib.util.find_spec(package) is not None
    except (ValueError, ImportError):  # a None / broken entry in sys.modules
        return False


def probe(kind: str, xla_cpu: bool = False) -> BackendStatus:
    """Probe one backend; "rocm" is the CUDA probe (HIP builds expose the CUDA API); `xla_cpu`: JAX's CPU
    stands in for TPU chips (XLA_CPU_DEVICES; only asked for by name, never by auto)."""
    if kind == "tpu":
        return _probe_tpu(xla_cpu)
    return PROBES["cuda" if kind == "rocm" else kind]()


def probe_all(xla_cpu: bool = False) -> dict[str, BackendStatus]:
    return {kind: probe(kind, xla_cpu) for kind in PRIORITY}


def torch_namespace(backend: str) -> ModuleType | None:
    """The torch.* module holding a backend's device functions (dispatch table, default None)."""
    table: dict[str, Callable[[], ModuleType | None]] = {
        "cuda": lambda: torch.cuda,
        "rocm": lambda: torch.cuda,
        "npu": npu_module,
        "xpu": lambda: getattr(torch, "xpu", None),
        "mps": lambda: getattr(torch, "mps", None),
    }
    return table.get(backend, lambda: None)()


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "CPU"


def device_name(backend: str, index: int) -> str:
    if backend == "cpu":
        return cpu_name()
    if backend in ("mps", "vulkan"):
        return {"mps": "Apple MPS", "vulkan": "Vulkan GPU"}[backend]
    if backend == "tpu":
        import jax  # present: the probe found a TPU through it

        return f"{jax.devices()[index].device_kind} #{index}"
    module = torch_namespace(backend)
    try:
        return str(module.get_device_name(index))
    except Exception as exc:  # a name is cosmetic: never fail device selection on it
        log.debug("get_device_name failed on %s:%d: %s", backend, index, exc)
        return f"{backend.upper()} device {index}"


def supports_bf16(backend: str) -> bool:
    """bf16 support as reported by the backend; XPU without the query is assumed capable."""
    module = torch_namespace(backend)
    check = getattr(module, "is_bf16_supported", None)
    if check is None:
        return backend == "xpu"
    try:
        return bool(check())
    except Exception as exc:
        log.warning("%s.is_bf16_supported() failed (%s); assuming no bf16", backend, exc)
        return False
