"""Reading generation parameters back out of images made by us or by other tools.

Writing them is pipelines.pnginfo.write's; this module imports nothing from it, so the two form no cycle.
Where each tool keeps its parameters (docs/png-metadata.md has the table):

- A1111 / Forge / reForge / SD.Next (and Stability Matrix, Fooocus' "a1111" scheme): the
  `parameters` text chunk, or the EXIF UserComment of a JPEG/WEBP. Prompt lines, an optional
  `Negative prompt:` part, and a last line of `Key: value` pairs in which a value may be a quoted
  JSON string holding commas; parsed with A1111's own pattern.
- ComfyUI: its API graph in `prompt` (or the UI graph in `workflow`), pipelines.pnginfo.comfy.
- SwarmUI, Fooocus, Ruined Fooocus, InvokeAI, NovelAI, Stability Matrix, Hugging Face Space JSON:
  pipelines.pnginfo.tools; JSON in `parameters` is told apart by `_json_parameters`.
- A1111's stealth PNG info (alpha-channel or RGB lowest bits): pipelines.pnginfo.files.

`read_png_info` never lets a malformed file raise anything but ValueError ("nothing readable"); a
part it cannot parse becomes a note beside what it could read. Hashes are pipelines.weights.hashing's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, BinaryIO

from PIL import Image

from pipelines.control import controlnet as control
from pipelines.control import ip_adapter
from pipelines.imaging import hires
from pipelines.pnginfo import tools
from pipelines.pnginfo.comfy import parse_comfyui, workflow_to_graph
from pipelines.pnginfo.files import PARAMETER_KEYS, read_text
from pipelines.sampling.samplers import sampler_fields
from pipelines.sampling.step_cache import CALIBRATION, StepCache
from pipelines.schema.inpaint import MASKED_CONTENT

__all__ = ["parse_a1111", "parse_a1111_parameters", "parse_comfyui", "read_metadata", "read_png_info"]

JSON_KEY = "diffusion_anywhere"  # our PNG chunk with the full metadata dict (written by pipelines.pnginfo.write)

# A1111 modules/infotext_utils.py: `re_param_code`
_PARAM = re.compile(r'\s*(\w[\w \-/]+):\s*("(?:\\.|[^\\"])+"|[^,]*)(?:,|$)')
_KEY_RUN = re.compile(r"\s*[\w \-/]*")  # what `_PARAM`'s key can span from a position, found in linear time
_LORA = re.compile(r"<lora:([^:>]+):([-0-9.eE]+)(?::[^>]*)?>")
_SIZE = re.compile(r"^(\d+)x(\d+)$")
_NUMBER = re.compile(r"^-?\d+(\.\d+)?([eE][-+]?\d+)?$")

FIELDS = ("prompt", "negative_prompt", "steps", "sampler", "guidance_scale", "seed", "width", "height", "model")


def find_params(line: str) -> list[tuple[str, str]]:
    """`_PARAM.findall(line)`, the same matches in linear time. `re.findall` retries the key at every
    position of a long run of word characters with no colon after it (quadratic: a 40 KB prompt
    line took 18 s); every start inside such a run fails alike, so the run is skipped at once."""
    found, pos = [], 0
    while pos < len(line):
        end = _KEY_RUN.match(line, pos).end()
        if end < len(line) and line[end] == ":":
            match = _PARAM.match(line, pos)
            if match and match.end() > pos:
                found.append(match.groups())
                pos = match.end()
                continue
        pos = max(end, pos + 1) if end >= len(line) or line[end] != ":" else pos + 1
    return found


def parse_a1111(text: str) -> dict[str, Any]:
    """Fields of an A1111 infotext, with every `Key: value` of its last line under "extra"."""
    lines = text.strip().split("\n")
    settings = lines.pop() if lines and len(find_params(lines[-1])) >= 3 else ""
    prompt_lines, negative_lines, in_negative = [], [], False
    for line in lines:
        if line.startswith("Negative prompt:"):
            in_negative = True
            line = line.removeprefix("Negative prompt:").strip()
        (negative_lines if in_negative else prompt_lines).append(line)
    extra: dict[str, str] = {}
    for key, value in find_params(settings):
        extra[key.strip()] = _unquote(value.strip())
    prompt = "\n".join(prompt_lines)
    out: dict[str, Any] = {
        "prompt": "\n".join(line.rstrip() for line in _LORA.sub("", prompt).split("\n")).strip(),
        "negative_prompt": "\n".join(negative_lines).strip(),
        "loras": {name: float(scale) for name, scale in _LORA.findall(prompt)},
        "extra": extra,
    }
    _typed(out, extra)
    return out


def _unquote(value: str) -> str:
    """A1111's `unquote`: a "quoted" value is a JSON string; one that does not decode stays as written."""
    if len(value) < 2 or value[0] != '"' or value[-1] != '"':
        return value
    try:
        decoded = json.loads(value)
    except (ValueError, RecursionError):
        return value
    return decoded if isinstance(decoded, str) else value


