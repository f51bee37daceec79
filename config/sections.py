"""Settings sections: each layer declares its environment variables once, as the fields of a frozen
pydantic model (a `Section`), and one reader (`read_section`) turns an environment mapping into it.

Why a package below devices/: `python -m devices`, `python -m pipelines` and `python -m
pipelines.batch` are entry points below engine/ that read their own sections, so the reader must
sit under the lowest layer. It imports nothing of the project.

A field is a setting when `setting(...)` declared it: the variable's name (pydantic's
`validation_alias`; constructing by field name, `PipelineOptions(max_batch=2)`, keeps working),
its default, its accepted values as types and bounds (Literal for choices, ge/le for numbers, a
validator with an `Accepts` for anything else) and a one-line description. From that one
declaration come the value's check, the one-line refusal (`SettingsError`: "NAME='value' is not
valid: expected ...") and the table in docs/settings.md (`docs_table`).

Constructors never read the environment: `Section()` is the defaults. Only entry points call
`from_env(os.environ)`, once, and pass the objects down.

Why not pydantic-settings' `BaseSettings`: it reads the process environment wherever it is
instantiated (the bug this replaces: libraries re-reading the environment below the app), and our
variables are flat names spread over layered sections (MAX_BATCH is the pipeline's,
PREFERRED_DEVICE the devices'). Restricting it to a given mapping and to declared names takes a
custom source per section, more code than the ten-line reader here, which plain pydantic serves.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import NoneType, UnionType
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, Union, get_args, get_origin

import annotated_types
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError
from pydantic.fields import FieldInfo

if TYPE_CHECKING:
    from typing import Self  # Python 3.11+; the project runs on 3.10 too

S = TypeVar("S", bound="Section")
TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")
FLAG_TEXT = "1/true/yes/on or 0/false/no/off"


class SettingsError(ValueError):
    """A setting has a value the program cannot use; the one-line message names the variable and what it accepts."""


class Refused(ValueError):
    """Raised by a field's validator to add a specific reason to the one-line refusal ("key 2 ...");
    any other ValueError is refused with the accepted values alone."""


@dataclass(frozen=True)
class Accepts:
    """What a variable accepts, in words, where its type alone does not say (a device, a size, keys).

    `invalid`: values it refuses (the test that every variable refuses a bad value in one line uses
    them); `secret`: the value is never repeated in a message (passwords, keys)."""

    text: str
    invalid: tuple[str, ...] = ()
    secret: bool = False


def _flag(value: Any) -> Any:
    """1/true/yes/on and 0/false/no/off in any capitalisation, nothing else (pydantic's bool would
    also take t/f/y/n)."""
    if not isinstance(value, str):
        return value
    text = value.strip().lower()
    if text not in TRUE + FALSE:
        raise ValueError(f"expected {FLAG_TEXT}")
    return text in TRUE


def _auto_flag(value: Any) -> Any:
    """auto | 1 | 0, from auto or any of the flag spellings."""
    if isinstance(value, str):
        text = value.strip().lower()
        return "1" if text in TRUE else "0" if text in FALSE else text
    return value


def lowercase(value: Any) -> Any:
    """Choices are case-insensitive: "CPU " is cpu."""
    return value.strip().lower() if isinstance(value, str) else value


Lower = BeforeValidator(lowercase)
Flag = Annotated[bool, BeforeValidator(_flag), Accepts(FLAG_TEXT, invalid=("maybe", "2"))]
AutoFlag = Annotated[
    Literal["auto", "1", "0"], BeforeValidator(_auto_flag), Accepts(f"auto, {FLAG_TEXT}", invalid=("maybe",))
]


class Section(BaseModel):
    """The settings of one layer: frozen, built from field names (code) or variable names (`from_env`)."""

    model_config = ConfigDict(
        frozen=True, validate_by_name=True, validate_by_alias=True, extra="forbid", arbitrary_types_allowed=True
    )

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Self:
        """This section's variables from `env` (an entry point passes os.environ); SettingsError naming a bad one."""
        return read_section(env, cls)

    def replace(self, **changes: Any) -> Self:
        """A copy with fields replaced, unchecked (for values the code itself chose)."""
        return self.model_copy(update=changes)


def setting(env: str, default: Any, description: str, *, shown: str | None = None, **constraints: Any) -> Any:
    """A field read from the variable `env`. `shown`: the default as docs/settings.md says it where the
    value would not (None as "per device"); `constraints`: pydantic's ge/gt/le/lt, validate_default."""
    extra = {"shown_default": shown} if shown is not None else None
    return Field(default, validation_alias=env, description=description, json_schema_extra=extra, **constraints)


def read_section(env: Mapping[str, str], cls: type[S]) -> S:
    """The one reader: `cls`'s variables from `env` (blank = unset), nested sections read from the same
    mapping; SettingsError with one line naming the first bad variable."""
    values: dict[str, Any] = {}
    for name, field in cls.model_fields.items():
        if _is_section(field.annotation):
            values[name] = read_section(env, field.annotation)
        elif isinstance(field.validation_alias, str) and (env.get(field.validation_alias) or "").strip():
            values[field.validation_alias] = env[field.validation_alias].strip()
    try:
        return cls.model_validate(values)
    except ValidationError as exc:
        raise SettingsError(refusal(cls, values, exc)) from None


