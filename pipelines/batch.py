"""Large offline jobs over processes and machines, with accelerate: `python -m pipelines.batch`.

    # one process (no launcher)
    python -m pipelines.batch --prompts prompts.txt --num-images 4 --out outputs/run1
    # two processes on this CPU
    torchrun --nproc_per_node 2 -m pipelines.batch --prompts prompts.txt --num-images 4 --out outputs/run1
    # every GPU/NPU of a box (one process each)
    accelerate launch --num_processes 8 -m pipelines.batch --prompts prompts.txt --num-images 4 --out outputs/run1
    # a 10,000-image job on 4 machines: the same command on each, R = 0..3
    accelerate launch --num_machines 4 --machine_rank R --main_process_ip IP --main_process_port 29500 \\
        --num_processes 32 -m pipelines.batch --prompts prompts.txt --num-images 4 --out /shared/run1

Work items, not prompts, are split between processes (`PartialState.split_between_processes`):
item k is (prompt line k // num_images, copy k % num_images) with seed `seed + k`, the order and
seeds of `ImagePipeline.work_items`, so every file is the one a single process (or the app) makes.
Each item is written as `<k:06d>-<seed>.png` atomically, and a re-run skips the files that exist:
the job is resumable after a kill. Per-run values (seconds, process) go to the JSONL manifest, not
into the PNGs, so runs with different process counts give byte-identical metadata. Each process
writes `manifest.part-<rank>.jsonl`; the main process merges them, ordered by item, into
`manifest.jsonl` (entries of earlier runs are kept).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from devices import DeviceManager

from .__main__ import parse_lora
from .errors import PipelineError
from .image_pipeline import ImagePipeline
from .metadata import save_png
from .request import GenerationRequest

log = logging.getLogger(__name__)
RUN_ONLY = ("timings", "device", "dtype", "attention")  # per-run values: manifest only


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines.batch", description=__doc__.splitlines()[0])
    p.add_argument(
        "--prompts", required=True, help="text file, one prompt per line (blank lines and # comments skipped)"
    )
    p.add_argument("--num-images", type=int, default=1, help="images per prompt")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--seed", type=int, default=0, help="seed of item 0; item k gets seed + k (default 0)")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--guidance", type=float, default=None)
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--negative", default=None)
    p.add_argument("--model", default=None, help="default: $MODEL_ID")
    p.add_argument("--lora", action="append", type=parse_lora, default=[], metavar="NAME_OR_FILE:SCALE")
    p.add_argument("--micro-batch", type=int, default=None, help="items per pipeline call (default: MICRO_BATCH)")
    p.add_argument("--device", default=None, help="default: this process's device from accelerate")
    p.add_argument("--threads", type=int, default=None, help="torch threads (torchrun sets 1 per process)")
    return p


def read_prompts(path: str | Path) -> list[str]:
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    prompts = [line.strip() for line in lines if line.strip() and not line.strip().startswith("#")]
    if not prompts:
        raise ValueError(f"--prompts {path}: no prompts in it")
    return prompts


def process_device(state: Any) -> str:
    """The PREFERRED_DEVICE string of this process's device (cuda:1, npu:3, xpu:0, mps, cpu)."""
    device = state.device
    return device.type if device.index is None or device.type in ("cpu", "mps") else f"{device.type}:{device.index}"


def item_name(index: int, seed: int) -> str:
    return f"{index:06d}-{seed}.png"


def chunks(items: list[int], size: int) -> list[list[int]]:
    """Runs of consecutive items (a gap, left by a finished file, starts a new run), at most `size` long."""
    runs: list[list[int]] = []
    for k in items:
        if runs and runs[-1][-1] == k - 1 and len(runs[-1]) < size:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def run_items(pipeline: ImagePipeline, request: GenerationRequest, todo: list[int], out: Path, rank: int, bar) -> list:
    """Generate and save `todo` (item indices) in contiguous runs; returns manifest entries."""
    entries = []
    micro = pipeline.options.micro_batch
    for run in chunks(todo, micro):
        start = time.perf_counter()
        result = pipeline.generate(request, item_range=(run[0], run[-1] + 1))
        seconds = (time.perf_counter() - start) / len(run)
        for k, image, meta in zip(run, result.images, result.metadata, strict=True):
            kept = {key: v for key, v in meta.items() if key not in RUN_ONLY}
            path = save_png(image, kept, out / item_name(k, meta["seed"]))
            entries.append({"item": k, "seed": meta["seed"], "prompt": meta["prompt"], "file": path.name,
                            "process": rank, "seconds": round(seconds, 4), "device": meta["device"]})  # fmt: skip
        bar.update(len(run))
    return entries


def merge_manifest(out: Path) -> int:
    """Merge every `manifest.part-*.jsonl` into `manifest.jsonl` (ordered by item, one entry per item)."""
    entries: dict[int, dict] = {}
    final = out / "manifest.jsonl"
    for path in [final, *sorted(out.glob("manifest.part-*.jsonl"))]:
        if path.is_file():
            for line in path.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    entry = json.loads(line)
                    entries[entry["item"]] = entry
    temp = out / "manifest.jsonl.part"
    temp.write_text("".join(json.dumps(entries[k]) + "\n" for k in sorted(entries)), encoding="utf-8")
    os.replace(temp, final)
    for path in out.glob("manifest.part-*.jsonl"):
        path.unlink()
    return len(entries)


def main(argv: list[str] | None = None) -> int:
    from accelerate import PartialState

    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    state = PartialState(cpu=torch.accelerator.current_accelerator() is None)
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    try:
        prompts = read_prompts(args.prompts)
        options = {"micro_batch": args.micro_batch} if args.micro_batch else {}
        pipeline = ImagePipeline.from_pretrained(
            args.model, DeviceManager(args.device or process_device(state)), **options
        )
        info = pipeline.model_info()
        for name, _scale in args.lora:
            pipeline.load_lora(name if name.endswith(".safetensors") else pipeline.loras.available().get(name, name))
        request = GenerationRequest(
            prompt=prompts, negative_prompt=args.negative, num_images=args.num_images, seed=args.seed,
            steps=args.steps or info.default_steps, guidance_scale=args.guidance or info.default_guidance,
            width=args.width, height=args.height, loras={Path(n).stem: s for n, s in args.lora},
        )  # fmt: skip
        total = request.total_images
        todo = [k for k in range(total) if not (out / item_name(k, args.seed + k)).is_file()]
        # Every process must split the same list: none may write before all have looked.
        state.wait_for_everyone()
        with state.split_between_processes(todo) as mine:
            share = len(mine)  # the main process shows its own share; all shares are about equal
            bar = tqdm(
                total=share, desc=f"images (process 0 of {state.num_processes})", disable=not state.is_main_process
            )
            entries = run_items(pipeline, request, list(mine), out, state.process_index, bar)
            bar.close()
    except (PipelineError, ValueError, OSError) as exc:
        print(f"error (process {state.process_index}): {exc}", file=sys.stderr)
        return 2
    part = out / f"manifest.part-{state.process_index}.jsonl"
    part.write_text("".join(json.dumps(e) + "\n" for e in entries), encoding="utf-8")
    state.wait_for_everyone()
    if state.is_main_process:
        count = merge_manifest(out)
        print(f"{total - len(todo)} of {total} image(s) already there, {len(todo)} made by {state.num_processes} "
              f"process(es); manifest: {count} entries in {out / 'manifest.jsonl'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
