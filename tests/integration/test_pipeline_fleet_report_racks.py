"""The fleet report's rack tables, on ``local[*]`` and on a real standalone Spark cluster.

The decision-log lines are built by the proxy's own code (``proxy.relay.racks.account``
then ``proxy.observe.decisionlog.event_from_shaping``) for a proxy in rack b in front of
brokers in racks a, b and c: two pods, three clients, a topic fetched by id (named in
some events, only by id in others), sample rates 1 and 0.5, events with and without a
price, and one schema-version-1 event (before rack-aware fetching).  Every number the
Spark job writes is checked against totals computed here with plain Python.

The same job then runs on a standalone cluster (a master and two workers on loopback,
started from PySpark's own ``spark-class``, ports chosen by the JVMs), and each worker
must have run an executor of it.  Both runs are applications of one driver JVM
(``support.spark_cluster.end_application`` between them).
"""

from __future__ import annotations

import json
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from support.spark_cluster import end_application, standalone_cluster

from proxy.observe.decisionlog import event_from_shaping
from proxy.relay.racks import RackMap, account
from proxy.sessions.topic_ids import TopicIdMap

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("spark")]
"""Group ``spark``: one worker runs the fleet report's tests in one driver JVM."""

ORDERS_ID = uuid.UUID("6c1c9a52-3a4b-4b5e-9a77-4f3f0b1f2a10")
DEFAULT_PRICE = 0.03  # the report's --cross-zone-price-per-gb, for events without a price
RACK_TABLES = ("rack_by_client", "rack_by_topic", "rack_by_client_topic")
"""Only these are built (the other tables have their own test): fewer Spark jobs."""
RACK_COLUMNS = (
    "same_rack_record_bytes",
    "other_rack_record_bytes",
    "unknown_rack_record_bytes",
    "cross_zone_avoided_record_bytes",
)


class NoLimits:
    def as_dict(self) -> Mapping[str, int | None]:
        return {}


@dataclass(frozen=True)
class Decision:
    upstream_bytes: int
    api_version: int = 13
    requested_max_bytes: int = 1 << 20
    upstream_max_bytes: int = 1 << 20
    partitions: int = 3
    partitions_with_data: int = 3
    partitions_served: int = 3
    partitions_trimmed: int = 0
    partitions_starved: int = 0
    max_starvation: int = 0
    upstream_records: int = 10
    reused_bytes: int = 0
    delivered_bytes: int = 0
    delivered_records: int = 10
    buffered_bytes: int = 0
    dropped_partial_bytes: int = 0
    limited_by: frozenset[str] = frozenset()
    progress_exemption: bool = False
    limits: NoLimits = field(default_factory=NoLimits)


def _racks() -> RackMap:
    m = RackMap("b")
    for node, rack in ((1, "a"), (2, "b"), (3, "c")):
        m.learn_broker(node, rack)
    for p, leader in ((0, 1), (1, 2), (2, 3)):
        m.learn_leader(ORDERS_ID, p, leader)
        m.learn_leader("logs", p, leader)
    return m


def _events() -> dict[str, list[dict[str, Any]]]:
    racks = _racks()
    named = TopicIdMap()
    named.learn("orders", ORDERS_ID)
    files: dict[str, list[dict[str, Any]]] = {"pod-a": [], "pod-b": []}
    clients = ("app-1", "app-2", None)
    for i in range(36):
        pod = "pod-a" if i % 2 else "pod-b"
        served = [
            ((ORDERS_ID, i % 3), 2, 1000 + 17 * i),  # broker 2 (rack b): followed or led
            (("logs", i % 3), 1 + i % 3, 300 + i),  # the leader wherever it is
        ]
        if i % 5 == 0:
            served.append((("logs", 0), None, 50))  # the bootstrap connection: unknown
        usage = account(racks, served)
        event = event_from_shaping(
            Decision(upstream_bytes=sum(n for _, _, n in served)),
            timestamp_ms=1_700_000_000_000 + i,
            client_id=clients[i % 3],
            node_id=2,
            policy="default",
            correlation_id=i,
            latency_ms=1.0,
            sample_rate=0.5 if i % 4 == 0 else 1.0,
            instance=pod,
            topic_ids=named if i % 6 else None,  # some events name orders only by id
            rack_usage=usage,
            cross_zone_price_per_gb=None if i % 7 == 0 else (0.05 if pod == "pod-a" else 0.02),
            preferred_replica_redirects=i % 4,
        )
        files[pod].append(event.to_json_obj())
    # a proxy from before rack-aware fetching: schema version 1, no rack fields
    old = dict(files["pod-a"][1])
    for key in (*RACK_COLUMNS, "rack", "cross_zone_price_per_gb"):
        old.pop(key)
    old.pop("preferred_replica_redirects")
    old.pop("rack_by_topic")
    old.update(schema_version=1, instance="pod-old", client_id="app-1")
    files["pod-old"] = [old]
    return files


