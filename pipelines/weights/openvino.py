"""The OpenVINO runtime: the pipeline's networks run as OpenVINO graphs, the diffusers pipeline unchanged.

How (issue 46, docs/performance.md#openvino): each network (the denoiser, the text encoders, the VAE's
encoder and decoder) gets a diffusers `ModelHook` whose `new_forward` runs an OpenVINO compiled
model instead of the torch module. The graph is made from the module itself by `ov.convert_model`
on the first call, traced with that call's own inputs, so any call the pipeline makes (CFG batch,
img2img strength, tiles of a tiled VAE, SDXL's extra conditioning) converts as it is made. The
module stays a torch module: diffusers still reads its config, dtype and device, LoRAs load into
it, and the samplers, previews, Stop, inpaint and the device pool run unchanged around it.

What a graph is keyed by (`_Entry.key`): the call's structure (pytree spec, tensor dtypes and ranks, its non-tensor
arguments, which are baked in the trace), the module's weights (a hash taken when the runtime is installed), the
active LoRAs and their scales (peft's scaling is a constant in the trace: a new LoRA set is a new graph), the
OpenVINO version and device; and, where the graph is not known to stay right at other shapes (`DYNAMIC_SAFE`), the
input shapes. Graphs are saved under OPENVINO_CACHE (model.xml/.bin + meta.json), so a restart reads them instead of
converting; OpenVINO's own CACHE_DIR keeps the compiled blobs beside them. A graph is compiled once for dynamic
shapes, or once per input shapes with static shapes (the NPU's rule, OPENVINO_SHAPES=static, and a small network's
with OPENVINO_SHAPES=auto: devices.runtime.STATIC_BELOW_BYTES).

Each converted graph is checked once against the torch module on the inputs it was traced with
(`TOLERANCE`); a graph that fails the check, or a module OpenVINO cannot convert, stays torch, and
`describe()` says which and why (the torch ops OpenVINO has no conversion for, by name).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.utils._pytree as pytree
from diffusers.hooks import HookRegistry, ModelHook

from devices.compile import denoiser_of
from devices.runtime import RuntimePlan, check_device, check_weights, openvino_devices, small_network

from .openvino_calls import SPLIT_BATCH, all_served, halves, outputs, run_at_once, set_inputs, streams_of, torch_threads
from .openvino_w8a8 import RECIPE, Calibration

log = logging.getLogger(__name__)

HOOK = "openvino"
_SUMMARY = ("No conversion rule found for operations", "Conversion is failed for")  # OpenVINO's failure summary
# Module classes whose traced graph was checked to give the torch output at other batch sizes and
# image sizes than the traced ones (tests/test_openvino.py::test_openvino_images_match_torch_fp32): no
# shape is read into Python there but what `_shape_class` keys. Any other class is converted per input shape.
# The DiTs and T5 (issue 58): Flux's and SD3's transformers and T5 traced at one batch and size gave torch's images
# (within 1/255) at batch 2, 2x wider, 2x taller and one patch step wider with no new conversion (tests/test_openvino.py::
# test_a_dit_converts_once_for_every_size). QwenImageTransformer2DModel is not here and cannot be: it takes the
# image's shape as a Python list (`img_shapes`) and the prompts' lengths (`txt_seq_lens`), which a trace bakes in,
# so each size and prompt length is a graph of its own (its key holds them as constants).
DYNAMIC_SAFE = (
    "UNet2DConditionModel", "Decoder", "Encoder", "CLIPTextModel", "CLIPTextModelWithProjection",
    "FluxTransformer2DModel", "SD3Transformer2DModel", "T5EncoderModel",
    "DecoderTiny", "EncoderTiny",  # TINY_VAE's (tests/test_tiny_vae.py: other sizes and batches, no new conversion)
)  # fmt: skip
# Text encoders converted at all: a text encoder with data-dependent Python branches (an attention
# mask read into an `if`, as Qwen2.5-VL's and Gemma's are) would bake one prompt's branch into the graph.
TEXT_ENCODERS = ("CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel")
VAES = ("AutoencoderKL", "AutoencoderTiny")  # encoder/decoder plain functions of their input (video VAEs keep caches between calls)
TOLERANCE = 1e-3  # largest |openvino - torch| / (1 + max |torch|) accepted for a new graph (measured: ~1e-6 in f32)
# ... with compressed weights (OPENVINO_WEIGHTS), per network: measured on the embedded model's UNet, CLIP and
# VAE decoder, int8 0.7-1.4e-2 (images >= 30 dB against fp32: tests/test_openvino.py); int4 is coarser.
COMPRESSED_TOLERANCE = {"int8": 5e-2, "int4": 2e-1, "w8a8": 5e-2}  # w8a8: the networks but the denoiser get int8 weights
# NNCF's mode per OPENVINO_WEIGHTS: asymmetric (a zero point per channel or group) is NNCF's default and its
# most accurate; the NPU's plugin decompresses symmetric weights only (OpenVINO's NPU weight-compression notes).
NNCF_MODES = {"int8": "INT8_ASYM", "int4": "INT4_ASYM", "w8a8": "INT8_ASYM"}
NNCF_MODES_NPU = {"int8": "INT8_SYM", "int4": "INT4_SYM", "w8a8": "INT8_SYM"}
INT4_GROUP = 64  # int4 groups of 64 input channels (NNCF's default 128 is wider than most of a small model's layers)
# Converted graphs kept in memory per network (LoRA sets): an older one is read again from disk when asked for.
GRAPHS_KEPT = 3
# Distinct graphs per network in a process before it goes back to torch: a pipeline passing a new Python
# number each step would otherwise convert at every step (LoRA sets and DiT shapes count too).
MAX_GRAPHS = 32
# With static shapes, compiled shapes kept per graph: the CFG batch and the batch after guidance ends. Each
# compiled shape holds its own buffers (measured on the embedded UNet: ~80 MB each for 25 MB of weights; ~1.9x
# the weights on larger UNets, docs/performance.md#openvino). A network under devices.runtime.STATIC_BELOW_BYTES
# keeps twice as many (hires fix adds a second size to both batches) for at most ~1 GB.
SHAPES_KEPT = 2
SMALL_SHAPES_KEPT = 4
# One OpenVINO compile, read or save at a time in the process: OpenVINO switches the process's C locale to "C" around
# them and back, and two at once (a pool's replicas compiling their shapes) left it at "C", so every later
# read_text() and subprocess text in the app decoded as ASCII (tests/test_openvino.py::
# test_replicas_compiling_at_once_leave_the_locale_alone). A process-wide lock, as the locale is process-wide.
OPENVINO_CALLS = threading.Lock()


@dataclass
class _Entry:
    """One compiled graph of one network, or why that network stays torch for this key."""

    key: str
    model: Any = None  # the converted openvino.Model (dynamic shapes where the network allows)
    compiled: OrderedDict[tuple, Any] = field(default_factory=OrderedDict)  # by input shapes; () = dynamic
    out_spec: Any = None
    error: str | None = None
    seconds: float = 0.0
    source: str = ""  # "converted" or "disk cache"
    out_at: list[int] = field(default_factory=list)  # where the graph's outputs go among the output's leaves
    out_leaves: list[Any] = field(default_factory=list)  # the output's leaves, tensors as None (the rest as returned)
    weight_bytes: int = 0  # the graph's constants (its weights), as compressed (OPENVINO_WEIGHTS)
    calibration: Calibration | None = None  # w8a8: the denoiser's first calls, recorded until it is quantized
    activations: str = "f32"  # "int8" once quantized (w8a8), or why it stays f32


def _flat(args: tuple, kwargs: dict) -> tuple[list[Any], Any, list[int]]:
    """(leaves, spec, indices of the tensor leaves) of a call."""
    leaves, spec = pytree.tree_flatten((args, kwargs))
    return leaves, spec, [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]


class _Traced(torch.nn.Module):
    """The module as a function of the call's tensors alone (the other arguments fixed), returning the
    output's tensors as a flat tuple: the form `ov.convert_model` traces."""

    def __init__(self, module: torch.nn.Module, forward: Callable, leaves: list[Any], spec: Any, tensor_at: list[int]):
        super().__init__()
        self.module = module  # registered, so the trace sees its weights as parameters
        self.call, self.leaves, self.spec, self.tensor_at = forward, leaves, spec, tensor_at

    def forward(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        leaves = list(self.leaves)
        for i, tensor in zip(self.tensor_at, tensors, strict=True):
            leaves[i] = tensor
        args, kwargs = pytree.tree_unflatten(leaves, self.spec)
        out = pytree.tree_leaves(self.call(*args, **kwargs))
        return tuple(t for t in out if isinstance(t, torch.Tensor))


def _shape_class(module: torch.nn.Module, tensors: list[torch.Tensor]) -> list[Any]:
    """What of its input shapes a dynamic graph still depends on. UNet2DConditionModel passes an explicit
    upsample size when the latent's sides are not multiples of 2**num_upsamplers: a Python branch the
    trace bakes, so a graph traced at 64 px gave an empty output at 56x80 (latents 14x20)."""
    if type(module).__name__ != "UNet2DConditionModel":
        return []
    factor = 2**module.num_upsamplers
    return [[side % factor == 0 for side in t.shape[-2:]] for t in tensors if t.ndim == 4]


def weights_hash(module: torch.nn.Module) -> str:
    """A hash of the module's parameters and buffers (names, shapes, dtypes, bytes): the cache key's
    weights part. Taken at install, before any per-request LoRA is loaded into the module."""
    digest = hashlib.blake2b(digest_size=16)
    for name, tensor in module.state_dict().items():
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
        data = tensor.detach().contiguous().cpu()
        digest.update(data.view(torch.uint8).numpy().tobytes() if data.numel() else b"")
    return digest.hexdigest()


def has_lora_layers(module: torch.nn.Module) -> bool:
    """Whether peft injected LoRA layers into the module (then the LoRA set is part of its graphs' key)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    return any(isinstance(m, BaseTunerLayer) for m in module.modules())


class OpenVinoHook(ModelHook):
    """Runs one network's calls through OpenVINO graphs (one per key, `_Entry`), or torch where it cannot."""

    def __init__(self, runtime: OpenVinoRuntime, name: str, module: torch.nn.Module):
        super().__init__()
        self.runtime, self.name, self.kind = runtime, name, type(module).__name__
        self.dynamic = self.kind in DYNAMIC_SAFE  # one graph for every shape, else one per input shapes
        self.weights = weights_hash(module)
        self.lora = ""  # the active LoRA set where the module has LoRA layers (OpenVinoRuntime.use_loras)
        self.ip_adapter = ""  # the denoiser's IP-Adapters and scales (OpenVinoRuntime.use_ip_adapters)
        self.graphs: OrderedDict[str, _Entry] = OrderedDict()
        self.seen: set[str] = set()
        self.last: _Entry | None = None
        self.denoiser = False  # set by OpenVinoRuntime.install: w8a8 quantizes this network's activations

    def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self.runtime.torch_reason is not None:  # this request runs torch (OpenVinoRuntime.torch_only)
            return self.fn_ref.original_forward(*args, **kwargs)
        leaves, spec, tensor_at = _flat(args, kwargs)
        key = self._key(leaves, spec, tensor_at, module)
        entry = self.graphs.get(key)
        if entry is None:
            entry = self._new_entry(module, key, args, kwargs)
        self.graphs.move_to_end(key)
        self.last = entry
        if entry.error is not None:
            with torch_threads(self.runtime.threads):  # inside OpenVinoRuntime.serving: the threads back
                return self.fn_ref.original_forward(*args, **kwargs)
        return self.runtime.run(entry, [leaves[i] for i in tensor_at], split=self.kind in SPLIT_BATCH)

    def _key(self, leaves: list[Any], spec: Any, tensor_at: list[int], module: torch.nn.Module) -> str:
        tensors = set(tensor_at)
        shapes = _shape_class(module, [leaves[i] for i in tensor_at]) if self.dynamic else None
        parts = {
            "call": str(spec),
            "module": self.kind,
            "weights": self.weights,
            "lora": self.lora,
            "ip_adapter": self.ip_adapter,
            "runtime": self.runtime.identity,
            "tensors": [
                [str(leaves[i].dtype), leaves[i].ndim if self.dynamic else list(leaves[i].shape)] for i in tensor_at
            ],
            "constants": [repr(leaf) for i, leaf in enumerate(leaves) if i not in tensors],
            "shape_class": shapes,
        }
        return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:24]

    def _new_entry(self, module: torch.nn.Module, key: str, args: tuple, kwargs: dict) -> _Entry:
        if len(self.seen) >= MAX_GRAPHS:
            entry = _Entry(key, error=f"over {MAX_GRAPHS} distinct calls: its inputs vary in values a graph bakes in")
        else:
            entry = self.runtime.graph(self, module, key, args, kwargs)
        self.seen.add(key)
        self.graphs[key] = entry
        converted = [k for k, e in self.graphs.items() if e.model is not None]
        for old in converted[:-GRAPHS_KEPT]:  # read again from disk if asked for again (still counted in `seen`)
            del self.graphs[old]
        return entry

    def describe(self) -> str:
        if self.last is None:
            return "not used yet"
        if self.last.error is not None:
            return f"torch ({self.last.error})"
        text = f"{self.last.source} in {self.last.seconds:.1f} s"
        if not self.dynamic:
            text += ", converted per shape"
        elif self.runtime.plan.static_for(self.last.weight_bytes):
            text += ", compiled per shape"
            if self.kind in SPLIT_BATCH and self.runtime.streams > 1:
                text += f", even batches in halves on {self.runtime.streams} CPU streams"
        if self.last.calibration is not None:
            return f"{text}, {self.last.calibration.describe()}"
        return text + (f", activations {self.last.activations}" if self.runtime.plan.weights == "w8a8" and self.denoiser else "")


