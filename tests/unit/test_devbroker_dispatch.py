"""The dev cluster's dispatcher: ApiVersions, refusals, Metadata, CreateTopics, ListOffsets,
FindCoordinator and DescribeCluster answered as Apache Kafka's broker answers them."""

from __future__ import annotations

import struct
import uuid

import pytest
from kio.schema.errors import ErrorCode as E
from support.batches import make_batch, make_record_batch
from support.dispatch import Close, Harness, Reply

from devbroker.admin import coordinator_node
from devbroker.versions import SUPPORTED
from proxy.protocol import codec

API_VERSIONS, METADATA, CREATE_TOPICS, LIST_OFFSETS = 18, 3, 19, 2
FIND_COORDINATOR, DESCRIBE_CLUSTER, PRODUCE = 10, 60, 0


@pytest.fixture
def h() -> Harness:
    return Harness(3, {"orders": 12, "small": 1})


def header(api_key: int, version: int, cid: int, client_id: bytes = b"c") -> bytes:
    return struct.pack(">hhih", api_key, version, cid, len(client_id)) + client_id


# -- ApiVersions -----------------------------------------------------------------


@pytest.mark.parametrize("version", [0, 1, 2, 3, 4])
def test_api_versions_lists_what_is_implemented(h: Harness, version: int) -> None:
    data = {"client_software_name": "kafka-python", "client_software_version": "2.1.0"}
    resp = h.call(0, h.request(API_VERSIONS, version, data))
    assert resp.error_code == E.none
    got = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
    assert got == SUPPORTED
    assert got[1] == (4, 18)  # Fetch, as Kafka 4.4
    assert got[0] == (3, 13)  # Produce v3+ (record batch v2), topic ids from v13
    assert got[2] == (1, 11)  # ListOffsets, as Kafka 4.4
    assert got[18] == (0, 4)


def test_api_versions_too_new_gets_v0_unsupported_version(h: Harness) -> None:
    frame = header(API_VERSIONS, 9, 77) + b"\x00"
    out = h.send_raw(0, frame)
    assert isinstance(out, Reply)
    # The response must be readable as v0 whatever version was asked (KIP-511).
    resp = h.decode(out, API_VERSIONS, 0)
    assert out.correlation_id == 77
    assert resp.error_code == E.unsupported_version
    assert [(k.api_key, k.min_version, k.max_version) for k in resp.api_keys] == [(18, 0, 4)]


def test_api_versions_v3_validates_client_software(h: Harness) -> None:
    data = {"client_software_name": "bad name!", "client_software_version": "1.0"}
    resp = h.call(0, h.request(API_VERSIONS, 3, data))
    assert resp.error_code == E.invalid_request


# -- refusals --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("api_key", "version"),
    [
        (9999, 0),  # unknown api key
        (0, 2),  # Produce below v3 (removed in Kafka 4)
        (1, 18),  # Fetch above what the dev cluster implements
        (20, 6),  # DeleteTopics: known to Kafka, not implemented here, not advertised
    ],
)
def test_unsupported_requests_close_the_connection(h: Harness, api_key: int, version: int) -> None:
    out = h.send_raw(0, header(api_key, version, 1) + b"\x00" * 16)
    assert isinstance(out, Close)


def test_undecodable_body_closes_the_connection(h: Harness) -> None:
    out = h.send_raw(0, header(METADATA, 1, 1) + b"\x00\x00\x00\x05\x00")
    assert isinstance(out, Close)


def test_short_header_closes_the_connection(h: Harness) -> None:
    assert isinstance(h.send_raw(0, b"\x00\x03"), Close)


# -- Metadata -------------------------------------------------------------------------


def test_metadata_lists_all_topics_with_spread_leaders(h: Harness) -> None:
    resp = h.call(
        1, h.request(METADATA, 12, {"topics": None, "include_topic_authorized_operations": False})
    )
    assert {b.node_id: (b.host, b.port) for b in resp.brokers} == {
        0: ("127.0.0.1", 9000),
        1: ("127.0.0.1", 9001),
        2: ("127.0.0.1", 9002),
    }
    assert resp.cluster_id == "dev-cluster-id"
    topics = {t.name: t for t in resp.topics}
    assert set(topics) == {"orders", "small"}
    orders = topics["orders"]
    assert orders.topic_id == h.state.topics["orders"].topic_id
    leaders = [p.leader_id for p in sorted(orders.partitions, key=lambda p: p.partition_index)]
    assert set(leaders) == {0, 1, 2}
    assert all(p.replica_nodes == (p.leader_id,) for p in orders.partitions)


