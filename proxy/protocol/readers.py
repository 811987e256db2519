"""kio entities decoded by readers compiled once per class: one validating pass, records as views.

Decoding used to take two passes: ``walk.check`` refused what kio must not see
(array counts that cannot fit in the message, nulls the schema does not allow),
then kio's native ``entity_reader`` decoded the body, copying every bytes and
records field out of the frame; a Fetch response's records were then replaced
by views of the frame (a third pass over its partitions).  :func:`reader_for`
compiles, from the same dataclass fields and metadata kio and ``walk`` read, a
reader that does all of it at once:

- it refuses everything ``walk.check`` refuses (a count larger than the bytes
  left, a null array, string, bytes or struct where the field is not nullable,
  a length past the end of the frame, a known tagged field of the wrong size)
  and everything kio refuses (an unknown tagged field, a negative length or
  count other than -1, a boolean that is not 0 or 1, an unknown error code,
  invalid UTF-8), always as :class:`DecodeError`;
- it returns the entity kio returns (``tests/unit/test_readers.py`` checks
  every request and response class kio knows against ``kio.serial.entity_reader``),
  except that the bytes fields named in *views* (a Fetch response's
  ``PartitionData.records``) are ``memoryview`` slices of the frame, not copies
  (an empty one stays ``b""``, as before).

Each class's reader is Python source generated at first use (as ``dataclasses``
generates ``__init__``): runs of fixed-size fields are one ``struct.unpack_from``,
the entity is built as kio's native reader builds it, by setting its slots
(no ``__init__`` call per entity).  Rare types (uuids, durations,
timestamps) are read by kio's own native field readers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator
from dataclasses import MISSING, Field, fields
from functools import cache
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial._implicit_defaults import get_tagged_field_default
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
)
from kio.serial._parse import get_field_reader, get_reader
from kio.serial.errors import SerialError

from .errors import DecodeError
from .varint import read_uvarint
from .walk import entries_nullable, field_nullable
from .writers import STRUCT_CODES

Reader = Callable[[Any, int], tuple[Any, int]]
"""``(buffer, offset) -> (value, offset after it)``."""

RangedReader = Callable[[Any, int, Callable[[], bool]], Generator[None, None, tuple[Any, int]]]
"""``(buffer, offset, tick) -> generator of (value, offset after it)``: yields when ``tick()``."""

NO_VIEWS: frozenset[str] = frozenset()
FETCH_RECORDS: frozenset[str] = frozenset({"PartitionData.records"})
"""The *views* that leave a Fetch response's records in the frame."""

# struct codes of the fixed-size kafka types read with a plain unpack: the writers' codes,
# but a bool is read as a byte so that anything other than 0 or 1 can be refused (as kio does)
_PACKED = {**STRUCT_CODES, "bool": "B"}
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_ERROR_CODES: dict[int, ErrorCode] = {int(c): c for c in ErrorCode}
_BOOLS = {0: False, 1: True}

READ_FAILURES = (
    struct.error,
    IndexError,
    KeyError,
    ValueError,  # UnicodeDecodeError too
    OverflowError,
    SerialError,
)
"""What a truncated or malformed message makes the generated code raise (then a DecodeError;
a caller of ``reader_for``'s compiled readers catches them itself)."""


def read(
    cls: type, buf: bytes | bytearray, offset: int, views: frozenset[str] = NO_VIEWS
) -> tuple[Any, int]:
    """The *cls* entity encoded at ``buf[offset:]`` and where it ends.

    Bytes after the entity are not looked at.  The fields named in *views*
    (``"Entity.field"``) are memoryviews of *buf*, every other bytes field a copy.
    """
    data: Any = _readable(buf, views)
    try:
        return reader_for(cls, views)(data, offset)
    except DecodeError:
        raise
    except READ_FAILURES as exc:
        if isinstance(exc, (struct.error, IndexError)):  # a read past the end of the frame
            raise DecodeError(f"{cls.__name__}: message truncated ({exc})") from exc
        raise DecodeError(f"{cls.__name__}: {type(exc).__name__}: {exc}") from exc


