"""What the HTTP APIs (webapi) share: who may call them, when they are served, how a call's job
runs and ends, and how uploaded images are checked. The A1111 and OpenAI routes themselves are
tested with their real clients in tests/test_a1111_api.py and tests/test_openai_images.py."""

from __future__ import annotations

import asyncio
import base64
import io
import threading
from types import SimpleNamespace

import httpx
import pytest
from PIL import Image

from engine import AppSettings, Caller, Engine, SettingsError
from engine.auth import Users, hash_password
from pipelines import GenerationRequest
from pipelines.run.options import DEFAULT_MODEL
from tests.app_server import embedded_model_available, running_app
from tests.test_engine import _Gate
from webapi.access import Access, Unauthorized
from webapi.errors import WireError
from webapi.images import from_base64, open_bytes
from webapi.running import ClientGone, wait

KEY = "k" * 24


def _request(authorization: str | None = None, host: str = "10.0.0.7"):
    headers = {"authorization": authorization} if authorization else {}
    return SimpleNamespace(headers=headers, client=SimpleNamespace(host=host))


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_http_callers_sign_in_with_basic_or_a_bearer_key():
    access = Access(Users({"alice": hash_password("pw", iterations=1000)}), (KEY,))
    assert access.caller(_request(_basic("alice", "pw"))).user == "alice"
    assert access.caller(_request(f"Bearer {KEY}")).user == "key:1"
    assert access.caller(_request("Bearer alice:pw")).user == "alice"  # clients with only an API-key field
    for bad in (None, _basic("alice", "nope"), "Bearer " + "x" * 24, "Basic !!!", "Digest abc", _basic("bob", "pw")):
        with pytest.raises(Unauthorized):
            access.caller(_request(bad))


def test_without_sign_in_each_call_is_a_one_off_caller_counted_by_address():
    first, second = Access().caller(_request()), Access().caller(_request())
    assert first.one_off and first.session != second.session  # each call its own session...
    assert first.key == second.key == "address:10.0.0.7"  # ...one share of QUEUE_PER_USER


@pytest.mark.parametrize(
    ("env", "served"),
    [
        ({}, True),  # localhost
        ({"GRADIO_SERVER_NAME": "0.0.0.0"}, False),  # public, no sign-in
        ({"GRADIO_SERVER_NAME": "0.0.0.0", "AUTH": "a:b"}, True),
        ({"GRADIO_SERVER_NAME": "0.0.0.0", "API_KEYS": KEY}, True),
        ({"GRADIO_SERVER_NAME": "0.0.0.0", "HTTP_API": "1"}, True),  # asked for
        ({"HTTP_API": "off"}, False),
        ({"SPACE_ID": "me/space"}, False),  # a Space is public
        ({"SPACE_ID": "me/space", "AUTH": "a:b", "SPACES_ZERO_GPU": "true"}, False),  # no visitor to charge
    ],
)
def test_the_http_apis_are_served_on_localhost_or_with_sign_in(env, served):
    settings = AppSettings.from_env(env)
    assert settings.http_api_enabled is served
    if not served:
        assert "HTTP_API" in settings.http_api_off_reason


@pytest.mark.parametrize(
    "bad", [{"API_KEYS": "short"}, {"API_KEYS": KEY + ",has space in it ok"}, {"HTTP_API": "maybe"}]
)
def test_bad_api_settings_stop_the_start_naming_the_variable(bad):
    with pytest.raises(SettingsError, match=next(iter(bad))):
        AppSettings.from_env(bad)


def test_interrupt_stops_only_the_callers_own_jobs():
    gate = _Gate()
    engine = Engine(gate)
    mine = engine.submit(GenerationRequest(prompt="mine"), Caller(user="alice", session="a1", one_off=True))
    theirs = engine.submit(GenerationRequest(prompt="theirs"), Caller(user="bob", session="b1", one_off=True))
    assert engine.stop_caller("user:bob") == {"running": 0, "queued": 1}  # bob's, still waiting: dropped
    assert engine.stop_caller("user:alice") == {"running": 1, "queued": 0}
    assert mine.result(timeout=5).cancelled
    with pytest.raises(Exception, match="cancelled before it started"):
        theirs.result(timeout=5)


