"""The in-process device pool: same images as one device, parallel replicas, failing devices, device lists."""

from __future__ import annotations

import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from devices import DeviceManager
from devices.options import DeviceSettings
from devices.pool import devices_for
from pipelines import GenerationRequest, ImagePipeline, PipelineError
from serving.health import Retest
from serving.pool import DevicePool, share_cpu_threads, split_range
from tests import fakes
from tests.sync import in_thread
from ui.status import status_markdown

PROMPTS = ["a red circle on a blue background", "a green square on a white background"]


@pytest.fixture(scope="module")
def single(tiny_model_dir):
    return ImagePipeline.from_pretrained(tiny_model_dir, DeviceManager("cpu"))


@pytest.fixture
def pool(tiny_model_dir):
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2) + 1)  # not the shared value: the pool must set it
    pool = DevicePool.from_pretrained(str(tiny_model_dir), devices="cpu,cpu")
    yield pool
    pool.close()  # also stops a retired replica's re-tests
    torch.set_num_threads(threads)


def pixels(image) -> np.ndarray:
    return np.asarray(image, dtype=np.float32) / 255


def request(**kwargs) -> GenerationRequest:
    return GenerationRequest(**{"prompt": PROMPTS, "num_images": 3, "steps": 3, "seed": 11, **kwargs})


def test_a_split_request_gives_the_single_device_images_in_order(pool, single):
    expected = single.generate(request())
    steps: list[tuple[int, int]] = []
    result = pool.generate(request(), progress=lambda done, total, _i: steps.append((done, total)))
    assert result.seeds == expected.seeds == list(range(11, 17))
    assert [m["prompt"] for m in result.metadata] == [m["prompt"] for m in expected.metadata]
    for got, want in zip(result.images, expected.images, strict=True):
        assert np.abs(pixels(got) - pixels(want)).max() <= 1 / 255 + 1e-6  # batched BLAS order
    assert steps[-1][0] == steps[-1][1]  # progress ends at done == total over both parts


def test_two_requests_run_on_two_replicas_at_once(pool):
    both_running = threading.Barrier(2, timeout=60)
    met: list[bool] = []

    def progress(done, total, _image):
        if done == 1:  # first step of each request: both must be denoising at the same time
            both_running.wait()
            met.append(True)

    calls = [
        in_thread(pool.generate, request(seed=s, num_images=1, prompt="a red circle on a blue background"), progress)
        for s in (1, 2)
    ]
    results = [call.result(timeout=120) for call in calls]
    assert met == [True, True] and sorted(r.seeds[0] for r in results) == [1, 2]


def test_a_failing_device_is_marked_and_its_work_retried_elsewhere(pool, single, monkeypatch):
    """A device that fails and also fails its self-test is out; its part runs on the other."""
    pool = DevicePool(pool.replicas, probe=lambda _p: (False, "matmul: max error 3.1"), retest=Retest(first=600))
    broken = pool.replicas[1]

    def lost(*args, **kwargs):
        raise RuntimeError("device lost")

    monkeypatch.setattr(broken, "generate", lost)
    result = pool.generate(request())
    assert result.seeds == list(range(11, 17))
    expected = single.generate(request())
    assert np.abs(pixels(result.images[-1]) - pixels(expected.images[-1])).max() <= 1 / 255 + 1e-6
    rows = {r.name: r for r in pool.status()}
    assert rows["cpu#1"].healthy is False and "device lost" in rows["cpu#1"].error
    assert rows["cpu#0"].healthy is True and pool.concurrency == 1
    pool.close()  # stops cpu#1's re-tests