def _readable(buf: bytes | bytearray, views: frozenset[str]) -> Any:
    """*buf* as the readers read it: a memoryview when fields are views of it, and always
    a read-only one over a ``bytearray`` (a frame read in place), as kio's readers want."""
    if type(buf) is bytearray:
        return memoryview(buf).toreadonly()
    return memoryview(buf) if views else buf


# --- value readers: one field, or one array entry ------------------------------------------


def _null(name: str, what: str) -> DecodeError:
    return DecodeError(f"{name}: null {what} where the schema allows none")


def _need(buf: Any, end: int) -> None:
    if end > len(buf):
        raise DecodeError("message truncated")


def _var_reader(kafka_type: str, flexible: bool, nullable: bool, view: bool, name: str) -> Reader:
    """A string, bytes or records value: length-prefixed, null where *nullable*."""
    legacy = _I16 if kafka_type == "string" else _I32
    if kafka_type == "string":

        def convert(buf: Any, start: int, end: int) -> Any:
            return str(buf[start:end], "utf-8")

    elif view:

        def convert(buf: Any, start: int, end: int) -> Any:
            return buf[start:end] if end > start else b""

    else:

        def convert(buf: Any, start: int, end: int) -> Any:
            return bytes(buf[start:end])

    def read_var(buf: Any, pos: int) -> tuple[Any, int]:
        if flexible:
            n, pos = read_uvarint(buf, pos)
            n -= 1
        else:
            (n,) = legacy.unpack_from(buf, pos)
            pos += legacy.size
        if n < 0:  # null: -1 only (kio refuses any other negative length)
            if n != -1:
                raise DecodeError(f"{name}: negative length {n}")
            if not nullable:
                raise _null(name, kafka_type)
            return None, pos
        end = pos + n
        _need(buf, end)
        return convert(buf, pos, end), end

    return read_var


def _fixed_reader(kafka_type: str) -> Reader:
    layout = struct.Struct(">" + _PACKED[kafka_type])
    unpack = layout.unpack_from
    size = layout.size
    table: dict[int, Any] | None = (
        _ERROR_CODES if kafka_type == "error_code" else _BOOLS if kafka_type == "bool" else None
    )
    if table is None:

        def read_fixed(buf: Any, pos: int) -> tuple[Any, int]:
            return unpack(buf, pos)[0], pos + size

        return read_fixed

    def read_mapped(buf: Any, pos: int) -> tuple[Any, int]:
        return table[unpack(buf, pos)[0]], pos + size

    return read_mapped


def _kio_reader(read_sized: Any) -> Reader:
    """kio's native reader of a rare type (uuid, duration, timestamp), as a :data:`Reader`."""

    def read_with_kio(buf: Any, pos: int) -> tuple[Any, int]:
        value, size = read_sized(buf, pos)
        return value, pos + size

    return read_with_kio


def _primitive_reader(
    kafka_type: str, flexible: bool, nullable: bool, view: bool, name: str, kio: Any
) -> Reader:
    if kafka_type in ("string", "bytes", "records"):
        return _var_reader(kafka_type, flexible, nullable, view, name)
    if kafka_type in _PACKED:
        return _fixed_reader(kafka_type)
    return _kio_reader(kio())


def _count(buf: Any, pos: int, flexible: bool, nullable: bool, name: str) -> tuple[int, int]:
    """An array count (-1: null, only where *nullable*) that fits in the bytes left."""
    if flexible:
        n, pos = read_uvarint(buf, pos)
        n -= 1
    else:
        (n,) = _I32.unpack_from(buf, pos)
        pos += 4
    if n < 0:  # null: -1 only (kio refuses any other negative count)
        if n != -1:
            raise DecodeError(f"{name}: negative array count {n}")
        if not nullable:
            raise _null(name, "array")
        return -1, pos
    # every entry takes a byte at least: a larger count cannot be honest (walk.py)
    if n > len(buf) - pos:
        raise DecodeError(f"{name}: array of {n} entries cannot fit in the message")
    return n, pos


def _array_reader(entry: Reader, flexible: bool, nullable: bool, name: str) -> Reader:
    def read_array(buf: Any, pos: int) -> tuple[Any, int]:
        n, pos = _count(buf, pos, flexible, nullable, name)
        if n < 0:
            return None, pos
        items: list[Any] = []
        append = items.append
        for _ in range(n):
            item, pos = entry(buf, pos)
            append(item)
        return tuple(items), pos

    return read_array


