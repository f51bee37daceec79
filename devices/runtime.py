"""Runtime policy: which engine runs the pipeline's networks on this device (torch, or OpenVINO), and why.

RUNTIME=auto|torch|openvino (PipelineOptions.runtime), OPENVINO_DEVICE=CPU|GPU|GPU.N|NPU|AUTO
(PipelineOptions.openvino_device). OpenVINO runs the denoiser, the VAE and the text encoders as
compiled graphs (pipelines/weights/openvino.py); everything between them (the sampler, guidance, previews,
Stop) stays torch on the CPU. So OpenVINO is a runtime of the torch CPU device: its compute can sit
on the CPU, an Intel GPU (Arc, iGPU) or an Intel NPU (Core Ultra), but the pipeline's tensors are CPU
tensors.

| torch backend | auto | openvino (asked) | why |
|---|---|---|---|
| cpu, openvino installed | OpenVINO | OpenVINO | measured on the embedded model: several times torch eager's images/s on the same cores (docs/performance.md#openvino) |
| cpu, openvino not installed | torch | refused | it is optional (requirements-openvino.txt): ~250 MB a GPU server does not need |
| cuda / rocm / npu / xpu / mps / vulkan / tpu | torch | refused | torch serves that accelerator; OpenVINO would move the work to the CPU or an Intel device, so it is never chosen silently (PREFERRED_DEVICE=cpu + OPENVINO_DEVICE=GPU runs an Intel GPU through OpenVINO) |

OpenVINO devices: `CPU`, `GPU` / `GPU.N` (Intel GPUs), `NPU` (static shapes only), `AUTO` (OpenVINO's
own choice). Shapes (OPENVINO_SHAPES): dynamic = one compiled graph for every batch and size; static =
one compiled graph per input shapes, compiled on the first call that has them (~0.5 s each for the
embedded UNet, then OpenVINO's compiled-blob cache), faster per call but with memory per shape kept;
auto = static on the NPU, and elsewhere static for a network whose weights are at most
STATIC_BELOW_BYTES, dynamic above (measured: docs/performance.md#openvino). The list comes from
`openvino.Core().available_devices`; nothing is probed at import.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any

from .backends import installed

log = logging.getLogger(__name__)

RUNTIMES = ("auto", "torch", "openvino")
NOT_INSTALLED = "openvino is not installed (pip install -r requirements-openvino.txt)"
OPENVINO_DEVICE_RE = re.compile(r"^(CPU|GPU(\.\d+)?|NPU|AUTO)$")
OPENVINO_DEVICES = "CPU, GPU, GPU.N, NPU or AUTO"
# OpenVINO devices whose plugin compiles only static shapes (why: the Intel NPU compiler needs every
# dimension known; a dynamic model fails to compile there).
STATIC_SHAPES = ("NPU",)
SHAPES = ("auto", "dynamic", "static")  # OPENVINO_SHAPES: auto = static on the devices above, by size elsewhere
# OPENVINO_SHAPES=auto on the other devices: static shapes for a network whose graph's weights (as the graph holds
# them: after OPENVINO_WEIGHTS' compression) are at most this, dynamic above. Why (docs/performance.md#openvino;
# UNets at 2 threads, static against dynamic a call): a dynamic graph redoes its shape work at every op of every
# call, much of a small network's call and little of a large one's, while each static shape holds a copy of the
# weights of its own: 26 MB (the embedded UNet) 1.5x; 78 MB 1.28x / 1.19x at 16^2 / 32^2 latents for +148 MB a
# shape; 295 MB 1.19x / 1.13x for +352 MB; 1.16 GB 1.07x / 1.08x for +1.16 GB (pipelines.weights.openvino keeps
# 2-4 shapes a graph).
STATIC_BELOW_BYTES = 128 * 2**20
# OPENVINO_WEIGHTS: the graphs' weights as converted (fp32), or compressed by NNCF (int8: per-channel; int4: groups
# of 64 with int8 where a layer does not fit), compute staying f32 (weights decompressed on the fly); or w8a8: the
# denoiser's weights and activations in int8 (calibrated on the first request: pipelines/weights/openvino_w8a8.py),
# so the CPU's int8 instructions do its work, and int8 weights for the other networks.
WEIGHTS = ("fp32", "int8", "int4", "w8a8")
NNCF_NOT_INSTALLED = "nncf is not installed (pip install -r requirements-openvino.txt)"


@dataclass(frozen=True)
class RuntimePlan:
    """What `plan` decided: `name` is torch or openvino; `error` set when the asked runtime cannot be had."""

    name: str
    reason: str
    openvino_device: str = "CPU"
    error: str | None = None
    shapes: str = "auto"  # OPENVINO_SHAPES
    strict: bool = False  # RUNTIME=openvino: a request OpenVINO cannot run is refused (auto runs it on torch)
    weights: str = "fp32"  # OPENVINO_WEIGHTS

    @property
    def openvino(self) -> bool:
        return self.name == "openvino"

    @property
    def static_shapes(self) -> bool:
        """One compiled graph per input shapes for every network (the NPU; OPENVINO_SHAPES=static)."""
        if self.shapes != "auto":
            return self.shapes == "static"
        return self.openvino_device.split(".")[0] in STATIC_SHAPES

    def static_for(self, weight_bytes: int) -> bool:
        """Whether a network whose graph holds `weight_bytes` of weights is compiled per input shapes."""
        if self.shapes == "auto" and not self.static_shapes:
            return small_network(weight_bytes)
        return self.static_shapes

    def describe(self) -> str:
        where = ""
        if self.openvino:
            shapes = ", static shapes" if self.static_shapes else ""
            if self.shapes == "auto" and not shapes:
                shapes = f", static shapes up to {STATIC_BELOW_BYTES // 2**20} MiB of weights a network"
            where = f" {self.openvino_device}{shapes}"
            where += f", {self.weights} weights" if self.weights != "fp32" else ""
        return f"{self.name}{where}: {self.reason}"


def small_network(weight_bytes: int) -> bool:
    """A network whose graph holds at most STATIC_BELOW_BYTES of weights: compiled per shape with
    OPENVINO_SHAPES=auto, and more of its shapes kept (pipelines.weights.openvino.SMALL_SHAPES_KEPT)."""
    return weight_bytes <= STATIC_BELOW_BYTES


def parse_openvino_device(value: str | None) -> str:
    """OPENVINO_DEVICE's value, upper-cased; ValueError naming the valid spellings."""
    text = (value or "CPU").strip().upper() or "CPU"
    if not OPENVINO_DEVICE_RE.match(text):
        raise ValueError(f"invalid OpenVINO device {value!r}; valid values: {OPENVINO_DEVICES}")
    return text


