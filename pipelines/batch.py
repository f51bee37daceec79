"""Large offline jobs over processes and machines, with accelerate: `python -m pipelines.batch`.

    # one process (no launcher)
    python -m pipelines.batch --prompts prompts.txt --num-images 4 --out outputs/run1
    # two processes on this CPU
    torchrun --nproc_per_node 2 -m pipelines.batch --prompts prompts.txt --num-images 4 --out outputs/run1
    # every GPU/NPU of a box (one process each)
    accelerate launch --num_processes 8 -m pipelines.batch --prompts prompts.txt --num-images 4 --out outputs/run1
    # clips from a video model: each item an MP4 with its parameters inside (--clip-format: webp, gif, png)
    python -m pipelines.batch --prompts prompts.txt --model models/tiny-shapes-video --frames 17 --out outputs/clips
    # a 10,000-image job on 4 machines of 8 devices: the same command on each, R = 0..3,
    # IP:P = machine 0's address and a free port; --num_processes counts all processes of all machines
    accelerate launch --num_machines 4 --machine_rank R --main_process_ip IP --main_process_port P \\
        --num_processes 32 -m pipelines.batch --prompts prompts.txt --num-images 4 --out /shared/run1

On several machines `--out` must be one folder they all see (NFS, Lustre...): every process lists
the finished files there to split the remaining work the same way, and the main process merges
the manifest there. Threads: torchrun sets OMP_NUM_THREADS=1 per process; without a launcher torch
uses all cores; `--threads N` overrides both.

Work items, not prompts, are split between processes (`PartialState.split_between_processes`):
item k is (prompt line k // num_images, copy k % num_images) with seed `seed + k`, the order and
seeds of `ImagePipeline.work_items`. Items are run in the app's micro-batches (items
[0, m), [m, 2m), ... for --micro-batch m) and whole micro-batches are what is split, because the
batch an image is denoised in can change its pixels (batched BLAS order; 1/255 measured here for
tiny-shapes, alone vs in a batch of 4): so every file is bit-identical to the one a single process,
the app or the CLI makes with the same seed and micro-batch on the same kind of device, whatever
the process count (a resumed run re-makes missing items in smaller batches).
Each item is written as `<k:06d>-<seed>.png` atomically (temp file + rename), and a re-run skips
the files that exist: the job is resumable after a kill. A video job (`--frames N`, N > 1, and every
other video field: the schema's fields of the txt2img and video tasks are flags) writes each item's clip
as `<k:06d>-<seed>.mp4` the same way (`pipelines.video.files`: H.264 with A1111's infotext and our JSON
inside, as `python -m pipelines --frames N --out clip.mp4` writes it; `--clip-format` for the others).
Per-run values (seconds, process, device index, timings) go to the JSONL manifest, not into the
files, so runs with different process counts give byte-identical metadata. Each process appends to `manifest.part-<rank>.jsonl` after every
micro-batch (a killed run keeps the entries of its finished files); after `wait_for_everyone()` the
main process merges all parts, ordered by item, into `manifest.jsonl` (earlier entries are kept).
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

from config import environment
from devices import DeviceManager
from devices.options import DeviceSettings
from pipelines.pnginfo.write import TEMP_SUFFIX, save_clip, save_png
from pipelines.run.image_pipeline import ImagePipeline
from pipelines.run.options import PipelineOptions
from pipelines.schema.cli import add_request_arguments, flag_message, request_values
from pipelines.schema.errors import PipelineError
from pipelines.schema.fields import RequestError, Spec
from pipelines.schema.request import GenerationRequest, item_seed, nest
from pipelines.video.files import FORMATS as CLIP_FORMATS
from pipelines.video.files import SUFFIXES as CLIP_SUFFIXES
from pipelines.weights.lora import load_outside

log = logging.getLogger(__name__)
RUN_ONLY = ("timings", "device")  # per-run values (cuda:0 vs cuda:1): manifest only; dtype/attention stay


TASKS = ("txt2img", "video")  # a batch job makes pictures, or clips (--frames) from a video model
# Not flags here: the prompts come from --prompts, one per line; its seed is item 0's and always fixed
# (resuming needs each item's seed; default 0).
NOT_TAKEN = {"prompt": "the prompts are the --prompts file's lines", "seed": "a flag of its own: --seed, default 0"}


def build_parser() -> tuple[argparse.ArgumentParser, list[Spec]]:
    p = argparse.ArgumentParser(prog="python -m pipelines.batch", description=__doc__.splitlines()[0])
    p.add_argument(
        "--prompts", required=True, help="text file, one prompt per line (blank lines and # comments skipped)"
    )
    added = add_request_arguments(p, TASKS, skip=NOT_TAKEN)  # the request's fields (pipelines.schema.cli)
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument(
        "--clip-format", choices=CLIP_FORMATS, default="mp4",
        help="with --frames: each clip's file (mp4: H.264; webp, gif; png: a zip of PNG frames), its parameters inside",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of item 0; item k gets seed + k (default 0)")
    p.add_argument("--model", default=None, help="default: $MODEL_ID")
    p.add_argument("--micro-batch", type=int, default=None, help="items per pipeline call (default: MICRO_BATCH)")
    p.add_argument("--device", default=None, help="default: this process's device from accelerate")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: all cores; 1 per process under torchrun)"
    )
    return p, added


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


def item_name(index: int, seed: int, suffix: str = ".png") -> str:
    return f"{index:06d}-{seed}{suffix}"


def file_suffix(request: GenerationRequest, clip_format: str) -> str:
    """Each item's file: a clip's (`clip_format`) where the request makes clips, else a PNG (a 1-frame clip is one)."""
    return CLIP_SUFFIXES[clip_format] if (request.num_frames or 1) > 1 else ".png"


def chunks(items: list[int], size: int) -> list[list[int]]:
    """The app's micro-batches of `items`: runs of consecutive items inside each aligned block
    [b * size, (b + 1) * size); a gap left by a finished file splits a block."""
    runs: list[list[int]] = []
    for k in items:
        if runs and runs[-1][-1] == k - 1 and runs[-1][0] // size == k // size:
            runs[-1].append(k)
        else:
            runs.append([k])
    return runs


def run_items(
    pipeline: ImagePipeline, request: GenerationRequest, runs: list[list[int]], out: Path, rank: int, bar,
    suffix: str = ".png",
) -> int:  # fmt: skip
    """Generate and save `runs` (contiguous item indices), appending each run's manifest entries
    to this process's part as soon as its files exist; returns the number of items made (`suffix`: their
    files', `file_suffix`)."""
    made = 0
    with (out / f"manifest.part-{rank}.jsonl").open("a", encoding="utf-8") as part:
        for run in runs:
            start = time.perf_counter()
            result = pipeline.generate(request, item_range=(run[0], run[-1] + 1))
            seconds = (time.perf_counter() - start) / len(run)
            for k, item, meta in zip(run, result.clips or result.images, result.metadata, strict=True):
                path = save_item(item, result.fps, meta, out / item_name(k, meta["seed"], suffix))
                entry = {"item": k, "seed": meta["seed"], "prompt": meta["prompt"], "file": path.name,
                         "process": rank, "seconds": round(seconds, 4), "device": meta["device"]}  # fmt: skip
                part.write(json.dumps(entry) + "\n")
            part.flush()
            made += len(run)
            bar.update(len(run))
    return made


