"""Diffusion Anywhere: the entry point (`python app.py`, the Space's app_file).

    python app.py                         # embedded model, best device, http://127.0.0.1:7860
    PREFERRED_DEVICE=npu python app.py    # ask for an Ascend NPU (falls back with a warning)
    PREFERRED_DEVICE=all python app.py    # one replica per device of the best backend

Importing this module reads no setting, loads no model and probes no device: `ui.main.main()`
checks every setting first, then builds the engine (`engine.build_engine`) and the UI
(`ui.demo.create_demo`).
"""

import contextlib

with contextlib.suppress(ImportError):  # ZeroGPU Spaces: `spaces` must be imported before anything touches CUDA
    import spaces  # noqa: F401

from ui.main import main


def __getattr__(name: str):
    """`app.create_demo` / `app.launch` for embedding, imported on first use: gradio reads
    GRADIO_SERVER_PORT at import, which must come after the settings check of `main()`."""
    if name in ("create_demo", "launch"):
        from ui import demo

        return getattr(demo, name)
    raise AttributeError(name)


if __name__ == "__main__":
    main()
