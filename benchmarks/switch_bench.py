"""Model switch cost: seconds and memory before/after switching a device pool between two models.

    python -m benchmarks.switch_bench [--to FOLDER] [--rounds 3] [--json PATH]

Starts a pool on the embedded model, switches to `--to` (default: a tiny random SD model built
locally, 32x32) and back, `--rounds` times, and prints per switch the seconds and the process's
resident memory (RSS) before and after, plus the pool's own memory figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from devices.memory import host_memory
from pipelines.options import DEFAULT_MODEL
from pipelines.pool import DevicePool


def rss_mib() -> float:
    return round(host_memory()["host_rss"] / 2**20, 1)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", default=None, help="the other model (default: a tiny SD folder built here)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        other = args.to
        if other is None:
            from tests.tiny_model import save_tiny_pipeline

            other = str(save_tiny_pipeline(Path(tmp) / "tiny-sd"))
        pool = DevicePool.from_pretrained(str(DEFAULT_MODEL), devices=args.device, memory_mode="off")
        rows = []
        for _ in range(args.rounds):
            for target in (other, str(DEFAULT_MODEL)):
                before = rss_mib()
                start = time.perf_counter()
                info = pool.load_model(target)
                rows.append({"to": info.model_name, "seconds": round(time.perf_counter() - start, 3),
                             "rss_before_mib": before, "rss_after_mib": rss_mib()})  # fmt: skip
                print(json.dumps(rows[-1]))
    summary = {
        name: statistics.median(r["seconds"] for r in rows if r["to"] == name) for name in {r["to"] for r in rows}
    }
    print("median seconds per switch:", json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"switches": rows, "median_seconds": summary}, indent=2))


if __name__ == "__main__":
    main()
