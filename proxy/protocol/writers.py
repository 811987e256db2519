"""kio entities encoded by writers compiled once per class: kio's bytes, fewer calls.

kio's ``entity_writer`` writes every field through a chain of small functions
(a validating ``uvarint(...)`` per length, one ``struct.pack`` and one
``write`` per integer, a ``BytesIO`` per flexible entity for its tagged
fields).  A Fetch response the proxy builds itself is encoded on every fetch,
and for a 1,000-partition consumer that chain was the largest share of the
fetch path's CPU.  :func:`writer_for` compiles a class's layout once, from the
same dataclass fields and metadata kio reads, into a few closures: runs of
fixed-size fields are one ``struct.pack``, lengths come from a table, and an
entity whose tagged fields all hold their defaults writes the single
``0`` byte kio writes for them.

The output is kio's, byte for byte (``tests/unit/test_writers.py`` checks every
request and response class kio knows against ``kio.serial.entity_writer``),
and it is written the way kio writes it: pieces handed to ``out.write`` in
order, a ``bytes``/``records`` value handed over as the very object the entity
holds (so ``codec.encode_response_gathered`` still references a Fetch
response's records instead of copying them).  What is rare on the hot path is
delegated to kio's own field writers rather than rewritten: tagged field
values, arrays of primitives, and durations and timestamps.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Generator
from dataclasses import MISSING, Field, fields
from functools import cache
from operator import attrgetter
from typing import IO, Any, Protocol, cast

from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    classify_field,
    get_field_tag,
    is_optional,
)
from kio.serial._serialize import get_field_writer
from kio.serial.errors import OutOfBoundValue
from kio.serial.writers import write_tagged_field
from kio.static.constants import uuid_zero


class Pieces(Protocol):
    """Where a writer puts its output: ``write`` is called with each piece, in order."""

    def write(self, data: Any) -> int: ...


Writer = Callable[[Pieces, Any], None]

STRUCT_CODES = {
    "int8": "b",
    "int16": "h",
    "int32": "i",
    "int64": "q",
    "uint8": "B",
    "uint16": "H",
    "uint32": "I",
    "uint64": "Q",
    "float64": "d",
    "bool": "?",
    "error_code": "h",  # an IntEnum: packs as its value, as kio's write_error_code does
}
"""struct codes of the fixed-size kafka types kio writes with a plain struct.pack."""
_SMALL = tuple(bytes((n,)) for n in range(128))
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_NULL_I16 = _I16.pack(-1)
_NULL_I32 = _I32.pack(-1)
_ZERO_UUID = uuid_zero.bytes
_NULL_MARKER = struct.pack(">b", -1)
_PRESENT_MARKER = struct.pack(">b", 1)


def uvarint(value: int) -> bytes:
    """An unsigned varint, as kio's ``write_unsigned_varint`` writes it."""
    if 0 <= value < 128:
        return _SMALL[value]
    out = bytearray()
    chunk = value & 0x7F
    value >>= 7
    while value:
        out.append(0x80 | chunk)
        chunk = value & 0x7F
        value >>= 7
    out.append(chunk)
    return bytes(out)


def encode(obj: Any, out: Pieces) -> None:
    """Write the kio entity *obj* to *out* (as ``kio.serial.entity_writer(type(obj))`` would)."""
    cls: type = type(obj)
    writer_for(cls)(out, obj)


@cache
def writer_for(cls: type) -> Writer:
    """The compiled writer of a kio entity class (bounded: one per class kio defines)."""
    if cls.__name__ == "RequestHeader":
        # kio special-cases its client_id; the codec encodes headers itself anyway
        from kio.serial import entity_writer

        return cast(Writer, entity_writer(cls))
    return _compiled(cls, fields(cls), tagged_section=True)


def encode_in_ranges(
    obj: Any,
    out: Pieces,
    path: tuple[str, ...],
    every: int,
    *,
    remember: Written | None = None,
) -> Generator[None, None, None]:
    """``encode``, yielding after every *every* entries of the innermost entity array
    along *path* (``("responses", "partitions")``: a Fetch response's partitions).

    The same pieces, in the same order, as ``encode(obj, out)``: an entity is the
    concatenation of its fields, so it is written as the fields before the array
    (``split_writer``), the array's count and its entries (each by its own writer,
    or cut further along the rest of *path*), then the fields after it.
    *remember*: those entries are written from it when it holds them (``Written``).
    """
    # A module-level walk, not a nested recursive one: a closure that calls itself is
    # a reference cycle, and *out* (a response's pieces) would wait for the cyclic GC.
    yield from _walk_in_ranges(obj, path, out, every, [0], remember)


