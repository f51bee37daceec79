"""Ray Serve backend overhead: the same 4-image request through Ray (1 replica) vs in-process, in one run.

    python -m benchmarks.ray_bench [--rounds 7] [--images 4] [--steps 20] [--json PATH]

Both sides use one torch thread (the replica is given 1 CPU, hence 1 thread) and the embedded
model (models/tiny-shapes); the calls alternate (order reversed each round, never at the same
time) and the medians are compared. The Ray side includes everything a request costs there:
routing, PNG encoding/decoding of the images, streamed progress events. Goal: overhead <= 5 %.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray
    from ray import serve

    from serving.ray_backend import RayBackend

    torch.set_num_threads(1)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    try:
        remote = RayBackend.start(model=args.model, replicas=1, device="cpu", cpus_per_replica=1)
        local = ImagePipeline.from_pretrained(args.model, DeviceManager("cpu"))
        req = GenerationRequest(prompt="a red circle on a blue background", num_images=args.images,
                                steps=args.steps, seed=3)  # fmt: skip
        sides = {"in-process": local.generate, "ray": remote.generate}
        times: dict[str, list[float]] = {k: [] for k in sides}
        images = {k: fn(req).images for k, fn in sides.items()}  # warm-up, and the images to compare
        for round_ in range(args.rounds):
            for name in list(sides) if round_ % 2 == 0 else reversed(list(sides)):
                start = time.perf_counter()
                sides[name](req)
                times[name].append(time.perf_counter() - start)
    finally:
        serve.shutdown()
        ray.shutdown()
    med = {k: statistics.median(v) for k, v in times.items()}
    diff = max(int(np.abs(np.asarray(a, np.int16) - np.asarray(b, np.int16)).max())
               for a, b in zip(images["ray"], images["in-process"], strict=True))  # fmt: skip
    report = {
        "torch_threads": 1,
        "rounds": args.rounds,
        "images": args.images,
        "steps": args.steps,
        "median_s": med,
        "overhead": med["ray"] / med["in-process"] - 1,
        "paired_overhead": statistics.median(r / i for r, i in zip(times["ray"], times["in-process"], strict=True)) - 1,
        "max_pixel_diff": diff,
        "seconds": times,
    }
    print("1 torch thread on each side (the replica reserves 1 CPU); calls alternated, medians compared")
    print(f"in-process {med['in-process']:.3f} s, ray {med['ray']:.3f} s: overhead {report['overhead']:+.1%} "
          f"(median of paired rounds {report['paired_overhead']:+.1%}), "
          f"max pixel diff {diff}/255")  # fmt: skip
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
