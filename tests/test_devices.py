"""DeviceManager on simulated backends: selection, fallback, dtype/attention policy, memory."""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from config import SettingsError
from devices import DeviceFallbackWarning, DeviceManager
from devices import memory as devices_memory
from devices.compile import plan as compile_plan
from devices.memory import STATS_KEYS
from devices.options import DeviceSettings
from devices.pool import devices_for
from tests import fakes
from tests.fakes import GiB

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def cpu_only(monkeypatch):
    fakes.no_accelerators(monkeypatch)


# ---------------------------------------------------------------- parsing
@pytest.mark.parametrize("value", ["auto", "CPU", "  cpu  ", "Auto "])
def test_accepts_case_and_whitespace(value):
    assert DeviceManager(value).backend == "cpu"


@pytest.mark.parametrize("value", ["gpu", "cuda:x", "cpu:1", "mps:0", "tpu:x", "vulkan:0", "cuda:-1"])
def test_invalid_device_lists_valid_values(value):
    with pytest.raises(ValueError) as err:
        DeviceManager(value)
    assert value in str(err.value)
    assert "cuda:N" in str(err.value) and "npu" in str(err.value) and "mps" in str(err.value)


def test_none_is_auto_and_the_settings_come_from_an_entry_point(monkeypatch):
    """A library constructor never reads the environment: DeviceManager() is auto whatever
    PREFERRED_DEVICE says; the settings read by an entry point give the device, an argument wins."""
    fakes.fake_cuda(monkeypatch, count=2)
    monkeypatch.setenv("PREFERRED_DEVICE", "cpu")
    monkeypatch.setenv("TORCH_DTYPE", "not-a-dtype")  # would raise if anything read it
    assert DeviceManager().device == torch.device("cuda", 0)
    settings = DeviceSettings.from_env({"PREFERRED_DEVICE": "cpu"})
    assert DeviceManager(options=settings.options_for()).backend == "cpu"
    assert DeviceManager(options=settings.options_for("cuda:1")).device == torch.device("cuda", 1)


# ---------------------------------------------------------------- selection and priority
def test_plain_cpu_machine():
    dm = DeviceManager()
    assert (dm.backend, dm.device, dm.dtype, dm.attention) == ("cpu", torch.device("cpu"), torch.float32, "sdpa")
    assert dm.fallback_reason is None
    assert dm.device_name


def test_auto_priority(monkeypatch):
    fakes.fake_mps(monkeypatch)
    assert DeviceManager().backend == "mps"
    fakes.fake_xpu(monkeypatch)
    assert DeviceManager().backend == "xpu"
    fakes.fake_npu(monkeypatch)
    assert DeviceManager().backend == "npu"
    fakes.fake_cuda(monkeypatch)
    assert DeviceManager().backend == "cuda"


def test_cuda_index_and_name(monkeypatch):
    fakes.fake_cuda(monkeypatch, count=2, name="NVIDIA L4")
    dm = DeviceManager("cuda:1")
    assert dm.device == torch.device("cuda", 1)
    assert dm.device_name == "NVIDIA L4 #1"


def test_npu_index(monkeypatch):
    fakes.fake_npu(monkeypatch, count=2)
    dm = DeviceManager("npu:1")
    assert (dm.backend, dm.device.type, dm.device.index) == ("npu", "npu", 1)
    assert dm.device_name == "Ascend910B3 #1"


def test_rocm_is_cuda_api_on_hip(monkeypatch):
    fakes.fake_cuda(monkeypatch, hip="6.2.41133", name="AMD Instinct MI300X")
    for request in ("rocm", "cuda", "auto"):
        dm = DeviceManager(request)
        assert dm.backend == "rocm" and dm.device == torch.device("cuda", 0)
        assert dm.fallback_reason is None


# ---------------------------------------------------------------- fallbacks
def _fallback(request: str) -> tuple[DeviceManager, str]:
    with pytest.warns(DeviceFallbackWarning) as record:
        dm = DeviceManager(request)
    return dm, str(record[0].message)


def test_npu_not_installed_falls_back_to_cpu():
    dm, message = _fallback("npu")
    assert dm.backend == "cpu"
    assert dm.fallback_reason == "torch_npu is not installed (see requirements-npu.txt)"
    assert "npu" in message and "torch_npu is not installed" in message and "using cpu" in message


