"""The broker side of KIP-227 fetch sessions (proxy.sessions.as_broker_cache), against Kafka's FetchSession.scala."""

from __future__ import annotations

import random
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.protocol.error_codes import (
    FETCH_SESSION_ID_NOT_FOUND,
    FETCH_SESSION_TOPIC_ID_ERROR,
    INVALID_FETCH_SESSION_EPOCH,
)
from proxy.protocol.messages import request_module
from proxy.protocol.partition_plan import PartitionPlan
from proxy.protocol.partition_result import PartitionResult, result_of
from proxy.sessions.as_broker_cache import (
    FetchContext,
    FetchSessionCache,
    FullFetchContext,
    IncrementalFetchContext,
    SessionErrorContext,
    SessionlessFetchContext,
    TopicIdPartition,
)
from proxy.sessions.kip227 import next_epoch

MAX = 2**31 - 1


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance_ms(self, ms: int) -> None:
        self.t += ms / 1000


def tp(name: str, p: int = 0, topic_id: uuid.UUID | None = None) -> TopicIdPartition:
    return TopicIdPartition(topic_id, name, p)


def req(offset: int = 0, max_bytes: int = 1000) -> PartitionPlan:
    return PartitionPlan(fetch_offset=offset, partition_max_bytes=max_bytes)


def out(hw: int = 10, lso: int = 0, size: int = 0, error: int = 0, **kw: int) -> PartitionResult:
    return PartitionResult(
        error_code=error, high_watermark=hw, log_start_offset=lso, records_size=size, **kw
    )


def ident(o: PartitionResult) -> PartitionResult:
    return o


def make_cache(slots: int = 10, clock: FakeClock | None = None) -> FetchSessionCache:
    return FetchSessionCache(
        max_slots=slots, eviction_ms=120_000, clock=clock or FakeClock(), rng=random.Random(7)
    )


def open_session(
    cache: FetchSessionCache,
    parts: list[TopicIdPartition],
    *,
    version: int = 12,
    follower: bool = False,
    outcomes: dict[TopicIdPartition, PartitionResult] | None = None,
) -> int:
    """Full fetch (0, 0) over *parts*; the new session's id (0 if none was created)."""
    data = {p: req() for p in parts}
    ctx = cache.new_context(version, 0, 0, follower, data, [], {})
    assert isinstance(ctx, FullFetchContext)
    updates = outcomes if outcomes is not None else {p: out() for p in parts}
    return ctx.update_and_generate_response_data(updates, ident).session_id


def incremental(
    cache: FetchSessionCache,
    sid: int,
    epoch: int,
    data: dict[TopicIdPartition, PartitionPlan] | None = None,
    forget: list[TopicIdPartition] | None = None,
    version: int = 12,
    names: dict[uuid.UUID, str] | None = None,
) -> FetchContext:
    return cache.new_context(version, sid, epoch, False, data or {}, forget or [], names or {})


def session_order(cache: FetchSessionCache, sid: int) -> list[str | None]:
    s = cache.get(sid)
    assert s is not None
    return [f"{cp.topic}-{cp.partition}" for cp in s.partitions.values()]


# -- epochs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prev", "nxt"), [(0, 1), (1, 2), (41, 42), (MAX - 1, MAX), (MAX, 1), (-1, -1), (-7, -1)]
)
def test_next_epoch(prev: int, nxt: int) -> None:
    assert next_epoch(prev) == nxt


@given(st.integers(0, MAX))
def test_next_epoch_never_returns_zero_for_sessions(epoch: int) -> None:
    assert 1 <= next_epoch(epoch) <= MAX


# -- the (session_id, epoch) table ------------------------------------------------------


def test_row_0_minus1_is_sessionless() -> None:
    cache = make_cache()
    a = tp("a")
    ctx = cache.new_context(12, 0, -1, False, {a: req(5)}, [], {})
    assert isinstance(ctx, SessionlessFetchContext)
    assert ctx.partitions() == [(a, req(5))]
    assert ctx.get_fetch_offset(a) == 5
    resp = ctx.update_and_generate_response_data({a: out()}, ident)
    assert (resp.error_code, resp.session_id, resp.partitions) == (0, 0, [(a, out())])
    assert len(cache) == 0


