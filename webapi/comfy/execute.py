"""Running a checked graph: nodes in dependency order, each node's outputs cached between runs.

`Run` is what a node sees (`sampler.Context` and more): it runs a sampler's request through the
engine when pixels are needed (`pictures`), reporting `progress` per step and, when the prompt
asks for previews, JPEG preview frames; it saves pictures for SaveImage/PreviewImage and reads
uploads for LoadImage. `execute` walks the graph, sends ComfyUI's websocket messages
(`execution_start`, `execution_cached`, `executing`, `executed`, `executing` null) and fills the
history's outputs. A node's cache key is its class, its values and its inputs' keys (and the
model served), so an identical second prompt is answered from the cache without any engine job.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import secrets
import struct
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PIL import Image, PngImagePlugin

from engine import Caller, CancelledBeforeStart, Engine, Finished, Preview, Progress, QueueFull, TooManyJobs
from engine.jobs import Job
from engine.outputs import OutputStore, day_folder

from .graph import Graph, order
from .sampler import LATENT_METHODS
from .values import RESAMPLE, Latent, Pictures, Sampled

if TYPE_CHECKING:
    from pipelines import GenerationResult, ModelInfo

SAFE_NAME = re.compile(r"^[\w][\w .()\-]{0,127}$")
PREVIEW_EVENT, JPEG = 1, 1
ADMISSION_WAIT = 600.0  # seconds a sampler waits for the engine to admit its job


class Interrupted(Exception):
    """/interrupt (or the prompt deleted while running) stopped it."""


@dataclass
class Folders:
    """Where a caller's files are: outputs (History's folder), temp (PreviewImage) and input (uploads)."""

    outputs: OutputStore
    scratch: Path  # this server's temporary folder: temp/ and input/ per caller

    def root(self, kind: str, owner: str | None) -> Path:
        if kind == "output":
            return self.outputs.folder(owner)
        if kind not in ("temp", "input"):
            raise FileNotFoundError(kind)
        tag = hashlib.sha256((owner or "").encode()).hexdigest()[:16]
        return self.scratch / kind / tag

    def find(self, kind: str, owner: str | None, subfolder: str, filename: str) -> Path:
        """A caller's file by ComfyUI's (type, subfolder, filename); FileNotFoundError for anything else
        (another caller's, a path trick, a name that is not a plain file name)."""
        parts = [p for p in subfolder.replace("\\", "/").split("/") if p] if subfolder else []
        if not SAFE_NAME.match(filename) or any(not SAFE_NAME.match(p) for p in parts):
            raise FileNotFoundError(filename)
        root = self.root(kind, owner).resolve()
        path = root.joinpath(*parts, filename).resolve()
        if not path.is_relative_to(root) or not path.is_file():
            raise FileNotFoundError(filename)
        return path


@dataclass
class Run:
    """One prompt's execution, as its nodes see it."""

    prompt_id: str
    engine: Engine
    caller: Caller
    owner: str | None
    folders: Folders
    graph: Graph
    send: Callable[[Any], None]  # a JSON message (dict) or a binary frame (bytes) to the prompt's client
    previews: bool = False
    workflow: Any = None
    node: str = ""
    warnings: list[str] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)
    job: Job | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def warn(self, text: str) -> None:
        self.warnings.append(text)

    def latent_upscalers(self) -> tuple[str, ...]:
        return tuple(self.engine.model_info().upscalers)

    def model_name(self) -> str:
        return self.engine.model_info().model_name

    def video_info(self) -> ModelInfo | None:
        """The model video requests go to (beside the image model, or the model itself), None when none makes clips."""
        video = self.engine.model_info().for_video
        return video if video.clips is not None else None

    def served(self) -> tuple[str, ...]:
        video = self.video_info()
        return (self.model_name(), *((video.model_name,) if video and video.model_name != self.model_name() else ()))

    def max_pixels(self) -> int:
        return self.engine.model_info().max_pixels

    def size_multiple(self) -> int:
        return self.engine.model_info().size_multiple

    def check_size(self, width: int, height: int) -> None:
        """ValueError for a size the model refuses (known only once a node's input size is)."""
        info = self.engine.model_info()
        if width * height > info.max_pixels or max(width, height) > info.max_side:
            raise ValueError(f"{width}x{height} is larger than the model takes ({info.max_pixels} pixels, sides to {info.max_side})")

    def interrupt(self) -> None:
        with self._lock:
            self.stopped.set()
            job = self.job
        if job is not None:
            self.engine.cancel(job)

    def pictures(self, latent: Latent) -> Pictures:
        if latent.sampled is not None:
            found = self._sampled(latent.sampled)
        elif latent.pixels is not None:
            found = latent.pixels
        else:  # an empty latent decodes to grey, as ComfyUI's zeros do (a video latent: each of its frames)
            count = latent.batch * (latent.frames or 1)
            found = Pictures(tuple(Image.new("RGB", (latent.width, latent.height), (128, 128, 128)) for _ in range(count)))
        if latent.upscale_method and found.images and found.images[0].size != (latent.width, latent.height):
            resample = RESAMPLE[latent.upscale_method]
            found = Pictures(tuple(im.resize((latent.width, latent.height), resample) for im in found.images),
                             found.metadata, found.seeds)  # fmt: skip
        return found

    def _sampled(self, sampled: Sampled) -> Pictures:
        """The sampler's request run as one engine job (once), its steps and previews reported."""
        if sampled.outcome:
            return sampled.outcome[0]
        job = self._submit(sampled)
        result, last = None, -1
        try:
            for event in job.events():
                if isinstance(event, Progress) and event.total and event.step != last and not event.note:  # once per step
                    last = event.step
                    self.send({"type": "progress", "data": {"value": event.step, "max": event.total,
                                                            "prompt_id": self.prompt_id, "node": sampled.node}})  # fmt: skip
                elif isinstance(event, Preview) and self.previews and event.images:
                    self.send(preview_frame(event.images[-1]))
                elif isinstance(event, Finished):
                    result = event.result
        except CancelledBeforeStart:
            raise Interrupted("interrupted before it started") from None
        finally:
            with self._lock:
                self.job = None
        if self.stopped.is_set():
            raise Interrupted("interrupted")
        if result is None or result.cancelled or not result.images:  # TIME_BUDGET: no partial batch is cached
            raise ValueError("; ".join(result.warnings if result else []) or "the sampler made no image")
        self.warnings.extend(result.warnings)
        found = frames_of(result) if result.clips else Pictures(tuple(result.images), tuple(result.metadata), tuple(result.seeds))
        sampled.outcome.append(found)
        return found

    def _submit(self, sampled: Sampled) -> Job:
        """The engine job, submitted when the engine admits it: while the caller is at QUEUE_PER_USER
        (its UI or other API jobs) or the queue is full, the prompt waits (Stop ends the wait)."""
        deadline = time.monotonic() + ADMISSION_WAIT
        while True:
            if self.stopped.is_set():
                raise Interrupted("interrupted")
            try:
                job = self.engine.submit(sampled.request, self.caller)
                break
            except (TooManyJobs, QueueFull):
                if time.monotonic() > deadline:
                    raise
                self.stopped.wait(0.25)  # the engine has no "admitted" event to wait on
        with self._lock:
            self.job = job
            stopped = self.stopped.is_set()
        if stopped:  # /interrupt came between the check above and here
            self.engine.cancel(job)
        return job

    def upload_path(self, name: str) -> Path:
        return self.folders.find("input", self.owner, "", name)

    def upload(self, name: str) -> Image.Image:
        with Image.open(self.upload_path(name)) as image:
            image.load()
            return image.copy()

    def upscale(self, images: list[Image.Image], model: str) -> list[Image.Image]:
        scale = next(u.scale for u in self.engine.upscalers.list(latent=False) if u.name == model)
        return self.engine.upscale(images, model, factor=float(scale))

    def save(self, pictures: Pictures, prefix: str, temp: bool) -> tuple:
        """The ComfyUI `ui` output of SaveImage/PreviewImage: each picture written as a PNG with
        ComfyUI's `prompt` and `workflow` chunks and, when a sampler made it, our parameters."""
        extra = self.comfy_text()
        kind = "temp" if temp else "output"
        if not temp and pictures.metadata:
            saved = self.folders.outputs.save_pictures(list(pictures.images), list(pictures.metadata), self.owner, extra)
        else:
            saved = [self._write(image, kind, extra) for image in pictures.images]
        root = self.folders.root(kind, self.owner)
        images = [{"filename": p.name, "subfolder": p.parent.relative_to(root).as_posix().removeprefix("."), "type": kind}
                  for p in saved]  # fmt: skip
        return ({"images": images},)

    def comfy_text(self) -> dict[str, str]:
        """ComfyUI's metadata of a saved file: the graph as `prompt`, the client's `workflow` when it sent one."""
        return {"prompt": json.dumps(self.graph.raw)} | ({"workflow": json.dumps(self.workflow)} if self.workflow else {})

    def _write(self, image: Image.Image, kind: str, extra: dict[str, str]) -> Path:
        folder = day_folder(self.folders.root(kind, self.owner))
        folder.mkdir(parents=True, exist_ok=True)
        info = PngImagePlugin.PngInfo()
        for key, text in extra.items():
            info.add_text(key, text)
        path = folder / f"ComfyUI-{secrets.token_hex(8)}.png"
        image.save(path, format="PNG", pnginfo=info)
        return path


