"""One image across several devices: the device side of PARALLEL (context and tensor parallel).

Owns what a group of devices needs from torch.distributed and diffusers' `enable_parallelism`, and
nothing of the pipeline or of the processes (serving/parallel.py starts and supervises those):
- `ParallelPlan` / `parse_parallel`: the PARALLEL setting (`ulysses:2`, `ring:4`, `tensor:2`, off);
- `groups_for`: PREFERRED_DEVICE's devices cut into groups of the plan's degree (4 GPUs, degree 2 =
  2 groups of 2, each a replica of the device pool);
- `COLLECTIVES`: which torch.distributed backend each kind of device talks over, and why;
- `RING_ATTENTION`: which attention backend runs ring attention on each kind (it needs `return_lse`);
- `able_models`: the diffusers model classes that can run a mode (their `_cp_plan` / `_tp_plan`);
- `enable`: the denoiser sharded over the group, with the CPU work-arounds
  (`_cpu_as_accelerator`) scoped to that call.

diffusers' classes decide which families can: a transformer with a `_cp_plan` splits its tokens
(Ulysses: all-to-all of heads; ring: K/V passed around), one with a `_tp_plan` splits its weights.
"""

from __future__ import annotations

import contextlib
import re
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

MODES = ("ulysses", "ring", "tensor")
VALID_PARALLEL = "off, or ulysses, ring or tensor with a degree of 2 or more (ulysses:2, ring:4, tensor:2)"
_PLAN_RE = re.compile(r"^(ulysses|ring|tensor)(?::(\d+))?$")


@dataclass(frozen=True)
class ParallelPlan:
    """How one image is split: `mode` (ulysses | ring | tensor) over `degree` devices (None: every
    device PREFERRED_DEVICE lists forms one group)."""

    mode: str
    degree: int | None = None

    def __str__(self) -> str:
        return self.mode if self.degree is None else f"{self.mode}:{self.degree}"

    @property
    def context(self) -> bool:
        """Context parallel (the tokens split) rather than tensor parallel (the weights split)."""
        return self.mode != "tensor"


def parse_parallel(value: Any) -> ParallelPlan | None:
    """PARALLEL's spelling: off/empty -> None, else `mode[:degree]` (degree >= 2)."""
    if value is None or isinstance(value, ParallelPlan):
        return value
    text = str(value).strip().lower()
    if text in ("", "off", "0", "none", "no"):
        return None
    match = _PLAN_RE.match(text)
    if not match or (match.group(2) is not None and int(match.group(2)) < 2):
        raise ValueError(f"invalid PARALLEL {value!r}; valid values: {VALID_PARALLEL}")
    return ParallelPlan(match.group(1), int(match.group(2)) if match.group(2) else None)


@dataclass(frozen=True)
class Collective:
    backend: str  # torch.distributed's backend name
    visible: str | None  # the variable that shows a worker only its own device (its index 0)
    why: str


# | device kind | torch.distributed backend | why |
COLLECTIVES: dict[str, Collective] = {
    "cpu": Collective("gloo", None, "the one torch.distributed backend for CPU tensors (TCP between processes)"),
    "cuda": Collective("nccl", "CUDA_VISIBLE_DEVICES", "NVIDIA's collectives: all-to-all over NVLink/PCIe, GPU memory to GPU memory"),
    "rocm": Collective("nccl", "HIP_VISIBLE_DEVICES", "ROCm builds of torch run RCCL under the name nccl"),
    "npu": Collective("hccl", "ASCEND_RT_VISIBLE_DEVICES", "Ascend's collectives (torch_npu registers hccl)"),
    "xpu": Collective("xccl", "ZE_AFFINITY_MASK", "Intel's oneCCL collectives (torch 2.8+ registers xccl for XPU)"),
}
# Kinds with no group: mps (one GPU per machine, no collectives backend for its tensors), vulkan
# (experimental), tpu (JAX devices: their mesh is devices/xla.py's, not torch.distributed's).
NO_GROUP = {
    "mps": "Apple's GPU is one device per machine and torch.distributed has no backend for MPS tensors",
    "vulkan": "torch's Vulkan backend has no collectives",
    "tpu": "TPU chips are JAX devices: their mesh is devices/xla.py's, not torch.distributed's",
}

