"""Per-connection traffic metrics: every frame on the four legs, by API, sizes and latencies.

The meter alone (sans-I/O, told the time), then wired into a real ``Connection``
over in-memory streams with a fake broker.
"""

from __future__ import annotations

import datetime
import importlib
import struct

import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.schema.produce.v8.request import ProduceRequest
from kio.static.primitive import i16, i32, i32Timedelta

from proxy.observe.metrics import Metrics
from proxy.observe.traffic import TrafficMeter, fetch_error_code
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.relay.relay import Relay
from proxy.server.connection import Connection

P = "kafka_fetch_proxy_"


def new_metrics() -> Metrics:
    return Metrics(process_metrics=False)


def value(metrics: Metrics, name: str, **labels: str) -> float:
    got = metrics.registry.get_sample_value(P + name, labels)
    return 0.0 if got is None else got


def opaque_request(api_key: int, cid: int, body: bytes = b"") -> bytes:
    # header v1 (api key, version, correlation id, client id "app"), any body
    return struct.pack(">hhi", api_key, 2, cid) + b"\x00\x03app" + body


def produce(acks: int, cid: int) -> bytes:
    request = ProduceRequest(
        transactional_id=None,
        acks=i16(acks),
        timeout=i32Timedelta.parse(datetime.timedelta(seconds=1)),
        topic_data=(),
    )
    return codec.encode_request(request, cid, "app")


def test_requests_and_responses_on_each_leg_with_latencies() -> None:
    metrics = new_metrics()
    meter = TrafficMeter(metrics, node=3)
    commit = opaque_request(8, 1, b"x" * 10)
    meter.client_frame(codec.parse_request_header(commit), commit, now=10.0, expects=True)
    meter.upstream_sent([commit], now=10.5, kinds=[(8, True)])
    assert meter.awaiting == (1, 1)
    meter.upstream_frame(b"\x00\x00\x00\x00answer", now=12.0)
    done = meter.client_sent([b"\x00\x00\x00\x01answer!"])
    meter.client_written(done, now=13.0)
    assert meter.awaiting == (0, 0)

    assert value(metrics, "client_to_proxy_requests_total", api="offset_commit") == 1
    assert value(metrics, "client_to_proxy_request_size_bytes_sum", api="offset_commit") == len(
        commit
    )
    assert value(metrics, "proxy_to_broker_requests_total", api="offset_commit") == 1
    assert value(metrics, "proxy_to_broker_bytes_total", node="3") == len(commit)
    assert value(metrics, "broker_to_proxy_responses_total", api="offset_commit") == 1
    assert value(metrics, "broker_to_proxy_response_size_bytes_sum", api="offset_commit") == 10
    assert value(metrics, "broker_to_proxy_bytes_total", node="3") == 10
    assert value(metrics, "proxy_to_client_responses_total", api="offset_commit") == 1
    assert value(metrics, "proxy_to_client_response_size_bytes_sum", api="offset_commit") == 11
    assert value(metrics, "broker_request_duration_seconds_sum", api="offset_commit") == 1.5
    assert value(metrics, "client_request_duration_seconds_sum", api="offset_commit") == 3.0
    assert value(metrics, "client_request_duration_seconds_count", api="offset_commit") == 1


def test_pipelined_responses_are_matched_in_order_and_acks0_produce_is_not_awaited() -> None:
    """Fed what the relay parsed (each request's expects, the kinds of what it queued
    upstream): the acks=0 Produce is awaited on neither leg."""
    metrics = new_metrics()
    meter = TrafficMeter(metrics)
    relay = Relay(lambda node, host, port: (host, port))
    frames = [opaque_request(8, 1), produce(0, 2), produce(1, 3), opaque_request(3, 4)]
    for n, frame in enumerate(frames):
        header = relay.client_frame(frame)
        meter.client_frame(header, frame, now=float(n), expects=relay.last_expects)
    sent, kinds = relay.take_upstream_with_kinds()
    assert kinds == [(8, True), (0, False), (0, True), (3, True)]
    # a request the proxy makes itself (e.g. a Metadata lookup) goes upstream too
    own = opaque_request(3, 0)
    meter.upstream_sent([*sent, own], now=4.0, kinds=[*kinds, (3, True)])
    assert meter.awaiting == (3, 4)  # the acks=0 Produce is answered by nobody
    for _ in range(4):
        meter.upstream_frame(b"\x00\x00\x00\x00", now=5.0)
    meter.client_written(meter.client_sent([b"\x00" * 4] * 3), now=6.0)

    assert value(metrics, "client_to_proxy_requests_total", api="produce") == 2
    assert value(metrics, "proxy_to_broker_requests_total", api="produce") == 2
    assert value(metrics, "broker_to_proxy_responses_total", api="produce") == 1
    assert value(metrics, "proxy_to_client_responses_total", api="produce") == 1
    assert value(metrics, "broker_to_proxy_responses_total", api="metadata") == 2
    assert value(metrics, "proxy_to_client_responses_total", api="metadata") == 1
    # client latencies: commit arrived at 0, acks=1 produce at 2, metadata at 3; written at 6
    assert value(metrics, "client_request_duration_seconds_sum", api="offset_commit") == 6
    assert value(metrics, "client_request_duration_seconds_sum", api="produce") == 4
    assert value(metrics, "client_request_duration_seconds_sum", api="metadata") == 3
    assert value(metrics, "broker_to_proxy_bytes_total", node="unknown") == 16


