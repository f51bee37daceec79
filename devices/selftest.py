"""`python -m devices test`: a numerical self-test of a device against the CPU in float32.

Every check runs the same inputs (fixed seed, drawn on the CPU) twice: on the CPU in float32 (the
reference) and on the device in the dtype under test, then compares. A device whose kernels are
wrong (a driver bug, a broken torch_npu, a fused attention kernel that misbehaves at some shape)
shows up here as a number, before it shows up as a black or noisy picture.

Checks: matmul, conv2d, group norm, softmax, each attention implementation the device offers
(`plan`), then the embedded model's VAE decoder and one denoiser (UNet) call, with each model-level
attention type (sdpa, vanilla, npu where available), since those are what `optimize` chooses between;
last, per dtype, one whole generation (text encoder, 10 guided steps, decode; the device's policy
attention), compared as a picture: per-call errors compound over the steps, and whether the
picture stays the same is what a user sees.

Error measures: `max_abs` and `mean_abs` are absolute; `rel` is max_abs divided by the reference's
largest magnitude (the scale a dtype's precision is relative to); PSNR is over the decoded image in
[0, 1] for the VAE row and over the reference's value range elsewhere.

Tolerances, one table (`TOLERANCES`):

| dtype | ops: rel <= | denoiser: rel <= | VAE PSNR >= | why |
|---|---|---|---|---|
| float32 on the CPU | 1e-6 | 1e-6 | - (rel 1e-6) | the same kernels on the same inputs: the bits should match; 1e-6 leaves room for a reduction order that changes with the thread count |
| float32 on an accelerator | 2e-3 | 5e-3 | 50 dB | cuDNN convolutions (and Ascend's HF32 matmuls) use TF32-class arithmetic by default: a 10-bit mantissa, ~1e-3 |
| float16 | 5e-3 | 2e-2 | 40 dB | 11-bit mantissa (eps 4.9e-4): inputs and outputs rounded, fp32 accumulation, a few eps of the output's scale per op; the ~40 layers of a UNet compound it; 40 dB is a high-quality JPEG's fidelity |
| bfloat16 | 3e-2 | 5e-2 | 30 dB | 8-bit mantissa (eps 3.9e-3, ~3 significant digits): a few 1e-2 of the scale per op; 30 dB is the usual floor of "the same picture" (a medium-quality JPEG) |

bfloat16 honestly: one decode or one denoiser call in bf16 is close to fp32 (tiny-shapes on this CPU:
decode 54.7 dB, mean error 0.34/255; denoiser 62.6 dB), and so is a whole generation with torch on
the CPU (52 dB, mean 0.36/255, max 14/255). The field notes saw a bf16 generation change this
model's picture by ~10/255 on average; the generation row is there to show such a drift wherever it
happens (docs/devices.md has the figures per device). The PSNR of every row is printed, so the
figure, not just "pass", is seen; `optimize` on the CPU does not pick bf16 anyway (it is several
times slower there).

`probe(dm)` is the quick health check (ops only, dm's own dtype and attention, no model): the
device pool calls it to decide whether a device that failed has recovered.
"""

from __future__ import annotations

import copy
import importlib
import logging
import math
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from . import attention as _attention
from . import backends
from .one_load import ONE_LOAD
from .options import parse_dtype

if TYPE_CHECKING:
    from .manager import DeviceManager

log = logging.getLogger(__name__)

SEED = 1234
MODEL_CHECKS = ("vae", "denoiser", "generation")  # rows compared as model outputs (rel bound of the model)
PICTURE_CHECKS = ("vae", "generation")  # rows compared as pictures in [0, 1] (PSNR bound)
GENERATION = {"prompt": "a red circle on a blue background", "num_inference_steps": 10}
DEFAULT_MODEL = Path(__file__).resolve().parents[1] / "models" / "tiny-shapes"
DTYPE_ORDER = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class Tolerance:
    """One row of the tolerance table in the module docstring."""

    op_rel: float
    model_rel: float
    vae_psnr: float | None  # None: the rel bound alone (float32 on the CPU must match, not resemble)


TOLERANCES: dict[str, Tolerance] = {
    "float32@cpu": Tolerance(1e-6, 1e-6, None),
    "float32": Tolerance(2e-3, 5e-3, 50.0),
    "float16": Tolerance(5e-3, 2e-2, 40.0),
    "bfloat16": Tolerance(3e-2, 5e-2, 30.0),
}


