"""A crash fails the run: in a test, and at interpreter exit after every test passed.

Each test runs pytest in a subprocess on a small generated test file with a copy of this project's
tests/conftest.py beside it, so its hooks apply as in the real suite: what a hook there does at exit (it
once ended the process with os._exit, which turned a crash at exit into a passing run) is checked here.
That the copy is really used is checked too: the generated tests use one of its fixtures, and the run's
output shows its session end waiting for a thread a test left running. Each run imports torch (the
conftest does), a few seconds.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

CONFTEST_APPLIES = """
import atexit
import concurrent.futures
import ctypes
import os
import threading
import time


POOL = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="idle-pool")  # kept: its worker stays


def crash():
    ctypes.string_at(0)  # reads address 0: a segmentation fault, as in native code


def test_the_projects_conftest_applies(openvino_cache):  # a fixture tests/conftest.py defines
    assert os.environ["RUNTIME"] == "torch"  # set when the conftest is imported
    # a non-daemon thread still running when the tests end: the conftest's session end names it and waits
    threading.Thread(target=time.sleep, args=(1,), name="left-by-a-test").start()
    # an idle pool worker, also non-daemon, is not waited for: the interpreter's exit shuts its pool down
    POOL.submit(int).result()
"""

PASSES = """
def test_passes():
    assert True
"""

CRASHES = """
def test_crashes():
    crash()


def test_after_the_crash():
    pass
"""

CRASH_AT_EXIT = {
    "segfault": ("atexit.register(crash)\n", signal.SIGSEGV, "Segmentation fault"),
    "abort": ("atexit.register(os.abort)\n", signal.SIGABRT, "Aborted"),
}


def run_session(tmp_path: Path, tests: str) -> subprocess.CompletedProcess:
    """pytest in a subprocess on `tests`, with this project's conftest beside them and the repository
    importable (the conftest's fixtures import from it); faulthandler on, as .ci/run sets it."""
    shutil.copy(ROOT / "tests" / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: this project's pytest settings stay out
    (tmp_path / "test_session.py").write_text(CONFTEST_APPLIES + tests)
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    env["PYTHONFAULTHANDLER"] = "1"
    command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", f"--basetemp={tmp_path / 'tmp'}", "-v"]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)


def output(result: subprocess.CompletedProcess) -> str:
    return f"rc {result.returncode}\n--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}"


def test_a_passing_session_exits_0_after_the_conftests_session_end(tmp_path):
    result = run_session(tmp_path, PASSES)
    assert result.returncode == 0, output(result)
    assert "2 passed" in result.stdout, output(result)
    assert "session end: waiting for non-daemon thread 'left-by-a-test'" in result.stdout, output(result)
    assert "idle-pool" not in result.stdout, output(result)


def test_a_crash_in_a_test_fails_the_run(tmp_path):
    result = run_session(tmp_path, CRASHES)
    assert result.returncode == -signal.SIGSEGV, output(result)
    assert "test_the_projects_conftest_applies PASSED" in result.stdout, output(result)
    assert "Fatal Python error: Segmentation fault" in result.stderr, output(result)
    assert "in test_crashes" in result.stderr, output(result)  # faulthandler's stack names the test


@pytest.mark.parametrize("kind", list(CRASH_AT_EXIT))
def test_a_crash_at_exit_after_every_test_passed_fails_the_run(tmp_path, kind):
    """What os._exit in the conftest's pytest_unconfigure hid: rc 0 although the process crashed."""
    register, signum, message = CRASH_AT_EXIT[kind]
    result = run_session(tmp_path, PASSES + register)
    assert "2 passed" in result.stdout, output(result)
    assert "session end: waiting for non-daemon thread 'left-by-a-test'" in result.stdout, output(result)
    assert result.returncode == -signum, output(result)
    assert f"Fatal Python error: {message}" in result.stderr, output(result)  # with the stack, for the log


RAY_LEFT_RUNNING = """
def test_leaves_ray_running():
    import ray

    ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False, object_store_memory=80 * 2**20)
"""


@pytest.mark.slow  # starts a local Ray instance (~12 s here)
def test_ray_left_running_is_shut_down_at_the_session_end(ray_turn, tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-ray.txt")
    monkeypatch.setenv("RAY_USAGE_STATS_ENABLED", "0")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    result = run_session(tmp_path, RAY_LEFT_RUNNING)
    assert "session end: Ray was still initialized, shutting it down" in result.stdout, output(result)
    assert result.returncode == 0, output(result)
