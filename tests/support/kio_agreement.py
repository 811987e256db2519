"""What the compiled readers and writers are compared with: kio's own reader and writer.

:func:`old_path` is what the codec did before the readers (``walk.check``, then
kio's ``entity_reader``), :func:`compiled` the reader, :func:`assert_same` that the
two agree on a buffer (both views settings); :func:`kio_bytes` and
:func:`compiled_bytes` are kio's and the compiled writer's encoding of an entity.
Shared by ``tests/unit/test_readers.py``, ``test_writers.py`` and the property test
over every class kio knows, ``test_kio_agreement.py``.
"""

from __future__ import annotations

import dataclasses
import io
import struct
from typing import Any

from kio.serial import entity_reader, entity_writer

from proxy.protocol import readers, walk, writers
from proxy.protocol.errors import DecodeError

PREFIX = b"\xaa\xbb\xcc"
"""Bytes before every body: the readers must honour the offset they are given."""


def old_path(schema: type, buf: bytes, offset: int) -> tuple[Any, int] | None:
    """What the codec did before the readers: the check walk, then kio; None if either refused."""
    try:
        walk.check(schema, buf, offset)
    except DecodeError:
        return None
    try:
        obj, size = entity_reader(schema)(buf, offset)
    except Exception:  # kio raises KeyError/ValueError/its own errors: the codec refused them all
        return None
    return obj, offset + size


def compiled(
    schema: type, buf: bytes, offset: int, views: frozenset[str]
) -> tuple[Any, int] | None:
    """The compiled reader; None if it refused (with DecodeError: anything else fails the test)."""
    try:
        return readers.read(schema, buf, offset, views)
    except DecodeError:
        return None


def as_bytes(obj: Any) -> Any:
    """*obj* in a form that compares by content: every memoryview (the records read as
    views) turned into bytes, and every float into its eight bytes, so that a NaN (which a
    flipped byte of a float64 field makes) equals the same NaN read by the other path."""
    if isinstance(obj, memoryview):
        return bytes(obj)
    if isinstance(obj, float):
        return struct.pack(">d", obj)
    if isinstance(obj, tuple):
        return tuple(as_bytes(item) for item in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return (type(obj), tuple(as_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj)))
    return obj


def assert_same(schema: type, buf: bytes, offset: int) -> int:
    """The old path and both readers (views or not) agree on *buf*; returns how many decoded."""
    expected = old_path(schema, buf, offset)
    decoded = 0
    for views in (readers.NO_VIEWS, readers.FETCH_RECORDS):
        got = compiled(schema, buf, offset, views)
        if expected is None:
            assert got is None, f"{schema.__name__}: old path refused {buf.hex()}, reader did not"
            continue
        assert got is not None, f"{schema.__name__}: reader refused {buf.hex()}, old path did not"
        assert got[1] == expected[1], f"{schema.__name__}: reader ended elsewhere on {buf.hex()}"
        same = as_bytes(got[0]) == as_bytes(expected[0])
        assert same, f"{schema.__name__}: read otherwise {buf.hex()}"
        decoded += 1
    return decoded


def kio_bytes(obj: Any) -> bytes:
    """kio's encoding of *obj* (its own writer)."""
    buffer = io.BytesIO()
    entity_writer(type(obj))(buffer, obj)
    return buffer.getvalue()


class Collect(list[Any]):
    """An output that keeps each piece written to it."""

    def write(self, data: Any) -> int:
        self.append(data)
        return len(data)


def compiled_bytes(obj: Any) -> bytes:
    """The compiled writer's encoding of *obj*."""
    out = Collect()
    writers.encode(obj, out)
    return b"".join(out)
