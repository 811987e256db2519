"""NodeEndpoints through the proxy, on a real 3-broker Kafka.

Kafka names the current leader of a partition, with its host and port, in the
``NodeEndpoints`` of Fetch v16+, Produce v10+, ShareFetch and ShareAcknowledge
responses when it answers NOT_LEADER_OR_FOLLOWER (or FENCED_LEADER_EPOCH) and knows
the leader (KafkaApis: ``getCurrentLeader`` for each such partition).  Through the
proxy those addresses must be the proxy's listeners, never a broker's.

Each case sends a raw request through the proxy's listener for a broker that is not
the partition's leader.  The topics have one replica, so that broker hosts no
replica of the partition and refuses it with NOT_LEADER_OR_FOLLOWER (with three
replicas a Fetch v11+ from a consumer would be served by the follower, KIP-392).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from support.backends import running
from support.batches import make_record_batch
from support.kafka import KafkaCluster
from support.rawclient import RawClient
from support.stack import ProxyStack

pytestmark = [pytest.mark.integration, pytest.mark.kafka]

TEST_TIMEOUT = 60.0
"""Absolute time limit of one test's network operations (seconds)."""

PRODUCE, FETCH, METADATA, SHARE_GROUP_HEARTBEAT, SHARE_FETCH, SHARE_ACKNOWLEDGE = (
    0,
    1,
    3,
    76,
    78,
    79,
)
NOT_LEADER_OR_FOLLOWER = ErrorCode.not_leader_or_follower


@pytest.fixture(scope="module")
def stack(kafka3: KafkaCluster) -> Iterator[ProxyStack]:
    with running(ProxyStack(upstream=kafka3)) as s:
        yield s


@pytest.fixture
def deadline() -> float:
    return time.monotonic() + TEST_TIMEOUT


@dataclass
class Placement:
    """A one-replica topic's partition 0 as Metadata through the proxy shows it."""

    topic: str
    topic_id: uuid.UUID
    leader: int
    leader_epoch: int
    asked: int
    """a node that is not the leader (and, with one replica, holds no replica)"""
    proxy: dict[int, tuple[str, int]]
    """node id -> the proxy's listener for it"""
    brokers: set[tuple[str, int]]
    """the real brokers' addresses"""

    def client(self, node: int, deadline: float) -> RawClient:
        return RawClient(self.proxy[node], deadline=deadline)


def metadata(c: RawClient, topic: str) -> Any:
    return c.call(
        METADATA,
        12,
        {
            "topics": [{"name": topic, "topic_id": None}],
            "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False,
        },
    )


def place(stack: ProxyStack, kafka: KafkaCluster, deadline: float) -> Placement:
    topic = kafka.create_topic(f"ne-{uuid.uuid4().hex[:10]}", 1, replication_factor=1)
    # Metadata first, as a client asks it: the proxy learns a broker it did not see at start
    # (one not yet registered or unfenced then) from the answer, which every node is in
    # once the broker answering it has applied their registrations.
    with RawClient(stack.bootstrap, deadline=deadline) as c:
        while True:
            meta = metadata(c, topic)
            if {b.node_id for b in meta.brokers} == set(kafka.nodes):
                break
            time.sleep(0.05)  # bounded: every call raises TimeoutError past the deadline
    proxy = {n: stack.run_sync(stack.proxy.broker_address, n) for n in kafka.nodes}
    assert all(a is not None for a in proxy.values()), proxy
    listeners = {n: a for n, a in proxy.items() if a is not None}
    assert {(b.node_id, b.host, b.port) for b in meta.brokers} == {
        (n, host, port) for n, (host, port) in listeners.items()
    }
    (t,) = meta.topics
    (p,) = t.partitions
    assert t.error_code == ErrorCode.none and p.error_code == ErrorCode.none
    assert p.leader_id == kafka.leader_of(topic, 0)  # as the brokers' own admin client sees it
    asked = min(n for n in kafka.nodes if n != p.leader_id)
    # Each broker applies the new topic's metadata on its own: until the asked one has,
    # it would answer UNKNOWN_TOPIC_ID instead of naming the leader.  Metadata says when.
    with RawClient(kafka.nodes[asked].address, deadline=deadline) as c:
        while True:
            known = metadata(c, topic).topics[0]
            if known.error_code == ErrorCode.none and known.partitions[0].leader_id == p.leader_id:
                break
            time.sleep(0.05)  # bounded: every call raises TimeoutError past the deadline
    return Placement(
        topic,
        t.topic_id,
        int(p.leader_id),
        int(p.leader_epoch),
        asked,
        listeners,
        {("127.0.0.1", n.port) for n in kafka.nodes.values()},
    )


def endpoints(response: Any) -> set[tuple[int, str, int]]:
    return {(int(e.node_id), e.host, int(e.port)) for e in response.node_endpoints}


def assert_names_the_leader_through_the_proxy(place: Placement, response: Any, leader: Any) -> None:
    """current_leader is the real leader; NodeEndpoints list it at its proxy listener only."""
    assert (int(leader.leader_id), int(leader.leader_epoch)) == (place.leader, place.leader_epoch)
    host, port = place.proxy[place.leader]
    assert endpoints(response) == {(place.leader, host, port)}
    assert host == "127.0.0.1"
    assert not {(h, p) for _n, h, p in endpoints(response)} & place.brokers


# -- Fetch v16+ ------------------------------------------------------------------------------


