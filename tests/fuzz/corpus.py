"""Seed inputs for the fuzzers, generated at run time from kio's schemas (nothing is committed).

``build(cls, rng)`` makes a valid instance of any kio entity deterministically
from a ``random.Random``: every field gets a value of its Kafka type, arrays get
0-2 elements, nullable fields are sometimes null, ``records`` fields hold real
RecordBatch v2 bytes.  The seeds of each fuzz target (``seeds(target)``) are
encoded messages of every API and version the proxy decodes, so a mutation
starts from bytes that reach deep into the decoders.
"""

from __future__ import annotations

import dataclasses
import random
import struct
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import cache
from types import NoneType, UnionType
from typing import Any, Union, get_args, get_origin

from crc32c import crc32c
from kio.schema.errors import ErrorCode
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
)

from proxy.protocol import codec
from proxy.protocol.apis import API_VERSIONS, FETCH, PRODUCE, SASL_HANDSHAKE
from proxy.relay import rewrite

MAX_VERSION_PROBE = 40
DECODED_APIS = frozenset(rewrite.REWRITTEN_APIS | {PRODUCE, FETCH, API_VERSIONS})
"""APIs whose requests or responses the proxy parses beyond the header prefix (the generic
rewrite entry point's list, so an API added to ``rewrite.REWRITTEN_APIS`` is fuzzed too)."""
REQUEST_APIS = sorted(DECODED_APIS | {SASL_HANDSHAKE})
"""APIs whose request bodies the proxy reads (Fetch decoded, Produce acks, SASL v0 mechanism)
plus the ones it relays with a rewritten response."""
RESPONSE_APIS = sorted(DECODED_APIS)
"""APIs whose responses the proxy decodes or rewrites (the generic rewrite entry point covers
every API ``rewrite.REWRITTEN_APIS`` lists, at every version kio knows)."""


def versions(api_key: int, *, response: bool) -> list[int]:
    schema = codec.response_schema if response else codec.request_schema
    return [v for v in range(MAX_VERSION_PROBE) if schema(api_key, v) is not None]


@cache
def response_pairs() -> tuple[tuple[int, int], ...]:
    return tuple((k, v) for k in RESPONSE_APIS for v in versions(k, response=True))


@cache
def request_pairs() -> tuple[tuple[int, int], ...]:
    return tuple((k, v) for k in REQUEST_APIS for v in versions(k, response=False))


# -- record batches ------------------------------------------------------------------------


def record_batch(
    base_offset: int, count: int, payload: bytes = b"v" * 8, attributes: int = 0
) -> bytes:
    """A syntactically valid RecordBatch v2 (opaque body, correct length and CRC)."""
    after_crc = (
        struct.pack(">hiqqqhii", attributes, count - 1, 1000, 1000 + count, -1, -1, -1, count)
        + payload
    )
    body = struct.pack(">ibI", 0, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", base_offset, len(body)) + body


def records_value(rng: random.Random) -> bytes:
    out = b""
    offset = rng.choice([0, 5, 1000])
    for _ in range(rng.randint(0, 3)):
        count = rng.randint(1, 4)
        attributes = rng.choice([0, 0, 0x10, 0x20, 0x30])  # plain, transactional, control
        out += record_batch(offset, count, b"x" * rng.randint(0, 12), attributes)
        offset += count
    if out and rng.random() < 0.2:
        out += out[: rng.randint(1, 30)]  # a partial trailing batch (KIP-74)
    return out


# -- values of every Kafka type ------------------------------------------------------------

_INTS = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint8": (0, 2**8 - 1),
    "uint16": (0, 2**16 - 1),
    "uint32": (0, 2**32 - 1),
    "uint64": (0, 2**64 - 1),
}
_ERRORS = [ErrorCode(0), ErrorCode(0), ErrorCode(1), ErrorCode(3), ErrorCode(70), ErrorCode(71)]
_STRINGS = ["", "orders", "t", "broker-1.internal", "ü"]


def _int(kafka_type: str, rng: random.Random) -> int:
    lo, hi = _INTS[kafka_type]
    pick = rng.random()
    if pick < 0.6:
        return max(lo, min(hi, rng.randint(-1, 4)))
    if pick < 0.8:
        return rng.choice([lo, hi, max(lo, 0), min(hi, 1000)])
    return rng.randint(lo, hi)


