"""What a node class is, and the registry of those served (`NODES`).

A class declares its inputs (`In`: a value with bounds taken from our request schema where the
schema has the field, a choice list from the server's catalog, or a link of a ComfyUI type), its
outputs, and a function of a `Context` (`execute.Run`) and those inputs. `/object_info` is
generated from these declarations and the graph is validated against them (`graph`); the classes
themselves are in `nodes` and `nodes_more`, registered when `graph` imports them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipelines.schema.request import spec

MAX_TEXT = 1 << 16  # characters of one STRING input
LINKED = "<linked>"  # what a node's `check` sees for an input given as a link (its value is known only when it runs)


@dataclass(frozen=True)
class VideoLimits:
    """The video model's abilities and limits (`ModelInfo.for_video`): what a video latent node is checked against."""

    name: str
    frame_step: int  # a clip has k x frame_step + 1 frames
    max_frames: int
    text_to_video: bool
    image_to_video: bool
    max_batch: int
    max_pixels: int
    max_side: int


@dataclass(frozen=True)
class Catalog:
    """The server's names that choice inputs offer (built per call: uploads are the caller's)."""

    models: tuple[str, ...]
    loras: tuple[str, ...]
    samplers: tuple[str, ...]  # ComfyUI's names of the samplers the model offers
    schedulers: tuple[str, ...]
    uploads: tuple[str, ...]
    upscale_models: tuple[str, ...]
    latent_methods: tuple[str, ...]
    controlnets: tuple[str, ...] = ()
    size_multiple: int = 8  # the model's limits (ModelInfo): what a node's size and batch are checked against
    max_batch: int = 16
    max_pixels: int = 2048 * 2048
    max_side: int = 16384
    video: VideoLimits | None = None  # the video model served (beside the image model, or the model itself), if any

    @property
    def served(self) -> tuple[str, ...]:
        """Every model the server runs, by name: the image model first, then the video model."""
        extra = (self.video.name,) if self.video and self.video.name not in self.models else ()
        return (*self.models, *extra)


@dataclass(frozen=True)
class In:
    """One input: `type` is INT, FLOAT, STRING, BOOLEAN, COMBO or a link type (MODEL, LATENT, ...)."""

    type: str
    default: Any = None
    low: float | None = None
    high: float | None = None
    step: float | None = None
    choices: Callable[[Catalog], tuple[str, ...]] | None = None
    optional: bool = False
    multiline: bool = False
    max_chars: int = MAX_TEXT  # a STRING's longest (a base64 picture's is the body's bound)

    @property
    def linked(self) -> bool:
        return self.type not in ("INT", "FLOAT", "STRING", "BOOLEAN", "COMBO")


def from_schema(name: str, kind: str, default: Any, step: float | None = None, **kw: Any) -> In:
    """A number input bounded by our request field `name` (one fact: the schema's Range)."""
    value = spec(name).value
    high = getattr(value, "high", None)
    low = getattr(value, "low", 0)
    return In(kind, default, low, high, step, **kw)


@dataclass(frozen=True)
class NodeType:
    name: str
    inputs: dict[str, In]
    outputs: tuple[str, ...]
    run: Callable[..., tuple]
    category: str
    output_names: tuple[str, ...] = ()
    output_node: bool = False
    description: str = ""
    refused: str = ""  # listed for clients that read it, but never run (why)
    fingerprint: Callable[[Any, dict[str, Any]], Any] | None = None  # what else its output depends on (a file's state)
    check: Callable[[Catalog, dict[str, Any]], list[tuple[str, str]]] | None = None  # (input, why) against the model's limits


NODES: dict[str, NodeType] = {}


def node(name: str, category: str, inputs: dict[str, In], outputs: tuple[str, ...] = (), **kw: Any) -> Callable:
    def register(fn: Callable[..., tuple]) -> Callable[..., tuple]:
        NODES[name] = NodeType(name, inputs, outputs, fn, category, description=(fn.__doc__ or "").strip(), **kw)
        return fn

    return register


def fits(width_key: str, height_key: str, batch_key: str | None = None) -> Callable[[Catalog, dict[str, Any]], list]:
    """A node's check that its size (and batch) fit the model's limits: the engine would refuse the
    request later, and a picture that large is memory the server may not have."""

    def check(c: Catalog, values: dict[str, Any]) -> list[tuple[str, str]]:
        width, height = values[width_key], values[height_key]
        out = [(k, f"larger than the model's largest side, {c.max_side}") for k in (width_key, height_key) if values[k] > c.max_side]
        if width * height > c.max_pixels:
            out.append((width_key, f"{width}x{height} is more than the model's {c.max_pixels} pixels"))
        if batch_key and values[batch_key] > c.max_batch:
            out.append((batch_key, f"more than the model's {c.max_batch} images at once (MAX_BATCH)"))
        return out

    return check


def link(kind: str, **kw: Any) -> In:
    return In(kind, **kw)


def combo(choices: Callable[[Catalog], tuple[str, ...]], default: str | None = None) -> In:
    return In("COMBO", default, choices=choices)


CKPT = combo(lambda c: c.served)
SEED = from_schema("seed", "INT", 0)
STEPS = from_schema("steps", "INT", 20)
CFG = from_schema("guidance_scale", "FLOAT", 8.0, 0.1)
SAMPLER = combo(lambda c: c.samplers, "euler")
SCHEDULER = combo(lambda c: c.schedulers, "normal")
DENOISE = In("FLOAT", 1.0, 0.0, 1.0, 0.01)
SIZE = In("INT", 512, 16, spec("width").value.high, 8)
SIZE0 = In("INT", 512, 0, spec("width").value.high, 8)  # 0: from the other side, keeping the aspect ratio
BATCH = In("INT", 1, 1, 64)
TEXT = In("STRING", "", multiline=True)
LORA_STRENGTH = In("FLOAT", 1.0, spec("loras").value.scale.low, spec("loras").value.scale.high, 0.01)
