"""Relay: correlation ids, response order with pipelining, acks=0, the Fetch plug-in point."""

from __future__ import annotations

import datetime
import struct

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.metadata.v1 import request as md1req
from kio.schema.metadata.v1 import response as md1
from kio.schema.produce.v9 import request as p9
from kio.schema.types import BrokerId
from kio.static.primitive import i16, i32, i32Timedelta

from proxy.protocol import codec
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import Gathered
from proxy.relay.relay import ClientRequest, Relay, Upstream, produce_acks

ZERO = i32Timedelta.parse(datetime.timedelta(0))
EMPTY_MD = md1.MetadataResponse(brokers=(), controller_id=BrokerId(1), topics=())


def resolve(node_id: int, host: str, port: int) -> tuple[str, int]:
    return ("proxy", 9000 + node_id)


def metadata_request(cid: int) -> bytes:
    return codec.encode_request(md1req.MetadataRequest(topics=None), cid, "app")


def produce_request(cid: int, acks: int, version: int = 9) -> bytes:
    req = p9.ProduceRequest(transactional_id="tx", acks=i16(acks), timeout=ZERO, topic_data=())
    frame = codec.encode_request(req, cid, "app")
    if version != 9:  # same layout for our purpose, header v2 only for 9+
        raise AssertionError
    return frame


def fetch_request(cid: int) -> bytes:
    req = fetch12.FetchRequest(max_wait=ZERO, min_bytes=i32(1), topics=(), forgotten_topics_data=())
    return codec.encode_request(req, cid, "app")


def upstream_cid(frame: bytes) -> int:
    return int(struct.unpack_from(">i", frame, 4)[0])


def opaque_response(cid: int, payload: bytes) -> bytes:
    return struct.pack(">i", cid) + payload


def test_own_correlation_ids_and_client_ids_restored_in_order() -> None:
    relay = Relay(resolve)
    # OffsetCommit-like opaque requests (api key 8): pass-through, never decoded
    requests = [struct.pack(">hhi", 8, 2, cid) + b"\xff\xffbody" for cid in (1000, 7, -5)]
    for r in requests:
        relay.client_frame(r)
    sent = relay.take_upstream()
    assert [f[8:] for f in sent] == [r[8:] for r in requests]  # body untouched
    ups = [upstream_cid(f) for f in sent]
    assert len(set(ups)) == 3
    for u, tag in zip(ups, [b"a", b"b", b"c"], strict=True):
        relay.upstream_frame(opaque_response(u, tag))
    out = relay.take_client()
    assert out == [opaque_response(1000, b"a"), opaque_response(7, b"b"), opaque_response(-5, b"c")]
    assert relay.in_flight == 0


def test_acks_zero_produce_has_no_response_and_does_not_stall() -> None:
    relay = Relay(resolve)
    relay.client_frame(produce_request(1, acks=1))
    relay.client_frame(produce_request(2, acks=0))
    relay.client_frame(metadata_request(3))
    sent = relay.take_upstream()
    assert len(sent) == 3 and relay.in_flight == 2 and relay.pending_upstream == 2
    relay.upstream_frame(opaque_response(upstream_cid(sent[0]), b"\x00produce"))
    md = md1.MetadataResponse(
        brokers=(
            md1.MetadataResponseBroker(node_id=BrokerId(2), host="real", port=i32(1), rack=None),
        ),
        controller_id=BrokerId(2),
        topics=(),
    )
    relay.upstream_frame(codec.encode_response(md, upstream_cid(sent[2])))
    out = relay.take_client()
    assert [codec.peek_correlation_id(f) for f in out] == [1, 3]
    assert codec.decode_response(3, 1, out[1])[1].brokers[0].port == 9002


def test_produce_acks_parsed_for_legacy_and_flexible_versions() -> None:
    flexible = codec.parse_request_header(produce_request(1, acks=0))
    assert produce_acks(flexible, produce_request(1, acks=0)) == 0
    from kio.schema.produce.v3 import request as p3

    legacy = codec.encode_request(
        p3.ProduceRequest(transactional_id=None, acks=i16(-1), timeout=ZERO, topic_data=()), 1, None
    )
    assert produce_acks(codec.parse_request_header(legacy), legacy) == -1