def test_row_0_0_creates_a_session_at_epoch_1() -> None:
    cache = make_cache()
    a, b = tp("a"), tp("b", 3)
    ctx = cache.new_context(12, 0, 0, False, {a: req(5), b: req(9, 77)}, [], {})
    assert isinstance(ctx, FullFetchContext)
    resp = ctx.update_and_generate_response_data(
        {a: out(hw=10, lso=2), b: out(hw=20, lso=3)}, ident
    )
    assert resp.error_code == 0 and 0 < resp.session_id <= MAX
    assert [p for p, _ in resp.partitions] == [a, b]
    s = cache.get(resp.session_id)
    assert s is not None and s.epoch == 1 and not s.privileged and not s.uses_topic_ids
    cb = s.find(b)
    assert cb is not None
    assert (cb.fetch_offset, cb.max_bytes, cb.high_watermark, cb.local_log_start_offset) == (
        9,
        77,
        20,
        3,
    )
    assert cache.num_partitions == 2 and cache.sessions_created == 1 and cache.num_sessions == 1


def test_row_id_0_closes_and_creates() -> None:
    cache = make_cache()
    old = open_session(cache, [tp("a")])
    ctx = cache.new_context(12, old, 0, False, {tp("b"): req()}, [], {})
    assert isinstance(ctx, FullFetchContext)
    assert cache.get(old) is None
    new = ctx.update_and_generate_response_data({tp("b"): out()}, ident).session_id
    assert new not in (0, old)
    assert session_order(cache, new) == ["b-0"]
    assert cache.num_partitions == 1


def test_row_id_minus1_closes_and_is_sessionless() -> None:
    cache = make_cache()
    old = open_session(cache, [tp("a")])
    ctx = cache.new_context(12, old, -1, False, {tp("a"): req()}, [], {})
    assert isinstance(ctx, SessionlessFetchContext)
    assert cache.get(old) is None and len(cache) == 0 and cache.num_partitions == 0
    assert ctx.update_and_generate_response_data({tp("a"): out()}, ident).session_id == 0


def test_full_fetch_naming_an_unknown_session_is_not_an_error() -> None:
    cache = make_cache()
    ctx = cache.new_context(12, 12345, 0, False, {tp("a"): req()}, [], {})
    assert isinstance(ctx, FullFetchContext)
    assert ctx.update_and_generate_response_data({tp("a"): out()}, ident).session_id != 0


def test_row_id_n_is_incremental_and_advances_the_epoch() -> None:
    cache = make_cache()
    a = tp("a")
    sid = open_session(cache, [a])
    ctx = incremental(cache, sid, 1)
    assert isinstance(ctx, IncrementalFetchContext)
    s = cache.get(sid)
    assert s is not None and s.epoch == 2
    assert ctx.partitions() == [(a, req())]
    resp = ctx.update_and_generate_response_data({a: out(size=5)}, ident)
    assert (resp.error_code, resp.session_id) == (0, sid)
    assert isinstance(incremental(cache, sid, 2), IncrementalFetchContext)


def test_unknown_session_id_is_fetch_session_id_not_found() -> None:
    cache = make_cache()
    open_session(cache, [tp("a")])
    for sid, epoch in [(999, 1), (0, 5)]:
        ctx = incremental(cache, sid, epoch, {tp("a"): req()})
        assert isinstance(ctx, SessionErrorContext)
        assert ctx.error_code == FETCH_SESSION_ID_NOT_FOUND
        assert ctx.partitions() == [] and ctx.get_fetch_offset(tp("a")) is None
        resp = ctx.update_and_generate_response_data({}, ident)
        assert (resp.error_code, resp.session_id, resp.partitions) == (70, 0, [])


@pytest.mark.parametrize("epoch", [2, 7, MAX, -2])
def test_wrong_epoch_is_invalid_fetch_session_epoch_and_changes_nothing(epoch: int) -> None:
    cache = make_cache()
    sid = open_session(cache, [tp("a")])
    ctx = incremental(cache, sid, epoch, {tp("b"): req()}, [tp("a")])
    assert isinstance(ctx, SessionErrorContext)
    assert ctx.error_code == INVALID_FETCH_SESSION_EPOCH
    resp = ctx.update_and_generate_response_data({}, ident)
    assert (resp.error_code, resp.session_id) == (71, 0)
    s = cache.get(sid)
    assert s is not None and s.epoch == 1 and session_order(cache, sid) == ["a-0"]


