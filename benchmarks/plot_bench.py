"""An X/Y/Z plot spread over the device pool: a 3x3 grid on one replica against two, in one run.

    python -m benchmarks.plot_bench [--runtime torch|openvino|auto] [--steps 20] [--images 1] [--repeats 3] [--json PATH]

The same 9 cells (Seed x CFG Scale, engine.plots) run through an Engine over a pool of one CPU
replica, one of two (`DevicePool`, each replica given its share of the cores) and one of two replicas
in processes of their own (REPLICA_PROCESSES), alternated; the median wall time of each and its ratio
to one replica's is printed. A cell is an ordinary request, so two replicas run two cells at once.
"""

from __future__ import annotations

import json

from benchmarks.measure import alternate, ratios, variants_parser
from devices import DeviceManager
from devices.options import DeviceSettings
from engine import Engine
from engine.axes import axis_types, find_axis
from engine.plots import Axis, PlotOptions, plot_cells, run_script
from pipelines import GenerationRequest, PipelineOptions
from pipelines.run.options import DEFAULT_MODEL
from serving.parallel import process_pool
from serving.pool import DevicePool


def main(argv: list[str] | None = None) -> None:
    parser = variants_parser(__doc__.splitlines()[0])
    parser.set_defaults(images=1, repeats=3)
    parser.add_argument("--runtime", default="auto", help="RUNTIME of every pool: torch, openvino or auto")
    args = parser.parse_args(argv)
    model = str(args.model or DEFAULT_MODEL)
    types = axis_types("txt2img")
    base = GenerationRequest(prompt="a red circle on a blue background", num_images=args.images, steps=args.steps, seed=1)
    axes = [Axis.of(find_axis(types, "Seed"), "1-3"), Axis.of(find_axis(types, "CFG Scale"), "3, 5, 7")]
    cells, layout = plot_cells(base, axes, PlotOptions())
    options = PipelineOptions().updated(model_id=model, runtime=args.runtime)
    pools = {"1 replica": DevicePool.from_pretrained(model, "cpu", options),
             "2 replicas": DevicePool.from_pretrained(model, "cpu,cpu", options),
             "2 processes": process_pool(model, options, DeviceSettings(), "cpu,cpu")}  # fmt: skip
    runs = {name: (lambda pool=pool: run_script(Engine(pool), cells, layout)) for name, pool in pools.items()}
    for run in runs.values():
        run()  # warm-up
    report = ratios(alternate(DeviceManager("cpu"), runs, args.repeats), "1 replica", width=10)
    for pool in pools.values():
        pool.close()
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"cells": len(cells), "steps": args.steps, "images": args.images, **report}, f, indent=2)


if __name__ == "__main__":
    main()