def test_metadata_v0_empty_list_means_all_v1_means_none(h: Harness) -> None:
    v0 = h.call(0, h.request(METADATA, 0, {"topics": []}))
    assert {t.name for t in v0.topics} == {"orders", "small"}
    v1 = h.call(0, h.request(METADATA, 1, {"topics": []}))
    assert v1.topics == ()


def test_metadata_unknown_topic_is_not_auto_created(h: Harness) -> None:
    req = h.request(
        METADATA,
        12,
        {
            "topics": [{"name": "nope", "topic_id": None}],
            "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False,
        },
    )
    resp = h.call(0, req)
    assert [(t.name, t.error_code) for t in resp.topics] == [("nope", E.unknown_topic_or_partition)]
    assert "nope" not in h.state.topics


def test_metadata_by_unknown_topic_id(h: Harness) -> None:
    tid = uuid.uuid4()
    req = h.request(
        METADATA,
        12,
        {"topics": [{"name": None, "topic_id": tid}], "include_topic_authorized_operations": False},
    )
    resp = h.call(0, req)
    assert [(t.topic_id, t.error_code) for t in resp.topics] == [(tid, E.unknown_topic_id)]


def test_metadata_stopped_leader_is_not_available(h: Harness) -> None:
    h.state.stopped_nodes.add(2)
    resp = h.call(
        0, h.request(METADATA, 12, {"topics": None, "include_topic_authorized_operations": False})
    )
    assert {b.node_id for b in resp.brokers} == {0, 1}
    for p in next(t for t in resp.topics if t.name == "orders").partitions:
        if h.leader_of("orders", p.partition_index) == 2:
            assert (p.error_code, p.leader_id) == (E.leader_not_available, -1)
        else:
            assert p.error_code == E.none


# -- CreateTopics ------------------------------------------------------------------------


def create(
    h: Harness, *topics: dict[str, object], validate_only: bool = False, version: int = 7
) -> dict[str, object]:
    full = [
        {"num_partitions": 3, "replication_factor": 1, "assignments": [], "configs": []} | t
        for t in topics
    ]
    resp = h.call(
        0,
        h.request(
            CREATE_TOPICS,
            version,
            {"topics": full, "timeout": 1000, "validate_only": validate_only},
        ),
    )
    return {t.name: t for t in resp.topics}


def test_create_topics(h: Harness) -> None:
    res = create(h, {"name": "new", "num_partitions": 5})
    assert res["new"].error_code == E.none
    assert res["new"].num_partitions == 5
    assert res["new"].topic_id == h.state.topics["new"].topic_id
    assert len(h.state.topics["new"].partitions) == 5


def test_create_topics_refusals(h: Harness) -> None:
    res = create(
        h,
        {"name": "orders"},
        {"name": "zero", "num_partitions": 0},
        {"name": "bad/name"},
        {"name": "wide", "replication_factor": 4},
        {"name": "dup"},
        {"name": "dup"},
    )
    assert res["orders"].error_code == E.topic_already_exists
    assert res["zero"].error_code == E.invalid_partitions
    assert res["bad/name"].error_code == E.invalid_topic_exception
    assert res["wide"].error_code == E.invalid_replication_factor
    assert res["dup"].error_code == E.invalid_request
    assert set(h.state.topics) == {"orders", "small"}


def test_create_topics_validate_only_creates_nothing(h: Harness) -> None:
    res = create(
        h, {"name": "dry", "num_partitions": -1, "replication_factor": -1}, validate_only=True
    )
    assert res["dry"].error_code == E.none
    assert res["dry"].num_partitions == 1
    assert "dry" not in h.state.topics


# -- ListOffsets -----------------------------------------------------------------------


def list_offsets(h: Harness, node: int, partition: int, timestamp: int, version: int = 9) -> object:
    req = h.request(
        LIST_OFFSETS,
        version,
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {
                            "partition_index": partition,
                            "timestamp": timestamp,
                            "current_leader_epoch": -1,
                        }
                    ],
                }
            ],
            "timeout": 1000,
        },
    )
    return h.call(node, req).topics[0].partitions[0]


