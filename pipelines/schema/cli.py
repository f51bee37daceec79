"""A request's command-line flags, derived from the request schema for every CLI that makes requests.

`python -m engine`, `python -m pipelines` and `python -m pipelines.batch` each add the schema's
fields for the tasks they serve (`add_request_arguments`), under the flag the schema names
(`About.cli`, else --our-name), with its description and what it accepts as help; a field added
to the schema becomes a flag of every CLI without a change here (tests/test_fields.py checks).
Values arrive as text and are checked by the schema itself, so a CLI refuses exactly what the UI
and the APIs refuse; `flag_message` names the flag in the refusal.

Kinds that a command line writes its own way:
- the prompt is positional (several: several prompts);
- LoRAs are `--lora NAME_OR_FILE[:SCALE]`, repeatable (each CLI resolves a name or a file);
- images are file paths (`--init-image`, repeatable; `--mask`);
- a switch (`--invert-mask`) is present or not;
- a ControlNet unit is `--controlnet image=FILE,model=NAME[,module=canny,weight=0.8,...]`, repeatable;
  an image prompt `--ip-adapter image=FILE,model=NAME[,scale=0.7]`, repeatable
  (the unit's fields by name, pipelines.control.controlnet).
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import Any

from pipelines.schema.fields import RequestError, Spec
from pipelines.schema.request import fields, names

FLAGS = names("cli")  # flat field -> its flag ("prompt" for the positional)
SHORT = {"num_images": "-n"}  # the short flags command lines have always had


def lora_flag(value: str) -> tuple[str, str]:
    """`NAME_OR_FILE[:SCALE]` -> (name or file, scale as text: the schema checks it; "1" when left out)."""
    path, sep, scale = value.rpartition(":")
    if not sep or not path or "/" in scale or "\\" in scale:  # no scale (a Windows path has a colon too)
        return value, "1"
    return path, scale


def add_request_arguments(
    parser: argparse.ArgumentParser, tasks: Iterable[str], skip: Iterable[str] = ()
) -> list[Spec]:
    """Add a flag for every schema field of `tasks` but `skip`; returns the fields added, in order."""
    tasks, skip = set(tasks), set(skip)
    added = []
    for item in fields():
        if not (item.about.tasks & tasks) or item.name in skip:
            continue
        flag = FLAGS[item.name]
        help_text = f"{item.description} [{item.accepted()}]"
        if item.name == "prompt":
            parser.add_argument("prompt", nargs="+", help=help_text)
        elif item.kind == "flag":  # a switch that is on by default is turned off by --no-NAME
            action = argparse.BooleanOptionalAction if item.default is True else "store_true"
            parser.add_argument(flag, dest=item.name, action=action, default=None, help=help_text)
        elif item.kind in ("scales", "images", "names", "units"):
            metavar = {"scales": "NAME_OR_FILE[:SCALE]", "images": "FILE", "names": "NAME", "units": "image=FILE,model=NAME,..."}[item.kind]
            parser.add_argument(flag, dest=item.name, action="append", metavar=metavar, help=help_text)
        else:
            metavar = "FILE" if item.kind == "image" else item.name.upper()
            short = (SHORT[item.name],) if item.name in SHORT else ()
            parser.add_argument(*short, flag, dest=item.name, metavar=metavar, help=help_text)
        added.append(item)
    return added


def request_values(args: argparse.Namespace, added: list[Spec]) -> dict[str, Any]:
    """The flat values the flags set (the schema checks them); images opened from their files."""
    from PIL import Image

    flat: dict[str, Any] = {}
    for item in added:
        value = getattr(args, item.name, None)
        if value is None:
            continue
        if item.name == "prompt":
            value = value if len(value) > 1 else value[0]
        elif item.kind == "scales":
            value = dict(lora_flag(v) for v in value)
        elif item.kind == "images":
            value = [_open(Image, path, item, "RGB") for path in value]
        elif item.kind == "image":
            value = _open(Image, value, item, None)
        elif item.kind == "units":
            value = [unit_flag(Image, text, item) for text in value]
        flat[item.name] = value
    return flat


def unit_flag(image_module: Any, text: str, item: Spec) -> dict[str, Any]:
    """`image=FILE,model=NAME,weight=0.8` -> the unit's values (the schema checks them), its image opened."""
    unit: dict[str, Any] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise RequestError(item.path, f"{part!r}: a unit is KEY=VALUE pairs separated by commas (image=FILE,model=NAME)")
        unit[key.strip()] = value.strip()
    if "image" in unit:
        unit["image"] = _open(image_module, unit["image"], item, "RGB")
    return unit


def _open(image_module: Any, path: str, item: Spec, mode: str | None) -> Any:
    try:
        with image_module.open(path) as image:
            image.load()
            return image.convert(mode) if mode else image.copy()
    except OSError as exc:
        raise RequestError(item.path, f"cannot read {path!r}: {exc.strerror or exc}") from None


def flag_message(exc: RequestError) -> str:
    """A refusal as a command line says it: the flag, then the sentence."""
    if exc.field is None:
        return exc.detail
    flag = FLAGS.get(exc.field, exc.field)
    return f"{flag}: {exc.detail}"
