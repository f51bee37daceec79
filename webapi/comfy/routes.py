"""ComfyUI's HTTP routes and websocket, at the server root and again under `/api`.

Each route checks its caller (`webapi.access`: Basic or Bearer, the same accounts as the other
APIs) and answers in ComfyUI's shapes; the caller's prompts, history, files and uploads are its
own (`service.Prompts`, `execute.Folders`). Bodies are read as JSON whatever their Content-Type
(urllib sends form-urlencoded, SillyTavern text/plain, some clients none).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.metadata
import json
import logging
import os
import platform
import re
import secrets
import sys
import urllib.parse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Request, WebSocket
from fastapi.responses import FileResponse, JSONResponse, Response
from PIL import Image

from engine import AppSettings, Caller, Engine, QueueFull
from pipelines import ModelInfo, from_any

from ..access import Access, Unauthorized
from ..body import TooLarge, json_body
from ..errors import WireError
from ..images import open_bytes
from .execute import SAFE_NAME
from .graph import Invalid, check
from .registry import NODES, Catalog, In, NodeType, VideoLimits
from .sampler import LATENT_METHODS
from .service import Entry, Prompts, status_message

log = logging.getLogger(__name__)
MAX_PROMPT_BYTES = 2 << 20  # a prompt with its workflow (ComfyUI's UI graph): real ones are well under 1 MiB
# ComfyUI's sampler and scheduler names (comfy/samplers.py), offered where ours match (`from_any`)
COMFY_SAMPLERS = ("euler", "euler_ancestral", "heun", "dpm_2", "dpm_2_ancestral", "lms", "dpmpp_sde", "dpmpp_2m",
                  "dpmpp_2m_sde", "ddim", "uni_pc", "lcm", "deis")  # fmt: skip
COMFY_SCHEDULERS = ("normal", "karras", "exponential", "sgm_uniform", "simple", "ddim_uniform", "beta",
                    "linear_quadratic", "kl_optimal")  # fmt: skip
VERSION = "0.3.0"  # the ComfyUI API this emulates (its routes and messages as of 0.3.x)


def _refusal(status: int, kind: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"type": kind, "message": message, "details": "", "extra_info": {}}, "node_errors": {}},
                        status_code=status)  # fmt: skip


class ComfyAPI:
    """The handlers, over one engine, its settings and the prompt queue."""

    def __init__(self, engine: Engine, settings: AppSettings, access: Access, prompts: Prompts):
        self.engine, self.settings, self.access, self.prompts = engine, settings, access, prompts
        self.folders = prompts.folders

    # ------------------------------------------------------------- helpers
    def catalog(self, owner: str | None) -> Catalog:
        info = self.engine.model_info()
        video = info.for_video if info.for_video.clips is not None else None
        offered = {*info.samplers, *(video.samplers if video else ())}  # a sampler runs on the model its latent is for
        samplers = tuple(n for n in COMFY_SAMPLERS if from_any(n).known and from_any(n).sampler in offered)
        uploads = self.folders.root("input", owner)
        upscalers = self.engine.upscalers.list(latent=False) if self.engine.upscalers else []
        return Catalog(
            models=(info.model_name,),
            loras=tuple(info.loras),
            samplers=samplers,
            schedulers=COMFY_SCHEDULERS,
            uploads=tuple(sorted(p.name for p in uploads.iterdir() if p.is_file())) if uploads.is_dir() else (),
            upscale_models=tuple(u.name for u in upscalers if u.kind == "model"),
            latent_methods=tuple(LATENT_METHODS),
            controlnets=tuple(info.controlnets),
            size_multiple=info.size_multiple,
            max_batch=info.max_batch,
            max_pixels=info.max_pixels,
            max_side=info.max_side,
            video=video_limits(video) if video else None,
        )

    # ------------------------------------------------------------- prompts
    async def post_prompt(self, request: Request, caller: Caller) -> Response:
        body = await json_body(request, MAX_PROMPT_BYTES)
        if not isinstance(body, dict) or "prompt" not in body:
            return _refusal(400, "no_prompt", "No prompt provided")
        owner = caller.user
        try:
            graph = check(body["prompt"], self.catalog(owner))
        except Invalid as refused:
            return JSONResponse(refused.body, status_code=400)
        prompt_id = body.get("prompt_id") or secrets.token_hex(16)
        if not isinstance(prompt_id, str) or not SAFE_NAME.match(prompt_id) or self.prompts.known(prompt_id):
            return _refusal(400, "invalid_prompt", "prompt_id must be a new id of letters, digits, '-' and '_'")
        extra = body.get("extra_data") if isinstance(body.get("extra_data"), dict) else {}
        client_id = body.get("client_id") if isinstance(body.get("client_id"), str) else None
        try:
            entry = self.prompts.add(
                owner,
                lambda number: Entry(prompt_id, number, owner, caller, client_id, graph, extra), bool(body.get("front"))
            )
        except QueueFull as exc:
            return _refusal(429, "queue_full", str(exc))
        return JSONResponse({"prompt_id": entry.id, "number": entry.number, "node_errors": {}})

    async def get_prompt(self, request: Request, caller: Caller) -> dict[str, Any]:
        return {"exec_info": {"queue_remaining": self.prompts.remaining(caller.user)}}

    async def get_queue(self, request: Request, caller: Caller) -> dict[str, Any]:
        return self.prompts.queue(caller.user)

    async def post_queue(self, request: Request, caller: Caller) -> Response:
        for ids in await _selections(request):
            self.prompts.delete(caller.user, ids)
        return Response(status_code=200)

    async def interrupt(self, request: Request, caller: Caller) -> Response:
        body = await json_body(request, 1 << 16)
        prompt_id = body.get("prompt_id") if isinstance(body, dict) else None
        self.prompts.interrupt(caller.user, str(prompt_id) if prompt_id else None)
        return Response(status_code=200)

    async def get_history(self, request: Request, caller: Caller) -> dict[str, Any]:
        raw = request.query_params.get("max_items")
        max_items = int(raw) if raw and raw.isascii() and raw.isdigit() else None
        return self.prompts.history(caller.user, max_items=max_items)

    async def get_history_item(self, request: Request, caller: Caller) -> dict[str, Any]:
        return self.prompts.history(caller.user, request.path_params["prompt_id"])

    async def post_history(self, request: Request, caller: Caller) -> Response:
        for ids in await _selections(request):
            self.prompts.forget(caller.user, ids)
        return Response(status_code=200)

    # ------------------------------------------------------------- files
    async def view(self, request: Request, caller: Caller) -> Response:
        q = request.query_params
        try:
            path = self.folders.find(q.get("type") or "output", caller.user, q.get("subfolder") or "", q.get("filename") or "")
        except FileNotFoundError:
            return Response(status_code=404)
        media = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".webp": "image/webp", ".mp4": "video/mp4",
                 ".gif": "image/gif"}  # fmt: skip
        return FileResponse(path, media_type=media.get(path.suffix.lower(), "application/octet-stream"))

    async def upload_image(self, request: Request, caller: Caller) -> Response:
        return await self._upload(request, caller, mask=False)

    async def upload_mask(self, request: Request, caller: Caller) -> Response:
        return await self._upload(request, caller, mask=True)

    async def _upload(self, request: Request, caller: Caller, mask: bool) -> Response:
        length = request.headers.get("content-length")
        if length and length.isascii() and length.isdigit() and int(length) > self.settings.max_file_bytes:
            return Response(f"the upload is larger than MAX_FILE_SIZE ({self.settings.max_file_size})", status_code=413)
        form = await request.form(max_files=1, max_fields=8)
        try:
            upload = form.get("image")
            if upload is None or isinstance(upload, str):
                return Response("no image in the form (field 'image')", status_code=400)
            data = await upload.read(self.settings.max_file_bytes + 1)
            if len(data) > self.settings.max_file_bytes:
                return Response(f"the upload is larger than MAX_FILE_SIZE ({self.settings.max_file_size})", status_code=413)
            name = plain_name(upload.filename)
            image = await asyncio.to_thread(open_bytes, data, ("image",), self.settings.max_upload_pixels, self.settings.max_file_bytes, None)
            if mask:
                image = await asyncio.to_thread(self._masked, image, form.get("original_ref"), caller.user)
            overwrite = str(form.get("overwrite", "")).lower() in ("true", "1")
            saved = await asyncio.to_thread(self._store, image, name, overwrite, caller.user)
        except (ValueError, FileNotFoundError) as exc:
            return Response(str(exc), status_code=400)
        finally:
            await form.close()
        return JSONResponse({"name": saved, "subfolder": "", "type": "input"})

    def _masked(self, mask: Image.Image, ref: Any, owner: str | None) -> Image.Image:
        """ComfyUI's /upload/mask: the original picture with the mask's alpha as its own."""
        try:
            ref = json.loads(ref) if isinstance(ref, str) else None
        except ValueError:
            ref = None
        if not isinstance(ref, dict) or not isinstance(ref.get("filename"), str):
            raise ValueError("original_ref must name the picture the mask is for")
        path = self.folders.find(str(ref.get("type") or "input"), owner, str(ref.get("subfolder") or ""), ref["filename"])
        with Image.open(path) as original:
            out = original.convert("RGBA")
        out.putalpha(mask.convert("RGBA").getchannel("A").resize(out.size))
        return out

    def _store(self, image: Image.Image, name: str, overwrite: bool, owner: str | None) -> str:
        folder = self.folders.root("input", owner)
        folder.mkdir(parents=True, exist_ok=True)
        stem = os.path.splitext(name)[0]
        name = stem + ".png"  # stored as a PNG whatever it came as (the pixels checked, nothing else kept)
        if image.mode not in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16"):  # CMYK, YCbCr, float: not PNG modes
            image = image.convert("RGBA")
        n = 1
        while not overwrite and (folder / name).exists():
            name, n = f"{stem} ({n}).png", n + 1
        image.save(folder / name, format="PNG")
        return name

    # ------------------------------------------------------------- information
    async def object_info(self, request: Request, caller: Caller) -> dict[str, Any]:
        catalog = self.catalog(caller.user)
        wanted = request.path_params.get("node_class")
        return {n: describe(t, catalog) for n, t in NODES.items() if wanted in (None, n)}

    async def system_stats(self, request: Request, caller: Caller) -> dict[str, Any]:
        replicas = self.engine.status()
        devices = [
            {"name": f"{r.name} : {r.device_name}", "type": r.backend, "index": i,
             "vram_total": r.memory.get("total") or 0, "vram_free": r.memory.get("free") or 0,
             "torch_vram_total": r.memory.get("reserved") or 0, "torch_vram_free": 0}
            for i, r in enumerate(replicas)
        ]  # fmt: skip
        host = replicas[0].memory if replicas else {}
        system = {
            "os": os.name, "python_version": sys.version, "embedded_python": False, "comfyui_version": VERSION,
            "pytorch_version": importlib.metadata.version("torch"), "argv": ["app.py"], "platform": platform.platform(),
            "ram_total": host.get("host_total") or 0, "ram_free": host.get("host_available") or 0,
        }  # fmt: skip
        return {"system": system, "devices": devices}

    async def embeddings(self, request: Request, caller: Caller) -> list[str]:
        return sorted(self.engine.model_info().embeddings)

    async def model_folders(self, request: Request, caller: Caller) -> list[str]:
        return sorted(self._folders(caller.user))

    async def models_in(self, request: Request, caller: Caller) -> Response:
        found = self._folders(caller.user).get(request.path_params["folder"])
        return JSONResponse(list(found)) if found is not None else Response(status_code=404)

    def _folders(self, owner: str | None) -> dict[str, tuple[str, ...]]:
        c = self.catalog(owner)
        return {"checkpoints": c.served, "loras": c.loras, "vae": c.served, "upscale_models": c.upscale_models,
                "embeddings": tuple(sorted(self.engine.model_info().embeddings)), "diffusion_models": c.served,
                "text_encoders": c.served, "controlnet": c.controlnets}  # fmt: skip

    # ------------------------------------------------------------- websocket
    async def websocket(self, socket: WebSocket) -> None:
        try:
            caller = who(self.access, socket)
        except Unauthorized:
            await socket.close(code=1008)
            return
        client_id = socket.query_params.get("clientId") or secrets.token_hex(16)
        await socket.accept()
        outbox = self.prompts.sockets.add(client_id, socket, caller.user)
        outbox.put(status_message(self.prompts.remaining(caller.user), client_id))
        sender = asyncio.create_task(outbox.drain())
        try:
            while (await socket.receive())["type"] != "websocket.disconnect":
                pass  # clients send nothing that matters; this notices the close
        finally:
            self.prompts.sockets.remove(client_id, outbox)
            sender.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sender


async def _selections(request: Request) -> list[list[str] | None]:
    """What a POST /queue or /history body selects, in ComfyUI's shape: `{"clear": true}` is everything
    (None), `{"delete": [ids]}` those ids; any other body selects nothing."""
    body = await json_body(request, 1 << 20)
    body = body if isinstance(body, dict) else {}
    found: list[list[str] | None] = [None] if body.get("clear") else []
    if isinstance(body.get("delete"), list):
        found.append([str(i) for i in body["delete"]])
    return found


def plain_name(sent: str | None) -> str:
    """An upload's name as a plain file name: its last part (URL-quoted names unquoted, as aiohttp
    sends "a%20b.png"), every character outside letters, digits, " .()-_" made "_"."""
    name = Path(urllib.parse.unquote(sent or "").replace("\\", "/")).name.lstrip(".")
    name = re.sub(r"[^\w .()\-]", "_", name)[-100:].strip()
    return name if SAFE_NAME.match(name) else "upload.png"


def video_limits(video: ModelInfo) -> VideoLimits:
    """What a video latent node is checked against: the video model's clips (`VideoAbilities`) and limits."""
    clips = video.clips
    return VideoLimits(
        name=video.model_name, frame_step=clips.frame_step, max_frames=clips.max_frames, text_to_video=clips.text_to_video,
        image_to_video=bool(clips.image_to_video), max_batch=video.max_batch, max_pixels=video.max_pixels, max_side=video.max_side,
    )  # fmt: skip


