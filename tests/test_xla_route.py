"""The TPU route's refusals and the XLA_CPU_DEVICES stand-in, in the main venv (no JAX: nothing here imports
it). The route itself runs in the TPU venv: tests/test_xla_app.py."""

from __future__ import annotations

import sys

import pytest

from devices import DeviceManager
from devices.options import DeviceOptions, DeviceSettings
from devices.xla import stand_in_environment
from pipelines.run import xla_route
from pipelines.schema.request import GenerationRequest

PROMPT = "a red circle on a blue background"


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
        ({"loras": {"x": 1.0}}, "LoRAs cannot be switched per request on tpu"),
        ({"step_cache": "FirstBlockCache"}, "step caches skip blocks"),
    ],
)
def test_requests_that_change_the_compiled_unet_are_refused_with_the_reason(fields, words):
    why = xla_route.request_refusal(GenerationRequest(prompt=PROMPT, **fields), "DPM++ 2M")
    assert why is not None and words in why and "torchax" in why


def test_a_plain_request_runs():
    assert xla_route.request_refusal(GenerationRequest(prompt=PROMPT, num_images=2, sampler="Euler a"), "Euler a") is None


def test_samplers_whose_step_torchax_cannot_run_are_refused_by_name():
    why = xla_route.request_refusal(GenerationRequest(prompt=PROMPT), "PLMS")
    assert why.startswith("the sampler PLMS cannot run on tpu") and "DPM++ 2M" in why


class _Pipe:
    unet = vae = None


def test_models_without_a_unet_and_a_second_chip_alone_are_refused():
    dm = DeviceManager("cpu")
    why = xla_route.load_refusal(_Pipe(), dm, {}, [])
    assert "_Pipe has no UNet2DConditionModel + AutoencoderKL" in why and "SD3, Flux" in why
    second = type("Dm", (), {"options": DeviceOptions.resolve("tpu:1")})()
    assert "tpu:1: one chip other than the first is not served" in xla_route.load_refusal(_Pipe(), second, {}, [])


def test_a_lora_cannot_be_loaded_into_the_route():
    with pytest.raises(ValueError, match="fuse: true"):
        xla_route.refuse_lora_load()
