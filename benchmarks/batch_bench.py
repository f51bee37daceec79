"""Batch jobs: wall time of 1 process vs 2 processes (torchrun, 1 thread each) for the same 32 images.

    python -m benchmarks.batch_bench [--images 32] [--steps 20] [--rounds 1] [--json PATH]

Reports the whole command's wall time (start-up included: imports and model load, ~6 s here) and
the generation time alone (the slowest process's sum of per-item seconds from the manifest).
With --rounds N the two sides alternate (1, 2, 1, 2, ...) and the median of each is compared, so a
busy neighbour on a shared machine slows both alike. Also checks that both wrote the same files.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
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


def files(folder: Path) -> dict[str, bytes]:
    """Every PNG's bytes by name: both sides must write byte-identical files."""
    return {p.name: p.read_bytes() for p in sorted(folder.glob("*.png"))}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=1, help="alternated runs of each side (median reported)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    rounds: dict[int, list[dict[str, float]]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.txt"
        prompts.write_text("\n".join(PROMPTS) + "\n")
        per_prompt = max(1, args.images // len(PROMPTS))
        for r in range(args.rounds):
            for n in (1, 2):
                rounds[n].append(run(Path(tmp) / f"p{n}-{r}", prompts, per_prompt, args.steps, n))
        same = files(Path(tmp) / "p1-0") == files(Path(tmp) / "p2-0")
    results = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for n, rs in rounds.items()}
    report = {
        "images": per_prompt * len(PROMPTS),
        "runs": results,
        "rounds": rounds,
        "speedup_wall": results[1]["wall_s"] / results[2]["wall_s"],
        "speedup_generation": results[1]["generation_s"] / results[2]["generation_s"],
        "same_files": same,
        "note": "shared 2-core CPU machine (other agents' jobs running); 1 torch thread per process",
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
