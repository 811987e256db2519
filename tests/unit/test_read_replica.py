"""The proxy following a preferred read replica itself (proxy.relay.read_replica), sans-I/O.

Requests and answers are kio Fetch messages at the client's version (v10, which
has no rack and no ``preferred_read_replica``, and v12 which has both); the
answers of the leader and of the replica are built here as the brokers would
give them, and every merged answer is encoded and decoded again to show it is a
valid Fetch response of the client's version.
"""

from __future__ import annotations

import random
from datetime import timedelta
from typing import Any

import pytest
from support.dev_upstream import batch
from support.fetch_messages import fetch_request, fetch_response, fetch_topics, partition_data

from proxy.protocol import codec, error_codes
from proxy.protocol.messages import make, request_module, response_module
from proxy.relay.racks import FallbackReason, RackMap
from proxy.relay.read_replica import (
    ReadReplicas,
    Watermarks,
    merge,
    requested_keys,
    split,
)

LEADER_NODE = 1
REPLICA = 2
T = "orders"


def fetch(version: int, parts: list[tuple[str, int, int]], *, epoch: int = 5) -> Any:
    mod = request_module(1, version)
    pairs = []
    for name, p, offset in parts:
        fp = make(
            mod.FetchPartition,
            partition=p,
            current_leader_epoch=epoch,
            fetch_offset=offset,
            last_fetched_epoch=-1,
            log_start_offset=-1,
            partition_max_bytes=1 << 20,
        )
        pairs.append((name, fp))
    return fetch_request(
        version, fetch_topics(version, pairs), max_wait=timedelta(milliseconds=500)
    )


def pdata(
    version: int,
    p: int,
    *,
    error: int = 0,
    hw: int = 0,
    lso: int | None = None,
    start: int = 0,
    records: bytes | None = None,
    redirect: int = -1,
) -> Any:
    return partition_data(
        version,
        p,
        error_code=error_codes_of(error),
        high_watermark=hw,
        last_stable_offset=hw if lso is None else lso,
        log_start_offset=start,
        aborted_transactions=None,
        preferred_read_replica=redirect,
        records=records,
    )


def error_codes_of(code: int) -> Any:
    from kio.schema.errors import ErrorCode

    return ErrorCode(code)


def answer(version: int, topics: list[tuple[str, list[Any]]], *, error: int = 0) -> Any:
    mod = response_module(1, version)
    return fetch_response(
        version,
        (make(mod.FetchableTopicResponse, topic=n, partitions=tuple(ps)) for n, ps in topics),
        error_code=error_codes_of(error),
    )


def wire(version: int, response: Any) -> Any:
    """*response* encoded and decoded again (it is a valid Fetch response of *version*)."""
    _, back = codec.decode_response(1, version, codec.encode_response(response, 7))
    return back


def parts_of(response: Any) -> list[tuple[str, int, Any]]:
    return [
        (t.topic, int(pd.partition_index), pd) for t in response.responses for pd in t.partitions
    ]


# -- the map --------------------------------------------------------------------------


def test_a_preferred_replica_is_kept_until_its_expiry_then_the_leader_again() -> None:
    rr = ReadReplicas(expiry_seconds=300.0)
    rr.learn({(T, 0): REPLICA, (T, 1): -1}, now=10.0)
    assert rr.replica((T, 0), 309.9) == REPLICA
    assert rr.replica((T, 1), 10.0) is None  # -1 names no replica
    assert rr.replica((T, 0), 310.0) is None  # expired: the leader decides again
    assert len(rr) == 0


def test_the_map_is_bounded_and_forgets_partitions_no_longer_fetched() -> None:
    rr = ReadReplicas(max_partitions=3)
    rr.learn({(T, p): REPLICA for p in range(5)}, now=0.0)
    assert len(rr) == 3 and (T, 0) not in rr and (T, 4) in rr
    rr.retain([(T, 4)])
    assert len(rr) == 1
    with pytest.raises(ValueError):
        ReadReplicas(expiry_seconds=0)


def test_routes_drop_a_replica_the_edge_cannot_reach_or_that_left_the_isr() -> None:
    racks = RackMap("b")
    racks.learn_leader(T, 0, LEADER_NODE, [1, 2, 3])
    racks.learn_leader(T, 1, LEADER_NODE, [1, 3])  # node 2 left the ISR of partition 1
    rr = ReadReplicas()
    rr.learn({(T, 0): REPLICA, (T, 1): REPLICA, (T, 2): 3}, now=0.0)
    routes, dropped = rr.routes(
        [(T, 0), (T, 1), (T, 2), (T, 3)],
        1.0,
        available=lambda node: node != 3,
        in_sync=racks.in_sync,
    )
    assert routes == {(T, 0): REPLICA}
    assert dropped == [
        ((T, 1), FallbackReason.NOT_IN_ISR),
        ((T, 2), FallbackReason.REPLICA_UNAVAILABLE),
    ]
    assert (T, 1) not in rr and (T, 2) not in rr
    assert racks.in_sync((T, 5), 2) is None  # not known: kept