def tolerance_for(dtype: str, backend: str) -> Tolerance:
    return TOLERANCES.get(f"{dtype}@{backend}") or TOLERANCES[dtype]


# ---------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class Plan:
    """What the self-test runs on a backend (computed without touching the device)."""

    backend: str
    dtypes: tuple[str, ...]
    op_attention: tuple[str, ...]  # sdpa, sdpa-math, sdpa-flash, sdpa-efficient, vanilla, npu
    model_attention: tuple[str, ...]  # sdpa, vanilla, npu: DIFFUSERS_ATTENTION_TYPE's values
    notes: tuple[str, ...] = ()


def _npu_fused_problem(backend: str) -> str | None:
    """Why Ascend's fused attention cannot be tested here, or None when it can."""
    if backend != "npu":
        return "not an NPU"
    try:
        _attention.check_npu_attention()
    except RuntimeError as exc:
        return str(exc)
    return None


def default_dtypes(backend: str) -> tuple[tuple[str, ...], list[str]]:
    """fp32 everywhere; bf16 where the backend reports it (the CPU always runs it, if slowly); fp16
    on every accelerator (MPS included: fp16 there is a known field issue, which is what to watch)."""
    notes: list[str] = []
    dtypes = ["float32"]
    if backend in ("cpu", "tpu") or backends.supports_bf16(backend):  # a TPU's matrix units are bf16
        dtypes.append("bfloat16")
    else:
        notes.append(f"bfloat16 not tested: {backend} reports no bf16 support")
    if backend == "cpu":
        notes.append(
            "float16 not in the CPU's default plan (never the CPU's dtype); --dtype float16 runs it (it did run on torch 2.14)"
        )
    elif backend == "tpu":
        notes.append("float16 not in the TPU's default plan (not native there: bf16 is); --dtype float16 runs it")
    else:
        dtypes.append("float16")
    return tuple(dtypes), notes


def plan(backend: str, dtypes: Sequence[str] | None = None) -> Plan:
    """The dtypes and attention implementations the self-test runs on `backend`."""
    chosen, notes = default_dtypes(backend)
    if dtypes:
        chosen = tuple(str(parse_dtype(d)).removeprefix("torch.") for d in dtypes)
    ops = ["sdpa", "sdpa-math", "vanilla"]
    models = ["sdpa", "vanilla"]
    if backend in ("cuda", "rocm"):
        ops += ["sdpa-flash", "sdpa-efficient"]
    problem = _npu_fused_problem(backend)
    if problem is None:
        ops.append("npu")
        models.append("npu")
    elif backend == "npu":
        notes.append(f"NPU fused attention not tested: {problem}")
    return Plan(backend, chosen, tuple(ops), tuple(models), tuple(notes))


# ---------------------------------------------------------------------------- ops
def _attention_fn(impl: str) -> Callable[..., torch.Tensor]:
    """(q, k, v) -> output for one attention implementation; q/k/v are (batch, heads, tokens, dim)."""
    if impl == "vanilla":
        return _vanilla_attention
    if impl == "npu":
        return _npu_attention
    kernels = {"sdpa-math": "MATH", "sdpa-flash": "FLASH_ATTENTION", "sdpa-efficient": "EFFICIENT_ATTENTION"}

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if impl not in kernels:
            return F.scaled_dot_product_attention(q, k, v)
        from torch.nn.attention import SDPBackend, sdpa_kernel

        with sdpa_kernel(getattr(SDPBackend, kernels[impl])):
            return F.scaled_dot_product_attention(q, k, v)

    return sdpa


def _vanilla_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """diffusers' AttnProcessor (what "vanilla" selects): baddbmm scores, softmax, bmm."""
    b, h, n, d = q.shape
    q3, k3, v3 = (t.reshape(b * h, -1, d) for t in (q, k, v))
    empty = torch.empty(q3.shape[0], q3.shape[1], k3.shape[1], dtype=q.dtype, device=q.device)
    scores = torch.baddbmm(empty, q3, k3.transpose(-1, -2), beta=0, alpha=d**-0.5)
    return torch.bmm(scores.softmax(dim=-1), v3).reshape(b, h, n, d)


