"""The Ray Serve backend on a local Ray instance: 2 CPU replicas of the tiny model (requirements-ray.txt; CI has it).

One Ray instance for the module (`ray.init(num_cpus=2)`, replicas with num_cpus=1, micro-batches of 2
so that a cancel lands between images), always shut down. Environment set for it (the raylet reads
it at start): RAY_USAGE_STATS_ENABLED=0 (no usage report, quiet), RAY_AUTH_MODE=disabled (no token
for a local test instance); the object store is capped at 100 MB.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline, PipelineError
from tests.ray_hold import HOLD
from tests.sync import in_thread, until

ray = pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-ray.txt")
pytestmark = pytest.mark.slow  # the Ray tier: a local Ray instance and Serve replicas (~2 min to start here)
PROMPT = "a red circle on a blue background"
ROOT = Path(__file__).resolve().parents[1]
OPTIONS = {"micro_batch": 2}


@pytest.fixture(scope="module")
def control_dir(tiny_model_dir, tmp_path_factory):
    """A ControlNet for the tiny model (its zero convolutions randomised, so a unit changes the image)."""
    import torch
    from diffusers import ControlNetModel, UNet2DConditionModel

    folder = tmp_path_factory.mktemp("controlnets")
    unet = UNet2DConditionModel.from_pretrained(tiny_model_dir, subfolder="unet")
    model = ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(16, 32))  # its VAE shrinks by 2
    torch.manual_seed(0)
    for name, parameter in model.named_parameters():
        if name.startswith(("controlnet_down_blocks", "controlnet_mid_block")):
            torch.nn.init.normal_(parameter, std=0.05)
    model.save_pretrained(folder / "tiny")
    OPTIONS["controlnet_dir"] = str(folder)  # both the replicas and the in-process pipeline
    return folder


@pytest.fixture(scope="module")
def adapter_dir(tiny_model_dir, tmp_path_factory):
    """A random IP-Adapter for the tiny model, in the folder layout IPADAPTER_DIR takes."""
    import torch
    from diffusers import UNet2DConditionModel

    from models.train.ip_adapter import build_encoder, initial_adapter, write_adapter

    folder = tmp_path_factory.mktemp("ip_adapters")
    unet = UNet2DConditionModel.from_pretrained(tiny_model_dir, subfolder="unet")
    state = initial_adapter(unet, torch.Generator().manual_seed(0))
    state["image_proj"]["proj.weight"].normal_(std=1.0)  # so that it visibly steers
    write_adapter(folder / "tiny", state, build_encoder()[0])
    OPTIONS["ipadapter_dir"] = str(folder)
    return folder


@pytest.fixture(scope="module")
def backend(ray_turn, tiny_model_dir, control_dir, adapter_dir):
    from ray import serve

    from serving.ray_backend import RayBackend

    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        env.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(
            num_cpus=2,
            include_dashboard=False,
            log_to_driver=False,
            object_store_memory=100 * 2**20,
            runtime_env={  # HOLD prompts wait at a step in the replicas; the hook runs before Ray sets sys.path
                "worker_process_setup_hook": "tests.ray_hold.install",
                "env_vars": {"PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))},
            },
        )
    try:
        yield RayBackend.start(model=str(tiny_model_dir), replicas=2, device="cpu", cpus_per_replica=1, **OPTIONS)
    finally:
        serve.shutdown()
        ray.shutdown()


@pytest.fixture(scope="module")
def local(tiny_model_dir, control_dir, adapter_dir):
    return ImagePipeline.from_pretrained(tiny_model_dir, DeviceManager("cpu"), **OPTIONS)


def request(**kwargs) -> GenerationRequest:
    return GenerationRequest(**{"prompt": PROMPT, "num_images": 2, "steps": 3, "seed": 21, **kwargs})


def assert_same(remote, local_result) -> None:
    assert remote.seeds == local_result.seeds
    assert [(m["prompt"], m["seed"]) for m in remote.metadata] == [
        (m["prompt"], m["seed"]) for m in local_result.metadata
    ]
    for a, b in zip(remote.images, local_result.images, strict=True):
        assert np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).max() <= 1


def test_results_equal_the_in_process_ones(backend, local):
    steps = []
    remote = backend.generate(request(), progress=lambda *a: steps.append(a))
    assert_same(remote, local.generate(request()))
    assert remote.seeds == [21, 22] and not remote.cancelled
    assert steps and steps[-1][0] == steps[-1][1]  # progress arrived, up to done == total
    edit = request(init_images=[Image.new("RGB", (32, 32), (200, 30, 30))], strength=0.8)  # inputs travel as PNG
    remote = backend.generate(edit)
    assert_same(remote, local.generate(edit))
    assert remote.inputs[0].getpixel((0, 0)) == (200, 30, 30)


def test_a_controlnet_unit_travels_with_its_image_and_gives_the_in_process_images(backend, local):
    picture = Image.new("RGB", (32, 32), "black")
    picture.paste((255, 255, 255), (4, 4, 16, 16))
    sent = request(controlnet=[{"image": picture, "model": "tiny", "module": "canny"}])
    remote = backend.generate(sent)
    assert_same(remote, local.generate(sent))
    assert remote.metadata[0]["controlnet"][0]["module"] == "canny"
    assert remote.images[0].tobytes() != local.generate(request()).images[0].tobytes()  # the unit did something


def test_an_image_prompt_travels_with_its_picture_and_gives_the_in_process_images(backend, local):
    sent = request(ip_adapter=[{"image": Image.new("RGB", (32, 32), (240, 210, 40)), "model": "tiny", "scale": 0.8}])
    remote = backend.generate(sent)
    assert_same(remote, local.generate(sent))
    assert remote.metadata[0]["ip_adapter"] == [{"model": "tiny", "scale": 0.8}]
    assert remote.images[0].tobytes() != local.generate(request()).images[0].tobytes()  # the picture did something


def test_an_inpaint_travels_with_its_mask_and_keeps_the_unmasked_pixels(backend, local):
    from pipelines.schema.inpaint import Inpaint

    image, mask = Image.new("RGB", (32, 32), (200, 30, 30)), Image.new("L", (32, 32), 0)
    mask.paste(255, (8, 8, 24, 24))
    inpaint = request(init_images=[image], strength=1.0, inpaint=Inpaint(mask=mask, masked_content="fill"))
    remote = backend.generate(inpaint)
    assert_same(remote, local.generate(inpaint))
    assert remote.metadata[0]["masked_content"] == "fill"
    outside = np.asarray(mask) == 0
    assert all((np.asarray(im) == (200, 30, 30)).all(axis=-1)[outside].all() for im in remote.images)


def run_together(backend, seeds, on_step=None):
    """Generate one request per seed from threads at once; each waits at step 1 until all are denoising."""
    together = threading.Barrier(len(seeds), timeout=30)

    def progress(done, _total, _image):
        if done == 1:
            together.wait()  # fails (BrokenBarrierError) if the requests do not run at the same time
            if on_step is not None:
                on_step()

    calls = {seed: in_thread(backend.generate, request(seed=seed, steps=20), progress) for seed in seeds}
    return {seed: call.result(timeout=120) for seed, call in calls.items()}  # a call's exception is raised here


def test_concurrent_requests_are_served_by_different_replicas_and_status_answers(backend):
    rows = []
    results = run_together(backend, [1, 2], on_step=lambda: rows.append(backend.status()))
    assert len({r.metadata[0]["replica"] for r in results.values()}) == 2
    assert sorted(r.seeds for r in results.values()) == [[1, 2], [2, 3]]
    assert all(len(s) == 2 for s in rows)  # status answered while both replicas were generating


def test_status_shows_busy_replicas_without_queueing_behind_them(backend):
    # an earlier test's cancelled job may still be winding down on the other replica: start from idle
    assert until(lambda: not any(r.busy for r in backend.status())), backend.status()
    seen = []

    def cancel() -> bool:
        seen.append(backend.status())  # a status call routed to a busy replica would hang here
        return any(r.busy for r in seen[-1]) or len(seen) > 100

    result = backend.generate(request(num_images=2, steps=150), should_cancel=cancel)
    busy = [r for r in seen[-1] if r.busy]
    assert len(busy) == 1 and busy[0].name.startswith("ray:") and "2 image(s)" in busy[0].activity
    assert all(r.healthy and r.backend == "cpu" for r in seen[-1]) and result.cancelled


def test_stop_returns_what_finished(backend, local):
    calls = []
    result = backend.generate(request(num_images=6, steps=30), should_cancel=lambda: len(calls) > 40 or calls.append(1))
    assert result.cancelled and 0 < len(result.images) < 6
    assert result.seeds == [21 + i for i in range(len(result.images))]
    assert any("cancelled" in w for w in result.warnings)


def test_a_caller_that_goes_away_stops_the_replica_work(backend, tmp_path):
    """The replica holds the job at step 2 (tests/ray_hold.py) until it is cancelled: only the caller
    going away can end the hold early, so the replica must stop there, however fast the machine."""
    report = tmp_path / "held.json"

    class Gone(Exception):
        pass

    def progress(done, _total, _image):
        if done == 2:  # the replica has reported step 2 and holds there
            raise Gone

    with pytest.raises(Gone):
        backend.generate(request(prompt=HOLD + str(report), num_images=2, steps=10), progress=progress)
    assert until(report.exists, timeout=120), "the held job did not end"
    held = json.loads(report.read_text())
    assert held["held_until"] == "cancel" and held["cancelled"] is True, held
    assert max(held["steps"]) < held["total"], held
    assert until(lambda: not any(r.busy for r in backend.status())), backend.status()


def test_request_errors_keep_their_message(backend):
    with pytest.raises(ValueError, match="width: 33 is not a multiple of 8"):
        backend.generate(request(width=33))  # checked before a replica is taken
    with pytest.raises(ValueError, match="sampler: 'Nope' is not available for this model"):
        backend.generate(request(sampler="Nope"))  # checked by the replica, message passed through


def kill_busy_replica(backend) -> None:
    """ray.kill the replica actor that is generating now (its id is in its status row)."""
    for _ in range(50):  # its first report may still be on its way: sleep-poll, bounded
        busy = [r.name.removeprefix("ray:") for r in backend.status() if r.busy]
        if busy:
            break
        time.sleep(0.1)
    actor = next(a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith(f"#{busy[0]}"))
    ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)


def test_a_replica_killed_mid_request_is_replaced_and_the_app_answers_clearly_meanwhile(backend):
    from ray import serve

    from serving.deployment import APP_NAME, DEPLOYMENT_NAME
    from serving.ray_backend import REPLICA_FAILED

    def progress(done, _total, _image):
        if done == 3:
            kill_busy_replica(backend)

    with pytest.raises(PipelineError) as failed:
        backend.generate(request(num_images=2, steps=150), progress=progress)
    assert str(failed.value) == REPLICA_FAILED
    outcomes = []
    for seed in range(4):  # meanwhile: served by the other replica, or refused with the same clear message
        try:
            outcomes.append(backend.generate(request(seed=seed)).seeds == [seed, seed + 1])
        except PipelineError as exc:
            assert str(exc) == REPLICA_FAILED
            outcomes.append("refused clearly")
    assert True in outcomes
    deadline, unhealthy, running = time.time() + 60, False, 0
    while time.time() < deadline and not (running == 2 and unhealthy):  # a test may sleep-poll
        unhealthy |= any(not r.healthy for r in backend.status())  # the panel shows the lost replica
        running = serve.status().applications[APP_NAME].deployments[DEPLOYMENT_NAME].replica_states.get("RUNNING")
        time.sleep(0.5)
    assert running == 2 and unhealthy
    # Both replicas serve again. The app's handle learns of the new replica by Serve's long poll,
    # a moment after serve.status() says RUNNING: until then both requests go to the old one.
    served, deadline = set(), time.time() + 60
    while len(served) < 2 and time.time() < deadline:
        served = {r.metadata[0]["replica"] for r in run_together(backend, [30, 40]).values()}
    assert len(served) == 2


def test_the_app_runs_on_the_ray_backend(backend, tmp_path, tiny_model_dir):
    from gradio_client import Client

    from tests.app_server import running_app
    from tests.test_reliability import args

    with running_app(tiny_model_dir, tmp_path, backend=backend) as (demo, _):
        client = Client(demo.local_url, verbose=False)
        images, info = client.predict(**args(seed=8), api_name="/generate")
        assert info["seeds"] == [8] and len(images) == 1
        # Stop through the app: the replica stops after its step and the finished images come back
        job = client.submit(**args(seed=9, num_images=8, steps=150, width=32, height=32), api_name="/generate")
        deadline = time.time() + 120
        while time.time() < deadline and not any(u.progress for u in job.status().progress_data or []):
            time.sleep(0.2)  # a test may sleep-poll: until the replica reports its first steps
        client.predict("", api_name="/stop")
        images, info = job.result(timeout=120)
    assert info["cancelled"] is True and len(images) < 8


def test_ray_replicas_stream_previews_to_the_engine(backend):
    from engine import Engine, Finished, Preview

    events = list(Engine(backend).submit(request(seed=12, num_images=2, steps=10)).events(timeout=300))
    assert any(isinstance(e, Preview) and e.images for e in events) and isinstance(events[-1], Finished)


def broken_model(folder):
    folder.mkdir()
    (folder / "model_index.json").write_text(
        '{"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"]}'
    )
    return folder


def test_a_replica_falls_back_to_the_old_model_only_while_its_switch_is_under_way(tiny_model_dir, tmp_path):
    """After a switch has settled, a replica that Serve restarts and that cannot load the model
    must fail its start: falling back would serve another model than its siblings, unseen."""
    from serving.deployment import GenerationReplica

    load = GenerationReplica.func_or_class._load
    broken = str(broken_model(tmp_path / "broken"))
    pipeline, error = load(broken, str(tiny_model_dir), DeviceManager("cpu"), None, lambda: False)
    assert pipeline.model_info().model_name == tiny_model_dir.name and error
    with pytest.raises(Exception, match=r"could not load model .*broken"):
        load(broken, str(tiny_model_dir), DeviceManager("cpu"), None, lambda: True)


def test_an_xyz_plot_runs_its_cells_on_both_replicas(backend, local):
    """A plot's cells are requests to the engine: Ray's two replicas take two at once; each cell is the
    in-process image of the same request."""
    from engine import Engine
    from engine.axes import axis_types, find_axis
    from engine.plots import Axis, PlotOptions, plot_cells, run_script

    types = axis_types("txt2img")
    axes = [Axis.of(find_axis(types, "Seed"), "1-2"), Axis.of(find_axis(types, "CFG Scale"), "1, 7")]
    cells, layout = plot_cells(request(num_images=1), axes, PlotOptions())
    result = run_script(Engine(backend), cells, layout)
    assert len(result.results) == 4 and result.grid is not None
    assert len({result.results[c.at].metadata[0]["replica"] for c in cells}) == 2
    for cell in cells:
        assert_same(result.results[cell.at], local.generate(cell.request))


def test_a_model_switch_reaches_every_replica_and_a_failed_one_keeps_the_old_model(backend, tiny_model_dir, tmp_path):
    """Last in the module: it leaves the replicas on another model. (Three redeploys, ~30-60 s each here.)"""
    from pipelines import ModelLoadError
    from serving.editing import EMBEDDED_T2I

    broken = broken_model(tmp_path / "broken")
    with pytest.raises(ModelLoadError, match=rf"could not switch to .*broken.*{tiny_model_dir.name} is serving again"):
        backend.load_model(str(broken))
    assert backend.model_info().model_name == tiny_model_dir.name
    results = run_together(backend, [7, 8])
    assert {r.metadata[0]["model"] for r in results.values()} == {tiny_model_dir.name}
    assert len({r.metadata[0]["replica"] for r in results.values()}) == 2
    # The next switch succeeds (the failed deploy's errors are not read), reaches both replicas and settles:
    # a replica that restarts now fails instead of falling back.
    info = backend.load_model(str(EMBEDDED_T2I))
    assert (info.model_name, info.default_width, info.default_height) == ("tiny-shapes", 64, 64)
    assert ray.get(backend.board.settled.remote(backend.app_args["deploy_id"]))
    results = run_together(backend, [5, 6])  # both replicas at once: each serves the new model
    assert {r.metadata[0]["model"] for r in results.values()} == {"tiny-shapes"}
    assert len({r.metadata[0]["replica"] for r in results.values()}) == 2
