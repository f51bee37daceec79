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


def test_the_testing_page_counts_come_from_junit_reports(tmp_path):
    """docs/testing.md's table is `python -m tests.suite_report`'s, made from pytest's JUnit reports: the
    counts, the times and the slowest tests with the first line of their docstrings."""
    from tests import suite_report

    def report(name: str, cases: str, seconds: float) -> Path:
        path = tmp_path / name
        path.write_text(f'<testsuites><testsuite name="pytest" time="{seconds}">{cases}</testsuite></testsuites>')
        return path

    this = "tests.test_repo"
    ok = f'<testcase classname="{this}" name="test_readme_has_exactly_two_setup_commands" time="1.5"/>'
    slow = f'<testcase classname="{this}" name="test_torch_is_pinned_and_layers_stack" time="30"/>'
    skipped = f'<testcase classname="{this}" name="test_x" time="0"><skipped/></testcase>'
    failed = f'<testcase classname="{this}" name="test_y" time="2"><failure/></testcase>'
    runs = [suite_report.read(report("q.xml", ok + skipped, 61.0), "quick"),
            suite_report.read(report("a.xml", ok + slow + failed, 125.0), "all")]  # fmt: skip
    text = suite_report.section(runs, 1500.0, "a test")
    assert "| `quick` | 1 | 0 | 1 | 1 min 01 s |" in text and "| `all` | 2 | 1 | 0 | 2 min 05 s |" in text
    assert "25 min 00 s" in text
    rows = [line for line in text.splitlines() if line.startswith("| 30 |")]
    assert rows and "torch is pinned and layers stack" in rows[0]  # no docstring: its name as a sentence
    assert suite_report.BEGIN in (ROOT / "docs" / "testing.md").read_text()