def test_replayed_epoch_is_refused() -> None:
    cache = make_cache()
    sid = open_session(cache, [tp("a")])
    assert isinstance(incremental(cache, sid, 1), IncrementalFetchContext)
    ctx = incremental(cache, sid, 1)
    assert isinstance(ctx, SessionErrorContext) and ctx.error_code == 71


def test_epoch_wraps_from_int32_max_to_1() -> None:
    cache = make_cache()
    sid = open_session(cache, [tp("a")])
    s = cache.get(sid)
    assert s is not None
    s.epoch = MAX
    assert isinstance(incremental(cache, sid, MAX), IncrementalFetchContext)
    assert s.epoch == 1
    assert isinstance(incremental(cache, sid, 1), IncrementalFetchContext)
    assert s.epoch == 2


def test_concurrent_request_in_session_makes_the_first_response_an_epoch_error() -> None:
    """updateAndGenerateResponseData re-checks the epoch (Kafka: 'Possible duplicate request')."""
    cache = make_cache()
    a = tp("a")
    sid = open_session(cache, [a])
    first = incremental(cache, sid, 1)
    second = incremental(cache, sid, 2)
    assert isinstance(first, IncrementalFetchContext)
    assert isinstance(second, IncrementalFetchContext)
    r1 = first.update_and_generate_response_data({a: out(size=1)}, ident)
    assert (r1.error_code, r1.session_id, r1.partitions) == (71, sid, [])
    assert first.throttled_response().error_code == 71
    r2 = second.update_and_generate_response_data({a: out(size=1)}, ident)
    assert r2.error_code == 0 and second.throttled_response().error_code == 0


def test_throttled_responses_carry_no_partitions() -> None:
    cache = make_cache()
    full = cache.new_context(12, 0, 0, False, {tp("a"): req()}, [], {})
    assert full.throttled_response().session_id == 0  # no session is created
    assert len(cache) == 0


@pytest.mark.parametrize(("created", "used"), [(12, 13), (13, 12), (7, 17), (17, 4)])
def test_topic_id_use_must_match_the_session(created: int, used: int) -> None:
    cache = make_cache()
    part = tp("a", topic_id=uuid.uuid4() if created >= 13 else None)
    sid = open_session(cache, [part], version=created)
    assert cache.get(sid) is not None
    ctx = incremental(cache, sid, 1, version=used)
    assert isinstance(ctx, SessionErrorContext)
    assert ctx.error_code == FETCH_SESSION_TOPIC_ID_ERROR
    s = cache.get(sid)
    assert s is not None and s.epoch == 1


def test_unresolved_topic_id_is_not_a_session_error_and_resolves_later() -> None:
    """Kafka keeps partitions with unknown ids in the session (fetch path answers UNKNOWN_TOPIC_ID)."""
    cache = make_cache()
    known, unknown = uuid.uuid4(), uuid.uuid4()
    a = TopicIdPartition(known, "a", 0)
    x = TopicIdPartition(unknown, None, 0)
    sid = open_session(cache, [a, x], version=13)
    ctx = incremental(cache, sid, 1, version=13, names={known: "a"})
    assert isinstance(ctx, IncrementalFetchContext)
    assert [p for p, _ in ctx.partitions()] == [a, x]
    ctx = incremental(cache, sid, 2, version=13, names={known: "a", unknown: "late"})
    assert [p.topic for p, _ in ctx.partitions()] == ["a", "late"]


def test_partitions_are_keyed_by_id_when_there_is_one() -> None:
    cache = make_cache()
    tid = uuid.uuid4()
    sid = open_session(cache, [TopicIdPartition(tid, None, 0)], version=13)
    # The same id with a name now known is the same partition (CachedPartition.equals).
    incremental(cache, sid, 1, {TopicIdPartition(tid, "a", 0): req(42)}, version=13)
    s = cache.get(sid)
    assert s is not None and s.size == 1
    assert s.get_fetch_offset(TopicIdPartition(tid, None, 0)) == 42


# -- incremental requests: add / update / forget ----------------------------------------


def test_incremental_adds_at_the_end_updates_in_place_and_forgets() -> None:
    cache = make_cache()
    a, b, c = tp("a"), tp("b"), tp("c")
    sid = open_session(cache, [a, b])
    ctx = incremental(cache, sid, 1, {c: req(3), a: req(99, 5)}, [b])
    assert isinstance(ctx, IncrementalFetchContext)
    assert ctx.partitions() == [(a, req(99, 5)), (c, req(3))]
    assert ctx.get_fetch_offset(a) == 99 and ctx.get_fetch_offset(b) is None
    assert cache.num_partitions == 2