def _npu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """torch_npu's fused attention, as diffusers' AttnProcessorNPU calls it (BNSD layout)."""
    torch_npu = importlib.import_module("torch_npu")
    heads, dim = q.shape[1], q.shape[3]
    return torch_npu.npu_fusion_attention(q, k, v, heads, input_layout="BNSD", scale=dim**-0.5, keep_prob=1.0)[0]


def _op_inputs(name: str, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Fixed-seed CPU float32 inputs, shaped like a small diffusion model's tensors."""
    shapes = {
        "matmul": [(128, 256), (256, 128)],
        "conv2d": [(2, 32, 32, 32), (64, 32, 3, 3), (64,)],
        "group_norm": [(2, 64, 32, 32), (64,), (64,)],
        "softmax": [(8, 256, 256)],
        "attention": [(2, 4, 256, 32)] * 3,
    }
    return tuple(torch.randn(shape, generator=gen) for shape in shapes[name])


OPS: dict[str, Callable[..., torch.Tensor]] = {
    "matmul": torch.matmul,
    "conv2d": lambda x, w, b: F.conv2d(x, w * 0.1, b, padding=1),
    "group_norm": lambda x, w, b: F.group_norm(x * 3 + 1, 16, w, b),
    "softmax": lambda x: (x * 4).softmax(dim=-1),
}


@dataclass(frozen=True)
class Case:
    """One row of the self-test: a check, its dtype, and the attention implementation if it has one."""

    check: str
    dtype: str
    attention: str = ""


def op_cases(p: Plan, attention: Sequence[str] | None = None) -> list[Case]:
    """The op rows a plan gives (flash attention has no float32 kernel: left out there)."""
    cases: list[Case] = []
    for dtype in p.dtypes:
        cases += [Case(name, dtype) for name in OPS]
        for impl in attention if attention is not None else p.op_attention:
            if not (impl == "sdpa-flash" and dtype == "float32"):
                cases.append(Case("attention", dtype, impl))
    return cases


def model_cases(p: Plan) -> list[Case]:
    """VAE and denoiser per dtype and attention; one generation per dtype, with the first (the
    policy's sdpa) attention: a whole generation per attention would double the test's time."""
    per_call = [Case(c, dtype, att) for dtype in p.dtypes for att in p.model_attention for c in ("vae", "denoiser")]
    return per_call + [Case("generation", dtype, p.model_attention[0]) for dtype in p.dtypes]


# ---------------------------------------------------------------------------- measuring
def compare(ref: torch.Tensor, out: torch.Tensor, peak: float | None = None) -> dict[str, float]:
    """max/mean absolute error, error relative to the reference's largest magnitude, PSNR over
    `peak` (default: the reference's value range)."""
    ref, out = ref.detach().float().cpu(), out.detach().float().cpu()
    diff = (out - ref).abs()
    if not torch.isfinite(out).all():
        nan = float("nan")
        return {"max_abs": math.inf, "mean_abs": math.inf, "rel": math.inf, "psnr": nan}
    scale = float(ref.abs().max()) or 1.0
    peak = peak if peak is not None else float(ref.max() - ref.min()) or 1.0
    mse = float((diff**2).mean())
    psnr = math.inf if mse == 0 else 10 * math.log10(peak**2 / mse)
    return {
        "max_abs": float(diff.max()),
        "mean_abs": float(diff.mean()),
        "rel": float(diff.max()) / scale,
        "psnr": psnr,
    }


@dataclass
class Row:
    """One line of the precision table (and of its JSON)."""

    check: str
    dtype: str
    attention: str
    max_abs: float | None = None
    mean_abs: float | None = None
    rel: float | None = None
    psnr: float | None = None
    tolerance: str = ""
    status: str = "pass"  # pass | FAIL | error
    detail: str = ""
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return self.status == "pass"

    def failure(self) -> str:
        """What failed and by how much, in one line."""
        where = f"{self.check} {self.dtype}" + (f" ({self.attention})" if self.attention else "")
        return f"{where}: {self.detail or self.status}"


def judge(case: Case, metrics: dict[str, float], backend: str) -> Row:
    """A row from the measures and the tolerance table (the VAE: by PSNR where the table gives one)."""
    tol = tolerance_for(case.dtype, backend)
    bound = tol.model_rel if case.check in MODEL_CHECKS else tol.op_rel
    row = Row(case.check, case.dtype, case.attention, **metrics, tolerance=f"rel <= {bound:g}")
    failed = not row.rel <= bound  # NaN compares False: a NaN output fails
    found = f"rel error {row.rel:.3g}" + (f" > {bound:g}" if failed else "")
    if case.check in PICTURE_CHECKS and tol.vae_psnr is not None:
        row.tolerance = f"PSNR >= {tol.vae_psnr:g} dB"
        failed = not row.psnr >= tol.vae_psnr
        found = f"PSNR {row.psnr:.1f} dB" + (f" < {tol.vae_psnr:g} dB" if failed else "")
    if case.check in PICTURE_CHECKS:  # also in the units a picture is seen in
        found += f"; mean error {row.mean_abs * 255:.2f}/255, max {row.max_abs * 255:.0f}/255 of the picture"
    row.status, row.detail = ("FAIL" if failed else "pass"), found
    return row


def _measure(
    case: Case, backend: str, reference: Callable[[], torch.Tensor], on_device: Callable[[], torch.Tensor], peak=None
) -> Row:
    """Run one case; a device that raises gives an "error" row with the exception's text (logged)."""
    start = time.perf_counter()
    try:
        with torch.no_grad():
            ref = reference()
            out = on_device()
        row = judge(case, compare(ref, out, peak), backend)
    except Exception as exc:  # the device's failure is the result being measured
        log.warning("self-test %s %s %s raised: %s", case.check, case.dtype, case.attention, exc)
        row = Row(case.check, case.dtype, case.attention, status="error", detail=f"{type(exc).__name__}: {exc}")
    row.seconds = time.perf_counter() - start
    return row


def _run_on(backend: str, on_device: Callable[[], torch.Tensor]) -> torch.Tensor:
    """`on_device()`; on a TPU inside torchax's environment (torch ops on `jax` tensors run on JAX only
    there: devices/xla.py), its output brought back to the CPU before the environment closes."""
    if backend != "tpu":
        return on_device()
    from .xla import call_env

    with call_env():
        return on_device().cpu()


def _to(device: torch.device, dtype: torch.dtype, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [t.to(device=device, dtype=dtype) for t in tensors]


def run_op(case: Case, device: torch.device, backend: str) -> Row:
    """One op case: CPU float32 against `device` in the case's dtype."""
    name = "attention" if case.check == "attention" else case.check
    inputs = _op_inputs(name, torch.Generator().manual_seed(SEED))
    dtype = parse_dtype(case.dtype)
    if case.check == "attention":
        fn = _attention_fn(case.attention)
        ref_fn = fn if case.attention in ("sdpa", "sdpa-math", "vanilla") else _attention_fn("sdpa-math")
    else:
        fn = ref_fn = OPS[case.check]
    return _measure(case, backend, lambda: ref_fn(*inputs), lambda: _run_on(backend, lambda: fn(*_to(device, dtype, inputs))))


# ---------------------------------------------------------------------------- models
@dataclass
class Models:
    """The embedded model's VAE and UNet on the CPU in float32, with their fixed inputs."""

    vae: Any
    unet: Any
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)


def load_models(model_dir: str | Path) -> Models:
    """VAE and UNet straight from a diffusers folder (no pipeline, no text encoder: the denoiser
    gets fixed-seed hidden states of the right width)."""
    from diffusers import AutoencoderKL, UNet2DConditionModel

    with ONE_LOAD:  # a pool's re-test runs beside the replicas' own loads
        vae = AutoencoderKL.from_pretrained(str(model_dir), subfolder="vae").eval()
        unet = UNet2DConditionModel.from_pretrained(str(model_dir), subfolder="unet").eval()
    gen = torch.Generator().manual_seed(SEED)
    size = unet.config.sample_size
    size = size[0] if isinstance(size, (list, tuple)) else size
    latents = torch.randn(1, unet.config.in_channels, size, size, generator=gen)
    hidden = torch.randn(1, 8, unet.config.cross_attention_dim, generator=gen)
    vae_latents = torch.randn(1, vae.config.latent_channels, size, size, generator=gen) / vae.config.scaling_factor
    inputs = {"latents": latents, "hidden": hidden, "timestep": torch.tensor([500]), "vae_latents": vae_latents}
    return Models(vae, unet, inputs)


def _prepare(model: torch.nn.Module, device: torch.device, dtype: torch.dtype, attention: str) -> torch.nn.Module:
    """A copy of `model` on the device in `dtype` with `attention` applied."""
    copy_ = copy.deepcopy(model).to(device=device, dtype=dtype)
    _attention.apply_to_module(copy_, attention)
    return copy_


def _model_call(models: Models, check: str, model: torch.nn.Module, device, dtype) -> torch.Tensor:
    x = models.inputs
    if check == "vae":
        image = model.decode(x["vae_latents"].to(device, dtype)).sample
        return (image.float().clamp(-1, 1) / 2 + 0.5).cpu()  # the picture in [0, 1]
    out = model(
        x["latents"].to(device, dtype), x["timestep"].to(device), encoder_hidden_states=x["hidden"].to(device, dtype)
    )
    return out.sample


def _generate(
    model_dir: str | Path, device: torch.device, dtype: torch.dtype, attention: str, backend: str = "cpu"
) -> torch.Tensor:
    """One image of the whole pipeline (as diffusers runs it) with a CPU generator: the picture in [0, 1].
    Read from disk on the CPU, then moved (on a TPU op by op inside torchax's environment: `_run_on`)."""
    from diffusers import DiffusionPipeline

    with ONE_LOAD:
        pipe = DiffusionPipeline.from_pretrained(str(model_dir), dtype=dtype)
    pipe.set_progress_bar_config(disable=True)
    for component in pipe.components.values():
        if isinstance(component, torch.nn.Module) and getattr(component, "attn_processors", None):
            _attention.apply_to_module(component, attention)

    def run() -> torch.Tensor:
        pipe.to(device)
        with _attention.call_context(attention):
            out = pipe(**GENERATION, generator=torch.Generator().manual_seed(SEED), output_type="pt")
        return out.images.float()

    return _run_on(backend, run).cpu()


def run_generation(model_dir: str | Path, case: Case, device: torch.device, backend: str, refs: dict) -> Row:
    """The generation row: the device's picture in the case's dtype against the CPU's in float32."""
    cpu_attention = case.attention if case.attention != "npu" else "sdpa"

    def reference() -> torch.Tensor:
        key = ("generation", cpu_attention)
        if key not in refs:
            refs[key] = _generate(model_dir, torch.device("cpu"), torch.float32, cpu_attention)
        return refs[key]

    def on_device() -> torch.Tensor:
        return _generate(model_dir, device, parse_dtype(case.dtype), case.attention, backend)

    return _measure(case, backend, reference, on_device, peak=1.0)


def run_model(models: Models, case: Case, device: torch.device, backend: str, refs: dict) -> Row:
    """One model case; the CPU float32 reference runs once per (check, attention) and is kept in `refs`."""
    source = models.vae if case.check == "vae" else models.unet
    context = _attention.call_context(case.attention)
    cpu_attention = case.attention if case.attention != "npu" else "sdpa"

    def reference() -> torch.Tensor:
        key = (case.check, cpu_attention)
        if key not in refs:
            with _attention.call_context(cpu_attention):
                ref_model = _prepare(source, torch.device("cpu"), torch.float32, cpu_attention)
                refs[key] = _model_call(models, case.check, ref_model, torch.device("cpu"), torch.float32)
        return refs[key]

    def on_device() -> torch.Tensor:
        dtype = parse_dtype(case.dtype)
        with context:
            return _run_on(
                backend, lambda: _model_call(models, case.check, _prepare(source, device, dtype, case.attention), device, dtype)
            )

    return _measure(case, backend, reference, on_device, peak=1.0 if case.check == "vae" else None)


# ---------------------------------------------------------------------------- the whole test
@dataclass
class Report:
    """What `run` measured: the device, its plan and one row per case."""

    device: str
    backend: str
    plan: Plan
    rows: list[Row]
    model: str | None
    seconds: float = 0.0

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.rows)

    def to_dict(self) -> dict[str, Any]:
        return {
            "device": self.device,
            "backend": self.backend,
            "model": self.model,
            "passed": self.passed,
            "seconds": round(self.seconds, 2),
            "plan": asdict(self.plan),
            "tolerances": {k: asdict(v) for k, v in TOLERANCES.items()},
            "rows": [_json_row(r) for r in self.rows],
        }


