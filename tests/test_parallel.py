"""PARALLEL: one image across several devices (serving/parallel.py, devices/parallel.py).

Two CPU processes over gloo stand in for two GPUs: a group with Ulysses degree 2 (and tensor parallel
degree 2) must make the image one process makes, through the engine the app runs; progress and
previews reach the caller; Stop stops every rank at the same step (the next request still works, so no
rank was left in a collective); a killed worker fails the running request naming it, and the group is
restarted and generates again; a family with no context-parallel plan is refused with those that have
one. Token counts divide by the degree (64 px Flux: 16 tokens; 32 px x 9 frames Wan: 12).
"""

from __future__ import annotations

import json
import os
import signal
import threading

import numpy as np
import pytest
import torch
import torch.multiprocessing
from diffusers import FluxTransformer2DModel

from devices import parallel as par
from engine import AppSettings, build_engine
from engine.jobs import Caller, Finished, Progress
from pipelines import DEFAULT_MODEL, GenerationRequest, LoraError, PipelineError
from serving.parallel import ParallelGroup
from tests import families

FLUX = dict(prompt="a red circle", width=64, height=64, steps=4, seed=7)  # 16 tokens: 8 per rank
WAN = dict(prompt="a red circle", width=32, height=32, num_frames=9, steps=3, seed=3)  # 12 tokens: 6 per rank


def engine_for(model, out, **env):
    settings = AppSettings.from_env({"MODEL_ID": str(model), "OUTPUT_DIR": str(out), "RUNTIME": "torch", **env})
    return build_engine(settings)


def pixels(result) -> np.ndarray:
    frames = result.clips[0] if result.clips else result.images
    return np.stack([np.asarray(f.convert("RGB"), dtype=np.int16) for f in frames])


def max_diff(a, b) -> int:
    return int(np.abs(pixels(a) - pixels(b)).max())


def stopped_after_two_steps(engine, request):
    """The app's Stop (Engine.stop) after the request's second progress event: the steps seen, and the result."""
    job = engine.submit(request, Caller(session="s1"))
    seen, result = [], None
    for event in job.events(timeout=120):
        if isinstance(event, Progress):
            seen.append(event.step)
            if len(seen) == 2:
                engine.stop("s1")
        if isinstance(event, Finished):
            result = event.result
    assert result is not None, "the job ended without a result"
    return seen, result


def group_of(engine) -> ParallelGroup:
    (group,) = engine.backend.replicas
    assert isinstance(group, ParallelGroup)
    return group


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    return families.build("flux", tmp_path_factory.mktemp("parallel") / "flux")


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    """The LoRA folder of the engines below (a LoRA saved into it later is listed by both)."""
    return tmp_path_factory.mktemp("loras")


@pytest.fixture(scope="module")
def one_flux(flux, lora_dir, tmp_path_factory):
    """The reference: one process, one device, torch."""
    engine = engine_for(flux, tmp_path_factory.mktemp("one"), PREFERRED_DEVICE="cpu", LORA_DIR=str(lora_dir))
    yield engine
    engine.backend.close()


@pytest.fixture(scope="module")
def ulysses(flux, lora_dir, tmp_path_factory):
    """One group of two CPU processes, Ulysses degree 2, shared by the tests below."""
    engine = engine_for(
        flux, tmp_path_factory.mktemp("ulysses"), PREFERRED_DEVICE="cpu,cpu", PARALLEL="ulysses:2", LORA_DIR=str(lora_dir)
    )
    yield engine
    engine.backend.close()


# ------------------------------------------------------------------ the setting and the refusals (no processes)
def test_parallel_setting_parses_and_refuses_in_one_line():
    assert str(par.parse_parallel("Ulysses:2")) == "ulysses:2"
    assert par.parse_parallel("off") is None
    for bad in ("ulysses:1", "pipeline:2", "tensor:x"):
        with pytest.raises(ValueError, match="ulysses:2, ring:4, tensor:2"):
            par.parse_parallel(bad)


def test_devices_are_cut_into_groups_of_the_degree():
    plan = par.parse_parallel("ulysses:2")
    assert par.groups_for(["cuda:0", "cuda:1", "cuda:2", "cuda:3"], plan) == [["cuda:0", "cuda:1"], ["cuda:2", "cuda:3"]]
    with pytest.raises(ValueError, match="needs a multiple of 2 devices; PREFERRED_DEVICE gives 3"):
        par.groups_for(["cuda:0", "cuda:1", "cuda:2"], plan)
    with pytest.raises(ValueError, match="mixes kinds"):
        par.groups_for(["cuda:0", "cpu"], plan)
    with pytest.raises(ValueError, match="no backend for MPS"):
        par.groups_for(["mps", "mps"], plan)


