"""`python -m devices benchmark` and `optimize`'s choice: how fast the denoiser runs on a device.

A cell is one combination of dtype x attention x compile x batch; its figure is denoiser calls per
second (it/s) of the embedded model's UNet on `batch` latents, counted over about `duration`
seconds after one warm-up call (which pays the compile, when there is one). With classifier-free
guidance a sampling step is one such call on twice the batch, so batch 4 is also two images
guided; images/s is it/s x batch. Every call is followed by a device synchronize, as a sampler's
next step reads the output anyway, so asynchronous backends are timed honestly.

Compile cells follow devices/compile.py's policy: where `plan(backend, "auto")` compiles (CUDA,
ROCm, XPU, Ascend with torchair) both off and on are measured; on CPU and MPS only when asked
(`--compile`), since there the compile alone costs tens of seconds.

`choose` is the optimizer's decision, a pure function of the self-test's rows and the benchmark's
rows (their JSON form), so it can be tested without a device.
"""

from __future__ import annotations

import copy
import logging
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from . import attention as _attention
from . import compile as _compile
from . import memory
from .options import parse_dtype
from .selftest import DEFAULT_MODEL, MODEL_CHECKS, SEED, plan

log = logging.getLogger(__name__)

BATCHES = (1, 4)
CHOICE_BATCH = 1  # the app's default request is one image, and interactive latency is what users wait on
# The op-level attention rows each model-level attention type depends on: sdpa dispatches to the
# backend's fused kernels; vanilla runs AttnProcessor with any SDPA call limited to the math kernel.
DEPENDS_ON = {"sdpa": ("sdpa", "sdpa-flash", "sdpa-efficient"), "vanilla": ("vanilla", "sdpa-math"), "npu": ("npu",)}


@dataclass
class Cell:
    """One benchmark measurement (the JSON row)."""

    dtype: str
    attention: str
    compile: bool
    batch: int
    it_s: float | None = None
    images_s: float | None = None
    calls: int = 0
    warmup_s: float = 0.0
    error: str = ""


def compile_options(backend: str, asked: bool) -> tuple[bool, ...]:
    """(False,) or (False, True): compile is measured where the policy compiles or it is asked for."""
    mode = "on" if asked else "auto"
    return (False, True) if _compile.plan(backend, mode).enabled else (False,)


def cells(
    backend: str, dtypes: Sequence[str] | None, compile_asked: bool, batches: Sequence[int] = BATCHES
) -> list[Cell]:
    """Every cell the benchmark runs on `backend`, in order."""
    p = plan(backend, dtypes)
    return [
        Cell(dtype, att, comp, batch)
        for dtype in p.dtypes
        for att in p.model_attention
        for comp in compile_options(backend, compile_asked)
        for batch in batches
    ]


def load_unet(model_dir: str | Path) -> torch.nn.Module:
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel.from_pretrained(str(model_dir), subfolder="unet").eval()


