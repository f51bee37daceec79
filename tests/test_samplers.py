"""The sampler list a model offers: only samplers that can run its noise schedule.

The embedded models' cosine schedule ends in a jump (sigma 642 at t = 998, 20,291 at t = 999)
that Karras sigmas and second-order steps cannot cross; before the schedule check the dropdown
offered them anyway and they crashed (IndexError) or drew black or noise. They now run on the same
schedule with that tail capped (`samplers.tail_repair`); the model's own sampler keeps it as it is.
"""

from __future__ import annotations

import math

import diffusers
import numpy as np
import pytest
import torch

from devices import DeviceManager
from models.eval import classify
from models.eval_edit import EDITOR_DIR, edit_item, judge
from models.train import edit_world
from models.train.world import Scene
from pipelines import GenerationRequest, ImagePipeline
from pipelines.run.options import DEFAULT_MODEL
from pipelines.sampling import samplers
from pipelines.schema.request import RequestError
from tests import families

PROMPTS = ("a green circle on a blue background", "a red triangle on a white background")
EDITS = (  # (input, instruction, kind, value): judged by the evaluation's `judge`
    (Scene("red", "circle", "blue", 0.5, 0.5, 0.5, 0.0), "make it green", "color", "green"),
    (Scene("white", "square", "black", 0.4, 0.45, 0.55, 10.0), "change the background to yellow", "background", "yellow"),
)  # fmt: skip
# Samplers that fail on the embedded models' own schedule and run on it with its tail capped
REPAIRED_HERE = ("DPM++ 2M Karras", "DPM++ 2M SDE Karras", "DPM++ SDE Karras", "DPM2 Karras", "DPM2 a",
                 "DPM2 a Karras", "Euler a", "Heun", "LMS Karras")  # fmt: skip
SD15_SCHEDULER = {  # SD 1.5's scheduler config less its `clip_sample: false`, which many configs omit
    "_class_name": "PNDMScheduler", "beta_start": 0.00085, "beta_end": 0.012, "beta_schedule": "scaled_linear",
    "num_train_timesteps": 1000, "set_alpha_to_one": False, "skip_prk_steps": True, "steps_offset": 1,
}  # fmt: skip


def _read(image) -> tuple[str, str, str]:
    c = classify(image)
    return c.color, c.shape, c.background


@pytest.fixture(scope="module")
def text_to_image():
    return ImagePipeline.from_pretrained(str(DEFAULT_MODEL), DeviceManager("cpu"))


@pytest.fixture(scope="module")
def editor():
    return ImagePipeline.from_pretrained(str(EDITOR_DIR), DeviceManager("cpu"))


@pytest.mark.slow  # 50 s on 2 shared cores
def test_every_sampler_the_embedded_model_offers_draws_the_prompt(text_to_image):
    offered = text_to_image.model_info().samplers
    assert {"DPM++ 2M", "DPM++ 2M SDE", "Euler", "Euler a", "DDIM", "UniPC", *REPAIRED_HERE} <= set(offered), offered
    wrong = []
    for name in offered:
        request = GenerationRequest(prompt=list(PROMPTS), steps=20, guidance_scale=4.0, seed=1, sampler=name)
        for prompt, image in zip(PROMPTS, text_to_image.generate(request).images, strict=True):
            color, shape, background = _read(image)
            assert shape != "none", f"{name}: no shape at all for {prompt!r} (black or noise)"
            wrong += [] if prompt == f"a {color} {shape} on a {background} background" else [(name, prompt)]
    # PLMS and LMS Karras (0.42 of 48 scenes right, docs/samplers-and-guidance.md) may miss one each
    assert len(wrong) <= len(offered) * len(PROMPTS) // 10, wrong


@pytest.mark.slow  # 71 s on 2 shared cores
def test_every_sampler_the_embedded_editor_offers_edits(editor):
    offered = editor.model_info().samplers
    assert set(REPAIRED_HERE) <= set(offered), offered
    wrong = []
    for name in offered:
        for scene, instruction, kind, value in EDITS:
            item = edit_item(edit_world.Edit(scene, kind, value, instruction, edit_world.apply(scene, kind, value)))
            request = GenerationRequest(prompt=instruction, init_images=[item["image"]], steps=20, seed=1, sampler=name,
                                        guidance_scale=3.0, image_guidance_scale=2.5)  # fmt: skip
            verdict = judge(item["image"], editor.generate(request).images[0], item["source"], kind, value)
            got = verdict["got"]
            assert got["shape"] != "none", f"{name}: no shape at all after {instruction!r} (black or noise)"
            # The second edit is a hard case for the shipped weights: a large square turned 10 degrees
            # comes back a circle in 8 of 10 seeds with the default sampler (docs/embedded-models.md).
            # There the asked change and the kept colour count, not the shape.
            right = verdict["all"] if scene.rotation == 0 else (got[kind], got["color"]) == (value, scene.color)
            wrong += [] if right else [(name, instruction, got)]
    # a sampler that cannot run the schedule draws noise: nothing right
    assert len(wrong) <= len(offered) * len(EDITS) // 10, wrong


