"""The compiled readers (proxy.protocol.readers) decode what kio decodes and refuse what the
old path refused: ``walk.check`` then kio's native ``entity_reader``, for every class kio knows."""

from __future__ import annotations

import dataclasses
import random
import struct
import sys
import tracemalloc
import uuid
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, reject, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from support.kio_classes import SCHEMAS, schema_id

from proxy.protocol import codec, readers, walk
from proxy.protocol.errors import DecodeError
from proxy.protocol.messages import make

_PREFIX = b"\xaa\xbb\xcc"
"""Bytes before every body: the readers must honour the offset they are given."""


def _old(schema: type, buf: bytes, offset: int) -> tuple[Any, int] | None:
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


def _new(schema: type, buf: bytes, offset: int, views: frozenset[str]) -> tuple[Any, int] | None:
    """The compiled reader; None if it refused (with DecodeError: anything else fails the test)."""
    try:
        return readers.read(schema, buf, offset, views)
    except DecodeError:
        return None


def _as_bytes(obj: Any) -> Any:
    """*obj* with every memoryview (the records read as views) turned into bytes."""
    if isinstance(obj, memoryview):
        return bytes(obj)
    if isinstance(obj, tuple):
        return tuple(_as_bytes(item) for item in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {f.name: _as_bytes(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
        return dataclasses.replace(obj, **changes)
    return obj


def _assert_same(schema: type, buf: bytes, offset: int) -> int:
    """The old path and both readers (views or not) agree on *buf*; returns how many decoded."""
    expected = _old(schema, buf, offset)
    decoded = 0
    for views in (readers.NO_VIEWS, readers.FETCH_RECORDS):
        got = _new(schema, buf, offset, views)
        if expected is None:
            assert got is None, f"{schema.__name__}: old path refused {buf.hex()}, reader did not"
            continue
        assert got is not None, f"{schema.__name__}: reader refused {buf.hex()}, old path did not"
        assert got[1] == expected[1]
        assert _as_bytes(got[0]) == expected[0]
        decoded += 1
    return decoded


def _encoded(data: st.DataObject) -> tuple[type, bytes]:
    schema = data.draw(st.sampled_from(SCHEMAS))
    obj = data.draw(st.from_type(schema))
    return schema, codec.encode_body(obj)


@pytest.mark.parametrize("schema", SCHEMAS, ids=schema_id)
def test_each_class_compiles(schema: type) -> None:
    """Every request and response class (and every entity in it) has a reader, both ways."""
    assert callable(readers.reader_for(schema))
    assert callable(readers.reader_for(schema, readers.FETCH_RECORDS))


@settings(
    max_examples=1500,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data())
def test_every_message_decodes_as_kio_decodes_it(data: st.DataObject) -> None:
    schema, body = _encoded(data)
    buf = _PREFIX + body
    try:
        expected, size = entity_reader(schema)(buf, len(_PREFIX))
    except ValueError as exc:
        # kio encodes any int64 millisecond duration but decodes only what a
        # datetime.timedelta holds: such an example says nothing about the reader.
        if "timedelta milliseconds overflow" in str(exc):
            reject()
        raise
    for views in (readers.NO_VIEWS, readers.FETCH_RECORDS):
        obj, end = readers.read(schema, buf, len(_PREFIX), views)
        assert end == len(_PREFIX) + size == len(buf)  # consumed exactly what kio consumed
        assert _as_bytes(obj) == expected
        assert type(obj) is type(expected)


@settings(
    max_examples=400,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(st.data(), st.randoms(use_true_random=False))
def test_malformed_messages_are_refused_exactly_when_the_old_path_refused_them(
    data: st.DataObject, rnd: random.Random
) -> None:
    """Truncations, byte flips and forged counts/lengths of a valid message: same verdict."""
    schema, body = _encoded(data)
    cases = [body[:cut] for cut in range(len(body))] if len(body) <= 256 else []
    cases += [body[: rnd.randrange(len(body) + 1)] for _ in range(20)]
    for _ in range(40):
        mutated = bytearray(body)
        for _ in range(rnd.randint(1, 3)):
            if not mutated:
                break
            at = rnd.randrange(len(mutated))
            if rnd.random() < 0.3 and at + 4 <= len(mutated):  # a forged int32/int16/varint
                forged = rnd.choice(
                    [b"\x7f\xff\xff\xff", b"\xff\xff\xff\xfe", b"\xff\xff", b"\xff\xff\xff\x0f"]
                )
                mutated[at : at + len(forged)] = forged
            else:
                mutated[at] = rnd.choice([0, 1, 0x7F, 0x80, 0xFE, 0xFF, rnd.randrange(256)])
        cases.append(bytes(mutated))
    for case in cases:
        _assert_same(schema, _PREFIX + case, len(_PREFIX))


# --- real messages ------------------------------------------------------------------------------


def _fetch_response(version: int, partitions: int = 3, records: bytes = b"r" * 40) -> Any:
    mod = sys.modules[codec.response_schema(1, version).__module__]

    def pd(index: int, value: bytes | None) -> Any:
        kwargs: dict[str, Any] = {
            "partition_index": index,
            "error_code": ErrorCode.none,
            "high_watermark": 10,
            "last_stable_offset": 10,
            "log_start_offset": 0,
            "aborted_transactions": (mod.AbortedTransaction(producer_id=5, first_offset=4),),
            "preferred_read_replica": -1,
            "records": value,
        }
        if hasattr(mod, "LeaderIdAndEpoch"):  # a tagged field after records
            kwargs["current_leader"] = mod.LeaderIdAndEpoch(leader_id=1, leader_epoch=3)
        return make(mod.PartitionData, **kwargs)

    parts = (*(pd(i, records) for i in range(partitions)), pd(90, None), pd(91, b""))
    return make(
        mod.FetchResponse,
        throttle_time=timedelta(milliseconds=3),
        error_code=ErrorCode.none,
        session_id=17,
        responses=(
            make(
                mod.FetchableTopicResponse,
                topic="orders",
                topic_id=uuid.UUID(int=5),
                partitions=parts,
            ),
        ),
    )


def _metadata_response() -> Any:
    mod = sys.modules[codec.response_schema(3, 12).__module__]
    return make(
        mod.MetadataResponse,
        throttle_time=timedelta(0),
        brokers=(mod.MetadataResponseBroker(node_id=1, host="broker-1", port=9092, rack=None),),
        cluster_id="c",
        controller_id=1,
        topics=(
            mod.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name="orders",
                topic_id=uuid.UUID(int=5),
                is_internal=False,
                partitions=(
                    mod.MetadataResponsePartition(
                        error_code=ErrorCode.none,
                        partition_index=0,
                        leader_id=1,
                        leader_epoch=0,
                        replica_nodes=(1,),
                        isr_nodes=(1,),
                        offline_replicas=(),
                    ),
                ),
                topic_authorized_operations=-2147483648,
            ),
        ),
    )


REAL = [
    *(
        (codec.response_schema(1, v), codec.encode_body(_fetch_response(v)))
        for v in (4, 11, 12, 16)
    ),
    (codec.response_schema(3, 12), codec.encode_body(_metadata_response())),
]


@pytest.mark.parametrize("schema, body", REAL, ids=lambda x: getattr(x, "__module__", ""))
def test_every_truncation_of_a_real_message_is_refused_like_before(
    schema: type, body: bytes
) -> None:
    assert _assert_same(schema, body, 0) == 2  # the whole message decodes
    for cut in range(len(body)):
        _assert_same(schema, body[:cut], 0)
        # the last byte is a tag section or a field: no strict prefix is a whole message
        assert _new(schema, body[:cut], 0, readers.FETCH_RECORDS) is None


@pytest.mark.parametrize("schema, body", REAL, ids=lambda x: getattr(x, "__module__", ""))
def test_every_single_byte_change_of_a_real_message_is_judged_like_before(
    schema: type, body: bytes
) -> None:
    for at in range(len(body)):
        for value in (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF):
            changed = body[:at] + bytes((value,)) + body[at + 1 :]
            _assert_same(schema, changed, 0)


def test_records_are_views_of_the_frame_and_other_bytes_stay_bytes() -> None:
    frame = codec.encode_response(_fetch_response(12), 7)
    offset = codec.response_body_offset(frame, 1)
    schema = codec.response_schema(1, 12)
    viewed, _ = readers.read(schema, frame, offset, readers.FETCH_RECORDS)
    copied, _ = readers.read(schema, frame, offset)
    kinds = [type(pd.records) for pd in viewed.responses[0].partitions]
    assert kinds == [memoryview, memoryview, memoryview, type(None), bytes]  # b"" stays b""
    assert all(pd.records.obj is frame for pd in viewed.responses[0].partitions[:3])
    assert [type(pd.records) for pd in copied.responses[0].partitions][:3] == [bytes] * 3
    assert _as_bytes(viewed) == copied
    # a bytes field of another class is a copy even when Fetch records are views
    sasl = codec.request_schema(36, 2)
    body = codec.encode_body(sasl(auth_bytes=b"secret"))
    obj, _ = readers.read(sasl, body, 0, readers.FETCH_RECORDS)
    assert type(obj.auth_bytes) is bytes and obj.auth_bytes == b"secret"


def test_an_unknown_tagged_field_is_refused_as_kio_refuses_it() -> None:
    """kio raises on a tag it does not know; the decoded path keeps that (the relay's byte
    rewriting, ``walk.rewrite``, is what keeps unknown tags)."""
    schema = codec.response_schema(18, 3)  # ApiVersions v3: error, api_keys[], throttle, tags
    body = b"\x00\x00\x01\x00\x00\x00\x00" + b"\x01\x05\x01\x00"  # tag 5, one byte
    with pytest.raises(KeyError):
        entity_reader(schema)(body, 0)
    with pytest.raises(DecodeError, match="unknown tagged field 5"):
        readers.read(schema, body, 0)
    assert readers.read(schema, body[:-4] + b"\x00", 0)[1] == len(body) - 3


def test_a_known_tagged_field_of_the_wrong_size_is_refused() -> None:
    schema = codec.response_schema(18, 3)
    # tag 1 (finalized_features_epoch, int64) announced with 9 bytes
    body = b"\x00\x00\x01\x00\x00\x00\x00" + b"\x01\x01\x09" + b"\x00" * 9
    with pytest.raises(DecodeError, match="wrong size"):
        readers.read(schema, body, 0)
    assert _old(schema, body, 0) is None


# Fetch v4 request: replica, max_wait, min_bytes, max_bytes, isolation, topics count
_FETCH_V4 = struct.pack(">iiiib", -1, 500, 1, 1, 0)


@pytest.mark.parametrize("count", [2**31 - 1, 2**31 - 2, 1000, 1])
def test_a_forged_count_is_refused_without_allocating(count: int) -> None:
    schema = codec.request_schema(1, 4)
    body = _FETCH_V4 + struct.pack(">i", count)
    readers.read(schema, _FETCH_V4 + struct.pack(">i", 0), 0)  # compiles (and caches) the reader
    tracemalloc.start()
    try:
        with pytest.raises(DecodeError, match=f"array of {count} entries cannot fit"):
            readers.read(schema, body, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024
    assert _old(schema, body, 0) is None


def test_a_forged_compact_count_is_refused() -> None:
    schema = codec.response_schema(1, 12)
    # throttle, error, session, responses: compact count 2**32 - 1 (varint of 2**32)
    body = struct.pack(">ihi", 0, 0, 0) + b"\x80\x80\x80\x80\x10" + b"\x00" * 8
    with pytest.raises(DecodeError, match="cannot fit"):
        readers.read(schema, body, 0)


@pytest.mark.parametrize("length", [-2, -5, -(2**31)])
def test_a_negative_length_other_than_null_is_refused(length: int) -> None:
    """kio reads only -1 as null (``NegativeByteLength`` otherwise); so does the reader."""
    schema = codec.response_schema(1, 4)
    body = codec.encode_body(_fetch_response(4, partitions=0))
    # the last partition's records (b""): int32 length 0 at the end of the message
    assert body.endswith(b"\x00\x00\x00\x00")
    forged = body[:-4] + struct.pack(">i", length)
    assert _old(schema, forged, 0) is None
    with pytest.raises(DecodeError, match="negative length"):
        readers.read(schema, forged, 0)
    assert readers.read(schema, body[:-4] + struct.pack(">i", -1), 0)[0] is not None


def test_nulls_are_refused_where_the_schema_has_none() -> None:
    # Fetch v4 response: the topic name is a non-nullable string
    schema = codec.response_schema(1, 4)
    body = codec.encode_body(_fetch_response(4, partitions=0))
    at = body.index(b"\x00\x06orders")
    forged = body[:at] + b"\xff\xff" + body[at + 8 :]
    assert _old(schema, forged, 0) is None
    with pytest.raises(DecodeError, match=r"FetchableTopicResponse\.topic: null string"):
        readers.read(schema, forged, 0)
    # FetchRequest v4: the topics array is not nullable
    with pytest.raises(DecodeError, match=r"FetchRequest\.topics: null array"):
        readers.read(codec.request_schema(1, 4), _FETCH_V4 + struct.pack(">i", -1), 0)


@pytest.mark.parametrize("marker", [0x00, 0x01, 0x02, 0x7F, 0x80, 0xFE, 0xFF])
def test_a_nullable_struct_marker_is_read_as_before(marker: int) -> None:
    """DescribeTopicPartitions v0: ``cursor`` is the one nullable struct in requests."""
    schema = codec.request_schema(75, 0)
    mod = sys.modules[schema.__module__]
    obj = schema(
        topics=(mod.TopicRequest(name="t"),),
        response_partition_limit=10,
        cursor=mod.Cursor(topic_name="t", partition_index=1),
    )
    body = codec.encode_body(obj)
    at = body.index(b"\x02t\x00\x00\x00\x01") - 1  # the marker precedes the cursor
    assert body[at] == 1
    assert _assert_same(schema, body[:at] + bytes((marker,)) + body[at + 1 :], 0) in (0, 2)
