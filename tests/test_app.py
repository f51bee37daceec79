"""The app through its public API (gradio_client), against a real server on a free port."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from gradio_client import Client
from PIL import Image

import app
from devices.memory import STATS_KEYS
from engine import build_engine
from pipelines import read_metadata
from pipelines.run.options import DEFAULT_MODEL
from tests.app_server import app_settings, embedded_model_available, main_pipeline, running_app
from tests.sync import HoldAtStep, in_thread, until

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle on a blue background"
STATUS_KEYS = {*STATS_KEYS, "device", "dtype", "attention"}


@pytest.fixture(scope="module")
def server(tmp_path_factory, tiny_model_dir):
    model = DEFAULT_MODEL if embedded_model_available() else tiny_model_dir
    with running_app(model, tmp_path_factory.mktemp("outputs")) as (demo, pipeline):
        yield demo, pipeline


@pytest.fixture(scope="module")
def client(server):
    return Client(server[0].local_url, verbose=False)


def generate_args(**kwargs) -> dict:
    """Keyword arguments of /generate: a small default request, updated with `kwargs`."""
    args = dict(
        prompt=PROMPT,
        negative_prompt="",
        num_images=1,
        steps=4,
        guidance_scale=4.0,
        width=64,
        height=64,
        seed=1,
        loras={},
    )
    return {**args, **kwargs}


def generate(client: Client, **kwargs):
    return client.predict(**generate_args(**kwargs), api_name="/generate")


def test_import_loads_no_model_and_probes_nothing():
    code = (
        "import sys, devices.manager as m\n"
        "m.DeviceManager.__init__ = lambda *a, **k: sys.exit('DeviceManager built at import')\n"
        "import app\n"
        "assert 'diffusers.pipelines' not in sys.modules, 'diffusers pipelines imported'\n"
        "print('ok')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr


def test_generate_four_images_with_distinct_seeds(client):
    images, info = generate(client, num_images=4, seed=123)
    assert info["seeds"] == [123, 124, 125, 126]
    assert len(images) == 4
    for item, seed in zip(images, info["seeds"], strict=True):
        assert item["caption"] == f"seed {seed}"
        with Image.open(item["image"]) as im:
            assert im.size == (64, 64) and im.mode == "RGB"
        assert read_metadata(item["image"])["parameters"]["seed"] == seed  # downloads keep the metadata
    assert info["device"] == "cpu" and info["dtype"] == "float32" and info["attention"] == "sdpa"
    assert info["timings"]["total"] > 0 and info["warnings"] == [] and info["cancelled"] is False


def test_status_endpoint(client):
    status = client.predict(api_name="/status")
    assert set(status) >= STATUS_KEYS
    assert status["backend"] == "cpu" and status["host_total"] > 0 and status["allocated"] > 0


def test_bad_input_is_an_error_message_then_the_server_still_works(client):
    with pytest.raises(Exception) as err:
        generate(client, prompt="   ")
    assert "prompt: must be non-empty text" in str(err.value)
    with pytest.raises(Exception) as err:
        generate(client, steps=0)
    assert "steps: 0 is out of range 1..150" in str(err.value)
    with pytest.raises(Exception) as err:
        generate(client, steps=2, sampler="PLMS")  # PLMS's warm-up takes 4 steps (pipelines.sampling.samplers)
    assert "steps: PLMS needs at least 4 steps; got 2" in str(err.value)
    with pytest.raises(Exception) as err:
        generate(client, width=66)
    assert "width: 66 is not a multiple of 8" in str(err.value)
    with pytest.raises(Exception) as err:
        generate(client, loras={"no-such-lora": 1.0})
    assert "unknown LoRA 'no-such-lora'" in str(err.value)
    images, info = generate(client, num_images=2, seed=9)
    assert len(images) == 2 and info["seeds"] == [9, 10]


def test_stop_cancels_and_returns_what_finished(server, monkeypatch):
    """16 images are two micro-batches of 8; the job is held at step 2 of the second until Stop
    cancels it: the first 8 images come back, however fast the machine."""
    demo, backend = server
    hold = HoldAtStep(backend.generate, step=6)  # 4 steps per micro-batch: step 2 of the second
    monkeypatch.setattr(backend, "generate", hold)
    client = Client(demo.local_url, verbose=False)
    job = client.submit(**generate_args(num_images=16, steps=4, seed=3), api_name="/generate")
    assert hold.reached.wait(120), hold
    client.predict(api_name="/stop")
    images, info = job.result(timeout=120)
    assert hold.stopped_early(), hold
    assert info["cancelled"] is True and info["seeds"] == list(range(3, 11))
    assert len(images) == 8 and any("cancelled" in w for w in info["warnings"])


class SlowSteps:
    """A backend's `generate` whose every step takes 0.2 s more: a job long enough to cancel midway."""

    def __init__(self, generate):
        self._generate, self.steps, self.results = generate, [], []

    def __call__(self, request, progress=None, should_cancel=None, preview=None):
        def on_step(step: int, total: int, image: int) -> None:
            self.steps.append(step)
            if progress is not None:
                progress(step, total, image)
            time.sleep(0.2)

        self.results.append(self._generate(request, on_step, should_cancel, preview))
        return self.results[-1]


