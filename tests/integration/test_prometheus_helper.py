"""Real Prometheus scrapes the proxy's real /metrics endpoint (observe.http) on loopback.

This checks the test helper in tests/support/prometheus.py and that the
exposition is something Prometheus ingests: names, labels, histograms, values
that change between scrapes.  The scrape of a running proxy under client load
(test_prometheus_proxy.py) builds on the same helper.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import trio
from prometheus_client import CollectorRegistry
from support.prometheus import PrometheusServer, run_prometheus

from proxy.observe.http import ObserveApp, Readiness, serve_http
from proxy.observe.labels import CloseCause, Direction
from proxy.observe.metrics import CATALOGUE, Metrics
from proxy.shaping.limits import LimitKind

pytestmark = pytest.mark.integration

P = "kafka_fetch_proxy_"
TIMEOUT = 90
T = TypeVar("T")


DASHBOARD = Path(__file__).resolve().parents[2] / "deploy/grafana/kafka-fetch-proxy-dashboard.json"


def dashboard_queries() -> list[str]:
    """The dashboard's panel queries with Grafana's variables filled in."""
    panels = json.loads(DASHBOARD.read_text())["panels"]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    assert exprs
    return [
        e.replace("$__rate_interval", "1m").replace("$job", ".*").replace("$instance", ".*")
        for e in exprs
    ]


async def in_thread(fn: Callable[..., T], *args: Any) -> T:
    """Blocking helper calls run in a thread so this loop keeps serving scrapes."""
    return await trio.to_thread.run_sync(fn, *args, abandon_on_cancel=True)


async def test_prometheus_scrapes_the_observe_endpoint(tmp_path: Path) -> None:
    metrics = Metrics(CollectorRegistry())
    for _ in range(3):
        metrics.connection_accepted()
    metrics.connection_closed(CloseCause.PEER_CLOSED)
    metrics.request(1, Direction.CLIENT_TO_PROXY, 300)
    metrics.response(1, Direction.BROKER_TO_PROXY, 20_000, node=2)
    metrics.trimmed(LimitKind.MAX_RECORDS, records=40, record_bytes=4000, policy="default")
    metrics.set_memory_budget(used=1 << 20, limit=64 << 20)
    app = ObserveApp(metrics.registry, lambda: Readiness.of(listeners_bound=True))

    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            with run_prometheus([f"127.0.0.1:{port}"], tmp_path / "prom") as prom:
                assert isinstance(prom, PrometheusServer)
                await in_thread(prom.wait_for_scrape)

                value = prom.value
                assert await in_thread(value, f"{P}client_connections_open") == 2
                assert await in_thread(value, f"{P}client_connections_accepted_total") == 3
                closed = f'{P}client_connections_closed_total{{cause="peer_closed"}}'
                assert await in_thread(value, closed) == 1
                trimmed = f'{P}trimmed_records_total{{limit="max_records",policy="default"}}'
                assert await in_thread(value, trimmed) == 40
                count = f'{P}client_to_proxy_request_size_bytes_count{{api="fetch"}}'
                assert await in_thread(value, count) == 1
                bucket = (
                    f'{P}broker_to_proxy_response_size_bytes_bucket{{api="fetch",le="65536.0"}}'
                )
                assert await in_thread(value, bucket) == 1
                assert await in_thread(value, f"{P}memory_budget_limit_bytes") == 64 << 20

                names = await in_thread(prom.series_names)
                for spec in CATALOGUE:
                    if spec.kind != "histogram" and not spec.labels:
                        assert spec.name in names, spec.name

                # every dashboard query is valid PromQL over these series
                # (a syntax error would be an HTTP 400, raised by prom.query)
                with_data = 0
                for expr in dashboard_queries():
                    with_data += bool(await in_thread(prom.query, expr))
                assert with_data >= 5  # rate() needs two scrapes; gauges answer at once

                # later scrapes see later values
                for _ in range(5):
                    metrics.connection_accepted()
                await in_thread(
                    prom.wait_until, f"{P}client_connections_accepted_total", lambda v: v == 8
                )
            nursery.cancel_scope.cancel()
