"""HTTP APIs other tools speak, served on the app's own port beside Gradio.

- `/sdapi/v1/*`: AUTOMATIC1111's web API (Open WebUI, SillyTavern, the `webuiapi` client, plugins);
  `webapi.a1111`.
- `/v1/images/*`, `/v1/models`: OpenAI's images API (the `openai` SDK and clients built on it);
  `webapi.openai_images`.
- `/prompt`, `/ws`, `/history`, `/view`, `/object_info`, ... (and the same under `/api`): ComfyUI's
  API with a typed node graph over the engine (its own clients, Open WebUI's and SillyTavern's
  ComfyUI modes, comfy-api-simplified); `webapi.comfy`.

They are FastAPI routes added to Gradio's app, so Gradio's sign-in and queue do not cover them:
every route checks its caller itself (`webapi.access`) and runs its work through the engine
(`engine.Engine.submit`), which applies the same admission (QUEUE_SIZE, QUEUE_PER_USER, the model's
limits), TIME_BUDGET and Stop as the UI's. Whether they are served is HTTP_API's decision
(`engine.settings.AppSettings.http_api_enabled`). Nothing here imports gradio.
"""

from __future__ import annotations

import logging
from typing import Any

from engine import AppSettings, Engine

from .access import Access

log = logging.getLogger(__name__)


def mount(app: Any, engine: Engine, settings: AppSettings) -> list[str]:
    """Add the HTTP APIs' routes to `app` (Gradio's FastAPI app); returns the prefixes served."""
    from . import a1111, comfy, openai_images  # FastAPI routers, imported only when served

    access = Access.from_settings(settings)
    app.include_router(a1111.router(engine, settings, access))
    app.include_router(openai_images.router(engine, settings, access))
    app.include_router(comfy.router(engine, settings, access))
    prefixes = ["/sdapi/v1", "/v1/images", "/v1/models", "/prompt", "/ws", "/api/prompt"]
    log.info("HTTP APIs served: %s (%s)", ", ".join(prefixes), access.describe())
    return prefixes
