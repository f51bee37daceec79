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


@pytest.fixture(autouse=True)
def torch_runtime(request, monkeypatch):
    """RUNTIME=auto means torch in tests (openvino "not installed") unless the test is marked `openvino`."""
    if request.node.get_closest_marker("openvino") is None:
        monkeypatch.setattr("devices.runtime.openvino_installed", lambda: False)


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
