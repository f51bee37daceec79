import gc
import logging
import os
import sys
import threading
import time
import traceback

import pytest
import torch
import torch._dynamo

# One thread: on a shared 2-core CI machine more threads run slower, not faster.
torch.set_num_threads(int(os.environ.get("TEST_TORCH_THREADS", "1")))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# No user settings file (~/.config/diffusion-anywhere/settings.json) under the tests: a test that
# wants one names its own (docs/settings.md#the-settings-file).
os.environ["SETTINGS_FILE"] = ""
# torch runs the networks unless a test asks for OpenVINO (marker `openvino`): with requirements-openvino.txt
# installed, RUNTIME=auto would convert every CPU model at load (~35 s each). Child processes (python app.py)
# read this; in-process loads see openvino as absent (the `torch_runtime` fixture below).
os.environ["RUNTIME"] = "torch"
logging.getLogger("diffusers").setLevel(logging.ERROR)


OPENVINO_ALLOWED = pytest.StashKey[bool]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture of the test is set up (a module-scoped pipeline too): whether it may see openvino."""
    item.config.stash[OPENVINO_ALLOWED] = item.get_closest_marker("openvino") is not None


@pytest.fixture(scope="session", autouse=True)
def torch_runtime(pytestconfig):
    """RUNTIME=auto means torch in tests (openvino "not installed") unless the test being set up is marked
    `openvino`: decided per test before its fixtures, so another module's module-scoped pipeline, built
    with the default RUNTIME=auto, is torch too."""
    from devices import runtime

    installed = runtime.openvino_installed
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(
            runtime, "openvino_installed", lambda: pytestconfig.stash.get(OPENVINO_ALLOWED, False) and installed()
        )
        yield


@pytest.fixture(scope="session")
def openvino_cache(tmp_path_factory):
    """One OPENVINO_CACHE per test session: the embedded model converts once, later loads read it."""
    return tmp_path_factory.mktemp("openvino-cache")


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random diffusers folder, built once per test session."""
    from tests.tiny_model import save_tiny_pipeline

    return save_tiny_pipeline(tmp_path_factory.mktemp("tiny-sd") / "model")


@pytest.fixture(scope="module")
def ray_turn(tmp_path_factory):
    """One Ray cluster on this machine at a time. The suite runs in pytest-xdist's workers (pyproject's
    addopts), which share the machine: two local clusters at once would share its 2 cores and its shared
    memory, and each module's timings would be the other's. The lock file sits in the run's base folder,
    which every worker of the run shares (without xdist: one process, the lock is always free)."""
    from filelock import FileLock

    with FileLock(str(tmp_path_factory.getbasetemp().parent / "ray.lock")):
        yield


@pytest.fixture(scope="session")
def family_root(tmp_path_factory):
    """Where the tiny model families (tests/families.py) are built, once per session."""
    return tmp_path_factory.mktemp("families")


# The end of a session. A CI run whose 1644 tests had all passed once died at interpreter exit with a
# segmentation fault (rc 139), in native libraries' teardown (torch, OpenVINO, Ray's threads); it did not
# repeat and its cause was not found. The process ends normally (no os._exit), so a crash or hang at exit
# fails the run (tests/test_crashes.py checks that with this file), and .ci/run sets PYTHONFAULTHANDLER=1
# so that such a crash prints every thread's Python stack. What the tests leave behind is released below,
# while the interpreter is still whole, instead of in the middle of its finalization.

THREADS_AT_START = pytest.StashKey[set]()
THREAD_WAIT_S = 60.0  # for all of the tests' leftover non-daemon threads together


def pytest_sessionstart(session):
    """The threads that ran before any test (pytest's, the imports'): the others are the tests'."""
    session.config.stash[THREADS_AT_START] = set(threading.enumerate())


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session):
    """After pytest's own teardown of what the last test left (trylast), before the summary. Nothing here
    swallows an exception: one fails the run with its traceback."""
    say = _terminal_line(session.config)
    # Ray: a connected driver has threads in Ray's native client code (GCS, raylet, log monitor) that
    # interpreter exit would stop wherever they are; Ray's own atexit shutdown then runs with modules
    # half torn down. The Ray fixtures (tests/test_ray*.py) shut it down; this is for a test that started
    # Ray and did not. Only if a test imported ray: importing it here costs seconds and starts nothing.
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        say("session end: Ray was still initialized, shutting it down")
        ray.shutdown()
    # OpenVINO needs no step of its own: its Core and compiled models belong to OpenVinoRuntime objects
    # (pipelines/weights/openvino.py) inside pipelines; no module keeps one (tests/test_openvino.py's are
    # module-scoped fixtures, released at its end). What reference cycles still hold (pipelines, torch
    # modules, OpenVINO models) is freed here, its destructors run with every module importable.
    gc.collect()
    # Non-daemon threads: the interpreter waits for each before finalizing, so one left running hangs
    # the run at exit. Named here (the last thing the log says if it hangs) and waited for, bounded.
    # Not concurrent.futures' pool workers: their executors are shut down by the interpreter's exit
    # itself (concurrent.futures registers that with threading._register_atexit), which ends idle
    # workers; their registries are private, so a Python without them only makes this wait for them.
    started = session.config.stash.get(THREADS_AT_START, set())
    pooled = set()
    for module, registry in (
        ("concurrent.futures.thread", "_threads_queues"),
        ("concurrent.futures.process", "_threads_wakeups"),
    ):
        pooled.update(getattr(sys.modules.get(module), registry, {}).keys())
    left = [
        t
        for t in threading.enumerate()
        if not t.daemon and t not in started and t not in pooled and t is not threading.current_thread()
    ]
    deadline = time.monotonic() + THREAD_WAIT_S
    for thread in left:
        say(f"session end: waiting for non-daemon thread {thread.name!r}, started by a test")
        thread.join(max(0.0, deadline - time.monotonic()))
    frames = sys._current_frames()
    for thread in (t for t in left if t.is_alive()):
        stack = "".join(traceback.format_stack(frames[thread.ident])) if thread.ident in frames else ""
        say(
            f"session end: thread {thread.name!r} still runs after {THREAD_WAIT_S:.0f} s; exit waits for it, at:\n{stack}"
        )


def _terminal_line(config):
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is None:
        return lambda line: print(line, file=sys.stderr, flush=True)

    def say(line):
        if reporter._tw.width_of_current_line:  # after `-q`'s progress ("....  [100%]")
            reporter._tw.line()
        reporter.write_line(line, yellow=True)

    return say
