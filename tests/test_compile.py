"""Graph compile policy per device (devices.compile), a real compile on CPU, group offload (MEMORY_MODE=group)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from devices import DeviceManager
from devices import compile as graph_compile
from pipelines import GenerationRequest, ImagePipeline
from pipelines.run.options import PipelineOptions
from tests import fakes


# ---------------------------------------------------------------- the policy, per simulated device
@pytest.mark.parametrize("hip", [None, "6.2"])
def test_cuda_and_rocm_compile_with_inductor(monkeypatch, hip):
    fakes.no_accelerators(monkeypatch)
    fakes.fake_cuda(monkeypatch, hip=hip)
    dm = DeviceManager("auto")
    assert dm.backend == ("rocm" if hip else "cuda")
    plan = graph_compile.plan(dm.backend)
    assert plan.enabled and plan.compiler == "inductor"
    assert not graph_compile.plan(dm.backend, "off").enabled


def test_xpu_compiles_with_inductor(monkeypatch):
    fakes.no_accelerators(monkeypatch)
    fakes.fake_xpu(monkeypatch)
    assert graph_compile.plan(DeviceManager("auto").backend).compiler == "inductor"


def test_npu_without_torchair_is_off_with_the_reason(monkeypatch):
    fakes.no_accelerators(monkeypatch)
    fakes.fake_npu(monkeypatch)
    monkeypatch.setitem(sys.modules, "torchair", None)  # `import torchair` fails, whatever this machine has
    dm = DeviceManager("auto")
    assert dm.backend == "npu"
    for mode in ("auto", "on"):  # asking for it does not bring inductor onto Ascend
        plan = graph_compile.plan(dm.backend, mode)
        assert not plan.enabled and "torchair" in plan.reason and "slower" in plan.reason


def test_npu_with_torchair_uses_its_backend(monkeypatch):
    fakes.no_accelerators(monkeypatch)
    fakes.fake_npu(monkeypatch)
    module = types.ModuleType("torchair")
    module.__spec__ = types.SimpleNamespace(name="torchair", loader=None, origin="fake")
    module.CompilerConfig = lambda: "config"
    module.get_npu_backend = lambda compiler_config: ("npu backend", compiler_config)
    monkeypatch.setitem(sys.modules, "torchair", module)
    plan = graph_compile.plan(DeviceManager("auto").backend)
    assert plan.enabled and plan.compiler == "torchair"
    assert graph_compile._backend("torchair") == ("npu backend", "config")


def test_mps_and_cpu_compile_only_when_asked(monkeypatch):
    fakes.no_accelerators(monkeypatch)
    fakes.fake_mps(monkeypatch)
    for backend in (DeviceManager("auto").backend, "cpu"):
        plan = graph_compile.plan(backend)
        assert not plan.enabled and "COMPILE=on" in plan.reason
        asked = graph_compile.plan(backend, "on")
        assert asked.enabled and asked.compiler == "inductor"


def test_compile_setting_is_read_once_and_checked():
    assert PipelineOptions().compile == "auto"
    assert PipelineOptions.from_env({"COMPILE": " ON "}).compile == "on"
    with pytest.raises(ValueError, match="COMPILE='fast' is not valid: expected one of auto, on, off"):
        PipelineOptions.from_env({"COMPILE": "fast"})


# ---------------------------------------------------------------- a real compile on this CPU
def _render(pipeline: ImagePipeline, batch: int) -> np.ndarray:
    request = GenerationRequest(prompt="a red circle", num_images=batch, steps=2, seed=7)
    return np.stack([np.asarray(im, dtype=np.float32) / 255 for im in pipeline.generate(request).images])


def test_compile_on_cpu_gives_the_eager_images(tiny_model_dir):
    """COMPILE=on: regional compile (the UNet declares BasicTransformerBlock) at load with a warm-up;
    the same images as eager, and a second batch size reuses the graph (dynamic=True)."""
    from torch._dynamo.utils import counters

    dm = DeviceManager("cpu", "float32", "sdpa")
    eager = ImagePipeline.from_pretrained(tiny_model_dir, dm, compile="off")
    assert eager.compile.startswith("no compile") and eager.compile_seconds == 0.0
    compiled = ImagePipeline.from_pretrained(tiny_model_dir, dm, compile="on")
    assert compiled.compile.startswith("compiled: unet repeated blocks (BasicTransformerBlock), inductor")
    assert compiled.compile_seconds > 0 and compiled.status()[0].compile == compiled.compile
    graphs = counters["stats"]["unique_graphs"]  # what dynamo has compiled so far (the load's warm-up)
    for batch in (1, 2):
        got = _render(compiled, batch)
        assert counters["stats"]["unique_graphs"] == graphs, f"batch size {batch} compiled a new graph"
        assert np.abs(got - _render(eager, batch)).max() <= 2 / 255  # 8-bit images: at most a rounding step


# ---------------------------------------------------------------- group offload
@pytest.fixture
def raw_pipe(tiny_model_dir):
    from diffusers import StableDiffusionPipeline

    return StableDiffusionPipeline.from_pretrained(tiny_model_dir)


def test_group_offload_is_applied_and_reported(monkeypatch, raw_pipe):
    from diffusers.hooks.group_offloading import _is_group_offload_enabled

    from devices.manager import weights_placement

    fakes.no_accelerators(monkeypatch)
    fakes.fake_mps(monkeypatch)  # an accelerator without streams: use_stream stays off
    dm = DeviceManager("auto")
    savers = dm.set_memory_efficient_mode(raw_pipe, "group-leaf")
    assert savers[-1] == "group_offload_leaf" and "vae_slicing" in savers
    assert _is_group_offload_enabled(raw_pipe.unet) and _is_group_offload_enabled(raw_pipe.vae)
    assert weights_placement(savers) == "group offload (leaf)"
    assert weights_placement(["vae_slicing"]) == "on device"


def test_group_offload_uses_streams_where_the_device_has_them(monkeypatch, raw_pipe):
    fakes.no_accelerators(monkeypatch)
    fakes.fake_cuda(monkeypatch)
    seen = {}
    monkeypatch.setattr(raw_pipe, "enable_group_offload", lambda **kw: seen.update(kw))
    savers = DeviceManager("auto").set_memory_efficient_mode(raw_pipe, "group")
    assert savers[-1] == "group_offload_block"
    assert seen["use_stream"] is True and seen["offload_type"] == "block_level" and seen["num_blocks_per_group"] == 1


def test_group_offload_is_refused_on_cpu_with_the_reason(raw_pipe, tiny_model_dir):
    dm = DeviceManager("cpu")
    with pytest.raises(ValueError, match="MEMORY_MODE=group: group offload keeps weights in CPU RAM"):
        dm.set_memory_efficient_mode(raw_pipe, "group")
    with pytest.raises(ValueError, match="invalid memory level 'group-block'"):
        dm.set_memory_efficient_mode(raw_pipe, "group-block")


def test_the_status_panel_says_where_the_weights_are(tiny_model_dir):
    from ui.status import status_json, status_markdown

    pipeline = ImagePipeline.from_pretrained(tiny_model_dir, DeviceManager("cpu"), memory_mode="balanced")
    replicas = pipeline.status()
    assert replicas[0].weights == "on device"
    text = status_markdown(replicas, [])
    assert "weights: on device · no compile: off by default on CPU" in text
    assert status_json(replicas)["weights"] == "on device"


def test_zero_gpu_compiles_only_when_asked():
    """ZeroGPU attaches the GPU inside spaces.GPU calls only: no warm-up at load there unless COMPILE=on."""
    from engine.settings import AppSettings

    assert AppSettings.from_env({"SPACES_ZERO_GPU": "1"}).pipeline.compile == "off"
    assert AppSettings.from_env({"SPACES_ZERO_GPU": "1", "COMPILE": "on"}).pipeline.compile == "on"
    assert AppSettings.from_env({}).pipeline.compile == "auto"


def test_a_failing_compile_falls_back_to_eager(tiny_model_dir, monkeypatch):
    """Compile is on by default on GPUs: a family whose graph cannot compile must still load and run."""
    monkeypatch.setattr(graph_compile, "plan", lambda backend, mode: graph_compile.CompilePlan(True, "no-such", "test"))
    pipeline = ImagePipeline.from_pretrained(tiny_model_dir, DeviceManager("cpu"), compile="on")
    assert pipeline.compile.startswith("compile failed, running eager:") and pipeline.compile_seconds == 0.0
    assert not any(getattr(m, "_compiled_call_impl", None) for m in pipeline.pipe.unet.modules())
    assert len(_render(pipeline, 1)) == 1


def test_edit_only_models_warm_up_with_an_input_image():
    from pipelines.run import model_setup
    from pipelines.run.options import REPO_ROOT

    editor = ImagePipeline.from_pretrained(REPO_ROOT / "models" / "tiny-shapes-edit", DeviceManager("cpu"))
    assert not editor.traits.text_to_image
    requests = model_setup._warm_up_requests(editor, 2)
    assert [r.num_images for r in requests] == [1, 2] and all(r.init_images for r in requests)
    assert len(editor.generate(requests[0]).images) == 1  # a request the model accepts
