"""Smoke tests of `python -m benchmarks` and `python -m benchmarks parity` on the tiny model."""

from __future__ import annotations

import json

import pytest

from benchmarks.__main__ import main as bench_main
from benchmarks.parity import main as parity_main


@pytest.mark.slow  # 41 s on 2 shared cores
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
    assert roof["loop_fraction_of_matmul"] > 0  # a ratio of two timings: reported, not bounded (it varies with load)
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


# ---------------------------------------------------------------- speed and parity over options (benchmarks.options)
def test_speed_command_writes_every_option(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "speed.json"
    args = ["speed", "--model", str(tiny_model_dir), "--device", "cpu", "--steps", "2", "--images", "1"]
    code = bench_main([*args, "--repeats", "1", "--options", "memory-balanced,group-block,fp8-layerwise", "--json", str(out)])
    assert code == 0
    report = json.loads(out.read_text())
    r = report["results"]
    assert list(r) == ["plain", "memory-balanced", "group-block", "fp8-layerwise"]  # plain first, always
    assert r["plain"]["speedup_vs_plain"] == 1.0 and r["plain"]["psnr_vs_plain"] is None
    assert r["plain"]["weights"] == "on device" and r["plain"]["compile"] == "no compile: COMPILE=off"
    assert r["memory-balanced"]["max_abs_vs_plain"] < 0.01 and r["memory-balanced"]["load_s"] > 0
    assert "needs an accelerator" in r["group-block"]["skipped"]
    fp8 = r["fp8-layerwise"]
    assert fp8["per_image_s"]["n"] == 1 and 15 < fp8["psnr_vs_plain"] < 90 and "float8_e4m3fn" in fp8["note"]
    table = capsys.readouterr().out
    assert "speedup" in table and "fp8-layerwise" in table


def test_speed_command_refuses_an_unknown_option(tiny_model_dir, capsys):
    assert bench_main(["speed", "--model", str(tiny_model_dir), "--device", "cpu", "--options", "warp"]) == 2
    assert "unknown option(s) warp" in capsys.readouterr().err


def test_parity_over_options_passes_skips_and_fails(tiny_model_dir, tmp_path, monkeypatch):
    """Each option vs the same model without it; a registered option that breaks the images fails the run
    (this is also how new options join: `register(Option(...))`)."""
    from benchmarks import options
    from benchmarks.parity import perturb_

    code, report = run_parity(tiny_model_dir, tmp_path, "--options", "fp8-layerwise,memory-balanced,group-leaf")
    assert code == 0 and report["pass"] is True
    o = report["options"]
    assert o["fp8-layerwise"]["pass"] and o["fp8-layerwise"]["tolerance"] == {"max_abs": 0.5, "min_psnr": 20.0}
    assert o["memory-balanced"]["tolerance"]["min_psnr"] == 40.0 and o["memory-balanced"]["pass"]
    assert "needs an accelerator" in o["group-leaf"]["skipped"]
    monkeypatch.setitem(options.OPTIONS, "broken", options.Option("broken", "noisy weights", load=dict(options.PLAIN),
                        after_load=lambda p: perturb_(p, 0.3) or "perturbed"))  # fmt: skip
    code, report = run_parity(tiny_model_dir, tmp_path, "--options", "broken")
    assert code == 1 and report["pass"] is False and report["reference_pass"] is True
    assert report["options"]["broken"]["pass"] is False


@pytest.mark.slow  # 55 s on 2 shared cores
def test_parity_and_speed_run_a_step_cache_through_the_request_path(tiny_model_dir, family_root, tmp_path):
    """A per-request option (a step cache) goes through ImagePipeline.generate, the app's path; on a
    model whose denoiser has no cache (the embedded UNet) it is skipped with the reason."""
    from tests import families

    flux = families.build("flux", family_root / "flux")
    code, report = run_parity(flux, tmp_path, "--steps", "12", "--options", "taylorseer-cache")
    cached = report["options"]["taylorseer-cache"]
    assert code == 0 and cached["pass"] and max(r["max_abs"] for r in cached["images"]) > 0  # it really ran cached
    code, report = run_parity(tiny_model_dir, tmp_path, "--options", "magcache")
    assert code == 0 and "no diffusers step cache" in report["options"]["magcache"]["skipped"]
    out = tmp_path / "speed.json"
    args = ["speed", "--model", str(flux), "--device", "cpu", "--steps", "12", "--images", "1", "--repeats", "1"]
    assert bench_main([*args, "--options", "taylorseer-cache", "--json", str(out)]) == 0
    row = json.loads(out.read_text())["results"]["taylorseer-cache"]
    assert row["per_image_s"]["n"] == 1 and row["max_abs_vs_plain"] > 0


def test_the_torchao_option_names_the_models_denoiser_or_says_why_not(tiny_model_dir, monkeypatch):
    import importlib.util

    from benchmarks.options import OPTIONS, Unavailable

    option = OPTIONS["torchao-int8wo"]
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())  # as if torchao were installed
    assert option.fields(str(tiny_model_dir))["quantization"] == "unet=torchao-int8wo"
    with pytest.raises(Unavailable, match="local diffusers folder"):
        option.fields("someone/hub-model")
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(Unavailable, match=r"requirements-quant\.txt"):
        option.fields(str(tiny_model_dir))


