"""LoRA files as people have them: peft/diffusers files with adapter metadata, kohya/A1111 files
with `.alpha` tensors. A LoRA whose alpha differs from its rank must have the strength its
trainer meant: the same output as the peft adapter applied directly (the reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline
from pipelines.schema.errors import LoraError
from tests import families

RANK, ALPHA = 4, 16  # scale alpha / rank = 4: ignoring alpha gives a 4x weaker LoRA
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]


def _request(**kw) -> GenerationRequest:
    return GenerationRequest(prompt="a red circle", steps=3, seed=11, width=64, height=64, guidance_scale=4.0, **kw)


def _pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.float32)


@pytest.fixture(scope="module")
def lora_files(tmp_path_factory):
    """(model folder, LoRA folder, reference image): the reference is the peft adapter applied directly."""
    from diffusers import DiffusionPipeline
    from peft import LoraConfig, get_peft_model_state_dict

    root = tmp_path_factory.mktemp("lora-files")
    model = families.build("sd15", root / "sd15")
    folder = root / "loras"
    folder.mkdir()
    pipe = DiffusionPipeline.from_pretrained(model)
    pipe.set_progress_bar_config(disable=True)
    torch.manual_seed(3)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, init_lora_weights=False)
    pipe.unet.add_adapter(config, adapter_name="ref")
    layers = get_peft_model_state_dict(pipe.unet, adapter_name="ref")
    reference = ImagePipeline.from_loaded(pipe, DeviceManager("cpu", attention="sdpa"), _options(folder), str(model))
    ref_image = reference.generate(_request()).images[0]
    type(pipe).save_lora_weights(
        folder, unet_lora_layers=layers, unet_lora_adapter_metadata=config.to_dict(), weight_name="peft-meta.safetensors"
    )
    save_file(_kohya(layers), folder / "kohya.safetensors")
    return model, folder, ref_image


def _options(folder):
    from pipelines.run.options import PipelineOptions

    return PipelineOptions(lora_dir=folder, memory_mode="off")


def _kohya(layers: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The same LoRA as sd-scripts writes it: `lora_unet_<module with _>.lora_down/up.weight` + `.alpha`."""
    out = {}
    for key, tensor in layers.items():
        module, kind = key.rsplit(".lora_", 1)
        name = "lora_unet_" + module.replace(".", "_")
        out[f"{name}.lora_down.weight" if kind.startswith("A") else f"{name}.lora_up.weight"] = tensor.contiguous()
        out[f"{name}.alpha"] = torch.tensor(float(ALPHA))
    return out


def _fresh(lora_files) -> ImagePipeline:
    model, folder, _ = lora_files
    return ImagePipeline.from_pretrained(model, device_manager=DeviceManager("cpu", attention="sdpa"), lora_dir=folder)


@pytest.mark.parametrize("name", ["peft-meta", "kohya"])
def test_lora_with_alpha_not_rank_matches_the_peft_reference(lora_files, name):
    _, _, reference = lora_files
    pipe = _fresh(lora_files)
    assert name in [info.name for info in pipe.list_loras()]
    assert pipe.load_lora(name) == name  # the name list_loras shows, no path needed
    image = pipe.generate(_request(loras={name: 1.0})).images[0]
    assert np.abs(_pixels(image) - _pixels(reference)).max() <= 1, "the LoRA's strength is not its trainer's"
    base = pipe.generate(_request()).images[0]
    assert np.abs(_pixels(base) - _pixels(reference)).max() > 10  # the LoRA really does something


def test_alpha_ignored_would_be_a_weaker_lora(lora_files):
    """The control: the old way (a pre-read dict, so no header metadata) does not match the reference,
    so the test above can fail."""
    _, folder, reference = lora_files
    pipe = _fresh(lora_files)
    pipe.diffusers_pipeline.load_lora_weights(load_file(folder / "peft-meta.safetensors"), adapter_name="dict")
    pipe.loras._loaded["dict"] = folder / "peft-meta.safetensors"
    image = pipe.generate(_request(loras={"dict": 1.0})).images[0]
    assert np.abs(_pixels(image) - _pixels(reference)).max() > 3


def test_lora_files_stay_safetensors_and_inside_lora_dir(lora_files, tmp_path):
    pipe = _fresh(lora_files)
    (tmp_path / "evil.bin").write_bytes(b"not a pickle you want")
    with pytest.raises(LoraError, match=r"only \.safetensors"):
        pipe.load_lora(tmp_path / "evil.bin")
    outside = tmp_path / "outside.safetensors"
    save_file({"x": torch.zeros(1)}, outside)
    with pytest.raises(LoraError, match="outside the LoRA folder"):
        pipe.load_lora(outside)
    with pytest.raises(LoraError, match="not found"):
        pipe.load_lora("missing")
