"""Device layer: one DeviceManager for CUDA, ROCm, Ascend NPU, Intel XPU, Apple MPS and CPU."""

from .manager import DeviceFallbackWarning, DeviceManager
from .options import VALID_DEVICES, parse_device

__all__ = ["VALID_DEVICES", "DeviceFallbackWarning", "DeviceManager", "parse_device"]
