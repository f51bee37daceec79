"""Prompt-adherence evaluation of the embedded model (and of its outline LoRA).

    python -m models.eval --n 200                    # random prompts and seeds, default steps
    python -m models.eval --n 200 --lora outline     # the LoRA: are shapes drawn as outlines?
    python -m models.eval --grid models/tiny-shapes/samples.png
    python -m models.eval --edit --n 200             # the instruction editor (models/eval_edit.py)
    python -m models.eval --inpaint --n 200          # inpainting (models/eval_inpaint.py)
    python -m models.eval --outpaint --n 100         # outpainting 64 -> 96 px (models/eval_inpaint.py)
    python -m models.eval --prompts --n 40           # A1111 weights, long prompts, editing (models/eval_prompts.py)
    python -m models.eval --upscale --n 100          # the embedded x2 upscaler against Lanczos (models/eval_hires.py)
    python -m models.eval --hires --n 64             # hires fix 64 -> 128 px against direct 128 (models/eval_hires.py)
    python -m models.eval --control --n 100          # the embedded ControlNet's placement and time (models/eval_control.py)
    python -m models.eval --ip-adapter --n 100       # the embedded IP-Adapter: the reference's colour carried (models/eval_ip_adapter.py)
    python -m models.eval --regions --n 60 [--method Latent|Attention|joined]   # regional prompts (models/eval_regions.py)
    python -m models.eval --detailer --n 60          # the detailer pass on small shapes (models/eval_regions.py)
    python -m models.eval --few-step --n 200         # tiny-shapes-fast at 4 steps against tiny-shapes at 20
    python -m models.eval --video --n 60             # the text-to-video model tiny-shapes-video (models/eval_video.py)

Each generated image is judged by models.scoring's classifier (no learned model), which is
100 % correct on the procedural training images themselves, so errors it reports are the model's.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path

from PIL import Image

from models.scoring import PALETTE_NAMES, classifier_self_check, classify, save_grid  # callers import classify here too
from models.train.world import SHAPES, prompt_for

MODEL_DIR = Path(__file__).resolve().parent / "tiny-shapes"
LORA_DIR = Path(__file__).resolve().parent / "loras"


def random_prompts(n: int, seed: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    items = []
    for _ in range(n):
        color = rng.choice(PALETTE_NAMES)
        background = rng.choice([c for c in PALETTE_NAMES if c != color])
        items.append((color, rng.choice(SHAPES), background))
    return items


def evaluate(
    pipeline,
    n: int = 200,
    seed: int = 0,
    steps: int | None = None,
    guidance: float | None = None,
    loras: dict[str, float] | None = None,
    batch: int = 8,
    sampler: str | None = None,
    size: tuple[int, int] | None = None,
) -> dict:
    """Generate `n` random (prompt, seed) pairs through our ImagePipeline and score them."""
    vocab = pipeline.vocabulary
    steps = steps or vocab.get("default_steps", 20)
    guidance = guidance if guidance is not None else vocab.get("default_guidance_scale", 4.0)
    wanted = random_prompts(n, seed)
    start = time.perf_counter()
    rows, images = _generate_rows(pipeline, wanted, seed, steps, guidance, loras or {}, batch, sampler, size)
    seconds = time.perf_counter() - start
    return {
        "n": n,
        "steps": steps,
        "guidance_scale": guidance,
        "loras": loras or {},
        "sampler": sampler or pipeline.model_info().scheduler,
        "size": list(size or (pipeline.model_info().default_width, pipeline.model_info().default_height)),
        **_rates(rows),
        "seconds_per_image": seconds / n,
        "rows": rows,
        "_images": images,
    }


def _generate_rows(
    pipeline,
    wanted: list[tuple[str, str, str]],
    seed: int,
    steps: int,
    guidance: float,
    loras: dict,
    batch: int,
    sampler: str | None = None,
    size: tuple[int, int] | None = None,
) -> tuple[list[dict], list[Image.Image]]:
    """The wanted scenes generated `batch` prompts per request (one seed drawn per request), each
    image classified: a row per image (prompt, seed, what the classifier saw, what was wanted)."""
    from pipelines import GenerationRequest

    seeds = random.Random(seed + 1)
    rows, images = [], []
    for i in range(0, len(wanted), batch):
        chunk = wanted[i : i + batch]
        result = pipeline.generate(
            GenerationRequest(
                prompt=[prompt_for(*w) for w in chunk],
                num_images=1,
                steps=steps,
                guidance_scale=guidance,
                seed=seeds.randrange(2**31 - 64),
                loras=loras,
                sampler=sampler,
                width=size[0] if size else None,
                height=size[1] if size else None,
            )
        )
        for (color, shape, background), image, s in zip(chunk, result.images, result.seeds, strict=True):
            c = classify(image)
            rows.append(
                {
                    "prompt": prompt_for(color, shape, background),
                    "seed": s,
                    **asdict(c),
                    "want": {"color": color, "shape": shape, "background": background},
                }
            )
            images.append(image)
    return rows, images


def _rates(rows: list[dict]) -> dict[str, float]:
    """Share of the rows right on each attribute, on all three at once, and drawn as outlines."""

    def rate(test) -> float:
        return sum(1 for r in rows if test(r)) / len(rows)

    return {
        "foreground_color": rate(lambda r: r["color"] == r["want"]["color"]),
        "background_color": rate(lambda r: r["background"] == r["want"]["background"]),
        "shape": rate(lambda r: r["shape"] == r["want"]["shape"]),
        "all_three": rate(lambda r: (r["color"], r["shape"], r["background"]) == tuple(r["want"].values())),
        "outline": rate(lambda r: r["outline"]),
    }


def run_few_step(args: argparse.Namespace) -> dict:
    """The embedded few-step model (the tiny-shapes-fast recipe: LCM-LoRA, 4 steps, guidance off) against
    tiny-shapes at its defaults (20 steps, guidance 4) on the same prompts and seeds: adherence and the ratio
    of each rate, seconds per image (batches of 8 here; end to end through the API: benchmarks)."""
    from devices import DeviceManager
    from pipelines import ImagePipeline
    from pipelines.run.options import PipelineOptions

    options = PipelineOptions(runtime=args.runtime or "auto", lora_dir=LORA_DIR)
    report = {}
    for name in ("tiny-shapes", "tiny-shapes-fast"):
        pipeline = ImagePipeline.from_pretrained(name if name != "tiny-shapes" else str(MODEL_DIR), DeviceManager(), options)
        evaluate(pipeline, 8, args.seed + 99)  # warm-up (OpenVINO reads or converts its graphs)
        row = evaluate(pipeline, args.n, args.seed)
        row.pop("_images")
        report[name] = {k: v for k, v in row.items() if k != "rows"}
        print(f"{name}: {row['steps']} steps, CFG {row['guidance_scale']}, sampler {pipeline.scheduler_name}, "
              f"runtime {pipeline.runtime_plan.name}")  # fmt: skip
        for key in ("foreground_color", "background_color", "shape", "all_three"):
            print(f"  {key:<17} {row[key] * 100:5.1f} %")
        print(f"  {'seconds/image':<17} {row['seconds_per_image']:.3f}")
    slow, fast = report["tiny-shapes"], report["tiny-shapes-fast"]
    report["all_three_ratio"] = fast["all_three"] / slow["all_three"]
    report["speedup"] = slow["seconds_per_image"] / fast["seconds_per_image"]
    print(f"fast / 20-step: all three {report['all_three_ratio']:.3f} of the 20-step model's (goal >= 0.95), "
          f"{report['speedup']:.2f}x faster per image (batches of 8)")  # fmt: skip
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m models.eval", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="default", help="model folder (default: tiny-shapes, or the editor)")
    parser.add_argument("--n", type=int, default=200, help="number of random (prompt, seed) pairs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=None)
    parser.add_argument("--guidance", type=float, default=None)
    parser.add_argument("--width", type=int, default=None, help="image width (default: the model's)")
    parser.add_argument("--height", type=int, default=None, help="image height (default: the model's)")
    parser.add_argument("--sampler", default=None, help="a sampler by its A1111 name (default: the model's own)")
    parser.add_argument("--lora", default=None, help="LoRA name in models/loras (scale --lora-scale)")
    parser.add_argument("--lora-scale", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--edit", action="store_true", help="evaluate the instruction editor (models/eval_edit.py)")
    parser.add_argument("--image-guidance", type=float, default=None, help="--edit: image guidance (model default)")
    parser.add_argument(
        "--guidance-end", type=float, default=None, help="--edit: share of the steps with guidance (model default)"
    )
    parser.add_argument("--inpaint", action="store_true", help="evaluate inpainting (models/eval_inpaint.py)")
    parser.add_argument("--outpaint", action="store_true", help="evaluate outpainting (models/eval_inpaint.py)")
    parser.add_argument("--prompts", action="store_true", help="A1111's prompt language (models/eval_prompts.py)")
    parser.add_argument("--upscale", action="store_true", help="the embedded upscaler's PSNR (models/eval_hires.py)")
    parser.add_argument("--hires", action="store_true", help="hires fix's adherence and time (models/eval_hires.py)")
    parser.add_argument("--control", action="store_true", help="the embedded ControlNet (models/eval_control.py)")
    parser.add_argument("--ip-adapter", action="store_true", help="the embedded IP-Adapter (models/eval_ip_adapter.py)")
    parser.add_argument("--regions", action="store_true", help="regional prompts, two columns (models/eval_regions.py)")
    parser.add_argument("--detailer", action="store_true", help="the detailer pass on small shapes (models/eval_regions.py)")
    parser.add_argument("--few-step", action="store_true", help="tiny-shapes-fast (4 steps) against tiny-shapes (20)")
    parser.add_argument("--video", action="store_true", help="the text-to-video model (models/eval_video.py)")
    parser.add_argument("--method", default=None, help="--regions: Latent (default), Attention, or joined (one prompt)")
    parser.add_argument("--padding", type=int, default=None, help="--detailer: the pass's only-masked padding (its default)")
    parser.add_argument("--runtime", default=None, help="--regions/--detailer/--few-step: RUNTIME (torch, openvino; default: auto)")
    parser.add_argument("--upscalers", default="Lanczos,shapes-compact-x2,Latent", help="--hires: the upscalers compared")
    parser.add_argument("--strength", type=float, default=None, help="--inpaint/--outpaint: (DEFAULT_STRENGTH); --hires: 0.3; --detailer: the pass's")
    parser.add_argument("--masked-content", default=None, help="--inpaint/--outpaint: original or fill")
    parser.add_argument("--inpaint-area", default=None, help='--inpaint/--outpaint: "whole picture" or "only masked"')
    parser.add_argument("--mask-blur", type=int, default=None, help="--inpaint/--outpaint: pixels (Inpaint's default)")
    parser.add_argument("--extend", default=None, help="--outpaint: e.g. right=32 (default: right 32, left+right 16)")
    parser.add_argument("--json", default=None, help="write the figures (and per-image rows) here")
    parser.add_argument("--grid", default=None, help="save a labelled grid of the first 48 images here")
    return parser


def special_evaluation(args: argparse.Namespace):
    """The evaluation another module runs for a mode flag (--edit, --hires, --few-step, --video...), or None."""
    special = (args.edit, args.inpaint, args.outpaint, args.prompts, args.upscale, args.hires, args.control,
               args.ip_adapter, args.regions, args.detailer, args.few_step, args.video)  # fmt: skip
    if not any(special):
        return None
    if args.few_step:
        run = run_few_step
    elif args.video:
        from models.eval_video import run_video as run
    elif args.regions or args.detailer:
        from models.eval_regions import run_detailer, run_regions

        run = run_regions if args.regions else run_detailer
    elif args.control:
        from models.eval_control import run_control as run
    elif args.ip_adapter:
        from models.eval_ip_adapter import run_ip_adapter as run
    elif args.upscale or args.hires:
        from models.eval_hires import run_hires, run_upscale

        run = run_upscale if args.upscale else run_hires
    elif args.prompts:
        from models.eval_prompts import run
    elif args.edit:
        from models.eval_edit import run
    else:
        from models.eval_inpaint import run
    return run


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from pipelines.weights.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    import torch

    from devices import DeviceManager
    from pipelines import ImagePipeline

    if args.threads:
        torch.set_num_threads(args.threads)
    run = special_evaluation(args)
    if run is not None:
        report = run(args)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
        return 0
    args.model = str(MODEL_DIR) if args.model == "default" else args.model
    pipeline = ImagePipeline.from_pretrained(args.model, DeviceManager(), lora_dir=LORA_DIR)
    loras = {args.lora: args.lora_scale} if args.lora else None
    print(f"classifier on training images: {classifier_self_check():.3f}")
    size = (args.width, args.height) if args.width or args.height else None
    report = evaluate(pipeline, args.n, args.seed, args.steps, args.guidance, loras, sampler=args.sampler, size=size)
    images = report.pop("_images")
    print(
        f"model {args.model}, {args.n} random prompts/seeds, {report['steps']} steps, CFG {report['guidance_scale']}"
        + (f", LoRA {loras}" if loras else "")
    )
    for key in ("foreground_color", "background_color", "shape", "all_three", "outline"):
        print(f"  {key:<17} {report[key] * 100:5.1f} %")
    print(f"  {'seconds/image':<17} {report['seconds_per_image']:.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    if args.grid:
        labels = [f"{r['want']['color']} {r['want']['shape'][:3]}/{r['want']['background']}" for r in report["rows"]]
        save_grid(images[:48], labels[:48], Path(args.grid))
        print(f"grid: {args.grid}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
