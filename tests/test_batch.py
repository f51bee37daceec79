"""Offline batch jobs: 2 processes (torchrun + accelerate's PartialState) make exactly the files of 1 process,
which are the app's images for the same seeds; re-runs resume. ~35 s on 2 cores (5 process starts). A video job
(--frames) writes each clip as an MP4 with its parameters inside (in this process: a few seconds)."""

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

from devices import DeviceManager
from pipelines import read_png_info, read_video
from pipelines.batch import RUN_ONLY, chunks, main, merge_manifest
from pipelines.pnginfo.write import JSON_KEY
from pipelines.run.image_pipeline import ImagePipeline
from pipelines.schema.request import GenerationRequest
from tests.app_server import free_port

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["a red circle on a blue background", "a green square", "a blue triangle"]
VIDEO_MODEL = ROOT / "models" / "tiny-shapes-video"
CLIP_PROMPTS = ["a red circle moving left on a blue background", "a green square moving up on a white background"]


def run_batch(out: Path, prompts: Path, model: Path, processes: int) -> subprocess.CompletedProcess:
    args = ["--prompts", str(prompts), "--num-images", "2", "--out", str(out), "--model", str(model),
            "--steps", "3", "--guidance", "4", "--seed", "7", "--micro-batch", "2"]  # fmt: skip
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
    prompts.write_text(f"# three prompts\n{PROMPTS[0]}\n\n{PROMPTS[1]}\n  {PROMPTS[2]}\n")
    one, two = base / "one", base / "two"
    run_batch(one, prompts, tiny_model_dir, 1)
    run_batch(two, prompts, tiny_model_dir, 2)
    return one, two, prompts, tiny_model_dir


def pngs(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.glob("*.png"))


@pytest.mark.slow  # multi-process: torchrun starts
def test_two_processes_make_exactly_the_files_of_one(runs):
    one, two, _, _ = runs
    assert pngs(one) == pngs(two) == [f"{k:06d}-{7 + k}.png" for k in range(6)]
    for name in pngs(one):
        with Image.open(one / name) as a, Image.open(two / name) as b:
            assert a.text == b.text  # identical metadata chunks
            assert np.array_equal(np.asarray(a), np.asarray(b)), name  # the same micro-batches: same pixels


@pytest.mark.slow  # multi-process: torchrun starts
def test_the_files_are_the_apps_images_for_the_same_seeds(runs, tiny_model_dir):
    one, _, _, _ = runs
    pipeline = ImagePipeline.from_pretrained(tiny_model_dir, DeviceManager("cpu"), micro_batch=2)
    request = GenerationRequest(prompt=PROMPTS, num_images=2, seed=7, steps=3, guidance_scale=4.0)
    result = pipeline.generate(request)
    for k, (image, meta) in enumerate(zip(result.images, result.metadata, strict=True)):
        with Image.open(one / f"{k:06d}-{7 + k}.png") as saved:
            assert np.array_equal(np.asarray(saved), np.asarray(image)), k
            stored = json.loads(saved.text[JSON_KEY])
        assert stored == {key: v for key, v in json.loads(json.dumps(meta)).items() if key not in RUN_ONLY}
        assert "timings" not in stored and "process" not in stored  # per-run values: manifest only


@pytest.mark.slow  # multi-process: torchrun starts
def test_the_manifest_lists_every_item_once_with_both_processes(runs):
    _, two, _, _ = runs
    entries = [json.loads(line) for line in (two / "manifest.jsonl").read_text().splitlines()]
    assert [e["item"] for e in entries] == list(range(6))
    assert {e["process"] for e in entries} == {0, 1}
    assert entries[0]["prompt"] == PROMPTS[0] and entries[5]["prompt"] == PROMPTS[2] and entries[5]["seed"] == 12
    assert [e["file"] for e in entries] == pngs(two) and all(e["seconds"] > 0 for e in entries)
    assert not list(two.glob("manifest.part-*"))


