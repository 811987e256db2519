"""The check walk (``walk.check``), through the codec whose readers refuse what it refuses
(``tests/unit/test_readers.py``): counts that cannot fit and nulls the schema has no room for
are refused.  That every valid message of every API and version passes (and round trips
through the codec) is checked in ``test_kio_agreement.py``, which draws each message once
for the walk, readers and writers."""

from __future__ import annotations

import struct
import uuid
from datetime import timedelta

import pytest
from kio.schema.broker_heartbeat.v1.request import BrokerHeartbeatRequest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v4.request import MetadataRequest as MetadataRequestV4

from proxy.protocol import codec
from proxy.protocol.errors import DecodeError

# Fetch v4 request: replica, max_wait, min_bytes, max_bytes, isolation, topics count
_FETCH_V4_HEAD = (
    struct.pack(">hhih", 1, 4, 9, 4) + b"fuzz" + struct.pack(">iiiib", -1, 500, 1, 1, 0)
)


def test_the_oversized_fetch_is_refused_before_kio() -> None:
    """kio 0.6.5 would reserve 2**32 - 2 entries (34 GB) for it and abort the process."""
    oversized = (
        struct.pack(">hhih", 1, 12, 7, 4)
        + b"fuzz\x00"
        + struct.pack(">iiiibii", -1, 500, 1, 1 << 20, 0, 0, -1)
        + b"\xff\xff\xff\xff\x0f"
        + b"\x00" * 8
    )
    with pytest.raises(DecodeError, match=r"FetchRequest\.topics: array of 4294967294 entries"):
        codec.decode_request(oversized)


@pytest.mark.parametrize("count", [2**31 - 1, 1000, 1])
def test_a_legacy_count_larger_than_the_bytes_left_is_refused(count: int) -> None:
    with pytest.raises(DecodeError, match=f"array of {count} entries cannot fit"):
        codec.decode_request(_FETCH_V4_HEAD + struct.pack(">i", count))


def test_a_count_that_fits_reaches_kio() -> None:
    # one topic "t" with no partitions: 7 bytes after the count
    frame = _FETCH_V4_HEAD + struct.pack(">ih", 1, 1) + b"t" + struct.pack(">i", 0)
    _, body = codec.decode_request(frame)
    assert [t.topic for t in body.topics] == ["t"]
    with pytest.raises(DecodeError, match="truncated"):
        codec.decode_request(frame[:-1])


def test_a_null_array_the_schema_does_not_allow_is_refused() -> None:
    with pytest.raises(DecodeError, match=r"FetchRequest\.topics: null array"):
        codec.decode_request(_FETCH_V4_HEAD + struct.pack(">i", -1))
    # flexible: compact count 0 is null
    schema = codec.response_schema(1, 12)
    obj = schema(throttle_time=timedelta(0), error_code=ErrorCode.none, session_id=0, responses=())
    frame = codec.encode_response(obj, 1)
    assert frame.endswith(b"\x01\x00")  # responses: compact count 0 + 1; no tagged fields
    with pytest.raises(DecodeError, match=r"FetchResponse\.responses: null array"):
        codec.decode_response(1, 12, frame[:-2] + b"\x00\x00")


def test_a_nullable_array_may_be_null() -> None:
    """Metadata v4's topics: null means every topic."""
    frame = codec.encode_request(
        MetadataRequestV4(topics=None, allow_auto_topic_creation=True), 3, None
    )
    _, body = codec.decode_request(frame, strict=True)
    assert body.topics is None


def test_a_null_string_the_schema_does_not_allow_is_refused() -> None:
    frame = _FETCH_V4_HEAD + struct.pack(">ih", 1, -1) + struct.pack(">i", 0)
    with pytest.raises(DecodeError, match=r"FetchTopic\.topic: null string"):
        codec.decode_request(frame)


def test_null_entries_of_an_array_of_nullable_uuids() -> None:
    """``tuple[UUID | None, ...]``: the array is not nullable, its entries are (fixed size)."""
    obj = BrokerHeartbeatRequest(
        broker_id=1,
        broker_epoch=2,
        current_metadata_offset=3,
        want_fence=False,
        want_shut_down=False,
        offline_log_dirs=(uuid.uuid4(), None),
    )
    frame = codec.encode_request(obj, 1, None)
    assert codec.decode_request(frame, strict=True)[1] == obj


def test_a_known_tagged_field_is_checked_too() -> None:
    """Fetch v12's tagged cluster_id (tag 0) in a tagged field longer than the string."""
    head = struct.pack(">hhih", 1, 12, 7, 4) + b"fuzz\x00"
    body = struct.pack(">iiiibii", -1, 500, 1, 1 << 20, 0, 0, -1) + b"\x01\x01\x01"
    ok = head + body + b"\x01\x00\x02\x02a"  # one tagged field: tag 0, size 2, "a"
    _, req = codec.decode_request(ok)
    assert req.cluster_id == "a"
    with pytest.raises(DecodeError, match="tagged field 0 of FetchRequest has the wrong size"):
        codec.decode_request(head + body + b"\x01\x00\x03\x02ab")
