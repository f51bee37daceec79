"""Few-step generation (pipelines.sampling.few_step, issue 58): the embedded fast model as `python app.py`
offers it, the LCM and TCD samplers on a model whose own scheduler is DPM++, the kind's sampler, steps and
guidance applied when a few-step model or LoRA is picked, and what breaks one refused with the reason."""

from __future__ import annotations

import numpy as np
import pytest

from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline
from pipelines.run.options import DEFAULT_MODEL, PipelineOptions
from pipelines.sampling import few_step, samplers
from pipelines.schema.fields import RequestError
from pipelines.weights import catalog

PROMPT = "a red circle on a blue background"


@pytest.fixture(scope="module")
def fast():
    return ImagePipeline.from_pretrained("tiny-shapes-fast", DeviceManager("cpu"), PipelineOptions(runtime="torch"))


@pytest.fixture(scope="module")
def base():
    return ImagePipeline.from_pretrained(DEFAULT_MODEL, DeviceManager("cpu"), PipelineOptions(runtime="torch"))


def test_kinds_are_found_by_the_names_people_download():
    names = {
        "lcm-lora-sdv1-5": ("LCM", 4), "LCM_Dreamshaper_v7": ("LCM", 4), "tiny-shapes-lcm.safetensors": ("LCM", 4),
        "TCD-SD15-LoRA": ("TCD", 4), "Hyper-SD15-2steps-lora.safetensors": ("Hyper-SD", 2),
        "Hyper-SDXL-8steps-CFG-lora": ("Hyper-SD", 8), "sdxl_lightning_4step_lora.safetensors": ("Lightning", 4),
        "stabilityai/sd-turbo": ("Turbo", 1), "stabilityai/sdxl-turbo": ("Turbo", 1),
    }  # fmt: skip
    for name, (kind, steps) in names.items():
        found = few_step.find([name])
        assert found is not None and (found.name, found.steps) == (kind, steps), name
    assert few_step.find(["Hyper-SDXL-8steps-CFG-lora"]).guidance_max == 8.0  # the CFG-preserving variant
    for plain in ("outline", "lightning-bolt-style", "runwayml/stable-diffusion-v1-5", "calcmodel"):
        assert few_step.find([plain]) is None, plain


def test_lcm_and_tcd_are_offered_on_a_dpm_model(base):
    offered = [s.name for s in samplers.offered(base.own_scheduler)]
    assert "LCM" in offered and "TCD" in offered  # diffusers' compatibles list leaves them out


def test_the_fast_model_is_in_the_picker_with_its_defaults(fast):
    assert "tiny-shapes-fast" in [m.name for m in catalog.list_models(None) if m.why_not in (None, "")]
    info = fast.model_info()
    assert (info.default_steps, info.default_guidance, info.scheduler) == (4, 1.0, "LCM")
    result = fast.generate(GenerationRequest(prompt=PROMPT, seed=1))
    meta = result.metadata[0]
    assert (meta["steps"], meta["sampler"], meta["guidance_scale"]) == (4, "LCM", 1.0)


def test_the_fast_model_draws_what_the_prompt_asks_in_four_steps(fast):
    """16 scenes of the world at the recipe's 4 steps: colour, shape and background right in at least 15 (the
    refined LCM-LoRA gets 200 of 200 in models.eval --few-step; the first, bootstrap-only one got 77 %)."""
    from models.eval import evaluate

    row = evaluate(fast, 16, 3)
    assert row["steps"] == 4 and row["all_three"] >= 15 / 16, row["rows"]


def test_a_few_step_lora_picked_on_the_base_model_brings_its_sampler_and_steps(base, fast):
    """The same LoRA as a request's LoRA on tiny-shapes (not fused): LCM, 4 steps, guidance off, the fast
    model's picture within rounding (fused vs. peft layers)."""
    picked = base.generate(GenerationRequest(prompt=PROMPT, seed=2, loras={"tiny-shapes-lcm": 1.0}))
    meta = picked.metadata[0]
    assert (meta["steps"], meta["sampler"], meta["guidance_scale"]) == (4, "LCM", 1.0)
    fused = fast.generate(GenerationRequest(prompt=PROMPT, seed=2))
    diff = np.abs(np.asarray(picked.images[0], float) - np.asarray(fused.images[0], float))
    assert diff.max() <= 3


@pytest.mark.parametrize(
    ("fields", "field", "says"),
    [
        ({"guidance_scale": 5.0}, "guidance_scale", "at most 2"),
        ({"sampler": "DPM++ 2M"}, "sampler", "use LCM, TCD"),
        ({"sampler": "Euler"}, "sampler", "distilled for"),
        ({"steps": 20}, "steps", "at most 8"),
    ],
)
def test_what_breaks_a_few_step_model_is_refused_naming_the_field(fast, base, fields, field, says):
    for pipeline, extra in ((fast, {}), (base, {"loras": {"tiny-shapes-lcm": 1.0}})):
        with pytest.raises(RequestError, match=says) as caught:
            pipeline.generate(GenerationRequest(prompt=PROMPT, seed=1, **fields, **extra))
        assert caught.value.loc == (field,)


def test_a_step_cache_is_refused_on_a_few_step_kind():
    kind = few_step.find(["lcm-lora-sdxl"])
    with pytest.raises(RequestError, match=r"no.*to spare"):
        few_step.check(kind, GenerationRequest(prompt=PROMPT, step_cache="FirstBlockCache", guidance_scale=1.0), "LCM")


def test_lightning_gets_trailing_timesteps(base):
    kind = few_step.find(["sdxl_lightning_4step_lora"])
    built = samplers.build(base.own_scheduler, kind.sampler, dict(kind.scheduler_options))
    built.set_timesteps(kind.steps)
    assert built.config.timestep_spacing == "trailing" and int(built.timesteps[0]) == 999
