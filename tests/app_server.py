"""Start the real app (create_demo + launch) on a free local port, for API and browser tests."""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from app import SETTINGS, AppSettings, create_demo, launch
from devices import DeviceManager
from pipelines import ImagePipeline
from pipelines.options import DEFAULT_LORA_DIR, DEFAULT_MODEL


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def embedded_model_available() -> bool:
    return (DEFAULT_MODEL / "model_index.json").is_file()


@contextmanager
def running_app(model: Path, output_dir: Path, lora_dir: Path = DEFAULT_LORA_DIR, **settings) -> Iterator:
    """Yield (demo, pipeline) for an app serving `model` on 127.0.0.1:<free port>."""
    dm = DeviceManager("cpu")
    pipeline = ImagePipeline.from_pretrained(model, dm, lora_dir=lora_dir)
    config: AppSettings = dataclasses.replace(
        SETTINGS,
        output_dir=output_dir,
        lora_dir=lora_dir,
        server_name="127.0.0.1",
        server_port=free_port(),
        **settings,
    )
    demo = launch(create_demo(pipeline, dm, config), config, quiet=True)
    try:
        yield demo, pipeline
    finally:
        demo.close()
