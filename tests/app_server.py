"""Start the real app (create_demo + launch) on a free local port, for API and browser tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from devices import DeviceManager
from pipelines import ImagePipeline
from pipelines.options import DEFAULT_LORA_DIR, DEFAULT_MODEL, PipelineOptions
from ui.demo import create_demo, launch
from ui.settings import AppSettings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def embedded_model_available() -> bool:
    return (DEFAULT_MODEL / "model_index.json").is_file()


@contextmanager
def running_app(model: Path, output_dir: Path, lora_dir: Path = DEFAULT_LORA_DIR, backend=None, **settings) -> Iterator:
    """Yield (demo, backend) for an app serving `model` (or `backend`) on 127.0.0.1:<free port>.

    The backend is one ImagePipeline on the CPU unless given (a DevicePool, a Ray backend).
    """
    if backend is None:
        backend = ImagePipeline.from_pretrained(model, DeviceManager("cpu"), lora_dir=lora_dir)
    config = AppSettings(
        pipeline=PipelineOptions(lora_dir=lora_dir),
        output_dir=Path(output_dir),
        server_name="127.0.0.1",
        server_port=free_port(),
        **settings,
    )
    demo = launch(create_demo(backend, config), config, quiet=True)
    try:
        yield demo, backend
    finally:
        demo.close()
