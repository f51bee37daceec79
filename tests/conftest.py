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
logging.getLogger("diffusers").setLevel(logging.ERROR)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A tiny random diffusers folder, built once per test session."""
    from tests.tiny_model import save_tiny_pipeline

    return save_tiny_pipeline(tmp_path_factory.mktemp("tiny-sd") / "model")


@pytest.fixture(scope="session")
def family_root(tmp_path_factory):
    """Where the tiny model families (tests/families.py) are built, once per session."""
    return tmp_path_factory.mktemp("families")