def _json_row(row: Row) -> dict[str, Any]:
    """Infinite PSNR (an exact match) as null with exact=true: JSON has no infinity."""
    data = asdict(row)
    data["exact"] = row.max_abs == 0.0
    for key in ("max_abs", "mean_abs", "rel", "psnr"):
        value = data[key]
        if value is not None and not math.isfinite(value):
            data[key] = None
    return data


def run(
    device: torch.device,
    backend: str,
    dtypes: Sequence[str] | None = None,
    model_dir: str | Path | None = DEFAULT_MODEL,
) -> Report:
    """The full self-test on `device`: ops, then (with a model folder) the VAE and denoiser rows."""
    start = time.perf_counter()
    p = plan(backend, dtypes)
    rows = [run_op(case, device, backend) for case in op_cases(p)]
    if model_dir is not None:
        models = load_models(model_dir)
        refs: dict = {}
        for case in model_cases(p):
            if case.check == "generation":
                rows.append(run_generation(model_dir, case, device, backend, refs))
            else:
                rows.append(run_model(models, case, device, backend, refs))
    report = Report(str(device), backend, p, rows, str(model_dir) if model_dir else None)
    report.seconds = time.perf_counter() - start
    return report


def _fmt(value: float | None, spec: str) -> str:
    width = int(spec.split(".")[0])
    if value is None:
        return f"{'-':>{width}}"
    if not math.isfinite(value):
        return f"{value!s:>{width}}"
    return format(value, spec)


