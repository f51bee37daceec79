"""OpenAI's images API on the app's port: what the `openai` SDK and the tools built on it call.

- POST /v1/images/generations (JSON): text-to-image with the loaded model;
- POST /v1/images/edits (multipart/form-data): with a `mask`, an inpaint (OpenAI's mask: its fully
  transparent pixels are edited); without one, the instruction editor where the model serving edits
  is one (`ModelInfo.for_edits.edit`), else image-to-image from `strength`;
- GET /v1/images/files/<token>.<ext>: the images of `response_format="url"` (no credentials, like
  OpenAI's signed URLs; kept CACHE_MINUTES, `webapi.openai_files`);
- GET /v1/models, /v1/models/{id}: the loaded model (and the editor beside it).

Fields are read in `webapi.openai_params`, errors answered in OpenAI's shape by
`webapi.openai_errors.OpenAIRoute`. Every call checks its caller (`webapi.access`) and runs through
the engine (`webapi.running.run_job`): QUEUE_SIZE, QUEUE_PER_USER, the model's limits, TIME_BUDGET
and cancel-on-disconnect apply as for the UI. An images call never switches models: a `model` naming
another one is answered by the loaded model, with a warning saying so. docs/openai-api.md documents
every field.
"""

from __future__ import annotations

import asyncio
import base64
import logging
import re
import time
from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from PIL import Image
from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.formparsers import MultiPartException

from engine import AppSettings, Caller, Engine
from engine.inputs import Limits
from engine.jobs import CancelledBeforeStart, QueueFull, Refused, TooManyJobs
from pipelines import INPAINT_FAMILIES, GenerationRequest, GenerationResult, ModelInfo, binary_mask
from pipelines.schema.errors import ModelLoadError, PipelineError

from . import body, openai_params
from .access import Access, Unauthorized
from .body import TooLarge
from .errors import WireError
from .images import header_size, open_bytes
from .openai_errors import OpenAIError, OpenAIRoute, bad_request, not_found, refused
from .openai_files import FileStore, encode
from .running import ClientGone, run_job

log = logging.getLogger(__name__)

OWNER = "diffusion-anywhere"
RETRY_AFTER = {"Retry-After": "2"}  # a full queue or a caller's own limit clears in seconds
_FILE_NAME = re.compile(r"[A-Za-z0-9_-]{43}\.(png|jpeg|webp)")


def router(engine: Engine, settings: AppSettings, access: Access) -> APIRouter:
    api = OpenAIImages(engine, settings, access)
    r = APIRouter(prefix="/v1", route_class=OpenAIRoute, tags=["OpenAI images API"])
    r.add_api_route("/images/generations", api.generations, methods=["POST"])
    r.add_api_route("/images/edits", api.edits, methods=["POST"])
    r.add_api_route("/images/variations", api.variations, methods=["POST"])
    r.add_api_route("/images/files/{name}", api.file, methods=["GET"])
    r.add_api_route("/models", api.models, methods=["GET"])
    r.add_api_route("/models/{model_id:path}", api.model, methods=["GET"])
    return r


def openai_mask(mask: Image.Image) -> Image.Image:
    """OpenAI's mask as ours ("L", white = repaint): a mask with alpha is edited where it is FULLY
    transparent (alpha 0); a mask without alpha is read as the Inpaint tab reads one (any
    non-black pixel is repainted: white = repaint)."""
    has_alpha = mask.mode in ("RGBA", "LA", "PA", "RGBa", "La") or "transparency" in mask.info
    if not has_alpha:
        return binary_mask(mask)
    alpha = np.asarray(mask.convert("RGBA"))[..., 3]
    return Image.fromarray(np.where(alpha == 0, 255, 0).astype(np.uint8), mode="L")


