"""Quantized checkpoints (pipelines.weights.quantization) on the tiny model families, on the CPU.

GGUF fixtures are written once per module from the tiny Flux / SD3 / Qwen-Image transformers with the
`gguf` package (benchmarks.quant_bench.write_gguf: Q8_0 and Q4_0, non-Linear tensors, biases, norms
and rows that are not whole 32-blocks kept F32). The `gguf` package cannot write K-quants (Q6_K,
Q5_K, Q4_K), so their test does not quantize anything: it writes random but well-formed K-quant
blocks and checks that diffusers reads them as gguf-py's reference dequantizer does.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks import quant_bench
from devices import DeviceManager
from pipelines import GenerationRequest
from pipelines.run.options import PipelineOptions
from pipelines.schema.errors import ModelLoadError
from pipelines.weights import hashing, quantization
from pipelines.weights.recipes import open_model
from tests.fakes import fake_cuda, fake_mps, fake_npu, no_accelerators

ROOT = Path(__file__).resolve().parents[1]
GGUF_FAMILIES = ("flux", "sd3", "qwen-image")  # their transformers load from a single file


@pytest.fixture(scope="module")
def made(family_root, tmp_path_factory):
    """family -> its tiny folder and its transformer as Q8_0 / Q4_0 GGUF files (built once)."""
    pytest.importorskip("gguf", reason="pip install -r requirements-quant.txt")
    out = {}
    for name in GGUF_FAMILIES:
        quant_bench.build_family(name, family_root)
        work = tmp_path_factory.mktemp(f"gguf-{name}")
        (work / name).symlink_to(family_root / name)
        out[name] = quant_bench.fixtures(name, work)
    return out


_PLAIN: dict[str, object] = {}


def plain(made, name):
    """The plain fp32 pipeline of a family and its image, once per session."""
    if name not in _PLAIN:
        pipeline = quant_bench.load(str(made[name]["folder"]))
        _PLAIN[name] = (pipeline, quant_bench.render(pipeline))
    return _PLAIN[name]


# ---------------------------------------------------------------- GGUF
def test_gguf_files_store_quantized_tensors_at_their_block_size(made):
    for name in GGUF_FAMILIES:
        q8, q4 = made[name]["Q8_0"]["stats"], made[name]["Q4_0"]["stats"]
        assert q8["quantized_tensors"] > 0 and q8["kept_tensors"] > 0
        assert q8["quantized_ratio"] <= 0.27, (name, q8)  # 34 bytes per 32 values
        assert q4["quantized_ratio"] <= 0.16, (name, q4)  # 18 bytes per 32 values
        assert q4["file_bytes"] < q8["file_bytes"]
    assert made["flux"]["Q8_0"]["stats"]["file_ratio"] < 0.35  # the whole file, F32 tensors included


@pytest.mark.parametrize("name", GGUF_FAMILIES)
def test_gguf_model_id_with_base_model_makes_close_images_and_says_so(made, name):
    base, plain_image = plain(made, name)
    q8 = quant_bench.load(str(made[name]["Q8_0"]["path"]), base_model=str(made[name]["folder"]))
    info = q8.model_info()
    assert "Q8_0" in info.quantization["transformer"] and info.quantization["transformer"].startswith("gguf")
    assert set(info.quantization) == {"transformer"}
    assert quant_bench.psnr(plain_image, quant_bench.render(q8)) >= 30
    request = GenerationRequest(prompt="a cat", steps=1, width=32, height=32)
    assert q8.generate(request).metadata[0]["quantization"] == info.quantization  # each image says so
    assert "quantization" not in base.generate(request).metadata[0]  # a plain model's metadata is unchanged
    assert q8.model_hash() == hashing.short_hash(made[name]["Q8_0"]["path"])  # the weights that run: the GGUF file
    plain_bytes, stats = base.model_info().component_bytes, made[name]["Q8_0"]["stats"]
    saved = stats["quantized_fp32_bytes"] - stats["quantized_bytes"]  # the blocks are what is held in memory
    assert info.component_bytes["transformer"] == plain_bytes["transformer"] - saved
    assert info.component_bytes["vae"] == plain_bytes["vae"]  # the rest comes from the base model
    from ui.status import status_markdown

    assert f"weights: on device · transformer {info.quantization['transformer']}" in status_markdown(q8.status(), [])


def test_gguf_model_in_a_two_replica_cpu_pool(made):
    """Each replica opens the quantized model itself: diffusers' GGUF parameters cannot be deep-copied."""
    from devices.options import DeviceSettings
    from serving.pool import DevicePool

    flux = made["flux"]
    opts = PipelineOptions(memory_mode="off", base_model=str(flux["folder"]))
    pool = DevicePool.from_pretrained(str(flux["Q8_0"]["path"]), "cpu", opts, DeviceSettings(cpu_replicas=2))
    try:
        assert len(pool.status()) == 2 and "Q8_0" in pool.model_info().quantization["transformer"]
        result = pool.generate(GenerationRequest(prompt="a cat", steps=1, width=32, height=32, num_images=2))
        assert len(result.images) == 2 and all(m["quantization"] for m in result.metadata)
    finally:
        pool.close()


