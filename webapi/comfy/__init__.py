"""ComfyUI's API over our engine: its HTTP routes and websocket, and a typed node graph.

Clients built for ComfyUI (its own API scripts, Open WebUI's and SillyTavern's ComfyUI modes,
comfy-api-simplified, ...) send a graph of nodes; `graph` checks it against the node classes
(`nodes`, `nodes_more`, `nodes_tooling`, `nodes_video`: each a typed function over ComfyUI's types,
`values`, declared in `registry`), `execute` runs it in dependency order with each node's outputs
cached, every sampler a request through the engine (`sampler`: one request per sampler, a second
pass on an enlarged latent fused into our hires fix, a video latent one video request), and
`service` keeps each caller's queue, history and websocket. `routes` answers at the root and
under `/api`. Nothing here imports gradio or torch.
"""

from __future__ import annotations

from typing import Any

from engine import AppSettings, Engine
from engine.outputs import OutputStore

from ..access import Access


def router(engine: Engine, settings: AppSettings, access: Access) -> Any:
    """The FastAPI router of ComfyUI's routes (imported only when the HTTP APIs are served)."""
    from .execute import Folders
    from .routes import router as comfy_router
    from .service import Prompts

    outputs = OutputStore.from_settings(settings.output_dir, settings.output_max_gb, settings.output_max_days)
    scratch = settings.output_dir / ".comfy"  # temp/ (PreviewImage) and input/ (uploads), within OUTPUT_DIR's limits
    prompts = Prompts(engine, Folders(outputs, scratch), workers=max(1, engine.backend.concurrency))
    return comfy_router(engine, settings, access, prompts)
