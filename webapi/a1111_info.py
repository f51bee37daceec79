"""What the A1111 API answers besides running jobs: a result's `info`, the model and option lists,
the caller's progress, PNG info. Shapes are A1111's (modules/api/models.py, 1.10), so clients that
read them (Open WebUI, SillyTavern, `webuiapi`) find the keys they expect.
"""

from __future__ import annotations

import io
import json
import logging
import re
import time
from typing import Any

from PIL import Image

from engine import Engine
from engine.jobs import Job
from pipelines import LATENT_UPSCALERS as LATENT
from pipelines import SAMPLERS_BY_NAME as BY_NAME
from pipelines import GenerationResult, ModelInfo, a1111_parameters, parse_a1111, read_png_info
from pipelines import read_png_text as read_text

from .a1111_request import Parsed, a1111_sampler_names
from .running import png_base64

log = logging.getLogger(__name__)

VERSION = "diffusion-anywhere"
_HASH_SUFFIX = re.compile(r"\s*\[[0-9a-fA-F]{8,64}\]\s*$")


def a1111_sampler(meta: dict[str, Any]) -> tuple[str, str]:
    """(sampler_name, scheduler) as A1111 reports them for our metadata's sampler."""
    name = meta.get("sampler", "")
    sampler, schedule = BY_NAME[name].a1111 if name in BY_NAME else (name, None)
    return sampler, schedule or "Automatic"


def info(parsed: Parsed, result: GenerationResult, model_hash: str | None) -> dict[str, Any]:
    """A1111's `info` (sent as a JSON string), for the images that finished."""
    request, metas = parsed.request, result.metadata
    first = metas[0] if metas else {}
    n = len(result.images)
    seeds = list(result.seeds) or ([request.seed] if request.seed is not None else [])
    sampler, schedule = a1111_sampler(first) if first else (parsed.sampler or "Automatic", "Automatic")
    return {
        "prompt": parsed.prompt,
        "all_prompts": [m.get("prompt", parsed.prompt) for m in metas[:n]],  # each image's, its wildcards resolved
        "negative_prompt": request.negative_prompt or "",
        "all_negative_prompts": [request.negative_prompt or ""] * n,
        "seed": seeds[0] if seeds else -1,
        "all_seeds": seeds,
        "subseed": seeds[0] if seeds else -1,
        "all_subseeds": seeds,
        "subseed_strength": 0,
        "width": first.get("width", request.width),
        "height": first.get("height", request.height),
        "sampler_name": sampler,
        "scheduler": schedule,
        "cfg_scale": request.guidance_scale,
        "steps": request.steps,
        "batch_size": parsed.batch_size,
        "n_iter": parsed.n_iter,
        "restore_faces": False,
        "face_restoration_model": None,
        "sd_model_name": first.get("model"),
        "sd_model_hash": first.get("model_hash") or model_hash,
        "sd_vae_name": None,
        "sd_vae_hash": None,
        "seed_resize_from_w": -1,
        "seed_resize_from_h": -1,
        "denoising_strength": request.strength if request.init_images else 0,
        "extra_generation_params": {"Lora": dict(request.loras)} if request.loras else {},
        "index_of_first_image": 0,
        "infotexts": [a1111_parameters(meta) for meta in metas],
        "styles": [],
        "job_timestamp": time.strftime("%Y%m%d%H%M%S"),
        "clip_skip": 1,
        "is_using_inpainting_conditioning": False,
        "version": VERSION,
        "warnings": [*parsed.warnings, *result.warnings],
    }


def png_b64(image: Image.Image) -> str:
    """An upscaled image as A1111's extras answer it (no generation metadata)."""
    return png_base64(image)


def images_b64(result: GenerationResult) -> list[str]:
    return [png_base64(image, meta) for image, meta in zip(result.images, result.metadata, strict=True)]


def checkpoint_name(value: str) -> str:
    """A model name from an A1111 title ("name.safetensors [hash]" -> "name")."""
    name = _HASH_SUFFIX.sub("", value.strip())
    for suffix in (".safetensors", ".ckpt"):
        name = name.removesuffix(suffix)
    return name


