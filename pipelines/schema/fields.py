"""The building blocks of the request schema (`pipelines.schema.request`): value types and what a field is.

A request field is declared once, in the schema, as `Annotated[type, <value type>, About(...)]`
plus pydantic's `Field(default, description=...)`. The value type (`Range`, `Text`, `Choice`,
`Flag`, ...) is both the declaration of what the field accepts (bounds, choices: read by the
forms, the CLIs, the docs) and its validator: every front end sends raw JSON-ish values (numbers
as numbers or text, `null` for "the model's"), and every front end gets the same parsing rules
and the same messages. `About` says how a field surfaces: its label, which kinds of request use
it, and the name each ecosystem has for it (A1111's key, OpenAI's field, the CLI flag).

Parsing rules (they answer what a caller may send, not what Python would accept):
- whole numbers: an int, an integral float, or ASCII digits ("20", "+7", "64.0"); at most 40 digits (a
  5000-digit string would otherwise cost a bignum conversion and Python's "Exceeds the limit"
  message); "²" and "١٢" are refused (Python's `isdigit` and `int` take them);
- numbers: an int, a float or an ASCII decimal ("0.5", "1e-2"); NaN and infinities refused;
- booleans are never numbers (JSON `true` is not 1);
- text: no lone surrogates, no control characters but tab and newlines (and at most the server's
  MAX_PROMPT_CHARS, which `GenerationRequest.parse` checks).
A refusal raises pydantic's `PydanticCustomError` whose message is the detail without the field
name; `pipelines.schema.request.request_error` turns pydantic's error into `RequestError(loc, detail)`.
"""

from __future__ import annotations

import math
import re
import typing
import unicodedata
from dataclasses import dataclass, field
from typing import Any

from PIL import Image
from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticCustomError, core_schema

TASKS = ("txt2img", "img2img", "inpaint", "video")  # what a request is: `GenerationRequest.task`
ALL_TASKS = frozenset(TASKS)
IMAGE_TASKS = frozenset(TASKS[:3])  # the kinds that make still pictures (a video request: `num_frames` set)
_WHOLE = re.compile(r"[+-]?[0-9]{1,40}")  # ASCII only: str.isdigit() is True for "²", int("١٢") is 12
_DECIMAL = re.compile(r"[+-]?(?:[0-9]{1,40}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})(?:[eE][+-]?[0-9]{1,3})?")
_ALLOWED_CONTROL = {"\n", "\t", "\r"}
IMAGE_MODES = ("RGB", "RGBA", "L")
MIN_IMAGE_SIDE = 8
LOC, FIELD = "__at__", "__field__"  # a refusal's context keys (not words a message would hold)


class RequestError(ValueError):
    """A refused request value, with where it is: `loc` is the field's path in the request schema
    (("steps",), ("inpaint", "mask_blur"), ("loras",)), `sub` the place inside the value (an index
    of a list, a key of a dict: ("init_images",) + (1,)), `detail` the sentence without the name.
    `str()` is "steps: 200 is out of range 1..150", "init_images[1]: ...".

    Every front end maps `field` (the flat name, `pipelines.schema.request.fields`) to its own name for it
    (A1111's `loc`, OpenAI's `param`, a CLI flag) without parsing the text."""

    def __init__(self, loc: tuple[str, ...] | str, detail: str, sub: tuple[str | int, ...] = ()):
        self.loc: tuple[str, ...] = (loc,) if isinstance(loc, str) else tuple(loc)
        self.sub = tuple(sub)
        self.detail = detail
        where = dotted(self.loc) + "".join(f"[{part!r}]" if isinstance(part, str) else f"[{part}]" for part in self.sub)
        super().__init__(f"{where}: {detail}" if where else detail)

    @property
    def field(self) -> str | None:
        """The field's flat name ("mask_blur" for ("inpaint", "mask_blur")); None: the request as a whole."""
        return self.loc[-1] if self.loc else None


def dotted(loc: tuple[str, ...]) -> str:
    """("inpaint", "mask_blur") -> "inpaint.mask_blur"."""
    return ".".join(loc)


def request_error(exc: ValidationError) -> RequestError:
    """pydantic's first error as ours: the field's path, the place inside it, and the sentence."""
    first = exc.errors(include_url=False)[0]
    ctx = first.get("ctx") or {}
    loc = tuple(str(part) for part in first["loc"] if isinstance(part, str)) + tuple(ctx.get(FIELD, ()))
    sub = tuple(ctx.get(LOC, ()))
    kind = first["type"]
    if kind == "missing":
        detail = "is required"
    elif kind == "extra_forbidden":
        detail = "is not a field of a generation request"
    else:  # ours ("request"), or pydantic's own for a nested model given as something else
        detail = first["msg"]
    return RequestError(loc, detail, sub)


