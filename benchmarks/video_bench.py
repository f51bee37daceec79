"""Video figures through the app's request path (`ImagePipeline.generate` with num_frames), one run, ratios printed.

    python -m benchmarks.video_bench [--runs 5] [--json benchmarks/results-video-cpu-2core.json]

- the embedded tiny-shapes-video: seconds per 17-frame clip (text-to-video and image-to-video), 20 steps;
- the tiny Wan of tests/families.py and the embedded model, 17 frames, 28 steps: plain against FirstBlockCache;
- peak RSS of a 17-frame tiny-Wan clip at 512x512 with the VAE's decode whole against tiled (TILED_VAE_PIXELS),
  each in a fresh process (ru_maxrss is a process's high-water mark).
Medians and the spread (min..max) of `--runs` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle moving left on a blue background"


def _timed(pipe, request, runs: int) -> dict:
    pipe.generate(request)  # warm
    times = []
    for _ in range(runs):
        began = time.perf_counter()
        pipe.generate(request)
        times.append(time.perf_counter() - began)
    return {"median_s": round(statistics.median(times), 3), "min_s": round(min(times), 3), "max_s": round(max(times), 3)}


def embedded(runs: int) -> dict:
    from devices import DeviceManager
    from pipelines import GenerationRequest, ImagePipeline

    pipe = ImagePipeline.from_pretrained(ROOT / "models" / "tiny-shapes-video", device_manager=DeviceManager("cpu"))
    first = pipe.generate(GenerationRequest(PROMPT, num_frames=17, seed=0)).clips[0][0]
    return {
        "text_to_video": _timed(pipe, GenerationRequest(PROMPT, num_frames=17, seed=1), runs),
        "image_to_video": _timed(pipe, GenerationRequest(PROMPT, num_frames=17, seed=1, init_images=[first]), runs),
    }


def step_cache(runs: int, root: Path) -> dict:
    """FirstBlockCache at 28 steps, 17 frames, 64x64: on the tiny random Wan (2 blocks) and on the embedded model (6)."""
    from devices import DeviceManager
    from pipelines import GenerationRequest, ImagePipeline
    from tests import families

    out = {}
    for name, path in (("tiny_wan", families.build_video("wan", root / "wan")), ("embedded", ROOT / "models" / "tiny-shapes-video")):
        pipe = ImagePipeline.from_pretrained(path, device_manager=DeviceManager("cpu"), memory_mode="off")
        base = dict(num_frames=17, width=64, height=64, steps=28, seed=0)
        plain = _timed(pipe, GenerationRequest(PROMPT, **base), runs)
        cached = _timed(pipe, GenerationRequest(PROMPT, step_cache="FirstBlockCache", **base), runs)
        out[name] = {"plain": plain, "FirstBlockCache": cached, "speedup": round(plain["median_s"] / cached["median_s"], 2)}
    return out


RSS_CODE = """
import resource, sys
from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline
pipe = ImagePipeline.from_pretrained(sys.argv[1], device_manager=DeviceManager("cpu"), memory_mode="off",
                                     tiled_vae_pixels=int(sys.argv[2]))
result = pipe.generate(GenerationRequest("a red circle", num_frames=17, width=512, height=512, steps=2, seed=0))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, int(result.vae_tiling))
"""


def tiled_rss(root: Path) -> dict:
    from tests import families

    path = families.build_video("wan", root / "wan")
    out = {}
    for label, threshold in (("whole", 10**9), ("tiled", 1)):
        run = subprocess.run([sys.executable, "-c", RSS_CODE, str(path), str(threshold)], cwd=ROOT, capture_output=True,
                             text=True, check=True)  # fmt: skip
        rss, tiled = run.stdout.split()[-2:]
        out[label] = {"peak_rss_mib": round(int(rss) / 2**20, 1), "tiled": tiled == "1"}
    out["ratio"] = round(out["tiled"]["peak_rss_mib"] / out["whole"]["peak_rss_mib"], 2)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        report = {"embedded": embedded(args.runs), "step_cache": step_cache(args.runs, Path(tmp)), "tiled_vae": tiled_rss(Path(tmp))}
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