def test_ring_on_the_cpu_is_refused_with_the_reason():
    with pytest.raises(ValueError, match=r"return_lse.*ulysses:2"):
        par.attention_backend(par.parse_parallel("ring:2"), "cpu")
    assert par.attention_backend(par.parse_parallel("ring:2"), "cuda") == "_native_cudnn"


def test_the_models_that_can_come_from_diffusers_classes():
    context, tensor = par.able_models("ulysses"), par.able_models("tensor")
    assert {"FluxTransformer2DModel", "WanTransformer3DModel", "QwenImageTransformer2DModel"} <= set(context)
    assert "UNet2DConditionModel" not in context and "SD3Transformer2DModel" not in context
    assert "FluxTransformer2DModel" in tensor and "WanTransformer3DModel" not in tensor


ROUNDS = ((True, False), (False, True), (False, False))  # (rank 0's flag, rank 1's flag) per round


def _agree(rank: int, port: int, out) -> None:
    par.join_group("cpu", rank, 2, port)
    out.put((rank, [par.agree(flags[rank], torch.device("cpu")) for flags in ROUNDS]))
    par.leave_group()


def test_every_rank_gets_the_same_stop_answer():
    """Stop seen by one rank only: both stop (each rank's should_cancel is this all-reduce)."""
    ctx = torch.multiprocessing.get_context("spawn")
    out, port = ctx.Queue(), par.free_port()
    procs = [ctx.Process(target=_agree, args=(r, port, out)) for r in (0, 1)]
    for p in procs:
        p.start()
    answers = dict(out.get(timeout=120) for _ in procs)
    for p in procs:
        p.join(30)
    assert answers == {0: [True, True, False], 1: [True, True, False]}


# ------------------------------------------------------------------ a group of two CPU processes
def test_ulysses_group_makes_the_image_of_one_process(ulysses, one_flux):
    group = group_of(ulysses)
    assert len(set(group.pids)) == 2 and os.getpid() not in group.pids
    assert group.splits == [[f"tokens split (ulysses 2, ring 1), rank {r} of 2"] for r in (0, 1)]
    row = ulysses.backend.status()[0]
    assert row.name == "ulysses:2[cpu,cpu]" and row.healthy and "the whole denoiser" in row.weights
    request = GenerationRequest(**FLUX)
    assert max_diff(ulysses.run(request), one_flux.run(request)) <= 1


def test_a_lora_on_a_ulysses_group_gives_the_image_of_one_process(ulysses, one_flux, lora_dir):
    """Context parallel keeps the weights whole: each rank loads the request's LoRA as one process does."""
    families.save_denoiser_lora(one_flux.backend.replicas[0].diffusers_pipeline, lora_dir, "style")
    styled = GenerationRequest(**FLUX, loras={"style": 1.0})
    theirs, plain = one_flux.run(styled), one_flux.run(GenerationRequest(**FLUX))
    assert max_diff(theirs, plain) > 2  # the LoRA changes the image (4/255 at 4 steps)
    assert max_diff(ulysses.run(styled), theirs) <= 1


def test_progress_reaches_the_caller(ulysses):
    """Rank 0's steps, as they happen (previews: the Wan test; Flux's packed latents have none, in one process too)."""
    steps = []
    result = ulysses.backend.generate(GenerationRequest(**FLUX), lambda s, t, i: steps.append((s, t)))
    assert steps[-1] == (FLUX["steps"], FLUX["steps"]) and len(steps) >= FLUX["steps"]
    assert not result.cancelled and len(result.images) == 1


def test_stop_stops_every_rank_and_the_next_request_works(ulysses, one_flux):
    """The app's Stop (Engine.stop) mid-request: the group answers, cancelled, before the last step; had a
    rank gone on alone, it would wait in a collective and the next request would never finish."""
    seen, result = stopped_after_two_steps(ulysses, GenerationRequest(**{**FLUX, "steps": 12}))
    assert result.cancelled and not result.images
    assert max(seen) < 12
    again = GenerationRequest(**FLUX)
    assert max_diff(ulysses.run(again), one_flux.run(again)) <= 1


def test_a_killed_worker_fails_the_request_clearly_and_the_group_restarts(ulysses, one_flux):
    group = group_of(ulysses)
    victim = group.pids[1]
    killed = threading.Event()

    def progress(step, total, image):
        if not killed.is_set():
            killed.set()
            os.kill(victim, signal.SIGKILL)

    with pytest.raises(PipelineError, match=rf"rank 1 \(pid {victim}\) was killed by signal 9.*restarted"):
        ulysses.backend.generate(GenerationRequest(**{**FLUX, "steps": 12}), progress)
    request = GenerationRequest(**FLUX)
    result = ulysses.run(request)  # waits for the restarted group
    assert max_diff(result, one_flux.run(request)) <= 1
    assert victim not in group.pids and group.restarts == 1
    row = ulysses.backend.status()[0]
    assert row.healthy and f"pid {victim}" in row.error and "restarted 1 time" in row.error


