"""ComfyUI's API (`webapi.comfy`) through its clients' own calls, against the app as `python app.py`
builds it (the embedded tiny-shapes model), with sign-in on: AUTH users and API_KEYS.

The clients: ComfyUI's `script_examples/websockets_api_example.py` (websocket-client + urllib),
the comfy-api-simplified package, and exact replays of Open WebUI's (aiohttp, Bearer key on HTTP
and the websocket) and SillyTavern's calls (text/plain bodies, /history polled every 100 ms, no
credentials: the key goes in the URL's path)."""

from __future__ import annotations

import asyncio
import base64
import io
import json
import time
import urllib.parse
import urllib.request
import uuid

import aiohttp
import httpx
import numpy as np
import pytest
import websocket
from PIL import Image, ImageSequence

from pipelines import GenerationRequest, read_png_info
from pipelines.pnginfo.comfy import parse_comfyui
from pipelines.run.options import DEFAULT_MODEL
from pipelines.schema.hires import Hires
from tests.app_server import embedded_model_available, running_app
from tests.sync import HoldAtStep, until
from webapi.running import png_bytes

KEY = "comfy-key-0123456789abcdef"
ALICE, BOB = ("alice", "wonderland-42"), ("bob", "builder-7")
PROMPT = "a red circle on a blue background"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return tmp_path_factory.mktemp("outputs")


@pytest.fixture(scope="module")
def app(outputs):
    if not embedded_model_available():
        pytest.skip("needs the embedded model (models/tiny-shapes)")
    env = {"API_KEYS": KEY, "AUTH": f"{ALICE[0]}:{ALICE[1]},{BOB[0]}:{BOB[1]}"}
    with running_app(DEFAULT_MODEL, outputs, env=env) as (demo, _):
        yield demo


@pytest.fixture(scope="module")
def url(app) -> str:
    return app.local_url.rstrip("/")


@pytest.fixture(scope="module")
def engine(app):
    return app.studio.engine


@pytest.fixture(scope="module")
def ckpt(url) -> str:
    info = httpx.get(f"{url}/object_info", headers=bearer()).json()
    return info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0][0]


def basic(user=ALICE) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()}


def bearer(key: str = KEY) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def text_graph(ckpt: str, prompt: str = PROMPT, seed: int = 5, steps: int = 6, size: int = 64, batch: int = 1) -> dict:
    """ComfyUI's own API example graph (7 nodes), with our model, size and a few steps."""
    return {
        "3": {"class_type": "KSampler", "inputs": {
            "cfg": 4, "denoise": 1, "latent_image": ["5", 0], "model": ["4", 0], "negative": ["7", 0],
            "positive": ["6", 0], "sampler_name": "euler", "scheduler": "normal", "seed": seed, "steps": steps}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"batch_size": batch, "height": size, "width": size}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": prompt}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"clip": ["4", 1], "text": ""}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}},
    }  # fmt: skip


def same_request(prompt: str = PROMPT, seed: int = 5, steps: int = 6, size: int = 64, **more) -> GenerationRequest:
    """What text_graph asks for, as our request."""
    return GenerationRequest(prompt=prompt, seed=seed, steps=steps, guidance_scale=4.0, width=size, height=size,
                             sampler="Euler", **more)  # fmt: skip


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.int16)


def upload(url: str, image: Image.Image, name: str, headers: dict[str, str], **form: str) -> httpx.Response:
    """POST /upload/image as clients send it: multipart `image` (+ form fields such as overwrite)."""
    return httpx.post(f"{url}/upload/image", files={"image": (name, png_bytes(image), "image/png")}, data=form, headers=headers)


class Example:
    """ComfyUI's websockets_api_example.py, its calls as written (urllib, websocket-client), with a
    credentials header added to each (ComfyUI itself has no sign-in)."""

    def __init__(self, url: str, headers: dict[str, str]):
        self.address, self.headers = url.split("//")[1], headers
        self.client_id = str(uuid.uuid4())
        self.ws = websocket.WebSocket()
        self.ws.connect(f"ws://{self.address}/ws?clientId={self.client_id}", header=[f"{k}: {v}" for k, v in headers.items()])
        self.messages: list[dict] = []

    def queue_prompt(self, prompt: dict) -> dict:
        data = json.dumps({"prompt": prompt, "client_id": self.client_id}).encode("utf-8")
        req = urllib.request.Request(f"http://{self.address}/prompt", data=data, headers=self.headers)
        return json.loads(urllib.request.urlopen(req).read())

    def get(self, path: str) -> bytes:
        req = urllib.request.Request(f"http://{self.address}{path}", headers=self.headers)
        with urllib.request.urlopen(req) as response:
            return response.read()

    def get_images(self, prompt: dict) -> tuple[str, dict[str, list[bytes]]]:
        prompt_id = self.queue_prompt(prompt)["prompt_id"]
        while True:
            out = self.ws.recv()
            if isinstance(out, str):
                message = json.loads(out)
                self.messages.append(message)
                if message["type"] == "executing" and message["data"]["node"] is None and message["data"]["prompt_id"] == prompt_id:
                    break
        history = json.loads(self.get(f"/history/{prompt_id}"))[prompt_id]
        found = {}
        for node_id, node_output in history["outputs"].items():
            found[node_id] = [self.get("/view?" + urllib.parse.urlencode(im)) for im in node_output.get("images", [])]
        return prompt_id, found

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def example(url):
    client = Example(url, basic())
    yield client
    client.close()


def mine(messages: list[dict], prompt_id: str) -> list[dict]:
    return [m for m in messages if m["type"] != "status" and m["data"].get("prompt_id") == prompt_id]