def test_npu_installed_but_not_visible(monkeypatch):
    fakes.fake_npu(monkeypatch, count=0)
    dm, message = _fallback("npu")
    assert "no NPU visible" in dm.fallback_reason and "using cpu" in message


def test_npu_import_broken_names_cann(monkeypatch):
    fakes.fake_npu(monkeypatch, import_error=OSError("libhccl.so: cannot open shared object file"))
    dm, _ = _fallback("npu:0")
    assert "libhccl.so" in dm.fallback_reason and "CANN" in dm.fallback_reason


def test_cuda_index_out_of_range_falls_back_to_cuda0(monkeypatch):
    fakes.fake_cuda(monkeypatch, count=1)
    dm, message = _fallback("cuda:3")
    assert dm.device == torch.device("cuda", 0)
    assert dm.fallback_reason == "cuda:3 requested but 1 device(s) visible"
    assert "cuda:3" in message and "using cuda:0" in message


def test_cuda_on_cpu_build_falls_back_to_best(monkeypatch):
    fakes.fake_mps(monkeypatch)
    dm, message = _fallback("cuda")
    assert dm.backend == "mps" and "using mps" in message


def test_rocm_requested_on_cuda_build(monkeypatch):
    fakes.fake_cuda(monkeypatch)
    dm, _ = _fallback("rocm")
    assert dm.backend == "cuda" and "not a ROCm" in dm.fallback_reason


def test_xpu_and_mps_unavailable_messages():
    assert "XPU" in _fallback("xpu:0")[0].fallback_reason
    assert "MPS" in _fallback("mps")[0].fallback_reason


def test_strict_mode_raises():
    strict = DeviceSettings.from_env({"PREFERRED_DEVICE_STRICT": "1"})
    with pytest.raises(RuntimeError, match="torch_npu is not installed"):
        DeviceManager(options=strict.options_for("npu"))
    assert DeviceManager(options=strict.options_for("cpu")).backend == "cpu"  # a usable request is fine in strict mode


# ---------------------------------------------------------------- dtype table
@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda mp: fakes.fake_cuda(mp, bf16=True), torch.bfloat16),
        (lambda mp: fakes.fake_cuda(mp, bf16=False), torch.float16),
        (lambda mp: fakes.fake_cuda(mp, hip="6.2"), torch.bfloat16),
        (lambda mp: fakes.fake_npu(mp, bf16=True), torch.bfloat16),
        (lambda mp: fakes.fake_npu(mp, bf16=False), torch.float16),
        (lambda mp: fakes.fake_xpu(mp), torch.bfloat16),
        (lambda mp: fakes.fake_mps(mp), torch.float32),
        (lambda mp: None, torch.float32),
    ],
)
def test_dtype_table(monkeypatch, setup, expected):
    setup(monkeypatch)
    assert DeviceManager().dtype == expected


def test_dtype_overrides(monkeypatch):
    fakes.fake_cuda(monkeypatch)
    assert (
        DeviceManager(options=DeviceSettings.from_env({"TORCH_DTYPE": "float32"}).options_for()).dtype == torch.float32
    )
    assert DeviceManager(dtype="fp16").dtype == torch.float16
    assert DeviceManager(dtype=torch.bfloat16).dtype == torch.bfloat16
    with pytest.raises(ValueError, match="float64"):
        DeviceManager(dtype="float64")


# ---------------------------------------------------------------- attention policy
@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (fakes.fake_npu, "vanilla"),
        (fakes.fake_mps, "vanilla"),
        (fakes.fake_cuda, "sdpa"),
        (fakes.fake_xpu, "sdpa"),
        (lambda mp: None, "sdpa"),
    ],
)
def test_attention_policy(monkeypatch, setup, expected):
    setup(monkeypatch)
    assert DeviceManager().attention == expected


def attention_from_settings(value: str, device: str | None = None) -> DeviceManager:
    """The DeviceManager an entry point builds with DIFFUSERS_ATTENTION_TYPE=value."""
    return DeviceManager(options=DeviceSettings.from_env({"DIFFUSERS_ATTENTION_TYPE": value}).options_for(device))


