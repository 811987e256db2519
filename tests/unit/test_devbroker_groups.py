"""The classic group protocol on the dev cluster, on a hand-moved clock."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode as E
from support.dispatch import Harness, Reply, Wait

from devbroker.admin import coordinator_node

JOIN, SYNC, HEARTBEAT, LEAVE, COMMIT, FETCH_OFFSETS = 11, 14, 12, 13, 8, 9
GROUP = "g"


@pytest.fixture
def h() -> Harness:
    return Harness(3, {"orders": 4})


def coord(h: Harness) -> int:
    return coordinator_node(h.state.node_ids, GROUP)


def join(
    h: Harness,
    member_id: str = "",
    *,
    version: int = 9,
    session: int = 10000,
    protocols: list[tuple[str, bytes]] | None = None,
    node: int | None = None,
    ptype: str = "consumer",
    instance: str | None = None,
) -> Any:
    req = h.request(
        JOIN,
        version,
        {
            "group_id": GROUP,
            "session_timeout": session,
            "rebalance_timeout": 30000,
            "member_id": member_id,
            "group_instance_id": instance,
            "protocol_type": ptype,
            "protocols": [
                {"name": n, "metadata": m}
                for n, m in (protocols or [("range", b"meta-" + member_id.encode())])
            ],
            "reason": None,
        },
    )
    return h.send(coord(h) if node is None else node, req)


def done(h: Harness, out: Any, key: int = JOIN, version: int = 9) -> Any:
    if isinstance(out, Reply):
        return h.decode(out, key, version)
    assert isinstance(out, Wait)
    return h.finish(out, key, version)


def new_member(h: Harness) -> str:
    resp = done(h, join(h))
    assert resp.error_code == E.member_id_required
    assert resp.member_id
    return str(resp.member_id)


def sync(
    h: Harness,
    member: str,
    generation: int,
    assignments: dict[str, bytes] | None = None,
    version: int = 5,
    instance: str | None = None,
) -> Any:
    req = h.request(
        SYNC,
        version,
        {
            "group_id": GROUP,
            "generation_id": generation,
            "member_id": member,
            "group_instance_id": instance,
            "protocol_type": "consumer",
            "protocol_name": "range",
            "assignments": [
                {"member_id": m, "assignment": a} for m, a in (assignments or {}).items()
            ],
        },
    )
    return h.send(coord(h), req)


def heartbeat(h: Harness, member: str, generation: int, instance: str | None = None) -> Any:
    req = h.request(
        HEARTBEAT,
        4,
        {
            "group_id": GROUP,
            "generation_id": generation,
            "member_id": member,
            "group_instance_id": instance,
        },
    )
    return h.call(coord(h), req).error_code


def single_member_group(h: Harness) -> tuple[str, int]:
    a = new_member(h)
    resp = done(h, join(h, a))
    assert resp.error_code == E.none
    assert (resp.leader, resp.member_id) == (a, a)
    synced = done(h, sync(h, a, resp.generation_id, {a: b"assign-a"}), SYNC, 5)
    assert (synced.error_code, synced.assignment) == (E.none, b"assign-a")
    return a, resp.generation_id


def test_member_id_required_then_join_sync_heartbeat(h: Harness) -> None:
    a, gen = single_member_group(h)
    assert gen == 1
    assert heartbeat(h, a, gen) == E.none


def test_join_v3_assigns_member_id_at_once(h: Harness) -> None:
    resp = done(h, join(h, version=3), JOIN, 3)
    assert resp.error_code == E.none and resp.member_id and resp.leader == resp.member_id


def test_not_coordinator_on_other_nodes(h: Harness) -> None:
    other = (coord(h) + 1) % 3
    assert done(h, join(h, node=other)).error_code == E.not_coordinator
    req = h.request(
        HEARTBEAT,
        4,
        {"group_id": GROUP, "generation_id": 1, "member_id": "m", "group_instance_id": None},
    )
    assert h.call(other, req).error_code == E.not_coordinator


def test_join_refusals(h: Harness) -> None:
    assert done(h, join(h, session=1000)).error_code == E.invalid_session_timeout
    assert done(h, join(h, "ghost")).error_code == E.unknown_member_id
    single_member_group(h)
    assert done(h, join(h, ptype="connect")).error_code == E.inconsistent_group_protocol
    assert done(h, join(h, protocols=[("sticky", b"")])).error_code == E.inconsistent_group_protocol


def test_second_member_triggers_a_rebalance_both_get_the_new_generation(h: Harness) -> None:
    a, gen1 = single_member_group(h)
    b = new_member(h)
    b_join = join(h, b)
    assert isinstance(b_join, Wait)
    assert h.finish(b_join, JOIN, 9) is None  # parked until a rejoins
    assert heartbeat(h, a, gen1) == E.rebalance_in_progress
    a_resp = done(h, join(h, a))
    b_resp = h.finish(b_join, JOIN, 9)
    assert b_resp is not None
    assert a_resp.generation_id == b_resp.generation_id == gen1 + 1
    assert a_resp.leader == b_resp.leader == a
    assert sorted(m.member_id for m in a_resp.members) == sorted([a, b])
    assert b_resp.members == ()
    gen2 = a_resp.generation_id
    # The follower's SyncGroup waits for the leader's assignment.
    b_sync = sync(h, b, gen2)
    assert isinstance(b_sync, Wait) and h.finish(b_sync, SYNC, 5) is None
    a_sync = done(h, sync(h, a, gen2, {a: b"A", b: b"B"}), SYNC, 5)
    assert a_sync.assignment == b"A"
    b_done = h.finish(b_sync, SYNC, 5)
    assert b_done is not None and (b_done.error_code, b_done.assignment) == (E.none, b"B")
    assert heartbeat(h, b, gen2) == E.none
    assert heartbeat(h, b, gen1) == E.illegal_generation


def test_sync_refusals(h: Harness) -> None:
    a, gen = single_member_group(h)
    assert done(h, sync(h, a, gen + 5), SYNC, 5).error_code == E.illegal_generation
    assert done(h, sync(h, "ghost", gen), SYNC, 5).error_code == E.unknown_member_id


def test_silent_member_expires_after_session_timeout(h: Harness) -> None:
    a, _gen1 = single_member_group(h)
    b = new_member(h)
    b_join = join(h, b)
    a_join = join(h, a)
    a_resp = done(h, a_join)
    assert h.finish(b_join, JOIN, 9) is not None
    gen2 = a_resp.generation_id
    done(h, sync(h, a, gen2, {a: b"A", b: b"B"}), SYNC, 5)
    done(h, sync(h, b, gen2), SYNC, 5)
    # b goes silent; a keeps heartbeating.
    for _ in range(3):
        h.advance(3)
        assert heartbeat(h, a, gen2) == E.none
    h.advance(3)  # 12s since b's last sign of life > 10s session timeout
    assert heartbeat(h, a, gen2) == E.rebalance_in_progress
    rejoin = done(h, join(h, a))
    assert rejoin.generation_id == gen2 + 1
    assert [m.member_id for m in rejoin.members] == [a]
    assert heartbeat(h, b, gen2) == E.unknown_member_id


def test_rebalance_timeout_drops_members_that_do_not_rejoin(h: Harness) -> None:
    a, _gen = single_member_group(h)
    b = new_member(h)
    b_join = join(h, b)
    for _ in range(9):  # a heartbeats (sees REBALANCE_IN_PROGRESS) but never rejoins
        h.advance(3)
        assert h.finish(b_join, JOIN, 9) is None
        heartbeat(h, a, 1)
    h.advance(4)  # past the 30s rebalance timeout
    resp = h.finish(b_join, JOIN, 9)
    assert resp is not None and resp.error_code == E.none
    assert (resp.leader, [m.member_id for m in resp.members]) == (b, [b])


def test_leave_group(h: Harness) -> None:
    a, gen = single_member_group(h)
    req = h.request(
        LEAVE,
        5,
        {
            "group_id": GROUP,
            "members": [
                {"member_id": a, "group_instance_id": None, "reason": None},
                {"member_id": "ghost", "group_instance_id": None, "reason": None},
            ],
        },
    )
    resp = h.call(coord(h), req)
    assert resp.error_code == E.none
    assert [(m.member_id, m.error_code) for m in resp.members] == [
        (a, E.none),
        ("ghost", E.unknown_member_id),
    ]
    assert heartbeat(h, a, gen) == E.unknown_member_id
    v0 = h.call(coord(h), h.request(LEAVE, 0, {"group_id": GROUP, "member_id": a}))
    assert v0.error_code == E.unknown_member_id


def commit(
    h: Harness,
    member: str,
    generation: int,
    offsets: dict[int, int],
    version: int = 9,
    topic: str = "orders",
) -> dict[int, E]:
    req = h.request(
        COMMIT,
        version,
        {
            "group_id": GROUP,
            "generation_id_or_member_epoch": generation,
            "member_id": member,
            "group_instance_id": None,
            "topics": [
                {
                    "name": topic,
                    "partitions": [
                        {
                            "partition_index": p,
                            "committed_offset": o,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "m",
                        }
                        for p, o in offsets.items()
                    ],
                }
            ],
        },
    )
    resp = h.call(coord(h), req)
    return {p.partition_index: p.error_code for p in resp.topics[0].partitions}


def fetch_offsets(h: Harness, partitions: list[int] | None, version: int = 7) -> dict[int, int]:
    topics = None if partitions is None else [{"name": "orders", "partition_indexes": partitions}]
    resp = h.call(
        coord(h),
        h.request(
            FETCH_OFFSETS, version, {"group_id": GROUP, "topics": topics, "require_stable": True}
        ),
    )
    assert resp.error_code == E.none
    return {p.partition_index: p.committed_offset for t in resp.topics for p in t.partitions}


def test_offsets_commit_and_fetch(h: Harness) -> None:
    # A consumer that assigns partitions itself commits with generation -1.
    assert commit(h, "", -1, {0: 5, 1: 7}) == {0: E.none, 1: E.none}
    assert fetch_offsets(h, [0, 1, 2]) == {0: 5, 1: 7, 2: -1}
    assert fetch_offsets(h, None) == {0: 5, 1: 7}
    assert commit(h, "", -1, {99: 1}) == {99: E.unknown_topic_or_partition}
    v8 = h.call(
        coord(h),
        h.request(
            FETCH_OFFSETS,
            8,
            {"groups": [{"group_id": GROUP, "topics": None}], "require_stable": False},
        ),
    )
    assert [(p.partition_index, p.committed_offset) for p in v8.groups[0].topics[0].partitions] == [
        (0, 5),
        (1, 7),
    ]


def test_offset_commit_refusals(h: Harness) -> None:
    assert commit(h, "m", 3, {0: 1}) == {0: E.illegal_generation}  # no such group
    a, gen = single_member_group(h)
    assert commit(h, "", -1, {0: 1}) == {0: E.unknown_member_id}  # group has members
    assert commit(h, a, gen + 1, {0: 1}) == {0: E.illegal_generation}
    assert commit(h, a, gen, {0: 9}) == {0: E.none}
    assert fetch_offsets(h, [0]) == {0: 9}


def test_empty_group_id(h: Harness) -> None:
    req = h.request(
        HEARTBEAT,
        4,
        {"group_id": "", "generation_id": 1, "member_id": "m", "group_instance_id": None},
    )
    assert {h.call(n, req).error_code for n in range(3)} == {E.invalid_group_id}


def test_commit_during_completing_rebalance_and_unknown_partitions(h: Harness) -> None:
    a, gen1 = single_member_group(h)
    b = new_member(h)
    b_join = join(h, b)
    gen2 = done(h, join(h, a)).generation_id
    assert h.finish(b_join, JOIN, 9) is not None
    # Members know generation 2 but the leader has not sent the assignment yet.
    assert commit(h, a, gen2, {0: 3, 77: 1}) == {
        0: E.rebalance_in_progress,
        77: E.unknown_topic_or_partition,
    }
    assert commit(h, a, gen1, {0: 3}) == {0: E.illegal_generation}


def test_parked_join_outlives_its_session_timeout_without_busy_waking(h: Harness) -> None:
    a, _gen = single_member_group(h)
    b = new_member(h)
    b_join = join(h, b)
    assert isinstance(b_join, Wait)
    for _ in range(6):  # a keeps heartbeating; b waits 18s (> its 10s session) for a to rejoin
        h.advance(3)
        assert heartbeat(h, a, 1) == E.rebalance_in_progress
        assert h.finish(b_join, JOIN, 9) is None
        wake = b_join.pending.wake_at()
        assert wake is not None and wake > h.now
    assert done(h, join(h, a)).generation_id == 2
    resp = h.finish(b_join, JOIN, 9)
    assert resp is not None and resp.generation_id == 2


def test_initial_rebalance_delay_holds_the_first_join(h: Harness) -> None:
    h.coordinator.initial_rebalance_delay_ms = (
        3000  # Kafka's group.initial.rebalance.delay.ms default
    )
    first = join(h, version=3)
    assert isinstance(first, Wait)
    assert h.finish(first, JOIN, 3) is None
    wake = first.pending.wake_at()
    assert wake == h.now + 3
    h.advance(3)
    resp = h.finish(first, JOIN, 3)
    assert resp is not None and (resp.error_code, resp.generation_id) == (E.none, 1)


def test_empty_groups_without_offsets_are_cleaned_up(h: Harness) -> None:
    a, gen = single_member_group(h)
    req = h.request(
        LEAVE,
        5,
        {
            "group_id": GROUP,
            "members": [{"member_id": a, "group_instance_id": None, "reason": None}],
        },
    )
    assert h.call(coord(h), req).error_code == E.none
    assert h.coordinator.groups[GROUP].state.value == "Empty"
    h.advance(599)
    assert heartbeat(h, a, gen) == E.unknown_member_id
    assert GROUP in h.coordinator.groups
    h.advance(2)
    h.coordinator.tick(h.now)
    assert GROUP not in h.coordinator.groups
    # A group holding committed offsets stays.
    assert commit(h, "", -1, {0: 4}) == {0: E.none}
    h.advance(10_000)
    h.coordinator.tick(h.now)
    assert fetch_offsets(h, [0]) == {0: 4}


# -- strictness audit: static membership (KIP-345) and FENCED_INSTANCE_ID ---------------------


def leave(h: Harness, members: list[tuple[str, str | None]]) -> Any:
    req = h.request(
        LEAVE,
        5,
        {
            "group_id": GROUP,
            "members": [
                {"member_id": m, "group_instance_id": i, "reason": None} for m, i in members
            ],
        },
    )
    return h.call(coord(h), req)


def commit_as(h: Harness, member: str, generation: int, instance: str | None) -> Any:
    req = h.request(
        COMMIT,
        9,
        {
            "group_id": GROUP,
            "generation_id_or_member_epoch": generation,
            "member_id": member,
            "group_instance_id": instance,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": 1,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        }
                    ],
                }
            ],
        },
    )
    return h.call(coord(h), req).topics[0].partitions[0].error_code


def static_member(h: Harness, instance: str = "i1") -> tuple[str, int]:
    resp = done(h, join(h, instance=instance))
    assert resp.error_code == E.none  # no MEMBER_ID_REQUIRED for static members
    synced = done(
        h,
        sync(h, resp.member_id, resp.generation_id, {resp.member_id: b"a"}, instance=instance),
        SYNC,
        5,
    )
    assert synced.error_code == E.none
    return str(resp.member_id), int(resp.generation_id)


def test_a_restarted_static_member_replaces_the_old_member_id_without_a_rebalance(
    h: Harness,
) -> None:
    old, gen = static_member(h)
    assert old.startswith("i1-")
    again = done(h, join(h, instance="i1"))
    assert again.error_code == E.none and again.generation_id == gen
    new = str(again.member_id)
    assert new != old and new.startswith("i1-")
    assert heartbeat(h, new, gen, "i1") == E.none
    assert heartbeat(h, old, gen, "i1") == E.fenced_instance_id
    assert heartbeat(h, new, gen, "other") == E.unknown_member_id
    assert commit_as(h, old, gen, "i1") == E.fenced_instance_id
    assert commit_as(h, new, gen, "i1") == E.none
    fenced = done(h, sync(h, old, gen, instance="i1"), SYNC, 5)
    assert fenced.error_code == E.fenced_instance_id
    rejoin_old = done(h, join(h, old, instance="i1"))
    assert rejoin_old.error_code == E.fenced_instance_id


def test_static_members_leave_by_instance_id(h: Harness) -> None:
    member, _gen = static_member(h)
    resp = leave(h, [("wrong-id", "i1"), ("", "nobody")])
    assert [m.error_code for m in resp.members] == [E.fenced_instance_id, E.unknown_member_id]
    resp = leave(h, [("", "i1")])
    assert [m.error_code for m in resp.members] == [E.none]
    assert not h.coordinator.groups[GROUP].members
    assert heartbeat(h, member, 1, "i1") == E.unknown_member_id


def test_a_static_member_replaced_while_joining_gets_fenced(h: Harness) -> None:
    a = new_member(h)
    first = join(h, a)
    assert isinstance(first, Wait)  # a is alone: completes at once
    assert done(h, first).error_code == E.none
    waiting = join(h, instance="i9")  # a second member: a rebalance waits for a
    assert isinstance(waiting, Wait) and h.finish(waiting, JOIN, 9) is None
    replaced = join(h, instance="i9")
    assert isinstance(replaced, Wait)
    old = h.finish(waiting, JOIN, 9)
    assert old is not None and old.error_code == E.fenced_instance_id