def test_an_incremental_update_keeps_every_request_parameter_the_client_sent() -> None:
    """Kafka's ``CachedPartition.updateRequestParams`` takes all five: the last fetched
    epoch too (KIP-595), which the broker's diverging-epoch check reads.  A session that
    kept the one its full fetch sent would ask with a stale epoch once the consumer has
    read into a new leader epoch, and the broker would answer a diverging epoch (a
    truncation that did not happen) at every fetch past the new epoch's start."""
    cache = make_cache()
    a = tp("a")
    data = {a: PartitionPlan(5, 1000, 0, current_leader_epoch=1, last_fetched_epoch=1)}
    ctx = cache.new_context(12, 0, 0, False, data, [], {})
    assert isinstance(ctx, FullFetchContext)
    sid = ctx.update_and_generate_response_data({a: out()}, ident).session_id
    moved = PartitionPlan(40, 2000, 3, current_leader_epoch=2, last_fetched_epoch=2)
    ctx = incremental(cache, sid, 1, {a: moved})
    assert isinstance(ctx, IncrementalFetchContext)
    assert ctx.partitions() == [(a, moved)]


def test_forgetting_an_unknown_partition_is_ignored() -> None:
    cache = make_cache()
    sid = open_session(cache, [tp("a")])
    ctx = incremental(cache, sid, 1, forget=[tp("zzz"), tp("a", 1)])
    assert isinstance(ctx, IncrementalFetchContext)
    assert session_order(cache, sid) == ["a-0"]


def test_forgetting_every_partition_closes_the_session() -> None:
    cache = make_cache()
    a, b = tp("a"), tp("b")
    sid = open_session(cache, [a, b])
    ctx = incremental(cache, sid, 1, forget=[a, b])
    assert isinstance(ctx, SessionlessFetchContext)
    assert cache.get(sid) is None and cache.num_partitions == 0
    assert ctx.update_and_generate_response_data({}, ident).session_id == 0
    assert isinstance(incremental(cache, sid, 1), SessionErrorContext)


# -- incremental responses: inclusion rules and rotation --------------------------------


@pytest.mark.parametrize(
    ("outcome", "included"),
    [
        (out(hw=10, lso=0), False),
        (out(hw=10, lso=0, size=1), True),
        (out(hw=11, lso=0), True),
        (out(hw=10, lso=4), True),
        (out(hw=10, lso=0, error=6), True),
        (out(hw=10, lso=0, diverging_epoch=3), True),
        (out(hw=10, lso=0, diverging_epoch=0), True),
        (out(hw=10, lso=0, preferred_read_replica=2), True),
    ],
)
def test_incremental_inclusion_rules(outcome: PartitionResult, included: bool) -> None:
    cache = make_cache()
    a, b = tp("a"), tp("b")
    sid = open_session(cache, [a, b], outcomes={a: out(hw=10, lso=0), b: out(hw=10, lso=0)})
    ctx = incremental(cache, sid, 1)
    resp = ctx.update_and_generate_response_data({a: outcome, b: out(hw=10, lso=0)}, ident)
    assert [p for p, _ in resp.partitions] == ([a] if included else [])


def test_changes_are_sent_once_then_remembered() -> None:
    cache = make_cache()
    a = tp("a")
    sid = open_session(cache, [a], outcomes={a: out(hw=10)})
    r1 = incremental(cache, sid, 1).update_and_generate_response_data({a: out(hw=12)}, ident)
    r2 = incremental(cache, sid, 2).update_and_generate_response_data({a: out(hw=12)}, ident)
    assert len(r1.partitions) == 1 and r2.partitions == []


def test_the_same_quiet_data_again_is_left_out_without_being_read() -> None:
    """A partition left out of an answer keeps the data object it was given (a shared
    empty entry); that same object again is left out without calling ``outcome`` on it,
    anything else is read and judged as always."""
    cache = make_cache()
    a = tp("a")
    sid = open_session(cache, [a], outcomes={a: out(hw=10)})
    quiet, read = out(hw=10), []

    def counted(o: PartitionResult) -> PartitionResult:
        read.append(o)
        return o

    r1 = incremental(cache, sid, 1).update_and_generate_response_data({a: quiet}, counted)
    r2 = incremental(cache, sid, 2).update_and_generate_response_data({a: quiet}, counted)
    assert r1.partitions == [] and r2.partitions == [] and read == [quiet]
    r3 = incremental(cache, sid, 3).update_and_generate_response_data({a: out(hw=12)}, counted)
    assert [p for p, _ in r3.partitions] == [a]
    r4 = incremental(cache, sid, 4).update_and_generate_response_data({a: quiet}, counted)
    assert [p for p, _ in r4.partitions] == [a]  # the watermark went from 12 back to 10


