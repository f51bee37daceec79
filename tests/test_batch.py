"""Offline batch jobs: 2 processes (torchrun + accelerate's PartialState) make exactly the files of 1 process."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.batch import chunks
from tests.app_server import free_port

ROOT = Path(__file__).resolve().parents[1]


def run_batch(out: Path, prompts: Path, model: Path, processes: int) -> subprocess.CompletedProcess:
    args = ["--prompts", str(prompts), "--num-images", "2", "--out", str(out), "--model", str(model),
            "--steps", "3", "--seed", "7", "--micro-batch", "2"]  # fmt: skip
    if processes == 1:
        command = [sys.executable, "-m", "pipelines.batch", *args, "--threads", "1"]
    else:
        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
        port = str(free_port())  # torchrun's rendezvous hangs with port 0
        command = [torchrun, "--nproc_per_node", str(processes), "--master_port", port, "-m", "pipelines.batch", *args]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    run = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    return run


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_model_dir):
    base = tmp_path_factory.mktemp("batch")
    prompts = base / "prompts.txt"
    prompts.write_text("# three prompts\na red circle on a blue background\n\na green square\na blue triangle\n")
    one, two = base / "one", base / "two"
    run_batch(one, prompts, tiny_model_dir, 1)
    run_batch(two, prompts, tiny_model_dir, 2)
    return one, two, prompts, tiny_model_dir


def pngs(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.png"))


def test_two_processes_make_exactly_the_files_of_one(runs):
    one, two, _, _ = runs
    assert pngs(one) == pngs(two) == [f"{k:06d}-{7 + k}.png" for k in range(6)]
    for name in pngs(one):
        with Image.open(one / name) as a, Image.open(two / name) as b:
            assert a.text == b.text  # identical metadata chunks
            diff = np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).max()
            assert diff <= 1, name  # batched BLAS order: at most 1/255


def test_the_manifest_lists_every_item_once_with_both_processes(runs):
    _, two, _, _ = runs
    entries = [json.loads(line) for line in (two / "manifest.jsonl").read_text().splitlines()]
    assert [e["item"] for e in entries] == list(range(6))
    assert {e["process"] for e in entries} == {0, 1}
    assert entries[0]["prompt"] == "a red circle on a blue background" and entries[5]["seed"] == 12
    assert not list(two.glob("manifest.part-*"))


def test_a_rerun_skips_finished_files_and_redoes_missing_ones(runs):
    _, two, prompts, model = runs
    before = {p.name: p.stat().st_mtime_ns for p in two.glob("*.png")}
    manifest = (two / "manifest.jsonl").read_text()
    run = run_batch(two, prompts, model, 1)
    assert "6 of 6 image(s) already there, 0 made" in run.stdout
    assert {p.name: p.stat().st_mtime_ns for p in two.glob("*.png")} == before
    assert (two / "manifest.jsonl").read_text() == manifest
    (two / "000001-8.png").unlink()
    (two / "000004-11.png").unlink()
    run = run_batch(two, prompts, model, 1)
    assert "4 of 6 image(s) already there, 2 made" in run.stdout
    changed = {p.name for p in two.glob("*.png") if before.get(p.name) != p.stat().st_mtime_ns}
    assert changed == {"000001-8.png", "000004-11.png"}


def test_runs_of_consecutive_items():
    assert chunks([0, 1, 2, 5, 6, 9], 2) == [[0, 1], [2], [5, 6], [9]]
