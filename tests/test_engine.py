"""The engine below every front end, on the backend `python app.py` builds (issue: one engine).

- previews reach the engine's callers with the default backend (the editor router) and on a pool;
- every backend declares its abilities, and wrappers forward them;
- admission, order and Stop are the engine's, whatever the front end;
- bounds have one owner; seeds take the generator's whole range; settings are read once;
- `GRADIO_SERVER_PORT=abc python app.py` is answered in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from config import sections, variables
from engine import (
    Admission,
    AppSettings,
    Caller,
    Engine,
    Preview,
    Progress,
    QueueFull,
    TooManyJobs,
    build_backend,
    build_engine,
)
from pipelines import GenerationRequest
from pipelines.run.backend import Capabilities
from pipelines.run.options import DEFAULT_MODEL
from pipelines.schema.fields import RequestError
from pipelines.schema.request import SEED_SPACE, RequestLimits, item_seed, pin_seed, spec, validate
from serving.editing import EditRouter
from serving.pool import DevicePool
from serving.video import VideoRouter
from tests.app_server import app_settings, embedded_model_available, main_pool

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle on a blue background"

pytestmark = pytest.mark.skipif(not embedded_model_available(), reason="needs the embedded model")


@pytest.fixture(scope="module")
def app_engine(tmp_path_factory):
    """The engine exactly as `python app.py` builds it here (default settings, embedded model)."""
    settings = app_settings(DEFAULT_MODEL, tmp_path_factory.mktemp("out"))
    engine = build_engine(settings)
    yield engine
    engine.close()


def _events(engine: Engine, request: GenerationRequest, caller: Caller | None = None) -> list:
    return list(engine.submit(request, caller).events(timeout=300))


def test_the_default_app_backend_streams_previews_before_the_final_images(app_engine):
    assert isinstance(app_engine.backend, VideoRouter), "python app.py serves the video model beside the embedded model"
    assert isinstance(app_engine.backend.main, EditRouter), "... and the editor beside it"
    assert app_engine.capabilities.previews
    request = GenerationRequest(prompt=PROMPT, num_images=2, steps=12, seed=5)
    events = _events(app_engine, request)
    kinds = [type(e).__name__ for e in events]
    assert kinds[-1] == "Finished" and "Preview" in kinds and kinds.index("Preview") < len(kinds) - 1, kinds
    frames = [e for e in events if isinstance(e, Preview)]
    assert all(len(f.images) >= 1 for f in frames) and len(frames[-1].images) == 2
    assert frames[0].images[0].size == events[-1].result.images[0].size
    progress = [e for e in events if isinstance(e, Progress)]
    assert [p.step for p in progress] == sorted(p.step for p in progress) and progress[-1].step == progress[-1].total


def test_edits_through_the_default_backend_stream_previews_too(app_engine):
    from models.train.world import Scene, draw

    image = draw(Scene("red", "circle", "blue", 0.5, 0.5, 0.5, 0.0))
    request = GenerationRequest(prompt="change the background to black", init_images=[image], steps=10, seed=0)
    events = _events(app_engine, request)
    assert any(isinstance(e, Preview) for e in events)
    assert events[-1].result.metadata[0]["model"] == "tiny-shapes-edit"


def test_a_pool_of_two_streams_previews_of_both_parts(tmp_path):
    settings = app_settings(DEFAULT_MODEL, tmp_path, env={"PREFERRED_DEVICE": "cpu", "CPU_REPLICAS": "2"})
    engine = build_engine(settings)
    try:
        pool = main_pool(engine.backend)
        assert isinstance(pool, DevicePool) and len(pool.replicas) == 2
        events = _events(engine, GenerationRequest(prompt=PROMPT, num_images=4, steps=10, seed=1))
        frames = [e for e in events if isinstance(e, Preview)]
        assert frames and max(len(f.images) for f in frames) == 4  # images 0-1 and 2-3 from the two replicas
        assert events[-1].result.seeds == [1, 2, 3, 4]
    finally:
        engine.close()


# ---------------------------------------------------------------- declared capabilities
def _leaf_backends():
    from pipelines import ImagePipeline

    classes = [ImagePipeline, DevicePool]
    try:
        from serving.ray_backend import RayBackend
    except ImportError:  # Ray is optional
        return classes
    return [*classes, RayBackend]


@pytest.mark.parametrize("cls", _leaf_backends(), ids=lambda c: c.__name__)
def test_a_backend_has_the_methods_of_the_abilities_it_declares(cls):
    caps = cls.capabilities
    assert isinstance(caps, Capabilities)
    assert caps.switch_models == callable(getattr(cls, "load_model", None))
    assert caps.count_tokens == callable(getattr(cls, "count_tokens", None))


def test_the_editor_router_forwards_what_both_backends_declare():
    class Stub:
        def __init__(self, caps):
            self.capabilities = caps

    full = Capabilities(previews=True, switch_models=True, count_tokens=True)
    assert EditRouter(Stub(full), Stub(full)).capabilities == full
    assert EditRouter(Stub(full), Stub(Capabilities())).capabilities == Capabilities(False, True, True)


# ---------------------------------------------------------------- admission and order
class _Gate:
    """A backend whose generations wait for `release`; records the order they started in."""

    capabilities = Capabilities()
    concurrency = 1

    def __init__(self):
        self.release = threading.Event()
        self.started: list[str] = []

    def model_info(self):
        from pipelines.run.backend import ModelInfo

        return ModelInfo("gate", 64, 64, 8, 256, 256 * 256, 16, 4, 4.0, "Euler")

    def generate(self, request, progress=None, should_cancel=None, preview=None):
        from pipelines import GenerationResult

        self.started.append(request.prompt)
        while not self.release.wait(0.05):
            if should_cancel is not None and should_cancel():
                break
        done = not (should_cancel and should_cancel())
        images = [] if not done else [None] * request.total_images
        return GenerationResult(images, [request.seed] * len(images), [], {}, None, "cpu", "float32", "sdpa",
                                cancelled=not done)  # fmt: skip

    def status(self):
        from pipelines.run.backend import ReplicaStatus

        return [ReplicaStatus("cpu", "cpu", "cpu", "CPU", "float32", "sdpa")]

    def close(self):
        pass


def test_steps_below_the_samplers_minimum_are_refused_at_admission_not_in_the_queue(app_engine):
    """Every front end submits here: the refusal names `steps` before the request takes a place."""
    from pipelines.schema.request import RequestError

    assert app_engine.model_info().min_steps["PLMS"] == 4  # the embedded model's PNDM runs its warm-up
    with pytest.raises(RequestError, match=r"^steps: PLMS needs at least 4 steps; got 3$") as refused:
        app_engine.submit(GenerationRequest(prompt=PROMPT, steps=3, sampler="PLMS"), Caller(session="plms"))
    assert refused.value.loc == ("steps",) and app_engine.load() == {"running": 0, "waiting": 0}


def test_the_engine_admits_in_order_and_refuses_over_its_limits():
    gate = _Gate()
    engine = Engine(gate, Admission(queue_size=2, per_caller=1))
    alice, bob, carol = (Caller(session=s) for s in ("alice", "bob", "carol"))
    first = engine.submit(GenerationRequest(prompt="a"), alice)
    second = engine.submit(GenerationRequest(prompt="b"), bob)
    third = engine.submit(GenerationRequest(prompt="c"), carol)
    with pytest.raises(TooManyJobs, match="QUEUE_PER_USER=1"):
        engine.submit(GenerationRequest(prompt="a2"), alice)
    with pytest.raises(QueueFull, match=r"the queue is full \(QUEUE_SIZE=2\)"):
        engine.submit(GenerationRequest(prompt="d"), Caller(session="dave"))
    assert next(second.events(timeout=5)).ahead == 0  # told its place while it waits
    assert engine.stop("bob") == {"running": 0, "queued": 1}
    with pytest.raises(Exception, match="cancelled before it started"):
        second.result(timeout=5)
    gate.release.set()
    first.result(timeout=5)
    third.result(timeout=5)
    assert gate.started == ["a", "c"]  # bob's dropped job never ran


def test_stop_reaches_only_the_callers_own_jobs():
    gate = _Gate()
    engine = Engine(gate)
    mine = engine.submit(GenerationRequest(prompt="mine"), Caller(user="alice", session="s1"))
    theirs_same_session = Caller(user="bob", session="s1")
    assert engine.stop("s1", "bob") == {"running": 0, "queued": 0}
    assert engine.stop("s1", None) == {"running": 0, "queued": 0}
    assert engine.stop("s1", "alice") == {"running": 1, "queued": 0}
    assert mine.result(timeout=5).cancelled and theirs_same_session.user == "bob"


def test_one_off_rest_calls_share_the_limit_by_address():
    assert Caller(session="ev1", address="10.0.0.1", one_off=True).key == "address:10.0.0.1"
    assert Caller(session="tab", address="10.0.0.1").key == "session:tab"
    assert Caller(user="alice", session="tab").key == "user:alice"


# ---------------------------------------------------------------- one owner per fact
def test_send_to_and_the_request_take_the_schemas_bounds():
    from ui.send import _fit

    for name in ("steps", "guidance_scale", "guidance_end", "strength", "image_guidance_scale"):
        low, high = spec(name).value.low, spec(name).value.high
        assert _fit(name, high + 100) == high and _fit(name, low - 100) == low
        assert getattr(GenerationRequest.parse({"prompt": "x", name: str(low)}), name) == low  # text, as a form sends
        with pytest.raises(RequestError, match=f"{name}: .* is out of range"):
            GenerationRequest.parse({"prompt": "x", name: high + 1})
    request = GenerationRequest(prompt="x", strength=spec("strength").value.low, guidance_end=0.01)
    validate(request, RequestLimits())  # and so does the pipeline


def test_the_form_sliders_are_built_from_the_bounds(tmp_path):
    from ui.demo import create_demo

    class Fixed(_Gate):
        capabilities = Capabilities(previews=True)

    config = create_demo(Engine(Fixed()), AppSettings(output_dir=tmp_path)).get_config_file()
    sliders, dropdowns = {}, {}
    for c in config["components"]:
        if c["type"] == "slider":
            sliders.setdefault(c["props"]["label"], c["props"])
        if c["type"] == "dropdown":
            dropdowns.setdefault(c["props"]["label"], c["props"])
    # the gate's own sampler ("Euler") is in no table it offers (samplers=()): listed all the same, so the
    # dropdown's value is one of its choices (gradio warned "not in the list of choices")
    assert dropdowns["Sampler"]["value"] == "Euler" and ("Euler", "Euler") in dropdowns["Sampler"]["choices"]
    for label, name in (("Steps", "steps"), ("Guidance (CFG)", "guidance_scale"), ("Guidance end", "guidance_end"),
                        ("Strength", "strength"), ("Image guidance", "image_guidance_scale")):  # fmt: skip
        bound = spec(name).value
        assert (sliders[label]["minimum"], sliders[label]["maximum"]) == (bound.low, bound.high), label


def test_seeds_take_the_generators_whole_range(app_engine):
    top = SEED_SPACE - 1
    validate(GenerationRequest(prompt="x", seed=top), RequestLimits())
    with pytest.raises(RequestError, match="seed: 18446744073709551616 is out of range"):
        GenerationRequest(prompt="x", seed=SEED_SPACE)
    result = app_engine.run(GenerationRequest(prompt=PROMPT, num_images=2, steps=2, seed=top))
    assert result.seeds == [top, 0] and [m["seed"] for m in result.metadata] == [top, 0]  # seed + k mod 2^64
    again = app_engine.run(GenerationRequest(prompt=PROMPT, num_images=1, steps=2, seed=0))
    # the same picture: a batch of 2 and a batch of 1 may round a few pixels apart (CPU GEMM kernels
    # block by batch size; seen on an AMD EPYC, bit-exact elsewhere), never more than 2/255
    diff = np.abs(np.asarray(again.images[0], np.int16) - np.asarray(result.images[1], np.int16))
    assert diff.max() <= 2 and diff.mean() < 0.05, (diff.max(), diff.mean())
    assert item_seed(top, 3) == 2 and pin_seed(GenerationRequest(prompt="x")).seed < 2**32


def test_a_64_bit_seed_typed_as_text_is_read_exactly():
    seed = spec("seed").parse
    assert seed("18446744073709551615") == 2**64 - 1
    assert seed("-1") is None and seed("") is None and seed(7.0) == 7
    with pytest.raises(ValueError, match="out of range"):
        seed(str(2**64))
    for bad in ("²", "١٢", "9" * 5000, "1e400", "7.5", True):  # Python's int() takes the first three; a seed is ASCII digits
        with pytest.raises(ValueError, match="must be a whole number"):
            seed(bad)


# ---------------------------------------------------------------- settings read once
class _LockedEnviron(dict):
    """os.environ for the build: reading any of the app's own variables fails the test."""

    def __init__(self, base: Mapping[str, str], names: set[str]):
        super().__init__(base)
        self.names = names

    def _check(self, key):
        if key in self.names:
            raise AssertionError(f"{key} was read from the environment below the settings object")

    def __getitem__(self, key):
        self._check(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._check(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._check(key)
        return super().__contains__(key)


# every declared variable (engine.settings and its sections): a new one is locked too
APP_VARIABLES = {v.name for section in sections(AppSettings) for v in variables(section)}


def test_the_backend_is_built_from_the_settings_object_alone(tmp_path, monkeypatch):
    settings = app_settings(DEFAULT_MODEL, tmp_path, env={"MAX_BATCH": "3", "PREFERRED_DEVICE": "cpu"})
    monkeypatch.setattr(os, "environ", _LockedEnviron(os.environ, APP_VARIABLES))
    backend = build_backend(settings)
    try:
        assert backend.model_info().max_batch == 3 and backend.model_info().for_edits.max_batch == 3
    finally:
        backend.close()


# ---------------------------------------------------------------- start-up
def test_a_bad_gradio_port_is_one_line_before_gradio_is_imported():
    env = {**os.environ, "GRADIO_SERVER_PORT": "abc"}
    run = subprocess.run([sys.executable, "app.py"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert run.stderr.strip() == "error: GRADIO_SERVER_PORT='abc' is not valid: expected an integer from 1 to 65535"


@pytest.mark.slow  # 90 s: three `python -m engine` starts on 2 shared cores
def test_the_command_line_runs_the_apps_backend(tmp_path):
    """`python -m engine` builds what `python app.py` serves: a prompt goes to the main model, an
    instruction with an input image to the embedded editor beside it."""
    from models.train.world import Scene, draw
    from pipelines import read_metadata

    source = tmp_path / "in.png"
    draw(Scene("red", "circle", "blue", 0.5, 0.5, 0.5, 0.0)).save(source)
    env = {**os.environ, "PREFERRED_DEVICE": "cpu", "OUTPUT_DIR": str(tmp_path)}
    env.pop("MODEL_ID", None)
    made = subprocess.run(
        [sys.executable, "-m", "engine", PROMPT, "-n", "2", "--seed", str(2**64 - 1), "--steps", "3",
         "--out", str(tmp_path / "t2i")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert made.returncode == 0, made.stderr
    assert f"seeds [{2**64 - 1}, 0]" in made.stdout
    edited = subprocess.run(
        [sys.executable, "-m", "engine", "change the background to black", "--init-image", str(source), "--seed", "0",
         "--out", str(tmp_path / "edit")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert edited.returncode == 0, edited.stderr
    (png,) = (tmp_path / "edit").glob("*.png")
    assert read_metadata(png)["json"]["model"] == "tiny-shapes-edit"
    bad = subprocess.run([sys.executable, "-m", "engine", PROMPT, "--steps", "0"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert bad.returncode == 2 and bad.stderr.strip().endswith("steps: 0 is out of range 1..150")


def test_a_caller_that_goes_away_leaves_the_queue_at_once():
    gate = _Gate()
    engine = Engine(gate)
    running = engine.submit(GenerationRequest(prompt="a"), Caller(session="a"))
    waiting = engine.submit(GenerationRequest(prompt="b"), Caller(session="b"))
    after = engine.submit(GenerationRequest(prompt="c"), Caller(session="c"))
    assert engine.load() == {"running": 1, "waiting": 2}
    engine.cancel(waiting)  # what the UI does when its event is closed (the browser tab went away)
    assert engine.load() == {"running": 1, "waiting": 1}
    with pytest.raises(Exception, match="cancelled before it started"):
        waiting.result(timeout=5)
    gate.release.set()
    running.result(timeout=5)
    after.result(timeout=5)
    assert gate.started == ["a", "c"]


def test_an_inpaint_is_checked_against_the_main_models_limits_not_the_editors():
    """Inpaints run on the main model (an instruction editor has no inpainting twin), so its limits apply."""
    import dataclasses

    from PIL import Image

    from pipelines.run.backend import ModelInfo
    from pipelines.schema.inpaint import Inpaint

    editor = ModelInfo("editor", 64, 64, 8, 64, 64 * 64, 1, 4, 4.0, "Euler")
    gate = _Gate()
    gate.model_info = lambda: dataclasses.replace(
        ModelInfo("main", 128, 128, 8, 256, 256 * 256, 16, 4, 4.0, "Euler"), editor=editor
    )
    engine = Engine(gate)
    picture = Image.new("RGB", (128, 128))
    inpaint = GenerationRequest(prompt="p", num_images=2, width=128, height=128, init_images=[picture],
                                inpaint=Inpaint(mask=Image.new("L", (128, 128), 255)))  # fmt: skip
    gate.release.set()
    assert len(engine.run(inpaint).images) == 2
    with pytest.raises(ValueError, match=r"num_images: 2 is out of range 1..1"):  # the same as an instruction edit: the editor's cap
        engine.submit(inpaint.replace(inpaint=None))
