"""`python -m devices` verbs: test, optimize --apply, set, the old form; the self-test's plan on
simulated backends; the health probe and the precision table failing when an op is broken; the
optimizer's choice."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from config.settings_file import read_file
from devices import DeviceManager, selftest, speed
from devices.compile import COMPILE_MODES
from devices.options import DeviceSettings
from tests import fakes
from tests.test_settings import app_log

ROOT = Path(__file__).resolve().parents[1]


def _env(tmp: Path) -> dict[str, str]:
    env = {
        k: v for k, v in os.environ.items() if k not in ("PREFERRED_DEVICE", "TORCH_DTYPE", "DIFFUSERS_ATTENTION_TYPE")
    }
    env.update(SETTINGS_FILE=str(tmp / "s.json"), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", XDG_CACHE_HOME=str(tmp))
    return env


def devices_cli(tmp: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "devices", *args],
        cwd=ROOT,
        env=_env(tmp),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# ---------------------------------------------------------------- through the command line
@pytest.fixture(scope="module")
def cpu_test_run(tmp_path_factory):
    """One `python -m devices test cpu` for every assertion about it."""
    tmp = tmp_path_factory.mktemp("selftest")
    proc = devices_cli(tmp, "test", "cpu", "--json-out", str(tmp / "t.json"))
    return proc, json.loads((tmp / "t.json").read_text())


def test_cpu_selftest_passes_fp32_exactly_and_reports_bf16_psnr(cpu_test_run):
    proc, data = cpu_test_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PSNR" in proc.stdout and "all checks pass" in proc.stdout
    rows = data["rows"]
    checks = {r["check"] for r in rows}
    assert {"matmul", "conv2d", "group_norm", "softmax", "attention", "vae", "denoiser"} <= checks
    assert {r["attention"] for r in rows if r["check"] == "attention"} == {"sdpa", "sdpa-math", "vanilla"}
    fp32 = [r for r in rows if r["dtype"] == "float32"]
    assert fp32 and all(r["max_abs"] <= 1e-6 and r["status"] == "pass" for r in fp32)
    bf16_models = [r for r in rows if r["dtype"] == "bfloat16" and r["check"] in ("vae", "denoiser")]
    assert len(bf16_models) == 4  # vae and denoiser x sdpa and vanilla
    for row in bf16_models:
        assert row["psnr"] is not None and 20 < row["psnr"] < 120, row  # a real, finite figure
        assert row["max_abs"] > 0  # bf16 is not exact: the table must not pretend it is
    generation = {r["dtype"]: r for r in rows if r["check"] == "generation"}
    assert generation["float32"]["exact"] and generation["float32"]["status"] == "pass"
    bf16 = generation["bfloat16"]  # the whole picture: its PSNR and errors in /255 are printed
    assert bf16["max_abs"] > 0 and 20 < bf16["psnr"] < 120 and "/255" in bf16["detail"]


def test_optimize_apply_writes_the_choice_and_the_app_starts_with_it(tmp_path, monkeypatch):
    proc = devices_cli(tmp_path, "optimize", "cpu", "--dtype", "float32", "--duration", "0.2", "--apply")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    written = read_file(tmp_path / "s.json")
    assert written["TORCH_DTYPE"] == "float32"
    assert written["DIFFUSERS_ATTENTION_TYPE"] in ("sdpa", "vanilla")
    assert written["COMPILE"] == "off" and written["COMPILE"] in COMPILE_MODES  # CPU: compile only with --compile
    assert "chosen float32/" in proc.stdout
    settings = DeviceSettings.from_env(written)  # values the variables accept
    assert settings.dtype == torch.float32
    import app  # python app.py's own reader of the settings, and its start log

    monkeypatch.setenv("SETTINGS_FILE", str(tmp_path / "s.json"))
    for name in ("TORCH_DTYPE", "DIFFUSERS_ATTENTION_TYPE", "COMPILE"):
        monkeypatch.delenv(name, raising=False)
    with app_log() as records:
        started, _ = app.check_settings([])
    assert started.devices.dtype == torch.float32 and started.pipeline.compile == "off"
    assert started.devices.attention == written["DIFFUSERS_ATTENTION_TYPE"]
    assert any(f"COMPILE=off (settings file {tmp_path / 's.json'})" in r.getMessage() for r in records)


def test_set_writes_preferred_device_and_refuses_gpu(tmp_path):
    proc = devices_cli(tmp_path, "set", "CPU")
    assert proc.returncode == 0, proc.stderr
    assert read_file(tmp_path / "s.json") == {"PREFERRED_DEVICE": "cpu"}
    assert str(tmp_path / "s.json") in proc.stdout
    bad = devices_cli(tmp_path, "set", "gpu")
    assert bad.returncode == 2
    assert bad.stderr.strip().count("\n") == 0 and "gpu" in bad.stderr and "cuda" in bad.stderr
    assert read_file(tmp_path / "s.json") == {"PREFERRED_DEVICE": "cpu"}  # unchanged


def test_old_form_is_info(monkeypatch, capsys, tmp_path):
    from devices.__main__ import main

    fakes.no_accelerators(monkeypatch)
    monkeypatch.setenv("SETTINGS_FILE", str(tmp_path / "none.json"))
    assert main(["--device", "cpu", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["backend"] == "cpu"
    assert main(["info", "--device", "cpu"]) == 0
    assert "Device:" in capsys.readouterr().out
    assert main(["test", "cuda"]) == 2  # strict: no self-test of a fallback device
    assert "not usable" in capsys.readouterr().err


# ---------------------------------------------------------------- the probe and a broken device
@pytest.fixture
def cpu(monkeypatch):
    fakes.no_accelerators(monkeypatch)


def test_probe_passes_on_a_sound_device(cpu):
    dm = DeviceManager("cpu")
    ok, text = selftest.probe(dm)
    assert ok and text.startswith("ok:")
    assert selftest.probe(DeviceManager("cpu", dtype="bfloat16", attention="vanilla"))[0]


def _wrong_off_fp32(op):
    """`op`, returning wrong values when it runs in a reduced dtype (the "device" side of the check)."""

    def broken(*args):
        out = op(*args)
        return out if args[0].dtype == torch.float32 else out * 1.5

    return broken


def test_broken_softmax_fails_probe_and_table(cpu, monkeypatch):
    monkeypatch.setitem(selftest.OPS, "softmax", _wrong_off_fp32(selftest.OPS["softmax"]))
    ok, text = selftest.probe(DeviceManager("cpu", dtype="bfloat16"))
    assert not ok and text.startswith("softmax bfloat16") and "rel error" in text
    report = selftest.run(torch.device("cpu"), "cpu", dtypes=["bfloat16"], model_dir=None)
    failed = [r for r in report.rows if not r.passed]
    assert [r.check for r in failed] == ["softmax"] and failed[0].status == "FAIL"
    assert not report.passed and "1 check(s) failed" in selftest.format_table(report)


def test_raising_device_is_an_answer_not_an_exception(cpu, monkeypatch):
    def raising(*args):
        if args[0].dtype != torch.float32:
            raise RuntimeError("ACL error 507015: device lost")
        return torch.nn.functional.group_norm(*args[:1], 16, *args[1:])

    monkeypatch.setitem(selftest.OPS, "group_norm", raising)
    ok, text = selftest.probe(DeviceManager("cpu", dtype="bfloat16"))
    assert not ok and "group_norm" in text and "device lost" in text


def test_nan_output_fails():
    case = selftest.Case("matmul", "float16")
    row = selftest.judge(case, selftest.compare(torch.ones(4), torch.tensor([1.0, float("nan"), 1.0, 1.0])), "cuda")
    assert row.status == "FAIL"


def test_vae_row_judged_by_psnr():
    ref = torch.full((1, 3, 8, 8), 0.5)
    noisy = ref + 0.05 * torch.randn(ref.shape, generator=torch.Generator().manual_seed(0))  # ~26 dB
    row = selftest.judge(selftest.Case("vae", "bfloat16", "sdpa"), selftest.compare(ref, noisy, peak=1.0), "cpu")
    assert row.status == "FAIL" and "PSNR" in row.detail and row.psnr < 30
    assert "/255" in row.detail


# ---------------------------------------------------------------- the plan on simulated backends
def _plan(backend):
    return selftest.plan(backend)


def test_plan_cpu(cpu):
    p = _plan("cpu")
    assert p.dtypes == ("float32", "bfloat16")
    assert p.op_attention == ("sdpa", "sdpa-math", "vanilla") and p.model_attention == ("sdpa", "vanilla")
    assert any("float16" in n for n in p.notes)
    assert selftest.plan("cpu", ["fp16"]).dtypes == ("float16",)


@pytest.mark.parametrize("bf16", [True, False])
def test_plan_cuda(cpu, monkeypatch, bf16):
    fakes.fake_cuda(monkeypatch, bf16=bf16)
    p = _plan("cuda")
    assert p.dtypes == (("float32", "bfloat16", "float16") if bf16 else ("float32", "float16"))
    assert {"sdpa", "sdpa-math", "vanilla", "sdpa-flash", "sdpa-efficient"} == set(p.op_attention)
    assert "npu" not in p.model_attention
    cases = selftest.op_cases(p)
    assert selftest.Case("attention", "float32", "sdpa-flash") not in cases  # flash has no fp32 kernel
    assert selftest.Case("attention", "float16", "sdpa-flash") in cases


def test_plan_npu(cpu, monkeypatch):
    fakes.fake_npu(monkeypatch, bf16=True)
    without = _plan("npu")  # a torch_npu without npu_fusion_attention
    assert "npu" not in without.op_attention and any("fused attention" in n for n in without.notes)
    monkeypatch.setattr(sys.modules["torch_npu"], "npu_fusion_attention", lambda *a, **k: None, raising=False)
    p = _plan("npu")
    assert p.dtypes == ("float32", "bfloat16", "float16")
    assert "npu" in p.op_attention and "npu" in p.model_attention
    assert "sdpa-flash" not in p.op_attention


def test_plan_npu_fp16_only_chip(cpu, monkeypatch):
    fakes.fake_npu(monkeypatch, bf16=False, name="Ascend310P")
    assert _plan("npu").dtypes == ("float32", "float16")


def test_plan_mps_and_xpu(cpu, monkeypatch):
    fakes.fake_mps(monkeypatch)
    assert _plan("mps").dtypes == ("float32", "float16")
    assert _plan("mps").op_attention == ("sdpa", "sdpa-math", "vanilla")
    fakes.fake_xpu(monkeypatch)
    assert _plan("xpu").dtypes == ("float32", "bfloat16", "float16")


def test_benchmark_cells_follow_compile_policy(cpu, monkeypatch):
    cpu_cells = speed.cells("cpu", None, compile_asked=False)
    assert {c.compile for c in cpu_cells} == {False} and len(cpu_cells) == 2 * 2 * 2
    assert {c.compile for c in speed.cells("cpu", None, compile_asked=True)} == {False, True}
    fakes.fake_cuda(monkeypatch)
    assert {c.compile for c in speed.cells("cuda", None, compile_asked=False)} == {False, True}


# ---------------------------------------------------------------- the optimizer's choice
def _row(check, dtype, attention="", status="pass", detail=""):
    return {"check": check, "dtype": dtype, "attention": attention, "status": status, "detail": detail, "tolerance": ""}


def _cell(dtype, attention, it_s, compile=False, batch=1):
    return {"dtype": dtype, "attention": attention, "compile": compile, "batch": batch, "it_s": it_s, "error": ""}


def test_choose_skips_the_faster_setting_that_fails():
    rows = [
        _row("matmul", "float32"),
        _row("vae", "float32", "sdpa"),
        _row("vae", "bfloat16", "sdpa", "FAIL", "PSNR 28.1 dB < 30 dB"),
        _row("vae", "bfloat16", "vanilla", "FAIL", "PSNR 28.0 dB < 30 dB"),
        _row("attention", "float32", "vanilla", "FAIL", "rel error 0.5 > 1e-06"),
    ]
    bench = [
        _cell("bfloat16", "sdpa", 13.0),
        _cell("float32", "sdpa", 10.0),
        _cell("float32", "vanilla", 11.0),
        _cell("float32", "sdpa", 40.0, batch=4),
    ]
    choice = speed.choose(rows, bench)
    assert choice.settings == {"TORCH_DTYPE": "float32", "DIFFUSERS_ATTENTION_TYPE": "sdpa", "COMPILE": "off"}
    text = "\n".join(choice.reasons)
    assert "bfloat16/sdpa/compile off is 1.30x faster but fails vae (sdpa): PSNR 28.1 dB" in text
    assert "float32/vanilla/compile off is 1.10x faster but fails attention (vanilla)" in text
    assert choice.reasons[-1].startswith("chosen float32/sdpa/compile off: 10.00 it/s at batch 1")


def test_a_failed_generation_rules_out_its_dtype_with_every_attention():
    rows = [_row("generation", "bfloat16", "sdpa", "FAIL", "PSNR 21.0 dB < 30 dB"), _row("vae", "float32", "sdpa")]
    bench = [_cell("bfloat16", "vanilla", 30.0), _cell("bfloat16", "sdpa", 20.0), _cell("float32", "sdpa", 10.0)]
    choice = speed.choose(rows, bench)
    assert choice.settings["TORCH_DTYPE"] == "float32"
    assert "bfloat16/vanilla/compile off is 3.00x faster but fails generation (sdpa): PSNR 21.0 dB" in "\n".join(
        choice.reasons
    )


def test_choose_takes_compile_and_reports_nothing_passing():
    rows = [_row("vae", "float32", "sdpa")]
    assert (
        speed.choose(rows, [_cell("float32", "sdpa", 1.0), _cell("float32", "sdpa", 2.0, compile=True)]).settings[
            "COMPILE"
        ]
        == "on"
    )
    bad = [_row("softmax", "float32", status="error", detail="RuntimeError: boom")]
    choice = speed.choose(bad, [_cell("float32", "sdpa", 1.0)])
    assert choice.settings == {} and "nothing to apply" in choice.reasons[-1] and "boom" in choice.reasons[0]


def test_json_row_has_no_infinity():
    row = selftest.Row("matmul", "float32", "", 0.0, 0.0, 0.0, math.inf)
    data = selftest._json_row(row)
    assert data["psnr"] is None and data["exact"] is True
    json.dumps(data, allow_nan=False)


# ---------------------------------------------------------------- the command line on simulated machines
def sim_cli(backend: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m devices ARGS` with the accelerator faked at torch's level (tests/sim_devices.py)."""
    env = {**_env(Path("/nonexistent")), "SETTINGS_FILE": ""}
    return subprocess.run(
        [sys.executable, "-m", "tests.sim_devices", backend, *args], cwd=ROOT, env=env, capture_output=True,
        text=True, timeout=240,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("backend", "device", "dtypes", "attention"),
    [
        ("cuda", "cuda:0 (cuda, NVIDIA H100", "float32, bfloat16, float16", "sdpa, sdpa-math, vanilla, sdpa-flash, sdpa-efficient"),
        ("rocm", "cuda:0 (rocm, AMD Instinct MI300X", "float32, bfloat16, float16", "sdpa, sdpa-math, vanilla, sdpa-flash, sdpa-efficient"),
        ("npu-fused", "npu:0 (npu, Ascend910B3", "float32, bfloat16, float16", "sdpa, sdpa-math, vanilla, npu"),
        ("xpu", "xpu:0 (xpu, Intel Arc A770", "float32, bfloat16, float16", "sdpa, sdpa-math, vanilla"),
        ("mps", "mps (mps, Apple MPS", "float32, float16", "sdpa, sdpa-math, vanilla"),
    ],
)  # fmt: skip
def test_info_and_the_test_plan_on_each_simulated_accelerator(backend, device, dtypes, attention):
    run = sim_cli(backend, "info", "+", "test", "--plan")
    assert run.returncode == 0, run.stderr
    info, planned = run.stdout.split("=" * 8 + "\n")[:2]
    assert f"Device:    {device}" in info
    assert f"dtypes: {dtypes}\n" in planned and f"op attention: {attention};" in planned
    assert "generation" in planned and "vae" in planned and "denoiser" in planned


def test_vulkan_is_in_the_report_and_testable_when_asked_for():
    run = sim_cli("vulkan", "info", "+", "test", "vulkan", "--plan")
    assert run.returncode == 0, run.stderr
    info, planned = run.stdout.split("=" * 8 + "\n")[:2]
    assert "Device:    cpu" in info  # never chosen by itself
    assert "  vulkan yes  Vulkan available (experimental" in info
    assert "Self-test plan for vulkan (vulkan)" in planned and "dtypes: float32, float16" in planned