def test_comfyuis_own_example_returns_the_models_image_with_progress_per_step(example, ckpt, engine, outputs):
    prompt_id, images = example.get_images(text_graph(ckpt, steps=6))
    messages = mine(example.messages, prompt_id)
    kinds = [m["type"] for m in messages]
    assert kinds[:2] == ["execution_start", "execution_cached"] and kinds[-1] == "executing"
    progress = [m["data"] for m in messages if m["type"] == "progress"]
    assert [p["value"] for p in progress] == [1, 2, 3, 4, 5, 6] and {p["max"] for p in progress} == {6}
    assert {p["node"] for p in progress} == {"3"}
    assert [m["data"]["node"] for m in messages if m["type"] == "executed"] == ["9"]
    (png,) = images["9"]
    with Image.open(io.BytesIO(png)) as got:
        expected = engine.run(same_request()).images[0]
        assert np.abs(pixels(got) - pixels(expected)).max() == 0  # the one-call pipeline's image exactly
        comfy = parse_comfyui(json.loads(got.text["prompt"]))  # ComfyUI's graph, as a ComfyUI reader sees it
        assert (comfy["prompt"], comfy["seed"], comfy["steps"]) == (PROMPT, 5, 6)
    ours = read_png_info(io.BytesIO(png))  # and our reader our parameters (A1111's infotext beside them)
    assert ours["source"] == "diffusion-anywhere" and ours["raw"].startswith(PROMPT + "\nSteps: 6, Sampler: Euler")
    assert (ours["parameters"]["prompt"], ours["parameters"]["seed"]) == (PROMPT, 5)
    assert len(list((outputs / "users" / "alice").glob("*/*.png"))) >= 1  # History lists it


def test_a_second_identical_prompt_is_answered_from_the_cache(example, ckpt):
    graph = text_graph(ckpt, seed=11)
    _first_id, first = example.get_images(graph)
    second_id, second = example.get_images(graph)
    cached = [m["data"]["nodes"] for m in mine(example.messages, second_id) if m["type"] == "execution_cached"]
    assert sorted(cached[0]) == sorted(graph)  # every node
    again = mine(example.messages, second_id)
    assert not [m for m in again if m["type"] in ("progress", "executing") and m["data"]["node"]]
    assert [m["data"]["node"] for m in again if m["type"] == "executed"] == ["9"]  # as ComfyUI: clients collect images from it
    assert first["9"] == second["9"]


def test_comfy_api_simplified_with_basic_auth(url, ckpt):
    from comfy_api_simplified import ComfyApiWrapper, ComfyWorkflowWrapper

    graph = text_graph(ckpt, seed=21)
    for node_id, node in graph.items():
        node["_meta"] = {"title": "Save Image" if node_id == "9" else f"{node['class_type']} {node_id}"}
    api = ComfyApiWrapper(url, user=ALICE[0], password=ALICE[1])
    workflow = ComfyWorkflowWrapper(graph)
    workflow.set_node_param("CLIPTextEncode 6", "text", "a green square on a yellow background")
    images = api.queue_and_wait_images(workflow, "Save Image")
    (png,) = images.values()  # no previews asked for: the only binary frames would be previews
    from models.scoring import classify

    found = classify(Image.open(io.BytesIO(png)).convert("RGB"))
    assert (found.color, found.shape, found.background) == ("green", "square", "yellow")


def test_open_webui_calls_with_a_bearer_key_generate_and_edit(url, ckpt):
    """Open WebUI's comfyui.py: /object_info to verify, the websocket and every HTTP call with
    `Authorization: Bearer <key>`, JSON bodies; an edit uploads to /api/upload/image first."""

    async def run() -> tuple[bytes, bytes]:
        headers = {"User-Agent": "Mozilla/5.0", **bearer()}
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{url}/object_info", headers=headers) as r:
                assert r.status == 200 and "KSampler" in await r.json()
            made = await workflow(session, text_graph(ckpt, seed=3), headers)
            form = aiohttp.FormData()
            form.add_field("image", made, filename="from chat.png", content_type="image/png")
            form.add_field("type", "input")
            async with session.post(f"{url}/api/upload/image", data=form, headers=bearer()) as r:
                uploaded = await r.json()
            edit = text_graph(ckpt, prompt="a red circle on a green background", seed=4)
            edit["5"] = {"class_type": "VAEEncode", "inputs": {"pixels": ["10", 0], "vae": ["4", 2]}}
            edit["10"] = {"class_type": "LoadImage", "inputs": {"image": uploaded["name"]}}
            edit["3"]["inputs"]["denoise"] = 0.6
            return made, await workflow(session, edit, headers)

    async def workflow(session, graph, headers) -> bytes:
        client_id = str(uuid.uuid4())
        async with session.ws_connect(f"{url.replace('http://', 'ws://')}/ws?clientId={client_id}", headers=bearer()) as ws:
            async with session.post(f"{url}/prompt", json={"prompt": graph, "client_id": client_id}, headers=headers) as r:
                prompt_id = (await r.json())["prompt_id"]
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.TEXT:
                    data = json.loads(msg.data)
                    if data["type"] == "executing" and data["data"]["node"] is None and data["data"]["prompt_id"] == prompt_id:
                        break
        async with session.get(f"{url}/history/{prompt_id}", headers=headers) as r:
            history = (await r.json())[prompt_id]
        image = history["outputs"]["9"]["images"][0]
        async with session.get(f"{url}/view?{urllib.parse.urlencode(image)}", headers=headers) as r:
            assert r.status == 200
            return await r.read()

    made, edited = asyncio.run(run())
    from models.scoring import classify

    assert classify(Image.open(io.BytesIO(made)).convert("RGB")).background == "blue"
    assert classify(Image.open(io.BytesIO(edited)).convert("RGB")).background == "green"


def test_sillytavern_calls_with_the_key_in_the_path(url, ckpt):
    """SillyTavern's stable-diffusion.js: no credentials on its ComfyUI calls, so the key goes in the
    URL; /object_info read without guards, the body sent as text/plain, /history polled every 100 ms."""
    base = f"{url}/key/{KEY}"
    info = httpx.get(f"{base}/object_info").json()
    assert info["UNETLoader"]["input"]["required"]["unet_name"][0][0] == ckpt  # the models served (the video model after it)
    assert ckpt in info["CheckpointLoaderSimple"]["input"]["required"]["ckpt_name"][0]
    assert "euler" in info["KSampler"]["input"]["required"]["sampler_name"][0]
    assert "karras" in info["KSampler"]["input"]["required"]["scheduler"][0]
    assert info["VAELoader"]["input"]["required"]["vae_name"][0]
    assert httpx.get(f"{base}/system_stats").json()["devices"][0]["type"] == "cpu"
    body = json.dumps({"prompt": text_graph(ckpt, prompt="a blue triangle on a red background", seed=8)})
    answer = httpx.post(f"{base}/prompt", content=body, headers={"Content-Type": "text/plain;charset=UTF-8"})
    prompt_id = answer.json()["prompt_id"]
    deadline = time.monotonic() + 120
    while (item := httpx.get(f"{base}/history").json().get(prompt_id)) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert item["status"]["status_str"] == "success"
    image = next(iter(item["outputs"].values()))["images"][0]
    view = httpx.get(f"{base}/view?filename={image['filename']}&subfolder={image['subfolder']}&type={image['type']}")
    from models.scoring import classify

    assert classify(Image.open(io.BytesIO(view.content)).convert("RGB")).shape == "triangle"
    assert httpx.get(f"{url}/key/not-a-key/object_info").status_code == 401