class OpenVinoRuntime:
    """One pipeline's OpenVINO side: the Core, the compile settings, the hooks on its networks and the
    graph cache on disk. One per ImagePipeline (a pool's replicas each have their own modules)."""

    def __init__(self, plan: RuntimePlan, cache_dir: Path, threads: int | None = None):
        import openvino

        self.ov, self.plan = openvino, plan
        self.core = openvino.Core()
        check_device(self.core, plan.openvino_device)  # ValueError naming what OpenVINO sees
        check_weights(self.core, plan.openvino_device, plan.weights)  # ... or a plugin without int8 weights
        self.version = openvino.get_version()
        self.cache_dir = Path(cache_dir).expanduser()
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        self.core.set_property({"CACHE_DIR": str(self.cache_dir / "compiled")})
        # the replica's share of the cores: serving.pool.share_cpu_threads set torch's
        self.threads = threads or torch.get_num_threads()
        self.config = _compile_config(plan.openvino_device, self.threads)
        self.identity = f"{self.version}|{plan.openvino_device}|{sorted(self.config.items())}|{RECIPE.get(plan.weights, plan.weights)}"
        self.streams = streams_of(plan.openvino_device, self.threads, plan.weights)  # SPLIT_BATCH
        self.device_label = _device_label(self.core, plan.openvino_device)
        self.hooks: dict[str, OpenVinoHook] = {}
        self.modules: dict[str, torch.nn.Module] = {}
        self.skipped: dict[str, str] = {}  # network -> why it stays torch
        self.conversions = 0  # graphs converted by this runtime (the disk cache's reads are not counted)
        self.compiles = 0  # graphs compiled for the device (per shape with static shapes)
        self.on_activity: Callable[[str], None] = lambda text: None  # the replica's activity line
        self.torch_reason: str | None = None  # set while a request runs on torch (`torch_only`)
        self.last_torch: str | None = None  # why the last request that ran torch did, for the status panel
        self._lock = threading.Lock()

    def install(self, pipe: Any) -> None:
        """A hook on each network `networks` finds; graphs are made on each network's first call."""
        found, self.skipped = networks(pipe)
        for name, module in found:
            hook = OpenVinoHook(self, name, module)
            hook.denoiser = name == found[0][0]  # networks() lists the denoiser first
            HookRegistry.check_if_exists_or_initialize(module).register_hook(hook, HOOK)
            self.hooks[name], self.modules[name] = hook, module
        one_device(pipe)
        log.info("OpenVINO %s on %s for %s", self.version, self.plan.openvino_device, ", ".join(self.hooks))

    def use_loras(self, key: str) -> None:
        """The active LoRA set (names, files, scales) of the next calls: part of the key of the networks
        that hold LoRA layers, so each set gets (and caches) its own graphs."""
        for name, hook in self.hooks.items():
            hook.lora = key if key and has_lora_layers(self.modules[name]) else ""

    def use_ip_adapters(self, key: str) -> None:
        """The IP-Adapters in the denoiser and their scales for the next calls (pipelines.control.ip_adapter): their
        processors and scales are traced into the denoiser's graph (SD's UNet, Flux's and SD3's
        transformer), so each set gets its own graphs, as a LoRA set does."""
        for name in ("unet", "transformer"):
            if name in self.hooks:
                self.hooks[name].ip_adapter = key

    @contextlib.contextmanager
    def torch_only(self, reason: str) -> Iterator[None]:
        """Every network runs its torch module inside (RUNTIME=auto's fallback for a request OpenVINO cannot
        run: pipelines.run.checks.torch_needed). The pipeline's lock makes it one request's."""
        before, self.torch_reason, self.last_torch = self.torch_reason, reason, reason
        try:
            yield
        finally:
            self.torch_reason = before

    def serving(self, pipe: Any) -> contextlib.AbstractContextManager:
        """Around one diffusers call of `pipe` (this pipeline or a twin): where every network it holds runs as graphs
        here, torch at one thread in this thread (pipelines.weights.openvino_calls says why); a ControlNet or an
        IP-Adapter's image encoder runs torch, so such a call keeps the threads, and so does a network that falls
        back to its torch module inside (`OpenVinoHook.new_forward`)."""
        if self.torch_reason is not None or self.skipped or self.threads == 1 or not all_served(pipe, self.modules):
            return contextlib.nullcontext()
        return torch_threads(1)

    @property
    def calibrating(self) -> bool:
        """w8a8: a denoiser's calls are still recorded (its requests run the f32 graph until it is quantized)."""
        return any(hook.last is not None and hook.last.calibration is not None for hook in self.hooks.values())

    def describe(self) -> str:
        parts = [f"{name} {hook.describe()}" for name, hook in self.hooks.items()]
        parts += [f"{name} torch ({why})" for name, why in self.skipped.items()]
        text = f"OpenVINO {self.version.split('-')[0]} {self.device_label}: " + "; ".join(parts)
        if self.plan.weights != "fp32":  # counted only where it is shown (the status panel polls this)
            graphs, fp32 = self.weight_bytes()
            if fp32:
                text += f"; {self.plan.weights} weights: {graphs / 2**20:.1f} MiB ({graphs / fp32:.2f}x fp32's {fp32 / 2**20:.1f})"
        return text + (f"; last torch request: {self.last_torch}" if self.last_torch else "")

    def graph(self, hook: OpenVinoHook, module: torch.nn.Module, key: str, args: tuple, kwargs: dict) -> _Entry:
        """The compiled graph for `key`: from the disk cache, else converted from the module (and saved)."""
        with self._lock:
            folder = self.cache_dir / key
            began = time.perf_counter()
            try:
                if (folder / "meta.json").is_file():
                    entry = self._read(key, folder, hook)
                else:
                    self.on_activity(f"OpenVINO: converting {hook.name} (once; cached on disk)")
                    entry = self._convert(hook, module, key, (args, kwargs), folder)
            except Exception as exc:  # OpenVINO's conversion errors name the op; the network stays torch
                entry = _Entry(key, error=f"not converted: {_reason(exc)}")
                log.warning("OpenVINO: %s stays torch: %s", hook.name, entry.error, exc_info=True)
            finally:
                self.on_activity("")
            entry.seconds = time.perf_counter() - began
            if entry.error is None:
                log.info("OpenVINO: %s %s in %.1f s (%s)", hook.name, entry.source, entry.seconds, key)
            return entry

    def _convert(self, hook: OpenVinoHook, module: torch.nn.Module, key: str, call: tuple, folder: Path) -> _Entry:
        """Trace the module with this call's inputs, compile, check against torch on them, save."""
        original = hook.fn_ref.original_forward
        leaves, spec, tensor_at = _flat(*call)
        example = tuple(leaves[i] for i in tensor_at)
        with torch.no_grad():
            expected = original(*call[0], **call[1])
            traced = _Traced(module, original, leaves, spec, tensor_at).eval()
            model = self._compressed(self.ov.convert_model(traced, example_input=example), hook)
        out_leaves, out_spec = pytree.tree_flatten(expected)
        entry = _Entry(key, model=model, source="converted", out_spec=out_spec, weight_bytes=_constant_bytes(model))
        entry.out_at = [i for i, leaf in enumerate(out_leaves) if isinstance(leaf, torch.Tensor)]
        entry.out_leaves = [None if i in entry.out_at else leaf for i, leaf in enumerate(out_leaves)]
        meta = {"out_spec": pytree.treespec_dumps(out_spec), "out_at": entry.out_at, "out_leaves": entry.out_leaves}
        text = json.dumps(meta)  # TypeError for an output leaf JSON cannot keep: the network stays torch
        calibrating = self._calibrates(hook)
        _check(hook.name, self.run(entry, list(example)), expected, TOLERANCE if calibrating else COMPRESSED_TOLERANCE.get(self.plan.weights, TOLERANCE))
        entry.calibration = Calibration() if calibrating else None
        _save(self.ov, model, text, folder)
        self.conversions += 1
        return entry

    def _calibrates(self, hook: OpenVinoHook) -> bool:
        """Whether this network's graph is quantized after calibration (w8a8's denoiser) rather than compressed."""
        return self.plan.weights == "w8a8" and hook.denoiser

    def _compressed(self, model: Any, hook: OpenVinoHook) -> Any:
        """The converted graph with its weights compressed by NNCF as OPENVINO_WEIGHTS asks (fp32: unchanged;
        w8a8's denoiser: unchanged until calibrated, `_quantize`)."""
        weights = self.plan.weights
        if weights == "fp32" or self._calibrates(hook):
            return model
        import nncf

        modes = NNCF_MODES_NPU if self.plan.openvino_device.startswith("NPU") else NNCF_MODES
        extra = {"group_size": INT4_GROUP, "ratio": 1.0} if weights == "int4" else {}
        return nncf.compress_weights(model, mode=getattr(nncf.CompressWeightsMode, modes[weights]), **extra)

    def weight_bytes(self) -> tuple[int, int]:
        """(bytes of the networks' weights in their last graphs, the same networks' torch fp32 bytes): what
        OPENVINO_WEIGHTS saves, for the status panel."""
        graphs = torch_bytes = 0
        for name, hook in self.hooks.items():
            if hook.last is not None and hook.last.error is None:
                graphs += hook.last.weight_bytes
                torch_bytes += sum(t.numel() * 4 for t in self.modules[name].state_dict().values())
        return graphs, torch_bytes

    def _read(self, key: str, folder: Path, hook: OpenVinoHook) -> _Entry:
        """A graph saved by `_convert` (checked then) or `_quantize`, compiled for this device."""
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
        with OPENVINO_CALLS:
            model = self.core.read_model(str(folder / "model.xml"))
        entry = _Entry(key, model=model, source="disk cache", out_spec=pytree.treespec_loads(meta["out_spec"]))
        entry.weight_bytes = _constant_bytes(model)
        entry.out_at, entry.out_leaves = meta["out_at"], meta["out_leaves"]
        entry.activations = meta.get("activations", "f32")
        if self._calibrates(hook) and entry.activations == "f32":
            entry.calibration = Calibration()
        return entry

    def _quantize(self, entry: _Entry) -> None:
        """w8a8: the denoiser's graph quantized on its recorded calls, kept when it stays within
        openvino_w8a8.TOLERANCE of the f32 graph, and saved over the f32 one in the cache; else the f32 graph
        stays, and `entry.activations` says why (the status panel shows it)."""
        from .openvino_w8a8 import TOLERANCE as W8A8_TOLERANCE
        from .openvino_w8a8 import quantize, relative_error

        samples, entry.calibration = entry.calibration.samples, None
        model, compiled = entry.model, entry.compiled
        f32 = _Entry(entry.key, model=model, compiled=compiled, weight_bytes=entry.weight_bytes)
        self.on_activity("OpenVINO: quantizing the denoiser to int8 activations (once; cached on disk)")
        try:
            entry.model, entry.compiled = quantize(model, samples), OrderedDict()
            # each recorded call through graphs of its own shapes: one request can call the denoiser at two sizes
            error = relative_error(lambda arrays: self.compiled(entry, arrays), lambda arrays: self.compiled(f32, arrays), samples)
            why = f"int8 was {error:.3f} from it, over {W8A8_TOLERANCE}" if error > W8A8_TOLERANCE else None
        except Exception as exc:  # NNCF or the plugin refusing the quantized graph: the request goes on in f32
            log.warning("OpenVINO: the denoiser's quantization failed", exc_info=True)
            why = f"not quantized: {_reason(exc)}"
        finally:
            self.on_activity("")
        if why is not None:
            entry.model, entry.compiled, entry.activations = model, compiled, f"f32 ({why})"
            log.warning("OpenVINO: the denoiser stays %s", entry.activations)
            return
        entry.activations, entry.weight_bytes = "int8", _constant_bytes(entry.model)
        folder = self.cache_dir / entry.key
        meta = json.loads((folder / "meta.json").read_text(encoding="utf-8")) | {"activations": "int8"}
        _save(self.ov, entry.model, json.dumps(meta), folder, replace=True)
        log.info("OpenVINO: denoiser quantized (int8 activations) on %d calls, %.3f from f32", len(samples), error)

    def compiled(self, entry: _Entry, tensors: list[torch.Tensor], streams: int = 1) -> Any:
        """The graph compiled for this device: once (dynamic shapes), or per input shapes with static shapes
        (the NPU's rule, a small network's with OPENVINO_SHAPES=auto: RuntimePlan.static_for), the last
        SHAPES_KEPT (SMALL_SHAPES_KEPT) kept; with `streams` > 1, for that many calls at once (SPLIT_BATCH)."""
        shapes = tuple(tuple(t.shape) for t in tensors) if self.plan.static_for(entry.weight_bytes) else ()
        slot = (shapes, streams)
        found = entry.compiled.get(slot)
        if found is not None:
            entry.compiled.move_to_end(slot)
            return found
        model = entry.model
        if shapes:
            model = model.clone()
            model.reshape({model.input(i): self.ov.PartialShape(list(shape)) for i, shape in enumerate(shapes)})
        config = self.config if streams == 1 else {**self.config, "PERFORMANCE_HINT": "THROUGHPUT", "NUM_STREAMS": streams}
        began = time.perf_counter()
        with OPENVINO_CALLS:
            found = entry.compiled[slot] = self.core.compile_model(model, self.plan.openvino_device, config)
        self.compiles += 1
        log.info("OpenVINO: compiled for %s (%d stream(s)) in %.1f s", shapes or "dynamic shapes", streams, time.perf_counter() - began)
        kept = SMALL_SHAPES_KEPT if small_network(entry.weight_bytes) else SHAPES_KEPT
        while len(entry.compiled) > kept:
            entry.compiled.popitem(last=False)
        return found

    def run(self, entry: _Entry, tensors: list[torch.Tensor], split: bool = False) -> Any:
        """One call of a compiled graph; the output in the torch module's structure (its ModelOutput, tuple).
        `split` (a SPLIT_BATCH network): an even batch runs as two halves at once (pipelines.weights.openvino_calls)
        on a replica with two streams, a graph compiled per shape, and no w8a8 calibration recording."""
        parts = None
        if split and self.streams > 1 and entry.calibration is None and self.plan.static_for(entry.weight_bytes):
            parts = halves(tensors)
        if parts is not None:
            return outputs(entry, run_at_once(self.ov, self.compiled(entry, parts[0], self.streams), parts))
        request = self.compiled(entry, tensors).create_infer_request()  # per call: replicas never share one
        arrays = set_inputs(self.ov, request, tensors)
        request.infer()
        if entry.calibration is not None and entry.calibration.record(arrays):
            with self._lock:
                self._quantize(entry)
        return outputs(entry, [request])


