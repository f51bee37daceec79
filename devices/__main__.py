"""`python -m devices VERB`: the device manager's command.

  info [--device X] [--json]        the device report (every backend, the choice, memory); the default verb,
                                    so `python -m devices [--device X] [--json]` still works
  test [DEVICE] [--dtype ...]       numerical self-test against the CPU in float32 (devices/selftest.py)
  benchmark [DEVICE] [--duration S] denoiser it/s per dtype x attention x compile x batch (devices/speed.py)
  optimize [DEVICE] [--apply]       test + benchmark, the fastest setting that passes, and why
  set DEVICE                        write PREFERRED_DEVICE to the settings file

Exit codes: 0 done (and, for test/optimize, every check passes), 1 a check failed or nothing passes,
2 a wrong argument or an unusable device.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

import torch

from config import SettingsError
from config.settings_file import layered, update_file

from .manager import DeviceFallbackWarning, DeviceManager
from .options import DeviceSettings, parse_preferred
from .xla import use_stand_in

VERBS = ("info", "test", "benchmark", "optimize", "set")
log = logging.getLogger(__name__)


class UsageError(Exception):
    """A wrong argument or an unusable device: one line on stderr, exit 2."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m devices", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    verbs = parser.add_subparsers(dest="verb", required=True)
    info = verbs.add_parser("info", help="the device report")
    info.add_argument("--device", default=None, help="device to request (default: $PREFERRED_DEVICE or auto)")
    info.add_argument("--dtype", default=None, help="float32 | float16 | bfloat16 (default: $TORCH_DTYPE or policy)")
    info.add_argument("--json", action="store_true", help="print the report as JSON")
    for name, text in (("test", "numerical self-test"), ("benchmark", "denoiser speed"), ("optimize", "choose")):
        sub = verbs.add_parser(name, help=text)
        sub.add_argument("device", nargs="?", default=None, help="default: $PREFERRED_DEVICE or auto")
        sub.add_argument("--model", type=Path, default=None, help="a diffusers folder (default: models/tiny-shapes)")
        sub.add_argument("--dtype", type=_dtypes, default=None, help="comma-separated dtypes (default: per backend)")
        sub.add_argument("--json-out", type=Path, default=None, help="where to save the JSON (default: the cache dir)")
        sub.add_argument(
            "--threads",
            type=int,
            default=None,
            help="torch CPU threads (default: torch's; on a busy machine: the free cores)",
        )
        if name != "test":
            sub.add_argument("--duration", type=float, default=1.0, help="seconds per benchmark cell (default 1)")
            sub.add_argument(
                "--compile", action="store_true", help="also measure compile where the policy is off (CPU, MPS)"
            )
    verbs.choices["optimize"].add_argument("--apply", action="store_true", help="write the choice to the settings file")
    verbs.choices["test"].add_argument(
        "--plan", action="store_true", help="list the checks this device would run (dtypes, attention), run none"
    )
    verbs.add_parser("set", help="write PREFERRED_DEVICE").add_argument("device", help="as PREFERRED_DEVICE accepts it")
    return parser


def _dtypes(text: str) -> list[str]:
    return [t for t in (s.strip() for s in text.split(",")) if t]


def _manager(
    settings: DeviceSettings, device: str | None, dtype: str | None = None, strict: bool = True
) -> DeviceManager:
    """The DeviceManager a verb runs on; the measuring verbs are strict: a test of another device than
    the one asked for would answer the wrong question."""
    options = settings.options_for(device, dtype)
    return DeviceManager(options=dataclasses.replace(options, strict=options.strict or strict))


def _json_path(given: Path | None, name: str, env: Mapping[str, str]) -> Path:
    if given is not None:
        return given
    cache = env.get("XDG_CACHE_HOME", "").strip() or os.path.join(env.get("HOME", "") or str(Path.home()), ".cache")
    return Path(cache) / "diffusion-anywhere" / name


