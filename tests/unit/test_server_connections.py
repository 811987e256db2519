"""Client connections cost nothing upstream until they send a request, and must send one soon.

The whole proxy in front of an in-process dev cluster over loopback (run-time ports):
an accepted connection opens its broker connection only when its first request is
relayed (requests the proxy answers itself need none), and a connection that sends no
whole request within ``first_request_timeout_seconds`` of its accept is closed with a
log line and a metric, so idle sockets cannot hold every ``max_connections`` slot for
the idle timeout (10 minutes by default).
"""

from __future__ import annotations

import struct

import pytest
import structlog
import trio
from support.dev_proxy import proxy_on_dev_cluster
from support.loopback import API_VERSIONS, METADATA, free_port, request, settings
from support.trio_waits import closed_by_peer, until

from proxy import config
from proxy.observe.metrics import Metrics
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.server.proxy import CLIENT_CLOSED_HINT, Proxy

P = "kafka_fetch_proxy_"
TIMEOUT = 20

UNSUPPORTED_API_VERSIONS = struct.pack(">hhi", 18, 99, 5) + b"\x00\x01t"
"""ApiVersions v99: the proxy answers it itself (UNSUPPORTED_VERSION), as Kafka does."""


def counter(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(P + name, labels) or 0.0


def total(metrics: Metrics, family: str) -> float:
    """A family's value summed over its label sets (brokers are labelled by node)."""
    return sum(
        s.value
        for f in metrics.registry.collect()
        if f.name == P + family
        for s in f.samples
        if s.name in (P + family, P + family + "_total")
    )


def upstream_opened(metrics: Metrics) -> float:
    return total(metrics, "broker_connections_opened")


async def test_connections_open_no_broker_connection_until_their_first_relayed_request() -> None:
    metrics = Metrics(process_metrics=False)
    with trio.fail_after(TIMEOUT):
        async with proxy_on_dev_cluster(metrics=metrics) as proxy:
            port = proxy.bootstrap.port
            idle = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(10)]
            for _ in range(10):  # connect and go (a TCP probe, a port scan)
                await (await trio.open_tcp_stream("127.0.0.1", port)).aclose()
            await until(lambda: counter(metrics, "client_connections_accepted_total") == 20)
            await until(lambda: proxy.open_connections == 10)
            assert upstream_opened(metrics) == 0

            # what the proxy answers itself needs no broker either
            asked = await trio.open_tcp_stream("127.0.0.1", port)
            decoder = FrameDecoder(1 << 20)
            reply = await request(asked, decoder, UNSUPPORTED_API_VERSIONS)
            assert struct.unpack(">ih", reply[:6]) == (5, 35)  # UNSUPPORTED_VERSION
            assert upstream_opened(metrics) == 0

            # the first relayed request opens exactly one, and it serves the connection
            reply = await request(asked, decoder, API_VERSIONS)
            assert codec.decode_response(18, 3, reply)[0] == 7
            await request(asked, decoder, METADATA)
            assert upstream_opened(metrics) == 1
            assert total(metrics, "broker_connections_open") == 1
            for stream in [*idle, asked]:
                await stream.aclose()
            await until(lambda: proxy.open_connections == 0)
    assert counter(metrics, "client_connections_closed_total", cause="peer_closed") == 21


async def test_a_connection_without_a_whole_request_soon_after_its_accept_is_closed() -> None:
    metrics = Metrics(process_metrics=False)
    with trio.fail_after(TIMEOUT), structlog.testing.capture_logs() as logs:
        async with proxy_on_dev_cluster(
            first_request_timeout_seconds=0.5, metrics=metrics
        ) as proxy:
            port = proxy.bootstrap.port
            served = await trio.open_tcp_stream("127.0.0.1", port)
            decoder = FrameDecoder(1 << 20)
            await request(served, decoder, API_VERSIONS)
            silent = await trio.open_tcp_stream("127.0.0.1", port)
            trickle = await trio.open_tcp_stream("127.0.0.1", port)
            await trickle.send_all(encode_frame(API_VERSIONS)[:7])  # never the rest
            assert await closed_by_peer(silent)
            assert await closed_by_peer(trickle)
            # its deadline has passed too: the connection that sent a request stays served
            await request(served, decoder, METADATA)
            await served.aclose()
            await until(lambda: proxy.open_connections == 0)
    closed = [e for e in logs if e.get("reason") == "first_request_timeout"]
    assert len(closed) == 2
    assert all(e["event"] == "connection_closed" and e["timeout_seconds"] == 0.5 for e in closed)
    assert "--first-request-timeout-seconds" in closed[0]["hint"]
    assert counter(metrics, "client_connections_closed_total", cause="first_request_timeout") == 2
    assert upstream_opened(metrics) == 1  # the served connection's only


async def test_a_client_whose_broker_cannot_be_reached_is_closed_with_one_line() -> None:
    metrics = Metrics(process_metrics=False)
    upstream = f"127.0.0.1:{free_port()}"  # nothing listens
    with trio.fail_after(TIMEOUT), structlog.testing.capture_logs() as logs:
        async with trio.open_nursery() as nursery:
            proxy = await nursery.start(Proxy(settings(upstream), metrics=metrics).serve)
            client = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap.port)
            await client.send_all(encode_frame(API_VERSIONS))
            assert await closed_by_peer(client)
            await until(lambda: proxy.open_connections == 0)
            nursery.cancel_scope.cancel()
    (closed,) = [e for e in logs if e["event"] == "connection_closed"]
    assert closed["reason"] == "upstream_unreachable" and closed["hint"] == CLIENT_CLOSED_HINT
    assert any(e["event"] == "upstream_connect_failed" for e in logs)
    assert upstream_opened(metrics) == 0
    assert counter(metrics, "client_connections_closed_total", cause="other") == 1


def test_first_request_timeout_is_a_setting() -> None:
    from proxy.cli import build_parser

    assert config.validate({"upstream": ["k:1"]}).first_request_timeout_seconds == 10
    env = {
        "KAFKA_FETCH_PROXY_UPSTREAM": "k:1",
        "KAFKA_FETCH_PROXY_FIRST_REQUEST_TIMEOUT_SECONDS": "2.5",
    }
    settings_ = config.load(env=env)
    assert settings_.first_request_timeout_seconds == 2.5
    values, sources = config.effective(settings_)  # what check-config shows
    assert values["first_request_timeout_seconds"] == 2.5
    assert sources["first_request_timeout_seconds"] == (
        "environment KAFKA_FETCH_PROXY_FIRST_REQUEST_TIMEOUT_SECONDS"
    )
    args = build_parser().parse_args(
        ["run", "--upstream", "k:1", "--first-request-timeout-seconds", "0"]
    )
    assert config.from_args(args, {}).first_request_timeout_seconds == 0  # 0: no limit
    with pytest.raises(config.ConfigError, match=r"first_request_timeout_seconds.*>= 0"):
        config.validate({"upstream": ["k:1"], "first_request_timeout_seconds": -1})


async def test_stopping_closes_connections_that_have_not_sent_a_byte() -> None:
    metrics = Metrics(process_metrics=False)
    async with proxy_on_dev_cluster(metrics=metrics) as proxy:
        silent = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap.port)
        with trio.fail_after(5):  # well before the 10 s first_request_timeout_seconds
            await until(lambda: proxy.open_connections == 1)
            await proxy.drain()
            assert await closed_by_peer(silent)
    assert counter(metrics, "client_connections_closed_total", cause="shutdown") == 1