def test_shapes_adherence_through_the_api_on_20_prompts(url, ckpt):
    from models.eval import prompt_for, random_prompts
    from models.scoring import classify

    ids, wanted = [], random_prompts(20, seed=7)
    for n, scene in enumerate(wanted):
        graph = text_graph(ckpt, prompt=prompt_for(*scene), seed=1000 + n, steps=10)
        ids.append(httpx.post(f"{url}/prompt", json={"prompt": graph}, headers=bearer()).json()["prompt_id"])
    assert until(lambda: set(ids) <= set(httpx.get(f"{url}/history", headers=bearer()).json()), timeout=300)
    history = httpx.get(f"{url}/history", headers=bearer()).json()
    right = 0
    for prompt_id, scene in zip(ids, wanted, strict=True):
        image = history[prompt_id]["outputs"]["9"]["images"][0]
        png = httpx.get(f"{url}/view", params=image, headers=bearer()).content
        found = classify(Image.open(io.BytesIO(png)).convert("RGB"))
        right += (found.color, found.shape, found.background) == scene
    assert right / len(ids) >= 0.9, right


def test_two_samplers_on_an_enlarged_latent_are_our_hires_fix(example, ckpt, engine):
    graph = text_graph(ckpt, seed=9, steps=8)
    graph["10"] = {"class_type": "LatentUpscaleBy", "inputs": {"samples": ["3", 0], "upscale_method": "bilinear", "scale_by": 1.5}}
    graph["11"] = {"class_type": "KSampler", "inputs": {**graph["3"]["inputs"], "latent_image": ["10", 0], "denoise": 0.5, "steps": 4}}
    graph["8"]["inputs"]["samples"] = ["11", 0]
    _, images = example.get_images(graph)
    hires = Hires(hires_fix=True, hires_upscaler="Latent", hires_width=96, hires_height=96, hires_steps=8, hires_strength=0.5)
    expected = engine.run(same_request(steps=8, seed=9).model_copy(update={"hires": hires})).images[0]
    with Image.open(io.BytesIO(images["9"][0])) as got:
        assert got.size == (96, 96)
        assert np.abs(pixels(got) - pixels(expected)).max() <= 1


def test_interrupt_stops_a_150_step_run_within_one_step(example, ckpt, app, monkeypatch):
    backend = app.studio.engine.backend
    hold = HoldAtStep(backend.generate, step=3)
    monkeypatch.setattr(backend, "generate", hold)
    prompt_id = example.queue_prompt(text_graph(ckpt, seed=31, steps=150))["prompt_id"]
    assert hold.reached.wait(120), hold
    assert json.loads(example.get(f"/history/{prompt_id}")) == {}  # running: SillyTavern polls on this
    assert httpx.post(f"{example_url(example)}/interrupt", headers=basic()).status_code == 200
    assert until(lambda: json.loads(example.get(f"/history/{prompt_id}")), timeout=60)
    item = json.loads(example.get(f"/history/{prompt_id}"))[prompt_id]
    assert item["status"]["status_str"] == "error"
    assert [m[0] for m in item["status"]["messages"]][-1] == "execution_interrupted"
    assert hold.stopped_early() and max(hold.steps) <= 4, hold.steps


def example_url(example: Example) -> str:
    return f"http://{example.address}"


def test_each_caller_sees_only_its_own_prompts_and_files(example, ckpt, url):
    prompt_id, _images = example.get_images(text_graph(ckpt, seed=41))
    image = json.loads(example.get(f"/history/{prompt_id}"))[prompt_id]["outputs"]["9"]["images"][0]
    as_bob = basic(BOB)
    assert httpx.get(f"{url}/history/{prompt_id}", headers=as_bob).json() == {}
    assert prompt_id not in httpx.get(f"{url}/history", headers=as_bob).json()
    assert httpx.get(f"{url}/view", params=image, headers=as_bob).status_code == 404
    httpx.post(f"{url}/history", json={"delete": [prompt_id]}, headers=as_bob)
    assert prompt_id in json.loads(example.get(f"/history/{prompt_id}"))  # bob deleted nothing of alice's
    reused = httpx.post(f"{url}/prompt", json={"prompt": text_graph(ckpt), "prompt_id": prompt_id}, headers=as_bob)
    assert reused.status_code == 400
    assert httpx.get(f"{url}/object_info", headers={}).status_code == 401
    with pytest.raises(websocket.WebSocketException):
        websocket.create_connection(f"ws://{example.address}/ws?clientId=x", timeout=10)


def bad(graph_edit) -> dict:
    def make(ckpt: str) -> dict:
        graph = text_graph(ckpt)
        graph_edit(graph)
        return graph

    return make