def _reason(exc: Exception) -> str:
    """Why a network did not convert, in a line: OpenVINO's summary of the torch ops it has no conversion
    rule for ("No conversion rule found for operations: aten::einsum, ..."), else the first lines."""
    text = str(exc)
    summary = [line.strip(" -") for line in text.splitlines() if line.strip(" -").startswith(_SUMMARY)]
    if summary:
        return "OpenVINO: " + "; ".join(summary)[:400]
    return f"{type(exc).__name__}: {' '.join(text.strip().splitlines()[:3])[:300]}"


def _constant_bytes(model: Any) -> int:
    """Bytes of an OpenVINO model's constants: its weights, as stored (int8/int4 where compressed)."""
    return sum(op.get_byte_size() for op in model.get_ordered_ops() if op.get_type_name() == "Constant")


def _check(name: str, got: Any, expected: Any, tolerance: float = TOLERANCE) -> None:
    """ValueError when a new graph's outputs are not the torch module's on the inputs it was traced with."""
    pairs = zip(pytree.tree_leaves(got), pytree.tree_leaves(expected), strict=True)
    for a, b in ((a, b) for a, b in pairs if isinstance(b, torch.Tensor)):
        if a.shape != b.shape:
            raise ValueError(f"{name}: OpenVINO output shape {tuple(a.shape)} != torch's {tuple(b.shape)}")
        error = (a.float() - b.float()).abs().max().item() / (1.0 + b.float().abs().max().item())
        if not error <= tolerance:
            raise ValueError(f"{name}: OpenVINO output differs from torch's by {error:.2e} (> {tolerance})")