class OpenAIImages:
    """The routes' handlers, over one engine and the server's settings."""

    def __init__(self, engine: Engine, settings: AppSettings, access: Access):
        self.engine, self.settings, self.access = engine, settings, access
        self.max_bytes = settings.max_file_bytes
        self.files = FileStore(settings.cache_minutes)
        self.created = int(time.time())

    # ------------------------------------------------------------------ routes
    async def generations(self, request: Request) -> JSONResponse:
        caller = self._caller(request)
        raw = await self._json(request)
        info = self.engine.model_info()
        if not info.text_to_image:
            raise bad_request(f"model: {info.model_name} does not do text-to-image (use /v1/images/edits)", "model")
        parsed = self._parse(openai_params.generation, raw, self._limits(info, "txt2img"))
        result = await self._run(parsed.request, caller, request)
        return await self._answer(result, parsed, info.model_name, request)

    async def edits(self, request: Request) -> JSONResponse:
        caller = self._caller(request)
        raw, files, mask_file = await self._form(request)
        info = self.engine.model_info()
        task = "inpaint" if mask_file is not None else "img2img"
        model = info.for_task(task)
        if mask_file is not None and not info.inpaint:
            raise bad_request(f"mask: {info.model_name} cannot inpaint; models that can: {INPAINT_FAMILIES}", "mask")
        if mask_file is None and not (model.edit or model.image_to_image):
            raise bad_request(f"image: {model.model_name} cannot edit images (text-to-image only)", "image")
        try:
            images = await self._images(files)
            mask = None if mask_file is None else await self._mask(mask_file, images[0].size)
        except WireError as exc:
            raise refused(exc) from None
        parsed = self._parse(openai_params.edit, raw, self._limits(info, task), images, mask)
        result = await self._run(parsed.request, caller, request)
        return await self._answer(result, parsed, model.model_name, request)

    async def variations(self, request: Request) -> JSONResponse:
        self._caller(request)
        raise not_found("variations are not served here: use /v1/images/edits with a prompt (image-to-image)")

    async def file(self, name: str) -> Response:
        found = self.files.get(name) if _FILE_NAME.fullmatch(name) else None
        if found is None:
            raise not_found("no such image: image URLs expire after CACHE_MINUTES")
        media_type, data = found
        return Response(
            data, media_type=media_type, headers={"Cache-Control": f"private, max-age={self.files.seconds:.0f}"}
        )

    async def models(self, request: Request) -> JSONResponse:
        self._caller(request)
        return JSONResponse({"object": "list", "data": self._model_entries()})

    async def model(self, model_id: str, request: Request) -> JSONResponse:
        self._caller(request)
        for entry in self._model_entries():
            if entry["id"] == model_id:
                return JSONResponse(entry)
        raise not_found(f"model {model_id[:80]!r} is not served here (GET /v1/models lists them)", "model")

    # ------------------------------------------------------------------ helpers
    def _caller(self, request: Request) -> Caller:
        try:
            return self.access.caller(request)
        except Unauthorized as exc:
            raise OpenAIError(401, f"{exc}", param=None, code="invalid_api_key") from None

    def _limits(self, info: ModelInfo, task: str) -> Limits:
        """The limits of the model serving `task` (`ModelInfo.for_task`: the routing rule's one owner)."""
        return Limits.of(self.settings, info).for_task(task)

    @staticmethod
    def _parse(parse: Any, raw: dict[str, Any], *args: Any) -> openai_params.Parsed:
        try:
            return parse(raw, *args)
        except ValueError as exc:
            raise refused(exc) from None

    def _model_entries(self) -> list[dict[str, Any]]:
        info = self.engine.model_info()
        roles = {info.model_name: "text-to-image" if info.text_to_image else "edits"}
        roles.setdefault(info.for_edits.model_name, "edits")
        return [
            {"id": name, "object": "model", "created": self.created, "owned_by": OWNER, "role": role}
            for name, role in roles.items()
        ]

    async def _json(self, request: Request) -> Any:
        """The JSON body, read up to a bound (prompts are capped by MAX_PROMPT_CHARS anyway)."""
        try:
            data = await body.json_body(request, body.fields_cap(self.settings.max_prompt_chars))
        except TooLarge as exc:
            raise OpenAIError(413, str(exc), code="too_large") from None
        except WireError as exc:
            raise bad_request(str(exc), param=None, code="invalid_json") from None
        if data is None:
            raise bad_request("the request body is empty: send a JSON object", param=None, code="invalid_json")
        return data

    async def _form(self, request: Request) -> tuple[dict[str, Any], list[bytes], bytes | None]:
        """(text fields, image bytes, mask bytes or None) of a multipart edit: counts checked before
        any file is read, each file read up to MAX_FILE_SIZE (+1 byte, to tell it was over)."""
        if not request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
            raise bad_request("send an edit as multipart/form-data (image, mask, prompt, ...)", param=None)
        most = self.settings.max_edit_files
        declared = request.headers.get("content-length") or "0"
        if declared.isdigit() and int(declared) > (most + 1) * self.max_bytes + 2**20:
            raise OpenAIError(413, f"the upload is larger than {most + 1} files of MAX_FILE_SIZE", param="image")
        try:
            form = await request.form(max_files=most + 2, max_fields=100, max_part_size=2**20)
        except (MultiPartException, StarletteHTTPException) as exc:
            raise bad_request(f"image: the form could not be read: {getattr(exc, 'detail', exc)}", "image") from None
        try:
            raw, uploads, mask = _split(form, most)
            images = [await upload.read(self.max_bytes + 1) for upload in uploads]
            return raw, images, None if mask is None else await mask.read(self.max_bytes + 1)
        except WireError as exc:
            raise refused(exc) from None
        finally:
            await form.close()  # the spooled temporary files

    async def _images(self, files: list[bytes]) -> list[Image.Image]:
        """Each image decoded after its header passed the byte and pixel checks, as RGB."""
        places = [("image",)] if len(files) == 1 else [("image", i) for i in range(len(files))]
        images = []
        for loc, data in zip(places, files, strict=True):
            args = (data, loc, self.settings.max_upload_pixels, self.max_bytes, "RGB")
            images.append(await asyncio.to_thread(open_bytes, *args))
        return images

    async def _mask(self, data: bytes, size: tuple[int, int]) -> Image.Image:
        """The mask, its header checked (an image, the image's size) before it is decoded; as ours."""
        mask_size = header_size(data, ("mask",), self.settings.max_upload_pixels)
        if mask_size != size:
            raise WireError(
                ("mask",),
                f"{mask_size[0]}x{mask_size[1]} but the image is {size[0]}x{size[1]}; the mask must have its image's size",
            )
        args = (data, ("mask",), self.settings.max_upload_pixels, self.max_bytes, None)
        return openai_mask(await asyncio.to_thread(open_bytes, *args))

    async def _run(self, request: GenerationRequest, caller: Caller, http_request: Request) -> GenerationResult:
        """The engine's answer, or its refusal in OpenAI's shape."""
        try:
            return await run_job(self.engine, request, caller, http_request)
        except TooManyJobs as exc:
            raise OpenAIError(429, str(exc), "rate_limit_error", code="rate_limit_exceeded", headers=RETRY_AFTER) from None
        except QueueFull as exc:
            raise OpenAIError(429, str(exc), "rate_limit_error", code="queue_full", headers=RETRY_AFTER) from None
        except (ClientGone, CancelledBeforeStart) as exc:
            raise OpenAIError(499, f"cancelled: {exc}", code="cancelled") from None
        except Refused as exc:
            raise OpenAIError(503, str(exc), "server_error", code="refused") from None
        except ValueError as exc:  # the schema's and the model's checks (ModelInfo.accept), by field
            raise refused(exc) from None
        except ModelLoadError as exc:
            raise OpenAIError(503, str(exc), "server_error", code="model_not_loaded") from None
        except PipelineError as exc:  # a message meant for the user (out of memory, ...)
            log.warning("OpenAI API: generation failed: %s", exc)
            raise OpenAIError(500, str(exc), "server_error", code="generation_failed") from None

    async def _answer(
        self, result: GenerationResult, parsed: openai_params.Parsed, model: str, request: Request
    ) -> JSONResponse:
        out = parsed.output
        pairs = list(zip(result.images, result.metadata, strict=False))
        blobs = await asyncio.to_thread(
            lambda: [encode(im, meta, out.output_format, out.compression) for im, meta in pairs]
        )
        base = str(request.base_url).rstrip("/")
        items = []
        for blob, seed in zip(blobs, result.seeds, strict=False):
            if out.response_format == "url":
                item: dict[str, Any] = {"url": f"{base}/v1/images/files/{self.files.put(blob, out.output_format)}"}
            else:
                item = {"b64_json": base64.b64encode(blob).decode("ascii")}
            items.append({**item, "revised_prompt": None, "seed": seed})
        first = result.images[0].size if result.images else (0, 0)
        return JSONResponse({
            "created": int(time.time()), "data": items, "model": model, "size": f"{first[0]}x{first[1]}",
            "output_format": out.output_format, "background": "opaque", "seeds": result.seeds[: len(items)],
            "timings": {k: round(v, 4) for k, v in result.timings.items()},
            "warnings": [*parsed.warnings, *result.warnings], "cancelled": result.cancelled,
        })  # fmt: skip


def _split(form: Any, most: int) -> tuple[dict[str, Any], list[Any], Any]:
    """A multipart form as (text fields, image files, mask file or None); WireError naming the field."""
    raw: dict[str, Any] = {}
    images, mask = [], None
    for key, value in form.multi_items():
        is_file = isinstance(value, UploadFile)
        if key in ("image", "image[]"):
            if not is_file:
                raise WireError(("image",), "expected an uploaded image file, got a text field")
            images.append(value)
        elif key == "mask":
            if not is_file:
                raise WireError(("mask",), "expected an uploaded PNG file, got a text field")
            mask = value
        elif is_file:
            raise WireError((key[:40],), "expected a text field, got a file")
        else:
            raw[key] = value
    if not images:
        raise WireError(("image",), "upload at least one image to edit (the field image, or image[] for several)")
    if len(images) > most:
        raise WireError(("image",), f"{len(images)} files, more than the limit of {most} (MAX_EDIT_FILES)")
    return raw, images, mask