def test_gguf_q4_from_a_recipe_with_a_relative_file(made, tmp_path):
    flux = made["flux"]
    gguf_file = tmp_path / "transformer-Q4_0.gguf"
    gguf_file.symlink_to(flux["Q4_0"]["path"])
    recipe = {
        "name": "tiny-flux-q4",
        "source": str(flux["folder"]),
        "pipeline_class": "FluxPipeline",
        "quantization": {"transformer": {"method": "gguf", "file": "transformer-Q4_0.gguf"}},
    }
    (tmp_path / "tiny-flux-q4.json").write_text(json.dumps(recipe))
    pipeline = quant_bench.load(str(tmp_path / "tiny-flux-q4.json"))
    info = pipeline.model_info()
    assert "Q4_0" in info.quantization["transformer"]
    value = quant_bench.psnr(plain(made, "flux")[1], quant_bench.render(pipeline))
    print(f"flux Q4_0 PSNR vs fp32: {value:.2f} dB")
    assert value >= 20  # reported, not a bar: Q4_0 keeps 4 bits per weight


def test_gguf_without_base_model_or_file_is_refused_naming_the_setting(made):
    dm = DeviceManager("cpu")
    with pytest.raises(ModelLoadError, match="BASE_MODEL"):
        open_model(str(made["flux"]["Q8_0"]["path"]), dm)
    with pytest.raises(ModelLoadError, match="GGUF file not found"):
        open_model(str(made["flux"]["folder"]), dm, quantize="transformer=gguf:/nowhere/x.gguf")
    with pytest.raises(ModelLoadError, match="as AutoencoderKL: SingleFileComponentError"):  # a transformer file
        open_model(str(made["flux"]["folder"]), dm, quantize=f"vae=gguf:{made['flux']['Q8_0']['path']}")
    with pytest.raises(ModelLoadError, match=r"gguf is refused for vae \(AutoencoderKLQwenImage\)"):
        open_model(str(made["qwen-image"]["folder"]), dm, quantize=f"vae=gguf:{made['flux']['Q8_0']['path']}")


def _random_kquant_rows(rows: int, cols: int, qtype, rng):
    """Random K-quant blocks with small positive fp16 super-block scales (Q6_K keeps `d` last;
    Q5_K / Q4_K start with `d`, `dmin`): well-formed data, not a quantization of anything."""
    import gguf
    import numpy as np

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    n = cols // block
    raw = rng.integers(0, 256, size=(rows, n, size), dtype=np.uint8)

    def scale():
        return rng.uniform(5e-5, 2e-4, size=(rows, n)).astype(np.float16).view(np.uint8).reshape(rows, n, 2)

    if qtype.name == "Q6_K":
        raw[..., size - 2 :] = scale()
    else:
        raw[..., 0:2], raw[..., 2:4] = scale(), scale()
    return raw.reshape(rows, n * size)


