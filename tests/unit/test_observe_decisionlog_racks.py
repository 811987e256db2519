"""Decision logs carry rack-aware fetching: bytes by rack, cost avoided, by topic; v2 validates."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import jsonschema
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.observe.decisionlog import SCHEMA_VERSION, event_from_shaping
from proxy.relay import racks
from proxy.relay.racks import RackMap, account
from proxy.sessions.topic_ids import TopicIdMap

SCHEMA = json.loads(
    (Path(__file__).resolve().parents[2] / "schemas" / "decision-log.schema.json").read_text()
)
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)
ORDERS_ID = uuid.UUID("6c1c9a52-3a4b-4b5e-9a77-4f3f0b1f2a10")


class NoLimits:
    def as_dict(self) -> Mapping[str, int | None]:
        return {}


@dataclass(frozen=True)
class FakeDecision:
    """What proxy.shaping's ShapingDecision reports (read structurally)."""

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
    delivered_bytes: int = 1350
    delivered_records: int = 10
    buffered_bytes: int = 0
    dropped_partial_bytes: int = 0
    limited_by: frozenset[str] = frozenset()
    progress_exemption: bool = False
    limits: NoLimits = field(default_factory=NoLimits)


def rack_b() -> RackMap:
    m = RackMap("b")
    for node, rack in ((1, "a"), (2, "b"), (3, "c")):
        m.learn_broker(node, rack)
    for p, leader in ((0, 1), (1, 2), (2, 3)):
        m.learn_leader("orders", p, leader)
        m.learn_leader(ORDERS_ID, p, leader)
    return m


def event(**kwargs: object) -> dict[str, object]:
    e = event_from_shaping(
        FakeDecision(upstream_bytes=1350),
        timestamp_ms=1,
        client_id="app",
        node_id=2,
        policy="default",
        correlation_id=1,
        latency_ms=1.0,
        sample_rate=1.0,
        **kwargs,  # type: ignore[arg-type]
    )
    obj = e.to_json_obj()
    VALIDATOR.validate(obj)
    return obj


def test_bytes_by_rack_cost_inputs_and_topics_by_name() -> None:
    ids = TopicIdMap()
    ids.learn("orders", ORDERS_ID)
    usage = account(
        rack_b(),
        [((ORDERS_ID, 0), 2, 1000), ((ORDERS_ID, 2), 3, 300), (("logs", 0), None, 50)],
    )
    obj = event(
        rack_usage=usage,
        cross_zone_price_per_gb=0.02,
        preferred_replica_redirects=3,
        topic_ids=ids,
    )
    assert obj["schema_version"] == SCHEMA_VERSION == 2
    assert obj["rack"] == "b"
    assert (
        obj["same_rack_record_bytes"],
        obj["other_rack_record_bytes"],
        obj["unknown_rack_record_bytes"],
        obj["cross_zone_avoided_record_bytes"],
    ) == (1000, 300, 50, 1000)
    assert obj["cross_zone_price_per_gb"] == 0.02
    assert obj["preferred_replica_redirects"] == 3
    assert obj["rack_by_topic"] == [
        {
            "topic": "orders",  # named from its id
            "topic_id": str(ORDERS_ID),
            "same_rack_record_bytes": 1000,
            "other_rack_record_bytes": 300,
            "unknown_rack_record_bytes": 0,
            "cross_zone_avoided_record_bytes": 1000,
        },
        {
            "topic": "logs",
            "topic_id": None,
            "same_rack_record_bytes": 0,
            "other_rack_record_bytes": 0,
            "unknown_rack_record_bytes": 50,
            "cross_zone_avoided_record_bytes": 0,
        },
    ]


def test_without_rack_accounting_every_upstream_byte_is_of_unknown_rack() -> None:
    obj = event()
    assert obj["rack"] is None and obj["rack_by_topic"] == []
    assert obj["unknown_rack_record_bytes"] == 1350
    assert obj["same_rack_record_bytes"] == obj["cross_zone_avoided_record_bytes"] == 0
    assert obj["cross_zone_price_per_gb"] is None


@settings(max_examples=60, deadline=None)
@given(
    rack=st.one_of(st.none(), st.text(max_size=300)),
    served=st.lists(
        st.tuples(
            st.one_of(st.text(max_size=300), st.uuids(), st.none()),
            st.integers(0, 2),
            st.one_of(st.none(), st.integers(0, 4)),
            st.integers(0, 2**40),
        ),
        max_size=150,
    ),
    price=st.one_of(st.none(), st.floats(0, 10)),
)
def test_every_rack_event_validates(
    rack: str | None,
    served: list[tuple[object, int, int | None, int]],
    price: float | None,
) -> None:
    m = rack_b()
    m.rack = rack[: racks.MAX_RACK_CHARS] if rack else None
    usage = account(m, [((t, p), node, n) for t, p, node, n in served])  # type: ignore[misc]
    obj = event(rack_usage=usage, cross_zone_price_per_gb=price)
    topics = obj["rack_by_topic"]
    assert isinstance(topics, list) and len(topics) <= racks.MAX_TOPICS_PER_USAGE + 1
    assert sum(t["same_rack_record_bytes"] for t in topics) == obj["same_rack_record_bytes"]