def test_attention_setting_overrides_the_policy(monkeypatch):
    fakes.fake_npu(monkeypatch)
    assert attention_from_settings("sdpa").attention == "sdpa"
    assert attention_from_settings(" Vanilla ", "cpu").attention == "vanilla"
    with pytest.raises(
        SettingsError, match="DIFFUSERS_ATTENTION_TYPE='flash' is not valid: expected one of vanilla, sdpa"
    ):
        attention_from_settings("flash")
    with pytest.raises(ValueError, match="vanilla, sdpa"):
        DeviceManager(attention="flash")


def _tiny_unet():
    from tests.tiny_model import build_tiny_pipeline

    return build_tiny_pipeline().unet


def test_apply_attention_really_swaps_processors():
    from diffusers.models.attention_processor import AttnProcessor, AttnProcessor2_0

    unet = _tiny_unet()
    x, t, ctx = torch.randn(1, 4, 16, 16), torch.tensor([10]), torch.randn(1, 5, 32)
    with torch.no_grad():
        applied = DeviceManager(attention="vanilla").apply_attention(unet)
        assert applied == {"UNet2DConditionModel": "AttnProcessor"}
        assert {type(p) for p in unet.attn_processors.values()} == {AttnProcessor}
        vanilla = unet(x, t, ctx).sample
        DeviceManager(attention="sdpa").apply_attention(unet)
        assert {type(p) for p in unet.attn_processors.values()} == {AttnProcessor2_0}
        sdpa = unet(x, t, ctx).sample
    torch.testing.assert_close(vanilla, sdpa, atol=1e-4, rtol=1e-4)


def test_apply_attention_covers_every_pipeline_component():
    from tests.tiny_model import build_tiny_pipeline

    pipe = build_tiny_pipeline()
    applied = DeviceManager(attention="vanilla").apply_attention(pipe)
    assert applied == {
        "unet": "AttnProcessor",
        "vae": "AttnProcessor",
        "text_encoder": "attn_implementation eager",
    }
    assert pipe.text_encoder.config._attn_implementation == "eager"


def test_apply_attention_reports_what_it_cannot_switch(caplog):
    unet = _tiny_unet()

    class CustomProcessor:
        def __call__(self, attn, hidden_states, *args, **kwargs):
            return hidden_states

    unet.set_attn_processor(CustomProcessor())
    applied = DeviceManager().apply_attention(unet)
    assert applied["UNet2DConditionModel"].startswith("unchanged: custom attention processors CustomProcessor")
    assert "keeps its custom attention processors CustomProcessor" in caplog.text


# ---------------------------------------------------------------- generator
def test_generator_is_cpu_and_reproducible():
    dm = DeviceManager()
    a = torch.randn(4, 16, generator=dm.create_generator(42))
    b = torch.randn(4, 16, generator=dm.create_generator(42))
    c = torch.randn(4, 16, generator=dm.create_generator(43))
    assert dm.create_generator(1).device.type == "cpu"
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_generator_is_cpu_on_accelerators(monkeypatch):
    fakes.fake_cuda(monkeypatch)
    assert DeviceManager().create_generator(1).device == torch.device("cpu")


# ---------------------------------------------------------------- memory
MEMORY_KEYS = set(STATS_KEYS)


def test_memory_stats_npu_from_torch_npu(monkeypatch):
    fakes.fake_npu(monkeypatch)
    stats = DeviceManager().memory_stats()
    assert set(stats) == MEMORY_KEYS
    assert (stats["allocated"], stats["reserved"], stats["peak"]) == (3 * GiB, 4 * GiB, 5 * GiB)
    assert (stats["free"], stats["total"]) == (20 * GiB, 64 * GiB)
    assert stats["host_total"] > stats["host_available"] > 0


def test_memory_stats_cuda_and_xpu(monkeypatch):
    fakes.fake_cuda(monkeypatch)
    assert DeviceManager().memory_stats()["total"] == 64 * GiB
    fakes.no_accelerators(monkeypatch)
    fakes.fake_xpu(monkeypatch)
    assert DeviceManager().memory_stats()["peak"] == 5 * GiB


