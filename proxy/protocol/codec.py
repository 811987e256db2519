"""Request/response headers and bodies, encoded and decoded with kio's generated schemas.

Only what the proxy (or the dev broker) must understand is decoded; everything
else stays opaque bytes.  The request header's first eight bytes (api key,
version, correlation id) are readable for *any* request, which is all that
pass-through needs.

Every body is decoded by one compiled, validating pass (:mod:`.readers`), which
refuses what kio's native reader would not (array counts that cannot fit in
the message, nulls where the schema has none) and what it would, and gives a
Fetch response's records as views of the frame when asked (``views``).
"""

from __future__ import annotations

import struct
from collections.abc import Generator
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema

from . import readers, writers
from .apis import API_VERSIONS, CONTROLLED_SHUTDOWN
from .errors import DecodeError, ProtocolError
from .framing import COPY_BELOW, Buffer, Gathered
from .varint import read_uvarint

T = TypeVar("T")

_SCHEMAS_CACHED = 4096
"""Schema look-ups cached: bounded, since request headers name any (api_key, version)."""
_PREFIX = struct.Struct(">hhi")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@lru_cache(maxsize=_SCHEMAS_CACHED)
def request_schema(api_key: int, version: int) -> Any | None:
    """The kio request class for (api_key, version), or None if kio does not know it."""
    try:
        return load_request_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity):
        return None


@lru_cache(maxsize=_SCHEMAS_CACHED)
def response_schema(api_key: int, version: int) -> Any | None:
    try:
        return load_response_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity):
        return None


def request_header_version(api_key: int, version: int) -> int | None:
    """0, 1 or 2; None when the (api_key, version) pair is unknown to us."""
    if api_key == CONTROLLED_SHUTDOWN and version == 0:
        return 0
    schema = request_schema(api_key, version)
    if schema is None:
        return None
    return 2 if schema.__flexible__ else 1


def response_header_version(api_key: int, version: int) -> int | None:
    """0 or 1.  ApiVersions responses always use v0 so that any client can read them."""
    if api_key == API_VERSIONS:
        return 0
    schema = response_schema(api_key, version)
    if schema is None:
        return None
    return 1 if schema.__flexible__ else 0


def skip_tagged_fields(buf: bytes | bytearray | memoryview, pos: int) -> int:
    count, pos = read_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        pos += size
        if pos > len(buf):
            raise DecodeError("truncated tagged field")
    return pos


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    header_version: int | None
    """None when the API/version is unknown to kio (the body is then opaque)."""
    body_offset: int | None
    """Where the body starts in the frame; None when header_version is None."""


def parse_request_header(frame: bytes) -> RequestHeader:
    """Parse the request header of a frame body (the bytes after the length prefix)."""
    if len(frame) < _PREFIX.size:
        raise ProtocolError(f"request frame of {len(frame)} bytes is too short for a header")
    api_key, api_version, correlation_id = _PREFIX.unpack_from(frame, 0)
    hv = request_header_version(api_key, api_version)
    pos = _PREFIX.size
    client_id: str | None = None
    if hv != 0:
        # v1 and v2 both carry a nullable non-compact client_id; read it even for
        # unknown APIs (every header version but v0 has it at this position).
        if len(frame) < pos + 2:
            if hv is None:
                return RequestHeader(api_key, api_version, correlation_id, None, None, None)
            raise ProtocolError("request header truncated in client_id")
        (n,) = _I16.unpack_from(frame, pos)
        pos += 2
        if n >= 0:
            if len(frame) < pos + n:
                if hv is None:
                    return RequestHeader(api_key, api_version, correlation_id, None, None, None)
                raise ProtocolError("request header truncated in client_id")
            client_id = frame[pos : pos + n].decode("utf-8", errors="replace")
            pos += n
        elif n != -1:
            raise ProtocolError(f"invalid client_id length {n}")
    if hv == 2:
        pos = skip_tagged_fields(frame, pos)
    if hv is None:
        return RequestHeader(api_key, api_version, correlation_id, client_id, None, None)
    return RequestHeader(api_key, api_version, correlation_id, client_id, hv, pos)


def encode_request_header(
    api_key: int, api_version: int, correlation_id: int, client_id: str | None
) -> bytes:
    hv = request_header_version(api_key, api_version)
    if hv is None:
        raise ProtocolError(f"unknown request api_key={api_key} version={api_version}")
    out = bytearray(_PREFIX.pack(api_key, api_version, correlation_id))
    if hv >= 1:
        if client_id is None:
            out += _I16.pack(-1)
        else:
            raw = client_id.encode()
            out += _I16.pack(len(raw)) + raw
    if hv == 2:
        out.append(0)
    return bytes(out)


def encode_response_header(correlation_id: int, header_version: int) -> bytes:
    return _I32.pack(correlation_id) + (b"\x00" if header_version == 1 else b"")


