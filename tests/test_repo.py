"""Repository conventions a fresh clone depends on."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", text.split("## Using it")[0], re.S)]


def test_readme_has_exactly_two_setup_commands():
    commands = readme_commands()
    assert len(commands) == 2, commands
    assert commands[0].endswith("python app.py") and "requirements.txt" in commands[0]
    assert commands[1].endswith("python -m pytest") and "requirements-dev.txt" in commands[1]


def test_ci_runs_the_readme_test_command_verbatim():
    ci = (ROOT / ".ci" / "run").read_text()
    assert readme_commands()[1] in ci.splitlines()
    assert "set -euo pipefail" in ci  # pytest's exit code 5 (nothing collected) fails CI


def test_torch_is_pinned_and_layers_stack():
    base = (ROOT / "requirements.txt").read_text().splitlines()
    assert "torch==2.14.1" in base and "torchvision==0.29.1" in base  # a pair: torchvision needs its torch
    for extra in ("requirements-cuda.txt", "requirements-dev.txt"):
        assert "-r requirements.txt" in (ROOT / extra).read_text().splitlines(), extra
    npu = (ROOT / "requirements-npu.txt").read_text().splitlines()
    assert "-r requirements-common.txt" in npu and "-r requirements-common.txt" in base
    # torch-npu X.Y.Z requires torch==X.Y.Z.*: the NPU file pins that torch, not the base one
    assert "torch-npu==2.14.0" in npu and "torch==2.14.0" in npu and "torchvision==0.29.0" in npu
