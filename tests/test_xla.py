"""The TPU path (issue 45) on XLA's CPU devices, in its own venv: JAX and torchax never enter the main one.

The module fixture builds `.venv-tpu` from requirements-tpu.txt (once, tests/xla_venv.py), then runs
`python -m devices.xla_check --dtype float32,bfloat16 --devices 2` in it: each dtype on 1 device and
on a 2-device mesh (XLA_FLAGS=--xla_force_host_platform_device_count=2, which the check sets, with
PJRT_NPROC: see devices.xla.host_threads). One process: the imports (~25 s here) are paid once.

The main venv never gets JAX (the last test checks). A venv that cannot be built FAILS the tests
(CI must notice), it never skips them. The added wall
time (build + check) is printed and saved in test-artifacts/xla-check.json; JAX's compile cache
lives in .venv-tpu/jax-cache, so a rerun on a kept venv skips XLA's compile.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.xla_venv import ensure_venv, venv_environment, venv_python

# The first test pays the fixture (venv build + check: ~5-6 min here, more on a loaded machine);
# pyproject's 600 s per test would cut it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(2400)]

ROOT = Path(__file__).resolve().parent.parent
ARTIFACT = ROOT / "test-artifacts" / "xla-check.json"
CHECK_TIMEOUT_S = 900


CHECKS = (("float32,bfloat16", 2),)  # (dtypes, devices) per process


def run_check(out: Path, dtype: str, devices: int) -> tuple[subprocess.CompletedProcess, float]:
    env = venv_environment(dict(os.environ))
    command = [str(venv_python()), "-m", "devices.xla_check", "--dtype", dtype, "--devices", str(devices)]
    started = time.perf_counter()
    done = subprocess.run(
        [*command, "--json-out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S
    )
    return done, time.perf_counter() - started


@pytest.fixture(scope="module")
def xla_report(request, tmp_path_factory) -> dict:
    """Both checks' rows in one report, after building the venv if needed; the wall times are printed
    and saved (test-artifacts/xla-check.json)."""
    build_s = ensure_venv()
    report: dict = {"rows": [], "passed": True, "wall": {"venv_build_s": round(build_s, 1)}, "stdout_table": []}
    for dtype, devices in CHECKS:
        out = tmp_path_factory.mktemp("xla") / f"xla-{dtype.replace(',', '-')}.json"
        done, check_s = run_check(out, dtype, devices)
        if not out.exists():
            pytest.fail(
                f"devices.xla_check --dtype {dtype} --devices {devices} wrote no report (exit {done.returncode}):\n"
                f"{(done.stdout + done.stderr)[-6000:]}"
            )
        part = json.loads(out.read_text())
        report["rows"] += part["rows"]
        report["passed"] &= part["passed"] and done.returncode == 0
        report["wall"][f"{dtype}_check_s"] = round(check_s, 1)
        report["stdout_table"] += [line for line in done.stdout.splitlines() if line.startswith("|")]
    ARTIFACT.parent.mkdir(parents=True, exist_ok=True)
    ARTIFACT.write_text(json.dumps(report, indent=2) + "\n")
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"\nXLA check: {report['wall']} (venv build 0 = reused)")
        for line in report["stdout_table"]:
            reporter.write_line(line)
    return report


def find_row(report: dict, dtype: str, devices: int, reference: str) -> dict:
    rows = [r for r in report["rows"] if (r["dtype"], r["devices"], r["reference"]) == (dtype, devices, reference)]
    assert len(rows) == 1, f"no single row {dtype} x {devices} vs {reference} in {report['rows']}"
    return rows[0]


def test_the_check_passes_as_a_whole(xla_report):
    assert xla_report["passed"], xla_report["stdout_table"]


def test_fp32_on_one_xla_device_gives_the_cpu_images(xla_report):
    row = find_row(xla_report, "float32", 1, "cpu float32")
    assert row["max_abs"] <= 2.0 and row["passed"]
    assert row["first_call_s"] > 0 and row["cached_call_s"] > 0


def test_fp32_on_a_two_device_mesh_gives_the_one_device_images(xla_report):
    assert find_row(xla_report, "float32", 2, "cpu float32")["max_abs"] <= 2.0
    mesh = find_row(xla_report, "float32", 2, "xla 1 device")
    # float images: only XLA's partitioned summation order may differ, so a saved value flips by 1/255 at most
    # where it sits on a rounding boundary (one of 24,576 with the fine-tuned tiny-shapes)
    assert mesh["passed"] and mesh["max_abs"] < 0.01 and mesh["pct_pixels_differing"] < 0.1


def test_bf16_is_judged_against_cpu_bf16_and_reported_against_fp32(xla_report):
    row = find_row(xla_report, "bfloat16", 1, "cpu bfloat16")
    assert row["passed"] and row["max_abs"] <= row["threshold_max"] and row["mean_abs"] <= row["threshold_mean"]
    assert find_row(xla_report, "bfloat16", 1, "cpu float32")["threshold_max"] is None  # reported, not judged
    find_row(xla_report, "bfloat16", 0, "cpu float32")  # CPU torch's own bf16 cost, for scale
    mesh = find_row(xla_report, "bfloat16", 2, "xla 1 device")  # a partitioned bf16 program rounds differently
    assert mesh["passed"] and mesh["max_abs"] <= mesh["threshold_max"]


def test_the_main_venv_never_imports_jax():
    """`import devices` (and devices.xla itself) must not import JAX, and the main venv must not have it:
    the probe the DeviceManager calls answers "not installed" there."""
    code = (
        "import importlib.util, sys, devices, devices.xla as x; "
        "print('imports jax' if 'jax' in sys.modules else 'clean'); "
        "print('has jax' if importlib.util.find_spec('jax') else x.jax_devices_summary())"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.strip().splitlines()[-2:]
    assert first == "clean"
    assert second != "has jax", "the main venv has jax: it belongs in .venv-tpu only (requirements-tpu.txt)"
    assert "jax/torchax are not installed" in second
