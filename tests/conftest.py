import logging
import os

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


@pytest.fixture(scope="session")
def family_root(tmp_path_factory):
    """Where the tiny model families (tests/families.py) are built, once per session."""
    return tmp_path_factory.mktemp("families")


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """End the process with pytest's exit status once everything is reported, without interpreter
    finalization: a CI run whose 1644 tests all passed then died with a segmentation fault at exit
    (rc 139), in native libraries' teardown (torch, OpenVINO, Ray threads) after every test had ended.
    The tests' own outcome is what the status says; a crash during a test is still a failure."""
    import sys

    status = getattr(config, "_exit_status", None)
    if status is None or os.environ.get("KEEP_FINALIZATION"):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    logging.shutdown()
    os._exit(int(status))


def pytest_sessionfinish(session, exitstatus):
    session.config._exit_status = exitstatus