def test_a_sampler_the_schedule_cannot_run_is_refused_with_the_reason(text_to_image):
    request = GenerationRequest(prompt=PROMPTS[0], steps=20, seed=1, sampler="EDMEulerScheduler")
    with pytest.raises(ValueError, match=r"'EDMEulerScheduler' is not available.*cannot run this model's noise schedule"):
        text_to_image.generate(request)
    assert "EDMEulerScheduler" in samplers.faults(text_to_image.diffusers_pipeline.scheduler)


def test_samplers_that_cannot_cross_the_schedules_jump_run_on_its_capped_tail(text_to_image):
    """Karras sigmas, Heun and DPM2 a fail on the cosine schedule's last step (IndexError, NaN, noise) and
    Euler a gives NaN at 3 steps; on the tail capped at sigma 14.6 each draws the scene. The model's own
    sampler and those that run as they are keep the schedule: their images are unchanged."""
    own = text_to_image.own_scheduler
    assert set(samplers.repaired(own)) == set(REPAIRED_HERE)
    assert "IndexError" in samplers.repaired(own)["DPM++ 2M Karras"] and "3 steps" in samplers.repaired(own)["Euler a"]
    capped = samplers.build(own, "Heun")
    sigmas = ((1 - capped.alphas_cumprod) / capped.alphas_cumprod).sqrt()
    original = ((1 - own.alphas_cumprod) / own.alphas_cumprod).sqrt()
    assert float(sigmas[-1]) == pytest.approx(samplers.TAIL_SIGMA_MAX) and float(original[-1]) > 20_000
    below = original < samplers.TAIL_SIGMA_MAX
    assert torch.allclose(sigmas[below], original[below], rtol=1e-3)  # the model's own levels (float32 cumprod)
    for name in ("DPM++ 2M", "Euler", "DDIM"):
        assert samplers.build(own, name).config.trained_betas is None, name
    for name, steps in (("DPM++ 2M Karras", 20), ("Heun", 20), ("Euler a", 3)):
        request = GenerationRequest(prompt=PROMPTS[0], steps=steps, guidance_scale=4.0, seed=1, sampler=name)
        image = text_to_image.generate(request).images[0]
        assert np.asarray(image).std() > 5 and _read(image)[1] != "none", name  # not black, not noise: a shape


def test_a_model_whose_own_sampler_is_an_sde_one_still_lists_its_samplers(text_to_image):
    """A recipe's default sampler becomes the model's scheduler; from "DPM++ 2M SDE" DEIS cannot be built
    (NotImplementedError for the SDE algorithm): it is left out, not a crash of the whole list."""
    sde = samplers.build(text_to_image.own_scheduler, "DPM++ 2M SDE")
    names = {s.name for s in samplers.offered(sde)}
    assert {"DPM++ 2M SDE", "Euler", "UniPC"} <= names and "DEIS" not in names


def test_an_sd_schedule_keeps_every_sampler_and_ddim_does_not_clip():
    own = diffusers.PNDMScheduler.from_config(SD15_SCHEDULER)
    names = {s.name for s in samplers.offered(own)}
    assert set(REPAIRED_HERE) | {"DPM++ 2M", "Euler a", "DDIM", "PLMS", "UniPC", "DEIS"} <= names, names
    assert set(samplers.faults(own)) <= {"EDMEulerScheduler"}  # EDM preconditioning is not SD's
    assert samplers.repaired(own) == {} and samplers.tail_repair(own) == {}  # no jump: nothing capped
    assert samplers.build(own, "DDIM").config.clip_sample is False  # latents are not bounded to [-1, 1]
    pixel = diffusers.DDPMScheduler(clip_sample=True)  # a pixel-space model that asks for clipping keeps it
    assert samplers.build(pixel, "DDIM").config.clip_sample is True


# ------------------------------------------------------------------------------ fewest steps
def _unet_calls(pipeline: ImagePipeline) -> list[int]:
    """A list that grows by one per UNet call: proof that a refusal came before any model work."""
    calls: list[int] = []
    pipeline.diffusers_pipeline.unet.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


