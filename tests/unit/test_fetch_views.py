"""The fetch path points decoded records into the upstream frame instead of kio's copies."""

from __future__ import annotations

import sys
import uuid
from datetime import timedelta
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from proxy.protocol import codec
from proxy.protocol.fetch_views import decode_fetch_response, records_as_views
from proxy.protocol.messages import make


def _response(version: int) -> Any:
    mod = sys.modules[codec.response_schema(1, version).__module__]

    def pd(index: int, records: bytes | None) -> Any:
        kwargs: dict[str, Any] = {
            "partition_index": index,
            "error_code": ErrorCode(0),
            "high_watermark": 10,
            "last_stable_offset": 10,
            "log_start_offset": 0,
            "aborted_transactions": None,
            "preferred_read_replica": -1,
            "records": records,
        }
        if hasattr(mod, "LeaderIdAndEpoch"):  # a tagged field after records
            kwargs["current_leader"] = mod.LeaderIdAndEpoch(leader_id=1, leader_epoch=3)
        return make(mod.PartitionData, **kwargs)

    topics = tuple(
        make(
            mod.FetchableTopicResponse,
            topic=name,
            topic_id=uuid.uuid4(),
            partitions=(pd(0, name.encode() * 50), pd(1, None), pd(2, b""), pd(3, b"xyz")),
        )
        for name in ("a", "b")
    )
    return make(
        mod.FetchResponse,
        throttle_time=timedelta(0),
        error_code=ErrorCode(0),
        session_id=0,
        responses=topics,
    )


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16, 17, 18])
def test_records_become_views_of_the_frame(version: int) -> None:
    frame = codec.encode_response(_response(version), 7)
    _, decoded = codec.decode_response(1, version, frame)
    viewed = records_as_views(decoded, version, frame)
    assert viewed == decoded  # same message
    for topic in viewed.responses:
        for pd in topic.partitions:
            if pd.records:
                assert isinstance(pd.records, memoryview) and pd.records.obj is frame
    assert codec.encode_response(viewed, 7) == frame


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16, 17, 18])
def test_decoding_reads_records_as_views_of_the_frame_in_one_pass(version: int) -> None:
    frame = codec.encode_response(_response(version), 7)
    decoded = decode_fetch_response(version, frame)
    assert decoded == codec.decode_response(1, version, frame)[1]
    for topic in decoded.responses:
        for pd in topic.partitions:
            if pd.records:
                assert isinstance(pd.records, memoryview) and pd.records.obj is frame
    assert codec.encode_response(decoded, 7) == frame


def test_a_frame_the_walk_cannot_follow_keeps_kio_copies() -> None:
    frame = codec.encode_response(_response(12), 7)
    _, decoded = codec.decode_response(1, 12, frame + b"\x00")  # trailing byte: kio ignores it
    assert records_as_views(decoded, 12, frame + b"\x00") is decoded


@pytest.mark.parametrize("version", [4, 11, 12, 13, 16, 17, 18])
@pytest.mark.parametrize("copy_below", [1, 16, 64 * 1024])
def test_gathered_reply_references_the_upstream_records(version: int, copy_below: int) -> None:
    upstream = codec.encode_response(_response(version), 7)
    _, decoded = codec.decode_response(1, version, upstream)
    viewed = records_as_views(decoded, version, upstream)
    reply = codec.encode_response_gathered(viewed, 99, copy_below=copy_below)
    assert reply.join() == codec.encode_response(viewed, 99)
    assert len(reply) == len(reply.join())
    assert codec.peek_correlation_id(bytes(reply.head)) == 99
    # Records of copy_below bytes or more go out as views of the upstream frame:
    # the reply adds no second copy of them.
    referenced = [p for p in reply.parts if isinstance(p, memoryview) and p.obj is upstream]
    expected = [
        pd.records
        for t in viewed.responses
        for pd in t.partitions
        if pd.records is not None and len(pd.records) >= copy_below
    ]
    assert [bytes(p) for p in referenced] == [bytes(r) for r in expected]
    for a, b in zip(reply.parts, reply.parts[1:], strict=False):  # small runs were joined
        assert len(a) >= copy_below or len(b) >= copy_below