def sd_models(engine: Engine, model_hash: str | None) -> list[dict[str, Any]]:
    """A1111's checkpoint list: the loaded model, and, only where switching is allowed, the others that
    can load here (`Engine.models()["models"]`, pipelines.weights.catalog): a client's model dropdown then offers
    nothing that cannot load (before, every recipe, downloadable or not)."""
    listing = engine.models()
    names = [m["name"] for m in listing["models"]] if engine.can_switch else []
    current = listing["current"]
    names = [current, *(n for n in names if n != current)]
    return [
        {
            "title": name,
            "model_name": name,
            "hash": (model_hash or "")[:10] or None if name == current else None,
            "sha256": None,
            "filename": name,
            "config": None,
        }
        for name in names
    ]


def options(model: ModelInfo, model_hash: str | None) -> dict[str, Any]:
    """The A1111 options that clients read; the values are what this server does."""
    return {
        "sd_model_checkpoint": model.model_name,
        "sd_checkpoint_hash": model_hash,
        "sd_vae": "Automatic",
        "sd_vae_name": None,
        "CLIP_stop_at_last_layers": 1,
        "samples_format": "png",
        "samples_save": False,
        "save_images_default": False,
        "grid_save": False,
        "enable_pnginfo": True,
        "eta_noise_seed_delta": 0,
        "sd_checkpoints_limit": 1,
        "live_previews_enable": True,
        "show_progress_every_n_steps": 1,
        "img2img_fix_steps": False,
        "sd_lora": "None",
        "sampler_name": model.scheduler,
    }


def samplers(model: ModelInfo) -> list[dict[str, Any]]:
    """The model's samplers by A1111's names, with A1111's own aliases for each (the sampler table's)."""
    return [
        {"name": n, "aliases": list(BY_NAME[n].aliases) if n in BY_NAME else [], "options": {}}
        for n in a1111_sampler_names(model)
    ]


def schedulers(model: ModelInfo) -> list[dict[str, Any]]:
    """Automatic (the sampler's own), and Karras where a Karras variant is offered for this model."""
    out = [{"name": "automatic", "label": "Automatic", "aliases": None, "default_rho": -1, "need_inner_model": False}]
    if any(s.endswith(" Karras") for s in model.samplers):
        out.append(
            {"name": "karras", "label": "Karras", "aliases": None, "default_rho": 7.0, "need_inner_model": False}
        )
    return out


def upscalers(engine: Engine) -> list[dict[str, Any]]:
    """A1111's /upscalers: "None" (a plain resize), Lanczos, Nearest, then the server's models
    (pipelines.imaging.upscalers), each with its file and factor."""
    out = [{"name": "None", "model_name": None, "model_path": None, "model_url": None, "scale": 4}]
    for item in engine.upscalers.list(latent=False) if engine.upscalers else []:
        name = item.name if item.kind == "model" else None
        out.append({"name": item.name, "model_name": name, "model_path": item.path, "model_url": None, "scale": item.scale})
    return out


def latent_upscale_modes() -> list[dict[str, str]]:
    """A1111's latent modes, which hires fix takes as `hr_upscaler` (pipelines.imaging.upscalers.LATENT)."""
    return [{"name": n} for n in LATENT]


def prompt_styles(model: ModelInfo) -> list[dict[str, str]]:
    """`/sdapi/v1/prompt-styles`: the styles of the server's STYLES_FILE, as A1111 lists them."""
    return [{"name": name, **texts} for name, texts in model.styles.items()]


def embeddings(model: ModelInfo) -> dict[str, Any]:
    """`/sdapi/v1/embeddings` as A1111 answers it: the textual-inversion embeddings loaded (EMBEDDINGS_DIR),
    and those skipped because they do not fit this model (the reason is in our extra `reason`)."""

    def entry(vectors: int | None, shape: int | None, reason: str | None = None) -> dict[str, Any]:
        out = {"step": None, "sd_checkpoint": None, "sd_checkpoint_name": None, "shape": shape, "vectors": vectors}
        return out if reason is None else {**out, "reason": reason}

    return {
        "loaded": {n: entry(e["vectors"], e["shape"]) for n, e in model.embeddings.items()},
        "skipped": {n: entry(None, None, why) for n, why in model.embeddings_skipped.items()},
    }


def loras(model: ModelInfo) -> list[dict[str, Any]]:
    return [{"name": n, "alias": n, "path": n, "metadata": {}} for n in model.loras]