@pytest.mark.slow  # multi-process: torchrun starts
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
    stale = two / ".000004-11.png.0badcafe.part"  # what a run killed mid-write leaves
    stale.write_bytes(b"\x89PNG truncated")
    run = run_batch(two, prompts, model, 1)
    assert "4 of 6 image(s) already there, 2 made" in run.stdout
    changed = {p.name for p in two.glob("*.png") if before.get(p.name) != p.stat().st_mtime_ns}
    assert changed == {"000001-8.png", "000004-11.png"}
    assert not stale.exists()
    entries = [json.loads(line) for line in (two / "manifest.jsonl").read_text().splitlines()]
    assert [e["item"] for e in entries] == list(range(6))


def test_a_killed_runs_manifest_part_is_merged_and_a_cut_line_skipped(tmp_path):
    (tmp_path / "manifest.jsonl").write_text(json.dumps({"item": 0, "process": 0}) + "\n")
    (tmp_path / "manifest.part-1.jsonl").write_text(
        json.dumps({"item": 2, "process": 1}) + "\n" + json.dumps({"item": 1, "process": 1}) + "\n" + '{"item": 3, "pro'
    )
    assert merge_manifest(tmp_path) == 3
    lines = (tmp_path / "manifest.jsonl").read_text().splitlines()
    assert [json.loads(line)["item"] for line in lines] == [0, 1, 2]
    assert not list(tmp_path.glob("manifest.part-*"))


def test_items_run_in_the_apps_micro_batches():
    assert chunks(list(range(6)), 2) == [[0, 1], [2, 3], [4, 5]]
    assert chunks([1, 2, 3, 4, 5, 7, 8], 4) == [[1, 2, 3], [4, 5], [7], [8]]  # gaps: finished files


@pytest.fixture
def one_thread():
    """In this process (`main`, as one batch process): torch on one thread, as `--threads 1`, restored after."""
    import torch

    threads = torch.get_num_threads()
    yield ["--threads", "1"]
    torch.set_num_threads(threads)


@pytest.mark.skipif(not (VIDEO_MODEL / "model_index.json").is_file(), reason="needs models/tiny-shapes-video")
def test_a_video_job_writes_each_clip_as_an_mp4_with_its_parameters(tmp_path, capsys, one_thread):
    prompts, out = tmp_path / "prompts.txt", tmp_path / "clips"
    prompts.write_text("\n".join(CLIP_PROMPTS) + "\n")
    argv = ["--prompts", str(prompts), "--model", str(VIDEO_MODEL), "--frames", "9", "--steps", "3", "--seed", "7",
            "--out", str(out), *one_thread]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err
    assert "0 of 2 clip(s) already there, 2 made" in capsys.readouterr().out
    names = sorted(p.name for p in out.iterdir() if not p.name.startswith("manifest"))
    assert names == ["000000-7.mp4", "000001-8.mp4"]
    for k, name in enumerate(names):
        clip = read_video(out / name)
        assert (clip.frames, clip.fps, clip.width, clip.height) == (9, 8.0, 64, 64)  # the model's fps and size
        info = read_png_info(out / name)
        fields = info["parameters"]
        assert (fields["prompt"], fields["seed"], fields["num_frames"], fields["steps"]) == (CLIP_PROMPTS[k], 7 + k, 9, 3)
        assert "Frames: 9, FPS: 8" in info["raw"]
        assert not set(json.loads(clip.metadata[JSON_KEY])) & set(RUN_ONLY)  # per-run values: manifest only
    entries = [json.loads(line) for line in (out / "manifest.jsonl").read_text().splitlines()]
    assert [(e["item"], e["file"]) for e in entries] == list(enumerate(names))
    assert main(argv) == 0 and "2 of 2 clip(s) already there, 0 made" in capsys.readouterr().out  # resumable


def test_a_batch_jobs_input_images_are_first_frames_of_clips(tmp_path, capsys):
    """A job takes the video fields, --init-image too (image-to-video); without --frames it would be an
    image-to-image job, whose fields (strength...) are not flags here: refused before the model loads."""
    prompts, first = tmp_path / "prompts.txt", tmp_path / "first.png"
    prompts.write_text(CLIP_PROMPTS[0] + "\n")
    Image.new("RGB", (64, 64), "red").save(first)
    assert main(["--prompts", str(prompts), "--init-image", str(first), "--out", str(tmp_path / "o")]) == 2
    assert "--init-image: a batch job's input images are its clips' first frames" in capsys.readouterr().err
