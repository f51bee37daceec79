"""What a CPU user sees through the A1111 API, from one run: per model and runtime, and where the time goes.

    python -m benchmarks.api_speed [--configs torch,openvino,openvino-int8,openvino-w8a8] [--models tiny-shapes,tiny-shapes-fast]
                                   [--images 1,4] [--repeats 5] [--json PATH]
    python -m benchmarks.api_speed --pool [--configs torch,openvino,torch-processes] [--repeats 5]   # PREFERRED_DEVICE=cpu,cpu

Each (model, config) is an app built as `python app.py` builds it (settings from an environment mapping:
MODEL_ID, RUNTIME, OPENVINO_WEIGHTS; the engine; `app.serve` on a free 127.0.0.1 port), all built first
and then measured in alternation (request i of every app before request i + 1 of any), after one warm-up
request each. Requests leave steps, guidance and sampler to the model (tiny-shapes: 20 steps at guidance 4;
tiny-shapes-fast: 4 at 1). Reported per app and batch: the median and min..max of

- `api_s`: POST /sdapi/v1/txt2img until its JSON (PNG images in base64, infotext) is read;
- `engine_s`: the same request on the engine (`Engine.run`: the queue, the job thread, PNG metadata);
- `pipeline_s` and its parts: the pipeline's own timings (text encoders, the denoising loop, the VAE decode);
- `outside_s` = api_s - the networks' parts: what the issue calls the cost outside the networks.

`--pool`: one app with two CPU replicas per config; one request alone against two sent at once (the
pool's parallelism: 1.0x is perfect, 2.0x none).
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

import app
from benchmarks.measure import wall_of_threads
from devices.parallel import free_port
from engine import AppSettings, build_engine
from pipelines import GenerationRequest

CONFIGS = {
    "torch": {"RUNTIME": "torch"},
    "openvino": {"RUNTIME": "openvino"},
    "openvino-int8": {"RUNTIME": "openvino", "OPENVINO_WEIGHTS": "int8"},
    "openvino-w8a8": {"RUNTIME": "openvino", "OPENVINO_WEIGHTS": "w8a8"},
    "torch-processes": {"RUNTIME": "torch", "REPLICA_PROCESSES": "on"},  # --pool: each replica in its own process
    "openvino-processes": {"RUNTIME": "openvino", "REPLICA_PROCESSES": "on"},
}
# Warm-up requests per batch size: the first shapes, and w8a8's calibration (20 denoiser calls: 5 requests of a
# 4-step model; pipelines/weights/openvino_w8a8.py).
WARM_UP = 5
PROMPT = "a red circle on a blue background"


@dataclass
class App:
    """One app as `python app.py` builds it, and what was measured on it."""

    label: str
    env: dict[str, str]
    engine: Any = None
    demo: Any = None
    client: Any = None
    times: dict[str, list[float]] = field(default_factory=dict)

    def start(self) -> None:
        settings = AppSettings.from_env({**self.env, "GRADIO_SERVER_PORT": str(free_port()), "OUTPUT_DIR": tempfile.mkdtemp()})
        self.engine = build_engine(settings)
        self.demo = app.serve(self.engine, settings, quiet=True)
        self.client = httpx.Client(base_url=self.demo.local_url.rstrip("/"), timeout=600)

    def close(self) -> None:
        self.demo.close()
        self.engine.close()

    def add(self, key: str, value: float) -> None:
        self.times.setdefault(key, []).append(value)

    def api(self, images: int, seed: int) -> float:
        began = time.perf_counter()
        answer = self.client.post("/sdapi/v1/txt2img", json={"prompt": PROMPT, "batch_size": images, "seed": seed})
        answer.raise_for_status()
        assert len(answer.json()["images"]) == images
        return time.perf_counter() - began

    def measure(self, images: int, seed: int) -> None:
        self.add(f"api_s@{images}", self.api(images, seed))
        began = time.perf_counter()
        result = self.engine.run(GenerationRequest(prompt=PROMPT, num_images=images, seed=seed))
        self.add(f"engine_s@{images}", time.perf_counter() - began)
        for part in ("encode", "denoise", "decode", "total"):
            self.add(f"{part}_s@{images}", result.timings[part])


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def speeds(apps: list[App], batches: list[int], repeats: int) -> dict[str, Any]:
    for a in apps:
        for images in batches:
            for _ in range(WARM_UP if a.env.get("OPENVINO_WEIGHTS") == "w8a8" else 1):
                a.api(images, 0)
    for i in range(repeats):
        for a in apps:
            for images in batches:
                a.measure(images, 1000 + i)
    report: dict[str, Any] = {}
    for a in apps:
        row = {k: summary(v) for k, v in a.times.items()}
        for images in batches:
            networks = sum(row[f"{p}_s@{images}"]["median"] for p in ("encode", "denoise", "decode"))
            row[f"outside_s@{images}"] = row[f"api_s@{images}"]["median"] - networks
            row[f"per_image_s@{images}"] = row[f"api_s@{images}"]["median"] / images
        report[a.label] = row
    return report


def pool(apps: list[App], repeats: int) -> dict[str, Any]:
    """One request alone against two at once on each two-replica app (medians, alternated)."""

    def both(a: App, seed: int) -> float:
        return wall_of_threads([functools.partial(a.api, 1, seed + k) for k in range(2)])

    for a in apps:
        both(a, 0)
    for i in range(repeats):
        for a in apps:
            a.add("one_s", a.api(1, 2000 + i))
            a.add("two_s", both(a, 3000 + 2 * i))
    report = {}
    for a in apps:
        one, two = summary(a.times["one_s"]), summary(a.times["two_s"])
        report[a.label] = {"one_s": one, "two_s": two, "two_over_one": two["median"] / one["median"]}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--configs", default="torch,openvino", help=f"comma list of {', '.join(CONFIGS)}")
    parser.add_argument("--models", default="tiny-shapes,tiny-shapes-fast")
    parser.add_argument("--images", default="1,4")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pool", action="store_true", help="two concurrent requests on two CPU replicas")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    cache = tempfile.mkdtemp(prefix="api-speed-openvino-")
    apps = []
    for model in args.models.split(",") if not args.pool else args.models.split(",")[:1]:
        for config in args.configs.split(","):
            env = {"MODEL_ID": model, "OPENVINO_CACHE": cache, **CONFIGS[config]}
            if args.pool:
                env["PREFERRED_DEVICE"] = "cpu,cpu"
            apps.append(App(f"{model} {config}", env))
    try:
        for a in apps:
            print(f"... starting {a.label}", flush=True)
            a.start()
        report = pool(apps, args.repeats) if args.pool else speeds(apps, [int(b) for b in args.images.split(",")], args.repeats)
    finally:
        for a in apps:
            if a.engine is not None:
                a.close()
    print(format_report(report, args.pool))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return 0


def format_report(report: dict[str, Any], is_pool: bool) -> str:
    lines = []
    for label, row in report.items():
        if is_pool:
            one, two = row["one_s"], row["two_s"]
            lines.append(f"{label}: one {one['median']:.3f} s ({one['min']:.3f}..{one['max']:.3f}), two at once "
                         f"{two['median']:.3f} s ({two['min']:.3f}..{two['max']:.3f}): {row['two_over_one']:.2f}x")  # fmt: skip
            continue
        for key in sorted(k for k in row if k.startswith("api_s@")):
            images = key.split("@")[1]
            api = row[key]
            parts = ", ".join(f"{p} {row[f'{p}_s@{images}']['median']:.3f}" for p in ("encode", "denoise", "decode"))
            lines.append(
                f"{label}, {images} image(s): API {api['median']:.3f} s ({api['min']:.3f}..{api['max']:.3f}), engine "
                f"{row[f'engine_s@{images}']['median']:.3f}; networks {parts}; outside {row[f'outside_s@{images}']:.3f} s"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