class Schema(BaseModel):
    """A part of the request schema: immutable, no unknown fields, PIL images allowed."""

    model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)


def refuse(detail: str, at: tuple[str | int, ...] = (), field: tuple[str, ...] = ()) -> PydanticCustomError:
    """A validator's refusal: `at` the place inside the value (a dict key, a list index); `field` the
    field's path, from a model validator (which pydantic reports at the model, not a field)."""
    where = {k: v for k, v in ((LOC, at), (FIELD, field)) if v}
    return PydanticCustomError("request", detail, where or None)


def shown(value: Any, limit: int = 40) -> str:
    """A caller's value as a message quotes it: repr, cut to `limit` characters (a value can be huge)."""
    text = repr(value) if value is None or isinstance(value, bool | int | float | str) else type(value).__name__
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _nullable(source: Any) -> bool:
    return type(None) in typing.get_args(source)


@dataclass(frozen=True)
class About:
    """How a field surfaces in the front ends (the schema's field list is what they derive from).

    - label: what a form calls it;
    - tasks: the kinds of request that use it (a front end serving only text-to-image leaves out
      `strength`);
    - a1111 / openai: the ecosystem's own name for it; None: our name, taken as an extension the
      ecosystem lacks (an A1111 body key, an OpenAI `extra_body` field);
    - cli: the flag of `python -m engine` and `python -m pipelines` (None: --our-name);
    - infotext: its name in A1111's PNG text ("CFG scale"), where a PNG records it
      (pipelines.pnginfo.write writes, pipelines.pnginfo.read reads it);
    - step: a form's slider step (forms only; bounds come from the value type).
    """

    label: str
    tasks: frozenset[str] = ALL_TASKS
    a1111: str | None = None
    openai: str | None = None
    cli: str | None = None
    infotext: str | None = None
    step: float | None = None
    unit: str = ""


@dataclass(frozen=True)
class Range:
    """A number field's accepted range, and its parser. `low_open`: `low` itself is refused."""

    low: float
    high: float
    integer: bool = False
    low_open: bool = False

    def describe(self) -> str:
        if self.integer:
            return f"{int(self.low)}..{int(self.high)}"
        return f"({self.low:g}, {self.high:g}]" if self.low_open else f"{self.low:g}..{self.high:g}"

    def parse(self, value: Any) -> int | float:
        """The number in `value`, checked against the range; PydanticCustomError naming the problem."""
        number = whole(value) if self.integer else decimal(value)
        if number > self.high or number < self.low or (self.low_open and number == self.low):
            raise refuse(f"{number if self.integer else f'{number:g}'} is out of range {self.describe()}")
        return number

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        nullable = _nullable(source)
        return core_schema.no_info_plain_validator_function(lambda v: None if v is None and nullable else self.parse(v))


def whole(value: Any) -> int:
    """An integer from an int, an integral float or ASCII digits (see the module docstring)."""
    number = value
    if isinstance(value, str):
        text = value.strip()
        if _WHOLE.fullmatch(text):
            return int(text)
        number = float(text) if _DECIMAL.fullmatch(text) else None  # "64.0": a whole number written as a decimal
    if isinstance(number, float) and math.isfinite(number) and number.is_integer():
        return int(number)
    if isinstance(number, int) and not isinstance(number, bool):
        return number
    raise refuse(f"must be a whole number, got {shown(value)}")


def decimal(value: Any) -> float:
    """A finite number from an int, a float or an ASCII decimal (see the module docstring)."""
    if isinstance(value, str):
        text = value.strip()
        if not _DECIMAL.fullmatch(text):
            raise refuse(f"must be a number, got {shown(value)}")
        value = float(text)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise refuse(f"must be a number, got {shown(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise refuse(f"must be a finite number, got {shown(value)}")
    return number


@dataclass(frozen=True)
class Seed:
    """A seed: 0..2^64-1 (torch's generators); a negative one (A1111's -1) or none means random."""

    high: int = 2**64 - 1

    def parse(self, value: Any) -> int | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        number = whole(value)
        if number < 0:
            return None
        if number > self.high:
            raise refuse(f"{number} is out of range 0..{self.high} (-1: random)")
        return number

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.parse)