def refusal(cls: type[Section], values: Mapping[str, Any], exc: ValidationError) -> str:
    """One line for the first error: "NAME='value' is not valid: expected <what it accepts>"."""
    error = exc.errors()[0]
    name = str(error["loc"][0]) if error["loc"] else ""
    field = next((f for f in cls.model_fields.values() if f.validation_alias == name), None)
    if field is None:  # not a variable (a rule across fields): pydantic's own words
        return f"{name}: {error['msg']}" if name else str(error["msg"])
    accepts = declared_accepts(field)
    given = " (value hidden)" if accepts is not None and accepts.secret else f"={values.get(name)!r}"
    line = f"{name}{given} is not valid: expected {accepted(field)}"
    reason = (error.get("ctx") or {}).get("error")
    return f"{line}; {reason}" if isinstance(reason, Refused) else line


@dataclass(frozen=True)
class Variable:
    """One declared variable, for docs/settings.md and the tests."""

    name: str
    field: str
    default: str
    accepts: str
    description: str
    info: FieldInfo


def variables(cls: type[Section]) -> Iterator[Variable]:
    """`cls`'s own variables in declaration order (not those of nested sections: `sections`)."""
    for name, field in cls.model_fields.items():
        if isinstance(field.validation_alias, str):
            yield Variable(
                field.validation_alias, name, default_text(field), accepted(field), field.description or "", field
            )


def sections(cls: type[Section]) -> list[type[Section]]:
    """`cls`'s nested sections (depth first), then `cls` itself: every section an entry point reads."""
    found: list[type[Section]] = []
    for field in cls.model_fields.values():
        if _is_section(field.annotation):
            found += [s for s in sections(field.annotation) if s not in found]
    return [*found, cls]


def docs_table(cls: type[Section]) -> str:
    """The markdown tables of every variable `cls` reads, one per section (docs/settings.md)."""
    out = []
    for section in sections(cls):
        title = section.model_config.get("title") or section.__name__
        out += [f"### {title}", "", f"`{section.__module__}.{section.__name__}`", ""]
        out += ["| variable | default | accepts | meaning |", "|---|---|---|---|"]
        for v in variables(section):
            out.append(f"| `{v.name}` | {_cell(v.default)} | {_cell(v.accepts)} | {_cell(v.description)} |")
        out.append("")
    return "\n".join(out).rstrip() + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _is_section(kind: Any) -> bool:
    return isinstance(kind, type) and issubclass(kind, Section)


def declared_accepts(field: FieldInfo) -> Accepts | None:
    """The field's `Accepts`, where its type declared one."""
    return next((m for m in field.metadata if isinstance(m, Accepts)), None)


def value_type(field: FieldInfo) -> Any:
    """The field's type without `None` (a setting may be unset) and without Annotated's extras."""
    kind = field.annotation
    if get_origin(kind) in (Union, UnionType):
        rest = [a for a in get_args(kind) if a is not NoneType]
        kind = rest[0] if len(rest) == 1 else kind
    return get_args(kind)[0] if get_origin(kind) is Annotated else kind


def bounds(field: FieldInfo) -> dict[str, Any]:
    """The field's numeric bounds as {"ge"|"gt"|"le"|"lt": value}."""
    out = {}
    for item in field.metadata:
        for key in ("ge", "gt", "le", "lt"):
            if isinstance(item, annotated_types.BaseMetadata) and hasattr(item, key):
                out[key] = getattr(item, key)
    return out


def accepted(field: FieldInfo) -> str:
    """What the variable accepts, in words, derived from its declaration."""
    if (accepts := declared_accepts(field)) is not None:
        return accepts.text
    kind = value_type(field)
    if get_origin(kind) is Literal:
        return "one of " + ", ".join(str(a) for a in get_args(kind))
    if kind in (int, float):
        return _range_text(kind, bounds(field))
    return "a path" if kind is Path else "any text"


def _range_text(kind: type, b: dict[str, Any]) -> str:
    noun = "an integer" if kind is int else "a number"
    low, high = _number(b.get("ge", b.get("gt"))), _number(b.get("le", b.get("lt")))
    if "gt" in b or "lt" in b:
        left, right = "(" if "gt" in b else "[", ")" if "lt" in b else "]"
        return f"{noun} in {left}{low}, {high}{right}" if high is not None else f"{noun} above {low}"
    if low is not None and high is not None:
        return f"{noun} from {low} to {high}"
    return f"{noun} of at least {low}" if low is not None else noun


def _number(value: float | None) -> str | None:
    """65535, 0.1, 86400: as written, never 6.5e+04."""
    if value is None:
        return None
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def default_text(field: FieldInfo) -> str:
    """The default as docs/settings.md shows it."""
    extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
    if "shown_default" in extra:
        return str(extra["shown_default"])
    value = field.get_default(call_default_factory=True)
    if value is None or value in ("", ()):
        return "none"
    if isinstance(value, bool):
        return "off" if not value else "on"
    return f"`{_number(value) if isinstance(value, float) else value}`"