def describe(kind: NodeType, catalog: Catalog) -> dict[str, Any]:
    """One class as ComfyUI's /object_info shows it."""
    required = {name: _input(i, catalog) for name, i in kind.inputs.items() if not i.optional}
    optional = {name: _input(i, catalog) for name, i in kind.inputs.items() if i.optional}
    return {
        "input": {"required": required, "optional": optional},
        "input_order": {"required": list(required), "optional": list(optional)},
        "output": list(kind.outputs), "output_is_list": [False] * len(kind.outputs),
        "output_name": list(kind.output_names or kind.outputs), "name": kind.name, "display_name": kind.name,
        "description": kind.refused or kind.description, "python_module": "nodes", "category": kind.category,
        "output_node": kind.output_node, "deprecated": False, "experimental": False,
    }  # fmt: skip


def _input(i: In, catalog: Catalog) -> list[Any]:
    if i.type == "COMBO":
        choices = list(i.choices(catalog)) if i.choices else []
        return [choices, {"default": i.default}] if i.default in choices else [choices]
    if i.linked:
        return [i.type]
    options: dict[str, Any] = {"default": i.default}
    if i.type in ("INT", "FLOAT"):
        options |= {k: v for k, v in (("min", i.low), ("max", i.high), ("step", i.step)) if v is not None}
        if i.type == "INT":
            options = {k: int(v) for k, v in options.items()}
    if i.multiline:
        options["multiline"] = True
    return [i.type, options]