def _expected(lines: list[dict[str, Any]]) -> dict[str, Any]:
    names = {
        t["topic_id"]: t["topic"]
        for e in lines
        for t in e.get("rack_by_topic", [])
        if t["topic_id"] and t["topic"] != t["topic_id"]
    }
    by_client: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_topic: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    by_pair: dict[tuple[str, str], dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for e in lines:
        w = 1 / e["sample_rate"]
        price = e.get("cross_zone_price_per_gb")
        price = DEFAULT_PRICE if price is None else price
        client = e["client_id"] or "(null)"
        c = by_client[client]
        c["events"] += 1
        c["same_rack_record_bytes"] += w * e.get("same_rack_record_bytes", 0)
        c["other_rack_record_bytes"] += w * e.get("other_rack_record_bytes", 0)
        c["unknown_rack_record_bytes"] += w * e.get(
            "unknown_rack_record_bytes", e["upstream_record_bytes"]
        )
        c["cross_zone_avoided_record_bytes"] += w * e.get("cross_zone_avoided_record_bytes", 0)
        c["cost_avoided"] += w * e.get("cross_zone_avoided_record_bytes", 0) / 1e9 * price
        c["preferred_replica_redirects"] += w * e.get("preferred_replica_redirects", 0)
        for t in e.get("rack_by_topic", []):
            topic = names.get(t["topic_id"] or t["topic"], t["topic"]) or "(other topics)"
            for table in (by_topic[topic], by_pair[(client, topic)]):
                for col in RACK_COLUMNS:
                    table[col] += w * t[col]
                table["cost_avoided"] += w * t["cross_zone_avoided_record_bytes"] / 1e9 * price
    for table in (*by_client.values(), *by_topic.values(), *by_pair.values()):
        known = table["same_rack_record_bytes"] + table["other_rack_record_bytes"]
        table["in_rack_share"] = table["same_rack_record_bytes"] / known if known else None
    return {"client": by_client, "topic": by_topic, "pair": by_pair}


def _check(tables: dict[str, list[dict[str, Any]]], expected: dict[str, Any]) -> None:
    def same(row: Mapping[str, Any], want: Mapping[str, float]) -> None:
        for col, value in want.items():
            if value is None:
                assert row[col] is None, col
            else:
                assert row[col] == pytest.approx(value, rel=1e-9, abs=1e-12), (col, row)

    got = {r["client_id"]: r for r in tables["rack_by_client"]}
    assert set(got) == set(expected["client"]) == {"app-1", "app-2", "(null)"}
    for client, want in expected["client"].items():
        same(got[client], want)
    got = {r["topic"]: r for r in tables["rack_by_topic"]}
    assert set(got) == set(expected["topic"]) == {"orders", "logs"}  # the id named
    for topic, want in expected["topic"].items():
        same(got[topic], want)
    got = {(r["client_id"], r["topic"]): r for r in tables["rack_by_client_topic"]}
    assert set(got) == set(expected["pair"])
    for pair, want in expected["pair"].items():
        same(got[pair], want)


def test_rack_tables_on_local_and_on_a_standalone_cluster(tmp_path: Path) -> None:
    from pipeline import fleet_report

    logs = tmp_path / "logs"
    logs.mkdir()
    files = _events()
    for pod, events in files.items():
        (logs / f"{pod}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    lines = [e for events in files.values() for e in events]
    expected = _expected(lines)
    # the data is what the test means: rack b's follower avoided bytes, some crossed zones
    assert expected["topic"]["orders"]["cross_zone_avoided_record_bytes"] > 0
    assert expected["topic"]["logs"]["other_rack_record_bytes"] > 0
    assert expected["client"]["app-1"]["unknown_rack_record_bytes"] > 0  # the v1 event

    end_application()  # an application of its own for each master below (one driver JVM)
    try:
        local = fleet_report.run(
            [str(logs)],
            str(tmp_path / "local"),
            cross_zone_price_per_gb=DEFAULT_PRICE,
            tables_wanted=RACK_TABLES,
        )
    finally:
        end_application()
    assert local["events"] == len(lines) and local["other_versions"] == 0
    _check(local["tables"], expected)  # type: ignore[arg-type]
    assert set(local["tables"]) == set(RACK_TABLES)  # type: ignore[arg-type]
    assert sorted(p.name for p in (tmp_path / "local").glob("*.png")) == ["racks.png"]

    with standalone_cluster(tmp_path / "spark") as cluster:
        try:
            remote = fleet_report.run(
                [str(logs)],
                str(tmp_path / "cluster"),
                master=cluster.master_url,
                cross_zone_price_per_gb=DEFAULT_PRICE,
                tables_wanted=RACK_TABLES,
            )
        finally:
            end_application()  # the application ends before its workers do
        executors = cluster.executor_dirs()
    assert remote["events"] == len(lines)
    _check(remote["tables"], expected)  # type: ignore[arg-type]
    assert all(executors), f"each worker runs an executor of the job: {executors}"
