"""Build kio messages of any version from one version-independent description.

Handlers describe a response once, with the field names of the newest
version, as plain dicts and lists; :func:`build` keeps only the fields that the
requested version's kio class has (recursively), converts error codes and
millisecond durations to kio's types, and refuses a dict that lacks a field the
class requires (a handler bug, not bad input).

Sans-I/O: no trio here.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
from collections.abc import Mapping
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta, i64Timedelta

_MISSING = dataclasses.MISSING


@dataclasses.dataclass(frozen=True, slots=True)
class _Field:
    name: str
    hint: Any
    required: bool


@cache
def _fields(cls: type) -> tuple[_Field, ...]:
    hints = typing.get_type_hints(cls)
    return tuple(
        _Field(
            f.name,
            hints[f.name],
            f.default is _MISSING and f.default_factory is _MISSING,
        )
        for f in dataclasses.fields(cls)
    )


def _convert(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return _convert(args[0], value) if len(args) == 1 else value
    if origin is tuple:
        (item, *_rest) = typing.get_args(hint)
        return tuple(_convert(item, v) for v in value)
    if hint is ErrorCode:
        return value if isinstance(value, ErrorCode) else ErrorCode(int(value))
    if hint in (i32Timedelta, i64Timedelta):
        return (
            value
            if isinstance(value, datetime.timedelta)
            else datetime.timedelta(milliseconds=int(value))
        )
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else build(hint, value)
    return value


def build(cls: Any, data: Mapping[str, Any]) -> Any:
    """An instance of the kio dataclass *cls* from *data* (extra keys are dropped)."""
    kwargs: dict[str, Any] = {}
    for f in _fields(cls):
        if f.name in data:
            kwargs[f.name] = _convert(f.hint, data[f.name])
        elif f.required:
            raise KeyError(f"{cls.__qualname__} v{getattr(cls, '__version__', '?')} needs {f.name}")
    return cls(**kwargs)


def ms(value: Any) -> int:
    """Milliseconds of a kio duration field (timedelta) or a plain int."""
    if isinstance(value, datetime.timedelta):
        return int(value.total_seconds() * 1000)
    return int(value)
