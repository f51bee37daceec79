"""ZeroGPU as a Space runs it, without a GPU (issue "Hugging Face Spaces for real", points 3-4).

The app runs as `python app.py` does (tests/zerogpu_app.py: the default backend, the embedded model
with the editor beside it) in a subprocess, because `spaces` patches torch process-wide at import,
with the real `spaces` package, SPACES_ZERO_GPU=true and a stand-in for ZeroGPU's device API on
loopback (`DeviceAPI`); only the two worker steps that need a real GPU are replaced. Through the
app's own `/generate`: two generations in a row, progress, Stop returning what finished, and every
GPU given back without `fail=true`.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import secrets
import signal
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest
from PIL import Image

from engine import AppSettings
from pipelines.run.options import DEFAULT_MODEL
from tests.app_server import embedded_model_available, free_port
from tests.sync import in_thread

spaces = pytest.importorskip("spaces", reason="the `spaces` package (requirements-dev.txt)")

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle on a blue background"
pytestmark = pytest.mark.skipif(not embedded_model_available(), reason="needs the embedded model")


class DeviceAPI:
    """ZeroGPU's device API as `spaces.zero.api.APIClient` calls it, on 127.0.0.1: one GPU, every call recorded."""

    def __init__(self):
        self.calls: list[tuple[str, dict[str, str]]] = []
        self.held: set[str] = set()  # allow tokens not yet released
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                url = urlparse(self.path)
                params = {k: v[0] for k, v in parse_qs(url.query).items()}
                api.calls.append((url.path, params))
                body = b""
                if url.path == "/schedule":
                    token = secrets.token_hex(8)
                    idle = not api.held
                    api.held.add(token)
                    body = json.dumps(
                        {"idle": idle, "nvidiaIndex": 0, "nvidiaUUID": "GPU-stand-in", "allowToken": token}
                    ).encode()
                elif url.path == "/release":
                    api.held.discard(params.get("allowToken", ""))
                elif url.path not in ("/startup-report", "/allow"):
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.serving = in_thread(self.server.serve_forever)

    def paths(self, path: str) -> list[dict[str, str]]:
        return [params for p, params in self.calls if p == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.serving.result(timeout=30)  # serve_forever's own failure, if it had one


@pytest.fixture(scope="module")
def zerogpu_app(tmp_path_factory):
    """(url, device API, log file) of the app on a simulated ZeroGPU Space."""
    tmp = tmp_path_factory.mktemp("zerogpu")
    api = DeviceAPI()
    port = free_port()
    cgroup = tmp / "cgroup"
    cgroup.write_text("0::/zerogpu-test\n")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("GRADIO_", "SPACES_", "ZEROGPU_"))},
        "SPACES_ZERO_GPU": "true",
        "SPACES_ZERO_DEVICE_API_URL": api.url,
        "ZEROGPU_OFFLOAD_DIR": str(tmp / "offload"),
        "ZEROGPU_PROC_SELF_CGROUP_PATH": str(cgroup),
        "HOME": str(tmp),  # spaces keeps its clean-up links under ~/.zerogpu
        "MODEL_ID": str(DEFAULT_MODEL),
        "OUTPUT_DIR": str(tmp / "outputs"),
        "GRADIO_SERVER_NAME": "127.0.0.1",
        "GRADIO_SERVER_PORT": str(port),
        "HTTP_API": "1",  # off on ZeroGPU unless asked: see the test's last part
        "GRADIO_ANALYTICS_ENABLED": "False",
        "PYTHONUNBUFFERED": "1",
    }
    log = tmp / "app.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "tests" / "zerogpu_app.py")],
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: the ZeroGPU workers it forks go with it
        )
    try:
        deadline = time.monotonic() + 240
        while "ready at" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"the ZeroGPU app did not start (exit {proc.poll()}):\n{log.read_text()[-4000:]}")
            time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/", api, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
        with contextlib.suppress(ProcessLookupError):  # forked workers that outlived the app
            os.killpg(proc.pid, signal.SIGKILL)
        api.close()


def _args(num_images: int, steps: int, seed: int) -> dict:
    return dict(
        prompt=PROMPT, negative_prompt="", num_images=num_images, steps=steps, guidance_scale=4.0,
        width=64, height=64, seed=seed, loras={},
    )  # fmt: skip


def _finish(job, seconds: float) -> tuple[list, dict, list[str]]:
    """(images, info, the progress descriptions seen), polling the job's status until it is done."""
    seen: list[str] = []
    deadline = time.monotonic() + seconds
    while not job.done():
        assert time.monotonic() < deadline, "the generation did not finish in time"
        seen += [u.desc for u in job.status().progress_data or [] if u.desc and u.desc not in seen]
        time.sleep(0.1)  # a test may sleep-poll
    images, info = job.result(timeout=30)
    return images, info, seen


