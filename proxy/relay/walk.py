"""Byte-level, schema-driven rewriting of Kafka messages that keeps everything it does not touch.

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
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, fields
from functools import cache
from typing import Any, Protocol

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)

from ..protocol.codec import read_uvarint
from ..protocol.errors import DecodeError

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


# --- varints ------------------------------------------------------------------------------


def write_uvarint(value: int) -> bytes:
    out = bytearray()
    while True:
        b = value & 0x7F
        value >>= 7
        if value:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


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

# A step says how to cross one field:
#   ("fixed", size) | ("var", kafka_type) | ("parray", step) | ("entity", plan_getter, nullable)
#   | ("earray", plan_getter)
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


def _primitive_step(kafka_type: str) -> Step:
    if kafka_type in _FIXED_SIZES:
        return ("fixed", _FIXED_SIZES[kafka_type])
    if kafka_type in ("string", "bytes", "records"):
        return ("var", kafka_type)
    raise DecodeError(f"no layout for kafka_type {kafka_type!r}")


@cache
def plan_for(cls: type) -> Plan:
    flexible = bool(getattr(cls, "__flexible__", False))
    steps: list[tuple[str, Step]] = []
    tagged: dict[int, Step] = {}
    for f in fields(cls):
        tag = get_field_tag(f)
        kind = classify_field(f)
        step: Step
        if isinstance(kind, PrimitiveField):
            step = _primitive_step(f.metadata["kafka_type"])
        elif isinstance(kind, PrimitiveTupleField):
            step = ("parray", _primitive_step(f.metadata["kafka_type"]))
        elif isinstance(kind, EntityField):
            # tagged struct fields carry no null marker (presence is the tag itself)
            step = ("entity", kind.type_, tag is None and is_optional(f))
        elif isinstance(kind, EntityTupleField):
            step = ("earray", kind.type_)
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

    def _skip_var(self, kafka_type: str, flexible: bool, pos: int) -> int:
        buf = self.buf
        if flexible:
            n, pos = read_uvarint(buf, pos)
            size = max(n - 1, 0)
        elif kafka_type == "string":
            self._need(pos, 2)
            (size,) = _I16.unpack_from(buf, pos)
            pos += 2
            size = max(size, 0)
        else:
            self._need(pos, 4)
            (size,) = _I32.unpack_from(buf, pos)
            pos += 4
            size = max(size, 0)
        self._need(pos, size)
        return pos + size

    def _array_count(self, flexible: bool, pos: int) -> tuple[int, int]:
        if flexible:
            n, pos = read_uvarint(self.buf, pos)
            return n - 1, pos  # -1: null
        self._need(pos, 4)
        (n,) = _I32.unpack_from(self.buf, pos)
        return n, pos + 4

    def step(self, step: Step, flexible: bool, pos: int, edits: list[Edit]) -> int:
        kind = step[0]
        if kind == "fixed":
            # no bounds check here: an overrun fails the next read or the final length check
            return pos + int(step[1])
        if kind == "var":
            return self._skip_var(step[1], flexible, pos)
        if kind == "parray":
            n, pos = self._array_count(flexible, pos)
            if n > len(self.buf) - pos:  # every element takes a byte at least
                raise DecodeError(f"array of {n} entries cannot fit in the message")
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
        n, pos = self._array_count(flexible, pos)
        count_end = pos
        if n > len(self.buf) - pos:
            raise DecodeError(f"array of {n} entries cannot fit in the message")
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
                if step[0] == "fixed":
                    pos += step[1]
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
            if step is not None and step[0] in ("entity", "earray"):
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


class _SpanHook:
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
    hook = _SpanHook(match, field)
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
