"""Command line: `python -m pipelines "a prompt" --num-images 4 --out outputs/`.

    python -m pipelines "a red circle on a blue background" --num-images 4 --out outputs/ \\
        [--model PATH_OR_ID] [--lora FILE:SCALE ...] [--init-image FILE ...] [--seed N] [--steps N]

Prints a tqdm bar per denoising step and one summary line; PNGs keep their metadata.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from tqdm import tqdm

from devices import DeviceManager
from devices.memory import human_bytes
from devices.options import DeviceSettings

from .errors import PipelineError
from .image_pipeline import ImagePipeline
from .metadata import save_images
from .options import PipelineOptions
from .request import GenerationRequest


def parse_lora(value: str) -> tuple[str, float]:
    path, _, scale = value.rpartition(":")
    if not path:  # no ":SCALE" part
        return value, 1.0
    try:
        return path, float(scale)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--lora {value!r}: expected FILE:SCALE, e.g. outline.safetensors:0.8"
        ) from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pipelines", description="Generate images with Diffusion Anywhere.")
    p.add_argument("prompt", nargs="+", help="one or more prompts")
    p.add_argument("--negative", default=None, help="negative prompt")
    p.add_argument("--num-images", type=int, default=1, help="images per prompt (and per input image)")
    p.add_argument("--out", default="outputs", help="output folder (default: outputs/)")
    p.add_argument("--model", default=None, help="diffusers folder, Hub id or .safetensors (default: $MODEL_ID)")
    p.add_argument("--lora", action="append", type=parse_lora, default=[], metavar="FILE:SCALE")
    p.add_argument("--init-image", action="append", default=[], metavar="FILE", help="image-to-image input(s)")
    p.add_argument("--strength", type=float, default=0.6)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    p.add_argument("--guidance", type=float, default=None, help="CFG scale (default: the model's)")
    p.add_argument("--image-guidance", type=float, default=None, help="instruction editors (default: the model's)")
    p.add_argument("--guidance-end", type=float, default=None, help="share of the steps with guidance (the model's)")
    p.add_argument("--width", type=int, default=None)
    p.add_argument("--height", type=int, default=None)
    p.add_argument("--device", default=None, help="auto|cpu|cuda[:N]|rocm|npu[:N]|xpu[:N]|mps")
    p.add_argument("--dtype", default=None, help="float32|float16|bfloat16")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from pipelines.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    from PIL import Image

    try:
        devices, options = DeviceSettings.from_env(os.environ), PipelineOptions.from_env(os.environ)  # read once
        dm = DeviceManager(options=devices.options_for(args.device, args.dtype))
        pipeline = ImagePipeline.from_pretrained(args.model, dm, options)  # MODEL_ID, MAX_BATCH...
        loras = {}
        for path, scale in args.lora:
            loras[pipeline.load_lora(path, allow_outside=True)] = scale
        info = pipeline.model_info()  # the same defaults the app shows
        request = GenerationRequest(
            prompt=args.prompt if len(args.prompt) > 1 else args.prompt[0],
            negative_prompt=args.negative,
            num_images=args.num_images,
            steps=args.steps if args.steps is not None else info.default_steps,
            guidance_scale=args.guidance if args.guidance is not None else info.default_guidance,
            width=args.width,
            height=args.height,
            seed=args.seed,
            init_images=[Image.open(f).convert("RGB") for f in args.init_image] or None,
            strength=args.strength,
            image_guidance_scale=args.image_guidance
            if args.image_guidance is not None
            else info.default_image_guidance,
            guidance_end=args.guidance_end,
            loras=loras,
        )
        bar = tqdm(total=1, unit="step", desc="denoising")

        def progress(step: int, total: int, _image: int) -> None:
            bar.total = total
            bar.n = step
            bar.refresh()

        result = pipeline.generate(request, progress=progress)
        bar.close()
    except (PipelineError, ValueError, RuntimeError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    paths = save_images(result, args.out)
    t = result.timings
    print(
        f"{len(result.images)} image(s) in {t['total']:.2f} s ({t['steps_per_second']:.1f} it/s), "
        f"peak memory {human_bytes(result.peak_memory)}, {result.device} {result.dtype} {result.attention}, "
        f"seeds {result.seeds[0]}..{result.seeds[-1]} -> {Path(args.out)}/"
        + (f" | warnings: {'; '.join(result.warnings)}" if result.warnings else "")
    )
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
