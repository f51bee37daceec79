"""Inpaint speed: a 4-image inpaint vs a 4-image text-to-image at the same steps, in one run.

    python -m benchmarks.inpaint_speed [--images 4] [--steps N] [--repeats 7] [--threads N] [--json PATH]

The inpaint repaints a centred box (half the side) of an image the model drew, at the app's
defaults (`DEFAULT_STRENGTH`, `Inpaint`'s defaults: mask blur 4, original content, whole picture).
After a warm-up of each, the two alternate (order reversed every round); prints the median time
of each and inpaint / text-to-image (goal: <= 1.5x).
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch
from PIL import Image, ImageDraw

from benchmarks.measure import alternate, summary
from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline
from pipelines.schema.inpaint import DEFAULT_STRENGTH, Inpaint

PROMPT = "a red circle on a blue background"


def centre_mask(size: tuple[int, int]) -> Image.Image:
    """A white box over the middle half of each side."""
    w, h = size
    mask = Image.new("L", size, 0)
    ImageDraw.Draw(mask).rectangle([w // 4, h // 4, w - w // 4 - 1, h - h // 4 - 1], fill=255)
    return mask


def main(argv: list[str] | None = None) -> dict:
    from pipelines.run.options import DEFAULT_MODEL

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=str(DEFAULT_MODEL))
    parser.add_argument("--device", default=None)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--steps", type=int, default=None, help="denoising steps (default: the model's)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    from pipelines.weights.loading import quiet_load_progress_bars

    quiet_load_progress_bars()
    if args.threads:
        torch.set_num_threads(args.threads)
    dm = DeviceManager(args.device)
    pipe = ImagePipeline.from_pretrained(args.model, dm)
    steps = args.steps or int(pipe.vocabulary.get("default_steps", 20))
    text = GenerationRequest(prompt=PROMPT, num_images=args.images, steps=steps, seed=1)
    source = pipe.generate(text).images[0]  # warm-up of text-to-image, and the picture to inpaint
    inpaint = GenerationRequest(
        prompt="a yellow square on a blue background", init_images=[source], num_images=args.images,
        steps=steps, seed=1, strength=DEFAULT_STRENGTH, inpaint=Inpaint(mask=centre_mask(source.size)),
    )  # fmt: skip
    pipe.generate(inpaint)  # warm-up: builds the inpainting twin
    times = alternate(dm, {"text-to-image": lambda: pipe.generate(text), "inpaint": lambda: pipe.generate(inpaint)},
                      args.repeats)  # fmt: skip
    t2i, inp = statistics.median(times["text-to-image"]), statistics.median(times["inpaint"])
    report = {
        "device": str(dm.device),
        "threads": torch.get_num_threads(),
        "model": args.model,
        "images": args.images,
        "steps": steps,
        "size": list(source.size),
        "repeats": args.repeats,
        "text_to_image_s": summary(times["text-to-image"]),
        "inpaint_s": summary(times["inpaint"]),
        "ratio": inp / t2i,
    }
    print(f"{args.images} images, {steps} steps, {report['threads']} threads, {args.repeats} repeats (median)")
    print(f"text-to-image: {t2i:.3f} s")
    print(f"inpaint:       {inp:.3f} s")
    print(f"inpaint / text-to-image: {report['ratio']:.2f}x")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=2)
    return report


if __name__ == "__main__":
    main()
