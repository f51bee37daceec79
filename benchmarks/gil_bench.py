"""Does a denoiser run in parallel in two threads of one process (a CPU pool's two replicas)? Eager torch against
the same UNet traced and frozen by TorchScript, which runs its graph in C++ with the GIL released.

    python -m benchmarks.gil_bench [--calls 20] [--repeats 5]

The embedded UNet, batch 2 (one image with classifier-free guidance), 1 torch thread (a replica's share of two
cores): `--calls` calls in one thread, then the same in two threads at once; medians of `--repeats`; the ratio
two/one is 1.0 when the two threads run in parallel and 2.0 when they take turns.
"""

from __future__ import annotations

import argparse
import functools
import statistics
from collections.abc import Callable

import torch

from benchmarks.measure import wall_of_threads
from pipelines.run.options import DEFAULT_MODEL


class _Positional(torch.nn.Module):
    def __init__(self, unet: torch.nn.Module):
        super().__init__()
        self.unet = unet

    def forward(self, x: torch.Tensor, t: torch.Tensor, context: torch.Tensor) -> torch.Tensor:
        return self.unet(x, t, context, return_dict=False)[0]


def _loop(call: Callable[[], torch.Tensor], calls: int) -> None:
    with torch.inference_mode():
        for _ in range(calls):
            call()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    from diffusers import UNet2DConditionModel

    torch.set_num_threads(1)
    unet = UNet2DConditionModel.from_pretrained(DEFAULT_MODEL / "unet").eval()
    x, t = torch.randn(2, unet.config.in_channels, 16, 16), torch.tensor([500.0, 500.0])
    context = torch.randn(2, 16, unet.config.cross_attention_dim)
    with torch.no_grad():
        traced = torch.jit.freeze(torch.jit.trace(_Positional(unet).eval(), (x, t, context), check_trace=False))
    for name, call in {"eager": lambda: unet(x, t, context), "torchscript": lambda: traced(x, t, context)}.items():
        _loop(call, 3)  # warm-up
        loop = functools.partial(_loop, call, args.calls)
        one = statistics.median(wall_of_threads([loop]) for _ in range(args.repeats))
        two = statistics.median(wall_of_threads([loop, loop]) for _ in range(args.repeats))
        print(f"{name:<12} one thread {one:.3f} s, two at once {two:.3f} s: {two / one:.2f}x")


if __name__ == "__main__":
    main()
