"""A TPU VM simulated at the level the device layer sees it: fake `jax` (devices, memory_stats,
device_put) and `torchax` (which, like the real one, renames torch's privateuse1 backend to "jax" and
registers a device module for it) modules, then the DeviceManager's answers as JSON. Run in a fresh process by tests/test_devices.py:
the rename is once per process, and tests/fakes.py names privateuse1 "npu" in the test process."""

from __future__ import annotations

import json
import sys
import types

import torch

SYNCS: list[int] = []


class FakeTpu:
    platform, device_kind = "tpu", "TPU v5 lite"

    def __init__(self, index: int):
        self.id = index

    def memory_stats(self) -> dict[str, int]:
        return {"bytes_in_use": (1 + self.id) << 30, "peak_bytes_in_use": 3 << 30, "bytes_limit": 16 << 30}


class Ready:
    def __init__(self, device: FakeTpu):
        self.device = device

    def block_until_ready(self) -> Ready:
        SYNCS.append(self.device.id)
        return self


def install(count: int) -> None:
    jax = types.ModuleType("jax")
    jax.devices = lambda: [FakeTpu(i) for i in range(count)]
    jax.device_put = lambda _x, device: Ready(device)
    torchax = types.ModuleType("torchax")
    device_module = types.ModuleType("torchax.device_module")  # what the real one registers, in short
    device_module.__dict__.update(
        is_available=lambda: True, device_count=lambda: 1, current_device=lambda: 0, _is_in_bad_fork=lambda: False
    )
    torch.utils.rename_privateuse1_backend("jax")
    torch._register_device_module("jax", device_module)
    sys.modules.update(jax=jax, torchax=torchax)


def main() -> None:
    install(count=4)
    from devices import DeviceManager
    from devices.compile import plan

    auto, first, second = DeviceManager(), DeviceManager("tpu"), DeviceManager("tpu:1", dtype="float32")
    second.synchronize()
    print(json.dumps({
        "auto": auto.backend,
        "first": [first.backend, str(first.device), first.dtype_name, first.attention, first.device_name],
        "second": [second.backend, str(second.device), second.dtype_name],
        "memory": second.memory_stats(),
        "syncs": SYNCS,
        "report": auto.report()["backends"]["tpu"],
        "compile": plan("tpu", "on").describe(),
        "load": refusal(second),
    }))  # fmt: skip


def refusal(dm) -> str:
    """What loading the embedded model on `tpu:1` says: the TPU route (pipelines.run.xla_route) serves every
    chip as one replica, or the first alone; it refuses before moving anything to JAX (faked here)."""
    from pipelines import ImagePipeline
    from pipelines.schema.errors import ModelLoadError

    try:
        ImagePipeline.from_pretrained("models/tiny-shapes", dm)
    except ModelLoadError as exc:
        return str(exc)
    return "loaded"


if __name__ == "__main__":
    main()