def test_list_offsets_earliest_latest_max_timestamp(h: Harness) -> None:
    leader = h.leader_of("orders", 0)
    part = h.state.partition("orders", 0)
    assert part is not None
    part.log.append(make_batch(0, 3, base_timestamp=5000), 0)
    part.log.append(make_batch(0, 2, base_timestamp=9000), 0)
    part.log.delete_records_before(1)
    assert (list_offsets(h, leader, 0, -2).offset, list_offsets(h, leader, 0, -1).offset) == (1, 5)
    top = list_offsets(h, leader, 0, -3)
    assert (top.offset, top.timestamp) == (4, 9002)
    by_time = list_offsets(h, leader, 0, 8000)
    assert (by_time.offset, by_time.timestamp) == (3, 9002)
    never = list_offsets(h, leader, 0, 99999)
    assert (never.error_code, never.offset, never.timestamp) == (E.none, -1, -1)


def test_list_offsets_refused_by_non_leader_and_unknown(h: Harness) -> None:
    other = (h.leader_of("orders", 0) + 1) % 3
    assert list_offsets(h, other, 0, -1).error_code == E.not_leader_or_follower
    assert list_offsets(h, 0, 99, -1).error_code == E.unknown_topic_or_partition


# -- FindCoordinator / DescribeCluster -----------------------------------------------------


def test_find_coordinator_single_and_batched(h: Harness) -> None:
    expected = coordinator_node(h.state.node_ids, "my-group")
    v3 = h.call(2, h.request(FIND_COORDINATOR, 3, {"key": "my-group", "key_type": 0}))
    assert (v3.error_code, v3.node_id, v3.port) == (E.none, expected, 9000 + expected)
    v4 = h.call(
        1,
        h.request(FIND_COORDINATOR, 4, {"key_type": 0, "coordinator_keys": ["my-group", "other"]}),
    )
    assert [(c.key, c.node_id) for c in v4.coordinators] == [
        ("my-group", expected),
        ("other", coordinator_node(h.state.node_ids, "other")),
    ]


def test_find_coordinator_stopped_node_and_transactions(h: Harness) -> None:
    node = coordinator_node(h.state.node_ids, "g")
    h.state.stopped_nodes.add(node)
    resp = h.call((node + 1) % 3, h.request(FIND_COORDINATOR, 3, {"key": "g", "key_type": 0}))
    assert resp.error_code == E.coordinator_not_available
    txn = h.call(0, h.request(FIND_COORDINATOR, 3, {"key": "tx", "key_type": 1}))
    assert (txn.error_code, txn.node_id) == (E.none, coordinator_node(h.state.node_ids, "tx"))
    share = h.call(0, h.request(FIND_COORDINATOR, 6, {"key_type": 2, "coordinator_keys": ["s"]}))
    # KafkaApis.getCoordinator: no share coordinator -> INVALID_REQUEST
    assert share.coordinators[0].error_code == E.invalid_request


def test_coordinator_follows_kafka_partition_for() -> None:
    # Utils.abs("group".hashCode()) % 50 == 98629247 % 50 == 47
    assert coordinator_node(list(range(50)), "group") == 47
    assert coordinator_node([0, 1, 2], "group") == 47 % 3


def test_describe_cluster(h: Harness) -> None:
    resp = h.call(
        0,
        h.request(
            DESCRIBE_CLUSTER,
            1,
            {"include_cluster_authorized_operations": False, "endpoint_type": 1},
        ),
    )
    assert resp.error_code == E.none
    assert resp.cluster_id == "dev-cluster-id"
    assert sorted(b.broker_id for b in resp.brokers) == [0, 1, 2]
    controllers = h.call(
        0,
        h.request(
            DESCRIBE_CLUSTER,
            1,
            {"include_cluster_authorized_operations": False, "endpoint_type": 2},
        ),
    )
    assert controllers.error_code == E.unsupported_endpoint_type


def test_every_supported_version_of_metadata_encodes(h: Harness) -> None:
    lo, hi = SUPPORTED[METADATA]
    for v in range(lo, hi + 1):
        schema = codec.request_schema(METADATA, v)
        fields = {
            "topics": [{"name": "orders", "topic_id": None}],
            "include_topic_authorized_operations": False,
            "include_cluster_authorized_operations": False,
        }
        resp = h.call(0, h.request(METADATA, v, fields))
        assert [t.name for t in resp.topics] == ["orders"], (v, schema)


