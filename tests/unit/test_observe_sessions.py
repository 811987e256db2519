"""/debug/sessions: the snapshot of fetch sessions, bounded, served as JSON."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from proxy.observe.http import ObserveApp, Readiness
from proxy.observe.sessions import SessionEntry, sessions_snapshot
from proxy.sessions.client import FetchSessionClient, PartitionKey, SessionMetadata


@dataclass
class FakeSession:
    next_metadata: SessionMetadata
    session_partitions: tuple[PartitionKey, ...]


def entry(n: int, partitions: int) -> SessionEntry:
    keys = tuple(PartitionKey(f"topic-{n}", p) for p in range(partitions))
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
    assert str(PartitionKey(topic_id, 3)) == f"{topic_id}-3"  # how partition names render
