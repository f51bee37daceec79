"""Start the app as `python app.py` builds it, on a free local port, for API and browser tests.

Settings come from an environment mapping through `AppSettings.from_env` (the same parsing as a
real start), the engine and its backend from `engine.build_engine` (a device pool, with the
embedded editor beside the embedded model), the UI and the HTTP APIs from `app.serve`. Only a
test that is about another backend (Ray, a hand-made pool) passes its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import app
from devices.parallel import free_port
from engine import AppSettings, build_engine
from pipelines.run.options import DEFAULT_LORA_DIR, DEFAULT_MODEL


def embedded_model_available() -> bool:
    return (DEFAULT_MODEL / "model_index.json").is_file()


def app_settings(model: Path, output_dir: Path, lora_dir: Path = DEFAULT_LORA_DIR, env=None, **overrides) -> AppSettings:
    """The settings `python app.py` would read from `env` (plus MODEL_ID, LORA_DIR, OUTPUT_DIR and a free
    port), with `overrides` replacing fields afterwards (objects such as users)."""
    environ = {
        "MODEL_ID": str(model),
        "LORA_DIR": str(lora_dir),
        "OUTPUT_DIR": str(output_dir),
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(free_port()),
        **(env or {}),
    }
    return AppSettings.from_env(environ).replace(**overrides)


@contextmanager
def running_app(model: Path, output_dir: Path, lora_dir: Path = DEFAULT_LORA_DIR, backend=None, env=None, **settings) -> Iterator:
    """Yield (demo, backend) for the app serving `model` on 127.0.0.1:<free port>.

    The backend is what the app builds from the settings (`build_engine`) unless one is given.
    """
    config = app_settings(model, output_dir, lora_dir, env, **settings)
    engine = build_engine(config, backend)
    demo = app.serve(engine, config, quiet=True)
    try:
        yield demo, engine.backend
    finally:
        stop_streams(demo)
        demo.close()
        if backend is None:
            engine.close()


def stop_streams(demo) -> None:
    """Set the app's stop event on the server's own event loop, before `demo.close()`.

    gradio's close sets that asyncio.Event from the calling thread while the server's loop may be
    adding or removing waiters on it (the open event streams of clients): "RuntimeError: deque mutated
    during iteration" at a test module's teardown, seen once in CI after a 200-request soak. Set on
    its loop, it is already set when close comes, which then touches no waiter."""

    async def stop() -> None:
        demo.app.stop_event.set()

    loop = demo.server.servers[0].get_loop()  # uvicorn's listening socket, on the server thread's loop
    asyncio.run_coroutine_threadsafe(stop(), loop).result(timeout=30)


def main_pool(backend):
    """The device pool that serves text-to-image in an app's backend: the video and editor routers' main one
    (`VideoRouter(EditRouter(pool, editor), video)`)."""
    while hasattr(backend, "main"):
        backend = backend.main
    return backend


def main_pipeline(backend):
    """The ImagePipeline that serves text-to-image in an app's backend (the main pool's first replica), for
    tests that reach into the model."""
    return main_pool(backend).replicas[0]
