"""Batch jobs: wall time of 1 process vs 2 processes (torchrun, 1 thread each) for the same 32 images.

    python -m benchmarks.batch_bench [--images 32] [--steps 20] [--json PATH]

Reports the whole command's wall time (start-up included: imports and model load, ~6 s here) and
the generation time alone (the slowest process's sum of per-item seconds from the manifest).
Also checks that both runs wrote the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS = ["a red circle on a blue background", "a green square on a white background",
           "a yellow triangle on a purple background", "a white circle on a black background"]  # fmt: skip


def run(out: Path, prompts: Path, images_per_prompt: int, steps: int, processes: int) -> dict[str, float]:
    args = ["-m", "pipelines.batch", "--prompts", str(prompts), "--num-images", str(images_per_prompt),
            "--out", str(out), "--steps", str(steps)]  # fmt: skip
    if processes == 1:
        command = [sys.executable, *args, "--threads", "1"]
    else:
        from tests.app_server import free_port

        torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent)) or "torchrun"
        command = [torchrun, "--nproc_per_node", str(processes), "--master_port", str(free_port()), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    subprocess.run(command, cwd=ROOT, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    per_process: dict[int, float] = defaultdict(float)
    for line in (out / "manifest.jsonl").read_text().splitlines():
        entry = json.loads(line)
        per_process[entry["process"]] += entry["seconds"]
    return {"wall_s": wall, "generation_s": max(per_process.values())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.txt"
        prompts.write_text("\n".join(PROMPTS) + "\n")
        per_prompt = max(1, args.images // len(PROMPTS))
        results = {n: run(Path(tmp) / f"p{n}", prompts, per_prompt, args.steps, n) for n in (1, 2)}
        same = sorted(p.name for p in (Path(tmp) / "p1").glob("*.png")) == sorted(
            p.name for p in (Path(tmp) / "p2").glob("*.png")
        )
    report = {
        "images": per_prompt * len(PROMPTS),
        "runs": results,
        "speedup_wall": results[1]["wall_s"] / results[2]["wall_s"],
        "speedup_generation": results[1]["generation_s"] / results[2]["generation_s"],
        "same_files": same,
    }
    for n, r in results.items():
        print(f"{n} process(es): {r['wall_s']:.1f} s wall, {r['generation_s']:.1f} s generating")
    print(
        f"speed-up {report['speedup_wall']:.2f}x wall, {report['speedup_generation']:.2f}x generation; same files: {same}"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
