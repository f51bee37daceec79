"""The backends layer: what runs a request behind the engine, in this process or over a Ray cluster.

- `serving.pool.DevicePool`: the in-process backend, one `ImagePipeline` per device (one device is a
  pool of one), with `serving.health`'s re-tests of a failed replica.
- `serving.editing.EditRouter`: the embedded editor beside the main model (instruction edits go to it).
- `serving.video.VideoRouter`: a video model beside the image models (video requests go to it); both routers
  share `serving.routing.Beside`.

Serving beyond one machine with Ray Serve (optional: `pip install -r requirements-ray.txt`):

- `serving.deployment`: the Serve deployment, one `ImagePipeline` per replica on one accelerator.
- `serving.ray_backend.RayBackend`: the app's `GenerationBackend` on top of it
  (`GENERATION_BACKEND=ray`).
- `serving.wire`: requests, results and errors as plain data (images as PNG bytes).
- `python -m serving`: start the deployment on a Ray cluster and keep it running.

Nothing here imports ray at import time of the app: only when the Ray backend is asked for.
"""

RAY_MISSING = "the Ray backend needs Ray Serve: pip install -r requirements-ray.txt"


def import_ray():
    """`ray` and `ray.serve`, or a clear error naming the requirements file."""
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise RuntimeError(RAY_MISSING) from exc
    return ray, serve
