"""`python -m engine "a prompt" ...`: the app's backend from the command line.

    python -m engine "a red circle on a blue background" --num-images 4 --seed 7 --out outputs/
    python -m engine "change the background to black" --init-image in.png      # the Edit tab's model
    python -m engine "a red square on a white background" --init-image in.png --mask mask.png   # inpaint
    python -m engine "a white background" --init-image in.png --outpaint 0,0,32,0   # extend 32 px right
    PREFERRED_DEVICE=cpu CPU_REPLICAS=2 python -m engine "a red circle on a blue background" -n 8

The same settings, backend and engine as `python app.py` (`AppSettings.from_env`, `build_engine`):
the device pool or Ray, the embedded editor beside the embedded model, the same limits and
defaults. (`python -m pipelines` drives one pipeline on one device directly, for porting a model.)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from tqdm import tqdm

from pipelines import GenerationRequest, PipelineError, save_images
from pipelines.backend import ModelInfo
from pipelines.inpaint import DEFAULT_STRENGTH, MASKED_CONTENT, Inpaint, extend_canvas
from pipelines.request import DEFAULTS

from . import AppSettings, Progress, SettingsError, build_engine
from .jobs import Engine, Finished


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine", description="Generate with the app's backend.")
    p.add_argument("prompt", nargs="+", help="one or more prompts (or edit instructions with --init-image)")
    p.add_argument("-n", "--num-images", type=int, default=1, help="images per prompt (and per input image)")
    p.add_argument("--negative", default=None, help="negative prompt")
    p.add_argument("--init-image", action="append", default=[], metavar="FILE", help="edit these images")
    p.add_argument("--seed", type=int, default=None, help="0..2^64-1; image k gets seed + k (default: random)")
    p.add_argument("--steps", type=int, default=None, help="default: the model's")
    p.add_argument("--guidance", type=float, default=None, help="default: the model's")
    p.add_argument("--lora", action="append", default=[], metavar="NAME:SCALE", help="a LoRA of LORA_DIR")
    p.add_argument("--out", default="outputs", help="output folder (default: outputs/)")
    p.add_argument("--model", default=None, help="default: $MODEL_ID")
    p.add_argument("--device", default=None, help="default: $PREFERRED_DEVICE")
    p.add_argument("--strength", type=float, default=None, help="denoising strength (default: 1.0 to inpaint)")
    g = p.add_argument_group("inpaint / outpaint (with --init-image; pipelines.inpaint)")
    g.add_argument("--mask", default=None, metavar="FILE", help="white = repaint; the input image's size")
    g.add_argument("--outpaint", default=None, metavar="L,U,R,D", help="extend the canvas by these pixels")
    g.add_argument("--mask-blur", type=int, default=4)
    g.add_argument("--masked-content", default="original", choices=MASKED_CONTENT)
    g.add_argument("--only-masked", type=int, default=None, metavar="PADDING", help="render only the masked box")
    g.add_argument("--invert-mask", action="store_true")
    return p


def inpaint_from(args: argparse.Namespace, images: list, step: int) -> tuple[list, Inpaint | None]:
    """The input images and the Inpaint of --mask / --outpaint (the canvas grown), or none."""
    from PIL import Image

    if args.outpaint:
        left, up, right, down = (int(v) for v in args.outpaint.split(","))
        grown = [extend_canvas(image, left, up, right, down, step) for image in images]
        images, mask = [canvas for canvas, _ in grown], grown[0][1]
    elif args.mask:
        mask = Image.open(args.mask)
    else:
        return images, None
    area = "whole picture" if args.only_masked is None else "only masked"
    padding = 32 if args.only_masked is None else args.only_masked
    spec = Inpaint(mask, args.mask_blur, args.masked_content, area, padding, args.invert_mask)
    return images, spec


def request_from(args: argparse.Namespace, info: ModelInfo) -> GenerationRequest:
    """The request, with the model's defaults (the editor's for an edit) where an option is unset."""
    from PIL import Image

    images = [Image.open(f).convert("RGB") for f in args.init_image] or None
    images, inpaint = inpaint_from(args, images, info.size_multiple) if images else (images, None)
    model = info.for_edits if images and inpaint is None else info
    strength = DEFAULT_STRENGTH if inpaint is not None else DEFAULTS.strength
    loras = {name: float(scale or 1.0) for name, _, scale in (item.partition(":") for item in args.lora)}
    return GenerationRequest(
        prompt=args.prompt if len(args.prompt) > 1 else args.prompt[0],
        negative_prompt=args.negative,
        num_images=args.num_images,
        steps=model.default_steps if args.steps is None else args.steps,
        guidance_scale=model.default_guidance if args.guidance is None else args.guidance,
        seed=args.seed,
        init_images=images,
        image_guidance_scale=model.default_image_guidance,
        loras=loras,
        strength=strength if args.strength is None else args.strength,
        inpaint=inpaint,
    )


def run(engine: Engine, request: GenerationRequest):
    """Submit and follow the job with a progress bar; the result."""
    bar = tqdm(total=1, unit="step", desc="denoising")
    try:
        for event in engine.submit(request).events():
            if isinstance(event, Progress):
                bar.total, bar.n = event.total, event.step
                bar.refresh()
            elif isinstance(event, Finished):
                return event.result
    finally:
        bar.close()
    raise AssertionError("unreachable: events() ends with Finished or raises")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = AppSettings.from_env(os.environ)
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = None
    try:
        engine = build_engine(settings, model=args.model, devices=args.device)
        result = run(engine, request_from(args, engine.model_info()))
    except (PipelineError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if engine is not None:
            engine.close()
    paths = save_images(result, args.out)
    print(f"{len(paths)} image(s), seeds {result.seeds}, on {result.device} -> {Path(args.out)}/")
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
