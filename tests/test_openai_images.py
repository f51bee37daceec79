"""OpenAI's images API (`/v1/images/*`, `/v1/models`) through the real `openai` client, against the app
as `python app.py` builds it (the embedded tiny-shapes model with its instruction editor beside it),
with API_KEYS and AUTH set and QUEUE_PER_USER=1."""

from __future__ import annotations

import base64
import io
import random
from types import SimpleNamespace

import httpx
import numpy as np
import openai
import pytest
from PIL import Image, ImageDraw

from pipelines.run.options import DEFAULT_MODEL
from tests.app_server import embedded_model_available, running_app
from tests.sync import HoldAtStep, in_thread, send_and_leave, until

KEY = "test-key-0123456789abcdef"
USER, PASSWORD = "alice", "wonderland-42"
PROMPT = "a red circle on a blue background"
FAST = {"steps": 3}
BOX = (16, 16, 40, 40)  # the edited region of the transparent-region mask (inclusive)


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    return tmp_path_factory.mktemp("outputs")


@pytest.fixture(scope="module")
def app(outputs):
    if not embedded_model_available():
        pytest.skip("needs the embedded model (models/tiny-shapes)")
    env = {"API_KEYS": KEY, "AUTH": f"{USER}:{PASSWORD}", "QUEUE_PER_USER": "1"}
    with running_app(DEFAULT_MODEL, outputs, env=env) as (demo, _):
        yield demo


@pytest.fixture(scope="module")
def url(app) -> str:
    return app.local_url.rstrip("/")


@pytest.fixture(scope="module")
def client(url) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def scene() -> bytes:
    from models.train.world import draw, random_scene

    buffer = io.BytesIO()
    draw(random_scene(random.Random(1))).convert("RGB").save(buffer, format="PNG")
    return buffer.getvalue()


def png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def decode(b64: str) -> Image.Image:
    data = base64.b64decode(b64)
    assert data.startswith(b"\x89PNG")
    return Image.open(io.BytesIO(data))


def pixels(image: Image.Image) -> np.ndarray:
    return np.asarray(image.convert("RGB")).astype(int)


def bad(call, param: str) -> openai.BadRequestError:
    with pytest.raises(openai.BadRequestError) as caught:
        call()
    error = caught.value.body
    assert caught.value.status_code == 400 and error["type"] == "invalid_request_error"
    assert error["param"] == param, error
    assert "Traceback" not in caught.value.response.text
    return caught.value


# ---------------------------------------------------------------------------------------------- generations
def test_generate_returns_n_pngs_of_the_model_size_with_their_seeds(app, client):
    info = app.studio.engine.model_info()
    out = client.images.generate(prompt=PROMPT, n=2, extra_body={**FAST, "seed": 11})
    assert len(out.data) == 2 and out.created > 0
    for k, item in enumerate(out.data):
        image = decode(item.b64_json)
        assert image.size == (info.default_width, info.default_height)
        assert item.model_extra["seed"] == 11 + k
        assert "parameters" in image.info  # our PNG metadata
    assert out.size == f"{info.default_width}x{info.default_height}" and out.model_extra["warnings"] == []


def test_the_same_seed_reproduces_pixel_identical_images(client, outputs):
    args = dict(
        prompt="a green square\non a white background", n=1, extra_body={**FAST, "seed": 1234, "guidance_scale": 3.0}
    )
    first, second = client.images.generate(**args), client.images.generate(**args)
    assert np.array_equal(pixels(decode(first.data[0].b64_json)), pixels(decode(second.data[0].b64_json)))
    other = client.images.generate(**{**args, "extra_body": {**FAST, "seed": 1235}})
    assert not np.array_equal(pixels(decode(first.data[0].b64_json)), pixels(decode(other.data[0].b64_json)))
    assert not [p for p in outputs.rglob("*") if p.is_file()]  # API results are not saved to the output folder


def test_openai_fixed_sizes_keep_their_aspect_at_the_model_area(app, client):
    info = app.studio.engine.model_info()
    out = client.images.generate(prompt=PROMPT, size="1792x1024", extra_body=FAST)
    width, height = decode(out.data[0].b64_json).size
    assert width > height and width % info.size_multiple == 0 and height % info.size_multiple == 0
    assert out.size == f"{width}x{height}"