def test_out_of_order_upstream_response_is_a_protocol_error() -> None:
    relay = Relay(resolve)
    relay.client_frame(metadata_request(1))
    relay.client_frame(metadata_request(2))
    sent = relay.take_upstream()
    with pytest.raises(ProtocolError):
        relay.upstream_frame(opaque_response(upstream_cid(sent[1]), b""))


def test_unsolicited_upstream_response_is_a_protocol_error() -> None:
    relay = Relay(resolve)
    with pytest.raises(ProtocolError):
        relay.upstream_frame(opaque_response(0, b""))


def test_in_flight_bound() -> None:
    relay = Relay(resolve, max_in_flight=2)
    relay.client_frame(metadata_request(1))
    relay.client_frame(produce_request(2, acks=0))  # takes no slot
    relay.client_frame(metadata_request(3))
    assert not relay.can_accept
    with pytest.raises(ProtocolError):
        relay.client_frame(metadata_request(4))
    sent = relay.take_upstream()
    relay.upstream_frame(codec.encode_response(EMPTY_MD, upstream_cid(sent[0])))
    assert relay.can_accept


def test_short_or_garbage_client_frame_is_a_protocol_error() -> None:
    relay = Relay(resolve)
    with pytest.raises(ProtocolError):
        relay.client_frame(b"\x00\x01")


def test_too_new_api_versions_answered_by_the_proxy() -> None:
    relay = Relay(resolve)
    relay.client_frame(struct.pack(">hhi", 18, 99, 42) + b"\x00\x00")
    assert relay.take_upstream() == []
    (resp,) = relay.take_client()
    cid, body = codec.decode_response(18, 0, resp)
    assert cid == 42 and body.error_code == ErrorCode.unsupported_version


class ReorderingFetch:
    """A handler exercising the plug-in: internal request first, then a replaced Fetch."""

    def __init__(self) -> None:
        self.internal: list[bytes] = []
        self.observed: list[int] = []
        self.requests: list[ClientRequest] = []

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None:
        self.requests.append(request)
        upstream.send(
            metadata_request(0), api_key=3, api_version=1, on_response=self.internal.append
        )
        replaced = request.frame + b""  # a handler could build a wholly different request

        def on_response(frame: bytes) -> None:
            request.reply(frame[:4] + b"SYNTHESIZED")

        upstream.send(replaced, api_key=1, api_version=12, on_response=on_response)

    def observe(self, api_key: int, api_version: int, frame: bytes) -> None:
        self.observed.append(api_key)


def test_fetch_handler_plug_in_internal_requests_and_ordering() -> None:
    handler = ReorderingFetch()
    relay = Relay(resolve, fetch_handler=handler)
    relay.client_frame(fetch_request(10))
    relay.client_frame(struct.pack(">hhi", 8, 2, 11) + b"\xff\xff")  # opaque, after the fetch
    sent = relay.take_upstream()
    assert [struct.unpack_from(">h", f)[0] for f in sent] == [3, 1, 8]
    ups = [upstream_cid(f) for f in sent]
    relay.upstream_frame(opaque_response(ups[0], b"internal"))
    assert relay.take_client() == []  # internal response consumed, never forwarded
    assert handler.internal == [opaque_response(ups[0], b"internal")]
    relay.upstream_frame(opaque_response(ups[1], b"upstream-fetch"))
    relay.upstream_frame(opaque_response(ups[2], b"commit"))
    out = relay.take_client()
    assert out == [opaque_response(10, b"SYNTHESIZED"), opaque_response(11, b"commit")]
    assert handler.observed == [8]


class Holding:
    """A FetchHandler that keeps each Fetch for the test to answer."""

    def __init__(self) -> None:
        self.held: list[ClientRequest] = []

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None:
        self.held.append(request)

    def observe(self, api_key: int, api_version: int, frame: bytes) -> None:
        return None