def response_body_offset(frame: bytes | bytearray | memoryview, header_version: int) -> int:
    if len(frame) < 4:
        raise ProtocolError("response frame too short for a correlation id")
    return skip_tagged_fields(frame, 4) if header_version == 1 else 4


def peek_correlation_id(frame: bytes | bytearray | memoryview) -> int:
    if len(frame) < 4:
        raise ProtocolError("response frame too short for a correlation id")
    (cid,) = _I32.unpack_from(frame, 0)
    return int(cid)


def _refused(schema: Any, exc: DecodeError) -> DecodeError:
    """*exc*, naming the message it was raised decoding."""
    return DecodeError(f"cannot decode {schema.__name__} v{schema.__version__}: {exc}")


def _decode(
    schema: Any,
    frame: bytes | bytearray,
    offset: int,
    *,
    strict: bool,
    views: frozenset[str] = readers.NO_VIEWS,
) -> Any:
    try:
        obj, end = readers.read(schema, frame, offset, views)
    except DecodeError as exc:
        raise _refused(schema, exc) from exc
    if strict and end != len(frame):
        raise DecodeError(
            f"{schema.__name__} v{schema.__version__}: {len(frame) - end} trailing bytes after body"
        )
    return obj


def _decode_in_ranges(
    schema: Any,
    frame: bytes | bytearray,
    offset: int,
    views: frozenset[str],
    path: tuple[str, ...],
    every: int,
) -> Generator[None, None, Any]:
    """``_decode`` (not strict) in ranges: see ``readers.read_in_ranges``."""
    try:
        obj, _ = yield from readers.read_in_ranges(
            schema, frame, offset, views, path=path, every=every
        )
    except DecodeError as exc:
        raise _refused(schema, exc) from exc
    return obj


# Kafka's broker (AbstractRequest.parseRequest) and Java client
# (AbstractResponse.parseResponse) read the fields they know and ignore any
# bytes after them, and librdkafka 2.x relies on that (Metadata v13 with three
# trailing bytes).  So decoding ignores trailing bytes unless *strict* is set
# (round-trip tests use strict=True to prove a decoder consumed everything).


def _request_body(header: RequestHeader) -> tuple[Any, int]:
    """(schema, body offset) of *header*'s request; DecodeError if kio does not know it."""
    schema = request_schema(header.api_key, header.api_version)
    if schema is None or header.body_offset is None:
        raise DecodeError(
            f"unsupported request api_key={header.api_key} version={header.api_version}"
        )
    return schema, header.body_offset


def _response_body(api_key: int, api_version: int, frame: bytes | bytearray) -> tuple[Any, int]:
    """(schema, body offset) of a response frame; DecodeError if kio does not know it."""
    schema = response_schema(api_key, api_version)
    hv = response_header_version(api_key, api_version)
    if schema is None or hv is None:
        raise DecodeError(f"unsupported response api_key={api_key} version={api_version}")
    return schema, response_body_offset(frame, hv)


def decode_request(frame: bytes, *, strict: bool = False) -> tuple[RequestHeader, Any]:
    """Decode header and body; DecodeError if kio does not know this API/version."""
    header = parse_request_header(frame)
    return header, decode_request_body(header, frame, strict=strict)


def decode_request_body(header: RequestHeader, frame: bytes, *, strict: bool = False) -> Any:
    schema, offset = _request_body(header)
    return _decode(schema, frame, offset, strict=strict)


def decode_request_body_in_ranges(
    header: RequestHeader, frame: bytes, *, path: tuple[str, ...], every: int
) -> Generator[None, None, Any]:
    """``decode_request_body``, yielding after every *every* entries of the entity array at
    *path* (``FETCH_REQUEST_PARTITIONS``; see ``readers.read_in_ranges``)."""
    schema, offset = _request_body(header)
    return (yield from _decode_in_ranges(schema, frame, offset, readers.NO_VIEWS, path, every))


def decode_response_in_ranges(
    api_key: int,
    api_version: int,
    frame: bytes | bytearray,
    *,
    views: frozenset[str] = readers.NO_VIEWS,
    path: tuple[str, ...],
    every: int,
) -> Generator[None, None, Any]:
    """``decode_response``'s body, yielding after every *every* entries of the entity array
    at *path* (``FETCH_RESPONSE_PARTITIONS``; see ``readers.read_in_ranges``)."""
    schema, offset = _response_body(api_key, api_version, frame)
    return (yield from _decode_in_ranges(schema, frame, offset, views, path, every))


def decode_response(
    api_key: int,
    api_version: int,
    frame: bytes | bytearray,
    *,
    strict: bool = False,
    views: frozenset[str] = readers.NO_VIEWS,
) -> tuple[int, Any]:
    """Decode a response frame (header and body); returns (correlation_id, body).

    The bytes fields named in *views* (e.g. ``readers.FETCH_RECORDS``) are views of *frame*.
    """
    schema, offset = _response_body(api_key, api_version, frame)
    body = _decode(schema, frame, offset, strict=strict, views=views)
    return peek_correlation_id(frame), body