def _walk_in_ranges(
    entity: Any,
    rest: tuple[str, ...],
    out: Pieces,
    every: int,
    done: list[int],
    remember: Written | None,
) -> Generator[None, None, None]:
    """``encode_in_ranges``'s walk; ``done[0]`` counts the entries written so far."""
    cls: type = type(entity)
    items = getattr(entity, rest[0]) if rest else None
    if not rest or items is None:
        writer_for(cls)(out, entity)
        return
    before, write_count, write_item, after = split_writer(cls, rest[0])
    before(out, entity)
    write_count(out, len(items))
    if len(rest) > 1:
        for item in items:
            yield from _walk_in_ranges(item, rest[1:], out, every, done, remember)
    elif remember is None:
        for item in items:
            write_item(out, item)
            done[0] += 1
            if every and done[0] % every == 0:
                yield
    else:
        # An entry written before (most entries of a sessionless client's response) is
        # looked up inline: one test and two look-ups per entry instead of a call.
        write = out.write
        now, last = remember.now, remember.last
        for item in items:
            key = id(item)
            known = now.get(key)
            if known is None:
                known = last.get(key)
            if known is not None and known[0] is item:
                now[key] = known
                write(known[1])
            else:
                write_and_remember(write_item, out, item, remember)
            done[0] += 1
            if every and done[0] % every == 0:
                yield
                now, last = remember.now, remember.last  # a response may have turned it
    after(out, entity)


class Collected(list[Any]):
    """A ``Pieces`` that keeps the written buffers instead of copying them.

    The writers write bytes fields (a Fetch response's records) with one ``write`` of
    the value itself, so an encoded message is assembled by a single join (``codec``):
    no growing buffer, no ``getvalue`` copy, no header concatenation.
    """

    __slots__ = ()

    def write(self, data: Any) -> int:
        self.append(data)
        return len(data)


class Written:
    """The encodings of the small entries of the last two responses a connection gave, by
    entry: ``encode_in_ranges`` writes an entry found here from its bytes, and the others
    through ``write_and_remember``.  ``turn`` at each response lets go of the entries the
    one before last gave and the last did not give again, so what it holds is bounded by
    the entries of two responses, and nothing outlives its use by more than one.

    For the entries of a Fetch response's partitions, which the Fetch path gives again
    unchanged (a partition's entry in the upstream session's cache, held answers): kio's
    entities are frozen, and a 1,000-partition consumer's idle partitions were most of
    the cost of encoding each response.  An entry is kept with its bytes, so its id
    cannot be reused meanwhile.  Only small encodings made of bytes objects are kept
    (never a view or a buffer of records, which would pin the frame it points into).
    """

    __slots__ = ("last", "now")

    def __init__(self) -> None:
        self.last: dict[int, tuple[Any, bytes]] = {}
        self.now: dict[int, tuple[Any, bytes]] = {}

    def turn(self) -> None:
        """A new response: the last one's entries become the ones to look back to."""
        self.last, self.now = self.now, {}

    def __len__(self) -> int:
        return len(self.now) + len(self.last)


WRITTEN_BELOW = 128
"""Bytes: a larger encoding is not remembered (it carries records, and is rarely repeated)."""


def write_and_remember(write_item: Writer, out: Pieces, item: Any, written: Written) -> None:
    """``write_item(out, item)`` for an entry *written* does not hold, kept there when its
    encoding is small and made of bytes objects (``Written``)."""
    key = id(item)
    pieces = Collected()
    write_item(pieces, item)
    size = 0
    for piece in pieces:
        if type(piece) is not bytes:
            size = WRITTEN_BELOW  # a view or a mutable buffer: written as it is, not kept
            break
        size += len(piece)
    if size >= WRITTEN_BELOW:
        for piece in pieces:
            out.write(piece)
        return
    data = b"".join(pieces)
    written.now[key] = (item, data)
    out.write(data)