def openvino_installed() -> bool:
    """Whether openvino can be imported; never imports it here (it is ~1 s and 250 MB of libraries)."""
    return installed("openvino")


def plan(
    backend: str, mode: str = "auto", openvino_device: str = "CPU", installed: bool | None = None, shapes: str = "auto",
    weights: str = "fp32",
) -> RuntimePlan:
    """The table above for one torch backend, RUNTIME, OPENVINO_DEVICE, OPENVINO_SHAPES and OPENVINO_WEIGHTS."""
    installed = openvino_installed() if installed is None else installed
    device = parse_openvino_device(openvino_device)
    if mode == "torch":
        return RuntimePlan("torch", "RUNTIME=torch")
    if backend != "cpu":
        why = (
            f"torch serves {backend}; OpenVINO runs on the CPU or Intel devices "
            "(PREFERRED_DEVICE=cpu with OPENVINO_DEVICE=GPU or NPU for an Intel GPU or NPU)"
        )
        if mode == "openvino":
            return RuntimePlan("torch", why, error=f"RUNTIME=openvino on {backend}: {why}")
        return RuntimePlan("torch", f"RUNTIME=auto: {why}")
    if not installed:
        if mode == "openvino":
            return RuntimePlan("torch", NOT_INSTALLED, error=f"RUNTIME=openvino: {NOT_INSTALLED}")
        return RuntimePlan("torch", f"RUNTIME=auto: {NOT_INSTALLED}")
    asked = "RUNTIME=openvino" if mode == "openvino" else "RUNTIME=auto on the CPU with openvino installed"
    if weights != "fp32" and not installed_nncf():
        if mode == "openvino":
            return RuntimePlan("torch", NNCF_NOT_INSTALLED, error=f"OPENVINO_WEIGHTS={weights}: {NNCF_NOT_INSTALLED}")
        asked, weights = f"{asked}; fp32 weights: OPENVINO_WEIGHTS={weights} needs nncf, not installed", "fp32"
    return RuntimePlan("openvino", asked, device, shapes=shapes, strict=mode == "openvino", weights=weights)


