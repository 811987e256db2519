"""/debug/sessions: the snapshot of fetch sessions, bounded, served as JSON."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from proxy.observe.http import ObserveApp, Readiness
from proxy.observe.session_snapshot import SessionEntry, sessions_snapshot
from proxy.protocol.partition_key import PartitionKey, partition_name
from proxy.sessions.as_client_session import FetchSessionClient, SessionMetadata


@dataclass
class FakeSession:
    next_metadata: SessionMetadata
    session_partitions: tuple[PartitionKey, ...]


def entry(n: int, partitions: int) -> SessionEntry:
    keys = tuple((f"topic-{n}", p) for p in range(partitions))
    return SessionEntry(f"c{n}", f"app-{n}", n % 3, FakeSession(SessionMetadata(100 + n, 7), keys))


def test_snapshot_lists_sessions_most_partitions_first() -> None:
    snap = sessions_snapshot([entry(1, 2), entry(2, 5), entry(3, 0)])
    assert snap["total"] == 3
    assert snap["truncated"] is False
    assert snap["partitions_cached"] == 7
    assert [s["connection"] for s in snap["sessions"]] == ["c2", "c1", "c3"]
    assert snap["sessions"][0] == {
        "connection": "c2",
        "client_id": "app-2",
        "node_id": 2,
        "session_id": 102,
        "epoch": 7,
        "partitions": 5,
    }


def test_snapshot_is_bounded() -> None:
    snap = sessions_snapshot(
        [entry(n, n) for n in range(50)], limit=10, with_partitions=True, partition_limit=3
    )
    assert snap["total"] == 50 and snap["truncated"] is True
    assert len(snap["sessions"]) == 10
    first = snap["sessions"][0]
    assert first["partitions"] == 49
    assert len(first["partition_names"]) == 3 and first["partition_names_truncated"] is True


def test_a_real_session_client_and_the_endpoint() -> None:
    client = FetchSessionClient()
    topic_id = uuid.UUID(int=1)
    entries = [SessionEntry("c1", None, 0, client), entry(2, 1)]
    app = ObserveApp(
        CollectorRegistry(),
        lambda: Readiness(True),
        debug_sessions=lambda: sessions_snapshot(entries, with_partitions=True),
    )
    response = app.handle("GET", "/debug/sessions")
    assert response.status == 200
    body = json.loads(response.body)
    fresh = next(s for s in body["sessions"] if s["connection"] == "c1")
    assert fresh["session_id"] == client.next_metadata.session_id
    assert fresh["epoch"] == client.next_metadata.epoch
    assert fresh["partitions"] == 0 and fresh["client_id"] is None
    assert partition_name((topic_id, 3)) == f"{topic_id}-3"  # how partition names render


class FakeCache:
    def __init__(self, sessions: int, partitions: int, evictions: int) -> None:
        self.num_sessions = sessions
        self.num_partitions = partitions
        self.evictions = evictions


@dataclass
class FakeHandler:
    """Shaped like the fetch path's handlers (the sessions part of ``relay.FetchHandler``)."""

    upstream_session: FakeSession | None
    session_cache: FakeCache


def handler(session_id: int, partitions: int, cache: FakeCache) -> FakeHandler:
    keys = tuple(("t", p) for p in range(partitions))
    return FakeHandler(FakeSession(SessionMetadata(session_id, 1), keys), cache)


def test_session_gauges_read_live_handlers_at_scrape_time() -> None:
    from proxy.observe.metrics import Metrics
    from proxy.observe.session_snapshot import SessionGauges

    metrics = Metrics(process_metrics=False)
    value = metrics.registry.get_sample_value
    gauges = SessionGauges(metrics)
    shared, other = FakeCache(3, 30, 2), FakeCache(1, 4, 0)
    handlers = [
        handler(11, 5, shared),
        handler(12, 7, shared),  # the same cache counts once
        handler(0, 0, other),  # no upstream session open (id 0)
        FakeHandler(None, other),  # not fetched yet
    ]
    gauges.refresh(handlers)
    P = "kafka_fetch_proxy_"
    assert value(P + "fetch_sessions_active", {"side": "upstream"}) == 2
    assert value(P + "fetch_session_partitions_cached", {"side": "upstream"}) == 12
    assert value(P + "fetch_sessions_active", {"side": "downstream"}) == 4
    assert value(P + "fetch_session_partitions_cached", {"side": "downstream"}) == 34
    assert value(P + "fetch_session_evictions_total", {"side": "downstream"}) == 2
    shared.evictions = 5
    gauges.refresh(handlers[:1])
    assert value(P + "fetch_session_evictions_total", {"side": "downstream"}) == 5
    assert value(P + "fetch_sessions_active", {"side": "upstream"}) == 1
    gauges.refresh([])
    assert value(P + "fetch_sessions_active", {"side": "downstream"}) == 0
    assert value(P + "fetch_session_evictions_total", {"side": "downstream"}) == 5


@dataclass
class FakeDownstreamSession:
    id: int
    epoch: int
    size: int
    privileged: bool = False


class FakeSessionCache:
    def __init__(self, *sessions: FakeDownstreamSession) -> None:
        self._sessions = list(sessions)

    def sessions(self) -> list[FakeDownstreamSession]:
        return list(self._sessions)


def test_snapshot_lists_downstream_sessions_bounded() -> None:
    caches = [
        FakeSessionCache(FakeDownstreamSession(7, 3, 2), FakeDownstreamSession(8, 1, 9, True)),
        FakeSessionCache(*(FakeDownstreamSession(100 + n, 1, 1) for n in range(5))),
    ]
    snap = sessions_snapshot([entry(1, 2)], downstream=caches, limit=3)
    assert snap["total"] == 1 and snap["sessions"][0]["connection"] == "c1"
    down = snap["downstream"]
    assert down["total"] == 7 and down["truncated"] is True
    assert down["partitions_cached"] == 2 + 9 + 5
    assert down["sessions"][:2] == [
        {"session_id": 8, "epoch": 1, "partitions": 9, "privileged": True},
        {"session_id": 7, "epoch": 3, "partitions": 2, "privileged": False},
    ]
    assert len(down["sessions"]) == 3
    assert "downstream" not in sessions_snapshot([])


def test_the_fetch_paths_handlers_hold_sessions_and_the_pass_through_none() -> None:
    from proxy.fetchpath import FetchPath, FetchPathConfig
    from proxy.observe.metrics import Metrics
    from proxy.observe.session_snapshot import SessionGauges
    from proxy.relay.relay import FetchHandler, PassThroughFetch

    path = FetchPath(FetchPathConfig())
    h: FetchHandler = path.handler(1)
    assert h.upstream_session is None  # no fetch yet
    assert h.session_cache is path.sessions_for(1)
    relay: FetchHandler = PassThroughFetch()
    assert relay.upstream_session is None and relay.session_cache is None
    metrics = Metrics(process_metrics=False)
    SessionGauges(metrics).refresh([h, relay])  # both read through the one protocol
    value = metrics.registry.get_sample_value
    assert value("kafka_fetch_proxy_fetch_sessions_active", {"side": "upstream"}) == 0
    assert value("kafka_fetch_proxy_fetch_sessions_active", {"side": "downstream"}) == 0