@dataclass(frozen=True)
class Text:
    """Text a person wrote: no lone surrogates or control characters (the module docstring)."""

    required: bool = False

    def parse(self, value: Any) -> str:
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise refuse(f"must be text, got {shown(value)}")
        for i, ch in enumerate(value):
            category = unicodedata.category(ch)
            if category == "Cs":
                raise refuse(f"invalid character (a lone UTF-16 surrogate) at position {i}")
            if category == "Cc" and ch not in _ALLOWED_CONTROL:
                raise refuse(f"control character U+{ord(ch):04X} at position {i} is not allowed")
        if self.required and not value.strip():
            raise refuse("must be non-empty text")
        return value

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        nullable = _nullable(source)

        def check(value: Any) -> str | None:
            text = self.parse(value)
            return None if nullable and not text else text

        return core_schema.no_info_plain_validator_function(check)


@dataclass(frozen=True)
class Prompts:
    """One prompt, or a list of prompts (each a request of its own images): each non-empty `Text`."""

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        text = Text(required=True)

        def check(value: Any) -> str | list[str]:
            if isinstance(value, list | tuple):
                if not value:
                    raise refuse("at least one prompt is required, got an empty list")
                return [_item(text.parse, item, i) for i, item in enumerate(value)]
            return text.parse(value)

        return core_schema.no_info_plain_validator_function(check)


def _item(parse: Any, value: Any, index: int | str) -> Any:
    """`parse(value)` for one item of a list or dict field: a refusal carries the item's place."""
    try:
        return parse(value)
    except PydanticCustomError as exc:
        raise refuse(exc.message(), at=(index,)) from None


@dataclass(frozen=True)
class Choice:
    """One of `options` (any capitalisation, given back as written here; `aliases`: other names of an option,
    lower-case -> the option); "" or null: the default."""

    options: tuple[str, ...]
    aliases: tuple[tuple[str, str], ...] = ()

    def parse(self, value: Any) -> str | None:
        if value is None or (isinstance(value, str) and not value.strip()):
            return None
        names = {**{o.lower(): o for o in self.options}, **dict(self.aliases)}
        found = names.get(value.strip().lower()) if isinstance(value, str) else None
        if found is None:
            raise refuse(f"{shown(value, 80)} is not one of {', '.join(self.options)}")
        return found

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        nullable = _nullable(source)

        def check(value: Any) -> str | None:
            chosen = self.parse(value)
            if chosen is None and not nullable:
                raise refuse(f"must be one of {', '.join(self.options)}")
            return chosen

        return core_schema.no_info_plain_validator_function(check)


@dataclass(frozen=True)
class Flag:
    """A switch: true/false, 1/0, or their text ("true", "0"); null is false."""

    def parse(self, value: Any) -> bool:
        if value is None or isinstance(value, bool):
            return bool(value)
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0"):
            return value.strip().lower() in ("true", "1")
        raise refuse(f"must be true or false, got {shown(value)}")

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.parse)


@dataclass(frozen=True)
class Scales:
    """A {name: number} mapping (LoRA name -> scale): names as text, each scale in `scale`'s range."""

    scale: Range

    def parse(self, value: Any) -> dict[str, float]:
        if value in (None, ""):
            return {}
        if not isinstance(value, dict):
            raise refuse(f"must be an object of name -> scale, got {shown(value)}")
        out = {}
        for name, scale in value.items():
            if not isinstance(name, str) or not name.strip():
                raise refuse(f"names must be non-empty text, got {shown(name)}")
            out[name] = float(_item(self.scale.parse, scale, name))
        return out

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.parse)


@dataclass(frozen=True)
class Names:
    """Names of what the server has (styles), in order: a list of non-empty texts; one text is a list
    of one; null or [] is none. Whether each exists is the model's to say (`ModelInfo.accept`)."""

    most: int = 32

    def parse(self, value: Any) -> tuple[str, ...]:
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value] if value.strip() else []
        if not isinstance(value, list | tuple):
            raise refuse(f"must be a list of names, got {shown(value)}")
        if len(value) > self.most:
            raise refuse(f"at most {self.most} names, got {len(value)}")
        return tuple(_item(Text(required=True).parse, item, i).strip() for i, item in enumerate(value))

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.parse)


