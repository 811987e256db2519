"""Property tests for the relay: ordering under any pipelining, and only ProtocolError escapes."""

from __future__ import annotations

import datetime
import struct
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.produce.v9 import request as p9
from kio.static.primitive import Records, i16, i32Timedelta

from proxy.protocol import codec
from proxy.protocol.errors import ProtocolError
from proxy.relay import rewrite
from proxy.relay.relay import Relay

ZERO = i32Timedelta.parse(datetime.timedelta(0))
st.register_type_strategy(Records, st.binary(max_size=40).map(Records.parse))


def resolve(node_id: int, host: str, port: int) -> tuple[str, int]:
    return ("proxy", 9000 + node_id % 1000)


def produce(cid: int, acks: int) -> bytes:
    req = p9.ProduceRequest(transactional_id=None, acks=i16(acks), timeout=ZERO, topic_data=())
    return codec.encode_request(req, cid, "c")


def opaque(cid: int) -> bytes:
    return struct.pack(">hhi", 8, 2, cid) + b"\xff\xff"


@settings(max_examples=200, deadline=None)
@given(
    kinds=st.lists(st.sampled_from(["opaque", "acks0", "acks1"]), min_size=1, max_size=40),
    cids=st.lists(st.integers(-(2**31), 2**31 - 1), min_size=40, max_size=40),
    answer_after=st.lists(st.integers(0, 5), min_size=40, max_size=40),
)
def test_responses_leave_in_request_order_with_client_ids(
    kinds: list[str], cids: list[int], answer_after: list[int]
) -> None:
    relay = Relay(resolve, max_in_flight=1000)
    upstream_queue: list[bytes] = []
    expected: list[int] = []
    received: list[bytes] = []
    for i, kind in enumerate(kinds):
        frame = (
            opaque(cids[i]) if kind == "opaque" else produce(cids[i], 0 if kind == "acks0" else 1)
        )
        relay.client_frame(frame)
        if kind != "acks0":
            expected.append(cids[i])
        sent = relay.take_upstream()  # one upstream frame per client request
        if kind != "acks0":  # acks=0 Produce: the broker never answers
            upstream_queue += sent
        # the broker answers some of what it has, in order, at random moments
        for _ in range(min(answer_after[i], len(upstream_queue))):
            req = upstream_queue.pop(0)
            relay.upstream_frame(req[4:8] + b"resp")
            received += relay.take_client()
    while upstream_queue:
        req = upstream_queue.pop(0)
        relay.upstream_frame(req[4:8] + b"resp")
        received += relay.take_client()
    assert [codec.peek_correlation_id(f) for f in received] == expected
    assert all(f[4:] == b"resp" for f in received)
    assert relay.in_flight == 0 and relay.pending_upstream == 0


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200))
def test_only_protocol_error_escapes_from_client_frames(data: bytes) -> None:
    relay = Relay(resolve)
    try:
        relay.client_frame(data)
    except ProtocolError:
        pass


SCHEMAS = [
    (k, v)
    for k in sorted(rewrite.REWRITTEN_APIS)
    for v in range(20)
    if codec.response_schema(k, v) is not None and rewrite.needs_rewrite(k, v)
]


@st.composite
def damaged(draw: st.DrawFn) -> tuple[int, int, bytes]:
    api_key, version = draw(st.sampled_from(SCHEMAS))
    obj: Any = draw(st.from_type(codec.response_schema(api_key, version)))
    frame = bytearray(codec.encode_response(obj, 1))
    for _ in range(draw(st.integers(1, 4))):
        how = draw(st.sampled_from(["flip", "cut", "grow"]))
        if how == "flip" and frame:
            i = draw(st.integers(0, len(frame) - 1))
            frame[i] = draw(st.integers(0, 255))
        elif how == "cut":
            del frame[draw(st.integers(0, len(frame))) :]
        else:
            frame += draw(st.binary(min_size=1, max_size=8))
    return api_key, version, bytes(frame)


@settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(damaged())
def test_only_protocol_error_escapes_from_damaged_responses(case: tuple[int, int, bytes]) -> None:
    api_key, version, frame = case
    try:
        rewrite.rewrite_response(api_key, version, frame, resolve)
    except ProtocolError:
        pass
