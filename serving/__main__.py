"""`python -m serving`: start the generation deployment on a Ray cluster and keep it serving.

ray start --head                                   # on the head node (then `ray start --address ...` on others)
python -m serving --model models/tiny-shapes --replicas 8 --device cuda --address auto
GENERATION_BACKEND=ray RAY_ADDRESS=auto python app.py   # the app (any node) uses the running deployment
"""

from __future__ import annotations

import argparse
import logging
import threading

from .ray_backend import RayBackend


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m serving", description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="diffusers folder, Hub id or .safetensors (default: $MODEL_ID)")
    parser.add_argument("--replicas", type=int, default=1, help="replicas, one device each")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | xpu | npu")
    parser.add_argument("--cpus-per-replica", type=float, default=1.0)
    parser.add_argument("--address", default=None, help="Ray cluster address (default: a local instance)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    backend = RayBackend.start(
        model=args.model, address=args.address, replicas=args.replicas, device=args.device,
        cpus_per_replica=args.cpus_per_replica,
    )  # fmt: skip
    print(f"serving {backend.model_info().model_name} on {args.replicas} replica(s); Ctrl+C to stop")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        backend.close()


if __name__ == "__main__":
    main()
