"""One module build at a time in this process.

diffusers and peft build a model's modules under `init_empty_weights` (accelerate's, peft's copy),
which swaps `torch.nn.Module.register_parameter` for the whole process, not the thread, and diffusers
sets torch's default dtype while it builds. Two threads loading at once (the replicas of a pool each
loading a ControlNet, a LoRA or an upscaler for their part of a request) can leave in the wrong order
and leave the swap in place: from then on every module built anywhere in the process has its weights
on `meta` ("Cannot copy out of meta tensor"), and a module built beside a load gets them too. Every
load that can run beside another thread holds `ONE_LOAD`. It is re-entrant: a pipeline's load takes
its recipe's LoRAs inside it. Process-wide because what it guards is: a lock per pipeline would not do.
It lives in the lowest layer, importing nothing of ours: the device self-test (a pool re-tests a
retired replica on a thread of its own) loads too.
"""

from __future__ import annotations

import threading

ONE_LOAD = threading.RLock()