def test_data_with_records_is_never_kept_as_quiet() -> None:
    """Records keep their response frame in memory: a partition's data with records is
    judged every time, and not held by the session."""
    cache = make_cache()
    a = tp("a")
    sid = open_session(cache, [a], outcomes={a: out(hw=10)})
    with_records = out(hw=10, size=5)
    for epoch in (1, 2):
        resp = incremental(cache, sid, epoch).update_and_generate_response_data(
            {a: with_records}, ident
        )
        assert [p for p, _ in resp.partitions] == [a]
    s = cache.get(sid)
    assert s is not None and s.partitions[a.session_key].quiet is None


def test_a_session_partition_rebuilds_its_request_entity_only_when_its_plan_changes() -> None:
    cache = make_cache()
    a = tp("a")
    sid = open_session(cache, [a])
    s = cache.get(sid)
    assert s is not None
    cp = s.partitions[a.session_key]
    mod = request_module(1, 12)
    first = cp.request_partition(mod)
    assert cp.request_partition(mod) is first
    assert cp.request_partition(request_module(1, 13)) is not first  # another version's class
    incremental(cache, sid, 1, {a: req(7, 300)})
    moved = cp.request_partition(request_module(1, 13))
    assert (moved.fetch_offset, moved.partition_max_bytes) == (7, 300)
    assert cp.plan() == req(7, 300)


def test_an_error_resets_the_cached_high_watermark_so_recovery_is_sent() -> None:
    cache = make_cache()
    a = tp("a")
    sid = open_session(cache, [a], outcomes={a: out(hw=10)})
    r1 = incremental(cache, sid, 1).update_and_generate_response_data(
        {a: out(hw=10, error=6)}, ident
    )
    s = cache.get(sid)
    assert s is not None and s.partitions[a.session_key].high_watermark == -1
    r2 = incremental(cache, sid, 2).update_and_generate_response_data({a: out(hw=10)}, ident)
    assert len(r1.partitions) == 1 and len(r2.partitions) == 1


def test_full_fetch_session_order_is_the_response_order() -> None:
    cache = make_cache()
    a, b, c = tp("a"), tp("b"), tp("c")
    ctx = cache.new_context(12, 0, 0, False, {a: req(), b: req(), c: req()}, [], {})
    # The dev broker appends partitions refused before reading after the read ones.
    sid = ctx.update_and_generate_response_data({a: out(), c: out(), b: out()}, ident).session_id
    assert session_order(cache, sid) == ["a-0", "c-0", "b-0"]


def test_partitions_that_returned_data_move_to_the_end() -> None:
    cache = make_cache()
    a, b, c, d = tp("a"), tp("b"), tp("c"), tp("d")
    sid = open_session(cache, [a, b, c, d])
    ctx = incremental(cache, sid, 1)
    updates = {a: out(size=3), b: out(hw=11), c: out(size=1), d: out()}
    resp = ctx.update_and_generate_response_data(updates, ident)
    assert [p for p, _ in resp.partitions] == [a, b, c]
    assert session_order(cache, sid) == ["b-0", "d-0", "a-0", "c-0"]
    assert [p for p, _ in incremental(cache, sid, 2).partitions()] == [b, d, a, c]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 3),  # records size
            st.sampled_from([10, 11]),  # high watermark (10 = unchanged)
            st.sampled_from([0, 0, 0, 6]),  # error code
        ),
        min_size=1,
        max_size=8,
    )
)
def test_rotation_and_inclusion_property(
    changes: list[tuple[int, int, int]],
) -> None:
    cache = make_cache()
    parts = [tp("t", i) for i in range(len(changes))]
    sid = open_session(cache, parts, outcomes={p: out(hw=10) for p in parts})
    updates = {
        p: out(hw=hw, size=size, error=err)
        for p, (size, hw, err) in zip(parts, changes, strict=True)
    }
    resp = incremental(cache, sid, 1).update_and_generate_response_data(updates, ident)
    expected = [
        p for p, (size, hw, err) in zip(parts, changes, strict=True) if size or hw != 10 or err
    ]
    assert [p for p, _ in resp.partitions] == expected
    with_data = [p for p, (size, _, _) in zip(parts, changes, strict=True) if size]
    without = [p for p in parts if p not in with_data]
    s = cache.get(sid)
    assert s is not None
    assert [cp.topic_id_partition for cp in s.partitions.values()] == without + with_data


