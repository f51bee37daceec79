"""DIFFUSERS_ATTENTION_TYPE=npu: Ascend's fused attention, chosen explicitly, on a simulated NPU.

On real hardware, check it with the parity command in docs/models.md ("Model families"): the same seeds
with `--attention npu` against vanilla.
"""

from __future__ import annotations

import sys

import pytest
import torch
import torch.nn.functional as F

from devices import DeviceManager
from devices.attention import apply_attention
from tests import fakes, families


def _fusion_attention(calls):
    """torch_npu.npu_fusion_attention's contract (BNSD layout, returns a tuple), computed with SDPA."""

    def npu_fusion_attention(q, k, v, head_num, input_layout, **kwargs):
        calls.append((tuple(q.shape), head_num, input_layout, q.dtype))
        return (F.scaled_dot_product_attention(q, k, v),)

    return npu_fusion_attention


@pytest.fixture
def npu_with_fused_attention(monkeypatch):
    """A fake NPU whose torch_npu has npu_fusion_attention, seen by diffusers as installed."""
    import diffusers.models.attention_dispatch as dispatch
    import diffusers.models.attention_processor as processors

    fakes.no_accelerators(monkeypatch)
    fakes.fake_npu(monkeypatch)
    calls: list = []
    monkeypatch.setattr(sys.modules["torch_npu"], "npu_fusion_attention", _fusion_attention(calls), raising=False)
    # Only the attention code sees torch_npu (GEGLU etc. would call other torch_npu kernels).
    monkeypatch.setattr(processors, "is_torch_npu_available", lambda: True)
    monkeypatch.setattr(dispatch, "_CAN_USE_NPU_ATTN", True)
    monkeypatch.setattr(dispatch, "npu_fusion_attention", _fusion_attention(calls))
    monkeypatch.setattr(processors, "torch_npu", sys.modules["torch_npu"], raising=False)
    return calls


def test_npu_attention_needs_an_npu(monkeypatch):
    fakes.no_accelerators(monkeypatch)
    with pytest.raises(ValueError, match="fused attention, but the device is cpu"):
        DeviceManager("cpu", attention="npu")


def test_npu_attention_needs_the_fused_op(monkeypatch):
    fakes.no_accelerators(monkeypatch)
    fakes.fake_npu(monkeypatch)  # a torch_npu without npu_fusion_attention
    with pytest.raises(RuntimeError, match="has no npu_fusion_attention"):
        DeviceManager("npu", attention="npu")


def test_default_on_npu_stays_vanilla(monkeypatch):
    fakes.no_accelerators(monkeypatch)
    fakes.fake_npu(monkeypatch)
    assert DeviceManager("npu").attention == "vanilla"


def test_npu_attention_selects_diffusers_npu_processor_and_backend(npu_with_fused_attention, tmp_path):
    from diffusers import DiffusionPipeline

    dm = DeviceManager("npu", attention="npu")
    assert dm.attention == "npu"
    sd = DiffusionPipeline.from_pretrained(families.build("sd15", tmp_path / "sd15"))
    applied = apply_attention(sd, dm.attention)
    assert applied["unet"] == applied["vae"] == "AttnProcessorNPU"
    assert applied["text_encoder"] == "attn_implementation sdpa"
    flux = DiffusionPipeline.from_pretrained(families.build("flux", tmp_path / "flux"))
    applied = apply_attention(flux, dm.attention)
    assert applied["transformer"] == "attention backend _native_npu"
    backends = {p._attention_backend for p in flux.transformer.attn_processors.values()}
    assert {str(getattr(b, "value", b)) for b in backends} == {"_native_npu"}


def test_npu_processor_really_calls_the_fused_op(npu_with_fused_attention, tmp_path):
    """In half precision (as on an NPU) the UNet's attention goes through npu_fusion_attention."""
    from diffusers import DiffusionPipeline

    calls = npu_with_fused_attention
    sd = DiffusionPipeline.from_pretrained(families.build("sd15", tmp_path / "sd15"), dtype=torch.bfloat16)
    apply_attention(sd, DeviceManager("npu", attention="npu").attention)
    unet = sd.unet
    with torch.no_grad():
        unet(
            torch.randn(1, 4, 8, 8, dtype=torch.bfloat16),
            10,
            encoder_hidden_states=torch.randn(1, 77, 32, dtype=torch.bfloat16),
        )
    assert calls and all(layout == "BNSD" and dtype == torch.bfloat16 for _, _, layout, dtype in calls)


def test_attention_type_npu_end_to_end(npu_with_fused_attention, monkeypatch, tiny_model_dir):
    """DIFFUSERS_ATTENTION_TYPE=npu from the environment to the images, as far as a CPU machine allows:
    the app's settings check accepts it, the backend the app builds (engine.build_backend) gets a
    DeviceManager on the NPU with attention "npu", the loaded pipeline's UNet and VAE run
    AttnProcessorNPU, and a generation goes through npu_fusion_attention and says so in its metadata.
    Only the weights stay on the CPU (the simulated NPU holds no tensors)."""
    from diffusers import DiffusionPipeline

    from app import check_settings
    from engine import build_backend
    from pipelines import GenerationRequest

    calls = npu_with_fused_attention
    monkeypatch.setenv("DIFFUSERS_ATTENTION_TYPE", "npu")
    monkeypatch.setenv("EDIT_MODEL_ID", "none")
    settings, args = check_settings([])
    moved: list = []
    monkeypatch.setattr(DiffusionPipeline, "to", lambda self, *a, **k: moved.append(str(a[0])) or self)
    backend = build_backend(settings, str(tiny_model_dir), args.device)

    (replica,) = backend.replicas
    assert (replica.dm.backend, replica.dm.attention, replica.dm.dtype) == ("npu", "npu", torch.bfloat16)
    assert moved == ["npu:0"]
    assert {type(p).__name__ for p in replica.pipe.unet.attn_processors.values()} == {"AttnProcessorNPU"}
    assert {type(p).__name__ for p in replica.pipe.vae.attn_processors.values()} == {"AttnProcessorNPU"}
    assert backend.status()[0].attention == "npu"

    calls.clear()
    result = backend.generate(GenerationRequest(prompt="a red circle", steps=2, width=32, height=32, seed=1))
    assert len(result.images) == 1 and result.attention == "npu"
    assert result.metadata[0]["attention_components"] == {
        "unet": "AttnProcessorNPU",
        "vae": "AttnProcessorNPU",
        "text_encoder": "attn_implementation sdpa",
    }
    assert calls and all(layout == "BNSD" and dtype == torch.bfloat16 for _, _, layout, dtype in calls)
    backend.close()