@dataclass(frozen=True)
class Picture:
    """A decoded image (front ends decode uploads after checking their headers): a PIL image of a
    mode the pipelines take, at least MIN_IMAGE_SIDE pixels a side. `many`: a non-empty list of them."""

    many: bool = False
    modes: tuple[str, ...] = IMAGE_MODES

    def one(self, value: Any) -> Image.Image:
        if not isinstance(value, Image.Image):
            raise refuse(f"must be an image, got {shown(value)}")
        if value.mode not in self.modes:
            raise refuse(f"image mode {value.mode!r} is not supported; use {' or '.join(self.modes)}")
        if value.width < MIN_IMAGE_SIDE or value.height < MIN_IMAGE_SIDE:
            raise refuse(f"{value.width}x{value.height} is too small (at least {MIN_IMAGE_SIDE} pixels a side)")
        return value

    def parse(self, value: Any) -> Any:
        if not self.many:
            return self.one(value)
        if value is None:
            return None
        if not isinstance(value, list | tuple) or not value:
            raise refuse("must be a non-empty list of images (null for text-to-image)")
        return [_item(self.one, item, i) for i, item in enumerate(value)]

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.parse)


@dataclass(frozen=True)
class Units:
    """A list of parts of one kind (ControlNet units): each a mapping of the part's fields or the part
    itself; null or [] is none. A refusal names the unit and its field ("controlnet[1]: weight: ...")."""

    part: Any  # a Schema class
    most: int = 8

    def parse(self, value: Any) -> tuple[Any, ...]:
        if value is None or value == "":
            return ()
        if isinstance(value, self.part | dict):
            value = [value]
        if not isinstance(value, list | tuple):
            raise refuse(f"must be a list of units (objects), got {shown(value)}")
        if len(value) > self.most:
            raise refuse(f"at most {self.most} units, got {len(value)}")
        return tuple(self._one(item, i) for i, item in enumerate(value))

    def _one(self, item: Any, index: int) -> Any:
        if isinstance(item, self.part):
            return item
        if not isinstance(item, dict):
            raise refuse(f"must be an object of the unit's fields, got {shown(item)}", at=(index,))
        try:
            return self.part(**item)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            where = [str(p) for p in first["loc"] if isinstance(p, str)] + list((first.get("ctx") or {}).get(FIELD, ()))
            name = ".".join(where) or "unit"
            detail = {"missing": "is required", "extra_forbidden": "is not a field of a unit"}.get(first["type"], first["msg"])
            raise refuse(f"{name}: {detail}", at=(index,)) from None

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        return core_schema.no_info_plain_validator_function(self.parse)


@dataclass(frozen=True)
class Spec:
    """One field as the front ends see it: where it is in the request, what it accepts, how it surfaces.

    `name` is its flat name, unique over the whole request (a nested field such as the inpaint's
    `mask_blur` is sent flat by every front end); `path` its place in the request ("inpaint",
    "mask_blur"); `value` its value type (Range, Choice, ...); `default` the request's default
    (None: the model's, the method's or the task's, as `description` says)."""

    name: str
    path: tuple[str, ...]
    value: Any
    about: About
    default: Any
    description: str
    required: bool = False
    nullable: bool = True
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        """What a form or a flag takes: whole | number | text | prompt | choice | flag | scales | names |
        image | images | units."""
        v = self.value
        if isinstance(v, Range):
            return "whole" if v.integer else "number"
        if isinstance(v, Seed):
            return "whole"
        if isinstance(v, Picture):
            return "images" if v.many else "image"
        kinds = {Text: "text", Prompts: "prompt", Choice: "choice", Flag: "flag", Scales: "scales", Names: "names",
                 Units: "units"}  # fmt: skip
        return kinds[type(v)]

    def parse(self, value: Any) -> Any:
        """One value by this field's rules (a recipe's default, a setting, a form's input); null passes
        where the field takes it. PydanticCustomError (a ValueError) with the detail otherwise."""
        if value is None and self.nullable:
            return None
        return self.value.parse(value)

    def accepted(self) -> str:
        """What the field accepts, in words (docs, CLI help)."""
        v = self.value
        if isinstance(v, Range):
            return v.describe()
        if isinstance(v, Seed):
            return f"0..{v.high}; -1: random"
        if isinstance(v, Choice):
            return " | ".join(v.options)
        if isinstance(v, Scales):
            return f"name -> {v.scale.describe()}"
        if isinstance(v, Units):
            return f"a list of at most {v.most} units"
        return {"text": "text", "prompt": "text, or a list of texts", "flag": "true | false", "names": "a list of names",
                "image": "an image", "images": "a list of images"}[self.kind]  # fmt: skip