def test_url_response_downloads_the_png_without_credentials(client, url):
    out = client.images.generate(prompt=PROMPT, response_format="url", extra_body=FAST)
    link = out.data[0].url
    assert link.startswith(f"{url}/v1/images/files/") and link.endswith(".png")
    got = httpx.get(link)
    assert got.status_code == 200 and got.headers["content-type"] == "image/png"
    Image.open(io.BytesIO(got.content)).verify()
    missing = httpx.get(f"{url}/v1/images/files/{'x' * 43}.png")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"


def test_output_format_webp_and_another_model_name(client):
    out = client.images.generate(prompt=PROMPT, model="dall-e-3", output_format="webp", quality="hd", style="vivid",
                                 extra_body=FAST)  # fmt: skip
    assert base64.b64decode(out.data[0].b64_json)[8:12] == b"WEBP" and out.output_format == "webp"
    assert any("dall-e-3" in w for w in out.model_extra["warnings"]) and out.model_extra["model"] != "dall-e-3"


# ---------------------------------------------------------------------------------------------- edits
def test_edit_without_mask_runs_the_instruction_editor(client, scene):
    original = Image.open(io.BytesIO(scene))
    out = client.images.edit(image=("scene.png", scene, "image/png"), prompt="make the circle green",
                             extra_body={**FAST, "seed": 5})  # fmt: skip
    edited = decode(out.data[0].b64_json)
    assert edited.size == original.size
    assert not np.array_equal(pixels(edited), pixels(original))
    assert out.model_extra["model"] == "tiny-shapes-edit"
    preset = client.images.edit(image=("scene.png", scene, "image/png"), prompt="make the circle green",
                                size="1536x1024", extra_body=FAST)  # fmt: skip
    assert decode(preset.data[0].b64_json).size == original.size  # OpenAI's presets keep the input's shape
    two = client.images.edit(image=[("a.png", scene, "image/png"), ("b.png", scene, "image/png")],
                             prompt="make the circle green", extra_body=FAST)  # fmt: skip
    assert len(two.data) == 2  # image[]: each input edited (n per input)


def test_edit_with_a_transparent_region_mask_inpaints_only_there(client, scene):
    original = Image.open(io.BytesIO(scene))
    mask = Image.new("RGBA", original.size, (0, 0, 0, 255))
    ImageDraw.Draw(mask).rectangle(BOX, fill=(0, 0, 0, 0))  # OpenAI: fully transparent = edit here
    out = client.images.edit(image=("scene.png", scene, "image/png"), mask=("mask.png", png(mask), "image/png"),
                             prompt=PROMPT, n=2, extra_body={**FAST, "seed": 3})  # fmt: skip
    outside = np.ones(original.size[::-1], dtype=bool)
    x1, y1, x2, y2 = BOX
    outside[y1 : y2 + 1, x1 : x2 + 1] = False
    assert len(out.data) == 2
    for item in out.data:
        got = pixels(decode(item.b64_json))
        assert got.shape == pixels(original).shape
        assert np.array_equal(got[outside], pixels(original)[outside])
        assert not np.array_equal(got[~outside], pixels(original)[~outside])
    plain = Image.new("L", original.size, 0)  # no alpha: white = repaint (the Inpaint tab's reading)
    ImageDraw.Draw(plain).rectangle(BOX, fill=255)
    out = client.images.edit(image=("scene.png", scene, "image/png"), mask=("mask.png", png(plain), "image/png"),
                             prompt=PROMPT, extra_body={**FAST, "seed": 3})  # fmt: skip
    got = pixels(decode(out.data[0].b64_json))
    assert np.array_equal(got[outside], pixels(original)[outside])
    assert not np.array_equal(got[~outside], pixels(original)[~outside])


def test_edit_input_checks(client, scene):
    image = ("scene.png", scene, "image/png")
    bomb = io.BytesIO()
    Image.new("1", (20000, 20000)).save(bomb, format="PNG")
    assert len(bomb.getvalue()) < 200_000
    err = bad(lambda: client.images.edit(image=("bomb.png", bomb.getvalue(), "image/png"), prompt="x"), "image")
    assert "MAX_UPLOAD_PIXELS" in err.message
    bad(lambda: client.images.edit(image=("notes.txt", b"just some text", "text/plain"), prompt="x"), "image")
    small = png(Image.new("RGBA", (48, 64)))
    err = bad(lambda: client.images.edit(image=image, mask=("m.png", small, "image/png"), prompt="x"), "mask")
    assert "48x64" in err.message
    bad(lambda: client.images.edit(image=image, mask=("m.png", bomb.getvalue(), "image/png"), prompt="x"), "mask")
    bad(lambda: client.images.edit(image=image, prompt="x", extra_body={"strength": "lots"}), "strength")
    tiny = png(Image.new("RGB", (8, 8)))
    err = bad(lambda: client.images.edit(image=[("t.png", tiny, "image/png")] * 17, prompt="x"), "image")
    assert "MAX_EDIT_FILES" in err.message


