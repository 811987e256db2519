"""The rack map (node -> rack, partition -> leader, from Metadata) and the rack accounting."""

from __future__ import annotations

import datetime
import uuid

import pytest
from kio.schema.errors import ErrorCode
from kio.schema.metadata.v0 import response as md0
from kio.schema.metadata.v12 import response as md12
from kio.schema.types import BrokerId
from kio.static.primitive import i32, i32Timedelta

from proxy.protocol import codec, error_codes
from proxy.relay import racks
from proxy.relay.racks import FallbackReason, Locality, RackMap, account

ZERO = i32Timedelta.parse(datetime.timedelta(0))
ORDERS_ID = uuid.UUID("6c1c9a52-3a4b-4b5e-9a77-4f3f0b1f2a10")
RACKS = {1: "a", 2: "b", 3: "c"}


def metadata(
    leaders: dict[int, int], *, racks_by_node: dict[int, str | None] = RACKS, error: int = 0
) -> md12.MetadataResponse:
    return md12.MetadataResponse(
        throttle_time=ZERO,
        brokers=tuple(
            md12.MetadataResponseBroker(node_id=BrokerId(n), host=f"k{n}", port=i32(9092), rack=r)
            for n, r in racks_by_node.items()
        ),
        cluster_id="c1",
        controller_id=BrokerId(1),
        topics=(
            md12.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name="orders",
                topic_id=ORDERS_ID,
                is_internal=False,
                partitions=tuple(
                    md12.MetadataResponsePartition(
                        error_code=ErrorCode(error),
                        partition_index=i32(p),
                        leader_id=BrokerId(leader),
                        leader_epoch=i32(5),
                        replica_nodes=(BrokerId(1), BrokerId(2), BrokerId(3)),
                        isr_nodes=(BrokerId(1), BrokerId(2), BrokerId(3)),
                        offline_replicas=(),
                    )
                    for p, leader in leaders.items()
                ),
                topic_authorized_operations=i32(-2147483648),
            ),
        ),
    )


def learnt(rack: str | None = "b", leaders: dict[int, int] | None = None) -> RackMap:
    m = RackMap(rack)
    frame = codec.encode_response(metadata(leaders or {0: 1, 1: 2, 2: 3}), 7)
    racks.learn_from_frame(m, 12, frame)
    return m


def test_racks_and_leaders_learnt_from_a_metadata_frame_by_name_and_id() -> None:
    m = learnt()
    assert m.racks() == RACKS
    assert m.same_rack_nodes() == (2,)
    assert [m.locality(n) for n in (1, 2, 3, 4, None)] == [
        Locality.OTHER_RACK,
        Locality.SAME_RACK,
        Locality.OTHER_RACK,
        Locality.UNKNOWN,  # not announced
        Locality.UNKNOWN,  # the bootstrap listener's connection
    ]
    assert [m.leader_of("orders", p) for p in range(4)] == [1, 2, 3, None]
    assert [m.leader_of(ORDERS_ID, p) for p in range(3)] == [1, 2, 3]


def test_a_proxy_without_a_rack_and_brokers_without_racks_are_unknown() -> None:
    m = learnt(rack=None)
    assert m.same_rack_nodes() == ()
    assert {m.locality(n) for n in RACKS} == {Locality.UNKNOWN}
    m = RackMap("a")
    m.learn_metadata(metadata({0: 1}, racks_by_node={1: None, 2: ""}))
    assert m.racks() == {1: None, 2: None}
    assert m.locality(1) is Locality.UNKNOWN
    # Metadata v0 has no rack field at all
    m.learn_metadata(
        md0.MetadataResponse(
            brokers=(md0.MetadataResponseBroker(node_id=BrokerId(5), host="h", port=i32(1)),),
            topics=(),
        )
    )
    assert m.knows(5) and m.rack_of(5) is None


def test_leader_changes_errors_and_undecodable_frames() -> None:
    m = learnt()
    m.learn_metadata(metadata({0: 2}))
    assert m.leader_of("orders", 0) == 2
    m.learn_metadata(metadata({0: 3}, error=error_codes.NOT_LEADER_OR_FOLLOWER))
    assert m.leader_of("orders", 0) is None and m.leader_of(ORDERS_ID, 0) is None
    before = (m.racks(), len(m))
    racks.learn_from_frame(m, 12, b"\x00\x00\x00\x07garbage")
    assert (m.racks(), len(m)) == before


