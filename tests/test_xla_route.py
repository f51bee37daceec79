"""The TPU route's refusals and the XLA_CPU_DEVICES stand-in, in the main venv (no JAX: nothing here imports
it). The route itself runs in the TPU venv: tests/test_xla_app.py."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from devices import DeviceManager
from devices.options import DeviceOptions, DeviceSettings
from devices.xla import stand_in_environment
from pipelines.run import xla_route
from pipelines.schema.errors import LoraError
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


def _fused_change(lora: Path) -> dict:
    """What diffusers' own `fuse_lora` adds to each UNet weight of the embedded model on the CPU (the reference)."""
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline.from_pretrained(str(ROOT / "models" / "tiny-shapes"))
    before = {k: v.clone() for k, v in pipe.unet.state_dict().items()}
    pipe.load_lora_weights(str(lora))
    pipe.fuse_lora(lora_scale=1.0)
    pipe.unload_lora_weights()  # the fused weights stay
    after = pipe.unet.state_dict()
    return {k: (after[k] - before[k]).numpy() for k in before if not torch.equal(after[k], before[k])}


def _forms(tmp_path: Path) -> dict[str, Path]:
    """The app's LoRA as diffusers saves it, in kohya's form with alphas (twice the rank: scale 2), and with peft
    metadata giving lora_alpha half the rank (scale 0.5)."""
    from diffusers import StableDiffusionPipeline
    from diffusers.utils import convert_state_dict_to_kohya
    from peft import LoraConfig
    from safetensors.torch import load_file, save_file

    plain = LORAS / "outline.safetensors"
    tensors = load_file(str(plain))
    rank = next(v.shape[0] for k, v in tensors.items() if k.endswith("lora_A.weight"))
    kohya = convert_state_dict_to_kohya(tensors)
    save_file({k: torch.tensor(2.0 * rank) if k.endswith(".alpha") else v for k, v in kohya.items()}, tmp_path / "kohya.safetensors")
    unet = {k[len("unet.") :]: v for k, v in tensors.items()}
    layers = sorted({k.rsplit(".lora_", 1)[0] for k in unet})
    metadata = LoraConfig(r=rank, lora_alpha=rank / 2, target_modules=layers).to_dict()  # as diffusers' training scripts save it
    StableDiffusionPipeline.save_lora_weights(tmp_path, unet_lora_layers=unet, unet_lora_adapter_metadata=metadata,
                                              weight_name="peft.safetensors")  # fmt: skip
    return {"diffusers": plain, "kohya": tmp_path / "kohya.safetensors", "peft metadata": tmp_path / "peft.safetensors"}


def test_weight_patching_adds_what_diffusers_fuses_for_each_lora_form(tmp_path):
    """The deltas patched into the TPU's compiled UNet are the weights diffusers' `fuse_lora` makes on the CPU, for
    a LoRA as diffusers saves it, in kohya's form with alphas and with peft metadata (each scale differs)."""
    from diffusers import StableDiffusionPipeline

    weights = _unet_weights()
    sizes = []
    for form, path in _forms(tmp_path).items():
        deltas = {k: pair.delta() for k, pair in xla_route.lora_layers(path, weights, StableDiffusionPipeline.lora_state_dict).items()}
        fused = _fused_change(path)
        assert sorted(deltas) == sorted(fused), form
        for name, delta in deltas.items():
            assert delta.shape == weights[name].shape
            np.testing.assert_allclose(delta, fused[name], atol=2e-6, err_msg=f"{form}: {name}")
        sizes.append(max(float(np.abs(d).max()) for d in deltas.values()))
    assert sizes[1] > 1.9 * sizes[0] and sizes[2] < 0.6 * sizes[0]  # kohya's alphas and peft's lora_alpha are applied


def test_what_weight_patching_does_not_read_is_refused_with_the_reason(tmp_path):
    from diffusers import StableDiffusionPipeline
    from safetensors.numpy import load_file, save_file

    read = StableDiffusionPipeline.lora_state_dict
    tensors = load_file(str(LORAS / "outline.safetensors"))
    save_file({**tensors, "text_encoder.x.lora_A.weight": np.zeros((4, 4), np.float32)}, tmp_path / "te.safetensors")
    with pytest.raises(LoraError, match=r"only the UNet's LoRA layers are read.*text_encoder"):
        xla_route.lora_layers(tmp_path / "te.safetensors", _unet_weights(), read)
    unet = {k[len("unet.") :]: v for k, v in load_file(str(LORAS / "outline.safetensors")).items()}
    metadata = {"r": 4, "lora_alpha": 4, "alpha_pattern": {"down_blocks.0": 8}, "rank_pattern": {}}  # refused before peft reads it
    StableDiffusionPipeline.save_lora_weights(tmp_path, unet_lora_layers={k: torch.from_numpy(v) for k, v in unet.items()},
                                              unet_lora_adapter_metadata=metadata, weight_name="pattern.safetensors")  # fmt: skip
    with pytest.raises(LoraError, match="alpha_pattern"):
        xla_route.lora_layers(tmp_path / "pattern.safetensors", _unet_weights(), read)


class _Unet:
    def __init__(self, params: dict):
        self.params = dict(params)


class _RoutePipe:  # what PatchedLoras reads of the route's pipeline: the compiled UNet's weight inputs, the LoRA reader
    lora_state_dict = staticmethod(__import__("diffusers").StableDiffusionPipeline.lora_state_dict)

    def __init__(self, params: dict):
        self.unet = _Unet(params)


def _patched(monkeypatch, fail_at: int | None = None) -> xla_route.PatchedLoras:
    """PatchedLoras over the embedded UNet's weights as numpy arrays, `devices.xla.add_to_weight` as numpy's
    addition (raising at call `fail_at`, as a device out of memory would)."""
    from types import SimpleNamespace

    calls = []

    def add(base, delta):
        calls.append(1)
        if fail_at is not None and len(calls) == fail_at:
            raise RuntimeError("RESOURCE_EXHAUSTED")
        return base + delta

    monkeypatch.setattr(xla_route.xla, "add_to_weight", add)
    route = SimpleNamespace(jax_pipe=SimpleNamespace(pipe=_RoutePipe(_unet_weights())))
    return xla_route.PatchedLoras(route, None, LORAS)


def test_patched_loras_put_the_models_own_weights_back_after_a_lora_a_failure_or_a_re_read(monkeypatch):
    loras = _patched(monkeypatch)
    params, base = loras.unet.params, loras.base
    loras.activate({"outline": 0.5})
    changed = [w for w in params if params[w] is not base[w]]
    assert len(changed) == 92
    pair = loras.layers["outline"][changed[0]]
    np.testing.assert_allclose(params[changed[0]], base[changed[0]] + 0.5 * pair.delta(), rtol=1e-6)
    loras.activate({})
    assert all(params[w] is base[w] for w in params)  # the same arrays: bit for bit

    loras.activate({"outline": 1.0})
    loras.load(LORAS / "outline.safetensors", name="outline")  # re-read while its weights are in
    loras.activate({})
    assert all(params[w] is base[w] for w in params)

    failing = _patched(monkeypatch, fail_at=3)
    with pytest.raises(RuntimeError, match="RESOURCE_EXHAUSTED"):
        failing.activate({"outline": 1.0})  # two weights patched, then the device fails
    failing.activate({})  # the request after: none of that LoRA may stay
    assert all(failing.unet.params[w] is failing.base[w] for w in failing.unet.params)