def test_late_reply_holds_back_later_responses() -> None:
    handler = Holding()
    relay = Relay(resolve, fetch_handler=handler)
    relay.client_frame(fetch_request(1))
    relay.client_frame(metadata_request(2))
    (sent,) = relay.take_upstream()
    relay.upstream_frame(codec.encode_response(EMPTY_MD, upstream_cid(sent)))
    assert relay.take_client() == []  # the Fetch before it is not answered yet
    handler.held[0].reply(opaque_response(0, b"late"))
    out = relay.take_client()
    assert [codec.peek_correlation_id(f) for f in out] == [1, 2]
    with pytest.raises(ProtocolError):
        handler.held[0].reply(opaque_response(0, b"again"))


def test_gathered_reply_keeps_its_parts_and_gets_the_client_correlation_id() -> None:
    handler = Holding()
    relay = Relay(resolve, fetch_handler=handler)
    relay.client_frame(fetch_request(41))
    relay.client_frame(fetch_request(42))
    records = memoryview(b"R" * 100_000)
    right = Gathered((struct.pack(">i", 41) + b"\x00\x00", records, b"\x00"))
    wrong = Gathered((b"\x00\x00\x00\x09\x00\x00", records, b"\x01"))
    handler.held[0].reply(right)
    handler.held[1].reply(wrong)
    first, second = relay.take_client()
    assert first is right  # already the client's id: kept as it is
    assert isinstance(second, Gathered)
    assert bytes(second.head) == struct.pack(">i", 42) + b"\x00\x00"
    assert second.parts[1] is records and len(second) == len(wrong)
    short = Gathered((b"\x00\x00", b"\x00\x07", b"tail"))  # id split across parts: joined
    relay.client_frame(fetch_request(43))
    handler.held[2].reply(short)
    assert relay.take_client() == [struct.pack(">i", 43) + b"tail"]


def test_upstream_correlation_ids_wrap() -> None:
    relay = Relay(resolve)
    relay._next_cid = 2**31 - 1
    relay.client_frame(metadata_request(1))
    relay.client_frame(metadata_request(2))
    assert [upstream_cid(f) for f in relay.take_upstream()] == [2**31 - 1, 0]


def sasl_handshake_v0(cid: int, mechanism: str) -> bytes:
    raw = mechanism.encode()
    return struct.pack(">hhi", 17, 0, cid) + b"\x00\x03app" + struct.pack(">h", len(raw)) + raw


def test_sasl_v0_raw_tokens_pass_untouched_then_normal_relaying_resumes() -> None:
    relay = Relay(resolve)
    relay.client_frame(sasl_handshake_v0(1, "SCRAM-SHA-256"))
    (hs,) = relay.take_upstream()
    relay.upstream_frame(struct.pack(">i", upstream_cid(hs)) + b"\x00\x00" + b"\x00\x00\x00\x00")
    assert codec.peek_correlation_id(relay.take_client()[0]) == 1
    # two raw exchanges: no Kafka header on either side, bytes untouched
    for token, answer in (
        (b"n,,n=user,r=abc", b"r=abcdef,s=c2FsdA==,i=4096"),
        (b"c=biws,p=xx", b"v=yy"),
    ):
        assert relay.client_frame(token) is None
        assert relay.take_upstream() == [token]
        relay.upstream_frame(answer)
        assert relay.take_client() == [answer]
    # the next frame is a normal request again
    relay.client_frame(metadata_request(9))
    (md,) = relay.take_upstream()
    assert md[8:] == metadata_request(9)[8:]


def test_sasl_v0_failed_handshake_stays_in_normal_mode() -> None:
    relay = Relay(resolve)
    relay.client_frame(sasl_handshake_v0(1, "PLAIN"))
    (hs,) = relay.take_upstream()
    relay.upstream_frame(struct.pack(">i", upstream_cid(hs)) + b"\x00\x21" + b"\x00\x00\x00\x00")
    relay.take_client()
    header = relay.client_frame(metadata_request(2))
    assert header is not None and header.correlation_id == 2  # parsed as a normal request
    assert relay.in_flight == 1


def test_sasl_v0_unknown_mechanism_closes() -> None:
    relay = Relay(resolve)
    relay.client_frame(sasl_handshake_v0(1, "GSSAPI"))
    (hs,) = relay.take_upstream()
    with pytest.raises(ProtocolError):
        relay.upstream_frame(
            struct.pack(">i", upstream_cid(hs)) + b"\x00\x00" + b"\x00\x00\x00\x00"
        )