def test_a_family_without_a_context_parallel_plan_is_refused_naming_those_with_one(tmp_path):
    sd15 = families.build("sd15", tmp_path / "sd15")
    with pytest.raises(ValueError, match=r"UNet2DConditionModel has no context-parallel plan.*FluxTransformer2DModel"):
        engine_for(sd15, tmp_path / "out", PREFERRED_DEVICE="cpu,cpu", PARALLEL="ulysses:2")


@pytest.mark.slow
def test_tensor_parallel_splits_the_weights_and_makes_the_same_image(flux, one_flux, tmp_path):
    engine = engine_for(flux, tmp_path, PREFERRED_DEVICE="cpu,cpu", PARALLEL="tensor:2")
    try:
        group = group_of(engine)
        transformer = FluxTransformer2DModel.from_pretrained(flux / "transformer")  # as loaded (one_flux's may hold LoRAs)
        whole = par.local_bytes(transformer)
        share = par.tensor_share(transformer, 2)  # every Linear halved (the plan's and the rest), norms whole
        assert group.rank_weights == [round(share * whole)] * 2, (group.rank_weights, whole, share)
        assert group.splits == [[f"weights split (tensor 2), rank {r} of 2"] for r in (0, 1)]
        assert share <= 0.6  # the issue's goal; diffusers' plan alone left 0.76 of this model (FLUX.1-dev 0.64)
        request = GenerationRequest(**FLUX)
        assert max_diff(engine.run(request), one_flux.run(request)) <= 1
        with pytest.raises(LoraError, match=r"PARALLEL=tensor:2: LoRAs cannot be used with tensor parallel.*ulysses"):
            engine.run(GenerationRequest(**FLUX, loras={"outline": 1.0}))  # a listed LoRA: refused before loading
        assert not engine.backend.model_info().lora_supported
    finally:
        engine.backend.close()


@pytest.mark.slow
def test_ulysses_group_makes_the_clip_of_one_process_on_wan(tmp_path):
    wan = families.build_video("wan", tmp_path / "wan")
    one = engine_for(wan, tmp_path / "one", PREFERRED_DEVICE="cpu")
    group = engine_for(wan, tmp_path / "group", PREFERRED_DEVICE="cpu,cpu", PARALLEL="ulysses:2", PREVIEW_EVERY="1")
    try:
        request = GenerationRequest(**WAN)
        previews = []
        mine = group.backend.generate(request, None, None, lambda first, images: previews.append(images))
        theirs = one.run(request)
        assert len(mine.clips[0]) == 9
        assert max_diff(mine, theirs) <= 1
        assert len(previews) >= WAN["steps"] - 1 and previews[0][0].size[0] > 0  # rank 0's previews came back
    finally:
        group.backend.close()
        one.backend.close()


def test_a_group_has_the_methods_of_the_abilities_it_declares():
    caps = ParallelGroup.capabilities
    assert caps.previews and caps.count_tokens and callable(ParallelGroup.count_tokens)
    assert not caps.switch_models  # a pool of groups switches models (DevicePool's builder starts new groups)


@pytest.mark.slow
def test_benchmarks_parity_parallel_reports_the_difference_and_the_overhead(flux, tmp_path, capsys):
    from benchmarks.__main__ import main as bench_main

    out = tmp_path / "parity.json"
    argv = ["parity", "--parallel", "ulysses:2", "--model", str(flux), "--device", "cpu,cpu", "--width", "64",
            "--height", "64", "--steps", "2", "--images", "1", "--repeats", "1", "--json", str(out)]  # fmt: skip
    assert bench_main(argv) == 0
    report = json.loads(out.read_text())
    (row,) = report["images"]
    assert report["group"] == "ulysses:2[cpu,cpu]" and row["max_abs"] <= 1 and row["overhead"] > 0
    assert "overhead" in capsys.readouterr().out


def test_a_request_error_in_the_workers_comes_back_as_the_same_class(ulysses, one_flux):
    """Raised inside every rank (a LoRA that is not there), sent as plain data, raised here as the class one
    process raises, with its message; the group goes on serving (no restart)."""
    request = GenerationRequest(**FLUX, loras={"no-such-lora": 1.0})  # past the engine's check, to the pipelines
    with pytest.raises(LoraError, match="unknown LoRA 'no-such-lora'") as one:
        one_flux.backend.generate(request)
    restarts = group_of(ulysses).restarts
    with pytest.raises(LoraError) as group:
        ulysses.backend.generate(request)
    assert str(group.value) == str(one.value) and group_of(ulysses).restarts == restarts
    assert max_diff(ulysses.run(GenerationRequest(**FLUX)), one_flux.run(GenerationRequest(**FLUX))) <= 1


