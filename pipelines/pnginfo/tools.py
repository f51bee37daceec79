"""Generation parameters as SwarmUI, Fooocus, InvokeAI, NovelAI and Stability Matrix write them.

Each parser takes the tool's decoded JSON (or text) and returns our fields: prompt, negative_prompt,
steps, guidance_scale, seed, width, height, sampler (ours where one matches) and schedule, model,
loras. A value of the wrong type is left out, never raised on.
"""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from typing import Any

from pipelines.sampling.samplers import sampler_fields


def _int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value.strip())
    return None


def _float(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _text(value: Any) -> str | None:
    return value.strip() if isinstance(value, str) else None


def _stem(value: Any) -> str | None:
    """A model's name from a path or name ("OfficialStableDiffusion/sd_xl_base_1.0.safetensors" -> "sd_xl_base_1.0")."""
    if not isinstance(value, str) or not value.strip():
        return None
    name = Path(value.strip().replace("\\", "/")).name
    return name.rsplit(".", 1)[0] if name.endswith((".safetensors", ".ckpt", ".pt", ".gguf", ".bin", ".sft")) else name


def fields(
    prompt: Any = None, negative: Any = None, steps: Any = None, cfg: Any = None, seed: Any = None,
    width: Any = None, height: Any = None, sampler: Any = None, schedule: Any = None, model: Any = None,
    loras: dict[str, float] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Our fields from one tool's values, each checked for its type; missing or malformed ones left out."""
    out: dict[str, Any] = {
        "prompt": _text(prompt) or "", "negative_prompt": _text(negative) or "", "steps": _int(steps),
        "guidance_scale": _float(cfg), "seed": _int(seed), "width": _int(width), "height": _int(height),
        "model": _stem(model), "loras": loras or {},
    }  # fmt: skip
    if isinstance(sampler, str) and sampler.strip():
        out.update(sampler_fields(sampler, schedule if isinstance(schedule, str) else None))
    return {k: v for k, v in out.items() if v is not None}


def parse_swarmui(data: dict[str, Any]) -> dict[str, Any]:
    """SwarmUI: `{"sui_image_params": {prompt, negativeprompt, model, seed, steps, cfgscale, width,
    height, sampler, scheduler, loras, loraweights, ...}, "sui_extra_data": ...}` in `parameters`."""
    p = data.get("sui_image_params")
    p = p if isinstance(p, dict) else {}
    names, weights = p.get("loras"), p.get("loraweights")
    loras = {}
    if isinstance(names, list):
        weights = weights if isinstance(weights, list) else []
        for i, name in enumerate(names):
            if isinstance(name, str):
                weight = _float(weights[i]) if i < len(weights) else None
                loras[_stem(name) or name] = weight if weight is not None else 1.0
    sampler = p.get("sampler") or p.get("comfyuisampler") or p.get("autowebuisampler")
    return fields(
        p.get("prompt"), p.get("negativeprompt"), p.get("steps"), p.get("cfgscale"), p.get("seed"),
        p.get("width"), p.get("height"), sampler, p.get("scheduler"), p.get("model"), loras,
    )  # fmt: skip


_PAIR = re.compile(r"^\(?\s*(\d+)\s*[,x×*]\s*(\d+)\s*\)?$")


def parse_fooocus(data: dict[str, Any]) -> dict[str, Any]:
    """Fooocus' own scheme (`"metadata_scheme": "fooocus"` in `parameters`, or a `fooocus_scheme`
    chunk): prompt, negative_prompt, steps, guidance_scale, seed (text), resolution "(w, h)", sampler,
    scheduler, base_model, loras as [name, weight(, hash)] lists."""
    size = _PAIR.match(str(data.get("resolution", "")))
    loras = {}
    for item in data.get("loras") if isinstance(data.get("loras"), list) else []:
        if isinstance(item, list | tuple) and len(item) >= 2 and isinstance(item[0], str):
            loras[_stem(item[0]) or item[0]] = _float(item[1]) if _float(item[1]) is not None else 1.0
        elif isinstance(item, str) and " : " in item:  # older: "name : weight"
            name, _, weight = item.rpartition(" : ")
            loras[_stem(name) or name] = _float(weight) if _float(weight) is not None else 1.0
    out = fields(
        data.get("prompt"), data.get("negative_prompt"), data.get("steps"), data.get("guidance_scale"),
        data.get("seed"), size and size.group(1), size and size.group(2), data.get("sampler"),
        data.get("scheduler"), data.get("base_model"), loras,
    )  # fmt: skip
    return with_hash_and_styles(out, data.get("base_model_hash"), data.get("styles"))


def with_hash_and_styles(out: dict[str, Any], model_hash: Any, styles: Any) -> dict[str, Any]:
    """`out` with "model_hash" (a hex text as the tool wrote it) and "styles" (a list of names, or its
    text as Fooocus writes it: "['Fooocus V2', 'Fooocus Sharp']") where given and well formed."""
    if isinstance(model_hash, str) and _HASH.match(model_hash.strip()):
        out["model_hash"] = model_hash.strip()
    names = style_names(styles)
    if names:
        out["styles"] = names
    return out


_HASH = re.compile(r"^(0x|blake3:|sha256:)?[0-9a-fA-F]{8,64}$")
_STYLE = re.compile(r"'((?:[^'\\]|\\.)*)'" + r'|"((?:[^"\\]|\\.)*)"')


def style_names(value: Any) -> tuple[str, ...]:
    """Style names from a list, a Python-list text (Fooocus: "['Fooocus V2', 'Fooocus Enhance']") or a
    text of names joined by "; " (SD.Next's infotext "Styles: Cinematic; Noir"); () when there are none."""
    if isinstance(value, list | tuple):
        names = [v.strip() for v in value if isinstance(v, str)]
    elif isinstance(value, str) and value.strip().startswith("["):
        names = [a or b for a, b in _STYLE.findall(value)]
    elif isinstance(value, str):
        names = value.split(";")
    else:
        names = []
    return tuple(dict.fromkeys(n.strip() for n in names if n.strip()))


def parse_invokeai(data: dict[str, Any]) -> dict[str, Any]:
    """InvokeAI 3+ `invokeai_metadata`: positive_prompt, negative_prompt, width, height, seed,
    cfg_scale, steps, scheduler (InvokeAI's names: "dpmpp_2m_k" is DPM++ 2M Karras), model, loras."""
    model = data.get("model")
    model_hash = model.get("hash") if isinstance(model, dict) else data.get("model_hash")
    if isinstance(model, dict):
        model = model.get("model_name") or model.get("name")
    loras = {}
    for item in data.get("loras") if isinstance(data.get("loras"), list) else []:
        if not isinstance(item, dict):
            continue
        ref = item.get("lora") or item.get("model") or {}
        name = ref.get("model_name") or ref.get("name") if isinstance(ref, dict) else None
        if isinstance(name, str):
            weight = _float(item.get("weight"))
            loras[name] = weight if weight is not None else 1.0
    out = fields(
        data.get("positive_prompt"), data.get("negative_prompt"), data.get("steps"), data.get("cfg_scale"),
        data.get("seed"), data.get("width"), data.get("height"), data.get("scheduler"), None, model, loras,
    )  # fmt: skip
    return with_hash_and_styles(out, model_hash, None)


def parse_invokeai_legacy(data: dict[str, Any]) -> dict[str, Any]:
    """InvokeAI 2.x `sd-metadata`: {"model_weights", "image": {"prompt": [{"prompt", "weight"}] or text,
    seed, steps, cfg_scale, sampler, width, height}}; a negative prompt is in [brackets] in the prompt."""
    image = data.get("image") if isinstance(data.get("image"), dict) else {}
    prompt = image.get("prompt")
    if isinstance(prompt, list):
        prompt = " ".join(str(p.get("prompt", "")) for p in prompt if isinstance(p, dict))
    positive, negative = split_brackets(prompt if isinstance(prompt, str) else "")
    out = fields(
        positive, negative, image.get("steps"), image.get("cfg_scale"), image.get("seed"), image.get("width"),
        image.get("height"), image.get("sampler"), None, data.get("model_weights"),
    )  # fmt: skip
    return with_hash_and_styles(out, data.get("model_hash"), None)


def split_brackets(prompt: str) -> tuple[str, str]:
    """InvokeAI's "positive [negative]" prompt split into its two parts."""
    negatives = re.findall(r"\[([^\[\]]*)\]", prompt)
    return re.sub(r"\[[^\[\]]*\]", "", prompt).strip(), ", ".join(n.strip() for n in negatives)


def parse_invokeai_dream(text: str) -> dict[str, Any]:
    """InvokeAI's oldest `Dream` chunk: `"prompt [negative]" -s 50 -S 2980747362 -W 512 -H 768 -C 5 -A k_lms`."""
    try:
        words = shlex.split(text)
    except ValueError:
        words = text.split()
    flags = {words[i]: words[i + 1] for i in range(1, len(words) - 1) if words[i].startswith("-")}
    positive, negative = split_brackets(words[0] if words else "")
    return fields(
        positive, negative, flags.get("-s"), flags.get("-C"), flags.get("-S"), flags.get("-W"),
        flags.get("-H"), flags.get("-A"),
    )  # fmt: skip


def parse_novelai(comment: dict[str, Any], text: dict[str, str]) -> dict[str, Any]:
    """NovelAI: `Comment` JSON (steps, sampler such as "k_euler_ancestral", seed, scale, uc: the
    negative prompt, width/height, prompt in newer files) and the prompt in `Description`; `Source`
    names the model and its hash ("Stable Diffusion 1D44365E", "NovelAI Diffusion V4.5 C02D4F98")."""
    prompt = comment.get("prompt") if isinstance(comment.get("prompt"), str) else text.get("Description")
    source = text.get("Source") if isinstance(text.get("Source"), str) else ""
    split = re.fullmatch(r"(.*?)\s+([0-9A-F]{8})", source.strip())  # the hash: 8 upper-case hex digits
    out = fields(
        prompt, comment.get("uc"), comment.get("steps"), comment.get("scale"), comment.get("seed"),
        comment.get("width"), comment.get("height"), comment.get("sampler"), comment.get("noise_schedule"),
        split.group(1) if split else source,
    )  # fmt: skip
    return with_hash_and_styles(out, split and split.group(2), None)


def parse_stability_matrix(data: dict[str, Any]) -> dict[str, Any]:
    """Stability Matrix's `parameters-json` (its GenerationParameters record: PositivePrompt,
    NegativePrompt, Steps, Sampler, CfgScale, Seed, Width, Height, ModelName; any letter case)."""
    p = {str(k).lower(): v for k, v in data.items()}
    return fields(
        p.get("positiveprompt"), p.get("negativeprompt"), p.get("steps"), p.get("cfgscale"), p.get("seed"),
        p.get("width"), p.get("height"), p.get("sampler"), None, p.get("modelname"),
    )  # fmt: skip


def find_keys(data: Any, keys: set[str], found: dict[str, Any] | None = None, depth: int = 0) -> dict[str, Any]:
    """The first value of each of `keys` (compared in lower case) anywhere in nested JSON (a
    Stability Matrix project, `smproj`, keeps its generation settings deep in its state)."""
    found = {} if found is None else found
    if depth > 32:
        return found
    items = data.items() if isinstance(data, dict) else enumerate(data) if isinstance(data, list) else []
    for key, value in items:
        name = str(key).lower()
        if name in keys and name not in found and not isinstance(value, dict | list):
            found[name] = value
        elif isinstance(value, dict | list):
            find_keys(value, keys, found, depth + 1)
    return found


def parse_smproj(data: Any) -> dict[str, Any]:
    """A Stability Matrix project (`smproj`): its prompt, seed, steps, CFG, size and sampler by key name."""
    keys = {"positiveprompt", "prompt", "negativeprompt", "steps", "cfgscale", "seed", "width", "height", "sampler"}
    p = find_keys(data, keys)
    return fields(
        p.get("positiveprompt", p.get("prompt")), p.get("negativeprompt"), p.get("steps"), p.get("cfgscale"),
        p.get("seed"), p.get("width"), p.get("height"), p.get("sampler"),
    )  # fmt: skip


def parse_ruined_fooocus(data: dict[str, Any]) -> dict[str, Any]:
    """Ruined Fooocus (`"software": "RuinedFooocus"` in the `parameters` JSON): Prompt, Negative, steps,
    cfg, width, height, seed, sampler_name, scheduler, base_model_name, base_model_hash, loras as
    [[weight, name], ...] or [[name, weight], ...], clip_skip."""
    loras = {}
    for item in data.get("loras") if isinstance(data.get("loras"), list) else []:
        if isinstance(item, list | tuple) and len(item) >= 2:
            name = next((v for v in item[:2] if isinstance(v, str) and _float(v) is None), None)
            weight = next((_float(v) for v in item[:2] if _float(v) is not None), 1.0)
            if name:
                loras[_stem(name) or name] = weight
    out = fields(
        data.get("Prompt"), data.get("Negative"), data.get("steps"), data.get("cfg"), data.get("seed"),
        data.get("width"), data.get("height"), data.get("sampler_name"), data.get("scheduler"),
        data.get("base_model_name"), loras,
    )  # fmt: skip
    if _int(data.get("clip_skip")) is not None and 1 <= _int(data.get("clip_skip")) <= 12:
        out["clip_skip"] = _int(data.get("clip_skip"))
    return with_hash_and_styles(out, data.get("base_model_hash"), data.get("style_selection"))


_SIZE_TEXT = re.compile(r"^\s*\(?\s*(\d+)\s*[x×*,]\s*(\d+)\s*\)?\s*$")


def parse_generic_json(data: dict[str, Any]) -> dict[str, Any]:
    """JSON of the common key names that Hugging Face Spaces and other small apps write into
    `parameters` (diffusers' argument names and A1111's): prompt, negative_prompt, width/height or
    resolution "1024 x 1024", guidance_scale / cfg_scale / cfg, num_inference_steps / steps, seed,
    sampler / scheduler, Model / model, Model hash. A key is matched in any letter case."""
    p = {str(k).lower().replace(" ", "_"): v for k, v in data.items()}
    size = _SIZE_TEXT.match(str(p.get("resolution") or p.get("size") or ""))
    width, height = (size.group(1), size.group(2)) if size else (p.get("width"), p.get("height"))
    cfg = next((p[k] for k in ("guidance_scale", "cfg_scale", "cfg", "scale") if k in p), None)
    steps = next((p[k] for k in ("num_inference_steps", "steps") if k in p), None)
    sampler = p.get("sampler") or p.get("sampler_name") or p.get("scheduler")
    schedule = p.get("schedule_type") or (p.get("scheduler") if p.get("sampler") or p.get("sampler_name") else None)
    model = p.get("model") or p.get("model_name") or p.get("checkpoint")
    out = fields(
        p.get("prompt"), p.get("negative_prompt"), steps, cfg, p.get("seed"), width, height, sampler, schedule,
        model if isinstance(model, str) else None,
    )  # fmt: skip
    return with_hash_and_styles(out, p.get("model_hash"), p.get("styles"))
