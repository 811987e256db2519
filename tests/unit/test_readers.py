"""The compiled readers (proxy.protocol.readers) decode what kio decodes and refuse what the
old path refused: ``walk.check`` then kio's native ``entity_reader``, for every class kio knows.

Random messages of every class (decoded as kio decodes them; truncated, flipped and
forged, refused exactly when the old path refused them) are checked in
``test_kio_agreement.py``, which draws each message once for the readers, writers and walk.
"""

from __future__ import annotations

import struct
import sys
import tracemalloc
import uuid
from datetime import timedelta
from typing import Any

import pytest
from kio.schema.alter_client_quotas.v0.request import AlterClientQuotasRequest
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader
from support.kio_agreement import as_bytes, assert_same, compiled, old_path
from support.kio_classes import SCHEMAS, schema_id

from proxy.protocol import codec, readers
from proxy.protocol.errors import DecodeError
from proxy.protocol.messages import make


@pytest.mark.parametrize("schema", SCHEMAS, ids=schema_id)
def test_each_class_compiles(schema: type) -> None:
    """Every request and response class (and every entity in it) has a reader, both ways."""
    assert callable(readers.reader_for(schema))
    assert callable(readers.reader_for(schema, readers.FETCH_RECORDS))


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
    assert assert_same(schema, body, 0) == 2  # the whole message decodes
    for cut in range(len(body)):
        assert_same(schema, body[:cut], 0)
        # the last byte is a tag section or a field: no strict prefix is a whole message
        assert compiled(schema, body[:cut], 0, readers.FETCH_RECORDS) is None


@pytest.mark.parametrize("schema, body", REAL, ids=lambda x: getattr(x, "__module__", ""))
def test_every_single_byte_change_of_a_real_message_is_judged_like_before(
    schema: type, body: bytes
) -> None:
    for at in range(len(body)):
        for value in (0x00, 0x01, 0x7F, 0x80, 0xFE, 0xFF):
            changed = body[:at] + bytes((value,)) + body[at + 1 :]
            assert_same(schema, changed, 0)


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
    assert as_bytes(viewed) == as_bytes(copied)
    # a bytes field of another class is a copy even when Fetch records are views
    sasl = codec.request_schema(36, 2)
    body = codec.encode_body(sasl(auth_bytes=b"secret"))
    obj, _ = readers.read(sasl, body, 0, readers.FETCH_RECORDS)
    assert type(obj.auth_bytes) is bytes and obj.auth_bytes == b"secret"


def test_a_nan_float64_is_read_with_its_bits_as_kio_reads_it() -> None:
    """A flipped byte of a float64 field can make a NaN: both paths read the same NaN, and
    the comparison (by bits) says so, where NaN == NaN would not.  CI found this one."""
    body = bytes.fromhex("000000010000000100000001300000000100007fffffff000000000000")
    assert assert_same(AlterClientQuotasRequest, b"\xaa" + body, 1) == 2
    value = readers.read(AlterClientQuotasRequest, body, 0)[0].entries[0].ops[0].value
    assert value != value and struct.pack(">d", value) == bytes.fromhex("7fffffff00000000")


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
    assert old_path(schema, body, 0) is None


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
    assert old_path(schema, body, 0) is None


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
    assert old_path(schema, forged, 0) is None
    with pytest.raises(DecodeError, match="negative length"):
        readers.read(schema, forged, 0)
    assert readers.read(schema, body[:-4] + struct.pack(">i", -1), 0)[0] is not None


def test_nulls_are_refused_where_the_schema_has_none() -> None:
    # Fetch v4 response: the topic name is a non-nullable string
    schema = codec.response_schema(1, 4)
    body = codec.encode_body(_fetch_response(4, partitions=0))
    at = body.index(b"\x00\x06orders")
    forged = body[:at] + b"\xff\xff" + body[at + 8 :]
    assert old_path(schema, forged, 0) is None
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
    assert assert_same(schema, body[:at] + bytes((marker,)) + body[at + 1 :], 0) in (0, 2)
