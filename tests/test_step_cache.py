"""Step caching (pipelines.sampling.step_cache): applied per request on the families whose transformer diffusers
gives a cache (tiny Flux, tiny Qwen-Image), reported, removed after the request (the next uncached
image is bit-identical), refused clearly elsewhere (SD 1.5's UNet); the form, the API and the Ray wire
carry the choice. Random tiny weights: the PSNR bounds check the mechanism, not image quality."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from benchmarks.cache_bench import AttentionCounter, psnr
from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline
from pipelines.pnginfo.write import a1111_parameters
from pipelines.run.options import PipelineOptions
from pipelines.run.traits import denoiser
from pipelines.sampling.step_cache import StepCache
from pipelines.schema.errors import UnsupportedTaskError
from pipelines.schema.request import validate
from pipelines.weights.recipes import RecipeError, parse
from tests import families

STEPS = 10
CACHES = [("FirstBlockCache", 0.5), ("TaylorSeer", None), ("MagCache", 0.5)]  # loose: random weights
_LOADED: dict[str, ImagePipeline] = {}


def pipeline(root, name: str, **options) -> ImagePipeline:
    """One pipeline per family for this module (not test_families' shared ones: Qwen's is changed).

    The tiny Qwen-Image has one transformer block; FirstBlockCache needs a first block and one after
    it (real Qwen-Image has 60), so a copy of the block is appended."""
    key = name + repr(sorted(options.items()))
    if key not in _LOADED:
        path = families.build(name, root / name)
        dm = DeviceManager("cpu")
        pipe = ImagePipeline.from_pretrained(path, device_manager=dm, memory_mode="off", **options)
        if name == "qwen-image":
            blocks = denoiser(pipe.pipe).transformer_blocks
            blocks.append(copy.deepcopy(blocks[0]))
        _LOADED[key] = pipe
    return _LOADED[key]


def request(**kw) -> GenerationRequest:
    kw = {"prompt": "a red circle", "steps": STEPS, "seed": 3, "width": 64, "height": 64, **kw}
    return GenerationRequest(**kw)


@pytest.mark.parametrize("name", ["flux", "qwen-image"])
def test_each_cache_applied_reported_and_removed(family_root, name):
    """Fewer attention computations, a nearby image, reported everywhere; then the uncached image again."""
    torch.set_num_threads(1)
    pipe = pipeline(family_root, name)
    transformer = denoiser(pipe.pipe)
    counter = AttentionCounter(transformer)
    base = pipe.generate(request())
    full = counter.take()
    assert "step_cache" not in base.metadata[0] and not base.step_cache and "step_cache" not in base.info()
    for method, threshold in CACHES:
        if method == "MagCache":  # the first MagCache request of a model calibrates: nothing skipped
            first = pipe.generate(request(step_cache=method, step_cache_threshold=threshold))
            assert counter.take() == full and "calibration" in first.step_cache
            assert np.array_equal(np.asarray(first.images[0]), np.asarray(base.images[0]))
            assert first.metadata[0]["step_cache_calibration"] is True
        result = pipe.generate(request(step_cache=method, step_cache_threshold=threshold))
        label = StepCache.of(method, threshold).label
        assert counter.take() < full, method
        assert 20 < psnr(base.images[0], result.images[0]) < float("inf"), method
        assert result.step_cache == label and result.info()["step_cache"] == label
        assert result.metadata[0]["step_cache"] == method
        assert result.metadata[0].get("step_cache_threshold") == threshold
        assert f"Step cache: {label}" in a1111_parameters(result.metadata[0])
        assert not transformer.is_cache_enabled
    after = pipe.generate(request())
    assert counter.take() == full
    assert np.array_equal(np.asarray(after.images[0]), np.asarray(base.images[0]))
    assert "Step cache" not in a1111_parameters(after.metadata[0])


def test_removed_after_cancel_and_after_an_error(family_root):
    pipe = pipeline(family_root, "flux")
    transformer = denoiser(pipe.pipe)
    cancelled = pipe.generate(request(step_cache="TaylorSeer"), should_cancel=lambda: transformer.is_cache_enabled)
    assert cancelled.cancelled and not transformer.is_cache_enabled

    def fail(step, total, image):
        if step == 3:
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        pipe.generate(request(step_cache="FirstBlockCache"), progress=fail)
    assert not transformer.is_cache_enabled
    again = pipe.generate(request(step_cache="FirstBlockCache"))  # nothing left behind that blocks a new cache
    assert again.step_cache == "FirstBlockCache 0.05"


@pytest.mark.parametrize("name", ["flux", "flux-kontext"])
def test_image_to_image_edits_and_inpaints_run_with_the_cache_too(family_root, name):
    """The Edit and Inpaint tabs send no step cache of their own: their requests get the model's
    (STEP_CACHE). diffusers' Flux img2img, inpaint and Kontext pipelines name no cache context
    (its hooks raised "No cache context is set"); with pipelines.sampling.step_cache.CallContexts they run
    cached, and the cache comes off again."""
    from PIL import Image, ImageDraw

    from pipelines.schema.inpaint import Inpaint

    pipe = pipeline(family_root, name, step_cache="TaylorSeer")
    transformer = denoiser(pipe.pipe)
    picture = Image.new("RGB", (64, 64), "navy")
    mask = Image.new("L", (64, 64), 0)
    ImageDraw.Draw(mask).rectangle((16, 16, 47, 47), fill=255)
    edit = {} if name == "flux-kontext" else {"strength": 0.8}  # Kontext edits by instruction
    for extra in (edit, {"inpaint": Inpaint(mask=mask)}):
        counter = AttentionCounter(transformer)
        cached = pipe.generate(request(init_images=[picture], **extra))
        skipped = counter.take()
        plain = pipe.generate(request(init_images=[picture], step_cache="none", **extra))
        assert cached.step_cache == "TaylorSeer" and not plain.step_cache, extra
        assert skipped < counter.take(), extra  # the cached run computed less attention
        assert psnr(plain.images[0], cached.images[0]) > 20, extra
        assert not transformer.is_cache_enabled


def test_refused_on_a_family_without_a_cache(family_root):
    pipe = pipeline(family_root, "sd15")
    assert not pipe.model_info().step_cache
    with pytest.raises(UnsupportedTaskError) as refused:
        pipe.generate(request(step_cache="FirstBlockCache", steps=2))
    message = str(refused.value)
    assert "UNet2DConditionModel" in message and "Flux" in message and "Qwen-Image" in message
    assert not pipe.generate(request(step_cache="none", steps=2)).step_cache  # asking for none is fine


def test_default_from_settings_and_off_where_unsupported(family_root):
    """STEP_CACHE: the cache of requests that name none; a request's "none" turns it off; a model
    without a cache runs uncached instead of refusing every request."""
    options = PipelineOptions.from_env({"STEP_CACHE": "firstblockcache", "STEP_CACHE_THRESHOLD": "0.5"})
    assert (options.step_cache, options.step_cache_threshold) == ("FirstBlockCache", 0.5)
    flux = pipeline(family_root, "flux", step_cache="FirstBlockCache", step_cache_threshold=0.5)
    info = flux.model_info()
    assert (info.default_step_cache, info.default_step_cache_threshold) == ("FirstBlockCache", 0.5)
    assert flux.generate(request()).step_cache == "FirstBlockCache 0.5"
    assert flux.generate(request(step_cache_threshold=0.3)).step_cache == "FirstBlockCache 0.3"
    assert not flux.generate(request(step_cache="none")).step_cache
    sd15 = pipeline(family_root, "sd15", step_cache="TaylorSeer")
    assert sd15.model_info().default_step_cache == "none" and not sd15.generate(request(steps=2)).step_cache


@pytest.mark.parametrize(
    "env",
    [{"STEP_CACHE": "teacache"}, {"STEP_CACHE_THRESHOLD": "0"}, {"STEP_CACHE_THRESHOLD": "nan"}],
)
def test_bad_settings_name_the_variable(env):
    from engine.settings import AppSettings, SettingsError

    with pytest.raises(SettingsError, match=next(iter(env))):
        AppSettings.from_env(env)


def test_request_and_recipe_validation():
    from pipelines.schema.request import RequestLimits

    with pytest.raises(ValueError, match="step_cache: 'TeaCache' is not one of none, FirstBlockCache"):
        validate(request(step_cache="TeaCache"), RequestLimits())
    with pytest.raises(ValueError, match="step_cache_threshold"):
        validate(request(step_cache="MagCache", step_cache_threshold=0.0), RequestLimits())
    recipe = parse({"name": "x", "source": "y", "defaults": {"step_cache": "MagCache", "step_cache_threshold": 0.1}})
    assert recipe.defaults["step_cache"] == "MagCache"
    with pytest.raises(RecipeError, match=r"defaults\.step_cache"):
        parse({"name": "x", "source": "y", "defaults": {"step_cache": "fbc"}})


def test_form_and_api_values_pass_through():
    """The form's or /generate's raw values become the request's fields (engine.inputs.read)."""
    from engine.inputs import Limits, read
    from pipelines.run.backend import ModelInfo
    from pipelines.schema.fields import RequestError
    from ui.fields import parameters

    assert {"step_cache", "step_cache_threshold"} <= set(parameters("generate"))
    info = ModelInfo("m", 64, 64, 16, 256, 256 * 256, 4, 10, 3.0, "Euler", step_cache=True)
    limits = Limits(info, 100, 4, 10**6)
    raw = {"prompt": "a cat", "step_cache": "magcache", "step_cache_threshold": "0.2"}
    req = read(raw, limits)
    assert (req.step_cache, req.step_cache_threshold) == ("MagCache", 0.2)
    assert read({"prompt": "a cat", "step_cache": ""}, limits).step_cache is None  # the model's default
    assert read({"prompt": "a cat"}, limits).step_cache is None
    with pytest.raises(RequestError, match="step_cache") as caught:
        read({**raw, "step_cache": "fast"}, limits)
    assert caught.value.field == "step_cache"
    with pytest.raises(RequestError, match="step_cache_threshold"):
        read({**raw, "step_cache_threshold": 2}, limits)


