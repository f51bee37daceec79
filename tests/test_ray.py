"""The Ray Serve backend on a local Ray instance with 2 CPU replicas (requirements-ray.txt; CI installs it).

Environment: RAY_AUTH_MODE=disabled and a small object store keep the local instance quiet and light.
"""

from __future__ import annotations

import os
import threading
import time

import numpy as np
import pytest

from devices import DeviceManager
from pipelines import GenerationRequest, ImagePipeline, PipelineError

ray = pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-ray.txt")
PROMPT = "a red circle on a blue background"


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    from ray import serve

    from serving.ray_backend import RayBackend

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=200 * 2**20)
    try:
        yield RayBackend.start(model=str(tiny_model_dir), replicas=2, device="cpu", cpus_per_replica=1)
    finally:
        serve.shutdown()
        ray.shutdown()


def request(**kwargs) -> GenerationRequest:
    return GenerationRequest(**{"prompt": PROMPT, "num_images": 2, "steps": 3, "seed": 21, **kwargs})


def test_results_equal_the_in_process_ones(backend, tiny_model_dir):
    local = ImagePipeline.from_pretrained(tiny_model_dir, DeviceManager("cpu")).generate(request())
    steps = []
    remote = backend.generate(request(), progress=lambda *a: steps.append(a))
    assert remote.seeds == local.seeds == [21, 22]
    assert [m["prompt"] for m in remote.metadata] == [m["prompt"] for m in local.metadata]
    for a, b in zip(remote.images, local.images, strict=True):
        assert np.abs(np.asarray(a, dtype=np.int16) - np.asarray(b, dtype=np.int16)).max() <= 1
    assert steps and steps[-1][0] == steps[-1][1]  # progress arrived, up to done == total


def test_concurrent_requests_go_to_different_replicas(backend):
    both = threading.Barrier(2, timeout=60)
    results = []

    def progress(done, _total, _image):
        if done == 1:
            both.wait()  # both requests are denoising at the same time

    threads = [
        threading.Thread(target=lambda s=s: results.append(backend.generate(request(seed=s, steps=20), progress)))
        for s in (1, 2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len({r.metadata[0]["replica"] for r in results}) == 2


def test_cancel_returns_what_finished(backend):
    calls = {"n": 0}

    def cancel() -> bool:
        calls["n"] += 1
        return calls["n"] > 3

    result = backend.generate(request(num_images=8, steps=100), should_cancel=cancel)
    assert result.cancelled and len(result.images) < 8


def test_request_errors_keep_their_message(backend):
    with pytest.raises(ValueError, match="width: 33 is not a multiple of 8"):
        backend.generate(request(width=33))


def test_status_has_a_row_per_replica(backend):
    time.sleep(2.5)  # one heartbeat
    rows = backend.status()
    assert len(rows) == 2 and all(r.healthy and r.backend == "cpu" for r in rows)


def test_a_killed_replica_is_replaced_and_the_app_answers_clearly_meanwhile(backend):
    from ray import serve

    from serving.deployment import APP_NAME

    victim = next(n for n in ray.util.list_named_actors(all_namespaces=True) if "SERVE_REPLICA" in n["name"])
    ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]), no_restart=True)
    outcomes = []
    for s in range(4):  # meanwhile: served by the other replica, or a clear message
        try:
            outcomes.append(backend.generate(request(seed=s)).seeds[0] == s)
        except PipelineError as exc:
            assert "Ray Serve is replacing it" in str(exc)
            outcomes.append("refused clearly")
    assert True in outcomes
    deadline = time.time() + 120
    while time.time() < deadline:  # a test may sleep-poll; Serve brings the replica back
        state = serve.status().applications[APP_NAME].deployments["GenerationReplica"]
        if state.replica_states.get("RUNNING", 0) == 2:
            break
        time.sleep(1)
    assert state.replica_states.get("RUNNING", 0) == 2
    assert backend.generate(request(seed=99)).seeds == [99, 100]


def test_the_app_runs_on_the_ray_backend(backend, tmp_path, tiny_model_dir):
    from gradio_client import Client

    from tests.app_server import running_app
    from tests.test_reliability import args

    with running_app(tiny_model_dir, tmp_path, backend=backend) as (demo, _):
        images, info = Client(demo.local_url, verbose=False).predict(**args(seed=8), api_name="/generate")
    assert info["seeds"] == [8] and len(images) == 1
