"""The public API: /generate (keyword parameters as raw JSON), /xyz_plot (the same, plus the plot's axes
and options), /stop (per caller or job id), /status, /models and /load_model (switching, where allowed).

`/generate`'s parameters are the request schema's fields of the Generate tab (`ui.fields.parameters`),
each a hidden input named by Gradio's own `inputs_kwargs`; their values arrive raw (checked by the
schema, `engine.inputs.read`, not by UI sliders).
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import gradio as gr

from engine.plots import PLOT_PARAMETERS, PlotOptions, named_plot
from pipelines import VIDEO_FORMATS, GenerationRequest
from pipelines.schema.request import spec
from ui import plot_panel
from ui.fields import FORM_ONLY, api_name, parameters
from ui.form import FIRST_VALUES
from ui.status import status_json
from ui.studio import Studio, api_answers
from ui.text import info_line

UNSET = ""  # a parameter left out: "" is "the default" (the model's) to the request reader, and a default to Gradio


def default(endpoint: str, field: str) -> Any:
    """What a caller that leaves `field` out gets: the tab's first value, else the schema's default,
    else UNSET ("the model's"; the seed's is -1, random)."""
    first = FIRST_VALUES.get(endpoint, {})
    if field in first:
        return first[field]
    if field == "seed":
        return -1
    if field in FORM_ONLY:
        return False  # the random-seed switch: off (the seed decides)
    value = spec(field).default
    return UNSET if value is None else value


def label(field: str) -> str:
    """A parameter's label in the API page: the form's label, what it accepts, and what it is."""
    if field in FORM_ONLY:
        return "random seed (true: draw one)"
    item = spec(field)
    return f"{item.about.label} [{item.accepted()}]: {item.description}"


def hidden_inputs(endpoint: str, names: tuple[str, ...]) -> dict[str, Any]:
    """A hidden input per parameter, by its published name: a text box for text, JSON for the rest."""
    out = {}
    for field in names:
        value = default(endpoint, field)
        text = field not in FORM_ONLY and spec(field).kind in ("text", "prompt", "choice")
        component = gr.Textbox if text else gr.JSON
        out[api_name(endpoint, field)] = component(
            value=value if text else json.dumps(value), label=label(field), visible=False
        )
    return out


def gallery_and_info(done: tuple) -> tuple:
    """/generate's, /inpaint's and /outpaint's answer: the gallery and the result's info."""
    gallery, result, _ = done
    return gallery, result.info()


def _clips(done: tuple) -> tuple:
    """/video's answer: the first clip to play (an MP4), every file, the result's info."""
    clips, result, posters = done
    return clips[0] if clips and clips[0].endswith(".mp4") else None, [*clips, *posters], result.info()


def generate_endpoint(studio: Studio):
    """`/generate`'s function: the parameters arrive as keyword arguments named by the schema."""

    def api_generate(request: gr.Request, progress=gr.Progress(), **values: Any):
        """Generate images. seed < 0 means random (any seed 0..2^64-1 reproduces); loras maps LoRA names to
        scales; a parameter left out (or null) is the model's default; step_cache (none | FirstBlockCache |
        TaylorSeer | MagCache) works on models that have one."""
        yield from api_answers(studio.generate_live(values, request, progress), gallery_and_info, 2)

    return api_generate


def plot_inputs() -> dict[str, Any]:
    """`/xyz_plot`'s own parameters (engine.plots.PLOT_PARAMETERS) as hidden inputs: axes as text,
    options as JSON (their defaults: PlotOptions')."""
    defaults = dataclasses.asdict(PlotOptions())
    out: dict[str, Any] = {}
    for name in PLOT_PARAMETERS:
        if name.endswith(("_type", "_values")):
            what = "an axis label (GET /sdapi/v1/script-info lists them) or A1111's index" if name.endswith("_type") else (
                "A1111's values: 1, 4, 7 | 1-5 | 1-9 (+2) | 10-20 [3] | Euler a, DPM++ 2M | 512x768")  # fmt: skip
            out[name] = gr.Textbox(value="Nothing" if name.endswith("_type") else "", label=f"{name}: {what}", visible=False)
        else:
            value = list(defaults[name]) if name == "vary_seeds" else defaults[name]
            out[name] = gr.JSON(value=json.dumps(value), label=name, visible=False)
    return out


def plot_endpoint(studio: Studio):
    """`/xyz_plot`'s function: `/generate`'s parameters, then the plot's."""

    def api_xyz_plot(request: gr.Request, progress=gr.Progress(), **values: Any):
        """An X/Y/Z plot of /generate's request: up to three axes (x_type + x_values, y_..., z_...), every
        combination one request; returns the labelled grid, each cell's images and a summary (seeds,
        cells finished, warnings). Stop (/stop) ends it with the finished cells."""
        named = {name: values[name] if name.endswith(("_type", "_values")) else _json(values[name]) for name in PLOT_PARAMETERS}
        flat = {field: values[field] for field in parameters("generate")}

        def make(base: GenerationRequest):
            return named_plot(base, "txt2img", studio.info.loras, named)[:2]

        made = plot_panel.cells_of(lambda: studio.request(flat, studio.limits), make)
        out = plot_panel.run_cells(studio, made, request, progress)
        return out["grid"], out["cells"], out["info"]

    return api_xyz_plot


def _json(value: Any) -> Any:
    """A hidden JSON input's value: Gradio hands over the JSON text as sent, or the parsed value."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def edit_endpoint(studio: Studio):
    """`/edit`'s function: the files, then the Edit tab's fields by their published names."""

    def api_edit(request: gr.Request, files: Any = None, progress=gr.Progress(), **values: Any):
        """Edit the uploaded images (an instruction, or image-to-image from a prompt and a strength):
        several files give results for each. A parameter left out (or null) is the model's default;
        random_seed true draws a seed."""
        flat = {field: values[api_name("edit", field)] for field in parameters("edit")}
        if flat.pop("random_seed", False) is True:
            flat["seed"] = None
        # what the Edit tab shows, as /edit was published: pairs, the info line, the PNGs
        yield from api_answers(studio.edit(flat, files, request, progress), lambda d: (d[0], info_line(d[1]), d[2]), 3)

    return api_edit


def video_endpoint(studio: Studio):
    """`/video`'s function: an optional first frame, the file format, then the Video tab's fields by name."""

    def api_video(request: gr.Request, image: Any = None, format: str = "mp4", progress=gr.Progress(), **values: Any):
        """Make clips from a prompt (and a first frame: image-to-video): num_frames frames at fps, written as
        format (mp4 | webp | gif | zip of PNGs) with their parameters inside. A parameter left out (or null)
        is the video model's default."""
        flat = {field: values[api_name("video", field)] for field in parameters("video")}
        yield from api_answers(studio.video(flat, image, format or "mp4", request, progress), _clips, 3)

    return api_video


def wire(studio: Studio) -> None:
    """The public API: `/generate`, `/edit` and the control endpoints."""
    outputs = [gr.Gallery(visible=False, format="png"), gr.JSON(visible=False)]
    queue = dict(concurrency_id="generate", concurrency_limit=None)  # the engine admits and queues (ui.demo)
    gr.Button(visible=False).click(
        generate_endpoint(studio), inputs=[], inputs_kwargs=hidden_inputs("generate", parameters("generate")),
        outputs=outputs, api_name="generate", **queue,
    )  # fmt: skip
    files = gr.File(label="images to edit", file_count="multiple", type="filepath", visible=False)
    edited = [gr.Gallery(visible=False, format="png"), gr.Markdown(visible=False), gr.File(file_count="multiple", visible=False)]
    gr.Button(visible=False).click(
        edit_endpoint(studio), inputs=[files], inputs_kwargs=hidden_inputs("edit", parameters("edit")),
        outputs=edited, api_name="edit", **queue,
    )  # fmt: skip
    plotted = [gr.Image(visible=False, type="filepath", format="png"), gr.Gallery(visible=False, format="png"),
               gr.JSON(visible=False)]  # fmt: skip
    gr.Button(visible=False).click(
        plot_endpoint(studio), inputs=[], inputs_kwargs={**hidden_inputs("generate", parameters("generate")), **plot_inputs()},
        outputs=plotted, api_name="xyz_plot", **queue,
    )  # fmt: skip
    first = gr.File(label="first frame (image-to-video)", file_types=["image"], type="filepath", visible=False)
    fmt = gr.Dropdown(list(VIDEO_FORMATS), value="mp4", label="file format", visible=False)
    made = [gr.Video(visible=False), gr.File(file_count="multiple", visible=False), gr.JSON(visible=False)]
    gr.Button(visible=False).click(
        video_endpoint(studio), inputs=[first, fmt], inputs_kwargs=hidden_inputs("video", parameters("video")),
        outputs=made, api_name="video", **queue,
    )  # fmt: skip
    _wire_control(studio)


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
