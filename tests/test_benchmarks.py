"""Smoke tests of `python -m benchmarks` and `python -m benchmarks parity` on the tiny model."""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.parity import main as parity_main


def test_benchmark_suite_writes_every_figure(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "bench.json"
    code = bench_main(
        [
            "--model",
            str(tiny_model_dir),
            "--device",
            "cpu",
            "--steps",
            "2",
            "--repeats",
            "2",
            "--pairs",
            "2",
            "--batches",
            "1,2",
            "--images",
            "2",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert report["backend"] == "cpu" and report["steps"] == 2
    r = report["results"]
    assert set(r) == {"wrapper", "attention", "batch", "dtype", "roofline", "startup"}
    assert r["wrapper"]["ratio_median_of_pairs"] > 0 and r["wrapper"]["pairs"] == 2
    assert r["wrapper"]["max_pixel_diff"] == 0.0  # the wrapper makes exactly the raw pipeline's images
    assert r["attention"]["vanilla_over_sdpa"] > 0 and r["attention"]["max_pixel_diff"] < 0.01
    assert set(r["batch"]["batches"]) == {"1", "2"}
    assert r["batch"]["batches"]["1"]["ratio_to_first"] == 1.0
    assert set(r["dtype"]["dtypes"]) == {"float32", "bfloat16"}
    assert r["dtype"]["dtypes"]["float32"]["max_pixel_diff_vs_float32"] == 0.0
    roof = r["roofline"]
    assert roof["unet_gflop_per_step"] > 0 and roof["matmul_gflops"] > 0
    assert 0 < roof["loop_fraction_of_matmul"] < 1.5
    assert r["startup"]["model_load_s"] > 0 and r["startup"]["app_launch_to_page_s"] > 0
    table = capsys.readouterr().out
    assert "wrapper / raw diffusers" in table and "fraction of matmul rate" in table


def test_unknown_section_is_an_error(tiny_model_dir, capsys):
    assert bench_main(["--model", str(tiny_model_dir), "--only", "wrapper,nope"]) == 2
    assert "unknown section(s) nope" in capsys.readouterr().err


def run_parity(model, tmp_path, *extra: str) -> tuple[int, dict]:
    out = tmp_path / "parity.json"
    args = ["--model", str(model), "--device", "cpu", "--steps", "2", "--images", "2", "--json", str(out), *extra]
    code = parity_main(args)
    return code, json.loads(out.read_text())


def test_parity_cpu_fp32_is_exact_and_passes(tiny_model_dir, tmp_path):
    code, report = run_parity(tiny_model_dir, tmp_path, "--dtype", "float32")
    assert code == 0 and report["pass"] is True
    assert all(row["max_abs"] == 0.0 and row["psnr"] is None for row in report["images"])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_parity_fails_a_perturbed_port(tiny_model_dir, tmp_path, dtype):
    code, report = run_parity(tiny_model_dir, tmp_path, "--dtype", dtype, "--perturb", "0.2")
    assert code == 1 and report["pass"] is False
    assert any(not row["pass"] for row in report["images"])


def test_inpaint_speed_benchmark_times_both(tiny_model_dir, tmp_path, capsys):
    from benchmarks.inpaint_speed import main as inpaint_main

    out = tmp_path / "inpaint.json"
    args = ["--model", str(tiny_model_dir), "--device", "cpu", "--steps", "2", "--repeats", "1", "--images", "2"]
    report = inpaint_main([*args, "--json", str(out)])
    assert json.loads(out.read_text()) == report
    assert report["steps"] == 2 and report["images"] == 2
    assert report["text_to_image_s"]["n"] == report["inpaint_s"]["n"] == 1
    assert report["ratio"] > 0
    assert "inpaint / text-to-image" in capsys.readouterr().out