def _encode(head: bytes, obj: Any) -> bytes:
    pieces = writers.Collected((head,))
    writers.encode(obj, pieces)
    return b"".join(pieces)


def _encode_in_ranges(
    head: bytes,
    obj: Any,
    path: tuple[str, ...],
    every: int,
    *,
    remember: writers.Written | None = None,
) -> Generator[None, None, writers.Collected]:
    """*head*, then *obj* written in ranges (``writers.encode_in_ranges``): the pieces
    ``_encode`` joins, the same bytes in the same order."""
    pieces = writers.Collected((head,))
    yield from writers.encode_in_ranges(obj, pieces, path, every, remember=remember)
    return pieces


def _request_head(obj: Any, correlation_id: int, client_id: str | None) -> bytes:
    return encode_request_header(
        int(obj.__api_key__), int(obj.__version__), correlation_id, client_id
    )


def _response_head(obj: Any, correlation_id: int) -> bytes:
    hv = response_header_version(int(obj.__api_key__), int(obj.__version__))
    assert hv is not None
    return encode_response_header(correlation_id, hv)


def encode_body(obj: Any) -> bytes:
    return _encode(b"", obj)


def encode_request(obj: Any, correlation_id: int, client_id: str | None) -> bytes:
    """Header + body of a request (frame body, without the length prefix)."""
    return _encode(_request_head(obj, correlation_id, client_id), obj)


def encode_request_in_ranges(
    obj: Any, correlation_id: int, client_id: str | None, *, path: tuple[str, ...], every: int
) -> Generator[None, None, bytes]:
    """``encode_request``, yielding after every *every* entries of the entity array at
    *path* (``FETCH_REQUEST_PARTITIONS``; see ``writers.encode_in_ranges``)."""
    head = _request_head(obj, correlation_id, client_id)
    return b"".join((yield from _encode_in_ranges(head, obj, path, every)))


FETCH_REQUEST_PARTITIONS = ("topics", "partitions")
"""Where a Fetch request's partitions are (``encode_request_in_ranges``)."""
FETCH_RESPONSE_PARTITIONS = ("responses", "partitions")
"""Where a Fetch response's partitions are (``encode_response_gathered_in_ranges``)."""


def drain(ranges: Generator[None, None, T]) -> T:
    """Run every range of *ranges* at once: its value."""
    while True:
        try:
            next(ranges)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


def encode_response(obj: Any, correlation_id: int) -> bytes:
    """Header + body of a response (frame body, without the length prefix)."""
    return _encode(_response_head(obj, correlation_id), obj)


def encode_response_gathered(
    obj: Any, correlation_id: int, *, copy_below: int = COPY_BELOW
) -> Gathered:
    """``encode_response`` as a gather list: large values are referenced, not copied.

    Every run of pieces kio writes that are smaller than *copy_below* is joined
    into one buffer; a bytes field of *copy_below* bytes or more (a Fetch
    response's records, often a view into the upstream frame) stays the object
    kio was given.  ``b"".join(result.parts) == encode_response(obj, correlation_id)``.
    """
    return drain(encode_response_gathered_in_ranges(obj, correlation_id, copy_below=copy_below))


def encode_response_gathered_in_ranges(
    obj: Any,
    correlation_id: int,
    *,
    path: tuple[str, ...] = (),
    every: int = 0,
    copy_below: int = COPY_BELOW,
    remember: writers.Written | None = None,
) -> Generator[None, None, Gathered]:
    """``encode_response_gathered``, yielding after every *every* entries of the entity
    array at *path* (``FETCH_RESPONSE_PARTITIONS``; see ``writers.encode_in_ranges``),
    whose entries are written through *remember* if given (``writers.Written``)."""
    head = _response_head(obj, correlation_id)
    if remember is not None:
        remember.turn()
    pieces = yield from _encode_in_ranges(head, obj, path, every, remember=remember)
    # The gather walks every piece (a few per partition): in ranges too, a run of small
    # pieces then joined at a range's end (the same bytes, in a few more parts).
    step = every * GATHER_PIECES_PER_ENTRY
    parts: list[Buffer] = []
    small: list[Buffer] = []
    for i, piece in enumerate(pieces, 1):
        if step and i % step == 0:
            if small:
                parts.append(b"".join(small))
                small = []
            yield
        if len(piece) < copy_below:
            small.append(piece)
            continue
        if small:
            parts.append(b"".join(small))
            small = []
        parts.append(piece)
    if small or not parts:
        parts.append(b"".join(small))
    return Gathered(parts)


GATHER_PIECES_PER_ENTRY = 6
"""Pieces a Fetch response's partition is written as, about (the gather's range size)."""