def test_no_healthy_device_left_is_a_clear_error(pool, monkeypatch):
    """Both devices fail and the last one fails its self-test too: nothing is left, and the message
    says why for each."""
    pool = DevicePool(pool.replicas, probe=lambda _p: (False, "matmul: max error 3.1"), retest=Retest(first=60))
    for replica in pool.replicas:
        monkeypatch.setattr(replica, "generate", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("device lost")))
    with pytest.raises(PipelineError, match="device lost"):
        pool.generate(request())
    with pytest.raises(PipelineError, match="no healthy device is left") as err:
        pool.generate(request())
    assert "self-test failed: matmul: max error 3.1" in str(err.value) and "re-test in 60 s" in str(err.value)
    pool.close()  # stops the re-tests (and drops this test's weights)


class FailsOnce:
    """A replica's generate that raises a device error on its first call, then works."""

    def __init__(self, generate):
        self.generate, self.calls = generate, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == 1:
            raise RuntimeError("ACL error 507035: the device task aborted")
        return self.generate(*args, **kwargs)


def test_one_device_error_on_a_one_replica_pool_leaves_it_serving(single, monkeypatch):
    """The issue's case: a one-device machine, one transient error. The real device self-test
    (devices.selftest.probe) passes, so the replica stays and the work is retried on it."""
    monkeypatch.setattr(single, "generate", FailsOnce(single.generate))
    pool = DevicePool([single])
    first = pool.generate(request(num_images=1, prompt=PROMPTS[0]))
    assert first.seeds == [11] and len(first.images) == 1 and single.generate.calls == 2
    second = pool.generate(request(num_images=1, prompt=PROMPTS[0], seed=5))
    assert second.seeds == [5] and pool.status()[0].healthy and pool.concurrency == 1


def test_a_request_that_always_fails_errs_but_the_next_one_is_served(single, monkeypatch):
    plain = single.generate

    def fails_on_boom(request, *args, **kwargs):
        if "boom" in str(request.prompt):
            raise IndexError("a diffusers edge case")
        return plain(request, *args, **kwargs)

    monkeypatch.setattr(single, "generate", fails_on_boom)
    pool = DevicePool([single])
    with pytest.raises(PipelineError, match="failed on cpu#0 and again on cpu#0: a diffusers edge case"):
        pool.generate(request(num_images=1, prompt="boom"))
    assert pool.generate(request(num_images=1, prompt=PROMPTS[0])).seeds == [11]


def test_a_retired_replica_is_re_tested_and_returns_when_its_device_passes(pool, monkeypatch):
    repaired, tested_twice, tests = threading.Event(), threading.Event(), []

    def probe(_pipeline):
        tests.append(repaired.is_set())
        if len(tests) >= 2:
            tested_twice.set()
        return (True, "ok") if repaired.is_set() else (False, "softmax: max error 0.7")

    pool = DevicePool(pool.replicas, probe=probe, retest=Retest(first=0.01, factor=1, cap=0.01))
    monkeypatch.setattr(pool.replicas[1], "generate", FailsOnce(pool.replicas[1].generate))
    assert pool.generate(request()).seeds == list(range(11, 17))  # cpu#1's part retried on cpu#0
    assert tested_twice.wait(timeout=60)
    out = {r.name: r for r in pool.status()}["cpu#1"]
    assert not out.healthy and "ACL error 507035" in out.error and "failed (softmax: max error 0.7)" in out.error
    assert pool.concurrency == 1
    panel = status_markdown(pool.status(), [])
    assert "**cpu#1**" in panel and "⛔ out of service: RuntimeError: ACL error 507035" in panel
    repaired.set()
    assert pool.wait_healthy(timeout=60)
    assert all(r.healthy and r.error is None for r in pool.status()) and pool.concurrency == 2
    assert tests[-1] is True and tests.count(True) == 1  # one passing test brought it back, then none ran


def test_cancel_reaches_every_part(pool):
    calls = {"n": 0}

    def cancel() -> bool:
        calls["n"] += 1
        return calls["n"] > 4

    result = pool.generate(request(steps=50), should_cancel=cancel)
    assert result.cancelled and len(result.images) < 6


def test_bad_requests_fail_before_any_work(pool):
    with pytest.raises(ValueError, match="width: 33 is not a multiple"):
        pool.generate(request(width=33))
    assert all(not r.busy for r in pool.status())


