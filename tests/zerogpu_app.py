"""`python app.py` on a simulated ZeroGPU Space, without a GPU (run as a subprocess by tests/test_zerogpu.py).

The environment comes from the test: SPACES_ZERO_GPU=true, SPACES_ZERO_DEVICE_API_URL (a loopback
stand-in for the device API), ZEROGPU_OFFLOAD_DIR, GRADIO_SERVER_PORT, MODEL_ID, OUTPUT_DIR.
Everything is the real `spaces` package and the real app, except the two steps of the ZeroGPU
worker that need a real GPU:
- `spaces.zero.torch.init(nvidia_uuid)`: selects the GPU and initialises CUDA;
- `spaces.zero.torch.move(callback)`: copies the weights recorded "on cuda" at start-up (packed to
  disk at launch) onto the GPU.
Their stand-ins keep the worker on the CPU under the same CUDA emulation the Space's process runs
at start-up: the packed weights are read back from disk into CPU tensors behind the emulated ones,
and every thread of the worker runs with the emulation on (it is per thread in torch). One rule of
real CUDA the emulation lacks is added: a 0-dim CPU tensor mixes with CUDA tensors as a scalar
(schedulers multiply by such `alpha_t`/`sigma_t`).
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

import spaces  # first, as app.py does: it patches torch before anything touches CUDA

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _init_on_cpu(nvidia_uuid: str) -> None:
    print(f"zerogpu stand-in: init {nvidia_uuid} in worker {os.getpid()}", flush=True)


def _move_on_cpu(callback=None) -> None:
    """The packed weights back into CPU tensors behind their emulated-CUDA aliases; the emulation on again."""
    import torch
    from spaces.zero.torch import patching

    for pack in patching.tensor_packs:
        with open(pack.path(), "rb") as file:
            for meta, size, aligned in [*(t for batch in pack.batches for t in batch), *pack.big_tensors]:
                data = file.read(aligned)[:size]
                flat = (
                    torch.frombuffer(bytearray(data), dtype=torch.uint8) if size else torch.empty(0, dtype=torch.uint8)
                )
                tensor = torch.as_strided(flat.view(meta.dtype), meta.shape, meta.stride())
                for fake in pack.fakes[meta]:
                    patching.cuda_aliases[fake] = tensor
                if callback is not None:
                    callback(size)
    _scalars_mix_with_cuda(patching)
    patching.patch()  # this thread, and the globals (torch.cuda.is_available, torch.device, ...)
    run = threading.Thread.run

    def run_emulated(self):  # every thread started from now on (the worker's task and generate threads)
        patching.enter_mode()
        return run(self)

    threading.Thread.run = run_emulated
    print(f"zerogpu stand-in: moved {len(patching.tensor_packs)} pack(s) in worker {os.getpid()}", flush=True)


def _scalars_mix_with_cuda(patching) -> None:
    import torch
    from torch.utils._pytree import tree_map_only

    emulate = patching.ZeroGPUFunctionMode.__torch_function__
    aliases = patching.cuda_aliases

    def lift(tensor):
        if tensor in aliases or tensor.dim() != 0 or tensor.device.type != "cpu":
            return tensor
        fake = patching.empty_fake(tensor)
        aliases[fake] = tensor
        return fake

    def torch_function(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in (*args, *kwargs.values()) if isinstance(t, torch.Tensor)]
        if len(tensors) > 1 and any(t in aliases for t in tensors):
            args, kwargs = tree_map_only(torch.Tensor, lift, (args, kwargs))
        return emulate(self, func, types, args, kwargs)

    patching.ZeroGPUFunctionMode.__torch_function__ = torch_function


spaces.zero.torch.init = _init_on_cpu
spaces.zero.torch.move = _move_on_cpu

if __name__ == "__main__":
    from app import main

    main([])