def test_settings_read_zerogpu_and_bound_the_time_budget():
    env = {"SPACES_ZERO_GPU": "true", "ZEROGPU_DURATION": "90", "TIME_BUDGET": "600"}
    settings = AppSettings.from_env(env)
    assert settings.zero_gpu and settings.zero_gpu_duration == 90
    assert settings.effective_time_budget == 90
    assert AppSettings.from_env({"TIME_BUDGET": "600"}).effective_time_budget == 600
    # the CPU seen at load is not where a ZeroGPU generation runs: no compile warm-up, no OpenVINO
    assert (settings.pipeline.compile, settings.pipeline.runtime) == ("off", "torch")
    asked = AppSettings.from_env({**env, "RUNTIME": "openvino", "COMPILE": "on"}).pipeline
    assert (asked.compile, asked.runtime) == ("on", "openvino")  # asked for: kept (and refused at load if impossible)


@pytest.mark.slow  # the ZeroGPU tier: the app in a subprocess, forking a worker per generation
def test_generations_run_in_zerogpu_workers_with_progress_and_stop(zerogpu_app):
    from gradio_client import Client, handle_file

    url, api, log = zerogpu_app
    # the visitor's ZeroGPU token (Spaces' proxy adds it): spaces reads it from the Gradio request, which
    # reaches the engine's worker thread in the job's context, and schedules the GPU on the visitor's quota
    payload = base64.urlsafe_b64encode(json.dumps({"user": "visitor"}).encode()).decode().rstrip("=")
    token = f"header.{payload}.signature"
    client = Client(url, verbose=False, headers={"X-IP-Token": token})

    # two generations in a row: their images and progress, each on a GPU scheduled and released
    for seed in (1, 2):
        images, info, seen = _finish(client.submit(**_args(2, 6, seed), api_name="/generate"), 300)
        assert len(images) == 2 and info["seeds"] == [seed, seed + 1] and not info["cancelled"], log.read_text()[-3000:]
        assert any("step" in d for d in seen), seen
    assert len(api.paths("/schedule")) == 2 and len(api.paths("/release")) == 2
    assert api.paths("/startup-report") and api.paths("/allow")
    assert [call.get("token") for call in api.paths("/schedule")] == [token, token]

    # an inpaint runs in a worker too, and comes back pasted into the picture (every unmasked pixel kept)
    scene, mask = _inpaint_files(Path(str(log)).parent)
    images, info = client.predict(
        handle_file(str(scene)), handle_file(str(mask)), prompt=PROMPT, num_images=1, steps=4, seed=5,
        api_name="/inpaint",
    )  # fmt: skip
    out, original = (np.asarray(Image.open(p).convert("RGB")) for p in (images[0]["image"], scene))
    assert (out == original)[np.asarray(Image.open(mask)) == 0].all() and info["seeds"] == [5]

    # Stop during a long one (same client session): what finished comes back
    job = client.submit(**_args(8, 40, 3), api_name="/generate")
    deadline = time.monotonic() + 180
    while not any(u.progress for u in job.status().progress_data or []):
        assert time.monotonic() < deadline and not job.done(), "no progress from the ZeroGPU worker"
        time.sleep(0.2)
    assert client.predict("", api_name="/stop")["running"] == 1
    images, info, _ = _finish(job, 180)
    assert info["cancelled"] is True and len(images) < 8
    assert any("cancelled" in w for w in info["warnings"])

    # HTTP_API=1: an A1111 API call runs in a ZeroGPU worker too, but with no Gradio request it carries
    # no visitor token: ZeroGPU schedules it on no visitor's quota (why HTTP_API is off there by default)
    import httpx

    answer = httpx.post(url + "sdapi/v1/txt2img", json={"prompt": PROMPT, "steps": 4, "seed": 9}, timeout=300)
    assert answer.status_code == 200 and len(answer.json()["images"]) == 1, answer.text[:500]
    assert api.paths("/schedule")[-1].get("token") is None

    text = log.read_text()
    assert "zerogpu stand-in: init" in text and "zerogpu stand-in: moved" in text
    deadline = time.monotonic() + 30  # the last worker's release may follow its answer
    while len(api.paths("/release")) < 5 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(api.paths("/release")) == 5
    assert not [r for r in api.paths("/release") if r.get("fail", "").lower() == "true"], api.calls


def _inpaint_files(folder: Path) -> tuple[Path, Path]:
    from models.train.world import draw, random_scene

    draw(random_scene(random.Random(1))).save(folder / "scene.png")
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (16, 16, 48, 48))
    mask.save(folder / "mask.png")
    return folder / "scene.png", folder / "mask.png"


def test_the_gpu_duration_grows_with_steps_images_and_pixels_and_is_capped(monkeypatch):
    from engine import zerogpu
    from pipelines import GenerationRequest

    monkeypatch.setattr(zerogpu, "_DEFAULT_SIZE", (512, 512))
    monkeypatch.setattr(zerogpu, "_MAX_DURATION", 120.0)
    assert zerogpu.gpu_duration(GenerationRequest(PROMPT, num_images=4, steps=20)) == 23  # 15 + 0.1 x 80
    assert zerogpu.gpu_duration(GenerationRequest(PROMPT, num_images=4, steps=30, width=1024, height=1024)) == 63
    assert zerogpu.gpu_duration(GenerationRequest(PROMPT, num_images=16, steps=150, width=1024, height=1024)) == 120
