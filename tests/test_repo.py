"""Repository conventions a fresh clone depends on."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def requirement_lines(name: str) -> list[str]:
    """The requirement lines of a requirements file, without comments (whole-line or trailing)."""
    lines = (line.split(" #")[0].strip() for line in (ROOT / name).read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


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
    assert "-r requirements.txt" in (ROOT / "requirements-ray.txt").read_text().splitlines()
    # the Spaces builder mounts requirements.txt alone: it must not include another file
    assert not [line for line in requirement_lines("requirements.txt") if line.startswith("-")]
    npu = (ROOT / "requirements-npu.txt").read_text().splitlines()
    assert "-r requirements-common.txt" in npu
    # torch-npu X.Y.Z requires torch==X.Y.Z.*: the NPU file pins that torch, not the base one
    assert "torch-npu==2.14.0" in npu and "torch==2.14.0" in npu and "torchvision==0.29.0" in npu


def test_requirements_txt_repeats_the_common_pins_and_adds_only_torch():
    """requirements.txt installs by itself (the Spaces builder sees no other file), so it repeats
    requirements-common.txt, the one source of the shared pins for the layered files: the two agree."""
    common = requirement_lines("requirements-common.txt")
    base = requirement_lines("requirements.txt")
    assert common and len(set(common)) == len(common), common
    assert [line for line in common if line.startswith("-")] == []  # nothing nested in the common file
    assert [line for line in base if line not in common] == ["torch==2.14.1", "torchvision==0.29.1"]
    assert [line for line in common if line not in base] == []
    assert len(base) == len(common) + 2, "requirements.txt repeats a line"