def memory(engine: Engine) -> dict[str, Any]:
    """A1111's /memory from the replicas' memory stats (host RAM; the first accelerator)."""
    rows = [r.memory for r in engine.status() if r.memory]
    host = rows[0] if rows else {}
    total, available = host.get("host_total"), host.get("host_available")
    ram = {"free": available, "used": (total - available) if total and available else None, "total": total}
    device = next((m for m in rows if m.get("backend") not in (None, "cpu")), None)
    if device is None:
        return {"ram": ram, "cuda": {"error": "no accelerator"}}
    free, all_ = device.get("free"), device.get("total")
    used = (all_ - free) if free is not None and all_ is not None else None
    return {
        "ram": ram,
        "cuda": {
            "system": {"free": free, "used": used, "total": all_},
            "active": {"current": device.get("allocated"), "peak": device.get("peak")},
            "allocated": {"current": device.get("allocated"), "peak": device.get("peak")},
            "reserved": {"current": device.get("reserved"), "peak": device.get("reserved")},
        },
    }


def _preview_b64(job: Job) -> str | None:
    frames = job.preview.images if job.preview else []
    if not frames:
        return None
    frame = frames[-1]
    if not isinstance(frame, Image.Image):
        try:
            frame = Image.fromarray(frame)
        except (TypeError, ValueError):
            return None
    return png_base64(frame.convert("RGB"))


def progress(jobs: list[Job], started: dict[str, float], skip_image: bool) -> dict[str, Any]:
    """A1111's /progress over the caller's own jobs (running first, then queued)."""
    state = {"skipped": False, "interrupted": False, "job": "", "job_count": len(jobs), "job_timestamp": "0",
             "job_no": 0, "sampling_step": 0, "sampling_steps": 0}  # fmt: skip
    running = next((j for j in jobs if j.state == "running"), None)
    job = running or (jobs[0] if jobs else None)
    if job is None:
        return {"progress": 0, "eta_relative": 0, "state": state, "current_image": None, "textinfo": None}
    began = started.get(job.id, time.time())
    step = job.progress
    fraction = step.step / step.total if step and step.total else 0.0
    elapsed = time.time() - began
    state.update(
        job=f"job({job.id})",
        job_timestamp=time.strftime("%Y%m%d%H%M%S", time.localtime(began)),
        job_no=step.image if step else 0,
        sampling_step=step.step if step else 0,
        sampling_steps=step.total if step else job.request.steps,
        interrupted=job.should_stop(),
    )
    return {
        "progress": round(fraction, 4),
        "eta_relative": round(elapsed * (1 - fraction) / fraction, 2) if fraction > 0 else 0,
        "state": state,
        "current_image": None if skip_image or running is None else _preview_b64(running),
        "textinfo": (step.note or f"step {step.step}/{step.total}") if step else ("waiting in the queue" if running is None else None),
    }


def _prompt_lines(text: str, has_settings: bool) -> str:
    """An infotext's prompt as written (its <lora:> tags kept, as A1111's "Prompt" has them)."""
    lines = text.strip().split("\n")
    if has_settings:
        lines = lines[:-1]
    ends = next((i for i, line in enumerate(lines) if line.startswith("Negative prompt:")), len(lines))
    return "\n".join(lines[:ends])


def png_info(data: bytes) -> dict[str, Any]:
    """A1111's /png-info: `info` is the `parameters` infotext (A1111's, ours, Forge's...), `items` the
    other text chunks, `parameters` the infotext's fields as A1111 names them; a file from another
    tool (ComfyUI, InvokeAI, ...) has no infotext: its fields as pipelines.pnginfo.read reads them."""
    try:
        text, _ = read_text(io.BytesIO(data))  # chunks and EXIF/XMP; the pixels are not decoded
    except Exception as exc:  # any damage: A1111 answers an unreadable file with empty fields too
        log.info("png-info: unreadable image (%s: %s)", type(exc).__name__, exc)
        return {"info": "", "items": {}, "parameters": {}}
    items = {k: v for k, v in text.items() if isinstance(v, str)}
    infotext = items.pop("parameters", None)
    if infotext is not None and not infotext.lstrip().startswith("{"):  # SwarmUI / Fooocus put JSON there
        fields = parse_a1111(infotext)
        parameters = {"Prompt": _prompt_lines(infotext, bool(fields["extra"]))}
        parameters["Negative prompt"] = fields.get("negative_prompt", "")
        parameters.update(fields["extra"])
        if "width" in fields:
            parameters["Size-1"], parameters["Size-2"] = str(fields["width"]), str(fields["height"])
        return {"info": infotext, "items": items, "parameters": parameters}
    try:
        found = read_png_info(io.BytesIO(data))
    except ValueError:
        return {"info": "", "items": items, "parameters": {}}
    return {"info": "", "items": items, "parameters": {k: v for k, v in found["parameters"].items() if k != "loras"}}


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)
