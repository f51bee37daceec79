"""CLIP text encoders on disk in the layout every loader reads: weights under `text_model.`.

transformers >= 5.6 saves a `CLIPTextModel` without that prefix; older transformers and tools that read
diffusers folders then load random weights without an error (models.train.common.nest_clip_keys)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import CLIPTextConfig, CLIPTextModel

from models.train.common import CLIP_PREFIX, MODELS_DIR, nest_clip_keys

# What transformers 4.x's CLIPTextModel names (its `text_model` submodule), for a 2-layer encoder.
LEGACY_LAYOUT = {
    "text_model.embeddings.token_embedding.weight", "text_model.embeddings.position_embedding.weight",
    "text_model.final_layer_norm.weight", "text_model.final_layer_norm.bias",
    *(f"text_model.encoder.layers.{i}.{part}" for i in range(2) for part in (
        "self_attn.k_proj.weight", "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
        "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.out_proj.weight", "self_attn.out_proj.bias",
        "layer_norm1.weight", "layer_norm1.bias", "mlp.fc1.weight", "mlp.fc1.bias", "mlp.fc2.weight", "mlp.fc2.bias",
        "layer_norm2.weight", "layer_norm2.bias")),
}  # fmt: skip


def _shipped_clip_files() -> list[Path]:
    configs = [c for c in MODELS_DIR.glob("*/text_encoder*/config.json")]
    return [
        c.parent / "model.safetensors"
        for c in configs
        if json.loads(c.read_text()).get("architectures") == ["CLIPTextModel"]
    ]


def test_every_shipped_clip_encoder_has_the_legacy_layout():
    files = _shipped_clip_files()
    assert {f.parts[-3] for f in files} >= {"tiny-shapes", "tiny-shapes-edit"}
    for weights in files:
        keys = set(load_file(weights))
        assert keys == LEGACY_LAYOUT or keys - {"text_model.embeddings.position_ids"} == LEGACY_LAYOUT, weights


def test_a_saved_encoder_is_nested_and_loads_back_the_same(tmp_path):
    torch.manual_seed(0)
    config = CLIPTextConfig(hidden_size=32, intermediate_size=37, num_attention_heads=4, num_hidden_layers=2,
                            vocab_size=99, max_position_embeddings=16, bos_token_id=0, eos_token_id=1, pad_token_id=1)  # fmt: skip
    model = CLIPTextModel(config).eval()
    model.save_pretrained(tmp_path / "text_encoder")
    assert not any(k.startswith(CLIP_PREFIX) for k in load_file(tmp_path / "text_encoder/model.safetensors"))
    assert nest_clip_keys(tmp_path) == [tmp_path / "text_encoder/model.safetensors"]
    assert set(load_file(tmp_path / "text_encoder/model.safetensors")) == LEGACY_LAYOUT
    assert nest_clip_keys(tmp_path) == []  # already nested: left alone
    again, info = CLIPTextModel.from_pretrained(tmp_path / "text_encoder", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ids = torch.tensor([[0, 5, 7, 1]])
    assert torch.equal(model(ids).last_hidden_state, again.eval()(ids).last_hidden_state)
