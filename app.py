"""Diffusion Anywhere: the entry point (`python app.py`, the Space's app_file).

    python app.py                         # embedded model, best device, http://127.0.0.1:7860
    PREFERRED_DEVICE=npu python app.py    # ask for an Ascend NPU (falls back with a warning)
    PREFERRED_DEVICE=all python app.py    # one replica per device of the best backend

Importing this module reads no setting, loads no model and probes no device: `ui.main.main()`
checks every setting first, then builds the backend and the UI (`ui.demo.create_demo`).
"""

import contextlib

with contextlib.suppress(ImportError):  # ZeroGPU Spaces: `spaces` must be imported before anything touches CUDA
    import spaces  # noqa: F401

from ui.demo import create_demo, launch  # noqa: F401  (re-exported for embedding: app.create_demo)
from ui.main import main

if __name__ == "__main__":
    main()