@pytest.mark.parametrize("endpoint", ["/generate", "/inpaint"])
def test_cancelling_a_gradio_client_call_stops_its_job(server, monkeypatch, tmp_path, endpoint):
    """gradio_client's `job.cancel()` stops the engine's job after its step, not only the client's wait
    (a plain function ran on to its last step: 40 x 0.2 s for nothing)."""
    from gradio_client import handle_file

    demo, backend = server
    slow = SlowSteps(backend.generate)
    monkeypatch.setattr(backend, "generate", slow)
    client = Client(demo.local_url, verbose=False)
    if endpoint == "/generate":
        files, args = [], generate_args(steps=40, seed=3)
    else:
        Image.new("RGB", (64, 64), "blue").save(tmp_path / "scene.png")
        mask = Image.new("L", (64, 64), 0)
        mask.paste(255, (16, 16, 48, 48))
        mask.save(tmp_path / "mask.png")
        files = [handle_file(str(tmp_path / name)) for name in ("scene.png", "mask.png")]
        args = dict(prompt=PROMPT, steps=40, seed=3, strength=1.0)
    job = client.submit(*files, **args, api_name=endpoint)
    assert until(lambda: len(slow.steps) >= 2, 120), slow.steps
    job.cancel()
    assert until(lambda: slow.results, 60), slow.steps
    assert slow.results[0].cancelled and len(slow.steps) < 20, slow.steps


def test_upscale_endpoint_enlarges_by_a_factor_or_to_a_size(client, tmp_path):
    """/upscale: the Upscale tab's work for API clients, by a factor or to width x height."""
    from gradio_client import handle_file

    Image.new("RGB", (40, 30), "purple").save(tmp_path / "small.png")
    files = [handle_file(str(tmp_path / "small.png"))]
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/upscale"]
    assert [p["parameter_name"] for p in api["parameters"]] == [
        "files", "upscaler", "scale_by", "width", "height", "upscaler_2", "upscaler_2_visibility"]  # fmt: skip
    gallery, info = client.predict(files, upscaler="Lanczos", scale_by=2.0, api_name="/upscale")
    assert info["sizes"] == [{"from": [40, 30], "to": [80, 60]}]
    with Image.open(gallery[0]["image"]) as image:
        assert image.size == (80, 60) and image.getpixel((40, 30))[:3] == (128, 0, 128)
    _, info = client.predict(files, upscaler="Lanczos", width=64, height=48, api_name="/upscale")
    assert info["sizes"][0]["to"] == [64, 48]
    with pytest.raises(Exception, match="upscaler"):
        client.predict(files, upscaler="no-such-upscaler", api_name="/upscale")


def test_status_answers_while_a_generation_runs(server, monkeypatch):
    """The job is held at step 2 until the test has its answers: a status call that queued behind the
    generation would answer only after the hold's limit, with the job no longer held, and fail."""
    demo, backend = server
    hold = HoldAtStep(backend.generate, step=2)
    monkeypatch.setattr(backend, "generate", hold)
    client = Client(demo.local_url, verbose=False)
    job = client.submit(**generate_args(num_images=4, steps=6, seed=3), api_name="/generate")
    assert hold.reached.wait(120), hold
    answers = [client.predict(api_name="/status") for _ in range(3)]
    assert hold.held_until is None, hold  # all three answered while the job was still held
    hold.release()
    images, _ = job.result(timeout=300)
    assert len(images) == 4 and hold.held_until == "release"
    for status in answers:  # and each showed the generation at its step
        assert any(r["busy"] and "step 2/" in r["activity"] for r in status["replicas"]), status["replicas"]