def frames_of(result: GenerationResult) -> Pictures:
    """A video result as ComfyUI's VAEDecode gives a video latent: every frame of every clip in one batch, each
    with its clip's metadata and seed."""
    frames = [(frame, meta, seed) for clip, meta, seed in zip(result.clips, result.metadata, result.seeds, strict=True) for frame in clip]
    return Pictures(tuple(f for f, _, _ in frames), tuple(m for _, m, _ in frames), tuple(s for _, _, s in frames))


def preview_frame(image: Image.Image) -> bytes:
    """ComfyUI's binary preview frame: event 1 (preview), format 1 (JPEG), then the JPEG."""
    buffer = io.BytesIO()
    image.convert("RGB").save(buffer, format="JPEG", quality=85)
    return struct.pack(">II", PREVIEW_EVENT, JPEG) + buffer.getvalue()


class Cache:
    """Each node's outputs by its key, least recently used dropped first (one per caller)."""

    def __init__(self, size: int = 64):
        self.size = size
        self._items: OrderedDict[str, tuple] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> tuple | None:
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                return self._items[key]
            return None

    def put(self, key: str, value: tuple) -> None:
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self.size:
                self._items.popitem(last=False)


def keys(run: Run, nodes: list[str]) -> dict[str, str]:
    """Each node's cache key: its class, values, its inputs' keys, the model served and what else its
    output depends on (an upload's state: `NodeType.fingerprint`)."""
    model = run.engine.model_info().model_name
    out: dict[str, str] = {}
    for node_id in nodes:
        node = run.graph.nodes[node_id]
        inputs = {name: [out[src], index] for name, (src, index) in node.links.items()}
        state = node.type.fingerprint(run, node.values) if node.type.fingerprint else None
        text = json.dumps([model, node.type.name, node.values, inputs, state], sort_keys=True, default=str)
        out[node_id] = hashlib.sha256(text.encode()).hexdigest()
    return out


