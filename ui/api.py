"""The public API: /generate (keyword parameters as raw JSON), /stop (per caller or job id), /status,
/models and /load_model (switching, where allowed)."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gradio as gr

from ui.fields import API_FIELDS
from ui.status import status_json
from ui.studio import Studio

# Labels of /generate's parameters (what gradio_client's view_api shows beside the names).
API_LABELS = {
    "prompt": "Prompt", "negative_prompt": "Negative prompt", "num_images": "num_images", "steps": "steps",
    "guidance_scale": "guidance_scale", "width": "width", "height": "height", "seed": "seed (-1: random)",
    "loras": "loras (name -> scale)", "sampler": "sampler (\"\": the model's)",
    "guidance_end": "guidance_end (share of the steps with guidance; null: the model's)",
    "step_cache": "step_cache (none | FirstBlockCache | TaylorSeer | MagCache; null: the model's)",
    "step_cache_threshold": "step_cache_threshold (0..1; null: the method's default)",
}  # fmt: skip


def api_defaults(studio: Studio) -> dict[str, Any]:
    """The value each /generate parameter takes when a caller leaves it out."""
    info = studio.info
    return {
        "prompt": "", "negative_prompt": "", "num_images": 4, "steps": info.default_steps,
        "guidance_scale": info.default_guidance, "width": info.default_width, "height": info.default_height,
        "seed": -1, "loras": {}, "sampler": "", "guidance_end": None, "step_cache": None,
        "step_cache_threshold": None,
    }  # fmt: skip


def with_parameters(fn: Any, names: Sequence[str], defaults: Mapping[str, Any] | None = None) -> Any:
    """Name the public parameters of `fn(request, *values, progress)` for Gradio, which reads a handler's
    signature for the API's parameter names and for where to pass the request and the progress tracker.
    Built from a list of fields, so the API cannot drift from the form (ui.fields)."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    given = {} if defaults is None else defaults
    params = [inspect.Parameter("request", kind, annotation=gr.Request)]  # first: it has no default
    params += [inspect.Parameter(n, kind, **({"default": given[n]} if n in given else {})) for n in names]
    params.append(inspect.Parameter("progress", kind, default=gr.Progress()))
    fn.__signature__ = inspect.Signature(params)
    fn.__annotations__ = {"request": gr.Request}
    return fn


def generate_endpoint(studio: Studio):
    """`/generate`'s function, its parameters named by API_FIELDS (Gradio reads the signature)."""

    def api_generate(*args: Any):
        request, *values, progress = args
        raw = dict(zip(API_FIELDS, values, strict=True))
        gallery, result, _ = studio.generate(raw, request, progress)
        return gallery, result.info()

    with_parameters(api_generate, API_FIELDS, api_defaults(studio))
    api_generate.__doc__ = (
        "Generate images. seed < 0 means random (any seed 0..2^64-1 reproduces); loras maps LoRA names to "
        "scales; sampler \"\" is the model's; guidance_end null is the model's; step_cache null is the model's "
        "(none | FirstBlockCache | TaylorSeer | MagCache, on models that have one)."
    )
    return api_generate


def wire(studio: Studio) -> Any:
    """The public API: keyword parameters taken as raw JSON (checked by ui.inputs, not by UI sliders).
    Returns /generate's function, for `accept_shorter_calls` once the Blocks exist."""
    defaults = api_defaults(studio)
    api_inputs = [gr.Textbox(value=defaults[n], label=API_LABELS[n], visible=False) for n in API_FIELDS[:2]]
    api_inputs += [gr.JSON(value=json.dumps(defaults[n]), label=API_LABELS[n], visible=False) for n in API_FIELDS[2:]]
    event = gr.Button(visible=False).click(
        generate_endpoint(studio),
        api_inputs,
        [gr.Gallery(visible=False, format="png"), gr.JSON(visible=False)],
        api_name="generate",
        concurrency_id="generate",
        concurrency_limit=None,  # the engine admits and queues (ui.demo)
    )
    _wire_control(studio)
    return event.fn


PUBLISHED = API_FIELDS.index("sampler") + 1  # /generate's values that callers have always sent


def accept_shorter_calls(blocks: gr.Blocks, published: Mapping[Any, tuple[int, Callable[[], list[Any]]]]) -> None:
    """Let a call of each `fn` in `published` that sends only the values its callers have always sent
    through. `published[fn]` is (that count, a function giving the values of the inputs added since,
    read at call time: the loaded model's defaults).

    gradio_client fills parameters it knows to have defaults, but a plain REST caller sends a list,
    and Gradio refuses a list shorter than the inputs before our function sees it
    (`Blocks.validate_inputs`). So this Blocks' check pads such a call first.
    """
    check = blocks.validate_inputs

    def validate_inputs(block_fn: Any, inputs: list[Any]) -> None:
        count, added = published.get(block_fn.fn, (len(block_fn.inputs), list))
        if count <= len(inputs) < len(block_fn.inputs):
            inputs.extend(added()[len(inputs) - count :])
        check(block_fn, inputs)

    blocks.validate_inputs = validate_inputs  # type: ignore[method-assign]


def generate_padding() -> tuple[int, Callable[[], list[Any]]]:
    """/generate's published values, and null (the model's) for each parameter added since."""
    return PUBLISHED, lambda: [None] * (len(API_FIELDS) - PUBLISHED)


def _wire_control(studio: Studio) -> None:
    """/stop, /status, /models and /load_model."""

    def stop(job_id: str, request: gr.Request) -> dict[str, int]:
        """Stop a generation: the caller's session, or the REST job whose event id is `job_id`."""
        return studio.stop(job_id, request)

    gr.Button(visible=False).click(
        stop, gr.Textbox(value="", visible=False, label="job_id"), gr.JSON(visible=False), api_name="stop", queue=False
    )

    def status() -> dict:
        """Every replica's device, dtype, attention, memory and what it does now."""
        return status_json(studio.engine.status())

    gr.api(status, api_name="status", queue=False)

    def list_models() -> dict:
        """What can be loaded (recipes and MODELS_DIR folders), the current model, whether switching is allowed."""
        return studio.models()

    gr.api(list_models, api_name="models", queue=False)

    def load_model(name: str, progress=gr.Progress()) -> dict:
        """Switch every replica to the model `name` (one of /models); its defaults and limits come back.
        Allowed by default only when the server listens on localhost (ALLOW_MODEL_SWITCH)."""
        return studio.load_model(name, progress).to_dict()

    gr.Button(visible=False).click(
        load_model, gr.Textbox(visible=False, label="name"), gr.JSON(visible=False), api_name="load_model",
        concurrency_id="switch",
    )  # fmt: skip