def _nullable_entity_reader(entity: Reader) -> Reader:
    def read_nullable_entity(buf: Any, pos: int) -> tuple[Any, int]:
        if buf[pos] == 0xFF:  # int8 -1: null
            return None, pos + 1
        return entity(buf, pos + 1)

    return read_nullable_entity


def _field_reader(
    cls: type, f: Field[Any], flexible: bool, tagged: bool, views: frozenset[str]
) -> Reader:
    kind = classify_field(f)
    name = f"{cls.__name__}.{f.name}"
    nullable = field_nullable(f)
    if isinstance(kind, PrimitiveField):
        return _primitive_reader(
            f.metadata["kafka_type"],
            flexible,
            nullable,
            name in views,
            name,
            lambda: get_field_reader(cls, f, False, tagged),
        )
    if isinstance(kind, PrimitiveTupleField):
        kafka_type = f.metadata["kafka_type"]
        entry_nullable = entries_nullable(f)
        entry = _primitive_reader(
            kafka_type,
            flexible,
            entry_nullable,
            False,
            name,
            lambda: get_reader(kafka_type, flexible, entry_nullable),
        )
        return _array_reader(entry, flexible, nullable, name)
    if isinstance(kind, EntityTupleField):
        return _array_reader(reader_for(kind.type_, views), flexible, nullable, name)
    if isinstance(kind, EntityField):
        entity = reader_for(kind.type_, views)
        # tagged struct fields carry no null marker (presence is the tag itself)
        return _nullable_entity_reader(entity) if nullable and not tagged else entity
    raise TypeError(f"{name}: unknown field class {kind!r}")  # pragma: no cover


def _read_tags(
    buf: Any, pos: int, known: dict[int, Reader], name: str
) -> tuple[dict[int, Any], int]:
    """The tagged-field section: {tag: value}; an unknown tag is refused, as kio refuses it."""
    n, pos = read_uvarint(buf, pos)
    values: dict[int, Any] = {}
    for _ in range(n):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        end = pos + size
        _need(buf, end)
        read_value = known.get(tag)
        if read_value is None:
            raise DecodeError(f"{name}: unknown tagged field {tag}")
        value, after = read_value(buf, pos)
        if after != end:
            raise DecodeError(f"tagged field {tag} of {name} has the wrong size")
        values[tag] = value
        pos = end
    return values, pos


# --- entities ------------------------------------------------------------------------------


def _emit_length(lines: list[str], pad: str, flexible: bool, legacy: str) -> None:
    """Code that reads a length or count into ``n`` (-1: null) and moves ``pos`` past it."""
    if flexible:
        lines += [
            f"{pad}n = buf[pos]",
            f"{pad}if n < 128:",
            f"{pad}    pos += 1",
            f"{pad}else:",
            f"{pad}    n, pos = read_uvarint(buf, pos)",
            f"{pad}n -= 1",
        ]
    else:
        size = 2 if legacy == "I16" else 4
        lines += [f"{pad}n, = {legacy}(buf, pos)", f"{pad}pos += {size}"]


def _emit_null(lines: list[str], pad: str, i: int, nullable: bool, what: str) -> None:
    """Code for a negative ``n``: field *i* is None where *nullable*, else DecodeError."""
    lines += [
        f"{pad}if n != -1:",
        f"{pad}    raise negative(N{i}, n)",
        f"{pad}f{i} = None" if nullable else f"{pad}raise null(N{i}, {what!r})",
    ]


def _negative(name: str, n: int) -> DecodeError:
    return DecodeError(f"{name}: negative length {n} (only -1, null, is allowed)")


def _truncated(name: str) -> DecodeError:
    return DecodeError(f"{name}: message truncated")


def _too_many(name: str, n: int) -> DecodeError:
    return DecodeError(f"{name}: array of {n} entries cannot fit in the message")