def _save(ov: Any, model: Any, meta: str, folder: Path, replace: bool = False) -> None:
    """model.xml/.bin and meta.json, written beside `folder` and renamed into place (replicas may race);
    `replace`: over the graph saved there (w8a8's quantized denoiser over its f32 graph)."""
    partial = folder.with_name(f"{folder.name}.partial-{threading.get_ident()}")
    partial.mkdir(parents=True, exist_ok=True)
    with OPENVINO_CALLS:
        ov.save_model(model, str(partial / "model.xml"), compress_to_fp16=False)
    (partial / "meta.json").write_text(meta, encoding="utf-8")
    if replace:
        shutil.rmtree(folder, ignore_errors=True)
    try:
        partial.rename(folder)
    except OSError:  # another replica saved the same graph first
        shutil.rmtree(partial, ignore_errors=True)


def _device_label(core: Any, device: str) -> str:
    """ "GPU.0 (Intel Arc A770, 15.9 GiB)": the device, its name and memory where OpenVINO reports them."""
    for found in openvino_devices(core)[0]:
        if found.name == device or (device == "GPU" and found.name.startswith("GPU")):
            memory = f", {found.memory_total / 2**30:.1f} GiB" if found.memory_total else ""
            return f"{device} ({found.full_name}{memory})"
    return device


