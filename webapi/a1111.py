"""AUTOMATIC1111's web API (`/sdapi/v1/*`) on this server: Open WebUI, SillyTavern, `webuiapi`, plugins.

Every route first checks its caller (`webapi.access`: 401 with `WWW-Authenticate: Basic`, as A1111's
`--api-auth`), then answers in A1111's shapes. txt2img and img2img run through the engine
(`webapi.running`), so QUEUE_SIZE, QUEUE_PER_USER, the model's limits, TIME_BUDGET and Stop apply as
in the UI; images are returned, never saved on the server (A1111's API default `save_images: false`).

Errors, as A1111's clients show them:
- a refused value: 422 `{"detail": [{"loc": ["body", field], "msg": ..., "type": "value_error"}]}`;
- a refused job: 429 (QUEUE_PER_USER) or 503 (queue full), both with `Retry-After`, 403 (model
  switch not allowed), and 500 for a pipeline failure, as `{"error", "detail", "body", "errors"}`;
- anything unexpected: 500 with a short message; the traceback goes to the log only.
Documented for users in docs/a1111-api.md.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from engine import AppSettings, Caller, Engine
from engine.inputs import Limits
from engine.jobs import CancelledBeforeStart, QueueFull, Refused, SwitchRefused, TooManyJobs
from engine.plots import ScriptStop, run_script
from pipelines import GenerationResult, UpscalerError
from pipelines.schema.errors import PipelineError
from pipelines.schema.fields import RequestError

from . import a1111_controlnet as controlnet
from . import a1111_extensions as extensions
from . import a1111_extras as extras
from . import a1111_info as answers
from . import a1111_request as parse
from . import a1111_scripts as scripts
from . import body, images, running
from .access import Access, Unauthorized
from .errors import WireError

log = logging.getLogger(__name__)

Handler = Callable[[Request, Caller], Awaitable[Any]]
RETRY_AFTER = {"Retry-After": "2"}  # a full queue or a caller's own limit clears in seconds: say when to retry


def invalid(loc: tuple[str | int, ...], message: str) -> JSONResponse:
    return JSONResponse({"detail": [{"loc": ["body", *loc], "msg": message, "type": "value_error"}]}, 422)


def api_error(status: int, exc: BaseException, message: str, headers: dict[str, str] | None = None) -> JSONResponse:
    """A1111's API error body (modules/api/api.py `api_error_handler`), without a traceback."""
    body = {"error": type(exc).__name__, "detail": message, "body": "", "errors": message}
    return JSONResponse(body, status, headers=headers)


def unauthorized() -> JSONResponse:
    return JSONResponse({"detail": "Incorrect username or password"}, 401, headers={"WWW-Authenticate": "Basic"})


def answer_error(exc: Exception, name: str) -> Response:
    """The response for an exception a route raised."""
    if isinstance(exc, running.ClientGone):
        return Response(status_code=499)
    if isinstance(exc, WireError):
        return invalid(exc.loc, str(exc))
    if isinstance(exc, RequestError):  # the schema's, or the model's limits: named by our field
        return invalid(parse.a1111_loc(exc), parse.a1111_message(exc))
    if isinstance(exc, ValueError):
        return invalid((), str(exc))
    if isinstance(exc, TooManyJobs | QueueFull):
        return api_error(429 if isinstance(exc, TooManyJobs) else 503, exc, str(exc), RETRY_AFTER)
    if isinstance(exc, SwitchRefused):
        return api_error(403, exc, str(exc))
    if isinstance(exc, Refused):
        return api_error(503, exc, str(exc))
    if isinstance(exc, PipelineError):
        log.warning("A1111 %s: %s", name, exc)
        return api_error(500, exc, str(exc))
    log.error("A1111 %s failed", name, exc_info=exc)  # the traceback, for the log only
    return api_error(500, exc, f"internal error in {name}; the server's log has the details")