Handler = Callable[[Request, Caller], Awaitable[Any]]
KEY_PREFIX = "/key/{path_key}"  # every route again below an API key, for clients that send no credentials


def who(access: Access, request: Request | WebSocket) -> Caller:
    """The caller: by the API key in the path under KEY_PREFIX, else by its headers (Basic or Bearer)."""
    key = request.path_params.get("path_key")
    return access.caller(request) if key is None else access.key_caller(request, key)



def guarded(access: Access, handler: Handler) -> Callable[[Request], Awaitable[Any]]:
    """The handler with its caller checked, and a malformed body a 4xx (never a 500)."""

    async def call(request: Request) -> Any:
        try:
            caller = who(access, request)
        except Unauthorized as exc:
            return JSONResponse({"error": {"type": "unauthorized", "message": str(exc)}}, status_code=401,
                                headers={"WWW-Authenticate": 'Basic realm="ComfyUI API"'})  # fmt: skip
        try:
            return await handler(request, caller)
        except TooLarge as exc:
            return _refusal(413, "too_large", str(exc))
        except WireError as exc:
            return _refusal(400, "invalid_body", str(exc))

    call.__name__ = handler.__name__
    return call


def router(engine: Engine, settings: AppSettings, access: Access, prompts: Prompts) -> APIRouter:
    api = ComfyAPI(engine, settings, access, prompts)
    routes = [
        ("POST", "/prompt", api.post_prompt), ("GET", "/prompt", api.get_prompt),
        ("GET", "/queue", api.get_queue), ("POST", "/queue", api.post_queue), ("POST", "/interrupt", api.interrupt),
        ("GET", "/history", api.get_history), ("GET", "/history/{prompt_id}", api.get_history_item),
        ("POST", "/history", api.post_history), ("GET", "/view", api.view),
        ("POST", "/upload/image", api.upload_image), ("POST", "/upload/mask", api.upload_mask),
        ("GET", "/object_info", api.object_info), ("GET", "/object_info/{node_class}", api.object_info),
        ("GET", "/system_stats", api.system_stats), ("GET", "/embeddings", api.embeddings),
        ("GET", "/models", api.model_folders), ("GET", "/models/{folder}", api.models_in),
    ]  # fmt: skip
    r = APIRouter(tags=["ComfyUI API"])
    for prefix in ("", "/api", KEY_PREFIX, KEY_PREFIX + "/api"):
        for method, path, handler in routes:
            r.add_api_route(prefix + path, guarded(access, handler), methods=[method], include_in_schema=not prefix)  # fmt: skip
        r.add_api_websocket_route(prefix + "/ws", api.websocket)
    return r