def _compile_config(device: str, threads: int | None) -> dict[str, Any]:
    """compile_model's settings: on the CPU f32 (torch fp32's numbers: the parity gate's 40 dB holds; a
    CPU with AMX would otherwise pick bf16) and the replica's share of the cores."""
    config: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY"}
    if device == "CPU":
        config["INFERENCE_PRECISION_HINT"] = "f32"
        if threads:
            config["INFERENCE_NUM_THREADS"] = int(threads)
        if threads and threads < (os.cpu_count() or 1):
            # A pool replica's share of the cores (serving.pool.share_cpu_threads): OpenVINO pins each compiled
            # model's stream to cores it picks itself, the same ones for every replica, so two replicas took turns
            # on one core (two requests at once: 2.01x one). Unpinned, the OS spreads them: 1.15x
            # (docs/performance.md#the-pool-on-a-cpu). A lone replica keeps the default (pinning measured no gain).
            config["ENABLE_CPU_PINNING"] = False
    return config


def one_device(pipe: Any) -> None:
    """The pipeline answers diffusers' `device` and `_execution_device` with the device its modules are on now,
    instead of walking each of its torch modules for offload hooks at every request (536 modules on the embedded
    model: 3.5 ms of a 4-step request's 34 ms here). A pipeline OpenVINO serves is on the CPU and never
    offloaded (devices.manager offloads none on the CPU), so the answer cannot change. optimum-intel's pipeline
    classes override the same two properties."""
    device = pipe._execution_device  # diffusers' own answer (offload hooks included), once
    pipe.__class__ = _on_one_device(type(pipe))
    pipe.__dict__["_one_device"] = device


