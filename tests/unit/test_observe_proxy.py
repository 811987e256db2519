"""The running Proxy reports every leg of its traffic and exposes its live connections.

An in-process dev cluster behind an in-process Proxy, raw Kafka frames (no client
library): request/response counts per direction and API, broker bytes per node,
latency histograms; the live-connection registry that /debug/sessions reads;
the decision log the proxy was given.
"""

from __future__ import annotations

import io
from typing import Any

import trio
import trio.testing
from kio.schema.metadata.v12.request import MetadataRequest
from support.loopback import API_VERSIONS, request, settings

from devbroker.cluster import DevCluster
from proxy.observe.decisionlog import DecisionLog, FractionSampler
from proxy.observe.metrics import Metrics
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder
from proxy.server.proxy import Proxy

P = "kafka_fetch_proxy_"
METADATA = codec.encode_request(
    MetadataRequest(
        topics=None,
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    ),
    8,
    "observed-app",
)


async def test_every_leg_is_counted_and_timed_and_live_connections_are_listed() -> None:
    metrics = Metrics(process_metrics=False)
    decisions = DecisionLog(io.StringIO(), sampler=FractionSampler(1.0), metrics=metrics)

    def value(name: str, **labels: str) -> float:
        got = metrics.registry.get_sample_value(P + name, labels)
        return 0.0 if got is None else got

    with trio.fail_after(20):
        async with DevCluster(nodes=1) as cluster, trio.open_nursery() as nursery:
            proxy: Any = await nursery.start(
                Proxy(settings(cluster.bootstrap), metrics=metrics, decision_log=decisions).serve
            )
            assert proxy.decision_log is decisions
            await proxy.discovered.wait()
            conn = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(0)[1])
            decoder = FrameDecoder(1 << 20)
            await request(conn, decoder, API_VERSIONS)
            await request(conn, decoder, METADATA)
            (live,) = proxy.live.values()
            assert live.node_id == 0 and live.connection.client_id == "observed-app"
            # no Fetch yet: no upstream session
            empty = {"total": 0, "truncated": False, "partitions_cached": 0, "sessions": []}
            assert proxy.debug_sessions() == {**empty, "downstream": empty}
            calls: list[int] = []
            proxy.metrics_refreshers.append(lambda: calls.append(1))
            proxy.refresh_metrics()
            assert calls == [1]
            await conn.aclose()
            with trio.move_on_after(5):
                while proxy.live:
                    await trio.testing.wait_all_tasks_blocked()
            assert not proxy.live
            nursery.cancel_scope.cancel()

    for api in ("api_versions", "metadata"):
        for name in (
            "client_to_proxy_requests_total",
            "proxy_to_broker_requests_total",
            "broker_to_proxy_responses_total",
            "proxy_to_client_responses_total",
            "broker_request_duration_seconds_count",
            "client_request_duration_seconds_count",
        ):
            assert value(name, api=api) == 1, (name, api)
        assert value("proxy_to_client_response_size_bytes_sum", api=api) > 0
    # what went to and came from broker 0, per node
    sent = sum(
        value("proxy_to_broker_request_size_bytes_sum", api=a) for a in ("api_versions", "metadata")
    )
    received = sum(
        value("broker_to_proxy_response_size_bytes_sum", api=a)
        for a in ("api_versions", "metadata")
    )
    assert (
        value("proxy_to_broker_bytes_total", node="0") == sent == len(API_VERSIONS) + len(METADATA)
    )
    assert value("broker_to_proxy_bytes_total", node="0") == received > 0
    assert value("client_request_duration_seconds_sum", api="metadata") >= value(
        "broker_request_duration_seconds_sum", api="metadata"
    )


def test_the_shutdown_summary_reports_a_peak_only_against_a_budget() -> None:
    """Without a budget nothing is refused, so the accounted peak bounds nothing and is
    left out."""
    from proxy.server.cli import budget_summary
    from proxy.shaping.budget import MemoryBudget

    unlimited = MemoryBudget(2**62)
    for _ in range(3):  # three responses of 50 MiB, accounted
        assert unlimited.try_reserve(52_428_800) is not None
    assert budget_summary(None, unlimited, 0) == {"limit_bytes": None, "count": 0}

    budget = MemoryBudget(64 << 20, floor=1 << 20)
    grant = budget.reservation()  # nothing while the fetch waits upstream
    assert grant.try_grow(4 << 20)  # its response's size, known from its length prefix
    grant.resize(1000)  # what the decoded response held
    grant.release()
    assert budget_summary(64 << 20, budget, 2) == {
        "limit_bytes": 64 << 20,
        "peak_bytes": 4 << 20,
        "overshoot_bytes": 0,
        "count": 2,
    }