def test_raw_sasl_tokens_count_as_sasl_authenticate() -> None:
    metrics = new_metrics()
    meter = TrafficMeter(metrics, node=0)
    token = b"\x00user\x00secret"  # no Kafka header: the first bytes are not an API key
    meter.client_frame(None, token, now=0.0, expects=True)
    meter.upstream_sent([token], now=0.0, kinds=[(36, True)])  # the relay's kind of it
    meter.upstream_frame(b"", now=1.0)
    meter.client_written(meter.client_sent([b""]), now=1.0)
    for name in (
        "client_to_proxy_requests_total",
        "proxy_to_broker_requests_total",
        "broker_to_proxy_responses_total",
        "proxy_to_client_responses_total",
    ):
        assert value(metrics, name, api="sasl_authenticate") == 1, name
    assert metrics.label_value_counts()[P + "proxy_to_broker_requests"] == 1


def test_unmatched_responses_are_counted_as_unknown_without_a_latency() -> None:
    metrics = new_metrics()
    meter = TrafficMeter(metrics)
    meter.upstream_frame(b"\x00\x00\x00\x07", now=1.0)
    meter.client_written(meter.client_sent([b"\x00\x00\x00\x07"]), now=1.0)
    assert value(metrics, "broker_to_proxy_responses_total", api="unknown") == 1
    assert value(metrics, "proxy_to_client_responses_total", api="unknown") == 1
    assert value(metrics, "broker_request_duration_seconds_count", api="unknown") == 0
    assert value(metrics, "client_request_duration_seconds_count", api="unknown") == 0


async def echo_broker(stream: trio.abc.Stream) -> None:
    """Answer every request that expects one with its correlation id and 5 bytes."""
    decoder = FrameDecoder(1 << 20)
    while data := await stream.receive_some(4096):
        decoder.feed(data)
        for frame in decoder.frames():
            await stream.send_all(encode_frame(frame[4:8] + b"hello"))


async def test_a_connection_reports_every_leg() -> None:
    metrics = new_metrics()
    client, proxy_client_side = trio.testing.memory_stream_pair()
    proxy_upstream_side, broker = trio.testing.memory_stream_pair()
    conn = Connection(
        proxy_client_side,
        proxy_upstream_side,
        Relay(lambda node, host, port: (host, port)),
        max_frame_bytes=1 << 20,
        meter=TrafficMeter(metrics, node=1),
    )
    requests = [opaque_request(8, cid) for cid in range(5)]

    async def run_conn() -> None:
        await conn.run()
        await trio.aclose_forcefully(proxy_client_side)
        await trio.aclose_forcefully(proxy_upstream_side)

    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_conn)
            nursery.start_soon(echo_broker, broker)
            await client.send_all(b"".join(encode_frame(r) for r in requests))
            decoder = FrameDecoder(1 << 20)
            got: list[bytes] = []
            while len(got) < len(requests):
                decoder.feed(await client.receive_some(4096))
                got += decoder.frames()
            assert [struct.unpack(">i", g[:4])[0] for g in got] == list(range(5))
            assert conn.client_id == "app"
            await client.aclose()
    for name in (
        "client_to_proxy_requests_total",
        "proxy_to_broker_requests_total",
        "broker_to_proxy_responses_total",
        "proxy_to_client_responses_total",
        "client_request_duration_seconds_count",
        "broker_request_duration_seconds_count",
    ):
        assert value(metrics, name, api="offset_commit") == 5, name
    assert value(metrics, "broker_to_proxy_bytes_total", node="1") == 5 * 9
    assert value(metrics, "proxy_to_client_response_size_bytes_sum", api="offset_commit") == 5 * 9


def fetch_response(version: int, error: int) -> bytes:
    module = importlib.import_module(f"kio.schema.fetch.v{version}.response")
    response = module.FetchResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        error_code=ErrorCode(error),
        session_id=i32(0),
        responses=(),
    )
    return codec.encode_response(response, 5)


def fetch_request_header(version: int) -> codec.RequestHeader:
    return codec.RequestHeader(1, version, 5, "app", 2 if version >= 12 else 1, 0)


def test_session_errors_to_the_client_count_as_downstream_resets() -> None:
    metrics = new_metrics()
    meter = TrafficMeter(metrics)
    cases = [(12, 70), (7, 71), (13, 106), (16, 0), (11, 70)]
    for version, _ in cases:
        meter.client_frame(fetch_request_header(version), b"\x00\x01", now=0.0, expects=True)
    assert fetch_error_code(12, fetch_response(12, 70)) == 70
    assert fetch_error_code(7, b"\x00\x00") is None  # too short: no error code
    meter.client_sent([fetch_response(v, e) for v, e in cases])

    def resets(reason: str) -> float:
        return value(metrics, "fetch_session_resets_total", side="downstream", reason=reason)

    assert resets("session_id_not_found") == 2
    assert resets("invalid_epoch") == 1
    assert resets("topic_id_error") == 1
    assert value(metrics, "fetch_session_resets_total", side="upstream", reason="other") == 0
    assert value(metrics, "proxy_to_client_responses_total", api="fetch") == 5


@given(st.integers(min_value=7, max_value=17), st.binary(max_size=64))
def test_reading_the_error_code_never_raises(version: int, frame: bytes) -> None:
    code = fetch_error_code(version, frame)
    assert code is None or -32768 <= code <= 32767
