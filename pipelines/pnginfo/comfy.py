"""ComfyUI's metadata: the API graph (`prompt` chunk) and, when that is missing, the UI workflow.

An input is a value or a link `["95", 0]` (source node id, output index). Links are followed to the
node that holds the value: seed and primitive nodes, string nodes and concatenations for prompt
text, `RandomNoise` / `KSamplerSelect` / `BasicScheduler` / `CFGGuider` / `BasicGuider` in
`SamplerCustomAdvanced` graphs, and the sampler's `model` input back through LoRA loaders to the
checkpoint. A cycle or a missing node ends a path; nothing here raises for a malformed graph.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pipelines.sampling.samplers import sampler_fields

MAX_DEPTH = 64
MAX_TEXT = 1 << 16  # characters of one prompt at most (a concatenation graph can double a text per node)
SAMPLER_TYPES = ("KSampler", "KSamplerAdvanced", "SamplerCustom", "SamplerCustomAdvanced")
TEXT_KEYS = ("text", "text_g", "text_l", "t5xxl", "clip_l", "prompt", "string", "value", "String", "Text")
NUMBER_KEYS = ("value", "seed", "noise_seed", "int", "float", "number", "Number", "Value", "INT", "FLOAT")
MODEL_KEYS = ("ckpt_name", "unet_name", "model_name", "model_path")


class Graph:
    """A ComfyUI API graph and the link-following reads of its values."""

    def __init__(self, graph: dict[str, Any]):
        self.nodes = {str(k): v for k, v in graph.items() if isinstance(v, dict)}
        # each node read once per role: a graph whose nodes share inputs (a diamond chain) would
        # otherwise be walked once per path, 2^depth times
        self._strings: dict[str, str | None] = {}
        self._prompts: dict[tuple[str, str], list[str]] = {}

    def node(self, ref: Any) -> dict[str, Any] | None:
        """The node a link points to (None for a value or a dangling link)."""
        if isinstance(ref, list) and len(ref) == 2 and isinstance(ref[0], str | int):
            found = self.nodes.get(str(ref[0]))
            return found if isinstance(found, dict) else None
        return None

    @staticmethod
    def inputs(node: dict[str, Any] | None) -> dict[str, Any]:
        found = (node or {}).get("inputs")
        return found if isinstance(found, dict) else {}

    def number(self, value: Any, keys: tuple[str, ...] = NUMBER_KEYS, depth: int = 0) -> float | int | None:
        """A number, following links to the node that holds it (a seed node, a primitive)."""
        if isinstance(value, bool):
            return None
        if isinstance(value, int | float):
            return value if math.isfinite(value) else None
        if isinstance(value, str) and value.strip().lstrip("-").isdigit():
            return int(value)
        source = self.inputs(self.node(value))
        if depth >= MAX_DEPTH or not source:
            return None
        for key in (*keys, *NUMBER_KEYS):
            if key in source:
                return self.number(source[key], keys, depth + 1)
        return None

    def string(self, value: Any, depth: int = 0) -> str | None:
        """Text, following links through string nodes and concatenations (joined by their delimiter)."""
        if isinstance(value, str):
            return value[:MAX_TEXT]
        node = self.node(value)
        if node is None or depth >= MAX_DEPTH:
            return None
        key = str(value[0])
        if key not in self._strings:
            self._strings[key] = None  # a cycle back to this node reads nothing
            self._strings[key] = self._string_of(self.inputs(node), depth)
        return self._strings[key]

    def _string_of(self, source: dict[str, Any], depth: int) -> str | None:
        for key in TEXT_KEYS:
            if key in source:
                return self.string(source[key], depth + 1)
        parts = [source[k] for k in sorted(source) if k.lower().startswith(("string", "text", "str"))]
        texts = [t for t in (self.string(p, depth + 1) for p in parts) if t]
        delimiter = source.get("delimiter", source.get("separator", " "))
        return str(delimiter if isinstance(delimiter, str) else " ").join(texts)[:MAX_TEXT] if texts else None

    def prompt(self, ref: Any, role: str, depth: int = 0) -> list[str]:
        """The texts encoded into a conditioning, through combine/concat/ControlNet/guidance nodes."""
        node = self.node(ref)
        if node is None or depth >= MAX_DEPTH:
            return []
        key = (str(ref[0]), role)
        if key not in self._prompts:
            self._prompts[key] = []  # a cycle back to this node reads nothing
            source = self.inputs(node)
            texts = [self.string(source[k], depth + 1) for k in TEXT_KEYS[:6] if k in source]
            if not any(texts):
                follow = [role] if role in source else sorted(k for k in source if "conditioning" in k.lower())
                texts = [t for name in follow for t in self.prompt(source[name], role, depth + 1)]
            self._prompts[key] = list(dict.fromkeys(t for t in texts if t))  # SDXL's text_g, text_l: often alike
        return self._prompts[key]

    def guidance(self, ref: Any, depth: int = 0, seen: set[str] | None = None) -> float | int | None:
        """A FluxGuidance node's `guidance` on a conditioning's way (Flux's distilled guidance)."""
        seen = set() if seen is None else seen
        source = self.inputs(self.node(ref))
        if not source or depth >= MAX_DEPTH or str(ref[0]) in seen:
            return None
        seen.add(str(ref[0]))
        if "guidance" in source:
            return self.number(source["guidance"], ("guidance",))
        return next(
            (
                g
                for k in sorted(source)
                if "conditioning" in k.lower()
                for g in [self.guidance(source[k], depth + 1, seen)]
                if g
            ),
            None,
        )

    def model(self, ref: Any, loras: dict[str, float], depth: int = 0) -> str | None:
        """The checkpoint feeding a `model` input, collecting the LoRA loaders on the way."""
        node = self.node(ref)
        if node is None or depth >= MAX_DEPTH:
            return None
        source = self.inputs(node)
        if "lora_name" in source and isinstance(source["lora_name"], str):
            strength = self.number(source.get("strength_model", 1.0), ("strength_model",))
            name = Path(source["lora_name"].replace("\\", "/")).stem  # "styles\\ink.safetensors" (Windows) -> "ink"
            loras.setdefault(name, float(strength if strength is not None else 1.0))
        for key in MODEL_KEYS:
            name = self.string(source.get(key), depth + 1) if key in source else None
            if name:
                return Path(name.replace("\\", "/")).stem
        return self.model(source.get("model"), loras, depth + 1)

    def size(self, ref: Any, depth: int = 0) -> tuple[int, int] | None:
        """The latent's size: the first node up the chain with a width and a height."""
        node = self.node(ref)
        if node is None or depth >= MAX_DEPTH:
            return None
        source = self.inputs(node)
        width, height = self.number(source.get("width"), ("width",)), self.number(source.get("height"), ("height",))
        if width and height:
            return int(width), int(height)
        nxt = next((source[k] for k in ("samples", "latent", "latent_image", "pixels", "image") if k in source), None)
        return self.size(nxt, depth + 1)


def find_sampler(graph: Graph) -> dict[str, Any] | None:
    """The sampler node: a KSampler-like one; among several (a two-pass graph), the first pass's (its
    latent comes from an empty latent with a size), else the one with the lowest node id."""
    found = [
        (key, node)
        for key, node in graph.nodes.items()
        if node.get("class_type") in SAMPLER_TYPES or "sampler_name" in graph.inputs(node)
    ]
    if not found:
        return None

    def order(item: tuple[str, dict]) -> tuple[int, int, str]:
        key, node = item
        latent = graph.inputs(graph.node(graph.inputs(node).get("latent_image")))
        first_pass = "width" in latent and "height" in latent
        return (0 if first_pass else 1, int(key) if key.isdigit() else 1 << 62, key)

    return sorted(found, key=order)[0][1]


def parse_comfyui(data: dict[str, Any]) -> dict[str, Any]:
    """Fields of a ComfyUI API graph (ValueError when it has no sampler node)."""
    graph = Graph(data)
    sampler = find_sampler(graph)
    if sampler is None:
        raise ValueError("no sampler node in this ComfyUI graph")
    inputs = graph.inputs(sampler)
    parts = _custom_parts(graph, inputs)  # SamplerCustom(Advanced): noise, guider, sampler, sigmas nodes
    merged = {**parts, **{k: v for k, v in inputs.items() if k not in parts or not isinstance(v, list)}}
    loras: dict[str, float] = {}
    out: dict[str, Any] = {
        "prompt": _join(graph.prompt(merged.get("positive", merged.get("conditioning")), "positive")),
        "negative_prompt": _join(graph.prompt(merged.get("negative"), "negative")),
        "steps": graph.number(merged.get("steps"), ("steps",)),
        "guidance_scale": graph.number(merged.get("cfg"), ("cfg",)),
        "seed": graph.number(merged.get("seed", merged.get("noise_seed")), ("seed", "noise_seed")),
        "model": graph.model(merged.get("model"), loras),
        "loras": loras,
    }
    _sampler_fields(graph, merged, out)
    flux = graph.guidance(merged.get("positive", merged.get("conditioning")))
    if flux is not None and out["guidance_scale"] in (None, 1, 1.0):  # Flux: CFG off, distilled guidance on
        out["guidance_scale"] = flux
    size = graph.size(merged.get("latent_image"))
    if size:
        out["width"], out["height"] = size
    if out["model"] is None:  # a model input we could not follow: any checkpoint loader in the graph
        out["model"] = next((graph.model([k, 0], loras) for k, n in graph.nodes.items() if _loads_model(n)), None)
    return _clean(out)


def _custom_parts(graph: Graph, inputs: dict[str, Any]) -> dict[str, Any]:
    """A SamplerCustomAdvanced's values from the nodes it links: RandomNoise (noise_seed), CFGGuider /
    BasicGuider (model, positive, negative, cfg / conditioning), KSamplerSelect (sampler_name),
    BasicScheduler and other sigma nodes (scheduler, steps, model)."""
    parts: dict[str, Any] = {}
    for key in ("noise", "guider", "sampler", "sigmas"):
        node = graph.node(inputs.get(key))
        for name, value in graph.inputs(node).items():
            parts.setdefault(name, value)
        if key == "sigmas" and node and "scheduler" not in graph.inputs(node):
            parts.setdefault("scheduler", str(node.get("class_type", "")).removesuffix("Scheduler"))
    return parts


def _sampler_fields(graph: Graph, merged: dict[str, Any], out: dict[str, Any]) -> None:
    name = graph.string(merged.get("sampler_name"))
    schedule = graph.string(merged.get("scheduler"))
    if name:
        out.update(sampler_fields(name, schedule))


def _join(texts: list[str]) -> str:
    return "\n".join(dict.fromkeys(t.strip() for t in texts if t.strip()))


def _loads_model(node: dict[str, Any]) -> bool:
    inputs = node.get("inputs")
    return isinstance(inputs, dict) and any(isinstance(inputs.get(k), str) for k in MODEL_KEYS)


def _clean(out: dict[str, Any]) -> dict[str, Any]:
    for key in ("steps", "seed"):
        if isinstance(out.get(key), float) and out[key].is_integer():
            out[key] = int(out[key])
        if out.get(key) is not None and not isinstance(out[key], int):
            out[key] = None
    if out.get("guidance_scale") is not None:
        out["guidance_scale"] = float(out["guidance_scale"])
    return {k: v for k, v in out.items() if v is not None}


# UI workflow (`workflow` chunk): node "widgets_values" by position, for the node types that carry
# generation parameters; linked inputs come from the "links" table.
WIDGETS = {
    "KSampler": ("seed", None, "steps", "cfg", "sampler_name", "scheduler", "denoise"),
    "KSamplerAdvanced": ("add_noise", "noise_seed", None, "steps", "cfg", "sampler_name", "scheduler"),
    "CLIPTextEncode": ("text",),
    "EmptyLatentImage": ("width", "height", "batch_size"),
    "EmptySD3LatentImage": ("width", "height", "batch_size"),
    "CheckpointLoaderSimple": ("ckpt_name",),
    "CheckpointLoader": ("config_name", "ckpt_name"),
    "UNETLoader": ("unet_name", "weight_dtype"),
    "LoraLoader": ("lora_name", "strength_model", "strength_clip"),
    "LoraLoaderModelOnly": ("lora_name", "strength_model"),
    "RandomNoise": ("noise_seed", None),
    "KSamplerSelect": ("sampler_name",),
    "BasicScheduler": ("scheduler", "steps", "denoise"),
    "CFGGuider": ("cfg",),
    "PrimitiveNode": ("value",),
}


def workflow_to_graph(workflow: dict[str, Any]) -> dict[str, Any]:
    """An API-like graph from a UI workflow: widget values by name, links as ["id", slot]."""
    links = {}
    for link in workflow.get("links") or []:
        if isinstance(link, list) and len(link) >= 4:
            links[link[0]] = [str(link[1]), link[2]]
    graph: dict[str, Any] = {}
    for node in workflow.get("nodes") or []:
        if not isinstance(node, dict) or node.get("mode") in (2, 4):  # muted or bypassed
            continue
        kind = str(node.get("type", ""))
        values = node.get("widgets_values")
        names = WIDGETS.get(kind, ())
        inputs: dict[str, Any] = {}
        if isinstance(values, list):
            inputs.update({n: v for n, v in zip(names, values, strict=False) if n})
        for item in node.get("inputs") or []:
            if isinstance(item, dict) and item.get("link") in links:
                inputs[str(item.get("name"))] = links[item["link"]]
        graph[str(node.get("id"))] = {"class_type": kind, "inputs": inputs}
    return graph