def _typed(out: dict[str, Any], extra: dict[str, str]) -> None:
    from pipelines.schema.request import fields  # the request schema names each field's infotext key ("CFG scale")

    numbers = {
        s.name: (s.about.infotext, int if s.kind == "whole" else float)
        for s in fields()
        if s.about.infotext and s.kind in ("whole", "number")
    }
    folded = {k.lower(): v for k, v in extra.items()}  # ComfyUI Image Saver writes "CFG Scale"
    for field, (key, kind) in numbers.items():
        value = extra.get(key, folded.get(key.lower(), ""))
        if _NUMBER.match(value):  # a malformed value stays only in "extra"
            exact = kind is int and value.lstrip("-").isdigit()  # 64-bit seeds: every digit kept
            out[field] = int(value) if exact else kind(float(value))
    size = _SIZE.match(extra.get("Size", ""))
    if size:
        out["width"], out["height"] = int(size.group(1)), int(size.group(2))
    for field, key in (("sampler", "Sampler"), ("model", "Model"), ("model_hash", "Model hash")):
        if extra.get(key):
            out[field] = extra[key]
    if tools.style_names(extra.get("Styles")):  # Fooocus' A1111 scheme, SD.Next: the names, as written
        out["styles"] = tools.style_names(extra["Styles"])
    if "sampler" in out:  # A1111 >= 1.9 writes "Sampler: DPM++ 2M, Schedule type: Karras"
        out.update(sampler_fields(out["sampler"], extra.get("Schedule type")))
    text = extra.get("Step cache", "")
    cache = StepCache.from_label(text)
    if text.endswith(CALIBRATION):  # a MagCache run that skipped nothing: the uncached image
        out["step_cache_calibration"] = True
    elif cache is not None:  # ours: the image is reproduced only with the same cache
        out["step_cache"], out["step_cache_threshold"] = cache.method, cache.threshold
    _inpaint_fields(out, extra)
    hires.read_infotext(out, extra)
    _schema_texts(out, extra)
    units = control.read_infotext(extra)  # their settings: a PNG holds neither kind of picture
    if any(not ip_adapter.is_ip_unit(u) for u in units):
        out["controlnet"] = [u for u in units if not ip_adapter.is_ip_unit(u)]
    if any(ip_adapter.is_ip_unit(u) for u in units):
        out["ip_adapter"] = [ip_adapter.from_unit(u) for u in units if ip_adapter.is_ip_unit(u)]


def _schema_texts(out: dict[str, Any], extra: dict[str, str]) -> None:
    """Every other text, choice, switch or template the schema names an infotext key for (Regional
    Prompter's "RP ...", ADetailer's "ADetailer ...", Dynamic Prompts' "Template"), by the field's own
    rules; a value the field refuses stays only in "extra"."""
    from pipelines.schema.request import fields

    for item in fields():
        key = item.about.infotext
        if not key or item.name in out or key not in extra or item.kind not in ("text", "choice", "flag", "names"):
            continue
        try:
            out[item.name] = item.parse([extra[key]] if item.kind == "names" else extra[key])
        except ValueError:
            continue


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


