"""`python -m tests.sim_devices BACKEND ARGS... [+ ARGS...]`: `python -m devices ARGS...` on a simulated
machine, once per `+`-separated command (one process start for several commands); exit: the worst.

The accelerator is faked at torch's level by tests/fakes.py (as in-process tests do), then the
command line's own `main` runs, so its parsing, probing and printing are the real ones. BACKEND:
cuda, rocm, npu, npu-fused (torch_npu with its fused attention), xpu, mps, vulkan, or cpu.
"""

from __future__ import annotations

import sys

import diffusers  # noqa: F401  (imports torch._dynamo, which reads torch.backends.mps.is_available's
import pytest  # original function: it must see it before the fakes replace it)

from tests import fakes

FAKES = {
    "cuda": lambda mp: fakes.fake_cuda(mp),
    "rocm": lambda mp: fakes.fake_cuda(mp, hip="6.2", name="AMD Instinct MI300X"),
    "npu": lambda mp: fakes.fake_npu(mp),
    "npu-fused": lambda mp: (
        fakes.fake_npu(mp),
        mp.setattr(sys.modules["torch_npu"], "npu_fusion_attention", lambda *a, **k: None, raising=False),
    ),
    "xpu": lambda mp: fakes.fake_xpu(mp),
    "mps": lambda mp: fakes.fake_mps(mp),
    "vulkan": lambda mp: fakes.fake_vulkan(mp),
    "cpu": lambda mp: None,
}


def main(argv: list[str]) -> int:
    from devices.__main__ import main as devices_main

    mp = pytest.MonkeyPatch()
    fakes.no_accelerators(mp)
    FAKES[argv[0]](mp)
    commands, current = [], []
    for arg in argv[1:]:
        if arg == "+":
            commands.append(current)
            current = []
        else:
            current.append(arg)
    try:
        codes = []
        for command in [*commands, current]:
            codes.append(devices_main(command))
            print("=" * 8, flush=True)  # where one command's output ends
        return max(codes)
    finally:
        mp.undo()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