# -- split ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", [10, 12])
def test_split_moves_routed_partitions_to_the_replica_with_the_clients_epochs(
    version: int,
) -> None:
    request = fetch(version, [(T, 0, 100), (T, 1, 200), ("events", 0, 7)], epoch=9)
    plan = split(request, {(T, 1): REPLICA, ("events", 0): REPLICA, ("gone", 0): 3})
    assert plan.leader is not None and plan.leader.max_wait == timedelta(0)
    assert requested_keys(plan.leader) == [(T, 0)]
    replica = plan.replicas[REPLICA]
    assert set(plan.replicas) == {REPLICA}  # a route for a partition not fetched is ignored
    assert requested_keys(replica) == [(T, 1), ("events", 0)]
    assert replica.session_id == 0 and replica.session_epoch == -1
    assert replica.max_wait == request.max_wait
    assert [p.current_leader_epoch for t in replica.topics for p in t.partitions] == [9, 9]
    assert [p.fetch_offset for t in replica.topics for p in t.partitions] == [200, 7]
    # the answers together are bounded as the client's one fetch was
    assert plan.leader.max_bytes + replica.max_bytes <= request.max_bytes
    assert split(request, {}).leader is request


def test_a_fetch_wholly_redirected_sends_nothing_to_the_leader() -> None:
    request = fetch(10, [(T, 0, 1), (T, 1, 2)])
    plan = split(request, {(T, 0): REPLICA, (T, 1): REPLICA})
    assert plan.leader is None
    assert plan.replicas[REPLICA].max_bytes == request.max_bytes


# -- merge ----------------------------------------------------------------------------


def test_merge_answers_in_the_clients_order_with_the_replicas_records() -> None:
    version = 10
    request = fetch(version, [(T, 0, 0), (T, 1, 0), (T, 2, 0)])
    rr = ReadReplicas()
    rr.learn({(T, 1): REPLICA}, 0.0)
    plan = split(request, rr.routes(requested_keys(request), 0.0)[0])
    data = batch(3)
    leader = answer(version, [(T, [pdata(version, 2, hw=4), pdata(version, 0, hw=9)])])
    replica = answer(version, [(T, [pdata(version, 1, hw=3, records=data)])])
    merged = merge(
        plan, leader, {REPLICA: replica}, watermarks=Watermarks(), read_replicas=rr, now=1.0
    )
    out = parts_of(wire(version, merged.response))
    assert [(t, p) for t, p, _ in out] == [(T, 0), (T, 1), (T, 2)]
    assert bytes(out[1][2].records) == data and out[0][2].high_watermark == 9
    assert sorted(merged.served, key=str) == sorted(
        [((T, 0), None, 0), ((T, 1), REPLICA, len(data)), ((T, 2), None, 0)], key=str
    )
    assert merged.fallbacks == ()


def test_a_leaders_redirect_is_followed_and_never_reaches_the_client() -> None:
    version = 12  # the field exists: a client that ignores redirects must not see one
    request = fetch(version, [(T, 0, 5)])
    rr = ReadReplicas()
    plan = split(request, rr.routes(requested_keys(request), 0.0)[0])
    leader = answer(version, [(T, [pdata(version, 0, hw=8, redirect=REPLICA)])])
    merged = merge(plan, leader, {}, watermarks=Watermarks(), read_replicas=rr, now=0.0)
    (_, _, pd) = parts_of(wire(version, merged.response))[0]
    assert pd.preferred_read_replica == -1 and not pd.records and pd.high_watermark == 8
    assert merged.redirects == {(T, 0): REPLICA}
    assert rr.replica((T, 0), 1.0) == REPLICA  # the next fetch goes to the replica
    nxt = split(request, rr.routes(requested_keys(request), 1.0)[0])
    assert nxt.leader is None and list(nxt.replicas) == [REPLICA]


