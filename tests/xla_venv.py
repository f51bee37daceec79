"""The TPU venv (.venv-tpu) the XLA tests run in: built from requirements-tpu.txt once, reused while the
requirements are the same (a stamp holds their hash and the Python version).

The venv sees the test run's own packages through a `.pth` file (requirements-tpu.txt's `-r
requirements.txt` is exactly that stack, so pip finds it satisfied) and installs what the TPU path
adds, JAX, jaxlib and torchax, into its own site-packages: the main venv never gets them, and the
build costs the JAX wheels, not a second copy of torch and CUDA's wheels. A venv that cannot be built
FAILS the test that needs it (CI must notice), it never skips. Shared by tests/test_xla.py (the
precision check) and tests/test_xla_app.py (the app on the TPU route).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-tpu"
STAMP = VENV / "requirements.sha256"
BUILD_TIMEOUT_S = 1200


def requirements_hash() -> str:
    """What the venv was built from: both files (requirements-tpu.txt includes requirements.txt) and Python."""
    digest = hashlib.sha256(sys.version.encode())
    for name in ("requirements-tpu.txt", "requirements.txt"):
        digest.update((ROOT / name).read_bytes())
    return digest.hexdigest()


def venv_python() -> Path:
    return VENV / "bin" / "python"


def ensure_venv() -> float:
    """Builds .venv-tpu unless a venv from the same requirements is there; seconds spent (0: reused)."""
    wanted = requirements_hash()
    if venv_python().exists() and STAMP.exists() and STAMP.read_text().strip() == wanted:
        return 0.0
    started = time.perf_counter()
    shutil.rmtree(VENV, ignore_errors=True)
    install = [str(venv_python()), "-m", "pip", "install", "--no-compile", "-r", "requirements-tpu.txt"]
    _run_or_fail([sys.executable, "-m", "venv", str(VENV)])
    _share_main_stack()
    _run_or_fail(install)
    STAMP.write_text(wanted + "\n")
    return time.perf_counter() - started


def _run_or_fail(command: list[str]) -> None:
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    if done.returncode != 0:
        pytest.fail(f"building .venv-tpu failed: {' '.join(command)}\n{(done.stdout + done.stderr)[-4000:]}")


def _share_main_stack() -> None:
    """A .pth in the new venv naming this interpreter's site-packages: the app's pinned stack, seen, not copied."""
    purelib = subprocess.run(
        [str(venv_python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "main-stack.pth").write_text("".join(f"{path}\n" for path in sorted(ours)))


def venv_environment(env: dict[str, str]) -> dict[str, str]:
    """`env` for a process in the venv: without PYTHONPATH/PYTHONHOME (the .pth shares the stack) or XLA_FLAGS
    (the processes set their own), and with JAX's CPU backend and its compile cache in the venv."""
    clean = {k: v for k, v in env.items() if k not in ("PYTHONPATH", "XLA_FLAGS", "PYTHONHOME")}
    return {**clean, "JAX_PLATFORMS": "cpu", **compile_cache_environment()}


def compile_cache_environment() -> dict[str, str]:
    """JAX's persistent compile cache in the venv, every program cached (as devices.xla.enable_compile_cache
    sets it; JAX reads these variables when it starts): a rerun on a kept venv skips XLA's compile."""
    return {
        "JAX_COMPILATION_CACHE_DIR": str(VENV / "jax-cache"),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }
