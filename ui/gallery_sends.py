"""The Send buttons under result galleries: the chosen picture to Inpaint, ControlNet, Video or Upscale.

Inpaint takes it as the picture to paint on, ControlNet as a unit's control image, Video as the first
frame (image-to-video), Upscale as the image to enlarge (A1111's "Send to extras").

A gallery's select event records which result is chosen (the first when none was); each button sends
that result's PNG. The Edit gallery shows each result after its input, so its stride is 2. A target
is a handler of the picture's path (and of the values of its own inputs) and the components it sets.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gradio as gr

from ui.control_panel import ControlPanel
from ui.inpaint_tab import send_image
from ui.send import inpaint_targets
from ui.studio import Studio

EVENTS = dict(api_visibility="private", queue=False)


@dataclass(frozen=True)
class Target:
    """Where a Send button takes a picture: `handler(path, *values of inputs)` -> updates of `outputs`."""

    handler: Callable[..., dict[Any, Any]]
    inputs: list[Any]
    outputs: list[Any]


@dataclass(frozen=True)
class Source:
    """A result gallery, its PNG downloads (the files sent), gallery items per result, its Send buttons by target."""

    gallery: Any
    downloads: Any
    stride: int
    buttons: dict[str, Any]


def to_inpaint(studio: Studio, i: dict[str, Any], tabs: gr.Tabs) -> Target:
    """The picture as the Inpaint editor's, its parameters in the Inpaint form, the tab opened."""
    return Target(lambda path: send_image(studio, path, i, tabs), [], [*inpaint_targets(i["form"]), tabs])


def to_controlnet(g: dict[str, Any], tabs: gr.Tabs) -> Target:
    """The picture as the control image of the Generate tab's first free ControlNet unit, the tab opened
    (A1111's and Forge's way to reuse a result's composition: its edges, its silhouette)."""
    panel: ControlPanel = g["form"].c["controlnet"]

    def handler(path: str | None, *images: Any) -> dict[Any, Any]:
        if not path:
            raise gr.Error("select an image first", print_exception=False)
        return {**panel.receive(path, list(images)), tabs: gr.Tabs(selected="generate")}

    return Target(handler, panel.images, [*panel.receivers, tabs])


def to_video(v: dict[str, Any], tabs: gr.Tabs) -> Target:
    """The picture as the Video tab's first frame (image-to-video), the tab opened."""

    def handler(path: str | None) -> dict[Any, Any]:
        if not path:
            raise gr.Error("select an image first", print_exception=False)
        return {v["image"]: path, tabs: gr.Tabs(selected="video")}

    return Target(handler, [], [v["image"], tabs])


def to_upscale(u: dict[str, Any], tabs: gr.Tabs) -> Target:
    """The picture as the Upscale tab's image (its PNG, parameters inside), the tab opened."""

    def handler(path: str | None) -> dict[Any, Any]:
        if not path:
            raise gr.Error("select an image first", print_exception=False)
        return {u["files"]: [path], tabs: gr.Tabs(selected="upscale")}

    return Target(handler, [], [u["files"], tabs])


def _picker(stride: int) -> Callable[[gr.SelectData], int]:
    """A gallery's select event -> the index of the result chosen (`stride` gallery items per result)."""

    def pick(evt: gr.SelectData) -> int:
        return evt.index // stride

    return pick


def _sender(target: Target) -> Callable[..., dict[Any, Any]]:
    def send(paths: list[str] | None, index: int, *values: Any) -> dict[Any, Any]:
        paths = paths or []
        return target.handler(paths[min(index, len(paths) - 1)] if paths else None, *values)

    return send


def wire(sources: list[Source], targets: dict[str, Target]) -> None:
    """Each source's buttons send its chosen result to their target."""
    for source in sources:
        chosen = gr.State(0)
        source.gallery.select(_picker(source.stride), None, chosen, **EVENTS)
        for name, button in source.buttons.items():
            target = targets[name]
            button.click(_sender(target), [source.downloads, chosen, *target.inputs], target.outputs, **EVENTS)