def save_item(item: Any, fps: float, meta: dict[str, Any], path: Path) -> Path:
    """One item's file with its metadata less the per-run values (`RUN_ONLY`): a PNG, or a clip (its frames) in
    the format `path`'s suffix names."""
    kept = {key: v for key, v in meta.items() if key not in RUN_ONLY}
    return save_clip(item, fps, kept, path) if isinstance(item, list) else save_png(item, kept, path)


def remove_stale_temp_files(out: Path, suffix: str = ".png") -> int:
    """Delete the temp files of writes a killed run left behind (`save_png`'s and `write_video`'s
    `.<name>.<hex>.part`). Only safe before the barrier, when no process of this run is writing yet."""
    stale = list(out.glob(f".*{suffix}.*{TEMP_SUFFIX}"))
    for path in stale:
        path.unlink(missing_ok=True)
    return len(stale)


def merge_manifest(out: Path) -> int:
    """Merge every `manifest.part-*.jsonl` into `manifest.jsonl` (ordered by item, one entry per
    item; a part's entry replaces an earlier run's). A line cut short by a kill mid-write is skipped with a warning:
    its file is either there (made, only its timing is lost) or re-made by this run."""
    entries: dict[int, dict] = {}
    final = out / "manifest.jsonl"
    for path in [final, *sorted(out.glob("manifest.part-*.jsonl"))]:
        if not path.is_file():
            continue
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            try:
                entry = json.loads(line) if line.strip() else None
            except json.JSONDecodeError as exc:
                log.warning("%s line %d is cut short (a killed run?), skipped: %s", path.name, number, exc)
                continue
            if entry is not None:
                entries[entry["item"]] = entry
    temp = out / "manifest.jsonl.part"
    temp.write_text("".join(json.dumps(entries[k]) + "\n" for k in sorted(entries)), encoding="utf-8")
    os.replace(temp, final)
    for path in out.glob("manifest.part-*.jsonl"):
        path.unlink()
    return len(entries)


