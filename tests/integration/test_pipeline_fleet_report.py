"""The fleet report over decision logs captured from real proxy runs.

Two proxy processes (two "pods") shape the fetches of real confluent-kafka
consumers under tight limits and write decision logs; the Spark job reads both
files, and every number it writes is checked against totals computed here
independently, with plain Python, from the same log lines.
"""

from __future__ import annotations

import json
import math
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from support.procs import devbroker, proxy

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("spark")]
"""Group ``spark``: one worker runs the fleet report's tests in one driver JVM."""

TOPIC = "fleet"
PARTITIONS = 4
RECORDS = 1200
DEADLINE_S = 60.0


def _produce(bootstrap: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.num.messages": 8})
    for i in range(RECORDS):
        producer.produce(TOPIC, value=b"v%d" % i, partition=i % PARTITIONS)
    assert producer.flush(30) == 0


def _consume_all(bootstrap: str, client_id: str) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fleet-{client_id}",
            "client.id": client_id,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    seen = 0
    deadline = time.monotonic() + DEADLINE_S
    while seen < RECORDS:
        assert time.monotonic() < deadline, f"{client_id} consumed {seen}/{RECORDS} in time"
        msg = consumer.poll(0.5)
        if msg is not None and msg.error() is None:
            seen += 1
    consumer.close()
    return seen


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (Spark's ``percentile``)."""
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _independent_totals(lines: list[dict[str, Any]]) -> dict[str, Any]:
    # the name of each topic id, from events that carry both (topic ids are Fetch v13+)
    names = {
        s["topic_id"]: s["topic"]
        for e in lines
        for s in e["starved_partitions"]
        if s.get("topic_id") and s["topic"] != s["topic_id"]
    }
    hits: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    savings: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    trimmed: dict[str, float] = defaultdict(float)
    latency: dict[str, list[float]] = defaultdict(list)
    starved: dict[tuple[str, int], list[int]] = defaultdict(list)
    for e in lines:
        w = 1 / e["sample_rate"]
        for limit in e["limits_applied"]:
            hits[(e["policy"], limit)][0] += 1
            hits[(e["policy"], limit)][1] += w
        inst = e["instance"] or "(unnamed)"
        savings[inst][0] += w * (e["sessionless_fetch_bytes"] - e["upstream_fetch_bytes"])
        savings[inst][1] += w * e["reused_record_bytes"]
        trimmed[e["policy"]] += w * (
            e["upstream_record_bytes"] + e["reused_record_bytes"] - e["delivered_record_bytes"]
        )
        latency[e["client_id"] or "(null)"].append(e["latency_ms"])
        for s in e["starved_partitions"]:
            topic = names.get(s.get("topic_id") or s["topic"], s["topic"])
            starved[(topic, s["partition"])].append(s["rounds"])
    return {
        "hits": hits,
        "savings": savings,
        "trimmed": trimmed,
        "latency": latency,
        "starved": starved,
    }


def test_fleet_report_matches_independent_totals(tmp_path: Path) -> None:
    import matplotlib.image

    from pipeline import fleet_report

    logs = tmp_path / "logs"
    logs.mkdir()
    # tight enough that a response leaves partitions with data unserved (starved)
    limits = [
        "--max-records",
        "12",
        "--max-partition-records",
        "10",
        "--decision-log-sample-rate",
        "1",
    ]
    with devbroker(f"{TOPIC}:{PARTITIONS}") as upstream:
        for pod in ("pod-a", "pod-b"):
            with proxy(
                upstream, *limits, "--instance", pod, "--decision-log", str(logs / f"{pod}.jsonl")
            ) as p:
                if pod == "pod-a":
                    _produce(p.lines["bootstrap"])
                assert _consume_all(p.lines["bootstrap"], f"consumer-{pod}") == RECORDS

    lines = [
        json.loads(line)
        for f in sorted(logs.iterdir())
        for line in f.read_text().splitlines()
        if line.strip()
    ]
    assert {e["instance"] for e in lines} == {"pod-a", "pod-b"}
    assert any(e["limits_applied"] for e in lines), "the limits never held data back"
    # librdkafka fetches by topic id (Fetch v13+); the proxy names the topics anyway
    starved = [s for e in lines for s in e["starved_partitions"]]
    assert starved, "no partition was ever starved"
    assert {e["api_version"] for e in lines} and min(e["api_version"] for e in lines) >= 13
    assert {s["topic"] for s in starved} == {TOPIC}
    topic_id = starved[0]["topic_id"]
    assert topic_id and {s["topic_id"] for s in starved} == {topic_id}
    # An older proxy's file: the topic as its id, no topic_id (named from the events
    # above), and an id no event names (shown as the id).
    unknown_id = "00000000-0000-4000-8000-000000000001"
    old = []
    for topic, partition in ((topic_id, 0), (unknown_id, 1)):
        event = json.loads(json.dumps(lines[0]))
        event["instance"] = "pod-old"
        event["starved_partitions"] = [{"topic": topic, "partition": partition, "rounds": 7}]
        old.append(event)
    (logs / "pod-old.jsonl").write_text("".join(json.dumps(e) + "\n" for e in old))
    lines += old
    expected = _independent_totals(lines)
    assert (TOPIC, 0) in expected["starved"] and (unknown_id, 1) in expected["starved"]

    result = fleet_report.run([str(logs)], str(tmp_path / "report"))
    tables = result["tables"]
    assert result["events"] == len(lines) and result["malformed"] == 0

    got_hits = {(r["policy"], r["limit"]): r for r in tables["limit_hits_by_policy"]}
    assert set(got_hits) == set(expected["hits"])
    for key, (n, weighted) in expected["hits"].items():
        assert got_hits[key]["events"] == n
        assert got_hits[key]["estimated_responses"] == pytest.approx(weighted)

    got_savings = {r["instance"]: r for r in tables["savings"]}
    assert set(got_savings) == set(expected["savings"])
    for inst, (session_saved, reuse_saved) in expected["savings"].items():
        assert got_savings[inst]["session_saved_bytes"] == pytest.approx(session_saved)
        assert got_savings[inst]["reuse_saved_bytes"] == pytest.approx(reuse_saved)

    got_trimmed = {r["policy"]: r["trimmed_record_bytes"] for r in tables["trimmed"]}
    assert got_trimmed == pytest.approx(dict(expected["trimmed"]))
    assert sum(got_trimmed.values()) > 0

    got_latency = {r["client_id"]: r for r in tables["latency_by_client"]}
    assert set(got_latency) == set(expected["latency"])
    for client, values in expected["latency"].items():
        assert got_latency[client]["events"] == len(values)
        assert got_latency[client]["max_ms"] == pytest.approx(max(values))
        assert got_latency[client]["p99_ms"] == pytest.approx(_percentile(values, 0.99))
        assert got_latency[client]["p50_ms"] == pytest.approx(_percentile(values, 0.5))

    got_starved = {(r["topic"], r["partition"]): r for r in tables["starvation_by_partition"]}
    assert set(got_starved) == set(expected["starved"])
    got_ids = {r["topic"]: r["topic_id"] for r in tables["starvation_by_partition"]}
    assert got_ids == {TOPIC: topic_id, unknown_id: None}  # an id nobody named stays as it is
    for key, rounds in expected["starved"].items():
        assert got_starved[key]["max_rounds"] == max(rounds)
        assert got_starved[key]["p99_rounds"] == pytest.approx(_percentile(rounds, 0.99))

    out = tmp_path / "report"
    html = (out / "report.html").read_text()
    assert "fleet report" in html
    assert f"<td>{TOPIC}</td>" in html
    labels = fleet_report.partition_labels(tables["starvation_by_partition"])  # the chart's
    assert f"{TOPIC}-0" in labels and not any(label.startswith(topic_id) for label in labels)
    pngs = sorted(out.glob("*.png"))
    assert len(pngs) == 5  # starvation, limit hits, latency, savings, racks
    for png in pngs:
        assert png.name in html
        image = matplotlib.image.imread(png)
        assert image.shape[0] > 100 and image.shape[1] > 100
