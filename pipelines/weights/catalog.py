"""The models a server offers for switching (its recipes and the model folders under MODELS_DIR), and
which of them can load here.

Only these can be loaded at runtime (by name): a switch request never names an arbitrary path or
Hub id, so a caller cannot make the server download, read or run anything its operator did not
put there.

This module is the one owner of "can this entry load here" (`ModelEntry.why_not`), which the Gradio
`/models` endpoint, the UI's Model picker, A1111's `/sdapi/v1/sd-models` and every switch read:
- a folder under MODELS_DIR with model_index.json: yes;
- a recipe: every source it names (weights, extra components, GGUF files) is local, or already in
  the Hugging Face cache, or can be downloaded; its custom pipeline file and LoRAs are on disk.
"Can be downloaded" means the Hub is not switched off (`HF_HUB_OFFLINE`, as huggingface_hub reads
it) and answered a probe lately (`HubProbe`: bounded, cached). Before this, the listing offered every
recipe, and on an offline machine picking one cost a long failing load (its retries and ~8 s of
lookups) and switched the model for everyone on the server.

Not checked: whether a gated repository lets this server's token in, whether a partly downloaded
model has every file, and whether the device can run the recipe's quantization; such a load fails
with its own reason, and the previous model keeps serving.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.schema.request import RequestError
from pipelines.weights import recipes
from pipelines.weights.loading import looks_like_path

log = logging.getLogger(__name__)

# The files whose presence in the Hugging Face cache means a repository was downloaded: a pipeline's
# index, or an extra component's config (a model's, a tokenizer's or a processor's).
PIPELINE_FILES = ("model_index.json",)
COMPONENT_FILES = ("config.json", "tokenizer_config.json", "preprocessor_config.json")
# The Hub probe: a failed lookup costs ~0.05-0.1 s where DNS fails at once (this machine), up to the
# timeout where packets are dropped; hf_hub_download's own retries took 23 s here. A result holds
# for HUB_PROBE_TTL s, and a stale one is refreshed in the background, so only the first listing waits.
HUB_PROBE_TIMEOUT = 2.0
HUB_PROBE_TTL = 300.0


@dataclass(frozen=True)
class ModelEntry:
    """One model a switch may name, and whether it can load on this server now (and why not)."""

    name: str  # what the picker shows and /load_model takes
    source: str  # MODEL_ID for it: a recipe name or a folder
    kind: str  # "recipe" | "folder"
    why_not: str = ""  # why it cannot load here ("" when it can); no server paths (shown to clients)

    @property
    def loadable(self) -> bool:
        """Listed for switching (picker, /models' `models`, sd-models), and a switch to it is tried."""
        return not self.why_not


class HubProbe:
    """Whether the Hugging Face Hub can be reached for downloads, asked at most once per `ttl`.

    The first question waits for the answer up to `timeout` (a probe that has not answered by then
    counts as unreachable until it does); later ones get the last answer at once, and a stale answer
    starts a new probe in the background. The probe runs in its own thread, so a slow DNS lookup,
    which no HTTP timeout covers, cannot hold a listing either.
    """

    def __init__(self, timeout: float = HUB_PROBE_TIMEOUT, ttl: float = HUB_PROBE_TTL):
        self.timeout, self.ttl = timeout, ttl
        self._lock = threading.Lock()
        self._checked: float | None = None  # time.monotonic() of the last answer
        self._why: str | None = None  # the last answer: None when reachable
        self._running: threading.Event | None = None  # set when the probe in flight answers

    def problem(self) -> str | None:
        """Why nothing can be downloaded from the Hub now, or None when it can."""
        from huggingface_hub import constants

        if constants.HF_HUB_OFFLINE:
            return "the Hugging Face Hub is switched off here (HF_HUB_OFFLINE)"
        with self._lock:
            first = self._checked is None
            if (first or time.monotonic() - self._checked > self.ttl) and self._running is None:
                self._running = threading.Event()
                threading.Thread(target=self._probe, args=(self._running,), name="hub-probe", daemon=True).start()
            running = self._running
        if first and running is not None and not running.wait(self.timeout):
            with self._lock:
                if self._checked is None:  # still unanswered: later listings do not wait again
                    self._checked = time.monotonic()
                    self._why = f"the Hugging Face Hub ({constants.ENDPOINT}) did not answer within {self.timeout:g} s"
        return self._why

    def _probe(self, done: threading.Event) -> None:
        """Ask once (`_ask`), keep the answer, tell the waiting listing; an unexpected error (the thread
        reports it) counts as unreachable, and the next stale listing asks again."""
        import httpx
        from huggingface_hub import constants

        why: str | None = f"the Hugging Face Hub ({constants.ENDPOINT}) probe failed (see the server log)"
        try:
            status = self._ask().status_code
            why = f"the Hugging Face Hub ({constants.ENDPOINT}) answered {status}" if status >= 500 else None
        except httpx.HTTPError as exc:  # the answer itself: unreachable, and why
            why = f"the Hugging Face Hub ({constants.ENDPOINT}) cannot be reached ({type(exc).__name__}: {exc})"
        finally:
            with self._lock:
                if why != self._why or self._checked is None:
                    log.info("Hugging Face Hub: %s", why or "reachable")
                self._checked, self._why, self._running = time.monotonic(), why, None
            done.set()

    def _ask(self) -> Any:
        """One HEAD request to the Hub's endpoint (proxies from the environment, as huggingface_hub's)."""
        import httpx
        from huggingface_hub import constants

        return httpx.head(constants.ENDPOINT, timeout=self.timeout)


HUB = HubProbe()  # the server's one probe (every listing shares its answer)


def list_models(
    models_dir: Path | None, recipes_dir: Path = recipes.RECIPES_DIR, hub: HubProbe | None = None
) -> list[ModelEntry]:
    """Recipes first (by name), then diffusers folders (with model_index.json) directly under `models_dir`;
    each says whether it can load here (`ModelEntry.why_not`)."""
    hub = hub or HUB
    out = [
        ModelEntry(name, name, "recipe", _recipe_problem(path, hub))
        for name, path in recipes.available(recipes_dir).items()
    ]
    taken = {e.name for e in out}
    if models_dir is not None and Path(models_dir).is_dir():
        for folder in sorted(Path(models_dir).iterdir()):
            if (folder / "model_index.json").is_file() and folder.name not in taken:
                out.append(ModelEntry(folder.name, str(folder.resolve()), "folder"))
    return out


def find(
    name: str, models_dir: Path | None, recipes_dir: Path = recipes.RECIPES_DIR, hub: HubProbe | None = None
) -> ModelEntry:
    """The entry `name` where it can load here; else RequestError on `model` saying why and naming
    the models that can (at once, instead of a long load that fails)."""
    entries = {e.name: e for e in list_models(models_dir, recipes_dir, hub)}
    can = ", ".join(e.name for e in entries.values() if e.loadable) or "none"
    if name not in entries:
        raise RequestError("model", f"{name!r} is not offered here; available: {can}")
    if not entries[name].loadable:
        raise RequestError("model", f"{name!r} cannot load here: {entries[name].why_not}; available: {can}")
    return entries[name]


def _recipe_problem(path: Path, hub: HubProbe) -> str:
    """Why the recipe at `path` cannot load here, or "" (paths as the recipe writes them)."""
    try:
        recipe = recipes.load(path)
    except recipes.RecipeError as exc:
        return f"the recipe does not validate ({exc})"
    if recipe.custom_pipeline and not Path(recipe.resolve(recipe.custom_pipeline)).is_file():
        return f"its custom pipeline {recipe.custom_pipeline} is not next to the recipe"
    for lora in recipe.loras:
        if not Path(recipe.resolve(lora.path)).is_file():
            return f"its LoRA {lora.path} is missing"
    needs = [("weights", recipe.source, PIPELINE_FILES)]
    needs += [(f"component {c.name}", c.source, COMPONENT_FILES) for c in recipe.components]
    needs += [(f"GGUF file for {q.component}", q.file, ()) for q in recipe.quantization if q.file]
    for what, source, files in needs:
        why = _source_problem(recipe.resolve(source), source, files, hub)
        if why:
            return f"its {what} {source}: {why}"
    return ""


def _source_problem(resolved: str, written: str, files: tuple[str, ...], hub: HubProbe) -> str:
    """Why one source of a recipe is not at hand: a missing local path, or a Hub repository (or URL)
    that is neither in the Hugging Face cache nor downloadable now; "" when it is at hand."""
    path = Path(resolved).expanduser()
    if path.is_dir() and files == PIPELINE_FILES and not (path / "model_index.json").is_file():
        return "a folder without model_index.json"
    if path.exists():
        return ""
    remote = "://" in written
    if looks_like_path(resolved) and not remote:
        return "missing"
    if files and _in_cache(resolved, files):
        return ""
    offline = hub.problem()
    if offline is None:
        return ""
    return f"{'a download' if remote else 'not in the Hugging Face cache'}, and {offline}"


def _in_cache(repo: str, files: tuple[str, ...]) -> bool:
    """Whether the Hugging Face cache holds `repo` (one of `files` at its main revision)."""
    from huggingface_hub import try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        return any(isinstance(try_to_load_from_cache(repo, name), str) for name in files)
    except HFValidationError as exc:  # not a repository id at all: nothing of it can be cached
        log.debug("%s is not a Hub repository id: %s", repo, exc)
        return False