REFUSED = {
    "unknown class": (bad(lambda g: g.update({"12": {"class_type": "IPAdapterApply", "inputs": {}}})), "12", "class_type"),
    "wrong link type": (bad(lambda g: g["3"]["inputs"].update(model=["4", 1])), "3", "model"),
    "missing link target": (bad(lambda g: g["3"]["inputs"].update(positive=["99", 0])), "3", "positive"),
    "missing input": (bad(lambda g: g["3"]["inputs"].pop("seed")), "3", "seed"),
    "steps out of bounds": (bad(lambda g: g["3"]["inputs"].update(steps=151)), "3", "steps"),
    "cfg not a number": (bad(lambda g: g["3"]["inputs"].update(cfg="lots")), "3", "cfg"),
    "unknown sampler": (bad(lambda g: g["3"]["inputs"].update(sampler_name="euler_magic")), "3", "sampler_name"),
    "unknown checkpoint": (bad(lambda g: g["4"]["inputs"].update(ckpt_name="../../v1-5.ckpt")), "4", "ckpt_name"),
    "cycle": (bad(lambda g: g["3"]["inputs"].update(latent_image=["12", 0]) or g.update({
        "12": {"class_type": "LatentUpscaleBy", "inputs": {"samples": ["13", 0], "upscale_method": "bilinear", "scale_by": 1}},
        "13": {"class_type": "LatentUpscaleBy", "inputs": {"samples": ["12", 0], "upscale_method": "bilinear", "scale_by": 1}},
    })), "12", "links"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_bad_graph_is_a_400_naming_the_node_and_input(url, ckpt, case):
    make, node, name = REFUSED[case]
    answer = httpx.post(f"{url}/prompt", json={"prompt": make(ckpt)}, headers=bearer())
    assert answer.status_code == 400, answer.text
    errors = answer.json()["node_errors"]
    assert node in errors, errors
    assert name in {e["extra_info"]["input_name"] for e in errors[node]["errors"]}, errors
    assert httpx.get(f"{url}/object_info/KSampler", headers=bearer()).status_code == 200  # alive


@pytest.mark.parametrize(
    "body",
    [
        {"prompt": {str(n): {"class_type": "EmptyLatentImage", "inputs": {}} for n in range(10_000)}},
        "[" * 100_000 + "]" * 100_000,
        {"prompt": {}},
        {"nothing": 1},
        {"prompt": {"1": {"class_type": "EmptyLatentImage", "inputs": {"width": 64, "height": 64, "batch_size": 1}}}},
    ],
    ids=["10000 nodes", "deep JSON", "empty", "no prompt", "no output node"],
)
def test_a_malformed_or_huge_body_is_a_4xx(url, body):
    content = body if isinstance(body, str) else json.dumps(body)
    answer = httpx.post(f"{url}/prompt", content=content, headers=bearer(), timeout=60)
    assert 400 <= answer.status_code < 500, answer.text
    assert httpx.get(f"{url}/system_stats", headers=bearer()).status_code == 200


def test_view_serves_the_callers_own_files_and_refuses_path_tricks(example, ckpt, url, outputs):
    prompt_id, _images = example.get_images(text_graph(ckpt, seed=91))
    image = json.loads(example.get(f"/history/{prompt_id}"))[prompt_id]["outputs"]["9"]["images"][0]
    assert httpx.get(f"{url}/view", params=image, headers=basic()).status_code == 200
    secret = outputs / "users" / "bob" / image["subfolder"] / "secret.png"  # another caller's file, really there
    secret.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (4, 4)).save(secret)
    (outputs / "top.png").write_bytes(secret.read_bytes())
    tricks = [
        {"filename": "secret.png", "subfolder": f"../bob/{image['subfolder']}", "type": "output"},
        {"filename": f"../../bob/{image['subfolder']}/secret.png", "subfolder": image["subfolder"], "type": "output"},
        {"filename": str(secret), "type": "output"},
        {"filename": "top.png", "subfolder": "../..", "type": "output"},
        {"filename": "top.png", "subfolder": "..", "type": "output"},
        {"filename": image["filename"], "subfolder": image["subfolder"], "type": "../output"},
        {"filename": "..", "type": "output"},
        {"filename": "secret.png", "subfolder": image["subfolder"], "type": "output"},  # bob's name, in alice's folder
    ]
    for params in tricks:
        assert httpx.get(f"{url}/view", params=params, headers=basic()).status_code == 404, params
    assert httpx.get(f"{url}/view", params={"filename": "secret.png", "subfolder": image["subfolder"]},
                     headers=basic(BOB)).status_code == 200  # fmt: skip


def test_uploads_keep_only_a_plain_name_and_only_pictures(url):
    answer = upload(url, Image.new("RGB", (8, 8), "red"), "../../escape.png", bearer())
    assert answer.status_code == 200 and answer.json()["name"] == "escape.png"
    info = httpx.get(f"{url}/object_info/LoadImage", headers=bearer()).json()
    assert "escape.png" in info["LoadImage"]["input"]["required"]["image"][0]
    assert "escape.png" not in httpx.get(f"{url}/object_info/LoadImage", headers=basic(BOB)).json()["LoadImage"]["input"]["required"]["image"][0]
    not_a_picture = {"image": ("notes.png", b"#!/bin/sh\necho hi\n", "image/png")}
    assert httpx.post(f"{url}/upload/image", files=not_a_picture, headers=bearer()).status_code == 400


def test_queue_and_system_stats_shapes(url):
    queue = httpx.get(f"{url}/api/queue", headers=bearer()).json()
    assert set(queue) == {"queue_running", "queue_pending"}
    stats = httpx.get(f"{url}/api/system_stats", headers=bearer()).json()
    assert stats["system"]["ram_total"] > 0 and stats["devices"][0]["name"]
    assert httpx.get(f"{url}/api/models/checkpoints", headers=bearer()).json()
    assert until(lambda: httpx.get(f"{url}/api/prompt", headers=bearer()).json() == {"exec_info": {"queue_remaining": 0}})


def test_the_custom_sampling_family_is_a_ksampler_put_together(example, ckpt):
    """Krita's way: RandomNoise + KSamplerSelect + BasicScheduler + CFGGuider into SamplerCustomAdvanced."""
    plain = text_graph(ckpt, seed=51)
    custom = {k: v for k, v in plain.items() if k != "3"}
    custom |= {
        "20": {"class_type": "RandomNoise", "inputs": {"noise_seed": 51}},
        "21": {"class_type": "KSamplerSelect", "inputs": {"sampler_name": "euler"}},
        "22": {"class_type": "BasicScheduler", "inputs": {"model": ["4", 0], "scheduler": "normal", "steps": 6, "denoise": 1.0}},
        "23": {"class_type": "CFGGuider", "inputs": {"model": ["4", 0], "positive": ["6", 0], "negative": ["7", 0], "cfg": 4}},
        "3": {"class_type": "SamplerCustomAdvanced", "inputs": {"noise": ["20", 0], "guider": ["23", 0], "sampler": ["21", 0],
                                                                "sigmas": ["22", 0], "latent_image": ["5", 0]}},
    }  # fmt: skip
    _, expected = example.get_images(plain)
    _, got = example.get_images(custom)
    assert got["9"] == expected["9"] or np.array_equal(
        pixels(Image.open(io.BytesIO(got["9"][0]))), pixels(Image.open(io.BytesIO(expected["9"][0])))
    )


def test_clip_set_last_layer_is_our_clip_skip(example, ckpt, engine):
    """CLIPSetLastLayer -2 between the checkpoint and the prompts: A1111's Clip skip 2, the same image."""
    graph = text_graph(ckpt, seed=57)
    graph["10"] = {"class_type": "CLIPSetLastLayer", "inputs": {"clip": ["4", 1], "stop_at_clip_layer": -2}}
    for encoder in ("6", "7"):
        graph[encoder]["inputs"]["clip"] = ["10", 0]
    _, images = example.get_images(graph)
    expected = engine.run(same_request(seed=57, clip_skip=2)).images[0]
    plain = engine.run(same_request(seed=57)).images[0]
    with Image.open(io.BytesIO(images["9"][0])) as got:
        assert np.abs(pixels(got) - pixels(expected)).max() == 0
        assert np.abs(pixels(got) - pixels(plain)).max() > 0  # an earlier layer: another image


def test_a_controlnet_graph_is_our_controlnet_unit(example, ckpt, engine):
    from pipelines.schema.control import ControlUnit

    name = engine.model_info().controlnets[0]
    hint = Image.new("RGB", (64, 64), "black")
    hint.paste((255, 255, 255), (8, 8, 40, 56))
    uploaded = upload(example_url(example), hint, "hint.png", basic()).json()
    graph = text_graph(ckpt, seed=61)
    graph |= {
        "30": {"class_type": "ControlNetLoader", "inputs": {"control_net_name": name}},
        "31": {"class_type": "LoadImage", "inputs": {"image": uploaded["name"]}},
        "32": {"class_type": "ControlNetApplyAdvanced", "inputs": {"positive": ["6", 0], "negative": ["7", 0], "control_net": ["30", 0],
               "image": ["31", 0], "strength": 0.8, "start_percent": 0.0, "end_percent": 0.9}},
    }  # fmt: skip
    graph["3"]["inputs"] |= {"positive": ["32", 0], "negative": ["32", 1]}
    _, images = example.get_images(graph)
    unit = ControlUnit(image=hint, module="none", model=name, weight=0.8, guidance_start=0.0, guidance_end=0.9)
    expected = engine.run(same_request(seed=61, controlnet=(unit,))).images[0]
    plain = engine.run(same_request(seed=61)).images[0]
    with Image.open(io.BytesIO(images["9"][0])) as got:
        assert np.abs(pixels(got) - pixels(expected)).max() == 0
        assert np.abs(pixels(got) - pixels(plain)).max() > 0  # the ControlNet did something


def test_an_inpaint_graph_redraws_only_under_the_mask(example, ckpt, engine):
    from pipelines.schema.inpaint import Inpaint

    picture = Image.new("RGBA", (64, 64), (0, 0, 255, 255))
    picture.paste((0, 0, 0, 0), (16, 16, 48, 48))  # transparent: LoadImage's mask
    uploaded = upload(example_url(example), picture, "hole.png", basic()).json()
    graph = text_graph(ckpt, seed=71)
    graph |= {
        "40": {"class_type": "LoadImage", "inputs": {"image": uploaded["name"]}},
        "41": {"class_type": "VAEEncode", "inputs": {"pixels": ["40", 0], "vae": ["4", 2]}},
        "5": {"class_type": "SetLatentNoiseMask", "inputs": {"samples": ["41", 0], "mask": ["40", 1]}},
    }
    graph["3"]["inputs"]["denoise"] = 0.8
    _, images = example.get_images(graph)
    mask = Image.new("L", (64, 64), 0)
    mask.paste(255, (16, 16, 48, 48))
    request = same_request(seed=71, steps=8, init_images=[picture.convert("RGB")], strength=0.8,
                           inpaint=Inpaint(mask=mask, mask_blur=0))  # fmt: skip
    expected = engine.run(request).images[0]
    with Image.open(io.BytesIO(images["9"][0])) as got:
        assert np.abs(pixels(got) - pixels(expected)).max() == 0
        assert np.abs(pixels(got)[:8, :8] - np.array([0, 0, 255])).max() <= 8  # outside the mask: kept


def test_previews_are_jpeg_frames_only_when_asked_and_the_workflow_is_kept(url, ckpt):
    client_id = str(uuid.uuid4())
    ws = websocket.create_connection(f"ws://{url.split('//')[1]}/ws?clientId={client_id}", header=[f"Authorization: Bearer {KEY}"])
    workflow = {"nodes": [{"id": 9, "type": "SaveImage"}], "links": []}
    frames: dict[str, list] = {}
    for method in ("none", "auto"):
        body = {"prompt": text_graph(ckpt, seed=81 if method == "none" else 82, steps=12), "client_id": client_id,
                "extra_data": {"preview_method": method, "extra_pnginfo": {"workflow": workflow}}}  # fmt: skip
        prompt_id = httpx.post(f"{url}/prompt", json=body, headers=bearer()).json()["prompt_id"]
        frames[method] = []
        while True:
            out = ws.recv()
            if isinstance(out, bytes):
                frames[method].append(out)
            elif (m := json.loads(out))["type"] == "executing" and m["data"]["node"] is None and m["data"]["prompt_id"] == prompt_id:
                break
    ws.close()
    assert frames["none"] == [] and frames["auto"]
    for frame in frames["auto"]:
        assert frame[:8] == (1).to_bytes(4, "big") + (1).to_bytes(4, "big")
        with Image.open(io.BytesIO(frame[8:])) as preview:
            assert preview.format == "JPEG"
    item = httpx.get(f"{url}/history/{prompt_id}", headers=bearer()).json()[prompt_id]
    png = httpx.get(f"{url}/view", params=item["outputs"]["9"]["images"][0], headers=bearer()).content
    with Image.open(io.BytesIO(png)) as saved:
        assert json.loads(saved.text["workflow"]) == workflow


def test_the_node_table_in_the_docs_is_generated_from_the_nodes():
    from tests.comfy_page import PAGE, page

    assert PAGE.read_text(encoding="utf-8") == page(), "docs/comfyui-api.md is stale: run python -m tests.comfy_page"


def test_a_caller_at_queue_per_user_waits_while_others_prompts_run():
    """With QUEUE_PER_USER=1 on a pool of two, alice's second prompt would be refused by the engine:
    it waits, and bob's prompt behind it runs first."""
    from types import SimpleNamespace

    from webapi.comfy.service import Entry, Prompts

    engine = SimpleNamespace(admission=SimpleNamespace(per_caller=1))
    prompts = Prompts(engine, folders=None, workers=0)  # no workers: the choice alone is checked
    entries = [Entry(f"p{n}", n, owner, None, None, None, {}) for n, owner in enumerate(["alice", "alice", "bob"])]
    prompts._pending = list(entries)
    prompts._running = {"p0": entries[0]}
    prompts._pending.remove(entries[0])
    assert prompts._runnable() is entries[2]
    prompts._running = {}
    assert prompts._runnable() is entries[1]


def test_an_upload_replaced_under_the_same_name_is_not_served_from_the_cache(example):
    graph = {"1": {"class_type": "LoadImage", "inputs": {"image": "swatch.png"}},
             "2": {"class_type": "SaveImage", "inputs": {"images": ["1", 0], "filename_prefix": "swatch"}}}  # fmt: skip
    seen = []
    for colour in ("red", "blue"):
        replaced = upload(example_url(example), Image.new("RGB", (8, 8), colour), "swatch.png", basic(), overwrite="true")
        assert replaced.json()["name"] == "swatch.png"
        _, images = example.get_images(graph)
        with Image.open(io.BytesIO(images["2"][0])) as saved:
            seen.append(saved.convert("RGB").getpixel((0, 0)))
    assert seen == [(255, 0, 0), (0, 0, 255)]


@pytest.mark.parametrize(
    ("edit", "node", "name"),
    [
        (lambda g: g["5"]["inputs"].update(batch_size=17), "5", "batch_size"),
        (lambda g: g["5"]["inputs"].update(width=4096, height=4096), "5", "width"),
        (lambda g: g["3"]["inputs"].update(cfg=10**400), "3", "cfg"),
    ],
    ids=["batch over MAX_BATCH", "pixels over the model's", "a 400-digit CFG"],
)
def test_sizes_and_numbers_beyond_the_models_limits_are_refused_before_running(url, ckpt, edit, node, name):
    graph = text_graph(ckpt)
    edit(graph)
    answer = httpx.post(f"{url}/prompt", json={"prompt": graph}, headers=bearer())
    assert answer.status_code == 400, answer.text
    assert name in {e["extra_info"]["input_name"] for e in answer.json()["node_errors"][node]["errors"]}


def test_odd_but_valid_graphs_run(example, ckpt):
    """As ComfyUI: a node no output needs is neither checked nor run, node ids need not be numbers,
    a size off the model's multiple runs at the multiple below (with a warning)."""
    graph = {("²" if k == "3" else k): v for k, v in text_graph(ckpt, seed=95, size=70).items()}
    graph["8"]["inputs"]["samples"] = ["²", 0]
    graph["50"] = {"class_type": "LoadImage", "inputs": {"image": "not-uploaded.png"}}
    prompt_id, images = example.get_images(graph)
    with Image.open(io.BytesIO(images["9"][0])) as got:
        assert got.size == (64, 64)
    item = json.loads(example.get(f"/history/{prompt_id}"))[prompt_id]
    assert any("70x70 runs as 64x64" in m[1]["message"] for m in item["status"]["messages"] if m[0] == "warning")
    assert httpx.post(f"{example_url(example)}/queue", json=[1, 2], headers=basic()).status_code == 200
    assert httpx.post(f"{example_url(example)}/history", json="clear", headers=basic()).status_code == 200


def test_pictures_in_the_prompt_and_out_over_the_websocket(url, ckpt, engine):
    """A plugin's way (comfyui-tooling-nodes): the canvas as base64 in the prompt, the results as
    binary PNG frames (event 1, format 2) to the prompt's client, nothing read from or written to disk."""
    import random

    from models.train.world import draw, random_scene

    scene = draw(random_scene(random.Random(3))).convert("RGB")
    graph = text_graph(ckpt, prompt="a red circle on a green background", seed=101)
    graph |= {
        "60": {"class_type": "ETN_LoadImageBase64", "inputs": {"image": base64.b64encode(png_bytes(scene)).decode()}},
        "5": {"class_type": "VAEEncode", "inputs": {"pixels": ["60", 0], "vae": ["4", 2]}},
        "9": {"class_type": "ETN_SendImageWebSocket", "inputs": {"images": ["8", 0], "format": "PNG"}},
    }
    graph["3"]["inputs"]["denoise"] = 0.6
    client_id = str(uuid.uuid4())
    ws = websocket.create_connection(f"ws://{url.split('//')[1]}/ws?clientId={client_id}", header=[f"Authorization: Bearer {KEY}"])
    prompt_id = httpx.post(f"{url}/prompt", json={"prompt": graph, "client_id": client_id}, headers=bearer()).json()["prompt_id"]
    frames = []
    while True:
        out = ws.recv()
        if isinstance(out, bytes):
            frames.append(out)
        elif (m := json.loads(out))["type"] == "executing" and m["data"]["node"] is None and m["data"]["prompt_id"] == prompt_id:
            break
    ws.close()
    (frame,) = frames
    assert frame[:8] == (1).to_bytes(4, "big") + (2).to_bytes(4, "big")
    request = same_request(prompt="a red circle on a green background", seed=101, steps=10, init_images=[scene], strength=0.6)
    expected = engine.run(request).images[0]
    with Image.open(io.BytesIO(frame[8:])) as got:
        assert got.format == "PNG" and np.abs(pixels(got) - pixels(expected)).max() == 0


def test_comfy_api_simplified_takes_websocket_images(url, ckpt):
    """comfy-api-simplified's other path: images sent over the websocket (SaveImageWebsocket) are its result."""
    from comfy_api_simplified import ComfyApiWrapper

    graph = text_graph(ckpt, prompt="a yellow triangle on a blue background", seed=111)
    graph["9"] = {"class_type": "SaveImageWebsocket", "inputs": {"images": ["8", 0]}}
    for node_id, node in graph.items():
        node["_meta"] = {"title": f"{node['class_type']} {node_id}"}
    images = ComfyApiWrapper(url, user=ALICE[0], password=ALICE[1]).queue_and_wait_images(graph, "SaveImageWebsocket 9")
    (png,) = images.values()
    from models.scoring import classify

    assert classify(Image.open(io.BytesIO(png)).convert("RGB")).shape == "triangle"


# ------------------------------------------------------------------ video: Wan's API graphs on the video model

VIDEO_PROMPT = "a red circle moving left on a blue background"


@pytest.fixture(scope="module")
def video_model(url, ckpt) -> str:
    """The video model served beside the image model (the embedded tiny-shapes-video), as UNETLoader lists it."""
    served = httpx.get(f"{url}/object_info/UNETLoader", headers=bearer()).json()["UNETLoader"]["input"]["required"]["unet_name"][0]
    assert served[0] == ckpt and len(served) == 2, served
    return served[1]


def wan_graph(video: str, latent: dict, steps: int = 4, seed: int = 3, prompt: str = VIDEO_PROMPT) -> dict:
    """ComfyUI's Wan text-to-video example graph in API format (its node ids), at our video model's size, with
    both ways it saves: SaveAnimatedWEBP (Wan 2.1's example) and CreateVideo + SaveVideo (Wan 2.2's)."""
    return {
        "37": {"class_type": "UNETLoader", "inputs": {"unet_name": video, "weight_dtype": "default"}},
        "38": {"class_type": "CLIPLoader", "inputs": {"clip_name": video, "type": "wan", "device": "default"}},
        "39": {"class_type": "VAELoader", "inputs": {"vae_name": video}},
        "48": {"class_type": "ModelSamplingSD3", "inputs": {"model": ["37", 0], "shift": 8.0}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": prompt, "clip": ["38", 0]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "", "clip": ["38", 0]}},
        "40": latent,
        "3": {"class_type": "KSampler", "inputs": {
            "model": ["48", 0], "seed": seed, "steps": steps, "cfg": 5.0, "sampler_name": "uni_pc", "scheduler": "simple",
            "positive": ["6", 0], "negative": ["7", 0], "latent_image": ["40", 0], "denoise": 1.0}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["39", 0]}},
        "28": {"class_type": "SaveAnimatedWEBP", "inputs": {
            "images": ["8", 0], "filename_prefix": "ComfyUI", "fps": 8.0, "lossless": True, "quality": 90, "method": "default"}},
        "50": {"class_type": "CreateVideo", "inputs": {"images": ["8", 0], "fps": 8.0}},
        "51": {"class_type": "SaveVideo", "inputs": {"video": ["50", 0], "filename_prefix": "video/ComfyUI", "format": "auto",
                                                     "codec": "auto"}},
    }  # fmt: skip


def empty_video(length: int = 17, size: int = 64, batch: int = 1) -> dict:
    return {"class_type": "EmptyHunyuanLatentVideo", "inputs": {"width": size, "height": size, "length": length, "batch_size": batch}}


def clip_file(data: bytes, tmp_path, name: str):
    path = tmp_path / name
    path.write_bytes(data)
    return path


def saved_clips(item: dict) -> tuple[dict, dict]:
    """The history's outputs of the WebP and the MP4 node, in ComfyUI's shape for animated images and videos."""
    webp, mp4 = item["outputs"]["28"], item["outputs"]["51"]
    for out, suffix in ((webp, ".webp"), (mp4, ".mp4")):
        assert set(out) == {"images", "animated"} and out["animated"] == [True], out
        (saved,) = out["images"]
        assert set(saved) == {"filename", "subfolder", "type"} and saved["type"] == "output", saved
        assert saved["filename"].endswith(suffix)
    return webp["images"][0], mp4["images"][0]


def test_a_wan_text_to_video_graph_is_one_video_request_saved_as_webp_and_mp4(example, engine, video_model, tmp_path):
    from pipelines import read_frames, read_png_info, read_video

    prompt_id, files = example.get_images(wan_graph(video_model, empty_video()))
    item = json.loads(example.get(f"/history/{prompt_id}"))[prompt_id]
    assert item["status"]["status_str"] == "success", item["status"]
    saved_clips(item)
    progress = [m["data"] for m in mine(example.messages, prompt_id) if m["type"] == "progress"]
    # the 4 steps, then the embedded model's refine pass (int(4 x 0.65) = 2 steps: pipelines.video.refine)
    assert [p["value"] for p in progress] == [1, 2, 3, 4, 5, 6] and {p["max"] for p in progress} == {6}
    assert {p["node"] for p in progress} == {"3"}
    warnings = [m[1]["message"] for m in item["status"]["messages"] if m[0] == "warning"]
    assert any("shift 8 is not applied" in w for w in warnings), warnings
    expected = engine.run(GenerationRequest(prompt=VIDEO_PROMPT, seed=3, steps=4, guidance_scale=5.0, width=64, height=64,
                                            num_frames=17, sampler="UniPC")).clips[0]  # fmt: skip
    (webp,), (mp4,) = files["28"], files["51"]
    with Image.open(io.BytesIO(webp)) as animated:
        assert (animated.format, animated.n_frames) == ("WEBP", 17)
        got = [(frame.convert("RGB"), frame.info["duration"]) for frame in ImageSequence.Iterator(animated)]
        exif = animated.getexif()
    assert {ms for _, ms in got} == {125}  # ComfyUI's int(1000 / fps)
    got = [frame for frame, _ in got]
    assert json.loads(exif[0x0110].removeprefix("prompt:"))["28"]["class_type"] == "SaveAnimatedWEBP"  # where ComfyUI reads it
    assert read_png_info(clip_file(webp, tmp_path, "clip.webp"))["parameters"]["prompt"] == VIDEO_PROMPT
    assert max(np.abs(pixels(a) - pixels(b)).max() for a, b in zip(got, expected, strict=True)) == 0  # lossless: the clip exactly
    path = clip_file(mp4, tmp_path, "clip.mp4")
    clip = read_video(path)
    assert (clip.frames, clip.fps, clip.width, clip.height) == (17, 8.0, 64, 64)
    assert np.mean([np.abs(pixels(a) - pixels(b)).mean() for a, b in zip(read_frames(path), expected, strict=True)]) < 6  # H.264
    assert json.loads(clip.metadata["prompt"])["40"]["class_type"] == "EmptyHunyuanLatentVideo"  # ComfyUI's graph inside
    fields = read_png_info(path)["parameters"]
    assert (fields["prompt"], fields["seed"], fields["num_frames"]) == (VIDEO_PROMPT, 3, 17)  # and our parameters


@pytest.mark.parametrize("node", ["Wan22ImageToVideoLatent", "WanImageToVideo"])
def test_a_wan_image_to_video_graph_starts_from_the_uploaded_image(example, url, video_model, node, tmp_path):
    from models.train.video_world import Clip
    from models.train.world import Scene
    from pipelines import read_frames, read_video

    first = Clip(Scene("yellow", "square", "purple", 0.3, 0.5, 0.5, 0.0), "right").frame(0)
    name = upload(url, first, f"start-{node}.png", basic()).json()["name"]
    graph = wan_graph(video_model, {}, prompt="a yellow square moving right on a purple background", seed=1)
    graph["52"] = {"class_type": "LoadImage", "inputs": {"image": name}}
    size = {"width": 64, "height": 64, "length": 17, "batch_size": 1, "start_image": ["52", 0]}
    if node == "Wan22ImageToVideoLatent":
        graph["40"] = {"class_type": node, "inputs": {"vae": ["39", 0], **size}}
    else:  # Wan 2.1's I2V graph: CLIP vision on the start image, the conditionings through the node
        graph["49"] = {"class_type": "CLIPVisionLoader", "inputs": {"clip_name": video_model}}
        graph["53"] = {"class_type": "CLIPVisionEncode", "inputs": {"clip_vision": ["49", 0], "image": ["52", 0], "crop": "none"}}
        graph["40"] = {"class_type": node, "inputs": {"positive": ["6", 0], "negative": ["7", 0], "vae": ["39", 0],
                                                      "clip_vision_output": ["53", 0], **size}}  # fmt: skip
        graph["3"]["inputs"] |= {"positive": ["40", 0], "negative": ["40", 1], "latent_image": ["40", 2]}
    prompt_id, files = example.get_images(graph)
    item = json.loads(example.get(f"/history/{prompt_id}"))[prompt_id]
    assert item["status"]["status_str"] == "success", item["status"]
    saved_clips(item)
    path = clip_file(files["51"][0], tmp_path, "i2v.mp4")
    frames = read_frames(path)
    assert read_video(path).frames == len(frames) == 17
    given = pixels(first)
    assert np.abs(pixels(frames[0]) - given).mean() < 6  # the start image through the VAE and H.264 (2.8; 13 from text alone)
    assert np.abs(pixels(frames[0]) - pixels(Image.new("RGB", (64, 64), "purple"))).mean() > 12  # not just its background


VIDEO_REFUSED = {
    "length off the frame step": (lambda g: g["40"]["inputs"].update(length=18), "40", "length", "17 or 21"),
    "more frames than the model": (lambda g: g["40"]["inputs"].update(length=37), "40", "length", "more than"),
    "ComfyUI's default size": (lambda g: g["40"]["inputs"].update(width=848, height=480), "40", "width", "pixels"),
    "batch over MAX_BATCH": (lambda g: g["40"]["inputs"].update(batch_size=17), "40", "batch_size", "MAX_BATCH"),
    "a model not served": (lambda g: g["37"]["inputs"].update(unet_name="wan2.1_t2v_1.3B_fp16.safetensors"), "37", "unet_name", "not one of"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(VIDEO_REFUSED))
def test_a_video_graph_the_model_cannot_run_is_a_400_naming_the_node(url, video_model, case):
    edit, node, name, why = VIDEO_REFUSED[case]
    graph = wan_graph(video_model, empty_video())
    edit(graph)
    answer = httpx.post(f"{url}/prompt", json={"prompt": graph}, headers=bearer())
    assert answer.status_code == 400, answer.text
    body = answer.json()
    assert set(body) == {"error", "node_errors"} and body["node_errors"][node]["class_type"] == graph[node]["class_type"]
    errors = {e["extra_info"]["input_name"]: e["message"] for e in body["node_errors"][node]["errors"]}
    assert why in errors[name], errors


def test_a_video_latent_on_the_image_model_is_an_error_naming_the_sampler(example, ckpt, video_model):
    graph = wan_graph(video_model, empty_video())
    graph["3"]["inputs"]["model"] = ["60", 0]
    graph["60"] = {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": ckpt}}
    prompt_id, _ = example.get_images(graph)
    item = json.loads(example.get(f"/history/{prompt_id}"))[prompt_id]
    kind, data = item["status"]["messages"][-1]
    assert (item["status"]["status_str"], kind, data["node_id"]) == ("error", "execution_error", "3")
    assert "sampled by the video model" in data["exception_message"]


def video_limits(**changes):
    from webapi.comfy.registry import VideoLimits

    fields = dict(name="v", frame_step=4, max_frames=33, text_to_video=True, image_to_video=True, max_batch=16,
                  max_pixels=64 * 64, max_side=256)  # fmt: skip
    return VideoLimits(**(fields | changes))


@pytest.mark.parametrize(
    ("video", "start", "why"),
    [
        (None, False, "no video model is served here"),
        (video_limits(image_to_video=False), True, "has no image-to-video"),
        (video_limits(text_to_video=False), False, "is image-to-video: give it a start_image"),
    ],
    ids=["no video model", "no image-to-video", "image-to-video only"],
)
def test_what_the_served_video_model_cannot_do_is_refused_in_comfyuis_shape(video, start, why):
    """Checked with the catalog a server without a video model (or with another kind) would offer."""
    from webapi.comfy.graph import Invalid, check
    from webapi.comfy.registry import Catalog

    catalog = Catalog(models=("m",), loras=(), samplers=("uni_pc",), schedulers=("simple",), uploads=("a.png",),
                      upscale_models=(), latent_methods=(), video=video)  # fmt: skip
    graph = wan_graph("m", {"class_type": "Wan22ImageToVideoLatent", "inputs": {
        "vae": ["39", 0], "width": 64, "height": 64, "length": 17, "batch_size": 1}})  # fmt: skip
    if start:
        graph["52"] = {"class_type": "LoadImage", "inputs": {"image": "a.png"}}
        graph["40"]["inputs"]["start_image"] = ["52", 0]
    with pytest.raises(Invalid) as refused:
        check(graph, catalog)
    errors = refused.value.body["node_errors"]["40"]["errors"]
    assert any(why in e["message"] for e in errors), errors