def test_only_output_files_are_served(server, client):
    demo, _ = server
    for path in ("app.py", str(ROOT / "app.py"), "/etc/passwd", str(ROOT / "models" / "train" / "world.py")):
        assert httpx.get(f"{demo.local_url}gradio_api/file={path}").status_code == 403, path


def test_queue_is_bounded_with_a_busy_message(tmp_path, tiny_model_dir, monkeypatch):
    """QUEUE_SIZE=1: the first job is held running, the second waits, the third is told the queue is full."""
    with running_app(tiny_model_dir, tmp_path, queue_size=1) as (demo, backend):
        engine = demo.studio.engine
        hold = HoldAtStep(backend.generate, step=2)
        monkeypatch.setattr(backend, "generate", hold)
        request = generate_args(num_images=2, steps=4, width=32, height=32)
        running = Client(demo.local_url, verbose=False).submit(**request, api_name="/generate")
        assert hold.reached.wait(120), hold
        waiting = Client(demo.local_url, verbose=False).submit(**request, api_name="/generate")
        assert until(lambda: engine.load() == {"running": 1, "waiting": 1}), engine.load()
        with pytest.raises(Exception, match=r"(?i)queue is full"):
            Client(demo.local_url, verbose=False).predict(**request, api_name="/generate")
        hold.release()
        assert len(running.result(timeout=300)[0]) == 2 and len(waiting.result(timeout=300)[0]) == 2


def test_concurrent_status_does_not_block(client):
    calls = [in_thread(client.predict, api_name="/status") for _ in range(4)]
    assert all(set(call.result(timeout=30)) >= STATUS_KEYS for call in calls)


def test_out_of_memory_keeps_what_finished(server, client, monkeypatch):
    """Memory runs out for any batch and again after the first image: the API still returns that image."""
    import torch

    pipeline = main_pipeline(server[1])
    unet = pipeline.diffusers_pipeline.unet
    real = unet.forward
    single_calls = {"n": 0}

    def forward(sample, *args, **kwargs):
        if sample.shape[0] > 2 or single_calls["n"] >= 2:  # CFG: 2 rows per image; 2 steps per image
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 GiB")
        single_calls["n"] += 1
        return real(sample, *args, **kwargs)

    monkeypatch.setattr(unet, "forward", forward)
    images, info = generate(client, num_images=4, steps=2, seed=40)
    assert len(images) == 1 and info["seeds"] == [40]
    assert any("even with one image at a time" in w for w in info["warnings"]), info["warnings"]
    pipeline.micro_batch_limit.clear()


def test_ui_limits_and_defaults_are_the_models(server, client):
    """One set of limits: the size sliders stop at the sizes the model was trained at (its card's, within
    what validation accepts), and /generate accepts all of it."""
    demo, pipeline = server
    info = pipeline.model_info()
    config = httpx.get(f"{demo.local_url}config").json()
    tabs = ("edit-", "inpaint-", "video-")  # the Generate tab's sliders (Video has its own Width, for its model)
    shown = [c for c in config["components"] if c["type"] == "slider" and not str(c["props"].get("elem_id")).startswith(tabs)]
    sliders = {c["props"].get("label"): c["props"] for c in shown}
    by_id = {c["props"].get("elem_id"): c["props"] for c in config["components"] if c["type"] == "slider"}
    assert sliders["Guidance (CFG)"]["maximum"] == 50 and sliders["Steps"]["maximum"] == 150
    assert (sliders["Width"]["minimum"], sliders["Width"]["maximum"]) == info.side_bounds == (64, 128)
    assert info.max_side >= 256  # beyond the sliders: hires fix, and the APIs (with a warning)
    assert sliders["Width"]["step"] == info.size_multiple
    assert (
        sliders["Steps"]["value"] == info.default_steps
        and by_id["guidance"]["value"] == info.default_guidance  # the Generate tab's (the Edit tab has the editor's)
    )
    assert by_id["edit-guidance"]["value"] == info.for_edits.default_guidance
    _, result = generate(client, guidance_scale=50.0, steps=2)  # over the old UI's CFG 20
    assert result["seeds"] == [1]


