import datetime

import pytest
from kio.schema.fetch.v12.request import FetchPartition, FetchRequest, FetchTopic
from kio.schema.metadata.v12.response import MetadataResponse
from kio.static.primitive import i32, i32Timedelta, i64

from proxy.protocol import codec
from proxy.protocol.errors import DecodeError


def fetch_request() -> FetchRequest:
    return FetchRequest(
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=500)),
        min_bytes=i32(1),
        topics=(
            FetchTopic(
                topic="t",
                partitions=(
                    FetchPartition(
                        partition=i32(0), fetch_offset=i64(7), partition_max_bytes=i32(9)
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
    )


def test_request_roundtrip_with_header_v2() -> None:
    frame = codec.encode_request(fetch_request(), correlation_id=99, client_id="app-1")
    header, body = codec.decode_request(frame, strict=True)
    assert (header.api_key, header.api_version, header.correlation_id) == (1, 12, 99)
    assert header.client_id == "app-1" and header.header_version == 2
    assert body == fetch_request()


def test_unknown_api_has_readable_prefix() -> None:
    frame = b"\x7f\x00\x00\x03\x00\x00\x00\x05\x00\x01z" + b"junk"
    h = codec.parse_request_header(frame)
    assert (h.api_key, h.api_version, h.correlation_id, h.client_id) == (0x7F00, 3, 5, "z")
    assert h.body_offset is None
    with pytest.raises(DecodeError):
        codec.decode_request(frame)


def test_trailing_bytes_ignored_like_kafka_unless_strict() -> None:
    frame = codec.encode_request(fetch_request(), correlation_id=1, client_id=None) + b"\x00\x01"
    _, body = codec.decode_request(frame)
    assert body == fetch_request()
    with pytest.raises(DecodeError):
        codec.decode_request(frame, strict=True)


def test_api_versions_response_always_header_v0() -> None:
    assert codec.response_header_version(18, 3) == 0
    assert codec.response_header_version(3, 12) == 1
    assert codec.response_header_version(3, 8) == 0


def test_response_roundtrip() -> None:
    resp = MetadataResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        brokers=(),
        cluster_id="c",
        controller_id=i32(1),
        topics=(),
    )
    frame = codec.encode_response(resp, 1234)
    cid, body = codec.decode_response(3, 12, frame, strict=True)
    assert cid == 1234 and body == resp