def endpoint(access: Access, handler: Handler, name: str) -> Callable[[Request], Awaitable[Response]]:
    """A route: the caller checked first (401), then the handler, its errors in A1111's shapes."""

    async def route(request: Request) -> Response:
        try:
            caller = access.caller(request)
        except Unauthorized:
            return unauthorized()
        try:
            value = await handler(request, caller)
        except Exception as exc:  # each kind answered in its own shape (answer_error)
            return answer_error(exc, name)
        return value if isinstance(value, Response) else JSONResponse(value)

    route.__name__ = f"a1111_{name.replace('-', '_')}"
    return route


async def read_body(request: Request, cap: int) -> dict[str, Any]:
    """The JSON object of a request body, read up to `cap` bytes; an empty body is {}."""
    data = await body.json_body(request, cap)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise WireError((), "the request body must be a JSON object")
    return data


class A1111:
    """The routes' shared state: the engine, the settings, and what /progress and /options report."""

    def __init__(self, engine: Engine, settings: AppSettings, access: Access):
        self.engine = engine
        self.settings = settings
        self.access = access
        self.max_bytes = settings.max_file_bytes
        self.started: dict[str, float] = {}  # job id -> when it was submitted (/progress's ETA)
        self.hashes: dict[str, str] = {}  # model name -> hash, from results' metadata

    def limits(self) -> Limits:
        return Limits.of(self.settings, self.engine.model_info())

    @property
    def body_cap(self) -> int:
        """img2img: up to MAX_EDIT_FILES images and a mask, base64, beside the fields."""
        return (self.settings.max_edit_files + 1) * (self.max_bytes * 4 // 3 + 64) + 1_000_000

    @property
    def fields_cap(self) -> int:
        """txt2img and the other JSON routes: fields only (prompts are capped by MAX_PROMPT_CHARS)."""
        return body.fields_cap(self.settings.max_prompt_chars)

    def model_hash(self) -> str | None:
        return self.hashes.get(self.engine.model_info().model_name)

    # ---------------------------------------------------------------- generating
    async def txt2img(self, request: Request, caller: Caller) -> dict[str, Any]:
        payload = await read_body(request, self.fields_cap)
        switched = await self.checkpoint(payload)  # first: the request is read against the model that runs it
        parsed = await asyncio.to_thread(parse.txt2img, scripts.readable(payload), self.limits(), self.max_bytes)
        parsed.warnings[:0] = switched
        if payload.get("script_name"):
            return await self.script(parsed, payload, caller, request, "txt2img")
        return await self.generate(parsed, payload, caller, request)

    async def img2img(self, request: Request, caller: Caller) -> dict[str, Any]:
        payload = await read_body(request, self.body_cap)
        switched = await self.checkpoint(payload)
        parsed = await asyncio.to_thread(parse.img2img, scripts.readable(payload), self.limits(), self.max_bytes)
        parsed.warnings[:0] = switched
        if payload.get("script_name"):
            return await self.script(parsed, payload, caller, request, "img2img")
        return await self.generate(parsed, payload, caller, request)

    async def checkpoint(self, payload: dict[str, Any]) -> list[str]:
        """override_settings.sd_model_checkpoint: loaded (where allowed) before the request is read."""
        warnings: list[str] = []
        name = parse.checkpoint(payload)
        if name:
            await self.switch(name, ("override_settings", "sd_model_checkpoint"), warnings)
        return warnings

    async def generate(self, parsed: parse.Parsed, payload: dict[str, Any], caller: Caller, http: Request):
        job = self.engine.submit(parsed.request, caller)
        self.started[job.id] = time.time()
        try:
            result = await running.wait(self.engine, job, http)
        except CancelledBeforeStart:
            parsed.warnings.append("interrupted before it started: no image was made")
            result = GenerationResult([], [], [], {}, None, "", "", "", cancelled=True)
        finally:
            self.started.pop(job.id, None)
        for meta in result.metadata:
            if meta.get("model_hash"):
                self.hashes[meta.get("model", "")] = meta["model_hash"]
        if parsed.warnings or result.warnings:
            log.info("A1111 request warnings: %s", "; ".join([*parsed.warnings, *result.warnings]))
        return await asyncio.to_thread(self.response, parsed, payload, result)

    async def script(self, parsed: parse.Parsed, payload: dict[str, Any], caller: Caller, http: Request, mode: str):
        """`script_name`: the script's cells through the engine (a pool runs them side by side), the
        answer in A1111's order (grid, sub-grids, cell images)."""
        no_prompt = scripts.needs_no_prompt(payload)
        name = scripts.find(str(payload["script_name"]))
        args, model = payload.get("script_args", []), self.engine.model_info()
        script = await asyncio.to_thread(scripts.build, name, args, parsed.request, mode, model, no_prompt)
        stop = ScriptStop()
        work = functools.partial(run_script, self.engine, script.cells, script.layout, caller, stop=stop)
        done = await running.until_gone(work, http, stop.stop, f"script {name}")
        result = done.as_result(script.grid, script.sub_grids, script.lone_images)
        if parsed.warnings or result.warnings:
            log.info("A1111 script warnings: %s", "; ".join([*parsed.warnings, *result.warnings]))
        grids = (1 + (len(done.sub_grids) if script.sub_grids else 0)) if script.grid and done.grid else 0
        return await asyncio.to_thread(self.response, parsed, payload, result, grids)

    def response(
        self, parsed: parse.Parsed, payload: dict[str, Any], result: GenerationResult, grids: int | None = None
    ) -> dict[str, Any]:
        """A1111's answer. `parameters` echoes the request as A1111's request model holds it: its own
        fields only (a client's `auth`, `url` or any unknown key is not sent back), images only when
        `include_init_images` asks. `grids`: a script's answer, whose first images are its grids."""
        own = parse.A1111_FIELDS["img2img" if "init_images" in payload else "txt2img"]
        echo = {k: v for k, v in payload.items() if k in own}
        if not payload.get("include_init_images"):
            echo.update({k: None for k in ("init_images", "mask") if k in echo})
        send = payload.get("send_images", True) is not False
        return {
            "images": answers.images_b64(result) if send else [],
            "parameters": echo,
            "info": answers.dumps(self.info(parsed, result, grids)),
        }

    def info(self, parsed: parse.Parsed, result: GenerationResult, grids: int | None) -> dict[str, Any]:
        info = answers.info(parsed, result, self.model_hash())
        return info if grids is None else scripts.script_info_fields(info, result, grids)

    async def switch(self, name: str, loc: tuple[str, ...], warnings: list[str]) -> None:
        """Load the checkpoint `name` unless it is the loaded one; refused where switching is off (403),
        and for a name that is not offered or cannot load here (422, with the reason and what can)."""
        want = answers.checkpoint_name(name)
        current = self.engine.model_info().model_name
        if want in (current, answers.checkpoint_name(current)):
            return
        if not self.engine.can_switch:
            raise SwitchRefused(
                f"sd_model_checkpoint: {name[:80]!r} is not the loaded model ({current}); {self.engine.switch_off_reason}"
            )
        from pipelines.schema.fields import RequestError

        try:  # unknown, or cannot load here (pipelines.weights.catalog): refused at once with why, not a failing load
            self.engine.find_model(want)
        except RequestError as exc:
            raise WireError(loc, exc.detail) from None
        log.info("A1111 API: switching the model to %s", want)
        await asyncio.to_thread(self.engine.load_model, want)
        warnings.append(f"sd_model_checkpoint: the model was switched to {want} for every user, and stays loaded")

    # ---------------------------------------------------------------- state
    async def get_options(self, request: Request, caller: Caller) -> dict[str, Any]:
        return answers.options(self.engine.model_info(), self.model_hash())

    async def set_options(self, request: Request, caller: Caller) -> None:
        payload = await read_body(request, self.fields_cap)
        name = payload.get("sd_model_checkpoint")
        if name is not None:
            if not isinstance(name, str):
                raise WireError(("sd_model_checkpoint",), "must be text (a model's title)")
            warnings: list[str] = []
            await self.switch(name, ("sd_model_checkpoint",), warnings)
        ignored = sorted(k for k in payload if k != "sd_model_checkpoint")
        if ignored:
            log.info("A1111 options ignored (not settings of this server): %s", ", ".join(ignored)[:500])
        return None

    async def progress(self, request: Request, caller: Caller) -> dict[str, Any]:
        skip = request.query_params.get("skip_current_image", "false").lower() in ("true", "1")
        mine = [job for job in self.engine.jobs() if job.caller.key == caller.key]
        return answers.progress(mine, self.started, skip)  # inline: polled often, cheap (a small preview PNG)

    async def interrupt(self, request: Request, caller: Caller) -> dict[str, Any]:
        stopped = self.engine.stop_caller(caller.key)
        log.info("A1111 interrupt by %s: %s", caller.key, stopped)
        return {}

    async def skip(self, request: Request, caller: Caller) -> dict[str, Any]:
        return {}  # A1111's skip moves on to the next image of a batch; a request here runs as one job

    async def png_info(self, request: Request, caller: Caller) -> dict[str, Any]:
        payload = await read_body(request, self.max_bytes * 4 // 3 + 1_000_000)
        data = images.from_base64(payload.get("image"), ("image",), self.max_bytes)
        images.open_bytes(data, ("image",), self.settings.max_upload_pixels, self.max_bytes, None)  # a readable image
        return await asyncio.to_thread(answers.png_info, data)

    # ---------------------------------------------------------------- extras (upscaling)
    async def extra_single_image(self, request: Request, caller: Caller) -> dict[str, Any]:
        payload = await read_body(request, self.max_bytes * 4 // 3 + 1_000_000)
        wanted = extras.read(payload, self.engine.upscaler_names())
        image = await asyncio.to_thread(
            extras.decode, payload.get("image"), ("image",), self.max_bytes, self.settings.max_upload_pixels
        )
        out = await self.upscale([image], wanted)
        return {"html_info": extras.html_info(wanted, 1, [out[0].size]), "image": answers.png_b64(out[0])}

    async def extra_batch_images(self, request: Request, caller: Caller) -> dict[str, Any]:
        payload = await read_body(request, self.body_cap)
        wanted = extras.read(payload, self.engine.upscaler_names())
        listed = payload.get("imageList")
        if not isinstance(listed, list) or not listed:
            raise WireError(("imageList",), "a list of at least one {\"data\": base64, \"name\": ...} is required")
        if len(listed) > self.settings.max_edit_files:
            raise WireError(("imageList",), f"{len(listed)} images, more than {self.settings.max_edit_files} (MAX_EDIT_FILES)")
        pictures = []
        for i, item in enumerate(listed):
            value = item.get("data") if isinstance(item, dict) else None
            pictures.append(await asyncio.to_thread(
                extras.decode, value, ("imageList", i, "data"), self.max_bytes, self.settings.max_upload_pixels
            ))  # fmt: skip
        out = await self.upscale(pictures, wanted)
        info = extras.html_info(wanted, len(out), [image.size for image in out])
        return {"html_info": info, "images": [answers.png_b64(image) for image in out]}

    async def upscale(self, pictures: list[Any], wanted: extras.Extras) -> list[Any]:
        try:
            return await asyncio.to_thread(
                self.engine.upscale, pictures, wanted.upscaler, wanted.factor, wanted.size, wanted.second, wanted.visibility
            )  # fmt: skip
        except UpscalerError as exc:
            raise extras.refused(exc) from None

    async def refresh(self, request: Request, caller: Caller) -> None:
        return None  # the model list is read on every call; LoRAs and embeddings are read at start

    async def sd_models(self, request: Request, caller: Caller) -> list[dict[str, Any]]:
        return answers.sd_models(self.engine, self.model_hash())

    async def cmd_flags(self, request: Request, caller: Caller) -> dict[str, Any]:
        local = self.settings.server_name in ("127.0.0.1", "localhost", "::1")
        return {"api": True, "api_auth": not self.access.open, "listen": not local, "nowebui": False,
                "port": self.settings.server_port, "lowvram": False, "medvram": False, "xformers": False}  # fmt: skip

    async def memory(self, request: Request, caller: Caller) -> dict[str, Any]:
        return answers.memory(self.engine)

    async def controlnet_detect(self, request: Request, caller: Caller) -> dict[str, Any]:
        payload = await read_body(request, self.max_bytes * 8)
        maps = await asyncio.to_thread(controlnet.detect_maps, payload, self.limits(), self.max_bytes, self.engine.detect)
        return {"images": [answers.png_b64(image) for image in maps], "info": "Success"}

    def listing(self, make: Callable[[], Any]) -> Handler:
        async def handler(request: Request, caller: Caller) -> Any:
            return make()

        return handler


def routes(api: A1111) -> list[tuple[str, str, Handler]]:
    """(method, path, handler) of every route served."""
    model = api.engine.model_info
    constant = {
        "sd-vae": [], "face-restorers": [],
        "hypernetworks": [], "realesrgan-models": [],
        "extensions": [], "sd-modules": [],
    }  # fmt: skip
    return [
        ("POST", "txt2img", api.txt2img),
        ("POST", "img2img", api.img2img),
        ("GET", "options", api.get_options),
        ("POST", "options", api.set_options),
        ("GET", "progress", api.progress),
        ("POST", "interrupt", api.interrupt),
        ("POST", "skip", api.skip),
        ("POST", "png-info", api.png_info),
        ("GET", "sd-models", api.sd_models),
        ("GET", "samplers", api.listing(lambda: answers.samplers(model()))),
        ("GET", "schedulers", api.listing(lambda: answers.schedulers(model()))),
        ("GET", "loras", api.listing(lambda: answers.loras(model()))),
        ("GET", "embeddings", api.listing(lambda: answers.embeddings(model()))),
        ("GET", "prompt-styles", api.listing(lambda: answers.prompt_styles(model()))),
        ("GET", "scripts", api.listing(scripts.scripts)),
        ("GET", "script-info", api.listing(lambda: scripts.script_info(model()))),
        ("GET", "upscalers", api.listing(lambda: answers.upscalers(api.engine))),
        ("POST", "extra-single-image", api.extra_single_image),
        ("POST", "extra-batch-images", api.extra_batch_images),
        ("GET", "latent-upscale-modes", api.listing(answers.latent_upscale_modes)),
        ("GET", "cmd-flags", api.cmd_flags),
        ("GET", "memory", api.memory),
        *(("POST", path, api.refresh) for path in ("refresh-checkpoints", "refresh-loras", "refresh-vae", "refresh-embeddings")),
        *(("GET", path, api.listing(lambda value=value: value)) for path, value in constant.items()),
    ]


def controlnet_routes(api: A1111) -> list[tuple[str, str, Handler]]:
    """sd-webui-controlnet's routes (webapi.a1111_controlnet), under /controlnet."""
    return [
        ("GET", "version", api.listing(lambda: {"version": controlnet.VERSION})),
        ("GET", "model_list", api.listing(lambda: controlnet.model_list(api.engine.model_info()))),
        ("GET", "module_list", api.listing(lambda: controlnet.module_list(api.engine.model_info()))),
        ("POST", "detect", api.controlnet_detect),
    ]


def adetailer_routes(api: A1111) -> list[tuple[str, str, Handler]]:
    """ADetailer's routes (webapi.a1111_extensions), under /adetailer/v1."""
    return [
        ("GET", "version", api.listing(lambda: {"version": extensions.ADETAILER_VERSION})),
        ("GET", "ad_model", api.listing(lambda: extensions.ad_models(api.engine.model_info().detectors))),
    ]


def router(engine: Engine, settings: AppSettings, access: Access) -> APIRouter:
    """The `/sdapi/v1` and `/controlnet` routes, served by `engine` under `settings`' limits, for callers
    `access` lets in."""
    api = A1111(engine, settings, access)
    out = APIRouter(tags=["A1111 API"])
    tables = (("/sdapi/v1", routes(api)), ("/controlnet", controlnet_routes(api)), ("/adetailer/v1", adetailer_routes(api)))
    for prefix, table in tables:
        for method, path, handler in table:
            name = path if prefix == "/sdapi/v1" else f"{prefix.strip('/').split('/')[0]}-{path}"
            out.add_api_route(f"{prefix}/{path}", endpoint(access, handler, name), methods=[method], name=f"a1111 {method} {name}")
    return out