def read_in_ranges(
    cls: type,
    buf: bytes | bytearray,
    offset: int,
    views: frozenset[str] = NO_VIEWS,
    *,
    path: tuple[str, ...] = (),
    every: int = 0,
) -> Generator[None, None, tuple[Any, int]]:
    """``read``, yielding after every *every* entries of the innermost entity array along
    *path* (``("topics", "partitions")``: a Fetch request's partitions); the same entity,
    the same refusals."""
    data: Any = _readable(buf, views)
    done = 0

    def tick() -> bool:
        nonlocal done
        done += 1
        return bool(every) and done % every == 0

    try:
        result: tuple[Any, int] = yield from ranged_reader_for(cls, views, path)(data, offset, tick)
    except DecodeError:
        raise
    except READ_FAILURES as exc:
        if isinstance(exc, (struct.error, IndexError)):
            raise DecodeError(f"{cls.__name__}: message truncated ({exc})") from exc
        raise DecodeError(f"{cls.__name__}: {type(exc).__name__}: {exc}") from exc
    return result


@cache
def ranged_reader_for(cls: type, views: frozenset[str], path: tuple[str, ...]) -> RangedReader:
    """``reader_for(cls, views)`` as a generator ``(buf, pos, tick)``: the entries of the
    entity array *path* names are read by the ranged reader of the rest of *path*, and at
    its end one at a time, yielding when ``tick()`` says so (bounded: one per path)."""
    if not path:
        read = reader_for(cls, views)

        def read_whole(
            buf: Any, pos: int, tick: Callable[[], bool]
        ) -> Generator[None, None, tuple[Any, int]]:
            result = read(buf, pos)
            yield from ()
            return result

        return read_whole
    ranged: RangedReader = _compiled_reader(cls, views, path)
    return ranged


@cache
def reader_for(cls: type, views: frozenset[str] = NO_VIEWS) -> Reader:
    """The compiled reader of a kio entity class (bounded: one per class kio defines and *views*).

    It raises :class:`DecodeError` for what it refuses and may raise the errors in
    ``READ_FAILURES`` on a truncated message; :func:`read` turns those into DecodeError too.
    The entity is built as kio's native reader builds it, without ``__init__``: its
    slots are set directly (kio's classes are frozen, slotted, with no ``__post_init__``).
    """
    reader: Reader = _compiled_reader(cls, views, ())
    return reader