def _inputs(unet: torch.nn.Module, batch: int, device: torch.device, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(SEED)
    size = unet.config.sample_size
    size = size[0] if isinstance(size, (list, tuple)) else size
    latents = torch.randn(batch, unet.config.in_channels, size, size, generator=gen)
    hidden = torch.randn(batch, 8, unet.config.cross_attention_dim, generator=gen)
    return {
        "sample": latents.to(device, dtype),
        "timestep": torch.tensor([500] * batch, device=device),
        "encoder_hidden_states": hidden.to(device, dtype),
    }


def measure(unet: torch.nn.Module, cell: Cell, device: torch.device, backend: str, duration: float) -> Cell:
    """Time one cell in place; a cell that raises keeps the exception's text (logged), the others go on."""
    try:
        dtype = parse_dtype(cell.dtype)
        model = copy.deepcopy(unet).to(device=device, dtype=dtype)
        _attention.apply_to_module(model, cell.attention)
        if cell.compile:
            _compile.compile_denoiser(SimpleNamespace(unet=model), _compile.plan(backend, "on"))
        inputs = _inputs(model, cell.batch, device, dtype)
        with torch.no_grad(), _attention.call_context(cell.attention):
            start = time.perf_counter()
            model(**inputs)
            memory.synchronize(backend, device)
            cell.warmup_s = time.perf_counter() - start
            start, calls = time.perf_counter(), 0
            while calls == 0 or time.perf_counter() - start < duration:
                model(**inputs)
                memory.synchronize(backend, device)
                calls += 1
            elapsed = time.perf_counter() - start
        cell.calls, cell.it_s = calls, calls / elapsed
        cell.images_s = cell.it_s * cell.batch
    except Exception as exc:  # the cell's failure is its result
        log.warning("benchmark %s raised: %s", cell, exc)
        cell.error = f"{type(exc).__name__}: {exc}"
    return cell


@dataclass
class Benchmark:
    device: str
    backend: str
    duration: float
    cells: list[Cell]
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["seconds"] = round(self.seconds, 2)
        return data


def run(
    device: torch.device,
    backend: str,
    *,
    dtypes: Sequence[str] | None = None,
    compile_asked: bool = False,
    duration: float = 1.0,
    batches: Sequence[int] = BATCHES,
    model_dir: str | Path = DEFAULT_MODEL,
) -> Benchmark:
    """Every cell of the benchmark on `device`."""
    start = time.perf_counter()
    unet = load_unet(model_dir)
    todo = cells(backend, dtypes, compile_asked, batches)
    notes = [] if compile_asked else [_compile.plan(backend, "auto").describe() + " (benchmark --compile measures it)"]
    notes += _load_note()
    done = [measure(unet, cell, device, backend, duration) for cell in todo]
    return Benchmark(str(device), backend, duration, done, time.perf_counter() - start, notes)


def _load_note() -> list[str]:
    """Other processes' load, said next to the figures: on a shared CPU it slows every cell several
    fold (field notes: 5-12x with torch's default threads), and a choice made under it may differ."""
    cores = os.cpu_count() or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    if load < 0.5:
        return []
    return [
        f"load average {load:.1f} on {cores} cores at the start: other processes compete, the figures are noisy (on a CPU: --threads with the free cores)"
    ]


def format_table(bench: Benchmark) -> str:
    head = f"{'dtype':<9} {'attention':<9} {'compile':<7} {'batch':>5} {'it/s':>8} {'images/s':>9} {'calls':>6} {'warm-up s':>9}"
    lines = [
        f"Denoiser speed on {bench.device} ({bench.backend}), ~{bench.duration:g} s per cell",
        head,
        "-" * len(head),
    ]
    for c in bench.cells:
        figures = (
            f"{'error: ' + c.error[:60]}"
            if c.error
            else f"{c.it_s:8.2f} {c.images_s:9.2f} {c.calls:6d} {c.warmup_s:9.2f}"
        )
        lines.append(f"{c.dtype:<9} {c.attention:<9} {'on' if c.compile else 'off':<7} {c.batch:>5} {figures}")
    lines += [f"note: {n}" for n in bench.notes]
    lines.append(f"({bench.seconds:.1f} s)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- optimize's choice
@dataclass(frozen=True)
class Choice:
    """The settings to write (variable -> text; empty when nothing passes) and why."""

    settings: dict[str, str]
    reasons: list[str]


def failures(test_rows: Iterable[Mapping[str, Any]], dtype: str, attention: str) -> list[Mapping[str, Any]]:
    """The self-test rows that rule out (dtype, attention): that dtype's plain ops, the op-level
    attention rows this attention depends on, and its model rows."""
    out = []
    for row in test_rows:
        if row["dtype"] != dtype or row["status"] == "pass":
            continue
        if row["check"] == "generation":  # the dtype's picture: rules out every attention of that dtype
            out.append(row)
            continue
        model_row = row["check"] in MODEL_CHECKS
        if model_row and row["attention"] != attention:
            continue
        if not model_row and row["attention"] and row["attention"] not in DEPENDS_ON.get(attention, (attention,)):
            continue
        out.append(row)
    return out


def _name(cell: Mapping[str, Any]) -> str:
    return f"{cell['dtype']}/{cell['attention']}/compile {'on' if cell['compile'] else 'off'}"


def _why(row: Mapping[str, Any]) -> str:
    where = f"{row['check']}" + (f" ({row['attention']})" if row["attention"] else "")
    return f"{where}: {row['detail'] or row['status']}" + (f" [{row['tolerance']}]" if row.get("tolerance") else "")


def choose(
    test_rows: Sequence[Mapping[str, Any]], bench_rows: Sequence[Mapping[str, Any]], batch: int = CHOICE_BATCH
) -> Choice:
    """The fastest (dtype, attention, compile) at `batch` whose self-test rows all pass, with the
    reasons: every faster setting that was ruled out and by what, then the choice and its margin."""
    timed = sorted(
        (c for c in bench_rows if c["batch"] == batch and not c.get("error") and c.get("it_s")),
        key=lambda c: c["it_s"],
        reverse=True,
    )
    if not timed:
        return Choice({}, [f"no benchmark cell at batch {batch} ran"])
    ruled_out = []
    for cell in timed:
        failed = failures(test_rows, cell["dtype"], cell["attention"])
        if not failed:
            reasons = [_ruled_out(other, rows, cell) for other, rows in ruled_out]
            return Choice(_settings(cell), [*reasons, _chosen(cell, timed)])
        ruled_out.append((cell, failed))
    reasons = [_ruled_out(other, rows, None) for other, rows in ruled_out]
    return Choice({}, [*reasons, "no setting passes the self-test: nothing to apply"])


def _ruled_out(cell: Mapping[str, Any], failed: Sequence[Mapping[str, Any]], chosen: Mapping[str, Any] | None) -> str:
    speed = f"{cell['it_s'] / chosen['it_s']:.2f}x faster" if chosen else f"{cell['it_s']:.2f} it/s"
    more = f" and {len(failed) - 1} more row(s)" if len(failed) > 1 else ""
    return f"{_name(cell)} is {speed} but fails {_why(failed[0])}{more}"


def _settings(cell: Mapping[str, Any]) -> dict[str, str]:
    return {
        "TORCH_DTYPE": cell["dtype"],
        "DIFFUSERS_ATTENTION_TYPE": cell["attention"],
        "COMPILE": "on" if cell["compile"] else "off",
    }


def _chosen(cell: Mapping[str, Any], timed: Sequence[Mapping[str, Any]]) -> str:
    others = [c for c in timed if c is not cell]
    margin = ""
    if others:
        best_other = max(others, key=lambda c: c["it_s"])
        margin = f"; {cell['it_s'] / best_other['it_s']:.2f}x {_name(best_other)} ({best_other['it_s']:.2f} it/s)"
    return f"chosen {_name(cell)}: {cell['it_s']:.2f} it/s at batch {cell['batch']}, passes every self-test row{margin}"