# -- the cache: slots and eviction ------------------------------------------------------


def test_session_ids_are_random_positive_and_unique() -> None:
    cache = make_cache(slots=200)
    ids = {open_session(cache, [tp("a")]) for _ in range(200)}
    assert len(ids) == 200 and all(0 < i < MAX for i in ids)


def test_full_cache_answers_without_a_session() -> None:
    clock = FakeClock()
    cache = make_cache(slots=2, clock=clock)
    s1, s2 = open_session(cache, [tp("a")]), open_session(cache, [tp("b")])
    assert s1 and s2
    ctx = cache.new_context(12, 0, 0, False, {tp("c"): req()}, [], {})
    resp = ctx.update_and_generate_response_data({tp("c"): out()}, ident)
    assert resp.session_id == 0 and [p for p, _ in resp.partitions] == [tp("c")]
    assert len(cache) == 2 and cache.evictions == 0


def test_zero_slots_never_creates_sessions() -> None:
    cache = make_cache(slots=0)
    assert open_session(cache, [tp("a")]) == 0


def test_stale_session_is_evicted_first() -> None:
    clock = FakeClock()
    cache = make_cache(slots=2, clock=clock)
    s1 = open_session(cache, [tp("a"), tp("b"), tp("c")])
    clock.advance_ms(1)
    s2 = open_session(cache, [tp("d")])
    clock.advance_ms(120_000)  # s1 idle for 120_001 ms: stale; s2 idle for exactly 120_000: not
    s3 = open_session(cache, [tp("e")])
    assert s3 != 0 and cache.get(s1) is None and cache.get(s2) is not None
    assert cache.evictions == 1 and cache.num_partitions == 2
    assert isinstance(incremental(cache, s1, 1), SessionErrorContext)


def test_idle_for_exactly_eviction_ms_is_not_stale() -> None:
    clock = FakeClock()
    cache = make_cache(slots=1, clock=clock)
    s1 = open_session(cache, [tp("a")])
    clock.advance_ms(120_000)
    assert open_session(cache, [tp("b")]) == 0
    assert cache.get(s1) is not None


def test_using_a_session_keeps_it_from_going_stale() -> None:
    clock = FakeClock()
    cache = make_cache(slots=2, clock=clock)
    s1 = open_session(cache, [tp("a")])
    s2 = open_session(cache, [tp("b")])
    clock.advance_ms(100_000)
    incremental(cache, s1, 1)  # touch s1
    clock.advance_ms(50_000)  # s2 idle 150 s, s1 idle 50 s
    s3 = open_session(cache, [tp("c")])
    assert s3 and cache.get(s2) is None and cache.get(s1) is not None


def test_privileged_session_evicts_a_young_consumer_session() -> None:
    clock = FakeClock()
    cache = make_cache(slots=2, clock=clock)
    c1 = open_session(cache, [tp("a"), tp("b")])
    c2 = open_session(cache, [tp("c")])
    f1 = open_session(cache, [tp("x")], follower=True)
    assert f1 != 0
    # The smallest consumer session goes (EvictableKey order: privileged, size, id).
    assert cache.get(c2) is None and cache.get(c1) is not None
    s = cache.get(f1)
    assert s is not None and s.privileged


def test_young_sessions_cannot_be_evicted_by_consumers_whatever_their_size() -> None:
    clock = FakeClock()
    cache = make_cache(slots=1, clock=clock)
    c1 = open_session(cache, [tp("a")])
    clock.advance_ms(60_000)
    big = [tp("t", i) for i in range(50)]
    assert open_session(cache, big) == 0
    assert cache.get(c1) is not None


def test_young_privileged_sessions_are_not_evicted_even_by_followers() -> None:
    cache = make_cache(slots=1)
    f1 = open_session(cache, [tp("a")], follower=True)
    assert open_session(cache, [tp("t", i) for i in range(9)], follower=True) == 0
    assert cache.get(f1) is not None