def execute(run: Run, cache: Cache) -> dict[str, Any]:
    """Run the graph; returns the output nodes' `ui` outputs (history's `outputs`). Only what the
    outputs need runs: the walk back from each output stops at a node answered from the cache."""
    graph, pid = run.graph, run.prompt_id
    nodes = order(graph)
    node_keys = keys(run, nodes)
    results = {n: found for n in nodes if (found := cache.get(node_keys[n])) is not None}
    needed = _needed(graph, results)
    run.send({"type": "execution_start", "data": {"prompt_id": pid, "timestamp": int(time.time() * 1000)}})
    run.send({"type": "execution_cached", "data": {"nodes": [n for n in nodes if n not in needed], "prompt_id": pid}})
    outputs: dict[str, Any] = {}
    for node_id in nodes:
        node = graph.nodes[node_id]
        if node_id in needed:
            if run.stopped.is_set():
                raise Interrupted("interrupted")
            run.node = node_id
            run.send({"type": "executing", "data": {"node": node_id, "display_node": node_id, "prompt_id": pid}})
            args = {**node.values, **{name: results[src][index] for name, (src, index) in node.links.items()}}
            results[node_id] = node.type.run(run, **args)
            cache.put(node_keys[node_id], results[node_id])
        if node.type.output_node:  # sent for a cached one too, as ComfyUI does: clients collect images from it
            outputs[node_id] = results[node_id][0]
            run.send({"type": "executed", "data": {"node": node_id, "display_node": node_id, "output": outputs[node_id],
                                                   "prompt_id": pid}})  # fmt: skip
    return outputs


def _needed(graph: Graph, cached: dict[str, Any]) -> set[str]:
    """The nodes that must run: back from the outputs, through every node not in the cache."""
    needed: set[str] = set()
    stack = [n for n in graph.outputs if n not in cached]
    while stack:
        node_id = stack.pop()
        if node_id not in needed:
            needed.add(node_id)
            stack.extend(src for src, _ in graph.nodes[node_id].links.values() if src not in cached)
    return needed


assert set(LATENT_METHODS) <= set(RESAMPLE)