def test_plms_below_its_warm_up_is_refused_on_steps_before_any_model_work(tiny_model_dir):
    """Was: ValueError "operands could not be broadcast together with shapes (2,) (8,)" from inside
    diffusers (PNDM's PRK warm-up), which the APIs answered without naming steps or the sampler."""
    pipeline = ImagePipeline.from_pretrained(str(tiny_model_dir), DeviceManager("cpu"))
    calls = _unet_calls(pipeline)
    assert pipeline.model_info().min_steps["PLMS"] == 4
    with pytest.raises(RequestError) as refused:
        pipeline.generate(GenerationRequest(prompt=PROMPTS[0], steps=2, seed=1, sampler="PLMS"))
    assert refused.value.loc == ("steps",) and str(refused.value) == "steps: PLMS needs at least 4 steps; got 2"
    # the model's own scheduler, when the request names no sampler: a PNDM that runs its warm-up
    pipeline.diffusers_pipeline.scheduler = diffusers.PNDMScheduler.from_config(
        pipeline.diffusers_pipeline.scheduler.config
    )
    assert pipeline.scheduler_name == "PLMS"
    with pytest.raises(RequestError, match=r"^steps: PLMS needs at least 4 steps; got 3$"):
        pipeline.generate(GenerationRequest(prompt=PROMPTS[0], steps=3, seed=1))
    assert calls == []
    assert len(pipeline.generate(GenerationRequest(prompt=PROMPTS[0], steps=4, seed=1)).images) == 1
    assert calls  # the minimum itself runs


def test_sd15s_own_pndm_skips_the_warm_up_and_keeps_every_step_count(family_root):
    """SD 1.5's PNDM config says skip_prk_steps: its PLMS runs from 1 step, so nothing is refused there."""
    pipeline = ImagePipeline.from_pretrained(str(families.build("sd15", family_root / "sd15")), DeviceManager("cpu"))
    assert pipeline.scheduler_name == "PLMS" and set(pipeline.model_info().min_steps.values()) == {1}
    assert len(pipeline.generate(GenerationRequest(prompt=PROMPTS[0], steps=2, seed=1)).images) == 1


@pytest.mark.parametrize("config", ["tiny-shapes", "sd15"])
def test_each_minimum_in_the_table_runs_and_one_step_fewer_fails(config):
    """The table's numbers against diffusers itself (the measurement in docs/samplers-and-guidance.md):
    every offered sampler runs at its minimum; where the minimum is above 1, one step fewer fails."""
    if config == "sd15":
        own = diffusers.PNDMScheduler.from_config(SD15_SCHEDULER)
    else:
        own = diffusers.DPMSolverMultistepScheduler.from_pretrained(str(DEFAULT_MODEL), subfolder="scheduler")
    prediction, alphas = own.config.get("prediction_type", "epsilon"), own.alphas_cumprod.double()
    needed = samplers.minima(own)
    assert (needed["PLMS"] == 4) is (config == "tiny-shapes")
    for sampler in samplers.offered(own):
        need = needed[sampler.name]
        mean, std = samplers._sample_gaussian(prediction, alphas, samplers.build(own, sampler.name), need)
        assert math.isfinite(mean) and math.isfinite(std), sampler.name
        if need > 1:
            with pytest.raises(ValueError, match="could not be broadcast"):
                samplers._sample_gaussian(prediction, alphas, samplers.build(own, sampler.name), need - 1)


def test_a_running_requests_sampler_is_not_taken_for_the_models_own(text_to_image):
    """While a request runs with another sampler swapped in, the model still reports its own, and a
    second request naming the running one's sampler keeps it. Before, `model_info()` read the swapped
    scheduler, so `accept` took "Euler a" for the model's own, dropped it, and that request (a plot's
    next cell, another user's) ran with DPM++ 2M, labelled as such."""
    import threading

    from tests.sync import in_thread

    own = text_to_image.model_info().scheduler
    other = "Euler a" if own != "Euler a" else "Euler"
    reached, release = threading.Event(), threading.Event()

    def hold(step: int, _total: int, _image: int) -> None:
        if step == 1:
            reached.set()
            release.wait(60)

    request = GenerationRequest(prompt="a red circle on a blue background", steps=4, seed=1, sampler=other)  # Euler a: NaN at 3
    running = in_thread(text_to_image.generate, request, hold)
    try:
        assert reached.wait(120), "the request never reached its first step"
        info = text_to_image.model_info()
        assert info.scheduler == own and other in info.samplers
        assert info.accept(request).sampler == other
    finally:
        release.set()
    assert running.result(timeout=120).metadata[0]["sampler"] == other
    assert text_to_image.model_info().scheduler == own