def fetch_request(place: Placement, session_epoch: int) -> dict[str, Any]:
    return {
        "cluster_id": None,
        "replica_id": -1,
        "replica_state": {"replica_id": -1, "replica_epoch": -1},
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "isolation_level": 0,
        "session_id": 0,
        "session_epoch": session_epoch,
        "topics": [
            {
                "topic": place.topic,
                "topic_id": place.topic_id,
                "partitions": [
                    {
                        "partition": 0,
                        "current_leader_epoch": -1,
                        "fetch_offset": 0,
                        "last_fetched_epoch": -1,
                        "log_start_offset": -1,
                        "partition_max_bytes": 1 << 20,
                    }
                ],
            }
        ],
        "forgotten_topics_data": [],
        "rack_id": "",
    }


@pytest.mark.parametrize("session_epoch", [-1, 0], ids=["sessionless", "session"])
@pytest.mark.parametrize("version", [16, 17, 18])
def test_fetch_from_a_non_leader_names_the_leader_at_its_proxy_listener(
    stack: ProxyStack, kafka3: KafkaCluster, deadline: float, version: int, session_epoch: int
) -> None:
    """Sessionless (epoch -1) and session-opening (epoch 0) fetches both go through the
    proxy's fetch path, which answers the client from Kafka's response."""
    place_ = place(stack, kafka3, deadline)
    with place_.client(place_.asked, deadline) as c:
        r = c.call(FETCH, version, fetch_request(place_, session_epoch))
    assert r.error_code == ErrorCode.none
    (t,) = r.responses
    (p,) = t.partitions
    assert p.error_code == NOT_LEADER_OR_FOLLOWER
    assert_names_the_leader_through_the_proxy(place_, r, p.current_leader)


# -- Produce v10+ ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", [10, 12, 13])
def test_produce_to_a_non_leader_names_the_leader_at_its_proxy_listener(
    stack: ProxyStack, kafka3: KafkaCluster, deadline: float, version: int
) -> None:
    place_ = place(stack, kafka3, deadline)
    records = make_record_batch([1_700_000_000_000], values=[b"v"])
    with place_.client(place_.asked, deadline) as c:
        r = c.call(
            PRODUCE,
            version,
            {
                "transactional_id": None,
                "acks": -1,
                "timeout": 10_000,
                "topic_data": [
                    {
                        "name": place_.topic,
                        "topic_id": place_.topic_id,
                        "partition_data": [{"index": 0, "records": records}],
                    }
                ],
            },
        )
    (t,) = r.responses
    (p,) = t.partition_responses
    assert p.error_code == NOT_LEADER_OR_FOLLOWER
    assert_names_the_leader_through_the_proxy(place_, r, p.current_leader)


# -- ShareFetch / ShareAcknowledge -----------------------------------------------------------


def share_fetch_request(place: Placement, group: str, member: str) -> dict[str, Any]:
    return {
        "group_id": group,
        "member_id": member,
        "share_session_epoch": 0,
        "max_wait": timedelta(0),
        "min_bytes": 1,
        "max_bytes": 1 << 20,
        "max_records": 10,
        "batch_size": 10,
        "share_acquire_mode": 0,
        "topics": [
            {
                "topic_id": place.topic_id,
                "partitions": [{"partition_index": 0, "acknowledgement_batches": []}],
            }
        ],
        "forgotten_topics_data": [],
    }


@pytest.mark.parametrize("version", [1, 2])
def test_share_fetch_from_a_non_leader_names_the_leader_at_its_proxy_listener(
    stack: ProxyStack, kafka3: KafkaCluster, deadline: float, version: int
) -> None:
    """ShareFetch needs no joined member: an initial request (epoch 0) opens a share session
    for any member id (SharePartitionManager.newContext), then the partition is refused by
    a broker that does not lead it (getOrCreateSharePartition: NOT_LEADER_OR_FOLLOWER),
    and KafkaApis names the leader.

    ShareAcknowledge in the same share session (epoch 1) reaches the same broker intact,
    but Kafka answers its partition UNKNOWN_TOPIC_OR_PARTITION without NodeEndpoints:
    SharePartitionManager.acknowledge looks for a SharePartition in its cache, and a
    broker only holds one for a partition it leads (a broker that stops leading drops
    them: SharePartitionListener.onBecomingFollower), so Kafka never names a leader here.
    """
    place_ = place(stack, kafka3, deadline)
    group, member = f"ne-share-{uuid.uuid4().hex[:8]}", str(uuid.uuid4())
    with place_.client(place_.asked, deadline) as c:
        r = c.call(SHARE_FETCH, version, share_fetch_request(place_, group, member))
        assert r.error_code == ErrorCode.none
        (t,) = r.responses
        (p,) = t.partitions
        assert (t.topic_id, p.partition_index) == (place_.topic_id, 0)
        assert p.error_code == NOT_LEADER_OR_FOLLOWER
        assert_names_the_leader_through_the_proxy(place_, r, p.current_leader)

        ack = c.call(
            SHARE_ACKNOWLEDGE,
            version,
            {
                "group_id": group,
                "member_id": member,
                "share_session_epoch": 1,
                "is_renew_ack": False,
                "topics": [
                    {
                        "topic_id": place_.topic_id,
                        "partitions": [
                            {
                                "partition_index": 0,
                                "acknowledgement_batches": [
                                    {"first_offset": 0, "last_offset": 0, "acknowledge_types": [1]}
                                ],
                            }
                        ],
                    }
                ],
            },
        )
    assert ack.error_code == ErrorCode.none  # the share session and its epoch were found
    (t,) = ack.responses
    (p,) = t.partitions
    assert p.error_code == ErrorCode.unknown_topic_or_partition
    assert ack.node_endpoints == ()
