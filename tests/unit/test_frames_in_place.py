"""Upstream frames read in place (``FrameDecoder``'s *preallocate*: a ``bytearray``) reach
only the Fetch path as they are; every other response callback gets ``bytes``."""

from __future__ import annotations

import datetime

from kio.static.primitive import i32Timedelta
from support.fetch_model import batch, make_partition, make_response

from proxy.protocol import codec
from proxy.protocol.codec import drain
from proxy.protocol.fetch_views import decode_fetch_response_in_ranges
from proxy.protocol.framing import Frame
from proxy.relay.relay import FrameCallback, Relay

ZERO = i32Timedelta.parse(datetime.timedelta(0))


def _to_proxy(node: int, host: str, port: int) -> tuple[str, int]:
    return host, port


def test_a_relayed_response_read_in_place_reaches_the_client_as_bytes() -> None:
    relay = Relay(_to_proxy)
    request = codec.encode_request(
        codec.request_schema(18, 3)(client_software_name="t", client_software_version="1"),  # type: ignore[misc]
        7,
        "c",
    )
    relay.client_frame(request)
    [sent] = relay.take_upstream()
    response = codec.encode_response(
        codec.response_schema(18, 3)(error_code=0, api_keys=(), throttle_time=ZERO),  # type: ignore[misc]
        int.from_bytes(sent[4:8], "big"),  # the correlation id the relay gave it upstream
    )
    relay.upstream_frame(bytearray(response))
    [out] = relay.take_client()
    assert type(out) is bytes


def test_a_frame_callback_gets_the_very_bytearray_and_others_a_copy() -> None:
    relay = Relay(_to_proxy)
    got: list[Frame] = []
    port = relay._upstream_port
    port.send(b"\x00" * 12, api_key=1, api_version=12, on_response=FrameCallback(got.append))
    port.send(b"\x00" * 12, api_key=1, api_version=12, on_response=got.append)
    sent = relay.take_upstream()
    assert len(sent) == 2
    # a request header: api key, version, then the correlation id the relay gave it
    first, second = (bytearray(bytes(frame[4:8]) + b"abc") for frame in sent)
    relay.upstream_frame(first)
    relay.upstream_frame(second)
    assert got[0] is first and type(got[1]) is bytes and got[1] == second


def test_a_fetch_response_read_in_place_decodes_as_bytes_do_with_read_only_record_views() -> None:
    response = make_response(12, [make_partition(12, p, batch(0, 3), hw=3) for p in range(4)])
    frame = codec.encode_response(response, 5)
    in_place = bytearray(frame)
    got = drain(decode_fetch_response_in_ranges(12, in_place, 2))
    assert got == drain(decode_fetch_response_in_ranges(12, frame, 0))
    for topic in got.responses:
        for p in topic.partitions:
            assert isinstance(p.records, memoryview) and p.records.readonly
            assert p.records.obj is in_place  # a view of the frame, not a copy