# ---------------------------------------------------------------------------------------------- models, auth
def test_models_list_the_loaded_model_and_its_editor(client):
    ids = [m.id for m in client.models.list()]
    assert ids == ["tiny-shapes", "tiny-shapes-edit"]
    assert client.models.retrieve("tiny-shapes").owned_by == "diffusion-anywhere"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("dall-e-3")


def test_wrong_or_missing_key_is_refused_and_a_user_password_bearer_works(url):
    wrong = openai.OpenAI(base_url=f"{url}/v1", api_key="wrong-key-0123456789", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        wrong.images.generate(prompt=PROMPT, extra_body=FAST)
    assert caught.value.body["code"] == "invalid_api_key"
    missing = httpx.post(f"{url}/v1/images/generations", json={"prompt": PROMPT})
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{url}/v1/models").status_code == 401
    user = openai.OpenAI(base_url=f"{url}/v1", api_key=f"{USER}:{PASSWORD}", max_retries=0)
    assert len(user.images.generate(prompt=PROMPT, extra_body=FAST).data) == 1


# ---------------------------------------------------------------------------------------------- bad inputs
def test_bad_generation_inputs_name_the_field(client, url):
    raw = httpx.post(f"{url}/v1/images/generations", content=b"{not json", headers={"Authorization": f"Bearer {KEY}"})
    assert raw.status_code == 400 and raw.json()["error"]["type"] == "invalid_request_error"
    assert "Traceback" not in raw.text
    deep = httpx.post(f"{url}/v1/images/generations", content=b"[" * 50000, headers={"Authorization": f"Bearer {KEY}"})
    assert deep.status_code == 400 and deep.json()["error"]["code"] == "invalid_json"
    gen = client.images.generate
    bad(lambda: gen(prompt=PROMPT, n=1000), "n")
    bad(lambda: gen(prompt=PROMPT, size="99999x99999"), "size")
    bad(lambda: gen(prompt=PROMPT, size="big"), "size")
    bad(lambda: gen(prompt=PROMPT, extra_body={"steps": 10**9}), "steps")
    bad(lambda: gen(prompt=PROMPT, extra_body={"n": "many"}), "n")
    bad(lambda: gen(prompt=PROMPT, extra_body={"n": [2]}), "n")
    bad(lambda: gen(prompt=PROMPT, extra_body={"sampler": "No Such Sampler"}), "sampler")
    plms = bad(lambda: gen(prompt=PROMPT, extra_body={"sampler": "PLMS", "steps": 2}), "steps")  # its warm-up: 4
    assert plms.body["message"] == "steps: PLMS needs at least 4 steps; got 2"
    bad(lambda: gen(prompt=""), "prompt")
    bad(lambda: gen(prompt=PROMPT, response_format="gif"), "response_format")
    bad(lambda: gen(prompt=PROMPT, output_format="gif"), "output_format")
    assert len(gen(prompt=PROMPT, extra_body=FAST).data) == 1  # nothing crashed


# ---------------------------------------------------------------------------------------------- admission
def test_a_second_concurrent_call_of_the_same_key_gets_429_and_the_queue_recovers(app, client, monkeypatch):
    engine = app.studio.engine
    hold = HoldAtStep(engine.backend.generate, step=2)  # the first call is surely running when the second comes
    monkeypatch.setattr(engine.backend, "generate", hold)
    first = in_thread(client.images.generate, prompt=PROMPT, n=4, extra_body={"steps": 10})
    assert hold.reached.wait(120), "the first call's job never reached its second step"
    assert engine.load()["running"] == 1
    with pytest.raises(openai.RateLimitError) as caught:
        client.images.generate(prompt=PROMPT, extra_body=FAST)
    assert caught.value.body["type"] == "rate_limit_error" and "QUEUE_PER_USER" in caught.value.body["message"]
    assert engine.stop_caller("user:key:1")["running"] == 1  # A1111's /interrupt's way: it returns what finished
    out = first.result(timeout=120)
    assert hold.stopped_early(), hold
    assert out.model_extra["cancelled"] is True and len(out.data) < 4
    assert until(lambda: engine.load() == {"running": 0, "waiting": 0}), engine.load()
    assert len(client.images.generate(prompt=PROMPT, extra_body=FAST).data) == 1


def test_a_client_that_disconnects_cancels_its_job(app, url, monkeypatch):
    """The job is held at its second step until it is cancelled: it must stop there, however fast
    the machine (without the cancel it would wait out the hold, then run all its steps)."""
    engine = app.studio.engine
    hold = HoldAtStep(engine.backend.generate, step=2)
    monkeypatch.setattr(engine.backend, "generate", hold)
    body = {"prompt": PROMPT, "n": 4, "steps": 10}
    connection = send_and_leave(f"{url}/v1/images/generations", body, key=KEY)
    assert hold.reached.wait(120), "the job never reached its second step"
    assert engine.load() == {"running": 1, "waiting": 0}
    connection.close()  # the client goes away while its job is held at step 2
    assert hold.finished.wait(120), "the job did not end"
    assert hold.stopped_early(), hold
    assert until(lambda: engine.load() == {"running": 0, "waiting": 0}), engine.load()


# ---------------------------------------------------------------------------------------------- the route class
def test_fastapi_validation_errors_on_these_routes_are_openai_errors_and_other_routes_unchanged(url):
    from fastapi import APIRouter, FastAPI
    from fastapi.testclient import TestClient

    from webapi.openai_errors import OpenAIRoute

    app = FastAPI()
    router = APIRouter(prefix="/v1", route_class=OpenAIRoute)

    async def typed(n: int) -> dict:
        return {"n": n}

    async def broken() -> dict:
        raise RuntimeError("secret detail")

    router.add_api_route("/typed", typed, methods=["GET"])
    router.add_api_route("/broken", broken, methods=["GET"])
    app.include_router(router)
    app.add_api_route("/other", typed, methods=["GET"])
    test = TestClient(app, raise_server_exceptions=False)
    error = test.get("/v1/typed", params={"n": "many"}).json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "n"
    broken_answer = test.get("/v1/broken")
    assert broken_answer.status_code == 500 and broken_answer.json()["error"]["type"] == "server_error"
    assert "secret detail" not in broken_answer.text and "Traceback" not in broken_answer.text
    assert "detail" in test.get("/other", params={"n": "many"}).json()  # FastAPI's own shape elsewhere
    assert set(httpx.get(f"{url}/gradio_api/info").json()) == {"detail"}  # Gradio's routes keep their shape


def test_webapi_never_imports_gradio():
    import subprocess
    import sys

    code = "import sys, webapi, webapi.openai_images; assert 'gradio' not in sys.modules, 'gradio imported'"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_without_an_editor_an_edit_is_image_to_image(tmp_path, scene):
    """EDIT_MODEL_ID=none: the main model edits by image-to-image, `strength` (default 0.6) redrawing."""
    if not embedded_model_available():
        pytest.skip("needs the embedded model (models/tiny-shapes)")
    env = {"API_KEYS": KEY, "EDIT_MODEL_ID": "none"}
    with running_app(DEFAULT_MODEL, tmp_path, env=env) as (demo, _):
        plain = openai.OpenAI(base_url=f"{demo.local_url.rstrip('/')}/v1", api_key=KEY, max_retries=0)
        assert [m.id for m in plain.models.list()] == ["tiny-shapes"]
        image = ("scene.png", scene, "image/png")
        out = plain.images.edit(image=image, prompt=PROMPT, extra_body={**FAST, "seed": 9, "strength": 0.8})
        edited = decode(out.data[0].b64_json)
        assert out.model_extra["model"] == "tiny-shapes" and edited.size == Image.open(io.BytesIO(scene)).size
        assert not np.array_equal(pixels(edited), pixels(Image.open(io.BytesIO(scene))))
        bad(lambda: plain.images.edit(image=image, prompt=PROMPT, extra_body={"strength": 0}), "strength")


def test_image_urls_expire_and_the_store_is_bounded(monkeypatch):
    """On the store's own clock, set by the test: a slow machine cannot expire a file early."""
    from webapi import openai_files

    now = [1000.0]
    monkeypatch.setattr(openai_files, "time", SimpleNamespace(monotonic=lambda: now[0]))
    store = openai_files.FileStore(minutes=0.5 / 60, max_bytes=10)
    first = store.put(b"12345678", "png")
    assert store.get(first) == ("image/png", b"12345678")
    second = store.put(b"abcdefgh", "webp")  # over max_bytes: the oldest goes
    assert store.get(first) is None and store.get(second) == ("image/webp", b"abcdefgh")
    now[0] += 0.4
    assert store.get(second) == ("image/webp", b"abcdefgh")  # not yet expired
    now[0] += 0.2
    assert store.get(second) is None and len(store) == 0