@cache
def split_writer(
    cls: type, name: str
) -> tuple[Writer, Callable[[Pieces, int], None], Writer, Writer]:
    """(fields before, array count, one entry, fields after) of the entity array field
    *name* of *cls*; together they write what ``writer_for(cls)`` writes (tagged
    fields are the last thing an entity writes, so they are "after")."""
    all_fields = fields(cls)
    at = next(i for i, f in enumerate(all_fields) if f.name == name)
    kind = classify_field(all_fields[at])
    if not isinstance(kind, EntityTupleField):
        raise TypeError(f"{cls.__name__}.{name} is not an array of entities")
    flexible = bool(cls.__flexible__)  # type: ignore[attr-defined]
    before = _compiled(cls, all_fields[:at], tagged_section=False)
    after = _compiled(cls, all_fields[at + 1 :], tagged_section=True)

    def write_count(out: Pieces, count: int) -> None:
        if flexible:
            out.write(uvarint(count + 1))
            return
        if count > 2**31 - 1:
            raise OutOfBoundValue(
                f"Sequence is too long for legacy array format ({count} > {2**31 - 1})"
            )
        out.write(_I32.pack(count))

    return before, write_count, writer_for(kind.type_), after


def _compiled(cls: type, of: tuple[Field[Any], ...], *, tagged_section: bool) -> Writer:
    """A writer of the fields *of* of *cls* (and of its tagged fields, at the end, when
    *tagged_section*)."""
    flexible = bool(cls.__flexible__)  # type: ignore[attr-defined]
    steps: list[Writer] = []
    run: list[tuple[str, str]] = []  # (field name, struct code) of consecutive fixed fields
    tagged: list[tuple[int, Field[Any], Any, Writer]] = []
    of = tuple(f for f in of if get_field_tag(f) is None)
    if tagged_section:  # (tagged fields may be declared anywhere: they are written last)
        of += tuple(f for f in fields(cls) if get_field_tag(f) is not None)
    for f in of:
        tag = get_field_tag(f)
        if tag is not None:
            writer = cast(
                Writer, get_field_writer(f, flexible=flexible, is_request_header=False, is_tag=True)
            )
            tagged.append((int(tag), f, get_tagged_field_default(f), writer))
            continue
        kind = classify_field(f)
        code = (
            STRUCT_CODES.get(f.metadata.get("kafka_type", ""))
            if isinstance(kind, PrimitiveField)
            else None
        )
        if code is not None:
            run.append((f.name, code))
            continue
        if run:
            steps.append(_packed(run))
            run = []
        steps.append(_field_step(f, kind, flexible))
    if run:
        steps.append(_packed(run))
    if flexible and tagged_section:
        steps.append(_tagged_step(sorted(tagged, key=lambda t: t[0])))
    elif tagged:
        raise ValueError(f"{cls.__name__}: tagged fields on a non-flexible entity")
    if not steps:
        return _nothing
    if len(steps) == 1:
        return steps[0]
    sequence = tuple(steps)

    def write_entity(out: Pieces, obj: Any) -> None:
        for step in sequence:
            step(out, obj)

    return write_entity


def _nothing(out: Pieces, obj: Any) -> None:
    pass


def _packed(run: list[tuple[str, str]]) -> Writer:
    layout = struct.Struct(">" + "".join(code for _, code in run))
    pack = layout.pack
    if len(run) == 1:
        get_one = attrgetter(run[0][0])

        def write_one(out: Pieces, obj: Any) -> None:
            out.write(pack(get_one(obj)))

        return write_one
    get_all = attrgetter(*(name for name, _ in run))

    def write_run(out: Pieces, obj: Any) -> None:
        out.write(pack(*get_all(obj)))

    return write_run


def _field_step(f: Field[Any], kind: Any, flexible: bool) -> Writer:
    get = attrgetter(f.name)
    if isinstance(kind, PrimitiveField):
        kafka_type = f.metadata["kafka_type"]
        nullable = is_optional(f)
        if kafka_type == "uuid":
            return _uuid(get)
        if kafka_type in ("string", "bytes", "records"):
            if flexible:
                return _compact(get, nullable)
            if kafka_type == "string":
                return _legacy_string(get, nullable)
            return _legacy_bytes(get, nullable)
    elif isinstance(kind, EntityTupleField):
        return _entity_array(get, writer_for(kind.type_), flexible)
    elif isinstance(kind, EntityField):
        return _entity(get, writer_for(kind.type_), is_optional(f))
    # arrays of primitives, durations, timestamps: rare on the hot path, kio writes them
    kio_writer = get_field_writer(f, flexible=flexible, is_request_header=False, is_tag=False)

    def write_with_kio(out: Pieces, obj: Any) -> None:
        kio_writer(cast(IO[bytes], out), get(obj))

    return write_with_kio


