"""Command line: `python -m pipelines "a prompt" --num-images 4 --out outputs/`.

    python -m pipelines "a red circle on a blue background" --num-images 4 --out outputs/ \\
        [--model PATH_OR_ID] [--lora FILE:SCALE ...] [--init-image FILE ...] [--seed N] [--steps N]
    python -m pipelines "a red circle moving left on a blue background" --model models/tiny-shapes-video \\
        --frames 17 --out clip.mp4     # a video model: an H.264 MP4 with its parameters inside

Every request field is a flag (`pipelines.schema.cli`, from the request schema: `--help` lists them).
Prints a tqdm bar per denoising step and one summary line; PNGs keep their metadata.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from tqdm import tqdm

from config import environment
from devices import DeviceManager
from devices.memory import human_bytes
from devices.options import DeviceSettings
from pipelines.pnginfo.write import save_clips, save_images
from pipelines.run.image_pipeline import ImagePipeline
from pipelines.run.options import PipelineOptions
from pipelines.schema.cli import add_request_arguments, flag_message, request_values
from pipelines.schema.errors import PipelineError
from pipelines.schema.fields import TASKS, RequestError, Spec
from pipelines.schema.request import GenerationRequest, nest
from pipelines.weights.lora import load_outside


def build_parser() -> tuple[argparse.ArgumentParser, list[Spec]]:
    p = argparse.ArgumentParser(prog="python -m pipelines", description="Generate images with Diffusion Anywhere.")
    added = add_request_arguments(p, TASKS)  # every request field (pipelines.schema.cli); --lora takes files too
    p.add_argument(
        "--out", default="outputs",
        help="output folder (default: outputs/); with --frames, a clip file too: clip.mp4 (H.264), .webp, .gif, .zip (PNG frames)",
    )  # fmt: skip
    p.add_argument("--model", default=None, help="diffusers folder, Hub id or .safetensors (default: $MODEL_ID)")
    p.add_argument("--device", default=None, help="auto|cpu|cuda[:N]|rocm|npu[:N]|xpu[:N]|mps")
    p.add_argument("--dtype", default=None, help="float32|float16|bfloat16")
    return p, added


def main(argv: list[str] | None = None) -> int:
    parser, added = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from pipelines.weights.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    try:
        flat = request_values(args, added)  # images read and checked before the model loads
        devices, options = DeviceSettings.from_env(env := environment(os.environ)), PipelineOptions.from_env(env)  # read once
        dm = DeviceManager(options=devices.options_for(args.device, args.dtype))
        pipeline = ImagePipeline.from_pretrained(args.model, dm, options)  # MODEL_ID, MAX_BATCH...
        flat["loras"] = load_outside(pipeline, flat.get("loras", {}))
        request = GenerationRequest.parse(nest(flat))  # the model's defaults fill the rest (generate)
        bar = tqdm(total=1, unit="step", desc="denoising")

        def progress(step: int, total: int, _image: int) -> None:
            bar.total = total
            bar.n = step
            bar.refresh()

        result = pipeline.generate(request, progress=progress)
        bar.close()
    except RequestError as exc:
        print(f"error: {flag_message(exc)}", file=sys.stderr)
        return 2
    except (PipelineError, ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = save_images(result, Path(args.out).parent if result.clips and Path(args.out).suffix else args.out)
    paths += save_clips(result, args.out) if result.clips else []
    t = result.timings
    made = f"{len(result.clips)} clip(s) of {len(result.clips[0])} frames" if result.clips else f"{len(result.images)} image(s)"
    print(
        f"{made} in {t['total']:.2f} s ({t['steps_per_second']:.1f} it/s), "
        f"peak memory {human_bytes(result.peak_memory)}, {result.device} {result.dtype} {result.attention}, "
        f"seeds {result.seeds[0]}..{result.seeds[-1]} -> {Path(args.out)}/"
        + (f" | warnings: {'; '.join(result.warnings)}" if result.warnings else "")
    )
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
