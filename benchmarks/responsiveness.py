"""How quickly the app's safety nets answer, from one run: figures the tests used to assert as
wall-clock limits, which prove nothing on a machine of another speed (the tests now check behaviour).

    python -m benchmarks.responsiveness [--model PATH] [--steps 40] [--images 8] [--threads 1] [--json PATH]

- stop: seconds and denoising steps from `Engine.stop` (the UI's Stop, A1111's /interrupt, a client
  that disconnects) to the job's end, against the seconds per step (it ends after its current step);
- status: `Engine.status()` (the status panel, `/status`) while a generation runs, over idle;
- hostile metadata: reading crafted PNG text chunks (a 2^30-path ComfyUI graph, a 1 MB A1111 line,
  100k fields, unclosed XMP tags), over reading a normal file.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import struct
import tempfile
import threading
import time
import zlib
from pathlib import Path
from typing import Any

from PIL import Image

from engine import Caller, Engine, Finished, Progress
from pipelines import GenerationRequest, ImagePipeline
from pipelines.pnginfo.read import read_png_info


def stop_and_status(engine: Engine, steps: int, images: int, polls: int = 20) -> dict[str, Any]:
    """Status latency idle and mid-job, then Stop at step 3 of `steps`: how long and how many steps to the end."""
    if steps < 4:
        raise ValueError("--steps: at least 4 (Stop comes at step 3)")
    idle = [_seconds(engine.status) for _ in range(polls)]
    request = GenerationRequest(prompt="a red circle on a blue background", num_images=images, steps=steps, seed=1)
    job = engine.submit(request, Caller(session="bench"))
    reached, stopped_at, seen = threading.Event(), {}, []
    for event in job.events(timeout=600):
        if isinstance(event, Progress):
            seen.append((time.perf_counter(), event.step))
            if event.step == 3 and not reached.is_set():
                reached.set()
                busy = [_seconds(engine.status) for _ in range(polls)]
                stopped_at = {"time": time.perf_counter(), "step": event.step, "total": event.total}
                engine.stop("bench")
        elif isinstance(event, Finished):
            ended, result = time.perf_counter(), event.result
    per_step = (seen[2][0] - seen[0][0]) / 2 if len(seen) >= 3 else float("nan")
    return {
        "status_idle_s": statistics.median(idle),
        "status_busy_s": statistics.median(busy),
        "status_busy_over_idle": statistics.median(busy) / statistics.median(idle),
        "stop_to_end_s": ended - stopped_at["time"],
        "seconds_per_step": per_step,
        "steps_after_stop": max(step for _, step in seen) - stopped_at["step"],
        "total_steps": stopped_at["total"],
        "cancelled": result.cancelled,
    }


def _seconds(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def _diamond_graph(depth: int) -> dict:
    """A ComfyUI graph whose every node links twice to the next: 2^depth paths to the prompt."""
    graph = {"1": {"class_type": "KSampler", "inputs": {"sampler_name": "euler", "positive": ["10", 0]}}}
    for k in range(10, 10 + depth):
        graph[str(k)] = {"inputs": {"conditioning_1": [str(k + 1), 0], "conditioning_2": [str(k + 1), 0]}}
    graph[str(10 + depth)] = {"inputs": {"text": "ab"}}
    return graph


HOSTILE = {
    "diamond graph": ("prompt", lambda: json.dumps(_diamond_graph(30))),
    "1 MB prompt line": ("parameters", lambda: "p\n" + "word " * 200_000),
    "100k fields": ("parameters", lambda: "p\n" + "Key: v, " * 100_000),
    "unclosed XMP tags": ("XML:com.adobe.xmp", lambda: "<x:parameters>" * 100_000),
}


def hostile_metadata(folder: Path, repeats: int = 3) -> dict[str, Any]:
    """Median seconds to read each crafted file, and its ratio to a file with a normal A1111 text."""
    buffer = folder / "base.png"
    Image.new("RGB", (8, 8)).save(buffer)
    base = buffer.read_bytes()

    def file_with(name: str, key: str, value: str) -> Path:
        path = folder / f"{name.replace(' ', '-')}.png"
        body = key.encode() + b"\x00\x00\x00\x00\x00" + value.encode()
        path.write_bytes(base[:-12] + _chunk(b"iTXt", body) + base[-12:])
        return path

    def read(path: Path) -> float:
        def once() -> None:
            with contextlib.suppress(ValueError):  # "no generation parameters" is an answer too: it is what is timed
                read_png_info(path)

        return statistics.median(_seconds(once) for _ in range(repeats))

    normal = read(file_with("normal", "parameters", "a cat\nSteps: 20, Sampler: Euler, Seed: 1"))
    out: dict[str, Any] = {"normal_s": normal}
    for name, (key, make) in HOSTILE.items():
        seconds = read(file_with(name, key, make()))
        out[name] = {"seconds": seconds, "over_normal": seconds / normal}
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from pipelines.run.options import DEFAULT_MODEL

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--device", default=None)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: steady on a shared machine)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    import torch

    from devices import DeviceManager

    torch.set_num_threads(args.threads)

    engine = Engine(ImagePipeline.from_pretrained(args.model, DeviceManager(args.device)))
    report = {"engine": stop_and_status(engine, args.steps, args.images)}
    with tempfile.TemporaryDirectory() as folder:
        report["hostile_metadata"] = hostile_metadata(Path(folder))
    e = report["engine"]
    print(f"Stop at step 3 of {e['total_steps']}: ended {e['stop_to_end_s']:.3f} s later, "
          f"{e['steps_after_stop']} step(s) on (one step: {e['seconds_per_step']:.3f} s)")  # fmt: skip
    print(f"status while generating / idle: {e['status_busy_over_idle']:.2f}x ({e['status_busy_s'] * 1e3:.1f} ms)")
    for name in HOSTILE:
        row = report["hostile_metadata"][name]
        print(f"read {name}: {row['seconds'] * 1e3:.1f} ms ({row['over_normal']:.0f}x a normal file)")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