def test_memory_stats_mps(monkeypatch):
    fakes.fake_mps(monkeypatch)
    stats = DeviceManager().memory_stats()
    assert (stats["allocated"], stats["reserved"], stats["total"]) == (2 * GiB, 3 * GiB, 16 * GiB)
    assert stats["free"] == 13 * GiB and stats["peak"] is None


def test_memory_stats_cpu_is_host_memory():
    dm = DeviceManager()
    stats = dm.memory_stats()
    assert set(stats) == MEMORY_KEYS
    assert stats["allocated"] > 0 and stats["total"] == stats["host_total"]
    assert "RAM" in dm.format_memory() and "free" in dm.format_memory()


@pytest.mark.skipif(not os.access("/proc/self/clear_refs", os.W_OK), reason="cannot reset the peak RSS (VmHWM) here")
def test_cpu_peak_rises_by_a_64_mib_allocation():
    MiB = 1024 * 1024
    dm = DeviceManager()
    dm.reset_peak_memory()  # the peak drops to the current RSS, so a new allocation must raise it
    before = dm.memory_stats()
    big = torch.ones(64 * MiB // 4)  # 64 MiB, every page written
    after = dm.memory_stats()
    rise = (after["peak"] - before["peak"]) / MiB
    assert rise >= 56, f"peak rose by {rise:.1f} MiB after a 64 MiB allocation"
    assert after["peak"] >= after["allocated"] >= before["allocated"] + 56 * MiB
    del big


def test_cpu_peak_resets_where_the_kernel_ignores_clear_refs(monkeypatch, tmp_path):
    """Some kernels accept the clear_refs write and keep VmHWM (the CI machine did): the peak
    after a reset must still start from today's use, not the process's lifetime peak."""
    MiB = 1024 * 1024
    spike = torch.ones(192 * MiB // 4)  # raise the lifetime peak well above today's use
    del spike
    monkeypatch.setattr(devices_memory, "CLEAR_REFS", str(tmp_path / "clear_refs"))  # written, ignored
    dm = DeviceManager()
    dm.reset_peak_memory()
    before = dm.memory_stats()
    assert before["peak"] < before["allocated"] + 32 * MiB, "the peak still holds the spike from before the reset"
    big = torch.ones(64 * MiB // 4)
    after = dm.memory_stats()
    assert (after["peak"] - before["peak"]) / MiB >= 56
    del big
    dm.reset_peak_memory()
    before = dm.memory_stats()
    brief = torch.ones(96 * MiB // 4)  # a step's working memory, gone before the result is read
    dm.sample_peak()  # what each denoising step does (pipelines.run.callbacks)
    del brief
    assert (dm.memory_stats()["peak"] - before["peak"]) / MiB >= 88


def test_cpu_peak_holds_a_steps_allocation_where_vmhwm_is_no_high_water_mark(monkeypatch):
    """A kernel whose VmHWM just follows the resident set: the samples still hold a step's peak."""
    import psutil

    MiB = 1024 * 1024
    monkeypatch.setattr(devices_memory, "_proc_status_kb", lambda field: psutil.Process().memory_info().rss)
    dm = DeviceManager()
    dm.reset_peak_memory()
    before = dm.memory_stats()
    brief = torch.ones(96 * MiB // 4)
    dm.sample_peak()
    del brief
    assert (dm.memory_stats()["peak"] - before["peak"]) / MiB >= 88


def test_cache_sync_peak_use_the_npu_namespace_never_cuda(monkeypatch):
    npu_calls = fakes.fake_npu(monkeypatch)

    def cuda_forbidden(*_a, **_k):
        raise AssertionError("torch.cuda called on an NPU")

    for name in ("empty_cache", "synchronize", "reset_peak_memory_stats", "memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, cuda_forbidden)
    dm = DeviceManager()
    dm.empty_cache()
    dm.synchronize()
    dm.reset_peak_memory()
    dm.memory_stats()
    assert {"empty_cache", "synchronize", "reset_peak_memory_stats", "memory_allocated"} <= set(npu_calls)
    assert "NPU" in dm.format_memory()


def test_cpu_cache_calls_are_noops(monkeypatch):
    def forbidden(*_a, **_k):
        raise AssertionError("device call on CPU")

    monkeypatch.setattr(torch.cuda, "empty_cache", forbidden)
    dm = DeviceManager()
    dm.empty_cache()
    dm.synchronize()
    dm.reset_peak_memory()


# ---------------------------------------------------------------- safetensors
def test_load_safetensors(tmp_path):
    from safetensors.torch import save_file

    path = tmp_path / "w.safetensors"
    save_file({"a": torch.arange(6.0).reshape(2, 3)}, str(path))
    loaded = DeviceManager.load_safetensors(path)
    assert loaded["a"].device.type == "cpu" and loaded["a"].sum().item() == 15
    with pytest.raises(FileNotFoundError, match=r"missing\.safetensors"):
        DeviceManager.load_safetensors(tmp_path / "missing.safetensors")
    corrupt = tmp_path / "corrupt.safetensors"
    corrupt.write_bytes(path.read_bytes()[:20])
    with pytest.raises(ValueError, match="not a valid safetensors"):
        DeviceManager.load_safetensors(corrupt)


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch PICKLE_RAN",))


def test_load_safetensors_never_unpickles(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fake = tmp_path / "evil.safetensors"
    fake.write_bytes(pickle.dumps({"w": _Exploit()}))
    with pytest.raises(ValueError):
        DeviceManager.load_safetensors(fake)
    assert not (tmp_path / "PICKLE_RAN").exists()


# ---------------------------------------------------------------- memory-efficient mode
class _FakeVae:
    def __init__(self):
        self.enabled = []

    def enable_slicing(self):
        self.enabled.append("slicing")

    def enable_tiling(self):
        self.enabled.append("tiling")


class _FakePipe:
    def __init__(self, weights_bytes: int):
        self.vae = _FakeVae()
        self.calls = []
        self.components = {"unet": torch.nn.Linear(weights_bytes // 4, 1, bias=False)}

    def enable_attention_slicing(self):
        self.calls.append("attention_slicing")

    def enable_model_cpu_offload(self, device=None):
        self.calls.append(f"offload:{device}")


def test_memory_efficient_levels(monkeypatch):
    dm = DeviceManager()
    assert dm.set_memory_efficient_mode(_FakePipe(1024), "off") == []
    assert dm.set_memory_efficient_mode(_FakePipe(1024), "auto") == []  # plenty of RAM
    # sdpa (the CPU default): no attention slicing, it would replace the chosen kernel
    assert dm.set_memory_efficient_mode(_FakePipe(1024), "max") == ["vae_slicing", "vae_tiling"]
    with pytest.raises(ValueError, match="valid values"):
        dm.set_memory_efficient_mode(_FakePipe(1024), "extreme")


def test_memory_efficient_auto_on_a_full_gpu(monkeypatch):
    fakes.fake_cuda(monkeypatch)  # 20 GiB free
    dm = DeviceManager()
    big = _FakePipe(4 * 1024 * 1024)
    monkeypatch.setattr("devices.manager.model_bytes", lambda pipe: 19 * GiB)
    assert dm.set_memory_efficient_mode(big) == ["vae_slicing", "vae_tiling", "model_cpu_offload"]
    assert big.calls == ["offload:cuda:0"]  # sdpa on CUDA: attention slicing would replace it
    monkeypatch.setattr("devices.manager.model_bytes", lambda pipe: 12 * GiB)
    assert "model_cpu_offload" not in dm.set_memory_efficient_mode(_FakePipe(1024))


def test_no_attention_slicing_on_mps(monkeypatch):
    fakes.fake_mps(monkeypatch)
    assert DeviceManager().set_memory_efficient_mode(_FakePipe(1024), "balanced") == ["vae_slicing", "vae_tiling"]


# ---------------------------------------------------------------- report and CLI
def test_describe_lists_every_backend(monkeypatch):
    fakes.fake_xpu(monkeypatch)
    text = DeviceManager().describe()
    for line in ("cuda   no", "npu    no", "tpu    no", "xpu    yes", "mps    no", "vulkan no", "cpu    yes", "torch_npu is not installed"):
        assert line in text
    assert "Intel Arc A770" in text and "bfloat16" in text


def test_cli_npu_fallback_report_and_json():
    env = {k: v for k, v in os.environ.items() if k not in ("PREFERRED_DEVICE_STRICT", "TORCH_DTYPE")}
    env.update(PREFERRED_DEVICE="npu", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    run = subprocess.run(
        [sys.executable, "-m", "devices"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "PREFERRED_DEVICE=npu is not usable: torch_npu is not installed" in run.stderr
    assert run.stderr.count("is not usable") == 1
    assert "Device:    cpu" in run.stdout and "Backends:" in run.stdout
    run = subprocess.run(
        [sys.executable, "-m", "devices", "--json"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    report = json.loads(run.stdout)
    assert report["backend"] == "cpu" and report["requested"] == "npu"
    assert report["fallback_reason"].startswith("torch_npu is not installed")
    assert set(report["memory"]) == MEMORY_KEYS
    assert report["backends"]["npu"]["available"] is False


# ---------------------------------------------------------------- Vulkan (experimental, asked for only)
def test_vulkan_is_reported_in_its_place_but_never_chosen_automatically(monkeypatch):
    fakes.fake_vulkan(monkeypatch)
    dm = DeviceManager()
    assert dm.backend == "cpu"  # auto passes over it: diffusers' ops are missing there
    rows = list(dm.report()["backends"])
    assert rows.index("mps") < rows.index("vulkan") < rows.index("cpu")  # CUDA/ROCm > XPU > MPS > Vulkan > CPU
    vulkan = dm.report()["backends"]["vulkan"]
    assert vulkan["available"] and "experimental" in vulkan["reason"] and "group norm" in vulkan["reason"]
    assert devices_for("all") == ["cpu"]
    fakes.fake_cuda(monkeypatch)
    assert DeviceManager().backend == "cuda"


def test_vulkan_when_asked_for_runs_fp32_vanilla_attention_without_compile(monkeypatch, caplog):
    fakes.fake_vulkan(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="devices.manager"):
        dm = DeviceManager("Vulkan")
    assert (dm.backend, dm.device, dm.dtype, dm.attention) == ("vulkan", torch.device("vulkan"), torch.float32, "vanilla")
    assert "experimental" in caplog.text
    assert not compile_plan("vulkan", "on").enabled and "Vulkan" in compile_plan("vulkan", "on").reason
    assert set(dm.memory_stats()) >= MEMORY_KEYS and dm.memory_stats()["total"] is None  # no figure, no error
    assert devices_for("vulkan:all") == ["vulkan"]
    with pytest.raises(ValueError, match="valid values"):
        DeviceManager("vulkan:0")


def test_vulkan_on_a_torch_without_it_falls_back_and_says_why():
    with pytest.warns(DeviceFallbackWarning, match="built without Vulkan"):
        assert DeviceManager("vulkan").backend == "cpu"


# ---------------------------------------------------------------- TPU (JAX devices through torchax)
def test_a_simulated_tpu_vm_when_asked_for_has_bf16_sdpa_jax_memory_and_synchronisation():
    """tests/tpu_sim.py fakes jax and torchax in a fresh process (torchax renames privateuse1 to "jax")."""
    run = subprocess.run(
        [sys.executable, "-m", "tests.tpu_sim"], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["auto"] == "cpu"  # asked for only: the TPU route runs the UNet families, the CPU every model
    assert out["first"] == ["tpu", "jax:0", "bfloat16", "sdpa", "TPU v5 lite #0"]
    assert out["second"] == ["tpu", "jax:1", "float32"]  # tpu:N, and fp32 when asked
    memory = out["memory"]
    assert (memory["allocated"], memory["peak"], memory["total"]) == (2 * GiB, 3 * GiB, 16 * GiB)
    assert memory["free"] == 14 * GiB and out["syncs"] == [1]  # synchronize() waited on device 1
    assert out["report"]["available"] and out["report"]["device_count"] == 4
    assert out["report"]["reason"].startswith("4 TPU device(s) visible (TPU v5 lite) (not chosen automatically")
    assert out["compile"].startswith("no compile") and "torchax" in out["compile"]
    assert out["load"].startswith("cannot load models/tiny-shapes on tpu: tpu:1: one chip other than the first")


def test_tpu_without_jax_falls_back_and_names_the_requirements_file():
    with pytest.warns(DeviceFallbackWarning, match="requirements-tpu.txt"):
        assert DeviceManager("tpu").backend == "cpu"
    assert DeviceManager().report()["backends"]["tpu"]["available"] is False
