"""A video request's memory (pipelines.video.memory): the estimate against peak RSS measured on the tiny Wan, a
clip too large for a (simulated) small device refused before any model work with a frame count and a size the
same check accepts, and other memory plans named where they would fit."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline
from pipelines.run import checks
from pipelines.schema.fields import RequestError
from pipelines.video import memory
from tests import families

ROOT = Path(__file__).resolve().parent.parent
REFINER = ROOT / "models" / "refiners" / "tiny-shapes-motion"
MiB = 2**20
FACTOR = 1.5  # the estimate is within this factor of the measured peak (0.98-1.06 x on the 2-core CPU)
# the points measured: (frames, side); more frames and a larger size each grow the peak
POINTS = [(5, 96), (21, 96), (5, 128)]

# One process: the tiny Wan loaded, one warm-up clip, then each point's peak RSS over the RSS before it. glibc's
# mmap threshold is fixed at 64 KiB (MALLOC_MMAP_THRESHOLD_, below) so freed blocks leave the resident set, and the
# kernel's peak (VmHWM) restarts at each point through /proc/self/clear_refs; a kernel that keeps its old mark
# (devices.memory.reset_peak says so) cannot measure this, and the test is skipped there.
MEASURE = """
import json, sys
import torch
torch.set_num_threads(1)
from devices import DeviceManager, memory as device_memory
from pipelines import GenerationRequest, ImagePipeline
from pipelines.run import checks
from pipelines.video import memory
dm = DeviceManager("cpu")
p = ImagePipeline.from_pretrained(sys.argv[1], device_manager=dm, memory_mode="off")
p.generate(GenerationRequest("a red circle", num_frames=5, width=32, height=32, steps=1, seed=0))
out = []
for frames, side in json.loads(sys.argv[2]):
    request = GenerationRequest("a red circle", num_frames=frames, width=side, height=side, steps=1, seed=0,
                                guidance_scale=5.0)
    if not device_memory.reset_peak("cpu", dm.device):
        print(json.dumps(None))
        sys.exit(0)
    before = device_memory.resident_bytes()
    p.generate(request)
    measured = device_memory.device_memory("cpu", dm.device)["peak"] - before
    out.append([measured, memory.estimate(*checks.clip_memory(p, request)).needed])
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def wan_path(family_root):
    return families.build_video("wan", family_root / "wan")


@pytest.fixture(scope="module")
def wan(wan_path):
    return ImagePipeline.from_pretrained(wan_path, device_manager=DeviceManager("cpu"), memory_mode="off")


def small_device(monkeypatch, pipe: ImagePipeline, free: int) -> None:
    """The pipeline's device with only `free` bytes free: its DeviceManager's memory query answers so."""
    real = pipe.dm.memory_stats
    monkeypatch.setattr(pipe.dm, "memory_stats", lambda: {**real(), "free": free})


def needed(pipe: ImagePipeline, frames: int, side: int) -> int:
    request = GenerationRequest("a red circle", num_frames=frames, width=side, height=side, steps=1)
    return memory.estimate(*checks.clip_memory(pipe, request)).needed


# their decoders' chunks and scales (memory.DECODERS); AnimateDiff's UNet (memory.UNET_FLOATS): the tiny copy, whose
# peak is its decode, and the motion refiner (tiny-shapes' 64-channel UNet), whose peak is the denoiser's
@pytest.mark.parametrize("name", ["wan", "cogvideox", "hunyuan-video", "animatediff", "refiner"])
def test_the_estimate_grows_with_frames_and_size_as_measured(family_root, name):
    path = REFINER if name == "refiner" else families.build_video(name, family_root / name)
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    run = subprocess.run(
        [sys.executable, "-c", MEASURE, str(path), json.dumps(POINTS)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    points = json.loads(run.stdout.splitlines()[-1])
    if points is None:
        pytest.skip("this kernel keeps its peak RSS (VmHWM) through /proc/self/clear_refs: no peak to measure")
    (small, small_est), (longer, longer_est), (larger, larger_est) = points
    assert longer > small and larger > small  # as measured: more frames, a larger size
    assert longer_est > small_est and larger_est > small_est  # and as estimated
    for measured, estimated in ((small, small_est), (longer, longer_est), (larger, larger_est)):
        assert 1 / FACTOR < estimated / measured < FACTOR, (estimated / MiB, measured / MiB)


def test_a_clip_too_large_for_a_small_device_is_refused_naming_what_fits(wan, monkeypatch):
    free = (needed(wan, 9, 64) + needed(wan, 13, 64)) // 2  # room for 9 frames at 64x64, not 13
    small_device(monkeypatch, wan, free)
    with pytest.raises(RequestError) as info:
        wan.generate(GenerationRequest("a red circle", num_frames=17, width=64, height=64, steps=1, seed=1))
    message = str(info.value)
    assert info.value.loc == ("num_frames",) and "9 frames at 64x64" in message
    assert "beyond the loaded weights" in message and "is free" in message and "MiB" in message
    fits = message.split("What would fit")[1]
    width, height = map(int, re.search(r"17 frames at (\d+)x(\d+)", fits).groups())  # a smaller size at 17 frames
    assert width < 64 and height < 64
    wan.check_task(GenerationRequest("a red circle", num_frames=17, width=width, height=height, steps=1))
    result = wan.generate(GenerationRequest("a red circle", num_frames=9, width=64, height=64, steps=1, seed=1))
    assert len(result.clips[0]) == 9  # the frame count named fits, and runs


def test_other_memory_plans_are_named_where_they_would_fit(wan):
    """On an accelerator holding its weights (here 8 GiB of them, as a 1.3B model in fp32 with its text encoder
    would), a transformer in int8 or the weights offloaded leave room that fewer frames would not."""
    shape, _, clip = checks.clip_memory(wan, GenerationRequest("a red circle", num_frames=9, width=64, height=64))
    gib = 2**30
    component_bytes = {"transformer": 6 * gib, "text_encoder": int(1.5 * gib), "vae": gib // 2}
    weights = memory.plan_weights(wan.pipe, component_bytes, [])
    assert weights.resident == 8 * gib and weights.plan == "on device"
    offloaded = memory.plan_weights(wan.pipe, component_bytes, ["model_cpu_offload"])
    assert offloaded.resident == 0 and offloaded.onload["denoiser"] == 6 * gib
    device = memory.Device("cuda:0", free=MiB // 4, can_offload=True)
    others = memory.alternatives(wan.pipe, component_bytes, [], quantized=False, device=device)
    error = memory.refusal(shape, weights, clip, device, wan.size_multiple, others)
    assert "QUANTIZATION=transformer=torchao-int8wo" in str(error) and "MEMORY_MODE=max" in str(error)
    assert not memory.alternatives(wan.pipe, component_bytes, ["model_cpu_offload"], quantized=True, device=device)
