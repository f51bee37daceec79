"""The Video tab: a prompt (and a first frame for image-to-video) to a clip that plays in the page.

Its form is the request schema's fields of the video task (`ui.form`, task "video"): frames, fps, size,
steps, guidance, seed, and the rest under Advanced. The clip is written as H.264 MP4 (or animated WebP,
GIF, PNG frames) beside its poster PNG, with its parameters inside (`engine.outputs.OutputStore.save_clips`).
"""

from __future__ import annotations

from typing import Any

import gradio as gr

from pipelines import VIDEO_FORMATS, ModelInfo
from pipelines.schema.request import DECODE_KNOBS
from ui.form import Form, wire_step_cache
from ui.studio import Studio
from ui.text import info_line

FORMAT_LABELS = {"mp4": "MP4 (H.264)", "webp": "animated WebP", "gif": "GIF", "png": "PNG frames (zip)"}


def mode_text(info: ModelInfo) -> str:
    """What the Video tab does with the model serving video (`ModelInfo.for_video`)."""
    clips = info.clips
    if clips is None:
        return "**No video model is loaded**: set VIDEO_MODEL_ID to a Wan or LTX folder, Hub id or recipe"
    i2v = " · a first frame makes it image-to-video" if clips.image_to_video else ""
    notes = f"  \n<small>{info.notes}</small>" if info.notes else ""
    return (f"**Text-to-video** with {info.model_name} ({info.pipeline_class}): {clips.default_frames} frames at "
            f"{clips.default_fps:g} fps by default{i2v}{notes}")  # fmt: skip


def hidden_knobs(clips: Any) -> tuple[str, ...]:
    """The families' own knobs the video model does not take (their sliders hidden, their values not sent): a
    second expert's guidance (Wan 2.2 A14B), a timestep-aware VAE's decode (LTX-Video 0.9.1+)."""
    hidden = () if clips and clips.two_experts else ("guidance_scale_2",)
    return hidden + (() if clips and clips.timestep_decode else DECODE_KNOBS)


def placeholder(info: ModelInfo) -> str:
    template = str(info.vocabulary.get("prompt_template") or "")
    return template.format(color="red", shape="circle", direction="left", background="blue") if template else ""


def build(studio: Studio) -> dict[str, Any]:
    info = studio.info.for_video
    c: dict[str, Any] = {}
    form = c["form"] = Form("video", info, c, studio.engine.detect)
    with gr.Row(equal_height=False):
        with gr.Column(scale=2, min_width=300):
            form.add("prompt", lines=2, placeholder=placeholder(info))
            form.add("negative_prompt", lines=1)
            c["mode"] = gr.Markdown(mode_text(info), elem_id="video-mode")
            with gr.Row():
                form.add("num_frames")
                form.add("fps")
            c["image"] = gr.Image(label="First frame (optional: image-to-video)", type="filepath", height=160,
                                  elem_id="video-image", interactive=bool(info.clips and info.clips.image_to_video))  # fmt: skip
            form.add("seed")
            with gr.Accordion("Advanced", open=False):
                for name in ("steps", "guidance_scale", "guidance_scale_2", *DECODE_KNOBS, "width", "height", "sampler"):
                    form.add(name)
                form.add_rest()
            c["format"] = gr.Dropdown([(FORMAT_LABELS[f], f) for f in VIDEO_FORMATS], value="mp4", label="File",
                                      elem_id="video-format")  # fmt: skip
            with gr.Row():
                c["run"] = gr.Button("Generate video", variant="primary", elem_id="video-btn", interactive=info.clips is not None)
                c["stop"] = gr.Button("Stop", variant="stop")
        with gr.Column(scale=3, min_width=360):
            c["player"] = gr.Video(label="Clip", elem_id="video-player", autoplay=True, loop=True, height=360)
            c["preview"] = gr.Image(label="Frames as they form", elem_id="video-preview", height=120, interactive=False,
                                    buttons=[])  # fmt: skip
            c["info"] = gr.Markdown(elem_id="video-info")
            c["downloads"] = gr.File(label="Clips and posters (with their parameters)", file_count="multiple", height=80,
                                     interactive=False, elem_id="video-downloads")  # an output: no upload zone  # fmt: skip
    return c


def updates(info: ModelInfo, v: dict[str, Any]) -> dict[Any, Any]:
    """What changes in this tab when another model is loaded (the video model stays: its own settings)."""
    info = info.for_video
    out = v["form"].updates(info)
    out[v["mode"]] = gr.update(value=mode_text(info))
    out[v["run"]] = gr.update(interactive=info.clips is not None)
    return out


def wire(studio: Studio, v: dict[str, Any]) -> None:
    form: Form = v["form"]

    def ui_video(values: dict, request: gr.Request, progress=gr.Progress()):
        raw = form.read(values)
        for name in hidden_knobs(studio.info.for_video.clips):
            raw.pop(name, None)  # its slider is hidden: the model takes none
        for kind, value in studio.video(raw, values[v["image"]], values[v["format"]], request, progress):
            if kind == "preview":  # each clip's frames as they form, every PREVIEW_EVERY steps (a strip of 5)
                yield gr.skip(), value[0], gr.skip(), gr.skip()
            elif kind == "done":
                clips, result, posters = value
                playable = next((p for p in clips if p.endswith(".mp4")), None)
                yield playable, None, info_line(result), [*clips, *posters]

    wire_step_cache(v)
    v["run"].click(
        ui_video,
        {v["image"], v["format"], *form.inputs},
        [v["player"], v["preview"], v["info"], v["downloads"]],
        show_progress_on=[v["info"]],  # the preview stays visible while it runs
        api_visibility="private",
        concurrency_id="generate",
        concurrency_limit=None,  # the engine admits and queues (ui.demo)
    )
