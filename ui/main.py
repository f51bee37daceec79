"""Start-up: check every setting, build the backend, launch the UI, log one ready line.

Kept out of app.py so that the entry point stays a few lines and importing it does nothing.
"""

from __future__ import annotations

import argparse
import logging
import sys

from ui.demo import create_demo, launch, make_backend
from ui.settings import AppSettings, SettingsError

log = logging.getLogger("diffusion_anywhere")


def _check_settings(argv: list[str] | None) -> tuple[AppSettings, argparse.Namespace]:
    """Read and validate every setting before anything heavy happens; exit 2 with the message otherwise."""
    from devices.options import DeviceOptions
    from devices.pool import expand_devices

    try:
        settings = AppSettings.from_env()
        expand_devices()  # PREFERRED_DEVICE (one device or a list) and CPU_REPLICAS
        DeviceOptions.resolve(preferred_device="auto")  # TORCH_DTYPE, DIFFUSERS_ATTENTION_TYPE
    except (SettingsError, ValueError) as exc:
        sys.exit(f"error: {exc}")
    parser = argparse.ArgumentParser(description="Diffusion Anywhere web app")
    parser.add_argument("--model", default=settings.pipeline.model_id, help="diffusers folder, Hub id or .safetensors")
    parser.add_argument("--device", default=None, help="auto|cpu|cuda[:N]|npu[:N]|all|cuda:0,cuda:1")
    parser.add_argument("--port", type=int, default=settings.server_port)
    parser.add_argument("--host", default=settings.server_name)
    args = parser.parse_args(argv)
    return settings.replace(server_port=args.port, server_name=args.host), args


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings, args = _check_settings(argv)
    for noisy in ("httpx", "diffusers", "transformers"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    from pipelines.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    if settings.exposed_without_sign_in:
        log.warning(
            "listening on %s WITHOUT sign-in: anyone who can reach this address can use the server; "
            "set AUTH=user:password or AUTH_FILE",
            settings.server_name,
        )
    backend = make_backend(settings, args.model, args.device)
    demo = launch(create_demo(backend, settings), settings)
    first = backend.status()[0]
    log.info(
        "ready at %s | device %s (%s) x%d | dtype %s | attention %s | model %s",
        demo.local_url, first.device, first.device_name, len(backend.status()), first.dtype,
        first.attention, backend.model_info().model_name,
    )  # fmt: skip
    demo.block_thread()
