"""`python -m devices [--device X] [--json]`: the device report (every backend, the choice, memory)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import warnings

from .manager import DeviceFallbackWarning, DeviceManager
from .options import DeviceSettings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devices", description=__doc__)
    parser.add_argument("--device", default=None, help="device to request (default: $PREFERRED_DEVICE or auto)")
    parser.add_argument("--dtype", default=None, help="float32 | float16 | bfloat16 (default: $TORCH_DTYPE or policy)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.simplefilter("ignore", DeviceFallbackWarning)  # the log line below says it once
    try:
        dm = DeviceManager(options=DeviceSettings.from_env(os.environ).options_for(args.device, args.dtype))
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(dm.to_json() if args.json else dm.describe())
    return 0


if __name__ == "__main__":
    sys.exit(main())
