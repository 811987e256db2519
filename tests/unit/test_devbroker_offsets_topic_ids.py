"""OffsetCommit and OffsetFetch v10 (topics by id) on the dev cluster, and the response
shapes KafkaApis gives every version (checked against Kafka 4.4 by
tests/integration/test_differential.py)."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from kio.schema.errors import ErrorCode as E
from support.dispatch import Harness

from devbroker.admin import coordinator_node
from devbroker.offsets import timeline_hash_map_order
from devbroker.versions import SUPPORTED

COMMIT, FETCH_OFFSETS = 8, 9
GROUP = "g"
UNKNOWN = uuid.UUID("00000000-0000-4000-8000-000000000001")
ZERO = uuid.UUID(int=0)


@pytest.fixture
def h() -> Harness:
    return Harness(3, {"orders": 2, "audit": 1})


def tid(h: Harness, topic: str) -> uuid.UUID:
    return h.state.topics[topic].topic_id


def coord(h: Harness) -> int:
    return coordinator_node(h.state.node_ids, GROUP)


def parts(*offsets: tuple[int, int]) -> list[dict[str, Any]]:
    return [
        {
            "partition_index": p,
            "committed_offset": o,
            "committed_leader_epoch": -1,
            "committed_metadata": f"m{p}",
        }
        for p, o in offsets
    ]


def commit(h: Harness, version: int, topics: list[dict[str, Any]], node: int | None = None) -> Any:
    req = h.request(
        COMMIT,
        version,
        {
            "group_id": GROUP,
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": topics,
        },
    )
    return h.call(coord(h) if node is None else node, req)


def shape(resp: Any, key: str) -> list[tuple[Any, list[tuple[int, E]]]]:
    return [
        (getattr(t, key), [(p.partition_index, p.error_code) for p in t.partitions])
        for t in resp.topics
    ]


def fetch(h: Harness, version: int, topics: list[dict[str, Any]] | None) -> Any:
    req = h.request(
        FETCH_OFFSETS,
        version,
        {
            "groups": [
                {"group_id": GROUP, "member_id": None, "member_epoch": -1, "topics": topics}
            ],
            "require_stable": False,
        },
    )
    group = h.call(coord(h), req).groups[0]
    assert group.error_code == E.none
    return group


def offsets(group: Any, key: str) -> list[tuple[Any, list[tuple[int, int, E]]]]:
    return [
        (
            getattr(t, key),
            [(p.partition_index, p.committed_offset, p.error_code) for p in t.partitions],
        )
        for t in group.topics
    ]


def test_v10_is_advertised() -> None:
    assert SUPPORTED[COMMIT] == (2, 10)
    assert SUPPORTED[FETCH_OFFSETS] == (1, 10)


def test_commit_v10_by_id_and_fetch_by_name_and_id(h: Harness) -> None:
    orders = tid(h, "orders")
    resp = commit(h, 10, [{"topic_id": orders, "partitions": parts((0, 5), (1, 7))}])
    assert shape(resp, "topic_id") == [(orders, [(0, E.none), (1, E.none)])]
    # Offsets are kept by name: a v9 fetch by name sees the v10 commit, and back.
    by_name = fetch(h, 9, [{"name": "orders", "partition_indexes": [1, 0]}])
    assert offsets(by_name, "name") == [("orders", [(1, 7, E.none), (0, 5, E.none)])]
    by_id = fetch(h, 10, [{"topic_id": orders, "partition_indexes": [0, 1, 9]}])
    assert offsets(by_id, "topic_id") == [
        (orders, [(0, 5, E.none), (1, 7, E.none), (9, -1, E.none)])
    ]
    everything = fetch(h, 10, None)
    assert offsets(everything, "topic_id") == [(orders, [(0, 5, E.none), (1, 7, E.none)])]


def test_commit_v10_unknown_ids_first_then_the_coordinators_answers(h: Harness) -> None:
    orders, audit = tid(h, "orders"), tid(h, "audit")
    resp = commit(
        h,
        10,
        [
            {"topic_id": UNKNOWN, "partitions": parts((0, 1), (2, 2))},
            {"topic_id": orders, "partitions": parts((3, 3), (1, 8))},
            {"topic_id": audit, "partitions": parts((0, 4))},
            {"topic_id": UNKNOWN, "partitions": parts((5, 1))},
            {"topic_id": ZERO, "partitions": parts((0, 1))},
        ],
    )
    # KafkaApis' builder: UNKNOWN_TOPIC_ID per unknown id (one topic per id), unknown
    # partitions of known topics, then the coordinator's topics merged in.
    assert shape(resp, "topic_id") == [
        (UNKNOWN, [(0, E.unknown_topic_id), (2, E.unknown_topic_id), (5, E.unknown_topic_id)]),
        (orders, [(3, E.unknown_topic_or_partition), (1, E.none)]),
        (None, [(0, E.unknown_topic_id)]),
        (audit, [(0, E.none)]),
    ]
    assert offsets(fetch(h, 9, [{"name": "audit", "partition_indexes": [0]}]), "name") == [
        ("audit", [(0, 4, E.none)])
    ]


def test_commit_with_nothing_valid_does_not_reach_the_coordinator(h: Harness) -> None:
    other = next(n for n in h.state.node_ids if n != coord(h))
    resp = commit(h, 10, [{"topic_id": UNKNOWN, "partitions": parts((0, 1))}], node=other)
    assert shape(resp, "topic_id") == [(UNKNOWN, [(0, E.unknown_topic_id)])]
    assert GROUP not in h.coordinator.groups
    resp = commit(h, 10, [{"topic_id": tid(h, "orders"), "partitions": parts((0, 1))}], other)
    assert shape(resp, "topic_id") == [(tid(h, "orders"), [(0, E.not_coordinator)])]


def test_commit_duplicate_topics_answered_per_request_topic(h: Harness) -> None:
    resp = commit(
        h,
        9,
        [
            {"name": "orders", "partitions": parts((0, 1))},
            {"name": "orders", "partitions": parts((1, 2))},
        ],
    )
    assert shape(resp, "name") == [("orders", [(0, E.none)]), ("orders", [(1, E.none)])]
    resp = commit(
        h,
        9,
        [
            {"name": "orders", "partitions": parts((3, 3), (0, 6))},
            {"name": "nope", "partitions": parts((0, 1))},
            {"name": "orders", "partitions": parts((1, 9))},
        ],
    )
    assert shape(resp, "name") == [
        ("orders", [(3, E.unknown_topic_or_partition), (0, E.none), (1, E.none)]),
        ("nope", [(0, E.unknown_topic_or_partition)]),
    ]


def test_fetch_v10_unknown_ids_follow_the_known_topics(h: Harness) -> None:
    orders = tid(h, "orders")
    commit(h, 10, [{"topic_id": orders, "partitions": parts((0, 5))}])
    group = fetch(
        h,
        10,
        [
            {"topic_id": UNKNOWN, "partition_indexes": [0]},
            {"topic_id": orders, "partition_indexes": [0]},
            {"topic_id": ZERO, "partition_indexes": [1]},
            {"topic_id": orders, "partition_indexes": [1]},
        ],
    )
    assert offsets(group, "topic_id") == [
        (orders, [(0, 5, E.none)]),
        (orders, [(1, -1, E.none)]),
        (UNKNOWN, [(0, -1, E.unknown_topic_id)]),
        (None, [(1, -1, E.unknown_topic_id)]),
    ]


def test_txn_offset_commit_answers_unknown_partitions_first_and_skips_the_coordinator(
    h: Harness,
) -> None:
    txn, group = 28, "txn-group"
    node = coordinator_node(h.state.node_ids, group)

    def txn_commit(topics: list[dict[str, Any]]) -> Any:
        req = h.request(
            txn,
            3,
            {
                "transactional_id": "tx",
                "group_id": group,
                "producer_id": 1,
                "producer_epoch": 0,
                "generation_id": -1,
                "member_id": "",
                "group_instance_id": None,
                "topics": topics,
            },
        )
        return h.call(node, req)

    # The transactional id is unknown: the coordinator refuses what reaches it, after
    # KafkaApis' own answers for unknown topics and partitions.
    resp = txn_commit(
        [
            {"name": "orders", "partitions": parts((0, 1), (7, 1))},
            {"name": "nope", "partitions": parts((0, 1))},
        ]
    )
    assert shape(resp, "name") == [
        ("orders", [(7, E.unknown_topic_or_partition), (0, E.invalid_producer_id_mapping)]),
        ("nope", [(0, E.unknown_topic_or_partition)]),
    ]
    resp = txn_commit([{"name": "nope", "partitions": parts((0, 1))}])
    assert shape(resp, "name") == [("nope", [(0, E.unknown_topic_or_partition)])]
    assert group not in h.coordinator.groups


@pytest.mark.parametrize(
    ("inserted", "kafka"),
    [  # partition orders Kafka 4.4 answered OffsetFetch (all topics) with
        ([7, 2, 5], [5, 2, 7]),
        ([4, 0], [0, 4]),
        ([6, 5, 4, 3, 2, 1, 0], [0, 5, 2, 4, 1, 6, 3]),
        ([7, 2, 5, 0, 6, 1, 3, 4], [0, 5, 2, 7, 4, 1, 6, 3]),
        ([4, 0, 3, 1, 2], [2, 0, 4, 1, 3]),
    ],
)
def test_timeline_hash_map_order_is_kafkas(inserted: list[int], kafka: list[int]) -> None:
    assert timeline_hash_map_order(inserted, lambda p: p) == kafka


def test_fetch_all_answers_in_kafkas_map_order(h: Harness) -> None:
    h.state.create_topic("wide", 8)
    commit(h, 9, [{"name": "wide", "partitions": parts(*[(p, p) for p in [7, 2, 5]])}])
    group = fetch(h, 9, None)
    assert offsets(group, "name") == [("wide", [(5, 5, E.none), (2, 2, E.none), (7, 7, E.none)])]
