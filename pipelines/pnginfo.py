"""Reading generation parameters back out of PNGs made by us, by A1111/Forge/SD.Next, or by ComfyUI.

Writing them is pipelines.metadata's; this module imports nothing from it, so the two form no cycle.

A1111's infotext (its `parameters` text chunk) is prompt lines, an optional `Negative prompt:` part,
and a last line of `Key: value` pairs in which a value may be a quoted JSON string holding commas
(`Lora hashes: "a: 1f2e, b: 9c8d"`); this is parsed with A1111's own pattern. ComfyUI stores its API
graph as JSON in the `prompt` chunk: the sampler node and the nodes it links to give the values.

Hashes (`Model hash`, `Lora hashes`) are computed in pipelines.hashing.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from PIL import Image

from .inpaint import MASKED_CONTENT
from .samplers import from_a1111

JSON_KEY = "diffusion_anywhere"  # our PNG chunk with the full metadata dict (written by pipelines.metadata)

# A1111 modules/infotext_utils.py: `re_param_code`
_PARAM = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
_LORA = re.compile(r"<lora:([^:>]+):([-0-9.eE]+)(?::[^>]*)?>")
_SIZE = re.compile(r"^(\d+)x(\d+)$")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")

FIELDS = ("prompt", "negative_prompt", "steps", "sampler", "guidance_scale", "seed", "width", "height", "model")


def parse_a1111(text: str) -> dict[str, Any]:
    """Fields of an A1111 infotext, with every `Key: value` of its last line under "extra"."""
    lines = text.strip().split("\n")
    settings = lines.pop() if lines and len(_PARAM.findall(lines[-1])) >= 3 else ""
    prompt_lines, negative_lines, in_negative = [], [], False
    for line in lines:
        if line.startswith("Negative prompt:"):
            in_negative = True
            line = line.removeprefix("Negative prompt:").strip()
        (negative_lines if in_negative else prompt_lines).append(line)
    extra: dict[str, str] = {}
    for key, value in _PARAM.findall(settings):
        value = value.strip()
        if value.startswith('"') and value.endswith('"'):
            value = json.loads(value)
        extra[key.strip()] = value
    prompt = "\n".join(prompt_lines)
    out: dict[str, Any] = {
        "prompt": "\n".join(line.rstrip() for line in _LORA.sub("", prompt).split("\n")).strip(),
        "negative_prompt": "\n".join(negative_lines).strip(),
        "loras": {name: float(scale) for name, scale in _LORA.findall(prompt)},
        "extra": extra,
    }
    _typed(out, extra)
    return out


def _typed(out: dict[str, Any], extra: dict[str, str]) -> None:
    numbers = {
        "steps": ("Steps", int), "guidance_scale": ("CFG scale", float), "seed": ("Seed", int),
        "guidance_end": ("Guidance end", float), "image_guidance_scale": ("Image CFG scale", float),
    }  # fmt: skip
    for field, (key, kind) in numbers.items():
        value = extra.get(key, "")
        if _NUMBER.match(value):  # a malformed value stays only in "extra"
            exact = kind is int and value.lstrip("-").isdigit()  # 64-bit seeds: every digit kept
            out[field] = int(value) if exact else kind(float(value))
    size = _SIZE.match(extra.get("Size", ""))
    if size:
        out["width"], out["height"] = int(size.group(1)), int(size.group(2))
    for field, key in (("sampler", "Sampler"), ("model", "Model"), ("model_hash", "Model hash")):
        if extra.get(key):
            out[field] = extra[key]
    if "sampler" in out:  # A1111 >= 1.9 writes Karras as "Schedule type: Karras"
        out["sampler"] = from_a1111(out["sampler"], extra.get("Schedule type"))
    if "Denoising strength" in extra:
        out["strength"] = float(extra["Denoising strength"])
    _inpaint_fields(out, extra)


def _inpaint_fields(out: dict[str, Any], extra: dict[str, str]) -> None:
    """An inpaint's settings from A1111's names; A1111 leaves out what is at its default ("Whole
    picture", no padding, "Inpaint masked"), so any one of them marks an inpaint."""
    if not {"Mask blur", "Masked content", "Inpaint area"} & set(extra):
        return
    if extra.get("Mask blur", "").isdigit():
        out["mask_blur"] = int(extra["Mask blur"])
    if extra.get("Masked content", "").lower() in MASKED_CONTENT:
        out["masked_content"] = extra["Masked content"].lower()
    out["inpaint_area"] = "only masked" if extra.get("Inpaint area", "").lower() == "only masked" else "whole picture"
    if extra.get("Masked area padding", "").isdigit():
        out["padding"] = int(extra["Masked area padding"])
    out["invert_mask"] = extra.get("Mask mode", "").lower() == "inpaint not masked"


def parse_comfyui(graph: dict[str, Any]) -> dict[str, Any]:
    """Fields of a ComfyUI API graph: the first KSampler-like node and the nodes it links to."""
    nodes = {k: v for k, v in graph.items() if isinstance(v, dict)}
    sampler = next((n for n in nodes.values() if "sampler_name" in n.get("inputs", {})), None)
    if sampler is None:
        raise ValueError("no sampler node in this ComfyUI graph")
    inputs = sampler["inputs"]

    def linked(name: str) -> dict[str, Any]:
        ref = inputs.get(name)
        return nodes.get(str(ref[0]), {}).get("inputs", {}) if isinstance(ref, list) else {}

    out: dict[str, Any] = {
        "prompt": str(linked("positive").get("text", "")),
        "negative_prompt": str(linked("negative").get("text", "")),
        "steps": int(inputs.get("steps", 0)) or None,
        "guidance_scale": float(inputs["cfg"]) if "cfg" in inputs else None,
        "seed": int(inputs.get("seed", inputs.get("noise_seed", 0))),
        "sampler": " ".join(str(inputs.get(k, "")) for k in ("sampler_name", "scheduler")).strip(),
        "loras": {},
    }
    latent = linked("latent_image")
    if "width" in latent:
        out["width"], out["height"] = int(latent["width"]), int(latent["height"])
    for node in nodes.values():
        node_inputs = node.get("inputs", {})
        if "ckpt_name" in node_inputs:
            out["model"] = Path(str(node_inputs["ckpt_name"])).stem
        if "lora_name" in node_inputs:
            out["loras"][Path(str(node_inputs["lora_name"])).stem] = float(node_inputs.get("strength_model", 1.0))
    return {k: v for k, v in out.items() if v is not None}


def read_png_info(path: str | Path) -> dict[str, Any]:
    """{"source": "diffusion-anywhere" | "a1111" | "comfyui", "parameters": fields, "raw": text}.

    Raises ValueError when the file holds no generation parameters we can read.
    """
    with Image.open(path) as image:
        text = {k: v for k, v in getattr(image, "text", {}).items() if isinstance(v, str)}
    if "parameters" in text:
        fields = parse_a1111(text["parameters"])
        source = "diffusion-anywhere" if JSON_KEY in text else "a1111"
        return {"source": source, "parameters": fields, "raw": text["parameters"]}
    if "prompt" in text:
        try:
            graph = json.loads(text["prompt"])
        except json.JSONDecodeError:
            raise ValueError("the PNG's `prompt` chunk is not ComfyUI JSON") from None
        return {"source": "comfyui", "parameters": parse_comfyui(graph), "raw": text["prompt"]}
    raise ValueError("no generation parameters in this PNG (A1111 `parameters` or ComfyUI `prompt` chunk)")


def parse_a1111_parameters(text: str) -> dict[str, Any]:
    """The fields of an A1111 infotext, without the raw `Key: value` pairs (`read_metadata`'s view)."""
    fields = parse_a1111(text)
    fields.pop("extra")
    return fields


def read_metadata(path: str | Path) -> dict[str, Any]:
    """{"parameters": parsed A1111 fields, "json": our JSON chunk} of a saved PNG."""
    with Image.open(path) as image:
        text = dict(image.text)  # type: ignore[attr-defined]
    return {
        "parameters": parse_a1111_parameters(text["parameters"]) if "parameters" in text else None,
        "json": json.loads(text[JSON_KEY]) if JSON_KEY in text else None,
    }
