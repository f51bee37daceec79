"""`python -m serving`: deploy the generation service on Ray Serve and keep it serving until Ctrl+C.

    ray start --head                        # on the head node; `ray start --address HEAD:6379` on the others
    python -m serving --model models/tiny-shapes --replicas 8 --device cuda --address auto
    GENERATION_BACKEND=ray RAY_ADDRESS=auto python app.py    # the app (on any node) uses the running deployment

The same with Serve's CLI (the app must be named so that the app finds it):
    serve run --name diffusion-anywhere serving.deployment:build_app model=models/tiny-shapes replicas=8 device=cuda
Every node needs this repository and its environment at the same path (models and LoRA folders too).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading

from config import SettingsError, environment
from devices.options import DeviceSettings
from pipelines import PipelineOptions

from .ray_backend import RayBackend, device_options


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serving", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="diffusers folder, Hub id or .safetensors (default: $MODEL_ID)")
    parser.add_argument("--replicas", type=int, default=1, help="replicas, one device each")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda", "xpu", "npu"))
    parser.add_argument("--cpus-per-replica", type=float, default=1.0, help="CPUs reserved (and torch threads on CPU)")
    parser.add_argument(
        "--address", default=None, help="Ray cluster address (default: $RAY_ADDRESS, else a local instance)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:  # the replicas get the pipeline settings (MODEL_ID, STEP_CACHE, COMPILE...) and TORCH_DTYPE / attention
        options, devices = PipelineOptions.from_env(env := environment(os.environ)), DeviceSettings.from_env(env)
    except SettingsError as exc:
        parser.exit(2, f"error: {exc}\n")
    backend = RayBackend.start(
        model=args.model, replicas=args.replicas, device=args.device, address=args.address,
        cpus_per_replica=args.cpus_per_replica, reuse=False, options=options, device_options=device_options(devices),
    )  # fmt: skip
    print(f"serving {backend.model_info().model_name} on {args.replicas} {args.device} replica(s); Ctrl+C to stop")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # a service manager's stop: close as on Ctrl+C
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        print("stopping: deleting the deployment")
        backend.close()


if __name__ == "__main__":
    main()