def test_metadata_v10_refuses_topic_ids(h: Harness) -> None:
    tid = h.state.topics["orders"].topic_id
    req = h.request(
        METADATA,
        10,
        {
            "topics": [{"name": "orders", "topic_id": tid}],
            "include_cluster_authorized_operations": False,
            "include_topic_authorized_operations": False,
        },
    )
    resp = h.call(0, req)
    assert [(t.name, t.error_code) for t in resp.topics] == [("orders", E.invalid_request)]
    assert resp.brokers == ()


def test_metadata_v12_by_known_topic_id(h: Harness) -> None:
    tid = h.state.topics["small"].topic_id
    req = h.request(
        METADATA,
        12,
        {"topics": [{"name": None, "topic_id": tid}], "include_topic_authorized_operations": False},
    )
    resp = h.call(0, req)
    assert [(t.name, t.topic_id, t.error_code) for t in resp.topics] == [("small", tid, E.none)]


@pytest.mark.parametrize("gzip_body", [False, True])
def test_list_offsets_by_timestamp_finds_the_record(h: Harness, gzip_body: bool) -> None:
    leader = h.leader_of("orders", 2)
    part = h.state.partition("orders", 2)
    assert part is not None
    part.log.append(make_record_batch([100, 300, 200, 500], gzip_body=gzip_body), 0)
    part.log.append(make_record_batch([600, 700], gzip_body=gzip_body), 0)
    found = {ts: list_offsets(h, leader, 2, ts) for ts in (0, 150, 250, 400, 501, 650, 701)}
    assert {ts: (r.offset, r.timestamp) for ts, r in found.items()} == {
        0: (0, 100),
        150: (1, 300),
        250: (1, 300),
        400: (3, 500),
        501: (4, 600),
        650: (5, 700),
        701: (-1, -1),
    }
    top = list_offsets(h, leader, 2, -3)
    assert (top.offset, top.timestamp) == (5, 700)
    part.log.delete_records_before(2)
    assert (list_offsets(h, leader, 2, 150).offset, list_offsets(h, leader, 2, 150).timestamp) == (
        2,
        200,
    )


def test_list_offsets_duplicate_partition_is_refused(h: Harness) -> None:
    leader = h.leader_of("orders", 0)
    one = {"partition_index": 0, "timestamp": -1, "current_leader_epoch": -1}
    req = h.request(
        LIST_OFFSETS,
        9,
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [{"name": "orders", "partitions": [one, one]}],
        },
    )
    resp = h.call(leader, req)
    parts = resp.topics[0].partitions
    assert [(p.partition_index, p.error_code) for p in parts] == [(0, E.invalid_request)]


def test_trailing_bytes_after_a_body_are_ignored_as_kafka_does(h: Harness) -> None:
    # librdkafka 2.x's admin client sends Metadata v13 like this: null topics, two
    # false flags, no tagged fields, then three bytes more.
    frame = (
        struct.pack(">hhih", METADATA, 13, 9, 7)
        + b"rdkafka"
        + b"\x00"
        + bytes.fromhex("00000000010000")
    )
    out = h.send_raw(0, frame)
    assert isinstance(out, Reply)
    assert {t.name for t in h.decode(out, METADATA, 13).topics} == {"orders", "small"}


# -- strictness audit: CreateTopics configs and colliding names (ReplicationControlManager) -----


def cfg(**pairs: str | None) -> list[dict[str, str | None]]:
    return [{"name": k.replace("_", "."), "value": v} for k, v in pairs.items()]


def test_create_topics_refuses_unknown_null_and_unimplemented_configs(h: Harness) -> None:
    res = create(
        h,
        {"name": "unknown", "configs": [{"name": "not.a.real.topic.config", "value": "1"}]},
        {"name": "null", "configs": cfg(retention_ms=None)},
        {"name": "compact", "configs": cfg(cleanup_policy="compact")},
        {"name": "plain", "configs": cfg(cleanup_policy="delete", min_insync_replicas="1")},
    )
    assert res["unknown"].error_code == E.invalid_config
    assert res["unknown"].error_message == "Unknown topic config name: not.a.real.topic.config"
    assert res["null"].error_code == E.invalid_config
    assert res["null"].error_message == "Null value not supported for topic configs: retention.ms"
    assert res["compact"].error_code == E.invalid_config  # Kafka would compact: not modelled
    assert res["plain"].error_code == E.none  # Kafka's defaults are what the dev cluster does
    assert set(h.state.topics) == {"orders", "small", "plain"}