@pytest.mark.parametrize("qtype", ["Q6_K", "Q5_K", "Q4_K"])
def test_k_quant_blocks_load_as_the_reference_dequantizer_reads_them(tmp_path, qtype):
    """A Flux transformer 256 wide (K-quant rows are 256-value super-blocks) through the app's loader."""
    gguf = pytest.importorskip("gguf")
    import numpy as np
    from diffusers import FluxTransformer2DModel
    from diffusers.quantizers.gguf.utils import dequantize_gguf_tensor

    torch.manual_seed(0)
    model = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=128, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[16, 56, 56], guidance_embeds=True,
    ).eval()  # fmt: skip
    model.save_config(tmp_path / "base" / "transformer")
    (tmp_path / "base" / "model_index.json").write_text(
        json.dumps({"transformer": ["diffusers", "FluxTransformer2DModel"]})
    )
    kind, rng = gguf.GGMLQuantizationType[qtype], np.random.default_rng(0)
    writer, reference = gguf.GGUFWriter(str(tmp_path / f"t-{qtype}.gguf"), "flux"), {}
    for name, tensor in model.state_dict().items():
        if name.endswith(".weight") and tensor.ndim == 2 and tensor.shape[1] % 256 == 0:
            raw = _random_kquant_rows(*tensor.shape, kind, rng)
            writer.add_tensor(name, raw, raw_dtype=kind)
            reference[name] = torch.from_numpy(gguf.quants.dequantize(raw, kind).copy())
        else:
            writer.add_tensor(name, tensor.numpy())
    for step in (writer.write_header_to_file, writer.write_kv_data_to_file, writer.write_tensors_to_file, writer.close):
        step()
    request = quantization.parse_setting(f"transformer=gguf:{tmp_path / f't-{qtype}.gguf'}")[0]
    loaded = quantization._load_gguf(request, "FluxTransformer2DModel", str(tmp_path / "base"), torch.float32)
    assert f"{qtype} x{len(reference)}" in quantization.describe_gguf(loaded)  # what model_info would report
    params = dict(loaded.named_parameters())
    for name, expected in reference.items():  # equal up to diffusers' fp16 arithmetic on the scales
        got = dequantize_gguf_tensor(params[name]).float()
        assert (got - expected).abs().max() <= 1e-3 * expected.abs().max(), name


# ---------------------------------------------------------------- fp8 layerwise, torchao
def test_fp8_layerwise_stores_float8_and_reports_it(made):
    plain_pipe, plain_image = plain(made, "flux")
    pipeline = quant_bench.load(str(made["flux"]["folder"]), quantization="transformer=fp8-layerwise")
    info = pipeline.model_info()
    assert info.quantization["transformer"].startswith("fp8 layerwise casting")
    dtypes = {p.dtype for p in pipeline.diffusers_pipeline.transformer.parameters()}
    assert torch.float8_e4m3fn in dtypes
    assert info.component_bytes["transformer"] < 0.6 * plain_pipe.model_info().component_bytes["transformer"]
    value = quant_bench.psnr(plain_image, quant_bench.render(pipeline))
    print(f"flux fp8-layerwise PSNR vs fp32: {value:.2f} dB")
    assert value >= 20


def _torchao_env() -> dict[str, str] | None:
    """The environment in which torchao imports: this one, or with QUANT_LIBS (a pip --target folder,
    default .quant-libs) on PYTHONPATH; None when neither has it."""
    if importlib.util.find_spec("torchao") is not None:
        return dict(os.environ)
    extra = Path(os.environ.get("QUANT_LIBS", ROOT / ".quant-libs"))
    if not (extra / "torchao").is_dir():
        return None
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(extra), os.environ.get("PYTHONPATH")]))}