def _save(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n", encoding="utf-8")
    print(f"saved {path}")


def _quiet_diffusers() -> None:
    """diffusers warns at every `.to(dtype)` of a model about modules kept in float32 (none here)."""
    from diffusers.utils import logging as diffusers_logging

    diffusers_logging.set_verbosity_error()


def cmd_info(args: argparse.Namespace, settings: DeviceSettings, env: Mapping[str, str]) -> int:
    dm = _manager(settings, args.device, args.dtype, strict=False)
    print(dm.to_json() if args.json else dm.describe())
    return 0


def cmd_test(args: argparse.Namespace, settings: DeviceSettings, env: Mapping[str, str]) -> int:
    from . import selftest

    dm = _manager(settings, args.device)
    if args.plan:
        print(selftest.format_plan(selftest.plan(dm.backend, args.dtype), str(dm.device)))
        return 0
    _quiet_diffusers()
    report = selftest.run(dm.device, dm.backend, args.dtype, args.model or selftest.DEFAULT_MODEL)
    print(selftest.format_table(report))
    _save(_json_path(args.json_out, f"selftest-{dm.backend}.json", env), report.to_dict())
    return 0 if report.passed else 1


def cmd_benchmark(args: argparse.Namespace, settings: DeviceSettings, env: Mapping[str, str]) -> int:
    from . import selftest, speed

    dm = _manager(settings, args.device)
    _quiet_diffusers()
    bench = speed.run(
        dm.device, dm.backend, dtypes=args.dtype, compile_asked=args.compile, duration=args.duration,
        model_dir=args.model or selftest.DEFAULT_MODEL,
    )  # fmt: skip
    print(speed.format_table(bench))
    _save(_json_path(args.json_out, f"benchmark-{dm.backend}.json", env), bench.to_dict())
    return 0


def cmd_optimize(args: argparse.Namespace, settings: DeviceSettings, env: Mapping[str, str], path: Path | None) -> int:
    from . import selftest, speed

    if args.apply and path is None:
        raise UsageError("SETTINGS_FILE is set but empty: there is no settings file to apply to")
    dm = _manager(settings, args.device)
    _quiet_diffusers()
    model = args.model or selftest.DEFAULT_MODEL
    report = selftest.run(dm.device, dm.backend, args.dtype, model)
    print(selftest.format_table(report), end="\n\n")
    bench = speed.run(
        dm.device, dm.backend, dtypes=args.dtype, compile_asked=args.compile, duration=args.duration,
        batches=(speed.CHOICE_BATCH,), model_dir=model,
    )  # fmt: skip
    print(speed.format_table(bench), end="\n\n")
    test_rows = report.to_dict()["rows"]
    choice = speed.choose(test_rows, bench.to_dict()["cells"])
    print("\n".join(f"- {reason}" for reason in choice.reasons))
    _save(
        _json_path(args.json_out, f"optimize-{dm.backend}.json", env),
        {"test": report.to_dict(), "benchmark": bench.to_dict(), "choice": dataclasses.asdict(choice)},
    )
    if not choice.settings:
        return 1
    print("choice: " + ", ".join(f"{k}={v}" for k, v in choice.settings.items()))
    if args.apply:
        update_file(path, choice.settings)
        print(f"wrote {', '.join(choice.settings)} to {path}")
    return 0


def cmd_set(args: argparse.Namespace, path: Path | None) -> int:
    if path is None:
        raise UsageError("SETTINGS_FILE is set but empty: there is no settings file to write")
    value = parse_preferred(args.device)
    update_file(path, {"PREFERRED_DEVICE": value})
    print(f"wrote PREFERRED_DEVICE={value} to {path}")
    return 0


def _argv(argv: list[str]) -> list[str]:
    """The old form (`python -m devices [--device X] [--json]`) is `info`."""
    if argv and (argv[0] in VERBS or argv[0] in ("-h", "--help")):
        return argv
    return ["info", *argv]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(_argv(sys.argv[1:] if argv is None else list(argv)))
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    warnings.simplefilter("ignore", DeviceFallbackWarning)  # the log line says it once
    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)  # measured here: 2 threads beside a busy process ran 28x slower than 1
    try:
        layers = layered(os.environ)  # the environment over the settings file: path and file read once
        if args.verb == "set":
            return cmd_set(args, layers.path)
        env = layers.values
        settings = DeviceSettings.from_env(env)
        use_stand_in(settings.xla_cpu_devices, os.environ)  # before anything imports JAX
        if args.verb == "optimize":
            return cmd_optimize(args, settings, env, layers.path)
        return {"info": cmd_info, "test": cmd_test, "benchmark": cmd_benchmark}[args.verb](args, settings, env)
    except (UsageError, SettingsError, ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
