"""The ComfyUI API end to end, from one run: a prompt's time through `/prompt` until its history
entry is there, against the same request run directly on the engine, and an identical second prompt
answered from the node cache.

    python -m benchmarks.comfy_api [--model PATH] [--steps 10] [--size 64] [--runs 5] [--json PATH]

The app is built as `python app.py` builds it (settings from the environment mapping below, the
engine, `app.serve`) on a free local port; each run uses a new seed, so its first prompt runs a job
and its second, identical one does not. Prints the median and the spread (min..max) of each time
and the ratios of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

import app
from devices.parallel import free_port
from engine import AppSettings, build_engine
from pipelines import DEFAULT_MODEL, GenerationRequest


def graph(model: str, seed: int, steps: int, size: int) -> dict[str, Any]:
    return {
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 4, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": seed, "steps": steps}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": model}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": 1, "height": size, "width": size}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": "a red circle on a blue background"}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": ""}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "bench", "images": ["8", 0]}},
    }  # fmt: skip


def through_api(client: httpx.Client, prompt: dict[str, Any]) -> float:
    """Seconds from POST /prompt to its history entry (polled every 5 ms) and its image fetched."""
    start = time.perf_counter()
    prompt_id = client.post("/prompt", json={"prompt": prompt}).json()["prompt_id"]
    while not (item := client.get(f"/history/{prompt_id}").json()):
        time.sleep(0.005)
    image = item[prompt_id]["outputs"]["9"]["images"][0]
    client.get("/view", params=image).raise_for_status()
    return time.perf_counter() - start


def measure(model: Path, steps: int, size: int, runs: int) -> dict[str, Any]:
    env = {"MODEL_ID": str(model), "OUTPUT_DIR": tempfile.mkdtemp(), "GRADIO_SERVER_PORT": str(free_port())}
    settings = AppSettings.from_env(env)
    engine = build_engine(settings)
    demo = app.serve(engine, settings, quiet=True)
    try:
        client = httpx.Client(base_url=demo.local_url.rstrip("/"), timeout=600)
        name = engine.model_info().model_name
        through_api(client, graph(name, 0, steps, size))  # warm-up
        direct, first, cached = [], [], []
        for run in range(1, runs + 1):
            request = GenerationRequest(prompt="a red circle on a blue background", seed=run, steps=steps,
                                        guidance_scale=4.0, width=size, height=size, sampler="Euler")  # fmt: skip
            t = time.perf_counter()
            engine.run(request)
            direct.append(time.perf_counter() - t)
            first.append(through_api(client, graph(name, 100 + run, steps, size)))
            cached.append(through_api(client, graph(name, 100 + run, steps, size)))
    finally:
        demo.close()
        engine.close()
    out = {name: _summary(values) for name, values in (("engine_s", direct), ("api_s", first), ("api_cached_s", cached))}
    out["api_over_engine"] = out["api_s"]["median"] / out["engine_s"]["median"]
    out["cached_over_first"] = out["api_cached_s"]["median"] / out["api_s"]["median"]
    return {"steps": steps, "size": size, "runs": runs, **out}


def _summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, default=DEFAULT_MODEL)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    found = measure(args.model, args.steps, args.size, args.runs)
    for key in ("engine_s", "api_s", "api_cached_s"):
        v = found[key]
        print(f"{key:14s} median {v['median']:.3f} s  ({v['min']:.3f}..{v['max']:.3f})")
    print(f"API over engine: {found['api_over_engine']:.2f}x   cached over first: {found['cached_over_first']:.3f}x")
    if args.json:
        args.json.write_text(json.dumps(found, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