def _uuid(get: Callable[[Any], Any]) -> Writer:
    def write_uuid(out: Pieces, obj: Any) -> None:
        value = get(obj)
        out.write(_ZERO_UUID if value is None else value.bytes)

    return write_uuid


def _compact(get: Callable[[Any], Any], nullable: bool) -> Writer:
    def write_compact(out: Pieces, obj: Any) -> None:
        value = get(obj)
        if value is None:
            if not nullable:
                raise TypeError("Unexpectedly received None value")
            out.write(b"\x00")
            return
        if isinstance(value, str):
            value = value.encode()
        out.write(uvarint(len(value) + 1))
        out.write(value)

    return write_compact


def _legacy_string(get: Callable[[Any], Any], nullable: bool) -> Writer:
    def write_legacy_string(out: Pieces, obj: Any) -> None:
        value = get(obj)
        if value is None:
            if not nullable:
                raise TypeError("Unexpectedly received None value")
            out.write(_NULL_I16)
            return
        raw = value.encode()
        if len(raw) > 32767:
            raise OutOfBoundValue(
                f"String is too long for legacy string format ({len(raw)} > 32767)"
            )
        out.write(_I16.pack(len(raw)))
        out.write(raw)

    return write_legacy_string


def _legacy_bytes(get: Callable[[Any], Any], nullable: bool) -> Writer:
    def write_legacy_bytes(out: Pieces, obj: Any) -> None:
        value = get(obj)
        if value is None:
            if not nullable:
                raise TypeError("Unexpectedly received None value")
            out.write(_NULL_I32)
            return
        if len(value) > 2**31 - 1:
            raise OutOfBoundValue(
                f"Bytes is too long for legacy string format ({len(value)} > {2**31 - 1})"
            )
        out.write(_I32.pack(len(value)))
        out.write(value)

    return write_legacy_bytes


def _entity(get: Callable[[Any], Any], write: Writer, nullable: bool) -> Writer:
    if not nullable:

        def write_entity(out: Pieces, obj: Any) -> None:
            write(out, get(obj))

        return write_entity

    def write_nullable_entity(out: Pieces, obj: Any) -> None:
        value = get(obj)
        if value is None:
            out.write(_NULL_MARKER)
            return
        out.write(_PRESENT_MARKER)
        write(out, value)

    return write_nullable_entity


def _entity_array(get: Callable[[Any], Any], write: Writer, flexible: bool) -> Writer:
    if flexible:

        def write_compact_array(out: Pieces, obj: Any) -> None:
            items = get(obj)
            if items is None:
                out.write(b"\x00")
                return
            out.write(uvarint(len(items) + 1))
            for item in items:
                write(out, item)

        return write_compact_array

    def write_legacy_array(out: Pieces, obj: Any) -> None:
        items = get(obj)
        if items is None:
            out.write(_NULL_I32)
            return
        if len(items) > 2**31 - 1:
            raise OutOfBoundValue(
                f"Sequence is too long for legacy array format ({len(items)} > {2**31 - 1})"
            )
        out.write(_I32.pack(len(items)))
        for item in items:
            write(out, item)

    return write_legacy_array


def _tagged_step(tagged: list[tuple[int, Field[Any], Any, Writer]]) -> Writer:
    """The tagged-field section, with kio's rule for which fields are written."""
    if not tagged:

        def write_no_tags(out: Pieces, obj: Any) -> None:
            out.write(b"\x00")

        return write_no_tags

    # kio skips a field at its default: the explicit one, else the implicit one
    entries = tuple(
        (tag, f.name, f.default, f.default == MISSING, implicit_default, writer)
        for tag, f, implicit_default, writer in tagged
    )

    def write_tags(out: Pieces, obj: Any) -> None:
        present = []
        for tag, name, default, no_default, implicit_default, writer in entries:
            value = getattr(obj, name)
            if value == default or (no_default and value == implicit_default):
                continue
            present.append((tag, writer, value))
        if not present:
            out.write(b"\x00")
            return
        with io.BytesIO() as buffer:
            for tag, writer, value in present:
                write_tagged_field(buffer=buffer, tag=tag, writer=writer, value=value)  # type: ignore[arg-type]
            out.write(uvarint(len(present)))
            out.write(buffer.getvalue())

    return write_tags