def test_bounded_least_recently_learnt_first() -> None:
    m = RackMap("a", max_brokers=2, max_partitions=3)
    for n in range(5):
        m.learn_broker(n, "a")
    assert m.racks() == {3: "a", 4: "a"}
    for p in range(5):
        m.learn_leader("t", p, 1)
    assert len(m) == 3 and m.leader_of("t", 0) is None and m.leader_of("t", 4) == 1
    m.learn_broker(9, "x" * 1000)
    assert len(m.rack_of(9) or "") == racks.MAX_RACK_CHARS
    with pytest.raises(ValueError):
        RackMap(max_partitions=0)


def test_account_counts_in_rack_cross_rack_and_avoided_bytes() -> None:
    m = learnt()  # proxy in rack b; leaders: p0 -> 1 (a), p1 -> 2 (b), p2 -> 3 (c)
    usage = account(
        m,
        [
            (("orders", 0), 2, 1000),  # follower in rack b, leader in a: avoided
            (("orders", 1), 2, 300),  # the leader itself, in rack b: in-rack, nothing avoided
            (("orders", 2), 3, 50),  # the leader in rack c: cross-rack
            (("orders", 3), 2, 7),  # leader unknown: in-rack, never counted as avoided
            (("other", 0), None, 11),  # the bootstrap connection: unknown node
            ((ORDERS_ID, 2), 2, 0),  # follower with no data: a follower partition, no bytes
        ],
    )
    assert usage.rack == "b"
    assert (usage.same_rack_bytes, usage.other_rack_bytes, usage.unknown_rack_bytes) == (
        1307,
        50,
        11,
    )
    assert usage.avoided_bytes == 1000
    assert usage.follower_partitions == 2
    by_node = {n.node: n for n in usage.by_node}
    assert by_node[2] == racks.NodeBytes(2, Locality.SAME_RACK, 1307, 1000, 2)
    assert by_node[3] == racks.NodeBytes(3, Locality.OTHER_RACK, 50, 0, 0)
    assert by_node[None].locality is Locality.UNKNOWN
    by_topic = {t.topic: t for t in usage.by_topic}
    assert by_topic["orders"] == racks.TopicBytes("orders", 1307, 50, 0, 1000)
    assert by_topic["other"] == racks.TopicBytes("other", 0, 0, 11, 0)
    assert ORDERS_ID not in by_topic  # no bytes, no row
    assert racks.cost(usage.avoided_bytes * 1_000_000, 0.02) == pytest.approx(0.02)


def test_bytes_from_an_in_rack_leader_avoid_nothing() -> None:
    m = learnt(rack="a")
    usage = account(m, [(("orders", 0), 1, 500), (("orders", 1), 1, 400)])
    assert usage.same_rack_bytes == 900
    assert usage.avoided_bytes == 400  # only p1: its leader (2) is in rack b
    assert usage.follower_partitions == 1


def test_topics_past_the_cap_fold_into_one_row() -> None:
    m = learnt()
    n = racks.MAX_TOPICS_PER_USAGE + 5
    usage = account(m, [((f"t{i}", 0), 2, 100 + i) for i in range(n)])
    assert len(usage.by_topic) == racks.MAX_TOPICS_PER_USAGE + 1
    assert usage.by_topic[-1].topic is None
    assert sum(t.same_rack_bytes for t in usage.by_topic) == usage.same_rack_bytes
    assert usage.by_topic[0].topic == f"t{n - 1}"  # the largest first


def test_fallback_reasons_for_replica_errors() -> None:
    assert (
        racks.fallback_reason(error_codes.OFFSET_OUT_OF_RANGE) is FallbackReason.OFFSET_OUT_OF_RANGE
    )
    assert (
        racks.fallback_reason(error_codes.NOT_LEADER_OR_FOLLOWER)
        is FallbackReason.NOT_LEADER_OR_FOLLOWER
    )
    assert racks.fallback_reason(error_codes.FENCED_LEADER_EPOCH) is FallbackReason.LEADER_EPOCH
    assert racks.fallback_reason(error_codes.UNKNOWN_LEADER_EPOCH) is FallbackReason.LEADER_EPOCH
    assert racks.fallback_reason(error_codes.UNKNOWN_SERVER_ERROR) is FallbackReason.OTHER


def test_the_proxy_learns_the_brokers_racks_at_discovery() -> None:
    """Before any client asks Metadata, the fetch path's rack map has every broker."""
    from support.stack import ProxyStack

    stack = ProxyStack({"rack": "b"}, nodes=3).start()
    try:
        fetch_path = stack.proxy.fetch_path
        assert fetch_path is not None
        assert fetch_path.racks.rack == "b"
        assert fetch_path.racks.racks() == {0: None, 1: None, 2: None}  # the dev cluster: none
    finally:
        stack.stop()
