"""Model switch cost: seconds and memory before/after switching a device pool between two models.

    python -m benchmarks.switch_bench [--to tiny|medium|FOLDER] [--rounds 3] [--json PATH]

Starts a pool on the embedded model, switches to `--to` and back, `--rounds` times, and prints
per switch the seconds and the process's resident memory (RSS) before, right after the load, and
after one 1-step image (safetensors maps the weights lazily: they become resident when they run). `tiny` is a
random 32x32 SD model (1 MB); `medium` the same with a 1.1 GB UNet, so that the memory the old
model frees is visible above the process's own ~0.8 GB of libraries.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from devices.memory import host_memory
from pipelines.run.options import DEFAULT_MODEL
from pipelines.schema.request import GenerationRequest
from serving.pool import DevicePool


def rss_mib() -> float:
    return round(host_memory()["host_rss"] / 2**20, 1)


def save_random_sd(path: Path, medium: bool) -> Path:
    """tests.tiny_model's pipeline; `medium` swaps in a ~290 M-parameter UNet (fp32: ~1.1 GB)."""
    from diffusers import UNet2DConditionModel

    from tests.tiny_model import build_tiny_pipeline

    pipe = build_tiny_pipeline()
    if medium:
        pipe.unet = UNet2DConditionModel(
            sample_size=16, layers_per_block=2, block_out_channels=(256, 512, 1024), cross_attention_dim=32,
            down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"), attention_head_dim=8,
        )  # fmt: skip
    pipe.save_pretrained(path, safe_serialization=True)
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--to", default="tiny", help="tiny | medium (random SD folders built here) | a model folder")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        other = args.to
        if other in ("tiny", "medium"):
            other = str(save_random_sd(Path(tmp) / f"{other}-sd", medium=other == "medium"))
        pool = DevicePool.from_pretrained(str(DEFAULT_MODEL), devices=args.device, memory_mode="off")
        rows = []
        for _ in range(args.rounds):
            for target in (other, str(DEFAULT_MODEL)):
                before = rss_mib()
                start = time.perf_counter()
                info = pool.load_model(target)
                seconds = round(time.perf_counter() - start, 3)
                after_load = rss_mib()
                pool.generate(GenerationRequest(prompt="a red circle on a blue background", steps=1, seed=0))
                rows.append({"to": info.model_name, "seconds": seconds, "rss_before_mib": before,
                             "rss_after_load_mib": after_load, "rss_after_first_image_mib": rss_mib()})  # fmt: skip
                print(json.dumps(rows[-1]))
    summary = {
        name: statistics.median(r["seconds"] for r in rows if r["to"] == name) for name in {r["to"] for r in rows}
    }
    print("median seconds per switch:", json.dumps(summary))
    if args.json:
        Path(args.json).write_text(json.dumps({"switches": rows, "median_seconds": summary}, indent=2))


if __name__ == "__main__":
    main()
