"""`HoldAtStep` inside Ray replicas, which run in processes of their own, for tests of a caller that
goes away (tests/test_ray.py).

`install` is the Ray instance's `worker_process_setup_hook`: it runs in every Ray worker and patches
`ImagePipeline.generate` when (and if) that worker imports it, so the Serve controller and the other
actors import nothing heavy. The patched `generate` holds only a request whose prompt is
`HOLD + <file>`: at step 2 until the request is cancelled (or 60 s), then it writes what happened
to that file as JSON (`held_until`, `steps`, `total`, `cancelled`), which the test reads.

This suits a caller that goes away (its stream is cancelled: the replica hears it at once), not
Stop: the caller passes Stop on when the next step's progress arrives, which a held step never sends.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import json
import sys
from pathlib import Path

from tests.sync import HoldAtStep

HOLD = "hold at step 2, then report to "
_TARGET = "pipelines.run.image_pipeline"


def install() -> None:
    """Patch ImagePipeline now if it is imported, else as soon as it is."""
    if _TARGET in sys.modules:
        _patch(sys.modules[_TARGET].ImagePipeline)
    elif not any(isinstance(finder, _PatchOnImport) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Finds `pipelines.run.image_pipeline` as usual and patches its ImagePipeline once it has run."""

    def find_spec(self, name, path, target=None):
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def run_then_patch(module) -> None:
            run(module)
            _patch(module.ImagePipeline)

        spec.loader.exec_module = run_then_patch
        return spec


def _patch(cls) -> None:
    original = cls.generate
    if getattr(original, "holds", False):
        return

    def generate(self, request, progress=None, should_cancel=None, preview=None, item_range=None):
        prompt = request.prompt if isinstance(request.prompt, str) else ""
        if not prompt.startswith(HOLD):
            return original(self, request, progress, should_cancel, preview, item_range)
        hold = HoldAtStep(lambda r, p, c, v: original(self, r, p, c, v, item_range), step=2, limit=60.0)
        try:
            return hold(request, progress, should_cancel, preview)
        finally:
            outcome = {"held_until": hold.held_until, "steps": hold.steps, "total": hold.total}
            outcome["cancelled"] = getattr(hold.result, "cancelled", None)
            Path(prompt.removeprefix(HOLD)).write_text(json.dumps(outcome))

    generate.holds = True
    cls.generate = generate
