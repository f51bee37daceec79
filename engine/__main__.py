"""`python -m engine "a prompt" ...`: the app's backend from the command line.

    python -m engine "a red circle on a blue background" --num-images 4 --seed 7 --out outputs/
    python -m engine "change the background to black" --init-image in.png      # the Edit tab's model
    python -m engine "a red square on a white background" --init-image in.png --mask mask.png   # inpaint
    python -m engine "a white background" --init-image in.png --outpaint 0,0,32,0   # extend 32 px right
    python -m engine "a red circle moving left on a blue background" --frames 17 --out clip.mp4   # the Video tab's model
    PREFERRED_DEVICE=cpu CPU_REPLICAS=2 python -m engine "a red circle on a blue background" -n 8

The same settings, backend and engine as `python app.py` (`AppSettings.from_env`, `build_engine`):
the device pool or Ray, the embedded editor beside the embedded model, the same limits and
defaults. Every request field is a flag (`pipelines.schema.cli`, from the request schema; `--help` lists
them with what each accepts). (`python -m pipelines` drives one pipeline on one device directly,
for porting a model.)
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from config import environment
from pipelines import ModelInfo, PipelineError, extend_canvas, save_clips, save_images
from pipelines.schema.cli import add_request_arguments, flag_message, request_values
from pipelines.schema.fields import TASKS, RequestError, Spec
from pipelines.schema.inpaint import MAX_EXTEND

from . import AppSettings, Progress, SettingsError, build_engine
from .inputs import Limits, read
from .jobs import Engine, Finished


def build_parser() -> tuple[argparse.ArgumentParser, list[Spec]]:
    p = argparse.ArgumentParser(prog="python -m engine", description="Generate with the app's backend.")
    added = add_request_arguments(p, TASKS)
    p.add_argument(
        "--out", default="outputs",
        help="output folder (default: outputs/); with --frames, a clip file too: clip.mp4 (H.264), .webp, .gif, .zip (PNG frames)",
    )  # fmt: skip
    p.add_argument("--model", default=None, help="default: $MODEL_ID")
    p.add_argument("--device", default=None, help="default: $PREFERRED_DEVICE")
    g = p.add_argument_group("outpaint and inpaint shorthands (with --init-image; pipelines.imaging.inpaint)")
    g.add_argument(
        "--outpaint", default=None, metavar="L,U,R,D", help=f"extend the canvas by these pixels (0..{MAX_EXTEND})"
    )
    g.add_argument(
        "--only-masked", default=None, metavar="PADDING", help="= --inpaint-area 'only masked' --padding PADDING"
    )
    return p, added


def outpaint(args: argparse.Namespace, flat: dict[str, Any], step: int) -> None:
    """--outpaint L,U,R,D: each input image's canvas grown, the new border as the mask (an inpaint)."""
    if not args.outpaint:
        return
    try:
        left, up, right, down = (int(v) for v in args.outpaint.split(","))
    except ValueError:
        raise RequestError((), f"--outpaint: expected L,U,R,D pixel counts, got {args.outpaint!r}") from None
    if not flat.get("init_images"):
        raise RequestError("init_images", "--outpaint needs --init-image")
    grown = [extend_canvas(image, left, up, right, down, step) for image in flat["init_images"]]
    flat.update(init_images=[canvas for canvas, _ in grown], mask=grown[0][1], invert_mask=False)


def request_from(args: argparse.Namespace, added: list[Spec], limits: Limits):
    """The request of the flags, checked as every front end's is (`engine.inputs.read`); the model's
    defaults fill what is unset when the engine takes it."""
    flat = request_values(args, added)
    outpaint(args, flat, limits.model.size_multiple)
    if args.only_masked is not None:
        flat.update(inpaint_area="only masked", padding=args.only_masked)
    task = "inpaint" if flat.get("mask") is not None else ("img2img" if flat.get("init_images") else "txt2img")
    return read(flat, limits.for_task(task))


def run(engine: Engine, request: Any):
    """Submit and follow the job with a progress bar; the result."""
    bar = tqdm(total=1, unit="step", desc="denoising")
    try:
        for event in engine.submit(request).events():
            if isinstance(event, Progress):
                bar.set_description(event.note or "denoising")  # an OpenVINO conversion inside the request
                bar.total, bar.n = event.total or bar.total, event.step
                bar.refresh()
            elif isinstance(event, Finished):
                return event.result
    finally:
        bar.close()
    raise AssertionError("unreachable: events() ends with Finished or raises")


def main(argv: list[str] | None = None) -> int:
    parser, added = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        settings = AppSettings.from_env(environment(os.environ))
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    engine = None
    try:
        engine = build_engine(settings, model=args.model, devices=args.device)
        info: ModelInfo = engine.model_info()
        result = run(engine, request_from(args, added, Limits.of(settings, info)))
    except RequestError as exc:
        print(f"error: {flag_message(exc)}", file=sys.stderr)
        return 2
    except (PipelineError, ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        if engine is not None:
            engine.close()
    paths = save_images(result, Path(args.out).parent if result.clips and Path(args.out).suffix else args.out)
    paths += save_clips(result, args.out) if result.clips else []
    print(f"{len(paths)} image(s), seeds {result.seeds}, on {result.device} -> {Path(args.out)}/")
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