def test_sampler_per_request_changes_the_image_reproducibly(client):
    default, _ = generate(client, seed=5, steps=6)
    euler_a, _ = generate(client, seed=5, steps=6, sampler="Euler a")
    again, _ = generate(client, seed=5, steps=6, sampler="Euler a")
    pixels = [np.asarray(Image.open(i[0]["image"]), dtype=np.int16) for i in (default, euler_a, again)]
    assert np.abs(pixels[0] - pixels[1]).mean() > 1 and np.array_equal(pixels[1], pixels[2])
    params = read_metadata(euler_a[0]["image"])["parameters"]
    assert params["sampler"] == "Euler a"
    with Image.open(euler_a[0]["image"]) as png:
        assert "Sampler: Euler a," in png.text["parameters"]
    with pytest.raises(Exception, match="sampler: 'Nope' is not available"):
        generate(client, sampler="Nope")


def test_a_gradio_client_caller_of_generate_sees_the_steps(client):
    """Progress reaches an API caller: the job reports its steps while the backend (the pool behind
    the editor router) denoises in its own threads."""
    job = client.submit(**generate_args(num_images=2, steps=40, seed=4), api_name="/generate")
    seen: list[str] = []
    deadline = time.time() + 300
    while not job.done() and time.time() < deadline:  # a test may sleep-poll
        for unit in job.status().progress_data or []:
            if unit.desc and unit.desc not in seen:
                seen.append(unit.desc)
        time.sleep(0.1)
    images, info = job.result(timeout=60)
    assert len(images) == 2 and info["cancelled"] is False
    steps = [d for d in seen if "step" in d]
    assert steps and steps[0].startswith("2 image(s): step "), seen


def test_generate_takes_guidance_end_and_rest_callers_of_the_published_values_still_work(server, client):
    """A plain REST caller of the ten values /generate was published with, positional (earlier READMEs'
    curl) or named (Gradio's own /gradio_api/call/v2/generate), gets its images: every parameter added
    since takes its default."""
    from tests.test_reliability import rest_call, rest_result

    images, _ = generate(client, seed=6, steps=4, guidance_end=0.5)
    params = read_metadata(images[0]["image"])
    assert params["json"]["guidance_end"] == 0.5 and params["parameters"]["guidance_end"] == 0.5
    ten = generate_args(seed=6, steps=4, sampler="")
    assert len(ten) == 10  # the documented signature
    url = server[0].local_url
    for route, values in (("generate", list(ten.values())), ("v2/generate", ten)):
        kind, data = rest_result(url, "generate", rest_call(url, route, values))
        assert kind == "complete" and data[1]["seeds"] == [6] and data[1]["num_images"] == 1, (route, data)
    with pytest.raises(Exception, match=r"guidance_end: 0 is out of range 0.01..1"):
        generate(client, guidance_end=0)
    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]
    names = [p["parameter_name"] for p in api["parameters"]]
    assert names[:10] == list(ten)  # the published order: positional callers depend on it
    assert all(p["parameter_has_default"] for p in api["parameters"][1:])  # added later, each with a default


def test_a_short_positional_call_names_its_values_in_the_endpoints_own_order(client):
    """`ui.positional` names a short `{"data": [...]}` call's values by `ui.fields.call_order`: that must
    be each endpoint's parameter order as Gradio publishes it, or values land in the wrong fields.
    A full list, a non-list and a list that is not short are left to Gradio."""
    from ui.fields import LEADING, call_order
    from ui.positional import named

    api = client.view_api(print_info=False, return_format="dict")["named_endpoints"]
    for endpoint in LEADING:
        assert tuple(p["parameter_name"] for p in api[f"/{endpoint}"]["parameters"]) == call_order(endpoint)
    assert json.loads(named("generate", b'{"data": ["a cat", "", 2]}')) == {
        "prompt": "a cat", "negative_prompt": "", "num_images": 2,
    }  # fmt: skip
    full = json.dumps({"data": [""] * len(call_order("generate"))}).encode()
    assert named("generate", full) is None
    assert named("generate", b'{"data": {"prompt": "x"}}') is None and named("generate", b"[1, 2") is None