APP_PAYLOAD = {"prompt": "a red circle", "width": 64, "height": 64, "steps": 4, "seed": 7, "cfg_scale": 3.5}


def _api_pixels(base: str) -> np.ndarray:
    import base64
    import io

    import httpx
    from PIL import Image

    response = httpx.post(f"{base}/sdapi/v1/txt2img", json=APP_PAYLOAD, timeout=300)
    assert response.status_code == 200, response.text[-2000:]
    (encoded,) = response.json()["images"]
    return np.asarray(Image.open(io.BytesIO(base64.b64decode(encoded))).convert("RGB"), dtype=np.int16)


@pytest.mark.slow  # `python app.py` with a group of two workers: ~40 s here
def test_python_app_py_serves_a_group_that_makes_the_image_of_one_process(flux, tmp_path):
    """The entry point as a user runs it (spawned workers re-import app.py's main module): its A1111 API
    gives the image the same API gives on one process."""
    import subprocess
    import sys
    import time

    from tests.app_server import free_port, running_app

    port, log = free_port(), tmp_path / "app.log"
    env = {
        **os.environ, "MODEL_ID": str(flux), "PREFERRED_DEVICE": "cpu,cpu", "PARALLEL": "ulysses:2", "RUNTIME": "torch",
        "EDIT_MODEL_ID": "none", "VIDEO_MODEL_ID": "none", "OUTPUT_DIR": str(tmp_path / "out"),
        "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port),
    }  # fmt: skip
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with log.open("w") as sink:
        process = subprocess.Popen([sys.executable, "app.py"], cwd=root, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while "ready at " not in log.read_text(errors="replace"):
            assert process.poll() is None, log.read_text(errors="replace")[-4000:]
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-4000:]
            time.sleep(0.5)
        grouped = _api_pixels(f"http://127.0.0.1:{port}")
    finally:
        process.terminate()
        process.wait(timeout=60)
    one_env = {"PREFERRED_DEVICE": "cpu", "RUNTIME": "torch", "EDIT_MODEL_ID": "none", "VIDEO_MODEL_ID": "none"}
    with running_app(flux, tmp_path / "one", env=one_env) as (demo, _):
        alone = _api_pixels(demo.local_url.rstrip("/"))
    (ready,) = [line for line in log.read_text(errors="replace").splitlines() if "ready at " in line]
    assert "replicas ulysses:2[cpu,cpu]" in ready, ready  # one replica: the group of two processes
    assert int(np.abs(grouped - alone).max()) <= 1


# ------------------------------------------------------------------ REPLICA_PROCESSES: the pool's replicas in processes
@pytest.mark.slow  # two spawned replicas of the embedded model: ~25 s here
def test_replicas_in_processes_make_the_in_process_images_stop_and_survive_a_kill(tmp_path):
    """PREFERRED_DEVICE=cpu,cpu REPLICA_PROCESSES=on: each replica a process of its own (no GIL between them);
    a 2-image request is split over both and gives one in-process replica's images; Stop stops it; a killed
    replica fails the request naming its pid (as a group's worker does) and is restarted."""
    alone = dict(EDIT_MODEL_ID="none", VIDEO_MODEL_ID="none")
    pool = engine_for(DEFAULT_MODEL, tmp_path / "pool", PREFERRED_DEVICE="cpu,cpu", REPLICA_PROCESSES="on", **alone)
    one = engine_for(DEFAULT_MODEL, tmp_path / "one", PREFERRED_DEVICE="cpu", **alone)
    try:
        replicas = pool.backend.replicas
        assert all(isinstance(r, ParallelGroup) for r in replicas) and len(replicas) == 2
        pids = [r.pids[0] for r in replicas]
        assert len(set(pids)) == 2 and os.getpid() not in pids
        rows = pool.backend.status()
        assert [r.name for r in rows] == ["cpu#0", "cpu#1"] and all(f"in process {p}" in r.weights for r, p in zip(rows, pids, strict=True))
        request = GenerationRequest(prompt="a red circle on a blue background", num_images=2, steps=8, seed=5)
        assert max_diff(pool.run(request), one.run(request)) <= 1

        seen, result = stopped_after_two_steps(pool, GenerationRequest(prompt="a red circle", steps=30, seed=1))
        assert result.cancelled
        assert max(seen) < 30

        killed = threading.Event()

        def progress(step, total, image):
            if not killed.is_set():
                killed.set()
                os.kill(pids[0], signal.SIGKILL)

        with pytest.raises(PipelineError, match=rf"rank 0 \(pid {pids[0]}\) was killed by signal 9.*restarted"):
            pool.backend.generate(request, progress)
        assert max_diff(pool.run(request), one.run(request)) <= 1  # both replicas again (the killed one restarted)
        assert replicas[0].restarts == 1 and pids[0] not in replicas[0].pids
    finally:
        pool.backend.close()
        one.backend.close()