def primitive(kafka_type: str, rng: random.Random, nullable: bool) -> Any:
    if nullable and rng.random() < 0.2:
        return None
    if kafka_type in _INTS:
        return _int(kafka_type, rng)
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "float64":
        return rng.choice([0.0, 0.5, -1.0])
    if kafka_type == "string":
        return rng.choice(_STRINGS)
    if kafka_type == "bytes":
        return rng.choice([b"", b"\x00\x01", b"sasl-token"])
    if kafka_type == "records":
        return records_value(rng)
    if kafka_type == "uuid":
        return rng.choice([uuid.UUID(int=0), uuid.UUID(int=rng.getrandbits(128))])
    if kafka_type == "error_code":
        return rng.choice(_ERRORS)
    if kafka_type == "timedelta_i32":
        return timedelta(milliseconds=rng.choice([0, 100, 500]))
    if kafka_type == "timedelta_i64":
        return timedelta(milliseconds=rng.choice([0, 100, 60_000]))
    if kafka_type == "datetime_i64":
        return datetime.fromtimestamp(rng.choice([0, 1_700_000_000]), tz=UTC)
    raise ValueError(f"no seed value for kafka_type {kafka_type!r}")


def _nullable(f: dataclasses.Field[Any]) -> bool:
    """``X | None``: the field itself may be null (kio's ``is_optional`` also says yes for
    ``tuple[UUID | None, ...]``, an array that may not be null, of UUIDs kio reads as None
    when zero)."""
    return get_origin(f.type) in (UnionType, Union) and NoneType in get_args(f.type)


def build(cls: type, rng: random.Random, depth: int = 0) -> Any:
    """A valid instance of the kio entity *cls* (see the module docstring)."""
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        tag = get_field_tag(f)
        if tag is not None and f.default is not dataclasses.MISSING and rng.random() < 0.5:
            continue  # leave the tagged field out (its default)
        kind = classify_field(f)
        nullable = _nullable(f)
        if isinstance(kind, EntityField):
            if nullable and rng.random() < 0.3:
                kwargs[f.name] = None
            else:
                kwargs[f.name] = build(kind.type_, rng, depth + 1)
        elif isinstance(kind, EntityTupleField):
            if nullable and rng.random() < 0.2:
                kwargs[f.name] = None
            else:
                n = rng.randint(0, 2 if depth < 3 else 1)
                kwargs[f.name] = tuple(build(kind.type_, rng, depth + 1) for _ in range(n))
        elif isinstance(kind, PrimitiveTupleField):
            if nullable and rng.random() < 0.2:
                kwargs[f.name] = None
            else:
                n = rng.randint(0, 3)
                kwargs[f.name] = tuple(
                    primitive(f.metadata["kafka_type"], rng, False) for _ in range(n)
                )
        else:
            kwargs[f.name] = primitive(f.metadata["kafka_type"], rng, nullable)
    return cls(**kwargs)


# -- encoded messages ----------------------------------------------------------------------


def encoded_requests(per_version: int = 3, seed: int = 0) -> Iterator[tuple[int, int, bytes]]:
    """(api_key, version, request frame body) for every version of every REQUEST_APIS entry."""
    rng = random.Random(seed)
    for api_key, version in request_pairs():
        schema = codec.request_schema(api_key, version)
        for _ in range(per_version):
            obj = build(schema, rng)
            yield api_key, version, codec.encode_request(obj, rng.randint(0, 2**31 - 1), "fuzz")


def encoded_responses(per_version: int = 3, seed: int = 0) -> Iterator[tuple[int, int, bytes]]:
    """(api_key, version, response frame body) for every version of every RESPONSE_APIS entry."""
    rng = random.Random(seed)
    for api_key, version in response_pairs():
        schema = codec.response_schema(api_key, version)
        for _ in range(per_version):
            obj = build(schema, rng)
            yield api_key, version, codec.encode_response(obj, rng.randint(0, 2**31 - 1))


def rewritten_pairs() -> list[tuple[int, int]]:
    return [(k, v) for k, v in response_pairs() if rewrite.needs_rewrite(k, v) or k == API_VERSIONS]