def test_ray_wire_carries_the_choice_and_the_report():
    from pipelines.schema.request import GenerationResult
    from serving.wire import request_from_wire, request_to_wire, result_from_wire, result_to_wire

    sent = request(step_cache="FirstBlockCache", step_cache_threshold=0.1)
    back = request_from_wire(request_to_wire(sent))
    assert (back.step_cache, back.step_cache_threshold) == ("FirstBlockCache", 0.1)
    result = GenerationResult([], [], [], {}, None, "cpu", "float32", "sdpa", step_cache="TaylorSeer")
    assert result_from_wire(result_to_wire(result)).step_cache == "TaylorSeer"


def test_which_transformers_diffusers_gives_a_cache():
    """What docs/step-caching.md says: Flux and Qwen-Image (and Chroma, Wan...) do; SD3, PixArt, Sana,
    HiDream and UNets do not (diffusers 0.42.1)."""
    import diffusers
    from diffusers.models.cache_utils import CacheMixin

    yes = ["FluxTransformer2DModel", "QwenImageTransformer2DModel", "ChromaTransformer2DModel", "WanTransformer3DModel"]
    no = ["SD3Transformer2DModel", "PixArtTransformer2DModel", "SanaTransformer2DModel",
          "HiDreamImageTransformer2DModel", "UNet2DConditionModel"]  # fmt: skip
    assert all(issubclass(getattr(diffusers, n), CacheMixin) for n in yes)
    assert not any(issubclass(getattr(diffusers, n), CacheMixin) for n in no)


