"""The public API: /generate (keyword parameters as raw JSON), /stop (per caller or job id), /status,
/models and /load_model (switching, where allowed)."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from ui.status import status_json
from ui.studio import Studio


def wire(studio: Studio) -> None:
    """The public API: keyword parameters taken as raw JSON (checked by ui.inputs, not by UI sliders)."""

    def api_generate(
        prompt: str,
        negative_prompt: str,
        num_images: Any,
        steps: Any,
        guidance_scale: Any,
        width: Any,
        height: Any,
        seed: Any,
        loras: Any,
        sampler: Any,
        request: gr.Request,
        progress=gr.Progress(),
    ):
        """Generate images. seed < 0 means random; loras maps LoRA names to scales; sampler "" is the model's."""
        raw = dict(prompt=prompt, negative_prompt=negative_prompt, num_images=num_images, steps=steps,
                   guidance_scale=guidance_scale, width=width, height=height, seed=seed, loras=loras,
                   sampler=sampler)  # fmt: skip
        gallery, result, _ = studio.generate(raw, request, progress)
        return gallery, result.info()

    info = studio.info
    defaults = [("", "Prompt"), ("", "Negative prompt")]
    numbers = [(4, "num_images"), (info.default_steps, "steps"), (info.default_guidance, "guidance_scale"),
               (info.default_width, "width"), (info.default_height, "height"), (-1, "seed (-1: random)"),
               ({}, "loras (name -> scale)"), ("", "sampler (\"\": the model's)")]  # fmt: skip
    api_inputs = [gr.Textbox(value=v, label=label, visible=False) for v, label in defaults]
    api_inputs += [gr.JSON(value=json.dumps(v), label=label, visible=False) for v, label in numbers]
    api_btn = gr.Button(visible=False)
    api_btn.click(
        api_generate,
        api_inputs,
        [gr.Gallery(visible=False, format="png"), gr.JSON(visible=False)],
        api_name="generate",
        concurrency_id="gpu",
        concurrency_limit=studio.backend.concurrency,
    )
    job_id = gr.Textbox(value="", visible=False, label="job_id")
    stopped = gr.JSON(visible=False)

    async def stop(job_id: str, request: gr.Request) -> dict[str, int]:
        """Stop a generation: the caller's session, or the REST job whose event id is `job_id`."""
        return await studio.stop(job_id, request)

    gr.Button(visible=False).click(stop, job_id, stopped, api_name="stop", queue=False)

    def status() -> dict:
        """Every replica's device, dtype, attention, memory and what it does now."""
        return status_json(studio.backend.status())

    gr.api(status, api_name="status", queue=False)

    def list_models() -> dict:
        """What can be loaded (recipes and MODELS_DIR folders), the current model, whether switching is allowed."""
        return studio.models()

    gr.api(list_models, api_name="models", queue=False)

    def load_model(name: str, progress=gr.Progress()) -> dict:
        """Switch every replica to the model `name` (one of /models); its defaults and limits come back.
        Allowed by default only when the server listens on localhost (ALLOW_MODEL_SWITCH)."""
        return studio.load_model(name, progress).to_dict()

    model_name = gr.Textbox(visible=False, label="name")
    gr.Button(visible=False).click(
        load_model, model_name, gr.JSON(visible=False), api_name="load_model", concurrency_id="gpu"
    )