def test_torchao_int8_weight_only_on_a_transformer_and_a_text_encoder(tmp_path):
    """In a child process: with torchao installed, diffusers imports it at `import diffusers`."""
    env = _torchao_env()
    if env is None:
        pytest.skip("torchao is not installed (requirements-quant.txt)")
    setting = "transformer=torchao-int8wo,text_encoder_2=torchao-int8wo"
    out = tmp_path / "torchao.json"
    command = [sys.executable, "-m", "benchmarks.quant_bench", "--families", "flux", "--quantization", setting]
    run = subprocess.run([*command, "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    r = json.loads(out.read_text())["flux"]
    assert r["reported"] == {"transformer": "torchao int8 weight-only", "text_encoder_2": "torchao int8 weight-only"}
    for component in ("transformer", "text_encoder_2"):  # int8 data + scales, well under fp32's 4 bytes
        assert r["component_bytes"][component] < 0.5 * r["plain_component_bytes"][component]
    assert r["component_bytes"]["vae"] == r["plain_component_bytes"]["vae"]
    assert r["psnr_db"] >= 30


# ---------------------------------------------------------------- refusals, per device
def test_bitsandbytes_is_refused_on_the_cpu_before_loading(made, tmp_path, monkeypatch):
    from pipelines.weights import loading

    loads: list[str] = []
    monkeypatch.setattr(loading, "load_diffusers_pipeline", lambda source, *a, **k: loads.append(source))
    with pytest.raises(ModelLoadError) as error:
        open_model(str(made["flux"]["folder"]), DeviceManager("cpu"), quantize="transformer=bnb-nf4")
    message = str(error.value)
    assert "QUANTIZATION (transformer)" in message and "(cpu)" in message and "CUDA" in message
    recipe = {"name": "r", "source": "black-forest-labs/FLUX.1-dev", "quantization": {"text_encoder_2": "bnb-int8"}}
    (tmp_path / "r.json").write_text(json.dumps(recipe))
    with pytest.raises(
        ModelLoadError, match=r"quantization\.text_encoder_2: bnb-int8 is refused on this device \(cpu\)"
    ):
        open_model(str(tmp_path / "r.json"), DeviceManager("cpu"))  # a Hub id: refused before any download
    assert loads == []  # neither the folder nor the Hub model was loaded (or downloaded) before the refusal


def test_simulated_npu_offers_gguf_and_torchao_and_refuses_bnb_and_fp8(monkeypatch):
    no_accelerators(monkeypatch)
    fake_npu(monkeypatch)
    dm = DeviceManager()
    assert dm.backend == "npu"
    for ok in ("transformer=gguf:t.gguf", "transformer=torchao-int8wo"):
        requests = quantization.parse_setting(ok)
        assert quantization.refusal(requests[0].method, dm.backend) is None
    for refused, reason in (("bnb-nf4", "no Ascend kernels"), ("fp8-layerwise", "not verified")):
        with pytest.raises(ModelLoadError, match=rf"{refused} is refused on this device \(npu\): .*{reason}"):
            open_model("black-forest-labs/FLUX.1-dev", dm, quantize=f"transformer={refused}")


def test_simulated_mps_refuses_fp8_and_bnb_offers_gguf(monkeypatch):
    no_accelerators(monkeypatch)
    fake_mps(monkeypatch)
    dm = DeviceManager()
    assert dm.backend == "mps"
    assert quantization.refusal("gguf", "mps") is None and quantization.refusal("torchao-int8wo", "mps") is None
    with pytest.raises(ModelLoadError, match=r"fp8-layerwise is refused on this device \(mps\): MPS has no float8"):
        open_model("black-forest-labs/FLUX.1-dev", dm, quantize="transformer=fp8-layerwise")
    with pytest.raises(ModelLoadError, match="no Metal kernels"):
        open_model("black-forest-labs/FLUX.1-dev", dm, quantize="transformer=bnb-nf4")


def test_bitsandbytes_on_cuda_needs_its_package(monkeypatch):
    no_accelerators(monkeypatch)
    fake_cuda(monkeypatch)
    dm = DeviceManager()
    assert quantization.refusal("bnb-nf4", dm.backend) is None
    if importlib.util.find_spec("bitsandbytes") is None:
        with pytest.raises(
            ModelLoadError, match=r"needs the bitsandbytes package: .*pip install -r requirements-quant\.txt"
        ):
            open_model("black-forest-labs/FLUX.1-dev", dm, quantize="transformer=bnb-nf4")


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("transformer=int3", "unknown quantization 'int3'"),
        ("transformer", "is not component=method"),
        ("transformer=gguf", "gguf needs a file"),
        ("transformer=torchao-int8wo:x.gguf", "takes no file"),
        ("transformer=gguf:x.safetensors", "is not a .gguf file"),
    ],
)
def test_bad_settings_name_the_setting(setting, message):
    with pytest.raises(ValueError, match=message):
        quantization.parse_setting(setting)