def test_status_has_one_row_per_replica(pool):
    rows = pool.status()
    assert [r.name for r in rows] == ["cpu#0", "cpu#1"] and all(r.memory["host_total"] for r in rows)
    assert torch.get_num_threads() == max(1, (os.cpu_count() or 1) // 2)  # two CPU replicas share the cores


@pytest.mark.parametrize(
    ("cores", "backends", "threads"),
    [
        (16, ["cpu", "cpu"], 8),
        (16, ["cpu", "cpu", "cpu"], 5),
        (16, ["cpu", "cpu", "cuda", "npu"], 8),  # only CPU replicas count
        (3, ["cpu"] * 4, 1),  # at least one thread each
        (None, ["cpu", "cpu"], 1),  # os.cpu_count() unknown: one core
    ],
)
def test_cpu_replicas_divide_the_cores(monkeypatch, cores, backends, threads):
    before = torch.get_num_threads()
    monkeypatch.setattr(os, "cpu_count", lambda: cores)
    try:
        torch.set_num_threads(7)
        share_cpu_threads([SimpleNamespace(backend=b) for b in backends])
        assert torch.get_num_threads() == threads
        torch.set_num_threads(7)
        share_cpu_threads([SimpleNamespace(backend=b) for b in ["cpu", "cuda"]])  # one CPU replica: left alone
        assert torch.get_num_threads() == 7
    finally:
        torch.set_num_threads(before)


def test_split_range():
    assert split_range(5, 2) == [(0, 3), (3, 5)]
    assert split_range(1, 4) == [(0, 1)]
    assert split_range(6, 3) == [(0, 2), (2, 4), (4, 6)]


def expand_devices(value: str | None, env: dict[str, str]) -> list[str | None]:
    """The devices an entry point's settings give: CPU_REPLICAS from `env`, `value` as --device does."""
    settings = DeviceSettings.from_env(env)
    return devices_for(value if value is not None else settings.preferred, settings.cpu_replicas)


@pytest.mark.parametrize(
    ("value", "env", "expected"),
    [
        ("cpu,cpu", {}, ["cpu", "cpu"]),
        ("cpu", {"CPU_REPLICAS": "3"}, ["cpu", "cpu", "cpu"]),
        ("cpu", {}, ["cpu"]),
        (None, {}, [None]),
        (None, {"CPU_REPLICAS": "2"}, ["cpu", "cpu"]),  # PREFERRED_DEVICE=auto on a machine without an accelerator
        ("all", {}, ["cpu"]),
    ],
)
def test_device_lists_on_cpu(monkeypatch, value, env, expected):
    fakes.no_accelerators(monkeypatch)
    assert expand_devices(value, env) == expected


def test_device_lists_with_simulated_accelerators(monkeypatch):
    fakes.no_accelerators(monkeypatch)
    fakes.fake_cuda(monkeypatch, count=4)
    assert expand_devices("all", {}) == ["cuda:0", "cuda:1", "cuda:2", "cuda:3"]
    assert expand_devices("cuda:0,cuda:2", {}) == ["cuda:0", "cuda:2"]
    with pytest.raises(ValueError, match="cuda:7 requested but 4 device"):
        expand_devices("cuda:0,cuda:7", {})
    fakes.fake_npu(monkeypatch, count=8)
    assert expand_devices("npu:all", {}) == [f"npu:{i}" for i in range(8)]


@pytest.mark.parametrize(
    ("value", "env", "message"),
    [
        ("cuda:0,gpu", {}, "'gpu' is not a device"),
        ("auto,cpu", {}, "'auto' cannot be part of a list"),
        ("npu:all", {}, "PREFERRED_DEVICE=npu:all: torch_npu is not installed"),
        ("cpu", {"CPU_REPLICAS": "x"}, "CPU_REPLICAS='x' is not valid"),
        ("cuda:1,cpu", {}, "PREFERRED_DEVICE='cuda:1,cpu': cuda:1 is not usable"),
    ],
)
def test_device_list_errors_name_the_setting(monkeypatch, value, env, message):
    fakes.no_accelerators(monkeypatch)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        expand_devices(value, env)


def test_the_app_serves_two_requests_at_once_on_a_pool(tmp_path, tiny_model_dir):
    from gradio_client import Client

    from tests.app_server import running_app
    from tests.test_reliability import args, wait_until_busy

    threads = torch.get_num_threads()
    pool = DevicePool.from_pretrained(str(tiny_model_dir), devices="cpu,cpu")
    try:
        with running_app(tiny_model_dir, tmp_path, backend=pool) as (demo, _):
            clients = [Client(demo.local_url, verbose=False) for _ in range(2)]
            jobs = [
                c.submit(**args(num_images=1, steps=150, seed=s), api_name="/generate") for s, c in enumerate(clients)
            ]
            wait_until_busy(demo.local_url)
            status = Client(demo.local_url, verbose=False)
            busy = 0
            for _ in range(100):  # both replicas report work while both jobs run
                rows = status.predict(api_name="/status")["replicas"]
                busy = max(busy, sum(r["busy"] for r in rows))
                if busy == 2:
                    break
            assert [r["name"] for r in rows] == ["cpu#0", "cpu#1"] and busy == 2
            assert sorted(j.result(timeout=300)[1]["seeds"][0] for j in jobs) == [0, 1]
    finally:
        torch.set_num_threads(threads)


def test_two_replicas_loading_a_lora_at_once_leave_torch_building_real_weights(monkeypatch):
    """Each replica loads the LoRA for its part (peft builds the adapter's layers inside its meta
    swap); the two loads are forced to overlap. The pool's images are the one-replica images with
    the LoRA, and a module built afterwards has real weights, not meta ones."""
    from peft.tuners import tuners_utils

    from pipelines.run.options import DEFAULT_MODEL
    from tests.sync import Overlap

    pool = DevicePool.from_pretrained(str(DEFAULT_MODEL), "cpu", device_settings=DeviceSettings(cpu_replicas=2))
    register = torch.nn.Module.register_parameter
    overlap = Overlap(tuners_utils.init_empty_weights)
    monkeypatch.setattr(tuners_utils, "init_empty_weights", overlap)
    try:
        two = GenerationRequest("a red circle on a blue background", num_images=2, steps=6, seed=3, loras={"outline": 1})
        pooled = pool.generate(two)
        assert overlap.threads == 2  # each replica built its adapter inside the swap
        assert torch.nn.Linear(2, 2).weight.device.type == "cpu"
        monkeypatch.undo()
        single = ImagePipeline.from_pretrained(DEFAULT_MODEL).generate(two)
        for got, want in zip(pooled.images, single.images, strict=True):
            assert np.abs(pixels(got) - pixels(want)).max() <= 2 / 255 + 1e-6
    finally:
        torch.nn.Module.register_parameter = register  # a failure here must not break every later test
        pool.close()


def test_two_cpu_replicas_of_the_app_as_python_app_py_builds_it_start_in_a_fresh_process():
    """`PREFERRED_DEVICE=cpu,cpu python app.py`: every model the app loads by default (the embedded video model, whose
    folder names the video room's own VAE class by module, included) opens for a pool of two replicas. In a fresh
    interpreter, so that no earlier test has imported that class already (the pool's loads once skipped the import
    that the single-device load makes, and the app's start failed)."""
    import subprocess
    import sys

    script = (
        "from engine import AppSettings\n"
        "from engine.backends import build_backend\n"
        "backend = build_backend(AppSettings.from_env({'PREFERRED_DEVICE': 'cpu,cpu', 'RUNTIME': 'torch'}))\n"
        "print(len(backend.main.main.replicas), len(backend.video.replicas))\n"
        "backend.close()\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["2", "2"]
