"""One call of a compiled graph: inputs, outputs, a UNet's even batch in halves, torch's threads around the call.

`OpenVinoRuntime.run` hands torch's tensors to the request without a copy and gives the outputs back in the torch
module's structure; a UNet's even batch runs as two halves at once; torch runs one thread around a call the
graphs serve.

The halves (`SPLIT_BATCH`): on a replica with two or more threads, a UNet call whose inputs all carry one even
batch runs as two half batches at once, one on each of two 1-thread CPU streams, and the outputs are joined.
Small convolutions parallelize better across samples than inside one; measured on the 2-core VM, the embedded
UNet's static graph alone: batch 2 7.58 -> 6.44 ms, 4 13.8 -> 12.1, 8 23.9 -> 21.8 (docs/performance.md). The
VAE decoder gained 3 % at most, so it is not split. Each sample of a UNet2DConditionModel call is computed alone
(GroupNorm and attention are per sample), so the halves give the whole's output; a call with an input of another
leading size (one timestep for a batch, say) runs whole. Not with OPENVINO_WEIGHTS=int8 or int4 (`streams_of`):
graphs whose weights OpenVINO decompresses as it runs drew wrong images (5-12 dB against fp32) in 3 of 6
processes when run as two streams at once, and right ones in 6 of 6 on one stream; fp32 and w8a8's quantized
UNet (its int8 weights are not decompressed) stayed right in every process (7 of 7 for w8a8).

Torch at one thread (`torch_threads`, OpenVinoRuntime.serving): inside a call whose networks all run as graphs,
what is left to torch (the sampler's arithmetic, the VAE's post-quant conv, the images' conversion) is as fast on
one thread, and a second thread's OpenMP worker spins after each parallel op on the core OpenVINO's next graph
wants. Measured: a 4-image few-step request 82.4 -> 79.0 ms, most of it around the VAE decoder. threadpoolctl
sets the calling thread's OpenMP count only (torch.set_num_threads would also set the count a new thread starts
with, process-wide), so another replica's torch request keeps its threads.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import torch
import torch.utils._pytree as pytree

SPLIT_BATCH = ("UNet2DConditionModel",)
STREAMS = 2  # the streams a split call runs on, where the replica has that many threads
DECOMPRESSED = ("int8", "int4")  # OPENVINO_WEIGHTS whose graphs decompress their weights: never split (module doc)


def streams_of(device: str, threads: int, weights: str) -> int:
    """The CPU streams a replica's SPLIT_BATCH calls run on: STREAMS on a CPU with that many threads, else 1."""
    return STREAMS if device == "CPU" and threads >= STREAMS and weights not in DECOMPRESSED else 1


def set_inputs(ov: Any, request: Any, tensors: list[torch.Tensor]) -> list[Any]:
    """The call's tensors as the request's inputs, sharing their memory. Returns the arrays, which the caller
    holds until the request has run: a tensor that was not contiguous (a regional window of the latent) is
    copied, and the request reads that copy."""
    arrays = [t.detach().cpu().contiguous().numpy() for t in tensors]
    for i, array in enumerate(arrays):  # the key holds the dtypes the graph was traced with: no conversion needed
        request.set_input_tensor(i, ov.Tensor(array, shared_memory=True))  # ~0.15 ms a call less than infer(arrays)
    return arrays


def outputs(entry: Any, requests: list[Any]) -> Any:
    """The requests' outputs (copied: a request's buffers are its own), joined along the batch where there are
    several, in the torch module's structure (`entry`: the graph's `_Entry`)."""
    leaves = list(entry.out_leaves)
    for n, i in enumerate(entry.out_at):
        parts = [torch.from_numpy(request.get_output_tensor(n).data.copy()) for request in requests]
        leaves[i] = parts[0] if len(parts) == 1 else torch.cat(parts)
    return pytree.tree_unflatten(leaves, entry.out_spec)


def halves(tensors: list[torch.Tensor]) -> list[list[torch.Tensor]] | None:
    """The call's inputs as two half batches, or None where it cannot split: an odd batch, or an input that is not
    a scalar and does not lead with the batch (the first input's first size)."""
    if not tensors or tensors[0].ndim == 0:
        return None
    batch = tensors[0].shape[0]
    if batch < 2 or batch % 2 or any(t.ndim and t.shape[0] != batch for t in tensors):
        return None
    half = batch // 2
    return [[t[k * half : (k + 1) * half] if t.ndim else t for t in tensors] for k in (0, 1)]


def run_at_once(ov: Any, compiled: Any, parts: list[list[torch.Tensor]]) -> list[Any]:
    """Each part's request started at once on `compiled` (made for that many streams); the finished requests."""
    requests = [compiled.create_infer_request() for _ in parts]
    held = []  # the input arrays, alive until every request has run (`set_inputs`)
    for request, part in zip(requests, parts, strict=True):
        held.append(set_inputs(ov, request, part))
        request.start_async()
    for request in requests:
        request.wait()
    del held
    return requests


def all_served(pipe: Any, served: dict[str, torch.nn.Module]) -> bool:
    """Whether each torch network `pipe` holds runs as graphs (`served`: the runtime's, by name; the VAE is served
    through its decoder and encoder). A ControlNet or an IP-Adapter's image encoder is not."""
    ids = {id(module) for module in served.values()}
    for name, module in pipe.components.items():
        if isinstance(module, torch.nn.Module) and id(module) not in ids and not (name == "vae" and "vae.decoder" in served):
            return False
    return True


def torch_threads(threads: int) -> contextlib.AbstractContextManager:
    """torch's OpenMP threads in the calling thread, for the block (threadpoolctl; ~10 µs)."""
    return _openmp().limit(limits=threads, user_api="openmp")


@functools.cache
def _openmp() -> Any:
    """threadpoolctl's view of the OpenMP runtimes loaded (torch's), taken once."""
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController()
