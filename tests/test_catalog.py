"""Which models a server lists as loadable (pipelines.weights.catalog): offline only the local ones, a recipe whose
weights are in the Hugging Face cache, a remote recipe only where the Hub can be reached; never a wait on
a Hub that does not answer. Was: every recipe listed, so a client's model dropdown offered models that
could not load offline, and picking one switched the model for everyone after a long failing load."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest
from huggingface_hub import constants

from pipelines.run.options import DEFAULT_MODEL
from pipelines.schema.request import RequestError
from pipelines.weights import catalog
from tests.tiny_model import save_tiny_pipeline

ROOT = Path(__file__).resolve().parents[1]
MODELS = DEFAULT_MODEL.parent  # the embedded models, as MODELS_DIR's default
REVISION = "0" * 40


def fake_cache(cache: Path, repo: str, files: dict[str, str] | None = None) -> Path:
    """`repo` laid out in a Hugging Face cache at `cache` as a download leaves it; its snapshot folder."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    (folder / "refs").mkdir(parents=True, exist_ok=True)
    (folder / "refs" / "main").write_text(REVISION)
    snapshot = folder / "snapshots" / REVISION
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, text in (files or {}).items():
        (snapshot / name).write_text(text)
    return snapshot


def recipe(folder: Path, name: str, source: str, **extra) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps({"name": name, "source": source, **extra}))


class Probe(catalog.HubProbe):
    """A HubProbe whose HEAD request is `answer` (a response, an exception, or a function), counted."""

    def __init__(self, answer, timeout: float = 2.0):
        super().__init__(timeout=timeout)
        self.answer, self.calls = answer, 0

    def _ask(self):
        self.calls += 1
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer() if callable(self.answer) else self.answer


@pytest.fixture
def empty_cache(tmp_path, monkeypatch) -> Path:
    """An empty Hugging Face cache, whatever this machine holds in its own."""
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    return cache


def test_offline_only_the_embedded_and_local_models_are_listed(empty_cache, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    probe = Probe(AssertionError("no network when the Hub is switched off"))
    entries = catalog.list_models(MODELS, hub=probe)
    assert {e.name for e in entries if e.loadable} == {"tiny-shapes", "tiny-shapes-fast", "tiny-shapes-edit", "tiny-shapes-video"}
    why = {e.name: e.why_not for e in entries if not e.loadable}
    assert len(why) == 19 and probe.calls == 0  # 11 image recipes, 8 video recipes
    assert why["sdxl-base"] == (
        "its weights stabilityai/stable-diffusion-xl-base-1.0: not in the Hugging Face cache, "
        "and the Hugging Face Hub is switched off here (HF_HUB_OFFLINE)"
    )
    assert "custom pipeline custom/pipeline_hidream_image_editing.py is not next to the recipe" in why["hidream-e1.1"]
    with pytest.raises(RequestError) as refused:
        catalog.find("flux.1-dev", MODELS, hub=probe)
    assert refused.value.loc == ("model",) and "HF_HUB_OFFLINE" in str(refused.value)
    assert str(refused.value).endswith("available: tiny-shapes-fast, tiny-shapes, tiny-shapes-edit, tiny-shapes-video")


def test_a_recipe_whose_weights_are_in_the_hugging_face_cache_is_listed(empty_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fake_cache(empty_cache, "someone/tiny-1.0", {"model_index.json": "{}"})
    fake_cache(empty_cache, "someone/text-encoder", {"config.json": "{}"})
    recipes = tmp_path / "recipes"
    recipe(recipes, "cached", "someone/tiny-1.0")
    recipe(recipes, "not-cached", "someone/elsewhere")
    component = {"source": "someone/not-here", "class": "transformers.CLIPTextModel"}
    recipe(recipes, "component-missing", "someone/tiny-1.0", components={"text_encoder": component})
    recipe(recipes, "with-component", "someone/tiny-1.0",
           components={"text_encoder": {**component, "source": "someone/text-encoder"}})  # fmt: skip
    recipe(recipes, "local-missing", "../no-such-folder")
    entries = {e.name: e for e in catalog.list_models(None, recipes, hub=Probe(AssertionError()))}
    assert {n for n, e in entries.items() if e.loadable} == {"cached", "with-component"}
    assert entries["not-cached"].why_not.startswith("its weights someone/elsewhere: not in the Hugging Face cache")
    assert entries["component-missing"].why_not.startswith("its component text_encoder someone/not-here: not in")
    assert entries["local-missing"].why_not == "its weights ../no-such-folder: missing"


def test_a_listed_cached_recipe_really_loads_offline(tmp_path):
    """The listing's promise, checked the way the app loads: a subprocess whose HF_HUB_CACHE holds the
    tiny model as a download would, offline, lists the recipe and opens it."""
    cache = tmp_path / "hf-cache"
    save_tiny_pipeline(fake_cache(cache, "someone/tiny-1.0"))
    recipe(tmp_path / "recipes", "cached", "someone/tiny-1.0")
    code = (
        "import sys; from pathlib import Path; from pipelines.weights import catalog, recipes; from devices import DeviceManager\n"
        "entry = catalog.find('cached', None, Path(sys.argv[1]))\n"
        "pipe, _, _ = recipes.open_model(str(Path(sys.argv[1]) / 'cached.json'), DeviceManager('cpu'))\n"
        "print(entry.name, type(pipe).__name__)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache),
           "HF_HOME": str(tmp_path)}  # fmt: skip
    run = subprocess.run([sys.executable, "-c", code, str(tmp_path / "recipes")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.split() == ["cached", "StableDiffusionPipeline"]


def test_online_a_remote_recipe_is_listed_only_while_the_hub_answers(empty_cache, tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    recipes = tmp_path / "recipes"
    recipe(recipes, "remote", "someone/elsewhere")
    answers = Probe(httpx.Response(200))
    assert catalog.list_models(None, recipes, hub=answers)[0].loadable
    down = Probe(httpx.ConnectError("[Errno -2] Name or service not known"))
    for _ in range(3):  # asked once, the answer kept for HUB_PROBE_TTL
        why = catalog.list_models(None, recipes, hub=down)[0].why_not
    assert down.calls == 1
    assert why == (
        "its weights someone/elsewhere: not in the Hugging Face cache, and the Hugging Face Hub "
        f"({constants.ENDPOINT}) cannot be reached (ConnectError: [Errno -2] Name or service not known)"
    )


def test_a_hub_that_never_answers_does_not_hold_the_listing(tmp_path, empty_cache, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    recipe(tmp_path / "recipes", "remote", "someone/elsewhere")
    release = threading.Event()
    hanging = Probe(lambda: release.wait(60) and httpx.Response(200), timeout=0.05)
    try:
        entries = catalog.list_models(None, tmp_path / "recipes", hub=hanging)
        assert entries[0].why_not.endswith(f"the Hugging Face Hub ({constants.ENDPOINT}) did not answer within 0.05 s")
    finally:
        release.set()
