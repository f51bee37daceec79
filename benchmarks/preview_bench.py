"""Live-preview overhead: generation time with previews every N steps vs none, in one run.

    python -m benchmarks.preview_bench [--every 1,2,5,10] [--repeats 7] [--json PATH]

Alternates the variants (order reversed every round) and prints the median time of each and
its ratio to no previews; PREVIEW_EVERY's default is the smallest N whose ratio stays <= 1.10.
"""

from __future__ import annotations

import json

import torch

from benchmarks.measure import alternate, ratios, variants_parser
from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline


def main(argv: list[str] | None = None) -> None:
    parser = variants_parser(__doc__.splitlines()[0])
    parser.add_argument("--every", default="1,2,5,10")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dm = DeviceManager(args.device)
    pipe = ImagePipeline.from_pretrained(args.model, dm)
    request = GenerationRequest(prompt="a red circle on a blue background", num_images=args.images,
                                steps=args.steps, seed=1)  # fmt: skip
    frames: list[int] = []

    def variant(every: int):
        def run():
            pipe.options = pipe.options.updated(preview_every=every or 1)
            hook = (lambda _first, images: frames.append(len(images))) if every else None
            return pipe.generate(request, preview=hook)

        return run

    variants = {"none": variant(0), **{f"every {n}": variant(int(n)) for n in args.every.split(",")}}
    pipe.generate(request)  # warm-up
    report = ratios(alternate(dm, variants, args.repeats), "none")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"device": str(dm.device), "threads": torch.get_num_threads(), **report}, f, indent=2)


if __name__ == "__main__":
    main()
