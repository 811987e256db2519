"""Building kio messages at a version known only at run time.

kio generates one module per message version (``kio.schema.fetch.v12.response``)
holding the message class and its entity classes (``FetchableTopicResponse``,
``PartitionData``, ...), each a frozen dataclass with exactly the fields of that
version.  Code that answers or asks at whatever version a peer speaks takes the
classes from that module (``request_module``, ``response_module``, or
``module_of`` an entity it already has) and builds each entity with ``make``:
it is described once, with every field any version has, and the fields the
version lacks are dropped.  ``convert`` carries an entity across versions.
"""

from __future__ import annotations

import dataclasses
import sys
from functools import cache
from types import ModuleType
from typing import Any, TypeVar

from . import codec
from .apis import FETCH
from .errors import DecodeError

T = TypeVar("T")


def _module(schema: Any, kind: str, api_key: int, version: int) -> ModuleType:
    if schema is None:
        raise DecodeError(f"kio has no {kind} schema for api_key={api_key} v{version}")
    return sys.modules[schema.__module__]


def request_module(api_key: int, version: int) -> ModuleType:
    """kio's module of a request version (its classes by name); DecodeError if kio has none."""
    return _module(codec.request_schema(api_key, version), "request", api_key, version)


def response_module(api_key: int, version: int) -> ModuleType:
    """kio's module of a response version (its classes by name); DecodeError if kio has none."""
    return _module(codec.response_schema(api_key, version), "response", api_key, version)


def module_of(entity: Any) -> ModuleType:
    """The module a kio entity (or entity class) belongs to: its sibling classes, same version."""
    cls = entity if isinstance(entity, type) else type(entity)
    return sys.modules[cls.__module__]


@cache
def field_names(cls: type) -> frozenset[str]:
    """The fields of a kio entity class at its version."""
    return frozenset(f.name for f in dataclasses.fields(cls))


def kio_class_with(cls: type, names: tuple[str, ...]) -> bool:
    """Whether *cls* is one of kio's entity classes and has every field of *names*: then
    its instances' values for them are kio's own (ints for its integer fields), which a
    per-partition fast path may read straight (``plan_of``, ``trim.marks_of``)."""
    return cls.__module__.startswith("kio.schema.") and field_names(cls).issuperset(names)


@cache
def _copy_plan(cls: type) -> tuple[tuple[str, ...], frozenset[str]] | None:
    """The fields ``replaced`` copies, or None when it must leave the class to
    ``dataclasses.replace`` (a ``__post_init__``, or a field not set by ``__init__``)."""
    fields = dataclasses.fields(cls)
    if hasattr(cls, "__post_init__") or not all(f.init for f in fields):
        return None
    names = tuple(f.name for f in fields)
    return names, frozenset(names)


def replaced(obj: T, **changes: Any) -> T:
    """``dataclasses.replace(obj, **changes)`` for a frozen dataclass (a kio entity, or one
    of the proxy's own), at about half its cost: the new instance's fields are set
    directly instead of through ``__init__``'s keyword arguments.  For the fetch path's
    per-fetch copies (a repeated fetch's upstream request and report); the same result
    as ``dataclasses.replace``, which it falls back to for a class with a
    ``__post_init__`` or a field outside ``__init__``.  An unknown field is a TypeError,
    as there."""
    cls = type(obj)
    plan = _copy_plan(cls)  # type: ignore[arg-type]
    if plan is None:
        return dataclasses.replace(obj, **changes)  # type: ignore[type-var]
    names, known = plan
    if not known.issuperset(changes):
        unknown = sorted(set(changes) - known)
        raise TypeError(f"{cls.__name__} has no field {', '.join(unknown)}")
    new: T = object.__new__(cls)
    put = object.__setattr__
    for name in names:
        put(new, name, changes[name] if name in changes else getattr(obj, name))
    return new


def make(cls: Any, **kwargs: Any) -> Any:
    """Instantiate a kio class with the keyword arguments that exist at its version."""
    names = field_names(cls)
    if names.issuperset(kwargs):
        return cls(**kwargs)
    return cls(**{k: v for k, v in kwargs.items() if k in names})


def convert(obj: Any, cls: Any) -> Any:
    """The same entity at another version (fields the target lacks are dropped)."""
    kind: type = type(obj)
    return make(cls, **{name: getattr(obj, name) for name in field_names(kind)})


_VERSIONS_TRIED = 32
"""Versions looked for by ``load_fetch_schemas`` (Kafka 4.x has Fetch up to v18)."""


def load_fetch_schemas() -> tuple[int, ...]:
    """Import kio's Fetch request and response modules of every version it has: the versions
    kio knows of Fetch, loaded.

    kio imports a message version's module the first time it is asked for (30-70 ms a
    version, once); the fetch path asks on a client's first Fetch of that version, on the
    event loop.  Called at start (``FetchPath``), before clients are served: about 0.2 s
    of CPU and 1.5 MiB of memory for Fetch v4-v18.
    """
    loaded = []
    for version in range(_VERSIONS_TRIED):
        request = codec.request_schema(FETCH, version)
        response = codec.response_schema(FETCH, version)
        if request is not None and response is not None:
            loaded.append(version)
    return tuple(loaded)