def test_cache_bench_runs_and_writes_its_figures(family_root, tmp_path):
    """`python -m benchmarks.cache_bench` end to end, short (the figures in the docs come from a full run)."""
    from benchmarks.cache_bench import VARIANTS, main

    out = tmp_path / "cache.json"
    path = families.build("flux", family_root / "flux")
    report = main(["--model", str(path), "--device", "cpu", "--steps", "6", "--size", "64", "--repeats", "1",
                   "--json", str(out)])  # fmt: skip
    assert set(report["variants"]) == set(VARIANTS) and report["uncached_bit_identical_after"] is True
    assert report["variants"]["TaylorSeer"]["attention_calls"] < report["variants"]["none"]["attention_calls"]
    assert "calibration" in report["magcache_first_run"] and out.is_file()


@pytest.mark.slow  # 39 s on 2 shared cores
def test_edit_and_inpaint_endpoints_take_a_step_cache(family_root, tmp_path):
    """The app as `python app.py` builds it on tiny Flux Kontext with STEP_CACHE=TaylorSeer: `/edit`
    and `/inpaint` (gradio_client) take `step_cache` like `/generate`, leaving it out means the
    server's default (a REST caller of /edit's published values too), and each result says what ran."""
    from gradio_client import Client, handle_file
    from PIL import Image, ImageDraw

    from tests.app_server import running_app
    from tests.test_reliability import rest_call, rest_result, rest_upload

    model = families.build("flux-kontext", family_root / "flux-kontext")
    picture, mask = tmp_path / "picture.png", tmp_path / "mask.png"
    Image.new("RGB", (64, 64), "navy").save(picture)
    box = Image.new("L", (64, 64), 0)
    ImageDraw.Draw(box).rectangle((16, 16, 47, 47), fill=255)
    box.save(mask)
    with running_app(model, tmp_path / "out", env={"STEP_CACHE": "TaylorSeer"}) as (demo, _):
        client, url = Client(demo.local_url, verbose=False), demo.local_url
        common = dict(prompt="make it red", num_images=1, steps=4, seed=5)
        edit = dict(files=[handle_file(str(picture))], **common, random_seed=False, api_name="/edit")
        assert "step cache TaylorSeer" in client.predict(**edit)[1]  # the server's default
        assert "step cache" not in client.predict(**edit, step_cache="none")[1]
        published = dict(files=rest_upload(url, picture), prompt="make it red", strength=0.8, num_images=1, steps=4,
                         guidance=3.5, seed="5", random_seed=False, sampler="Euler (flow matching)", image_guidance=1.5,
                         guidance_end=1.0)  # fmt: skip
        kind, data = rest_result(url, "edit", rest_call(url, "v2/edit", published))
        assert kind == "complete" and "step cache TaylorSeer" in data[1], data
        _, result = client.predict(
            handle_file(str(picture)), handle_file(str(mask)), **common,
            step_cache="FirstBlockCache", step_cache_threshold=0.4, api_name="/inpaint",
        )  # fmt: skip
        assert result["step_cache"] == "FirstBlockCache 0.4"
        with pytest.raises(Exception, match="step_cache: 'fast' is not one of"):
            client.predict(handle_file(str(picture)), handle_file(str(mask)), **common, step_cache="fast",
                           api_name="/inpaint")  # fmt: skip
