"""Start-up: check every setting, build the engine, launch the UI, log one ready line.

Kept out of app.py so that the entry point stays a few lines and importing it does nothing.
Gradio is imported only after the settings passed: it reads GRADIO_SERVER_PORT when imported and
would stop a bad value with a traceback of its own.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from engine import AppSettings, SettingsError, build_engine

log = logging.getLogger("diffusion_anywhere")


def check_settings(argv: list[str] | None = None) -> tuple[AppSettings, argparse.Namespace]:
    """Read and validate every setting before anything heavy happens; exit 2 with the message otherwise."""
    from devices.pool import devices_for

    try:
        settings = AppSettings.from_env(os.environ)  # the one read of the environment (docs/settings.md)
        devices_for(settings.devices.preferred, settings.devices.cpu_replicas)  # a list's devices must be usable
    except (SettingsError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)  # a usage error, as argparse and the other entry points exit
    parser = argparse.ArgumentParser(description="Diffusion Anywhere web app")
    parser.add_argument("--model", default=settings.pipeline.model_id, help="diffusers folder, Hub id or .safetensors")
    parser.add_argument("--device", default=None, help="auto|cpu|cuda[:N]|npu[:N]|all|cuda:0,cuda:1")
    parser.add_argument("--port", type=int, default=settings.server_port)
    parser.add_argument("--host", default=settings.server_name)
    args = parser.parse_args(argv)
    return settings.replace(server_port=args.port, server_name=args.host), args


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings, args = check_settings(argv)
    for noisy in ("httpx", "diffusers", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from pipelines.loading import quiet_load_progress_bars
    from ui.demo import create_demo, launch  # after the settings check: see the module docstring

    quiet_load_progress_bars()
    if settings.exposed_without_sign_in:
        log.warning(
            "listening on %s WITHOUT sign-in: anyone who can reach this address can use the server; "
            "set AUTH=user:password or AUTH_FILE",
            settings.server_name,
        )
    engine = build_engine(settings, model=args.model, devices=args.device)
    demo = launch(create_demo(engine, settings), settings)
    replicas = [r for r in engine.status() if r.role == "main"]  # the editor's row is not a replica of the model
    first = replicas[0]
    log.info(
        "ready at %s | device %s (%s) x%d | dtype %s | attention %s | model %s",
        demo.local_url, first.device, first.device_name, len(replicas), first.dtype,
        first.attention, engine.model_info().model_name,
    )  # fmt: skip
    demo.block_thread()