def test_recipe_field_is_validated_and_a_missing_component_named(made, tmp_path):
    from pipelines.weights import recipes

    with pytest.raises(recipes.RecipeError, match=r"recipe x: quantization.unet: unknown quantization 'q2'"):
        recipes.parse({"name": "x", "source": "y", "quantization": {"unet": "q2"}}, "x")
    with pytest.raises(ModelLoadError, match="the model has no component 'unet'"):
        open_model(str(made["flux"]["folder"]), DeviceManager("cpu"), quantize="unet=fp8-layerwise")
    recipe = {"name": "x", "source": str(made["flux"]["folder"]), "quantization": {"vae": "fp8-layerwise"},
              "components": {"vae": {"source": "vae", "class": "diffusers.AutoencoderKL"}}}  # fmt: skip
    (tmp_path / "x.json").write_text(json.dumps(recipe))
    with pytest.raises(ModelLoadError, match="vae is loaded by the recipe's components"):
        open_model(str(tmp_path / "x.json"), DeviceManager("cpu"))
    with pytest.raises(ModelLoadError, match="diffusers models only"):
        open_model(str(made["flux"]["folder"]), DeviceManager("cpu"), quantize="text_encoder=fp8-layerwise")


# ---------------------------------------------------------------- defaults and reporting
def test_plain_model_reports_no_quantization_and_real_component_bytes(made):
    pipeline, _ = plain(made, "flux")
    info = pipeline.model_info()
    assert info.quantization == {}
    pipe = pipeline.diffusers_pipeline
    expected = sum(t.numel() * t.element_size() for t in [*pipe.vae.parameters(), *pipe.vae.buffers()])
    assert info.component_bytes["vae"] == expected
    assert set(info.component_bytes) == {"vae", "text_encoder", "text_encoder_2", "transformer"}


def test_back_ends_are_optional_pins_with_bitsandbytes_kept_to_cuda_hosts():
    lines = [line.split("#")[0].strip() for line in (ROOT / "requirements-quant.txt").read_text().splitlines()]
    pins = {line.split("==")[0]: line for line in lines if line}
    assert set(pins) == {"gguf", "torchao", "bitsandbytes"} and all("==" in line for line in pins.values())
    assert "platform_machine" in pins["bitsandbytes"] and "torch" not in pins
    assert "requirements-quant" not in (ROOT / "requirements.txt").read_text()  # optional: never in the base


def test_settings_are_read_once_and_back_ends_never_imported_by_the_policy_module():
    opts = PipelineOptions.from_env({"QUANTIZATION": " transformer=fp8-layerwise ", "BASE_MODEL": "a/b"})
    assert (opts.quantization, opts.base_model) == ("transformer=fp8-layerwise", "a/b")
    assert PipelineOptions.from_env({}).quantization == ""
    with pytest.raises(ValueError, match=r"QUANTIZATION=.*is not component=method"):
        PipelineOptions.from_env({"QUANTIZATION": "int8"})
    source = (ROOT / "pipelines" / "weights" / "quantization.py").read_text()
    top_level = [line for line in source.splitlines() if line.startswith(("import ", "from "))]
    assert not any(name in line for line in top_level for name in ("gguf", "torchao", "bitsandbytes", "diffusers"))


@pytest.mark.slow  # 47 s on 2 shared cores
def test_speed_and_parity_measure_a_quantization_spec(made, tmp_path, capsys):
    """`python -m benchmarks speed|parity --quantization SPEC`: a maintainer's own GGUF (here the tiny
    Flux at Q8_0) measured against the same model without it; a spec the loader refuses is a failed
    row, not a crash."""
    from benchmarks.__main__ import main as bench_main

    folder, q8 = str(made["flux"]["folder"]), made["flux"]["Q8_0"]["path"]
    spec = f"transformer=gguf:{q8}"
    common = ["--model", folder, "--device", "cpu", "--steps", "2", "--images", "1"]
    out = tmp_path / "speed.json"
    assert bench_main(["speed", *common, "--options", "plain", "--repeats", "1", "--quantization", spec,
                       "--json", str(out)]) == 0  # fmt: skip
    row = json.loads(out.read_text())["results"]["quantization"]
    assert row["summary"] == f"QUANTIZATION={spec}" and "Q8_0" in row["quantization"]["transformer"]
    assert row["psnr_vs_plain"] >= 30 and row["per_image_s"]["n"] == 1
    out = tmp_path / "parity.json"
    assert bench_main(["parity", *common, "--quantization", spec, "--json", str(out)]) == 0
    assert json.loads(out.read_text())["options"]["quantization"]["pass"] is True
    bad = bench_main(["parity", *common, "--quantization", "transformer=gguf:missing.gguf"])
    assert bad == 1 and "option quantization     FAIL: ModelLoadError" in capsys.readouterr().out