def format_plan(p: Plan, device: str) -> str:
    """`test --plan`: the rows a self-test of `device` would have, without touching it."""
    cases = op_cases(p) + model_cases(p)
    lines = [f"Self-test plan for {device} ({p.backend}): {len(cases)} checks against cpu float32"]
    lines.append(f"dtypes: {', '.join(p.dtypes)}")
    lines.append(f"op attention: {', '.join(p.op_attention)}; model attention: {', '.join(p.model_attention)}")
    lines += [f"  {c.check:<10} {c.dtype:<9} {c.attention or '-'}" for c in cases]
    lines += [f"note: {n}" for n in p.notes]
    return "\n".join(lines)


def format_table(report: Report) -> str:
    """The precision table as text: one line per row, failures' reasons after the table."""
    head = f"{'check':<10} {'dtype':<9} {'attention':<15} {'max abs':>9} {'mean abs':>9} {'rel':>9} {'PSNR dB':>8}  {'tolerance':<16} result"
    lines = [f"Self-test of {report.device} ({report.backend}) against cpu float32, seed {SEED}", head, "-" * len(head)]
    for r in report.rows:
        lines.append(
            f"{r.check:<10} {r.dtype:<9} {r.attention or '-':<15} {_fmt(r.max_abs, '9.2e')} {_fmt(r.mean_abs, '9.2e')} "
            f"{_fmt(r.rel, '9.2e')} {_fmt(r.psnr, '8.1f')}  {r.tolerance or '-':<16} {r.status}"
        )
    lines += [f"note: {n}" for n in report.plan.notes]
    lines += [f"{r.status}: {r.failure()}" for r in report.rows if not r.passed]
    verdict = "all checks pass" if report.passed else f"{sum(not r.passed for r in report.rows)} check(s) failed"
    lines.append(f"{verdict} ({report.seconds:.1f} s)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------- the health probe
def _probe_attention(attention: str) -> str:
    """The op-level implementation that a model-level attention type runs (sdpa default for sdpa)."""
    return {"vanilla": "vanilla", "npu": "npu"}.get(attention, "sdpa")


def probe(dm: DeviceManager) -> tuple[bool, str]:
    """Quick health check of dm's device in dm's dtype and attention: the op checks only, no model.

    Never raises for a failing device: its exception, or the first check out of tolerance, is the
    answer (False, text), and is logged. Used by the device pool to tell whether a device recovered.
    """
    start = time.perf_counter()
    p = Plan(dm.backend, (dm.dtype_name,), (), ())
    rows = []
    for case in op_cases(p, attention=[_probe_attention(dm.attention)]):
        context: AbstractContextManager = (
            _attention.call_context(dm.attention) if case.check == "attention" else nullcontext()
        )
        with context:
            rows.append(run_op(case, dm.device, dm.backend))
        if not rows[-1].passed:
            message = rows[-1].failure()
            log.warning("health probe of %s failed: %s", dm.device, message)
            return False, message
    elapsed = time.perf_counter() - start
    return True, f"ok: {len(rows)} checks on {dm.device} {dm.dtype_name} ({dm.attention}) in {elapsed * 1000:.0f} ms"