class _Connection:
    """A Starlette request stand-in whose client hangs up when `gone` is set."""

    def __init__(self):
        self.gone = asyncio.Event()

    async def receive(self):
        await self.gone.wait()
        return {"type": "http.disconnect"}


def _hang_up_while_waiting(engine: Engine, job) -> None:
    """`wait` for `job` on a connection whose client hangs up: the call ends with ClientGone."""

    async def call():
        connection = _Connection()
        connection.gone.set()  # the job has not finished (the gate holds it): only the hang-up can end the wait
        with pytest.raises(ClientGone):
            await wait(engine, job, connection)

    asyncio.run(asyncio.wait_for(call(), 10))


def test_a_client_that_hangs_up_cancels_its_own_job_and_nobody_elses():
    gate = _Gate()
    engine = Engine(gate)
    other = engine.submit(GenerationRequest(prompt="other"), Caller(session="o"))
    job = engine.submit(GenerationRequest(prompt="leaving"), Caller(session="l"))
    assert job.state == "queued"  # behind `other`, which the gate holds
    _hang_up_while_waiting(engine, job)
    assert job.state == "done" and engine.load() == {"running": 1, "waiting": 0}  # dropped, never started
    gate.release.set()
    assert not other.result(timeout=5).cancelled
    assert gate.started == ["other"]


class _RecordingGate(_Gate):
    """The gate, keeping what each generation returned (the caller's own copy went to `wait`)."""

    def __init__(self):
        super().__init__()
        self.results: list = []
        self.ended = threading.Event()

    def generate(self, request, progress=None, should_cancel=None, preview=None):
        result = super().generate(request, progress, should_cancel, preview)
        self.results.append(result)
        self.ended.set()
        return result


def test_a_client_that_hangs_up_stops_its_running_job_after_the_step():
    """The gate holds the job until it is released or cancelled, and nothing releases it here: only
    the cancel can end it."""
    gate = _RecordingGate()
    engine = Engine(gate)
    job = engine.submit(GenerationRequest(prompt="leaving", num_images=2), Caller(session="l"))
    assert job.state == "running"
    try:
        _hang_up_while_waiting(engine, job)
        assert gate.ended.wait(30), "the running job was not cancelled"
    finally:
        gate.release.set()  # a failed test leaves no generation polling
    assert gate.results[0].cancelled and gate.results[0].images == []
    assert gate.started == ["leaving"]


def _png(size, mode="RGB") -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size).save(buffer, format="PNG")
    return buffer.getvalue()


def test_uploads_are_checked_before_they_are_decoded():
    small = _png((32, 16))
    data_url = "data:image/png;base64," + base64.b64encode(small).decode()
    assert open_bytes(from_base64(data_url, ("image",), 10**6), ("image",), 4096, 10**6).size == (32, 16)
    bomb = _png((20000, 20000), "1")  # a few KB that would decode to 400 M pixels
    assert len(bomb) < 100_000
    with pytest.raises(WireError, match=r"init_images\[0\]: .*pixels.*MAX_UPLOAD_PIXELS") as caught:
        open_bytes(bomb, ("init_images", 0), 4096 * 4096, 10**6)
    assert caught.value.loc == ("init_images", 0)
    with pytest.raises(WireError, match="mask: not valid base64"):
        from_base64("abc$%^", ("mask",), 10**6)
    with pytest.raises(WireError, match="image: not an image"):
        open_bytes(b"hello, world", ("image",), 4096, 10**6)
    with pytest.raises(WireError, match="MAX_FILE_SIZE"):
        from_base64("A" * 4000, ("image",), 1000)
    assert AppSettings().max_file_bytes == 10 * 1024**2
    assert AppSettings.from_env({"MAX_FILE_SIZE": "1.5 KB"}).max_file_bytes == 1536


@pytest.mark.skipif(not embedded_model_available(), reason="needs the embedded model")
def test_http_api_0_serves_no_http_api_routes(tmp_path):
    with running_app(DEFAULT_MODEL, tmp_path, env={"HTTP_API": "0"}) as (demo, _):
        for route in ("/sdapi/v1/options", "/v1/models"):
            assert httpx.get(demo.local_url.rstrip("/") + route, timeout=10).status_code == 404