def test_edit_callers_of_the_published_values_still_work(server, tmp_path):
    """/edit gained step_cache, step_cache_threshold, negative_prompt and loras; a plain REST caller
    that sends the files and the ten values /edit was published with, positional or named, still gets
    its edit (the new ones: their defaults, the model's)."""
    from tests.test_reliability import rest_call, rest_result, rest_upload

    url = server[0].local_url
    picture = tmp_path / "in.png"
    Image.new("RGB", (64, 64), "blue").save(picture)
    files = rest_upload(url, picture)
    published = dict(files=files, prompt="make the background red", strength=0.8, num_images=1, steps=2, guidance=4.0,
                     seed="9", random_seed=False, sampler="Euler", image_guidance=1.5, guidance_end=1.0)  # fmt: skip
    for route, values in (("edit", list(published.values())), ("v2/edit", published)):
        kind, data = rest_result(url, "edit", rest_call(url, route, values))
        assert kind == "complete", (route, data)
        assert len(data[0]) == 2 and data[0][1]["caption"] == "result 1 · seed 9"  # the input, then its edit
        assert "1 image(s) in" in data[1]


def test_generate_passes_the_step_cache_through(client):
    """The embedded model's UNet has no step cache: asking for one through /generate is refused by the
    pipeline with the families that have one; "none" (and leaving it out) generates as before."""
    with pytest.raises(Exception, match=r"has no step cache.*Flux.*Qwen-Image"):
        generate(client, step_cache="FirstBlockCache", step_cache_threshold=0.1)
    with pytest.raises(Exception, match=r"step_cache: 'fast' is not one of"):
        generate(client, step_cache="fast")
    _, info = generate(client, steps=2, step_cache="none")
    assert info["seeds"] == [1] and "step_cache" not in info


def test_a_64_bit_seed_reproduces_through_the_api(client):
    top = 2**64 - 1
    first, info = generate(client, num_images=2, steps=3, seed=top)
    assert info["seeds"] == [top, 0]
    again, _ = generate(client, num_images=1, steps=3, seed=0)
    pixels = [np.asarray(Image.open(i["image"]), dtype=np.int16) for i in (first[1], again[0])]
    # the same picture; torch's batched convolutions may round a pixel or two by 1/255 (another seed: all of them)
    assert np.abs(pixels[0] - pixels[1]).max() <= 1 and (pixels[0] != pixels[1]).mean() < 0.001
    assert read_metadata(first[0]["image"])["parameters"]["seed"] == top


def test_the_app_starts_when_gradios_start_up_probe_times_out_once(tmp_path, tiny_model_dir, monkeypatch):
    """On a loaded machine Gradio's own probe of the page (a HEAD, 3 s) can time out and Gradio then
    refuses to start ("localhost is not accessible"); on 127.0.0.1 the app starts again instead."""
    import gradio.networking

    probes = []
    real = gradio.networking.url_ok

    def slow_once(url):
        probes.append(url)
        return len(probes) > 1 and real(url)

    monkeypatch.setattr(gradio.networking, "url_ok", slow_once)
    with running_app(tiny_model_dir, tmp_path) as (demo, _):
        assert len(probes) == 2
        assert httpx.get(demo.local_url, timeout=30).status_code == 200


def test_a_probe_that_keeps_failing_still_stops_the_start(tmp_path, tiny_model_dir, monkeypatch):
    import gradio.networking

    monkeypatch.setattr(gradio.networking, "url_ok", lambda url: False)
    settings = app_settings(tiny_model_dir, tmp_path)
    engine = build_engine(settings)
    try:
        with pytest.raises(ValueError, match="localhost is not accessible"):
            app.serve(engine, settings, quiet=True)
    finally:
        engine.close()
    with socket.socket() as s:  # the port is free again: no server left behind
        s.bind(("127.0.0.1", settings.server_port))
