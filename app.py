"""Diffusion Anywhere: the entry point (`python app.py`, the Space's app_file), and where the front
ends are wired together.

    python app.py                         # embedded model, best device, http://127.0.0.1:7860
    PREFERRED_DEVICE=npu python app.py    # ask for an Ascend NPU (falls back with a warning)
    PREFERRED_DEVICE=all python app.py    # one replica per device of the best backend

Importing this module reads no setting, loads no model and probes no device: `main()` checks every
setting first, then builds the engine (`engine.build_engine`) and serves it (`serve`): the Gradio UI
(`ui.demo`) and, beside it on the same port, the A1111 and OpenAI HTTP APIs (`webapi`). This module
is the only one that knows both front ends: `ui` and `webapi` import neither each other (the
layers contract in pyproject.toml, checked by tests/test_structure.py).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from typing import Any, NoReturn

with contextlib.suppress(ImportError):  # ZeroGPU Spaces: `spaces` must be imported before anything touches CUDA
    import spaces  # noqa: F401

log = logging.getLogger("diffusion_anywhere")


def check_settings(argv: list[str] | None = None) -> tuple[Any, argparse.Namespace]:
    """Read and validate every setting before anything heavy happens; exit 2 with the message otherwise.
    Gradio is imported only after this: it reads GRADIO_SERVER_PORT when imported and would stop a bad
    value with a traceback of its own."""
    from config import layered
    from devices.pool import devices_for
    from engine import AppSettings, SettingsError

    try:
        env = layered(os.environ)  # the environment over the settings file (docs/settings.md: precedence)
    except SettingsError as exc:  # the file is not JSON of VARIABLE: value
        _usage_error(str(exc))
    try:
        settings = AppSettings.from_env(env.values)  # the one read of the settings
        devices_for(settings.devices.preferred, settings.devices.cpu_replicas)  # a list's devices must be usable
    except (SettingsError, ValueError) as exc:
        _usage_error(f"{exc}{_from_file(exc, env)}")
    log.info("settings: %s", "; ".join(env.origins(AppSettings)) or "all defaults")
    parser = argparse.ArgumentParser(description="Diffusion Anywhere web app")
    parser.add_argument("--model", default=settings.pipeline.model_id, help="diffusers folder, Hub id or .safetensors")
    parser.add_argument("--device", default=None, help="auto|cpu|cuda[:N]|npu[:N]|all|cuda:0,cuda:1")
    parser.add_argument("--port", type=int, default=settings.server_port)
    parser.add_argument("--host", default=settings.server_name)
    args = parser.parse_args(argv)
    return settings.replace(server_port=args.port, server_name=args.host), args


def _usage_error(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)  # a usage error, as argparse and the other entry points exit


def _from_file(exc: Exception, env: Any) -> str:
    """" (from settings file X)" when the refused variable came from the settings file, not the environment."""
    name = str(exc).split("=", 1)[0]
    return f" (from {env.sources[name]})" if name in env.sources else ""


def serve(engine: Any, settings: Any, **launch_options: Any) -> Any:
    """The UI launched for `engine` (not blocking), and the HTTP APIs mounted beside Gradio's routes on
    the same port where HTTP_API serves them (they check their own callers: webapi.access)."""
    from ui.demo import create_demo, launch

    demo = launch(create_demo(engine, settings), settings, **launch_options)
    if settings.http_api_enabled:
        import webapi

        webapi.mount(demo.app, engine, settings)
    else:
        log.info("HTTP APIs (A1111 /sdapi/v1, OpenAI /v1/images) not served: %s", settings.http_api_off_reason)
    return demo


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings, args = check_settings(argv)
    from devices.xla import use_stand_in  # XLA_CPU_DEVICES: JAX's CPU stands in for TPU chips (docs/devices.md)

    use_stand_in(settings.devices.xla_cpu_devices, os.environ)  # before anything imports JAX
    for noisy in ("httpx", "diffusers", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from engine import build_engine
    from pipelines import quiet_load_progress_bars

    quiet_load_progress_bars()
    if settings.exposed_without_sign_in:
        log.warning(
            "listening on %s WITHOUT sign-in: anyone who can reach this address can use the server; "
            "set AUTH=user:password or AUTH_FILE",
            settings.server_name,
        )
    engine = build_engine(settings, model=args.model, devices=args.device)
    demo = serve(engine, settings)
    replicas = [r for r in engine.status() if r.role == "main"]  # the editor's row is not a replica of the model
    first = replicas[0]
    log.info(
        "ready at %s | device %s (%s) x%d | replicas %s | dtype %s | attention %s | model %s",
        demo.local_url, first.device, first.device_name, len(replicas), ", ".join(r.name for r in replicas),
        first.dtype, first.attention, engine.model_info().model_name,
    )  # fmt: skip
    demo.block_thread()


if __name__ == "__main__":
    main()