@functools.cache
def _on_one_device(cls: type) -> type:
    """`cls` with `device` and `_execution_device` read from the instance (`one_device`); same name, so the
    pipeline's class still reads as diffusers' in logs, model info and a saved model_index.json."""
    fixed = property(lambda self: self.__dict__["_one_device"])
    names = {"__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__}
    return type(cls.__name__, (cls,), {**names, "device": fixed, "_execution_device": fixed})


def networks(pipe: Any) -> tuple[list[tuple[str, torch.nn.Module]], dict[str, str]]:
    """(name, module) of the networks OpenVINO runs, and (name -> why) for those left to torch."""
    components = pipe.components
    name, denoiser = denoiser_of(pipe)
    found = [(name, denoiser)]
    skipped: dict[str, str] = {}
    for te in ("text_encoder", "text_encoder_2", "text_encoder_3"):
        module = components.get(te)
        if isinstance(module, torch.nn.Module):
            kind = type(module).__name__
            if kind in TEXT_ENCODERS:
                found.append((te, module))
            else:
                skipped[te] = f"{kind} is not among the text encoders checked to convert: {', '.join(TEXT_ENCODERS)}"
    vae = components.get("vae")
    if type(vae).__name__ in VAES:
        found += [("vae.decoder", vae.decoder), ("vae.encoder", vae.encoder)]
    elif vae is not None:
        skipped["vae"] = f"{type(vae).__name__} is not among the VAEs checked to convert: {', '.join(VAES)}"
    return found, skipped