def test_responsiveness_benchmark_reports_stop_status_and_hostile_metadata(tiny_model_dir, tmp_path, capsys):
    """The figures the tests no longer assert as time limits, printed from one run (no limit here either)."""
    from benchmarks.responsiveness import HOSTILE
    from benchmarks.responsiveness import main as responsiveness_main

    out = tmp_path / "responsiveness.json"
    report = responsiveness_main(["--model", str(tiny_model_dir), "--steps", "4", "--images", "1", "--json", str(out)])
    assert json.loads(out.read_text()) == report
    engine = report["engine"]
    assert engine["total_steps"] == 4 and 0 <= engine["steps_after_stop"] <= 1  # stopped at 3 of 4
    assert engine["status_busy_s"] > 0 and engine["stop_to_end_s"] > 0
    assert set(report["hostile_metadata"]) == {"normal_s", *HOSTILE}
    assert "Stop at step 3 of 4" in capsys.readouterr().out


@pytest.mark.slow  # ~40 s: torch, then OpenVINO converting, cached, dynamic and static, at 1 and 4 images
@pytest.mark.openvino
def test_speed_runtime_openvino_reports_the_ratios(tiny_model_dir, tmp_path, capsys):
    """`python -m benchmarks speed --runtime openvino` (peer left out: its venv is a 1.5 GB build) prints the
    issue's figures: images/s against torch per batch, first and cached load, memory, PSNR."""
    pytest.importorskip("openvino")
    out = tmp_path / "openvino.json"
    argv = ["speed", "--runtime", "openvino", "--no-peer", "--model", str(tiny_model_dir), "--steps", "2"]
    assert bench_main([*argv, "--repeats", "1", "--json", str(out)]) == 0
    summary = json.loads(out.read_text())["summary"]
    assert set(summary["images_per_s"]) == {"1", "4"}
    rows = summary["images_per_s"].values()
    assert all(r["openvino_vs_torch"] > 0 and r["openvino_static"] > 0 and r["openvino_dynamic"] > 0 for r in rows)
    assert summary["first_load_s"] > 0 and summary["cached_load_s"] > 0 and summary["psnr_vs_torch"] >= 40
    assert "OpenVINO vs torch eager" in capsys.readouterr().out
    for images, report in json.loads(out.read_text())["reports"].items():  # w8a8 timed once calibrated, not before
        assert "activations int8" in report["results"]["openvino-w8a8"]["runtime"], images


@pytest.mark.openvino
def test_the_suite_writes_its_json_under_openvino(tiny_model_dir, tmp_path):
    """Issue 58: with openvino installed RUNTIME=auto runs the suite on OpenVINO; its JSON holds plain numbers
    (the FLOP count was a Tensor: TypeError at the end of the run) and the dtype section measures torch's dtypes
    on the torch modules (bf16 used to be converted, then fell back with tracebacks)."""
    pytest.importorskip("openvino")
    out = tmp_path / "bench.json"
    argv = ["--model", str(tiny_model_dir), "--device", "cpu", "--steps", "2", "--repeats", "1", "--images", "1"]
    assert bench_main([*argv, "--only", "dtype,roofline", "--json", str(out)]) == 0
    r = json.loads(out.read_text())["results"]
    assert r["roofline"]["runtime"] == "openvino" and r["roofline"]["unet_gflop_per_step"] > 0
    assert r["dtype"]["runtime"] == "torch" and set(r["dtype"]["dtypes"]) == {"float32", "bfloat16"}


def test_a_recipe_is_benchmarked_as_one_folder_that_draws_what_the_app_draws(tmp_path):
    """`speed --runtime openvino --model tiny-shapes-fast` (issue 58's few-step peer case): ours and optimum-intel
    load one plain folder made from the recipe. It has the recipe's LCM scheduler, 4 steps and guidance 1, and
    its images are the app's own for the recipe, so the two runtimes are timed on the same work."""
    from benchmarks.openvino_bench import plain_folder
    from benchmarks.suite import as_array
    from devices import DeviceManager
    from pipelines import GenerationRequest, ImagePipeline
    from pipelines.run.model_setup import read_vocabulary

    folder = plain_folder("tiny-shapes-fast", tmp_path)
    vocabulary = read_vocabulary(folder)
    assert (vocabulary["default_steps"], vocabulary["default_guidance_scale"]) == (4, 1.0)
    request = GenerationRequest(prompt="a red circle on a blue background", steps=4, guidance_scale=1.0, seed=3)
    images = []
    for source in (folder, "tiny-shapes-fast"):
        pipeline = ImagePipeline.from_pretrained(source, DeviceManager("cpu"))
        assert type(pipeline.pipe.scheduler).__name__ == "LCMScheduler"
        images.append(as_array(pipeline.generate(request).images))
        pipeline.close()
    assert abs(images[0] - images[1]).max() <= 2 / 255
