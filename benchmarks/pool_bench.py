"""Device-pool throughput: images per second with 1 vs 2 replicas, 8 concurrent requests, in one run.

    python -m benchmarks.pool_bench [--requests 8] [--images 1] [--steps 20] [--rounds 3] [--json PATH]

On this 2-core CPU each replica gets one torch thread (the pool divides the cores); the
one-replica pool is run with one thread as well, so the ratio measures the pool, not threading.
Rounds alternate 1 and 2 replicas (order reversed each round); the median of each is reported.
Every image is also checked to be the same whichever pool made it (the seeds invariant).
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import numpy as np
import torch

from pipelines import GenerationRequest
from serving.pool import DevicePool


def burst(pool: DevicePool, requests: int, images: int, steps: int) -> tuple[float, dict[int, np.ndarray]]:
    """Wall seconds for `requests` concurrent requests, and each request's first image by seed."""
    out: dict[int, np.ndarray] = {}

    def one(i: int) -> None:
        seed = 100 * i
        req = GenerationRequest(prompt="a red circle on a blue background", num_images=images, steps=steps, seed=seed)
        out[seed] = np.asarray(pool.generate(req).images[0], dtype=np.int16)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(requests)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--images", type=int, default=1)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--devices", default="cpu,cpu", help="the pool to compare with one replica")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    two = DevicePool.from_pretrained(args.model, devices=args.devices)
    threads = torch.get_num_threads()
    one = DevicePool(two.replicas[:1])
    pools = {"1 replica": one, f"{len(two.replicas)} replicas": two}
    times: dict[str, list[float]] = {name: [] for name in pools}
    images: dict[str, dict[int, np.ndarray]] = {}
    burst(two, 2, 1, 2)  # warm-up
    for round_ in range(args.rounds):
        for name in list(pools) if round_ % 2 == 0 else reversed(list(pools)):
            seconds, images[name] = burst(pools[name], args.requests, args.images, args.steps)
            times[name].append(seconds)
    total = args.requests * args.images
    rate = {name: total / statistics.median(t) for name, t in times.items()}
    names = list(pools)
    diff = max(int(np.abs(images[names[0]][s] - images[names[1]][s]).max()) for s in images[names[0]])
    report = {
        "threads_per_replica": threads,
        "images_per_second": rate,
        "speedup": rate[names[1]] / rate[names[0]],
        "max_pixel_diff_between_pools": diff,
        "seconds": times,
    }
    for name in names:
        print(f"{name}: {rate[name]:.2f} images/s (median of {args.rounds})")
    print(f"speed-up {report['speedup']:.2f}x, {threads} torch thread(s) per replica, max pixel diff {diff}/255")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
