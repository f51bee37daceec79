"""Switching models at runtime in the running app (gradio_client), and who may do it."""

from __future__ import annotations

import gc
import weakref

import pytest
from gradio_client import Client

from engine import build_engine
from engine.settings import AppSettings, SettingsError
from pipelines.run.options import DEFAULT_MODEL
from tests.app_server import main_pipeline, running_app
from tests.tiny_model import save_tiny_pipeline


@pytest.fixture(scope="module")
def models_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    save_tiny_pipeline(root / "tiny-sd")
    broken = root / "broken"
    broken.mkdir()
    (broken / "model_index.json").write_text(
        '{"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"]}'
    )
    return root


@pytest.fixture(scope="module")
def app(models_dir, tmp_path_factory):
    from huggingface_hub import constants

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(constants, "HF_HUB_CACHE", str(tmp_path_factory.mktemp("hf-cache")))  # none of this machine's
        with running_app(DEFAULT_MODEL, tmp_path_factory.mktemp("out"), models_dir=models_dir) as (demo, backend):
            yield demo, backend, Client(demo.local_url, verbose=False)


def _generate(client: Client, **kw):
    args = dict(prompt="a red circle on a blue background", negative_prompt="", num_images=1, steps=2,
                guidance_scale=4.0, width=None, height=None, seed=3, loras={}, sampler="")  # fmt: skip
    args.update(kw)
    return client.predict(**args, api_name="/generate")


def test_models_lists_what_can_load_here_and_the_picker_agrees(app):
    """Offline (the tests' HF_HUB_OFFLINE=1) only local models can load; the others are listed apart with
    the reason, left out of the UI's picker, and a switch to one is refused at once (pipelines.weights.catalog)."""
    demo, _, client = app
    listed = client.predict(api_name="/models")
    names = {m["name"]: m["kind"] for m in listed["models"]}
    assert names == {"tiny-shapes-fast": "recipe", "tiny-shapes": "recipe", "broken": "folder", "tiny-sd": "folder"}
    why = {m["name"]: m["why"] for m in listed["unavailable"]}
    assert "hidream-e1.1" in why and "HF_HUB_OFFLINE" in why["sdxl-base"], why
    assert listed["current"] == "tiny-shapes" and listed["switch_allowed"] is True
    (picker,) = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "model-picker"]
    assert [value for _, value in picker.choices] == list(names)
    assert picker.info.startswith("Not listed, as they cannot load here: animatediff-v1-5-3, cogvideox-2b, ")
    with pytest.raises(Exception, match=r"'sdxl-base' cannot load here: .*HF_HUB_OFFLINE.*available: tiny-shapes"):
        client.predict("sdxl-base", api_name="/load_model")
    assert client.predict(api_name="/models")["current"] == "tiny-shapes"


def test_switch_frees_the_old_model_shows_new_defaults_and_a_failed_switch_keeps_serving(app):
    _, pool, client = app
    old = weakref.ref(main_pipeline(pool).diffusers_pipeline)
    info = client.predict("tiny-sd", api_name="/load_model")
    gc.collect()
    assert old() is None, "the old model's weights are still referenced after the switch"
    assert (info["model_name"], info["default_width"], info["size_multiple"]) == ("tiny-sd", 32, 8)
    _, result = _generate(client)
    assert result["num_images"] == 1 and client.predict(api_name="/status")["replicas"][0]["activity"] == "idle"
    with pytest.raises(Exception, match=r"could not switch to .*broken.*tiny-sd.* is serving again"):
        client.predict("broken", api_name="/load_model")
    assert client.predict(api_name="/models")["current"] == "tiny-sd"
    assert _generate(client)[1]["num_images"] == 1  # the previous model still serves
    with pytest.raises(Exception, match="is not offered here"):
        client.predict("/etc", api_name="/load_model")
    back = client.predict("tiny-shapes", api_name="/load_model")  # a recipe name
    assert back["model_name"] == "tiny-shapes" and back["default_width"] == 64


def test_switching_is_localhost_only_unless_allowed(app):
    _, backend, _ = app
    assert not build_engine(AppSettings(server_name="0.0.0.0"), backend).can_switch
    assert build_engine(AppSettings(server_name="0.0.0.0", allow_model_switch="1"), backend).can_switch
    assert not build_engine(AppSettings(allow_model_switch="0"), backend).can_switch
    with pytest.raises(SettingsError, match="ALLOW_MODEL_SWITCH"):
        AppSettings.from_env({"ALLOW_MODEL_SWITCH": "sometimes"})