def test_the_high_watermark_the_client_sees_never_goes_back() -> None:
    version = 10
    request = fetch(version, [(T, 0, 10)])
    rr, wm = ReadReplicas(), Watermarks()
    first = merge(
        split(request, {}),
        answer(version, [(T, [pdata(version, 0, hw=20, lso=18, start=3, redirect=-1)])]),
        {},
        watermarks=wm,
        read_replicas=rr,
        now=0.0,
    )
    assert parts_of(first.response)[0][2].high_watermark == 20
    rr.learn({(T, 0): REPLICA}, 0.0)
    plan = split(request, rr.routes(requested_keys(request), 0.0)[0])
    # the follower learns the high watermark later
    behind = answer(version, [(T, [pdata(version, 0, hw=15, lso=12, start=2, records=batch(1))])])
    merged = merge(plan, None, {REPLICA: behind}, watermarks=wm, read_replicas=rr, now=0.1)
    pd = parts_of(wire(version, merged.response))[0][2]
    assert (pd.high_watermark, pd.last_stable_offset, pd.log_start_offset) == (20, 18, 3)
    assert pd.records  # the records are the follower's, as it gave them


@pytest.mark.parametrize(
    ("code", "reason"),
    [
        (error_codes.OFFSET_OUT_OF_RANGE, FallbackReason.OFFSET_OUT_OF_RANGE),
        (error_codes.NOT_LEADER_OR_FOLLOWER, FallbackReason.NOT_LEADER_OR_FOLLOWER),
        (error_codes.FENCED_LEADER_EPOCH, FallbackReason.LEADER_EPOCH),
        (error_codes.UNKNOWN_LEADER_EPOCH, FallbackReason.LEADER_EPOCH),
        (3, FallbackReason.OTHER),  # UNKNOWN_TOPIC_OR_PARTITION: the leader will say
    ],
)
def test_a_replica_error_is_an_empty_answer_and_the_leader_next(
    code: int, reason: FallbackReason
) -> None:
    """A follower may answer OFFSET_OUT_OF_RANGE for an offset the leader has: the client
    must not reset, so it gets no error and asks the same offset again, of the leader."""
    version = 10
    request = fetch(version, [(T, 0, 42), (T, 1, 7)])
    rr, wm = ReadReplicas(), Watermarks()
    rr.learn({(T, 0): REPLICA, (T, 1): REPLICA}, 0.0)
    plan = split(request, rr.routes(requested_keys(request), 0.0)[0])
    replica = answer(
        version,
        [
            (
                T,
                [
                    pdata(version, 0, error=code, hw=-1, start=-1),
                    pdata(version, 1, hw=9, records=batch(2)),
                ],
            )
        ],
    )
    merged = merge(plan, None, {REPLICA: replica}, watermarks=wm, read_replicas=rr, now=0.0)
    pd0 = parts_of(wire(version, merged.response))[0][2]
    assert pd0.error_code == 0 and not pd0.records and pd0.high_watermark >= 42
    assert [(f.key, f.node, f.reason) for f in merged.fallbacks] == [((T, 0), REPLICA, reason)]
    assert (T, 0) not in rr and rr.replica((T, 1), 0.0) == REPLICA
    nxt = split(request, rr.routes(requested_keys(request), 0.0)[0])
    assert nxt.leader is not None and requested_keys(nxt.leader) == [(T, 0)]
    assert ((T, 0), REPLICA, 0) not in merged.served


def test_a_lost_replica_connection_answers_empty_and_falls_back() -> None:
    version = 10
    request = fetch(version, [(T, 0, 3), (T, 1, 4)])
    rr, wm = ReadReplicas(), Watermarks()
    rr.learn({(T, 0): REPLICA, (T, 1): REPLICA}, 0.0)
    wm.apply((T, 0), pdata(version, 0, hw=11))
    plan = split(request, rr.routes(requested_keys(request), 0.0)[0])
    merged = merge(plan, None, {REPLICA: None}, watermarks=wm, read_replicas=rr, now=0.0)
    out = parts_of(wire(version, merged.response))
    assert [(p, pd.error_code, pd.high_watermark, pd.records) for _, p, pd in out] == [
        (0, 0, 11, None),  # what the client saw before, never less
        (1, 0, 4, None),  # never seen: its own offset
    ]
    assert {f.reason for f in merged.fallbacks} == {FallbackReason.REPLICA_UNAVAILABLE}
    assert len(rr) == 0 and merged.served == ()


def test_a_leader_error_is_the_clients_answer_and_no_replica_record_is_delivered() -> None:
    version = 10
    request = fetch(version, [(T, 0, 0), (T, 1, 0)])
    rr = ReadReplicas()
    rr.learn({(T, 1): REPLICA}, 0.0)
    plan = split(request, rr.routes(requested_keys(request), 0.0)[0])
    leader = answer(version, [], error=error_codes.INVALID_FETCH_SESSION_EPOCH)
    replica = answer(version, [(T, [pdata(version, 1, hw=1, records=batch(1))])])
    merged = merge(
        plan, leader, {REPLICA: replica}, watermarks=Watermarks(), read_replicas=rr, now=0
    )
    assert merged.response is leader and merged.served == ()


