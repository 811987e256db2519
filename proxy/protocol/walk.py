"""Byte-level, schema-driven walking of Kafka messages: checking, and rewriting what it touches.

kio decodes a message into frozen dataclasses, but it refuses unknown tagged
fields and re-encoding loses anything it did not model.  The proxy only ever
changes a few small entities (a broker's host and port, an ApiVersions range),
so instead of decode -> modify -> encode it *walks* the encoded bytes using the
layout kio's generated classes describe (field order, types, flexible
versions, tags) and splices replacements into the original frame:

- every byte the proxy did not change is copied verbatim, including unknown
  tagged fields at any depth and record batches (never decompressed, never
  even copied when nothing changed);
- when an entity inside a tagged field changes size, that tagged field's size
  is re-encoded; when an array element is dropped, the array count is.

``rewrite(schema, frame, offset, hook)`` calls ``hook`` for every entity whose
class the hook ``wants``; the hook sees the original bytes and the byte span of
each non-tagged field and returns replacement bytes (``b""`` drops an array
element) or None to keep the entity.  The result is the new frame, or the very
same ``bytes`` object when nothing changed.

``check(schema, frame, offset)`` is the same walk with no hook.  The codec ran
it before handing network bytes to kio; the codec's compiled readers
(:mod:`.readers`) now refuse the same inputs while they decode, and
``tests/unit/test_readers.py`` holds them to this walk's verdicts.  kio's native array
readers reserve the count a message declares before reading its entries (a
44-byte request can announce 2**32 - 2 of them, and the failed allocation
aborts the process), and kio decodes a null (-1) count as None even where the
schema has no null.  The walk refuses both, as Kafka's own generated readers
do: every array needs a byte per entry at least, so a count larger than the
bytes left cannot be honest; a null array, string or bytes value is allowed
only where kio's type for the field is ``... | None``.  It skips records and
bytes without copying them, so it costs one pass over the message's structure.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import Field, dataclass, fields
from functools import cache
from types import NoneType, UnionType
from typing import Any, Protocol, Union, get_args, get_origin

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
)

from .errors import DecodeError
from .varint import read_uvarint, write_uvarint

_FIXED_SIZES = {
    "int8": 1,
    "uint8": 1,
    "bool": 1,
    "int16": 2,
    "uint16": 2,
    "error_code": 2,
    "int32": 4,
    "uint32": 4,
    "timedelta_i32": 4,
    "int64": 8,
    "uint64": 8,
    "float64": 8,
    "timedelta_i64": 8,
    "datetime_i64": 8,
    "uuid": 16,
}
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

Span = tuple[int, int]


class Hook(Protocol):
    def wants(self, cls: type) -> bool: ...

    def __call__(
        self, cls: type, buf: bytes, spans: dict[str, Span], start: int, end: int
    ) -> bytes | None:
        """Replacement bytes for the entity encoded at buf[start:end], or None to keep it."""


def encode_string(value: str | None, flexible: bool) -> bytes:
    """A (nullable) Kafka string: compact in flexible versions, int16-prefixed otherwise."""
    if value is None:
        return b"\x00" if flexible else _I16.pack(-1)
    raw = value.encode()
    return (write_uvarint(len(raw) + 1) if flexible else _I16.pack(len(raw))) + raw


def decode_string(buf: bytes, span: Span, flexible: bool) -> str | None:
    start, end = span
    if flexible:
        n, pos = read_uvarint(buf, start)
        return None if n == 0 else buf[pos:end].decode("utf-8", errors="replace")
    (n,) = _I16.unpack_from(buf, start)
    return None if n < 0 else buf[start + 2 : end].decode("utf-8", errors="replace")


# --- compiled layouts ---------------------------------------------------------------------

# A step says how to cross one field (*name* is "Entity.field", for error messages):
#   ("fixed", size) | ("var", kafka_type, nullable, name) | ("parray", step, nullable, name)
#   | ("entity", cls, null_marker) | ("earray", cls, nullable, name)
Step = tuple[Any, ...]


@dataclass(slots=True)
class Plan:
    cls: type
    flexible: bool
    steps: list[tuple[str, Step]]
    tagged: dict[int, Step]
    fast_steps: list[Step]
    """``steps`` with runs of fixed-size fields merged: for entities nobody inspects."""


def _merge_fixed(steps: list[tuple[str, Step]]) -> list[Step]:
    out: list[Step] = []
    for _, step in steps:
        if step[0] == "fixed" and out and out[-1][0] == "fixed":
            out[-1] = ("fixed", out[-1][1] + step[1])
        else:
            out.append(step)
    return out


def _is_optional(tp: Any) -> bool:
    return get_origin(tp) in (UnionType, Union) and NoneType in get_args(tp)


def field_nullable(f: Field[Any]) -> bool:
    """Is the field itself nullable (``X | None``, ``tuple[X, ...] | None``)?

    Not kio's ``is_optional``, which also says yes for an array of nullable
    entries (``tuple[UUID | None, ...]``).
    """
    return _is_optional(f.type)


def entries_nullable(f: Field[Any]) -> bool:
    """Are the entries of the array field *f* nullable (``tuple[X | None, ...]``)?"""
    array = f.type
    if _is_optional(array):
        array = next(a for a in get_args(array) if a is not NoneType)
    return _is_optional(get_args(array)[0])


def _primitive_step(kafka_type: str, nullable: bool, name: str) -> Step:
    if kafka_type in _FIXED_SIZES:
        return ("fixed", _FIXED_SIZES[kafka_type])
    if kafka_type in ("string", "bytes", "records"):
        return ("var", kafka_type, nullable, name)
    raise DecodeError(f"no layout for kafka_type {kafka_type!r}")


@cache
def plan_for(cls: type) -> Plan:
    flexible = bool(getattr(cls, "__flexible__", False))
    steps: list[tuple[str, Step]] = []
    tagged: dict[int, Step] = {}
    for f in fields(cls):
        tag = get_field_tag(f)
        kind = classify_field(f)
        nullable = field_nullable(f)
        name = f"{cls.__name__}.{f.name}"
        step: Step
        if isinstance(kind, PrimitiveField):
            step = _primitive_step(f.metadata["kafka_type"], nullable, name)
        elif isinstance(kind, PrimitiveTupleField):
            entry = _primitive_step(f.metadata["kafka_type"], entries_nullable(f), name)
            step = ("parray", entry, nullable, name)
        elif isinstance(kind, EntityField):
            # tagged struct fields carry no null marker (presence is the tag itself)
            step = ("entity", kind.type_, tag is None and nullable)
        elif isinstance(kind, EntityTupleField):
            step = ("earray", kind.type_, nullable, name)
        else:  # pragma: no cover - kio has exactly these four classes
            raise DecodeError(f"unknown field class {kind!r}")
        if tag is None:
            steps.append((f.name, step))
        else:
            tagged[int(tag)] = step
    return Plan(cls, flexible, steps, tagged, _merge_fixed(steps))


# --- the walk -----------------------------------------------------------------------------

Edit = tuple[int, int, bytes]


class _Walker:
    __slots__ = ("buf", "hook", "wanted")

    def __init__(self, buf: bytes, hook: Hook) -> None:
        self.buf = buf
        self.hook = hook
        self.wanted: dict[type, bool] = {}

    def _need(self, pos: int, size: int) -> None:
        if size < 0 or pos + size > len(self.buf):
            raise DecodeError("message truncated")

    def _skip_var(self, step: Step, flexible: bool, pos: int) -> int:
        buf = self.buf
        if flexible:
            n, pos = read_uvarint(buf, pos)
            size = n - 1  # -1: null
        elif step[1] == "string":
            self._need(pos, 2)
            (size,) = _I16.unpack_from(buf, pos)
            pos += 2
        else:
            self._need(pos, 4)
            (size,) = _I32.unpack_from(buf, pos)
            pos += 4
        if size < 0:  # null (Kafka reads any negative length as null)
            if not step[2]:
                raise DecodeError(f"{step[3]}: null {step[1]} where the schema allows none")
            return pos
        self._need(pos, size)
        return pos + size

    def _array_count(self, step: Step, flexible: bool, pos: int) -> tuple[int, int]:
        """(count, position after it); a null count (-1) only where *step* is nullable."""
        if flexible:
            n, pos = read_uvarint(self.buf, pos)
            n -= 1  # -1: null
        else:
            self._need(pos, 4)
            (n,) = _I32.unpack_from(self.buf, pos)
            pos += 4
        if n < 0 and not step[2]:
            raise DecodeError(f"{step[3]}: null array where the schema allows none")
        # Every entry takes a byte at least: a larger count cannot be honest, and kio
        # would reserve memory for all of it before finding out.
        if n > len(self.buf) - pos:
            raise DecodeError(f"{step[3]}: array of {n} entries cannot fit in the message")
        return n, pos

    def step(self, step: Step, flexible: bool, pos: int, edits: list[Edit]) -> int:
        kind = step[0]
        if kind == "fixed":
            # no bounds check here: an overrun fails the next read or the final length check
            return pos + int(step[1])
        if kind == "var":
            return self._skip_var(step, flexible, pos)
        if kind == "parray":
            n, pos = self._array_count(step, flexible, pos)
            for _ in range(max(n, 0)):
                pos = self.step(step[1], flexible, pos, edits)
            return pos
        if kind == "entity":
            if step[2]:  # nullable struct: int8 marker
                self._need(pos, 1)
                marker = self.buf[pos]
                pos += 1
                if marker == 0xFF:
                    return pos
            return self.entity(plan_for(step[1]), pos, edits)
        # earray
        count_start = pos
        n, pos = self._array_count(step, flexible, pos)
        count_end = pos
        plan = plan_for(step[1])
        local: list[Edit] = []
        dropped = 0
        for _ in range(max(n, 0)):
            start = pos
            pos = self.entity(plan, pos, local)
            if local and local[-1] == (start, pos, b""):
                dropped += 1
        if dropped:
            new_n = n - dropped
            count = write_uvarint(new_n + 1) if flexible else _I32.pack(new_n)
            edits.append((count_start, count_end, count))
        edits.extend(local)
        return pos

    def entity(self, plan: Plan, pos: int, edits: list[Edit]) -> int:
        wanted = self.wanted.get(plan.cls)
        if wanted is None:
            wanted = self.wanted[plan.cls] = self.hook.wants(plan.cls)
        if not wanted:
            for step in plan.fast_steps:
                kind = step[0]
                if kind == "fixed":
                    pos += step[1]
                elif kind == "var":  # records: the bulk of a Fetch response
                    pos = self._skip_var(step, plan.flexible, pos)
                else:
                    pos = self.step(step, plan.flexible, pos, edits)
            if plan.flexible:
                pos = self.tagged_fields(plan, pos, edits)
            return pos
        start = pos
        spans: dict[str, Span] = {}
        inner: list[Edit] = []
        for name, step in plan.steps:
            field_start = pos
            pos = self.step(step, plan.flexible, pos, inner)
            spans[name] = (field_start, pos)
        if plan.flexible:
            pos = self.tagged_fields(plan, pos, inner)
        if pos > len(self.buf):
            raise DecodeError("message truncated")
        replacement = self.hook(plan.cls, self.buf, spans, start, pos)
        if replacement is not None:
            edits.append((start, pos, replacement))
        elif inner:
            edits.extend(inner)
        return pos

    def tagged_fields(self, plan: Plan, pos: int, edits: list[Edit]) -> int:
        if pos < len(self.buf) and self.buf[pos] == 0:  # no tagged fields: the common case
            return pos + 1
        n, pos = read_uvarint(self.buf, pos)
        for _ in range(n):
            field_start = pos
            tag, pos = read_uvarint(self.buf, pos)
            size, pos = read_uvarint(self.buf, pos)
            self._need(pos, size)
            end = pos + size
            step = plan.tagged.get(tag)
            if step is not None:  # a known tag: kio decodes it, so it is checked too
                inner: list[Edit] = []
                if self.step(step, True, pos, inner) != end:
                    raise DecodeError(
                        f"tagged field {tag} of {plan.cls.__name__} has the wrong size"
                    )
                if inner:
                    data = apply_edits(self.buf, inner, pos, end)
                    edits.append(
                        (field_start, end, write_uvarint(tag) + write_uvarint(len(data)) + data)
                    )
            pos = end
        return pos


def apply_edits(buf: bytes, edits: list[Edit], start: int = 0, end: int | None = None) -> bytes:
    end = len(buf) if end is None else end
    out = bytearray()
    pos = start
    for e_start, e_end, data in edits:
        out += buf[pos:e_start]
        out += data
        pos = e_end
    out += buf[pos:end]
    return bytes(out)


def rewrite(schema: type, frame: bytes, offset: int, hook: Hook) -> bytes:
    """Walk the ``schema`` body at ``frame[offset:]``; return the frame with the hook's edits.

    Raises DecodeError if the body is malformed or does not end exactly at the
    end of the frame.
    """
    walker = _Walker(frame, hook)
    edits: list[Edit] = []
    try:
        end = walker.entity(plan_for(schema), offset, edits)
    except (IndexError, struct.error) as exc:
        raise DecodeError(f"{schema.__name__}: {exc}") from exc
    if end != len(frame):
        raise DecodeError(f"{schema.__name__}: {len(frame) - end} trailing bytes after body")
    if not edits:
        return frame
    return apply_edits(frame, edits)


class _Nothing:
    """The hook of ``check``: wants no entity, so every entity takes the fast path."""

    __slots__ = ()

    def wants(self, cls: type) -> bool:
        return False

    def __call__(
        self, cls: type, buf: bytes, spans: dict[str, Span], start: int, end: int
    ) -> bytes | None:  # pragma: no cover - never called: wants() is always False
        return None


_NOTHING = _Nothing()


def check(schema: type, frame: bytes, offset: int, hook: Hook | None = None) -> int:
    """Walk the ``schema`` body at ``frame[offset:]`` and return where it ends.

    Raises DecodeError where the body breaks what its layout allows: an array
    count larger than the bytes left, a null array, string or bytes value where
    the field is not nullable, a length past the end of the frame, a known
    tagged field of the wrong size.  Bytes after the body are allowed (the
    codec ignores them, as Kafka does).  Nothing is copied: records and bytes
    fields are skipped by their length.  A *hook* (e.g. a :class:`SpanHook`) sees the
    entities it wants on the way; what it returns is ignored.
    """
    try:
        end = _Walker(frame, hook or _NOTHING).entity(plan_for(schema), offset, [])
    except (IndexError, struct.error) as exc:
        raise DecodeError(f"{schema.__name__}: {exc}") from exc
    if end > len(frame):
        raise DecodeError(f"{schema.__name__}: message truncated")
    return end


class SpanHook:
    """Collects where *field* is encoded in each entity *match* accepts, in message order."""

    __slots__ = ("field", "match", "spans")

    def __init__(self, match: Callable[[type], bool], field: str) -> None:
        self.match = match
        self.field = field
        self.spans: list[Span] = []

    def wants(self, cls: type) -> bool:
        return self.match(cls)

    def __call__(
        self, cls: type, buf: bytes, spans: dict[str, Span], start: int, end: int
    ) -> bytes | None:
        self.spans.append(spans[self.field])
        return None


def field_spans(
    schema: type, frame: bytes, offset: int, match: Callable[[type], bool], field: str
) -> list[Span]:
    """Where *field* is encoded in each entity *match* accepts, in message order.

    The span covers the field's length prefix too.  Raises DecodeError like
    ``rewrite`` (malformed body, trailing bytes).
    """
    hook = SpanHook(match, field)
    walker = _Walker(frame, hook)
    try:
        end = walker.entity(plan_for(schema), offset, [])
    except (IndexError, struct.error) as exc:
        raise DecodeError(f"{schema.__name__}: {exc}") from exc
    if end != len(frame):
        raise DecodeError(f"{schema.__name__}: {len(frame) - end} trailing bytes after body")
    return hook.spans


def field_reader(fmt: struct.Struct) -> Callable[[bytes, Span], int]:
    def read(buf: bytes, span: Span) -> int:
        return int(fmt.unpack_from(buf, span[0])[0])

    return read


read_i16 = field_reader(_I16)
read_i32 = field_reader(_I32)