# Ring attention merges partial attentions with their log-sum-exp (`return_lse`); of diffusers'
# context-parallel backends, these return it. The others (native SDPA, the CPU's only one; NPU's
# fused attention) cannot run ring attention.
RING_ATTENTION = {"cuda": "_native_cudnn", "rocm": "_native_flash"}
# Ulysses and ring need a context-parallel attention backend: the device's own policy's where it is
# one (sdpa -> native), else this one (vanilla's _native_math has no context-parallel path).
ULYSSES_ATTENTION = {"npu": "_native_npu"}
ULYSSES_DEFAULT = "native"


def collective_for(kind: str) -> Collective:
    """The collectives backend of a device kind; ValueError saying why a kind cannot form a group."""
    if kind in COLLECTIVES:
        return COLLECTIVES[kind]
    why = NO_GROUP.get(kind, "no torch.distributed backend is known for it")
    raise ValueError(f"PARALLEL: {kind} devices cannot form a group ({why}); groups run on {', '.join(COLLECTIVES)}")


def attention_backend(plan: ParallelPlan, kind: str) -> str | None:
    """The attention backend the denoiser runs under `plan` on `kind` (None: tensor parallel keeps the
    device's own); ValueError where ring attention cannot run."""
    if not plan.context:
        return None
    if plan.mode == "ring":
        if kind not in RING_ATTENTION:
            raise ValueError(
                f"PARALLEL={plan}: ring attention needs an attention kernel that returns its log-sum-exp "
                f"(return_lse), which {kind} has not (diffusers' native and NPU attention lack it); "
                f"it runs on {', '.join(RING_ATTENTION)}. Use ulysses:{plan.degree or 2} here"
            )
        return RING_ATTENTION[kind]
    return ULYSSES_ATTENTION.get(kind, ULYSSES_DEFAULT)


def kind_of(device: str) -> str:
    """"cuda:1" -> "cuda"."""
    return device.split(":", 1)[0]


def groups_for(devices: list[str], plan: ParallelPlan) -> list[list[str]]:
    """PREFERRED_DEVICE's devices cut into groups of the plan's degree, in order; ValueError when they do
    not divide or a group would mix kinds of device."""
    degree = plan.degree or len(devices)
    if degree < 2 or len(devices) % degree:
        raise ValueError(
            f"PARALLEL={plan} needs {'a multiple of ' if plan.degree else ''}{max(degree, 2)} devices; "
            f"PREFERRED_DEVICE gives {len(devices)} ({','.join(devices)}): list them, e.g. "
            f"PREFERRED_DEVICE=cpu,cpu or cuda:0,cuda:1"
        )
    groups = [devices[i : i + degree] for i in range(0, len(devices), degree)]
    for group in groups:
        kinds = {kind_of(d) for d in group}
        if len(kinds) > 1:
            raise ValueError(f"PARALLEL={plan}: a group mixes kinds of device ({','.join(group)})")
        collective_for(kinds.pop())
        if kind_of(group[0]) != "cpu" and len(set(group)) < len(group):
            raise ValueError(f"PARALLEL={plan}: a group names one device twice ({','.join(group)})")
    return groups


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now: a group's rendezvous (its processes are local), and the servers the
    tests and benchmarks start."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def join_group(kind: str, rank: int, world: int, port: int) -> None:
    """This process joins its group: the kind's collectives backend, rendezvous on 127.0.0.1:`port`.
    An accelerator worker sees only its own device (the kind's `visible` variable), as index 0."""
    collective = collective_for(kind)
    if kind != "cpu":
        torch.accelerator.set_device_index(0)
    torch.distributed.init_process_group(
        collective.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )


def leave_group() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def agree(flag: bool, device: torch.device) -> bool:
    """Whether any rank of the group says yes (an all-reduce of MAX): every rank gets the same answer,
    so all of them stop at the same step (a rank that stopped alone would leave the others waiting in a
    collective forever)."""
    value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
    torch.distributed.all_reduce(value, op=torch.distributed.ReduceOp.MAX)
    return bool(value.item())


@contextlib.contextmanager
def _cpu_as_accelerator() -> Iterator[None]:
    """THE CPU WORK-AROUNDS, both here and scoped to one `enable_parallelism` call on a CPU group.

    diffusers 0.42.1 was written for groups of accelerators; a group of CPU processes (gloo) runs the
    same collectives and DTensors, and gives one process's image (tests/test_parallel.py), but two
    checks stop it:
    - `ModelMixin._resolve_parallel_config` picks a rank's device as
      `torch.device(accelerator, rank % torch.accelerator.device_count())`; without an accelerator the
      count is 0 (ZeroDivisionError). A CPU process has one device, "cpu", so the count reads 1 while
      that call runs (the device is then cpu:0, the CPU);
    - `hooks.tensor_parallel.apply_tensor_parallel` accepts meshes of `_SUPPORTED_TP_DEVICES` only
      (cuda, neuron, tpu, xpu); torch's `parallelize_module` shards CPU tensors as well, so "cpu" is
      on that list while the call runs.
    Both are torch's and diffusers' own again as soon as the call returns.
    """
    from diffusers.hooks import tensor_parallel

    own_count, own_devices = torch.accelerator.device_count, tensor_parallel._SUPPORTED_TP_DEVICES
    torch.accelerator.device_count = lambda: 1
    tensor_parallel._SUPPORTED_TP_DEVICES = (*own_devices, "cpu")
    try:
        yield
    finally:
        torch.accelerator.device_count = own_count
        tensor_parallel._SUPPORTED_TP_DEVICES = own_devices


def able_models(mode: str) -> list[str]:
    """The diffusers model classes that can run `mode`: those with a `_cp_plan` (ulysses, ring) or a
    `_tp_plan` (tensor), read from the classes themselves (a diffusers upgrade adds its own)."""
    import diffusers
    from diffusers import ModelMixin

    names = []
    for name in dir(diffusers.models):  # every class diffusers exports (its lazy module imports each on access)
        cls = getattr(diffusers.models, name) if name[:1].isupper() else None
        if isinstance(cls, type) and issubclass(cls, ModelMixin) and _plan_of(cls, mode) is not None:
            names.append(name)
    return sorted(names)


def _plan_of(cls: type, mode: str) -> Any:
    return cls._tp_plan if mode == "tensor" else cls._cp_plan


def check_model(model: Any, plan: ParallelPlan) -> None:
    """ValueError naming the classes that can, where `model`'s class has no plan for `plan.mode`."""
    if _plan_of(type(model), plan.mode) is None:
        kind = "tensor-parallel plan (_tp_plan)" if plan.mode == "tensor" else "context-parallel plan (_cp_plan)"
        raise ValueError(
            f"PARALLEL={plan}: {type(model).__name__} has no {kind} in diffusers, so one image cannot be split "
            f"over devices with it; the denoisers that can: {', '.join(able_models(plan.mode))}"
        )


def enable(model: Any, plan: ParallelPlan, kind: str, world: int, device_type: str) -> None:
    """Shard `model` (a diffusers denoiser, in a process of a joined group) over the group; `device_type`: torch's
    name of the device kind (`cuda` on ROCm), for the tensor-parallel mesh."""
    from diffusers import ContextParallelConfig, TensorParallelConfig

    check_model(model, plan)
    degree = plan.degree or world
    mesh = None
    if plan.mode == "tensor":
        mesh = torch.distributed.device_mesh.init_device_mesh(device_type, (degree,), mesh_dim_names=("tp",))
        config: Any = TensorParallelConfig(mesh=mesh)
    else:
        model.set_attention_backend(attention_backend(plan, kind))
        config = ContextParallelConfig(**{f"{plan.mode}_degree": degree})
    scope = _cpu_as_accelerator() if kind == "cpu" and not torch.accelerator.is_available() else contextlib.nullcontext()
    with scope:
        model.enable_parallelism(config=config)
    if mesh is not None:
        _split_the_rest(model, mesh)