def old_but_recently_used(clock: FakeClock, cache: FetchSessionCache, sid: int, epoch: int) -> None:
    """Make a session older than eviction_ms (and so evictable by size) but not stale."""
    clock.advance_ms(120_001)
    assert isinstance(incremental(cache, sid, epoch), IncrementalFetchContext)


def test_larger_session_evicts_an_older_smaller_one() -> None:
    clock = FakeClock()
    cache = make_cache(slots=1, clock=clock)
    c1 = open_session(cache, [tp("a"), tp("b")])
    old_but_recently_used(clock, cache, c1, 1)
    assert open_session(cache, [tp("x"), tp("y")]) == 0  # equal size: not more valuable
    assert cache.get(c1) is not None
    c2 = open_session(cache, [tp("x"), tp("y"), tp("z")])
    assert c2 != 0 and cache.get(c1) is None and cache.evictions == 1


def test_consumer_cannot_evict_an_old_privileged_session() -> None:
    clock = FakeClock()
    cache = make_cache(slots=1, clock=clock)
    f1 = open_session(cache, [tp("a")], follower=True)
    old_but_recently_used(clock, cache, f1, 1)
    assert open_session(cache, [tp("t", i) for i in range(20)]) == 0
    assert cache.get(f1) is not None


def test_follower_evicts_old_privileged_session_by_size() -> None:
    clock = FakeClock()
    cache = make_cache(slots=1, clock=clock)
    f1 = open_session(cache, [tp("a")], follower=True)
    old_but_recently_used(clock, cache, f1, 1)
    f2 = open_session(cache, [tp("a"), tp("b")], follower=True)
    assert f2 != 0 and cache.get(f1) is None


def test_clear_drops_every_session() -> None:
    cache = make_cache()
    sid = open_session(cache, [tp("a"), tp("b")])
    cache.clear()
    assert len(cache) == 0 and cache.num_partitions == 0
    ctx = incremental(cache, sid, 1)
    assert isinstance(ctx, SessionErrorContext) and ctx.error_code == FETCH_SESSION_ID_NOT_FOUND


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["full", "close", "incr", "incr_bad", "tick"]),
            st.integers(0, 5),
            st.booleans(),
        ),
        max_size=40,
    )
)
def test_cache_invariants(ops: list[tuple[str, int, bool]]) -> None:
    clock = FakeClock()
    cache = make_cache(slots=3, clock=clock)
    for op, n, flag in ops:
        live = cache.sessions()
        if op == "full":
            open_session(cache, [tp("t", i) for i in range(n + 1)], follower=flag)
        elif op == "tick":
            clock.advance_ms(n * 40_000)
        elif live:
            s = live[n % len(live)]
            if op == "close":
                cache.new_context(12, s.id, -1, False, {}, [], {})
            elif op == "incr":
                forget = [tp("t", 0)] if flag else []
                ctx = incremental(cache, s.id, s.epoch, {tp("u", n): req()}, forget)
                assert isinstance(ctx, IncrementalFetchContext)
            else:
                ctx = incremental(cache, s.id, s.epoch + 1)
                assert isinstance(ctx, SessionErrorContext)
        assert len(cache) <= 3
        assert cache.num_partitions == sum(s.size for s in cache.sessions())
        assert all(s.id > 0 and s.epoch >= 1 for s in cache.sessions())


def test_result_of_reads_a_kio_partition_of_any_version() -> None:
    from kio.schema.errors import ErrorCode
    from kio.schema.fetch.v4.response import PartitionData as V4
    from kio.schema.fetch.v17.response import EpochEndOffset
    from kio.schema.fetch.v17.response import PartitionData as V17

    v4 = V4(
        partition_index=0,
        error_code=ErrorCode.none,
        high_watermark=5,
        aborted_transactions=None,
        records=b"abc",
    )
    assert result_of(v4) == out(hw=5, lso=-1, size=3)
    v17 = V17(
        partition_index=0,
        error_code=ErrorCode.not_leader_or_follower,
        high_watermark=-1,
        last_stable_offset=4,
        log_start_offset=-1,
        diverging_epoch=EpochEndOffset(epoch=2, end_offset=9),
        aborted_transactions=None,
        records=None,
    )
    assert result_of(v17) == out(hw=-1, lso=-1, error=6, diverging_epoch=2, last_stable_offset=4)
