"""A request's walk through the code: `python -m benchmarks.walk` (docs/architecture.md#a-requests-walk).

One text-to-image request of the embedded model goes through the engine exactly as `python app.py`
builds it (default settings). A profile hook records every function of the project's layers that runs
for it, from the engine's submit to the result (the stops), and the project's frames on the stack when
diffusers' pipeline `__call__` starts (the depth). It prints the stops by layer and file, and the
counts: the figures the architecture page quotes.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
NOT_OURS = ("benchmarks", "tests", ".venv")


def _ours(filename: str) -> str | None:
    """The repository-relative path of a project file (not the tools', not a library's), else None."""
    path = Path(filename).resolve()
    if ROOT not in path.parents:
        return None
    rel = path.relative_to(ROOT)
    return None if rel.parts[0] in NOT_OURS else rel.as_posix()


def _stack(frame: FrameType | None) -> list[tuple[str, str]]:
    """(file, function) of the project's frames on `frame`'s stack, outermost first."""
    stops = []
    while frame is not None:
        rel = _ours(frame.f_code.co_filename)
        if rel is not None:
            stops.append((rel, frame.f_code.co_qualname))
        frame = frame.f_back
    return stops[::-1]


def walk(steps: int = 2) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(the project's frames on the stack when diffusers' pipeline is called, every project function
    that ran for the request) for one text-to-image request through the app's engine."""
    from engine.backends import build_engine
    from engine.settings import AppSettings
    from pipelines import DEFAULT_MODEL, GenerationRequest

    found: list[list[tuple[str, str]]] = []
    ran: dict[tuple[str, str], None] = {}  # in first-call order
    on = threading.Event()

    def profile(frame: FrameType, event: str, _arg: Any) -> None:
        if event != "call" or not on.is_set():
            return
        code = frame.f_code
        rel = _ours(code.co_filename)
        if rel is not None:
            ran.setdefault((rel, code.co_qualname), None)
        elif code.co_name == "__call__" and "/diffusers/pipelines/" in code.co_filename and not found:
            found.append(_stack(frame))

    with tempfile.TemporaryDirectory() as out:
        settings = AppSettings.from_env({"MODEL_ID": str(DEFAULT_MODEL), "OUTPUT_DIR": out})
        threading.setprofile(profile)  # before the engine starts its threads: each one is profiled
        sys.setprofile(profile)  # and this one, which submits
        try:
            engine = build_engine(settings)
            try:
                on.set()
                list(engine.submit(GenerationRequest(prompt="a red circle", steps=steps, seed=1)).events(timeout=300))
            finally:
                engine.close()
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    if not found:
        raise RuntimeError("diffusers' pipeline was never called")
    return found[0], list(ran)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.walk", description=__doc__)
    parser.add_argument("--json", type=Path, help="also write the stops to this file")
    args = parser.parse_args(argv)
    stack, ran = walk()
    for i, (file, function) in enumerate(ran, 1):
        print(f"{i:3d}  {file}:{function}")
    for layer in sorted({file.split("/")[0] for file, _ in ran}):
        mine = [f for f in ran if f[0].split("/")[0] == layer]
        print(f"{layer}: {len(mine)} functions in {len({f for f, _ in mine})} files")
    print(f"{len(ran)} functions in {len({f for f, _ in ran})} files ran for the request")
    print(f"depth at diffusers' call: {len(stack)} frames ({' > '.join(fn for _, fn in stack)})")
    if args.json:
        args.json.write_text(json.dumps({"ran": ran, "stack": stack}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