MAX_JSON = 8 << 20  # characters of JSON parsed at most


def _json(text: str | None) -> Any:
    """Parsed JSON of a chunk, or None when it is not JSON (or too large or too deeply nested)."""
    if not text or len(text) > MAX_JSON or text.lstrip()[:1] not in ("{", "["):
        return None
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        return None


def _parameters(text: dict[str, str]) -> tuple[str, Any] | None:
    """(source, parser) for a `parameters` chunk: JSON of a tool we know (`_json_parameters`), else
    A1111's infotext (written by A1111/Forge/SD.Next, by Stability Matrix beside its `parameters-json`, by us)."""
    raw = text["parameters"]
    data = _json(raw)
    if isinstance(data, dict):
        return _json_parameters(data, text)
    if data is not None:  # a JSON list: no tool's parameters
        return None
    source = "a1111"
    if JSON_KEY in text:
        source = "diffusion-anywhere"
    elif "parameters-json" in text or "smproj" in text:
        source = "stability-matrix"
    elif text.get("fooocus_scheme") == "a1111" or text.get("MakerNote") == "a1111":
        source = "fooocus"
    return source, lambda: parse_a1111(raw)


def _json_parameters(data: dict[str, Any], text: dict[str, str]) -> tuple[str, Any] | None:
    """(source, parser) for JSON in `parameters` (or a JPEG/WEBP's UserComment): SwarmUI, Ruined
    Fooocus, Fooocus, a ComfyUI graph (Civitai's, SaveImagePlus' `{"prompt": graph}`), NovelAI's
    chunks (its WEBP), else any JSON with a text "prompt" (Hugging Face Spaces' diffusers arguments);
    None for JSON of no tool."""
    if isinstance(data.get("sui_image_params"), dict):
        return "swarmui", lambda: tools.parse_swarmui(data)
    if str(data.get("software", "")).replace(" ", "").lower() == "ruinedfooocus":
        return "ruined-fooocus", lambda: tools.parse_ruined_fooocus(data)
    if (
        data.get("metadata_scheme") == "fooocus" or text.get("fooocus_scheme") == "fooocus"
        or text.get("MakerNote") == "fooocus" or "full_prompt" in data
    ):  # fmt: skip
        return "fooocus", lambda: tools.parse_fooocus(data)
    graph = data.get("prompt") if isinstance(data.get("prompt"), dict) else data
    if _is_graph(graph):
        if isinstance(data.get("extraMetadata"), str):  # Civitai's generator: its form's values beside the graph
            return "civitai", lambda: _civitai(graph, data["extraMetadata"])
        return "comfyui", lambda: parse_comfyui(graph)
    comment = _json(data.get("Comment")) if isinstance(data.get("Comment"), str) else None
    if isinstance(comment, dict):
        return "novelai", lambda: tools.parse_novelai(comment, {k: v for k, v in data.items() if isinstance(v, str)})
    if isinstance(data.get("prompt"), str):
        return "hf-space", lambda: tools.parse_generic_json(data)
    return None


def _civitai(graph: dict[str, Any], extra: str) -> dict[str, Any]:
    """Civitai's ComfyUI graph, each field it lacks (an upscale-only graph lacks all) from the
    `extraMetadata` JSON text of Civitai's form (prompt, negativePrompt, steps, cfgScale, sampler, seed)."""
    form = _json(extra)
    try:
        out = parse_comfyui(graph)
    except ValueError:  # no sampler node (an upscale of an earlier image): the form's values are all there is
        if not isinstance(form, dict):
            raise
        out = {}
    if isinstance(form, dict):
        found = tools.fields(
            form.get("prompt"), form.get("negativePrompt"), form.get("steps"), form.get("cfgScale"),
            form.get("seed"), form.get("width"), form.get("height"), form.get("sampler"), form.get("scheduler"),
            form.get("baseModel"),
        )  # fmt: skip
        for key, value in found.items():
            if out.get(key) in (None, "", {}):
                out[key] = value
    return out


