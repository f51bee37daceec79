"""The TPU route's refusals and the XLA_CPU_DEVICES stand-in, in the main venv (no JAX: nothing here imports
it). The route itself runs in the TPU venv: tests/test_xla_app.py."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from devices import DeviceManager
from devices.options import DeviceOptions, DeviceSettings
from devices.xla import stand_in_environment
from pipelines.run import xla_route
from pipelines.schema.errors import LoraError
from pipelines.schema.inpaint import Inpaint
from pipelines.schema.request import GenerationRequest

PROMPT = "a red circle on a blue background"
ROOT = Path(__file__).resolve().parent.parent


def test_the_stand_in_setting_travels_to_each_device_and_is_off_by_default():
    assert DeviceSettings().xla_cpu_devices == 0
    settings = DeviceSettings.from_env({"XLA_CPU_DEVICES": "2", "PREFERRED_DEVICE": "tpu"})
    assert settings.options_for().xla_cpu_devices == 2
    assert DeviceOptions.for_device("tpu", settings).xla_cpu_devices == 2
    assert DeviceOptions.resolve("tpu").xla_cpu_devices == 0  # arguments alone: never the stand-in


def test_the_stand_in_environment_keeps_what_is_set_and_adds_the_device_count():
    env = stand_in_environment(2, {"XLA_FLAGS": "--xla_dump_to=/tmp/x", "PJRT_NPROC": "3"})
    assert env["JAX_PLATFORMS"] == "cpu" and env["PJRT_NPROC"] == "3"
    assert "--xla_dump_to=/tmp/x" in env["XLA_FLAGS"]
    assert "--xla_force_host_platform_device_count=2" in env["XLA_FLAGS"]
    assert stand_in_environment(2, {})["PJRT_NPROC"] == "8"  # devices.xla.host_threads


def test_auto_never_picks_the_stand_in_and_jax_stays_out_of_the_main_venv():
    dm = DeviceManager(options=DeviceSettings(xla_cpu_devices=2).options_for())
    assert dm.backend != "tpu"
    assert "jax" not in sys.modules


@pytest.mark.parametrize(
    ("fields", "words"),
    [
        ({"step_cache": "FirstBlockCache"}, "step caches skip blocks"),
    ],
)
def test_requests_that_change_the_compiled_unet_are_refused_with_the_reason(fields, words):
    why = xla_route.request_refusal(GenerationRequest(prompt=PROMPT, **fields))
    assert why is not None and words in why and "torchax" in why


def test_a_plain_request_runs():
    assert xla_route.request_refusal(GenerationRequest(prompt=PROMPT, num_images=2, sampler="Euler a")) is None


@pytest.mark.parametrize("sampler", ["DDIM", "PLMS", "LCM", "TCD", "DDPMScheduler"])
def test_samplers_once_refused_and_inpaint_run(sampler):
    mask = Image.new("L", (64, 64), 255)
    inpaint = GenerationRequest(prompt=PROMPT, init_images=[Image.new("RGB", (64, 64))], inpaint=Inpaint(mask=mask))
    assert xla_route.request_refusal(GenerationRequest(prompt=PROMPT, sampler=sampler)) is None
    assert xla_route.request_refusal(inpaint) is None


def test_the_route_keeps_a_schedulers_timesteps_on_the_cpu_with_its_signature():
    from diffusers import DDIMScheduler

    scheduler = xla_route.cpu_timesteps(DDIMScheduler())
    scheduler.set_timesteps(4, device="meta")  # the route's pipeline asks for "jax"; any device but the CPU
    assert scheduler.timesteps.device.type == "cpu" and len(scheduler.timesteps) == 4
    # diffusers reads the signature to decide whether custom timesteps or sigmas are accepted
    assert inspect.signature(scheduler.set_timesteps) == inspect.signature(DDIMScheduler().set_timesteps)


class _Pipe:
    unet = vae = None


def test_models_without_a_unet_and_a_second_chip_alone_are_refused():
    dm = DeviceManager("cpu")
    why = xla_route.load_refusal(_Pipe(), dm, {}, [])
    assert "_Pipe has no UNet2DConditionModel + AutoencoderKL" in why and "SD3, Flux" in why
    second = type("Dm", (), {"options": DeviceOptions.resolve("tpu:1")})()
    assert "tpu:1: one chip other than the first is not served" in xla_route.load_refusal(_Pipe(), second, {}, [])


LORAS = ROOT / "models" / "loras"


def _unet_weights() -> dict:
    from safetensors.numpy import load_file

    return load_file(str(ROOT / "models" / "tiny-shapes" / "unet" / "diffusion_pytorch_model.safetensors"))


def test_a_loras_deltas_for_weight_patching_have_the_unets_shapes():
    weights = _unet_weights()
    deltas = xla_route.lora_deltas(LORAS / "outline.safetensors", weights)
    assert len(deltas) == 92 and all(deltas[name].shape == weights[name].shape for name in deltas)


def test_what_weight_patching_does_not_read_is_refused_with_the_reason(tmp_path):
    from safetensors.numpy import load_file, save_file

    tensors = load_file(str(LORAS / "outline.safetensors"))
    save_file({**tensors, "text_encoder.x.lora_A.weight": np.zeros((4, 4), np.float32)}, tmp_path / "te.safetensors")
    with pytest.raises(LoraError, match="only UNet lora_A/lora_B weights are read"):
        xla_route.lora_deltas(tmp_path / "te.safetensors", _unet_weights())
    save_file(tensors, tmp_path / "meta.safetensors", metadata={"lora_adapter_metadata": "{}"})
    with pytest.raises(LoraError, match="peft metadata"):
        xla_route.lora_deltas(tmp_path / "meta.safetensors", _unet_weights())