def _compiled_reader(cls: type, views: frozenset[str], path: tuple[str, ...]) -> Any:
    """The reader's source, compiled; with a *path*, the generator ``ranged_reader_for``
    describes."""
    flexible = bool(getattr(cls, "__flexible__", False))
    namespace: dict[str, Any] = {
        "cls": cls,
        "new": object.__new__,
        "read_tags": _read_tags,
        "read_uvarint": read_uvarint,
        "null": _null,
        "negative": _negative,
        "truncated": _truncated,
        "too_many": _too_many,
        "I16": _I16.unpack_from,
        "I32": _I32.unpack_from,
        "ERROR_CODES": _ERROR_CODES,
        "BOOLS": _BOOLS,
        "NAME": cls.__name__,
        "EMPTY": b"",
    }
    lines: list[str] = []
    run: list[tuple[int, str]] = []  # (field index, kafka type) of consecutive packed fields
    plain: list[tuple[int, str]] = []  # (field index, name) of the fields read in order
    tagged: list[tuple[int, str, int]] = []  # (field index, name, tag)
    known_tags: dict[int, Reader] = {}

    def flush() -> None:
        if not run:
            return
        layout = struct.Struct(">" + "".join(_PACKED[t] for _, t in run))
        key = f"S{run[0][0]}"
        namespace[key] = layout.unpack_from
        targets = ", ".join(f"f{i}" for i, _ in run)
        lines.append(f"    {targets}, = {key}(buf, pos)")
        lines.append(f"    pos += {layout.size}")
        for i, t in run:
            if t == "error_code":
                lines.append(f"    f{i} = ERROR_CODES[f{i}]")
            elif t == "bool":
                lines.append(f"    f{i} = BOOLS[f{i}]")
        run.clear()

    for i, f in enumerate(fields(cls)):
        name = f"{cls.__name__}.{f.name}"
        namespace[f"N{i}"] = name
        slot: Any = cls.__dict__.get(f.name)
        if not hasattr(slot, "__set__") or hasattr(cls, "__post_init__"):
            raise TypeError(f"{name}: not a slotted kio entity without __post_init__")
        namespace[f"SET{i}"] = slot.__set__  # the slot's descriptor
        tag = get_field_tag(f)
        if tag is not None:
            known_tags[int(tag)] = _field_reader(cls, f, True, True, views)
            namespace[f"D{i}"] = get_tagged_field_default(f) if f.default is MISSING else f.default
            tagged.append((i, f.name, int(tag)))
            continue
        plain.append((i, f.name))
        kind = classify_field(f)
        kafka_type = f.metadata.get("kafka_type", "")
        if isinstance(kind, PrimitiveField) and kafka_type in _PACKED:
            run.append((i, kafka_type))
            continue
        flush()
        if isinstance(kind, PrimitiveField) and kafka_type in ("string", "bytes", "records"):
            _emit_length(lines, "    ", flexible, "I16" if kafka_type == "string" else "I32")
            lines.append("    if n < 0:")
            _emit_null(lines, "        ", i, field_nullable(f), kafka_type)
            lines += [
                "    else:",
                "        end = pos + n",
                "        if end > len(buf):",
                f"            raise truncated(N{i})",
            ]
            if kafka_type == "string":
                lines.append(f'        f{i} = str(buf[pos:end], "utf-8")')
            elif name in views:
                lines.append(f"        f{i} = buf[pos:end] if n else EMPTY")
            else:
                lines.append(f"        f{i} = bytes(buf[pos:end])")
            lines.append("        pos = end")
        elif isinstance(kind, EntityTupleField):
            ranged = bool(path) and f.name == path[0]
            if ranged and len(path) > 1:
                namespace[f"E{i}"] = ranged_reader_for(kind.type_, views, path[1:])
                read_item = f"            item, pos = yield from E{i}(buf, pos, tick)"
            else:
                namespace[f"E{i}"] = reader_for(kind.type_, views)
                read_item = f"            item, pos = E{i}(buf, pos)"
            _emit_length(lines, "    ", flexible, "I32")
            lines.append("    if n < 0:")
            _emit_null(lines, "        ", i, field_nullable(f), "array")
            lines += [
                "    elif n == 0:",
                f"        f{i} = ()",
                "    else:",
                "        # every entry takes a byte at least: a larger count cannot be honest",
                "        if n > len(buf) - pos:",
                f"            raise too_many(N{i}, n)",
                "        items = []",
                "        for _ in range(n):",
                read_item,
                "            items.append(item)",
                *(
                    ["            if tick():", "                yield"]
                    if ranged and len(path) == 1
                    else []
                ),
                f"        f{i} = tuple(items)",
            ]
        else:
            namespace[f"R{i}"] = _field_reader(cls, f, flexible, False, views)
            lines.append(f"    f{i}, pos = R{i}(buf, pos)")
    flush()
    lines.append("    obj = new(cls)")
    lines += [f"    SET{i}(obj, f{i})" for i, _ in plain]
    if tagged:
        namespace["KNOWN"] = known_tags
        lines += [
            "    if buf[pos] == 0:  # no tagged fields: the common case",
            *(f"        SET{i}(obj, D{i})" for i, _, _ in tagged),
            "        return obj, pos + 1",
            "    tags, pos = read_tags(buf, pos, KNOWN, NAME)",
            *(f"    SET{i}(obj, tags.get({tag}, D{i}))" for i, _, tag in tagged),
        ]
    elif flexible:
        lines += [
            "    if buf[pos] == 0:  # no tagged fields: the common case",
            "        return obj, pos + 1",
            "    tags, pos = read_tags(buf, pos, KNOWN, NAME)",
        ]
        namespace["KNOWN"] = known_tags
    lines.append("    return obj, pos")
    if path:
        if not any(f.name == path[0] for f in fields(cls)):
            raise TypeError(f"{cls.__name__} has no entity array {path[0]!r}")
        lines.append("    yield  # (never reached: a generator)")
        head = "def read_entity(buf, pos, tick):\n"
    else:
        head = "def read_entity(buf, pos):\n"
    source = head + "\n".join(lines) + "\n"
    exec(compile(source, f"<reader of {cls.__module__}.{cls.__name__}>", "exec"), namespace)
    return namespace["read_entity"]