def test_a_replica_stuck_below_the_clients_offset_falls_back_after_max_lagging() -> None:
    version = 10
    request = fetch(version, [(T, 0, 50)])
    rr, wm = ReadReplicas(max_lagging=3), Watermarks()
    rr.learn({(T, 0): REPLICA}, 0.0)
    reasons = []
    for _ in range(3):
        plan = split(request, rr.routes(requested_keys(request), 0.0)[0])
        assert plan.leader is None
        stuck = answer(version, [(T, [pdata(version, 0, hw=40)])])
        merged = merge(plan, None, {REPLICA: stuck}, watermarks=wm, read_replicas=rr, now=0.0)
        reasons += [f.reason for f in merged.fallbacks]
    assert reasons == [FallbackReason.REPLICA_LAGGING]
    assert (T, 0) not in rr


# -- a consumer over many exchanges: nothing lost, nothing repeated ------------------


@pytest.mark.parametrize("seed", range(20))
def test_a_consumer_behind_the_proxy_gets_every_offset_once(seed: int) -> None:
    """A leader with a growing log and a follower that lags, fails and errs at random;
    a v10 consumer that only advances past what it receives reads every offset once,
    in order, and never sees the high watermark go back."""
    rng = random.Random(seed)
    version = 10
    log_end = 0  # the leader's log end (= its high watermark here)
    follower_end = 0
    rr, wm = ReadReplicas(expiry_seconds=5.0), Watermarks()
    position, got, last_hw, now = 0, [], 0, 0.0
    from_replica, fallbacks = 0, set()
    for _ in range(200):
        now += 0.5
        log_end += rng.randrange(0, 4)
        follower_end = min(log_end, follower_end + rng.randrange(0, 4))
        request = fetch(version, [(T, 0, position)])
        plan = split(request, rr.routes(requested_keys(request), now)[0])

        def serve(at: int, log: int, hw: int, *, redirect: bool = False) -> Any:
            """A broker's answer for offset *at*: its log ends at *log*, it serves up to *hw*."""
            if at > log:
                return pdata(version, 0, error=error_codes.OFFSET_OUT_OF_RANGE, hw=-1, start=-1)
            count = min(hw - at, 3)
            records = _batch_at(at, count) if count > 0 and not redirect else None
            return pdata(version, 0, hw=hw, records=records)

        leader, leader_redirects = None, {}
        if plan.leader is not None:
            # upstream, the proxy's fetch is v11+ with its rack; the v10 answer lost the field
            redirect = rng.random() < 0.7
            leader = answer(version, [(T, [serve(position, log_end, log_end, redirect=redirect)])])
            leader_redirects = {(T, 0): REPLICA} if redirect else {}
        replicas: dict[int, Any] = {}
        for node in plan.replicas:
            fate = rng.random()
            if fate < 0.1:
                replicas[node] = None  # connection lost
            elif fate < 0.15:
                replicas[node] = answer(
                    version, [(T, [pdata(version, 0, error=error_codes.NOT_LEADER_OR_FOLLOWER)])]
                )
            else:
                follower_hw = max(0, follower_end - rng.randrange(0, 3))
                replicas[node] = answer(
                    version, [(T, [serve(position, follower_end, follower_hw)])]
                )
        merged = merge(
            plan,
            leader,
            replicas,
            watermarks=wm,
            read_replicas=rr,
            now=now,
            leader_redirects=leader_redirects,
        )
        from_replica += sum(n for _, node, n in merged.served if node == REPLICA)
        fallbacks.update(f.reason for f in merged.fallbacks)
        (_, _, pd) = parts_of(merged.response)[0]
        assert pd.error_code == 0
        assert pd.high_watermark >= last_hw
        last_hw = pd.high_watermark
        if pd.records:
            base, count = _offsets(bytes(pd.records))
            assert base == position
            got.extend(range(base, base + count))
            position = base + count
    assert got == list(range(len(got)))
    assert position > 50  # it made progress through all of that
    assert from_replica > 0 and FallbackReason.REPLICA_UNAVAILABLE in fallbacks


def _batch_at(base: int, count: int) -> bytes:
    from support.batches import make_batch

    return make_batch(base, count, b"v")


def _offsets(records: bytes) -> tuple[int, int]:
    from proxy.protocol.records import iter_batches

    batches = list(iter_batches(records))
    return int(batches[0].base_offset), batches[-1].next_offset - int(batches[0].base_offset)