def test_create_topics_refuses_names_colliding_through_dots_and_underscores(h: Harness) -> None:
    assert create(h, {"name": "my.topic"})["my.topic"].error_code == E.none
    clash = create(h, {"name": "my_topic"})["my_topic"]
    assert clash.error_code == E.invalid_topic_exception
    assert clash.error_message == "Topic 'my_topic' collides with existing topic: my.topic"


def test_create_topics_refuses_an_operation_over_10000_metadata_records(h: Harness) -> None:
    # QuorumController.MAX_RECORDS_PER_USER_OP: one record per topic and per partition.
    res = create(h, {"name": "huge", "num_partitions": 9_999}, {"name": "ok", "num_partitions": 1})
    assert {n: r.error_code for n, r in res.items()} == {
        "huge": E.policy_violation,
        "ok": E.policy_violation,
    }
    assert res["ok"].error_message == "Unable to perform excessively large batch operation."
    assert "huge" not in h.state.topics and "ok" not in h.state.topics
    assert create(h, {"name": "big", "num_partitions": 9_999})["big"].error_code == E.none


# -- strictness audit: ListOffsetsRequest.isolationLevel() throws on unknown levels ------------


@pytest.mark.parametrize("replica_id", [-1, 1])
def test_list_offsets_unknown_isolation_level_fails_every_partition(
    h: Harness, replica_id: int
) -> None:
    req = h.request(
        LIST_OFFSETS,
        9,
        {
            "replica_id": replica_id,
            "isolation_level": 2,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {"partition_index": i, "timestamp": -1, "current_leader_epoch": -1}
                        for i in (0, 1, 1)
                    ],
                }
            ],
            "timeout": 1000,
        },
    )
    resp = h.call(0, req)
    got = [(p.partition_index, p.error_code, p.offset) for p in resp.topics[0].partitions]
    assert got == [(i, E.unknown_server_error, -1) for i in (0, 1, 1)]


# -- Kafka 4.4: ListOffsets v11, answer orders -----------------------------------------------


def test_list_offsets_v11_earliest_pending_upload_is_not_found(h: Harness) -> None:
    """Timestamp -6 (KIP-1023): without tiered storage Kafka finds no offset."""
    leader = h.leader_of("orders", 0)
    part = h.state.partition("orders", 0)
    assert part is not None
    part.log.append(make_batch(0, 3), 0)
    got = list_offsets(h, leader, 0, -6, version=11)
    assert (got.error_code, got.offset, got.timestamp, got.leader_epoch) == (E.none, -1, -1, -1)


def test_list_offsets_answers_in_kafkas_hash_order(h: Harness) -> None:
    """Partitions come in the order of Kafka's hash maps (observed on Kafka 4.4), not as asked."""
    harness = Harness(1, {"diff-offsets-e4436a31": 3})
    req = harness.request(
        LIST_OFFSETS,
        10,
        {
            "replica_id": -1,
            "isolation_level": 0,
            "topics": [
                {
                    "name": "diff-offsets-e4436a31",
                    "partitions": [
                        {"partition_index": p, "timestamp": -1, "current_leader_epoch": -1}
                        for p in (1, 2, 0)
                    ],
                }
            ],
            "timeout": 1000,
        },
    )
    (topic,) = harness.call(0, req).topics
    assert [p.partition_index for p in topic.partitions] == [2, 0, 1]


def test_metadata_answers_known_topics_then_missing_ones(h: Harness) -> None:
    req = h.request(
        METADATA,
        12,
        {
            "topics": [{"name": n, "topic_id": None} for n in ("nope", "orders", "nada", "small")],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    names = [t.name for t in h.call(0, req).topics]
    assert names[:2] == ["orders", "small"]  # Set1..Set4 keep the order asked
    assert sorted(names[2:]) == ["nada", "nope"]
    dup = h.request(
        METADATA,
        12,
        {
            "topics": [{"name": n, "topic_id": None} for n in ("small", "small")],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )
    assert [t.name for t in h.call(0, dup).topics] == ["small"]  # a set: once