def load(args: argparse.Namespace, added: list[Spec], device: str) -> tuple[ImagePipeline, GenerationRequest]:
    """The pipeline on this process's device (LoRAs from LORA_DIR, or a .safetensors path, as the
    CLI takes them) and the whole job as one request: the model's defaults where a flag is unset."""

    prompts = read_prompts(args.prompts)
    flat = request_values(args, added)  # checked by the schema before the model loads
    if flat.get("init_images") and not flat.get("num_frames"):  # the img2img fields (strength...) are no flags here
        raise RequestError("init_images", "a batch job's input images are its clips' first frames: with --frames")
    GenerationRequest.parse(nest({**flat, "prompt": prompts, "seed": args.seed}))
    options = {"micro_batch": args.micro_batch} if args.micro_batch else {}
    env = environment(os.environ)  # the environment over the settings file, read once
    dm = DeviceManager(options=DeviceSettings.from_env(env).options_for(device))  # the settings, read once
    pipeline = ImagePipeline.from_pretrained(args.model, dm, PipelineOptions.from_env(env), **options)
    flat["loras"] = load_outside(pipeline, flat.get("loras", {}))
    request = GenerationRequest.parse(nest({**flat, "prompt": prompts, "seed": args.seed}))
    return pipeline, request.with_defaults(pipeline)


def main(argv: list[str] | None = None) -> int:
    from accelerate import PartialState

    parser, added = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Without cpu=True, CPU processes started by torchrun would each think they are alone.
    # is_available(): a CUDA build of torch on a machine without a GPU still names cuda as its accelerator
    state = PartialState(cpu=not torch.accelerator.is_available())
    if args.threads:
        torch.set_num_threads(args.threads)
    out = Path(args.out)
    try:
        out.mkdir(parents=True, exist_ok=True)
        pipeline, request = load(args, added, args.device or process_device(state))
        total, suffix = request.total_images, file_suffix(request, args.clip_format)
        noun = "image" if suffix == ".png" else "clip"
        todo = [k for k in range(total) if not (out / item_name(k, item_seed(args.seed, k), suffix)).is_file()]
        if state.is_main_process:
            remove_stale_temp_files(out, suffix)
        # Every process must split the same list: none may write before all have looked.
        state.wait_for_everyone()
        with state.split_between_processes(chunks(todo, pipeline.options.micro_batch)) as mine:
            bar = tqdm(
                total=sum(map(len, mine)),  # the main process's share; shares differ by one micro-batch at most
                desc=f"{noun}s (process 0 of {state.num_processes})",
                disable=not state.is_main_process,
            )
            run_items(pipeline, request, list(mine), out, state.process_index, bar, suffix)
            bar.close()
    except RequestError as exc:
        print(f"error (process {state.process_index}): {flag_message(exc)}", file=sys.stderr)
        return 2
    except (PipelineError, ValueError, OSError) as exc:
        print(f"error (process {state.process_index}): {exc}", file=sys.stderr)
        return 2
    state.wait_for_everyone()
    if state.is_main_process:
        count = merge_manifest(out)
        print(f"{total - len(todo)} of {total} {noun}(s) already there, {len(todo)} made by {state.num_processes} "
              f"process(es); manifest: {count} entries in {out / 'manifest.jsonl'}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
