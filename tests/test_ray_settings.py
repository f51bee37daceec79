"""GENERATION_BACKEND=ray honours the pipeline settings: the app's whole PipelineOptions reaches the
replicas (STEP_CACHE, STEP_CACHE_THRESHOLD, COMPILE, QUANTIZATION, MAX_BATCH ...), with TORCH_DTYPE.

One deployment for the module: the tiny Flux (tests/families.py: a transformer with a step cache)
on one CPU replica of a local Ray instance (`address="local"`: never a stale cluster left behind),
built the way the app builds it, `build_backend(AppSettings.from_env(...))`. COMPILE=off is the
proof that COMPILE travels without paying for a compile: on a CPU, the default (auto) reports
"off by default on CPU", the forwarded setting "COMPILE=off".
"""

from __future__ import annotations

import pytest

from tests import families

pytestmark = pytest.mark.slow  # the Ray tier (docs/testing.md)

ray = pytest.importorskip("ray", reason="Ray is optional: pip install -r requirements-ray.txt")

SETTINGS = {
    "GENERATION_BACKEND": "ray", "RAY_DEVICE": "cpu", "RAY_REPLICAS": "1", "RAY_CPUS_PER_REPLICA": "1",
    "STEP_CACHE": "firstblockcache", "STEP_CACHE_THRESHOLD": "0.3", "COMPILE": "off",
    "QUANTIZATION": "transformer=fp8-layerwise", "MEMORY_MODE": "off", "MAX_BATCH": "3", "TORCH_DTYPE": "float32",
}  # fmt: skip


@pytest.fixture(scope="module")
def backend(ray_turn, family_root):
    from ray import serve

    from engine import build_backend
    from engine.settings import AppSettings

    settings = AppSettings.from_env({**SETTINGS, "MODEL_ID": str(families.build("flux", family_root / "flux"))})
    with pytest.MonkeyPatch.context() as env:
        env.setenv("RAY_USAGE_STATS_ENABLED", "0")
        env.setenv("RAY_AUTH_MODE", "disabled")
        ray.init(
            address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20
        )
    try:
        yield build_backend(settings)
    finally:
        serve.shutdown()
        ray.shutdown()


def test_the_replicas_load_with_the_apps_pipeline_settings(backend):
    info = backend.model_info()
    assert (info.default_step_cache, info.default_step_cache_threshold) == ("FirstBlockCache", 0.3)
    assert info.max_batch == 3
    assert info.quantization["transformer"].startswith("fp8 layerwise casting")
    (row,) = backend.status()
    assert "COMPILE=off" in row.compile
    assert row.dtype == "float32" and row.weights == "on device"


def test_a_generation_on_a_replica_runs_with_the_step_cache(backend):
    from pipelines import GenerationRequest

    result = backend.generate(GenerationRequest(prompt="a red circle", steps=3, width=64, height=64, seed=3))
    assert len(result.images) == 1
    assert result.step_cache == "FirstBlockCache 0.3"