def rest_linears(model: Any, degree: int) -> list[str]:
    """The Linear layers of `model` outside its `_tp_plan` that tensor parallel of `degree` splits too:
    AdaLN modulation, embedders, the output projection (28% of FLUX.1-dev's weights, 34% of
    Qwen-Image's), each whose output width divides by the degree."""
    import fnmatch

    plan = type(model)._tp_plan or {}
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and module.out_features % degree == 0
        and not any(fnmatch.fnmatchcase(name, glob) for glob in plan)
    ]


def _split_the_rest(model: Any, mesh: Any) -> None:
    """Split `rest_linears` column-wise with their output gathered whole on every rank (torch's
    `ColwiseParallel(output_layouts=Replicate())`): diffusers' plans split attention and MLP layers
    only, which leaves FLUX.1-dev at 0.64 of its weights per device at degree 2; with these at 1/N as
    well it is 0.50. Each costs one all-gather of its (small) output per call; their inputs and
    outputs stay whole tensors, so the model around them is unchanged."""
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    names = rest_linears(model, mesh.size())
    parallelize_module(model, mesh, {name: ColwiseParallel(output_layouts=Replicate()) for name in names})


def local_bytes(model: Any) -> int:
    """The bytes of `model`'s parameters held by this process: a tensor-parallel shard counts its local
    part only (a DTensor's `to_local()`), a replicated one in full."""
    from torch.distributed.tensor import DTensor

    total = 0
    for p in model.parameters():
        local = p.to_local() if isinstance(p, DTensor) else p
        total += local.numel() * local.element_size()
    return total


def tensor_share(model: Any, degree: int) -> float:
    """The part of `model`'s weights one rank holds under tensor parallel of `degree`, predicted before
    any split: the `_tp_plan`'s layers and `rest_linears` divided by the degree, the rest (norms,
    convolutions, a row-wise layer's bias) whole on every rank. FLUX.1-dev: 0.50 at degree 2."""
    import fnmatch

    plan = type(model)._tp_plan or {}
    rest = set(rest_linears(model, degree))
    total = sharded = 0
    for name, p in model.named_parameters():
        size = p.numel() * p.element_size()
        total += size
        module, kind = name.rsplit(".", 1)
        styles = [style for glob, style in plan.items() if fnmatch.fnmatchcase(module, glob)]
        # a row-wise layer splits its weight's inputs and keeps its bias whole; a column-wise one splits both
        if module in rest or (styles and (kind == "weight" or _column_wise(styles[0]))):
            sharded += size
    return (total - sharded + sharded / degree) / total if total else 1.0


def _column_wise(style: Any) -> bool:
    """A plan's style that splits a layer's outputs (its bias with them): "colwise" or a packed column-wise one."""
    from diffusers.hooks.tensor_parallel import PackedColwiseParallel

    return style == "colwise" or isinstance(style, PackedColwiseParallel)


def applied(model: Any) -> str:
    """What `enable` did to `model`, read back from the config diffusers recorded on it (`_parallel_config`,
    the attribute that makes a second `enable_parallelism` refuse): "not split" where nothing was."""
    config = model._parallel_config
    if config is None:
        return "not split"
    where = f"rank {config._rank} of {config._world_size}"
    cp, tp = config.context_parallel_config, config.tensor_parallel_config
    if cp is not None:
        return f"tokens split (ulysses {cp.ulysses_degree}, ring {cp.ring_degree}), {where}"
    return f"weights split (tensor {tp._tp_degree}), {where}"