def _is_graph(data: Any) -> bool:
    """Whether `data` is a ComfyUI API graph: nodes (dicts with a "class_type") by id."""
    nodes = list(data.values())[:64] if isinstance(data, dict) else []
    return sum(isinstance(n, dict) and isinstance(n.get("class_type"), str) for n in nodes) >= max(1, len(nodes) // 2)


def _candidates(text: dict[str, str]) -> list[tuple[str, str, Any]]:
    """(source, chunk, parser) for each chunk that may hold generation parameters, best first."""
    found = []
    if "parameters" in text:
        parsed = _parameters(text)
        if parsed:
            found.append((parsed[0], "parameters", parsed[1]))
    for key, source, parse in (
        ("parameters-json", "stability-matrix", tools.parse_stability_matrix),
        ("smproj", "stability-matrix", tools.parse_smproj),
        ("invokeai_metadata", "invokeai", tools.parse_invokeai),
        ("sd-metadata", "invokeai", tools.parse_invokeai_legacy),
        ("Comment", "novelai", lambda d: tools.parse_novelai(d, text)),
        ("prompt", "comfyui", parse_comfyui),
        ("workflow", "comfyui", lambda d: parse_comfyui(workflow_to_graph(d))),
    ):
        data = _json(text.get(key))
        if isinstance(data, dict):
            found.append((source, key, lambda p=parse, d=data: p(d)))
    if "Dream" in text:
        found.append(("invokeai", "Dream", lambda: tools.parse_invokeai_dream(text["Dream"])))
    if text.get("Software", "").startswith("NovelAI") and "Description" in text:
        found.append(("novelai", "Description", lambda: tools.fields(text["Description"])))
    return found


def read_png_info(path: str | Path | BinaryIO) -> dict[str, Any]:
    """{"source", "parameters": fields, "raw": the chunk's text, "notes": what could not be read} of
    an image (PNG, JPEG, WEBP). source: "diffusion-anywhere", "a1111", "comfyui", "civitai", "swarmui",
    "fooocus", "ruined-fooocus", "invokeai", "novelai", "stability-matrix", "hf-space" (a generic JSON of
    diffusers' argument names), or "unknown" (a chunk we could not parse, shown raw). A1111's stealth
    metadata (in the pixels' lowest bits) is read where no chunk holds parameters.

    Raises ValueError only when the file holds no generation parameters at all (or is no image).
    """
    try:
        text, notes = read_text(path)
    except Exception as exc:
        raise ValueError(f"this file cannot be read as an image ({type(exc).__name__}: {exc})") from None
    for source, key, parse in _candidates(text):
        try:
            fields = parse()
        except Exception as exc:
            notes.append(f"{source} `{key}` chunk could not be read ({type(exc).__name__}: {exc})")
            continue
        return {"source": source, "parameters": fields, "raw": text[key], "notes": notes}
    raw_key = next((k for k in PARAMETER_KEYS if k in text), None)
    if raw_key is not None:  # a chunk we know holds parameters, in a form we could not read: shown raw
        notes.append(f"the `{raw_key}` chunk is in a form this reader does not know; its text is shown as it is")
        return {"source": "unknown", "parameters": {}, "raw": text[raw_key], "notes": notes}
    detail = f" ({'; '.join(notes)})" if notes else ""
    raise ValueError(
        "no generation parameters in this image (no A1111 `parameters`, ComfyUI `prompt`, InvokeAI, "
        f"NovelAI, SwarmUI, Fooocus, Stability Matrix chunk, nor EXIF UserComment or XMP){detail}"
    )


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