def installed_nncf() -> bool:
    """Whether NNCF (OPENVINO_WEIGHTS=int8|int4's weight compression) can be imported; not imported here."""
    return installed("nncf")


def check_weights(core: Any, device: str, weights: str) -> None:
    """ValueError when OPENVINO_WEIGHTS asks for compressed weights the device's plugin does not run (its
    OPTIMIZATION_CAPABILITIES lack INT8: OpenVINO's name for int8 and int4 weight decompression)."""
    if weights == "fp32" or device == "AUTO":
        return
    name = "GPU.0" if device == "GPU" and "GPU" not in core.available_devices else device
    capabilities = list(core.get_property(name, "OPTIMIZATION_CAPABILITIES"))
    if "INT8" not in capabilities:
        raise ValueError(
            f"OPENVINO_WEIGHTS={weights}: OpenVINO's {device} plugin cannot run compressed weights "
            f"(its capabilities: {', '.join(capabilities) or 'none'}); OPENVINO_WEIGHTS=fp32 runs there"
        )


@dataclass(frozen=True)
class OpenVinoDevice:
    """One device OpenVINO sees, for the device report and the status panel."""

    name: str  # CPU, GPU.0, NPU
    full_name: str
    memory_total: int | None = None  # bytes, where the plugin reports it (Intel GPUs)
    properties: dict[str, Any] = field(default_factory=dict)


def _memory(core: Any, name: str) -> int | None:
    """GPU_DEVICE_TOTAL_MEM_SIZE where the plugin has it (Intel GPUs); None elsewhere."""
    if not name.startswith("GPU"):
        return None
    try:
        return int(core.get_property(name, "GPU_DEVICE_TOTAL_MEM_SIZE"))
    except RuntimeError as exc:  # an older driver without the property
        log.debug("no memory size for %s: %s", name, exc)
        return None


def openvino_devices(core: Any = None) -> tuple[list[OpenVinoDevice], str]:
    """(devices, reason) from `openvino.Core().available_devices`; ([], why) when openvino is absent."""
    if core is None:
        if not openvino_installed():
            return [], NOT_INSTALLED
        import openvino

        core = openvino.Core()
    found = []
    for name in core.available_devices:
        found.append(OpenVinoDevice(name, str(core.get_property(name, "FULL_DEVICE_NAME")), _memory(core, name)))
    return found, f"{len(found)} OpenVINO device(s): {', '.join(d.name for d in found) or 'none'}"


def check_device(core: Any, device: str) -> None:
    """ValueError when OPENVINO_DEVICE names a device OpenVINO does not see (AUTO always exists)."""
    if device == "AUTO":
        return
    seen = list(core.available_devices)
    # "GPU" is GPU.0 where several GPUs are listed as GPU.0, GPU.1
    if device in seen or (device == "GPU" and any(d.startswith("GPU") for d in seen)):
        return
    raise ValueError(f"OPENVINO_DEVICE={device}: OpenVINO sees {', '.join(seen) or 'no device'}")
