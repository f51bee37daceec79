"""What A1111's prompt language costs: a weighted, a long and an edited prompt against the plain one,
in one run (pipelines.prompts.plan).

    python -m benchmarks.prompt_bench [--steps 20] [--images 4] [--repeats 7] [--json PATH]

Alternates the variants (order reversed every round) and prints the median time of each and its
ratio to the plain prompt. A plain prompt is untouched (the pipeline encodes it); a weighted one is
encoded here once per call; a long one in two windows; an edited one again at its switch step.
"""

from __future__ import annotations

import json

import torch

from benchmarks.measure import alternate, ratios, variants_parser
from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline

PLAIN = "a red circle on a blue background"
VARIANTS = {
    "plain": PLAIN,
    "weighted": "a (red:1.3) circle on a [blue] background",
    "long (2 windows)": "a circle on a background, a circle on a background, " + PLAIN,
    "edited [a:b:0.5]": "a [red:yellow:0.5] circle on a blue background",
}


def main(argv: list[str] | None = None) -> None:
    args = variants_parser(__doc__.splitlines()[0]).parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dm = DeviceManager(args.device)
    pipe = ImagePipeline.from_pretrained(args.model, dm)

    def variant(prompt: str):
        request = GenerationRequest(prompt=prompt, num_images=args.images, steps=args.steps, seed=1)
        return lambda: pipe.generate(request)

    variants = {name: variant(prompt) for name, prompt in VARIANTS.items()}
    for run in variants.values():
        run()  # warm-up
    report = ratios(alternate(dm, variants, args.repeats), "plain", width=17)
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": str(dm.device), "threads": torch.get_num_threads(), "steps": args.steps,
                       "images": args.images, **report}, f, indent=2)  # fmt: skip


if __name__ == "__main__":
    main()
