"""A dev-cluster node's fetch session cache: Kafka's eight shards, their slots and id ranges."""

from __future__ import annotations

import random
import uuid

import pytest
from support.dispatch import Harness, Wait
from support.fetch_messages import fetch_body, partition_body

from devbroker.fetch import NodeFetcher
from devbroker.session_cache import (
    NUM_SHARDS,
    SESSION_ID_RANGE,
    SessionIdOutOfRange,
    ShardedSessionCache,
    shard_index,
)
from proxy.protocol.partition_plan import PartitionPlan
from proxy.protocol.partition_result import PartitionResult
from proxy.sessions.as_broker_cache import TopicIdPartition

FETCH = 1
TID = uuid.UUID(int=42)
PART = {TopicIdPartition(TID, "t", 0): PartitionPlan(fetch_offset=0, partition_max_bytes=1024)}


def open_session(cache: ShardedSessionCache) -> int:
    """A full fetch creating a session (epoch 0); its id, or 0 when none was created."""
    context = cache.new_context(13, 0, 0, False, PART, [], {TID: "t"})
    return context.update_and_generate_response_data({k: None for k in PART}, outcome).session_id


def outcome(_data: object) -> PartitionResult:
    return PartitionResult(error_code=0, high_watermark=0, log_start_offset=0, records_size=0)


def test_fewer_slots_than_shards_means_no_sessions() -> None:
    """Kafka gives each shard slots // 8: below 8 slots no session is ever created."""
    cache = ShardedSessionCache(7, rng=random.Random(1))
    assert [open_session(cache) for _ in range(16)] == [0] * 16
    assert cache.num_sessions == 0


def test_new_sessions_go_round_robin_with_ids_in_their_shard_range() -> None:
    cache = ShardedSessionCache(16, rng=random.Random(2))
    ids = [open_session(cache) for _ in range(NUM_SHARDS)]
    assert [shard_index(i) for i in ids] == list(range(NUM_SHARDS))
    assert all(
        max(1, k * SESSION_ID_RANGE) <= i < (k + 1) * SESSION_ID_RANGE for k, i in enumerate(ids)
    )
    assert cache.sessions_created == NUM_SHARDS
    assert {s.id for s in cache.sessions()} == set(ids)
    assert all(cache.get(i) is not None for i in ids)


def test_a_full_shard_refuses_although_another_has_room() -> None:
    """One slot per shard: closing a session frees its shard only, not the next one in turn."""
    cache = ShardedSessionCache(8, rng=random.Random(3))
    ids = [open_session(cache) for _ in range(8)]
    assert 0 not in ids
    assert open_session(cache) == 0  # shard 0 again: full (fresh sessions are not evictable)
    cache.new_context(13, ids[0], -1, False, PART, [], {})  # close the session of shard 0
    assert open_session(cache) == 0  # shard 1 is next in turn, and full
    for _ in range(6):
        open_session(cache)  # shards 2..7: full
    assert shard_index(open_session(cache)) == 0  # back at shard 0, which has room


def test_attempts_that_create_nothing_still_take_their_turn() -> None:
    cache = ShardedSessionCache(8, rng=random.Random(4))
    first = open_session(cache)
    assert shard_index(first) == 0
    cache.new_context(13, 0, -1, False, PART, [], {})  # sessionless: no turn taken
    assert shard_index(open_session(cache)) == 1


# -- eviction (FetchSessionCacheShard.tryEvict), per shard ---------------------------------


class Clock:
    def __init__(self) -> None:
        self.seconds = 1000.0

    def __call__(self) -> float:
        return self.seconds


def parts(n: int) -> dict[TopicIdPartition, PartitionPlan]:
    return {
        TopicIdPartition(TID, "t", i): PartitionPlan(fetch_offset=0, partition_max_bytes=1024)
        for i in range(n)
    }


def full_fetch(cache: ShardedSessionCache, n: int = 1, *, privileged: bool = False) -> int:
    """A full fetch (epoch 0) of *n* partitions; the new session's id, or 0."""
    data = parts(n)
    context = cache.new_context(13, 0, 0, privileged, data, [], {TID: "t"})
    return context.update_and_generate_response_data({k: None for k in data}, outcome).session_id


def incremental_error(cache: ShardedSessionCache, session_id: int, epoch: int) -> int:
    context = cache.new_context(13, session_id, epoch, False, {}, [], {TID: "t"})
    return context.update_and_generate_response_data({}, outcome).error_code


def two_slot_shards(clock: Clock) -> tuple[ShardedSessionCache, list[int], list[int]]:
    """16 slots (2 a shard), filled: shard k holds small[k] (1 partition), large[k] (2)."""
    cache = ShardedSessionCache(2 * NUM_SHARDS, clock=clock, rng=random.Random(5))
    small = [full_fetch(cache, 1) for _ in range(NUM_SHARDS)]
    clock.seconds += 0.01
    large = [full_fetch(cache, 2) for _ in range(NUM_SHARDS)]
    assert 0 not in small + large and cache.num_sessions == 2 * NUM_SHARDS
    return cache, small, large


def test_a_follower_evicts_the_consumer_session_with_fewest_partitions_not_the_lru() -> None:
    clock = Clock()
    cache, small, large = two_slot_shards(clock)
    clock.seconds += 0.01
    assert incremental_error(cache, small[0], 1) == 0  # small[0] is now the most recently used
    follower = full_fetch(cache, 1, privileged=True)  # shard 0 again
    assert shard_index(follower) == 0
    assert cache.get(small[0]) is None and cache.get(large[0]) is not None
    assert incremental_error(cache, small[0], 2) == 70
    assert cache.evictions == 1


def test_young_sessions_are_kept_from_consumers_whatever_their_size() -> None:
    clock = Clock()
    cache, _small, _large = two_slot_shards(clock)
    assert [full_fetch(cache, 5) for _ in range(NUM_SHARDS)] == [0] * NUM_SHARDS
    assert cache.evictions == 0


def test_a_follower_evicts_a_consumer_before_a_smaller_follower_session() -> None:
    clock = Clock()
    cache, small, large = two_slot_shards(clock)
    first = full_fetch(cache, 1, privileged=True)  # evicts small[0]
    for _ in range(NUM_SHARDS - 1):
        full_fetch(cache, 1)
    second = full_fetch(cache, 1, privileged=True)  # shard 0: privileged ranks above size
    assert 0 not in (first, second)
    assert cache.get(small[0]) is None and cache.get(large[0]) is None
    for _ in range(NUM_SHARDS - 1):
        full_fetch(cache, 1)
    assert full_fetch(cache, 3, privileged=True) == 0  # shard 0 holds two young followers
    assert cache.get(first) is not None and cache.get(second) is not None
    assert cache.evictions == 2


def test_old_sessions_become_evictable_by_size_and_stale_ones_by_anyone() -> None:
    clock = Clock()
    cache, small, large = two_slot_shards(clock)
    clock.seconds += 120.5  # shard 0's sessions: older than evictionMs, but used just now
    assert incremental_error(cache, small[0], 1) == 0
    assert incremental_error(cache, large[0], 1) == 0
    assert full_fetch(cache, 1) == 0  # shard 0: (False, 1, 0) is below (False, 1, id)
    # Shards 1..7 were last used 120 s ago: their least recently used session is stale.
    others = [full_fetch(cache, 1) for _ in range(NUM_SHARDS - 1)]
    assert 0 not in others and all(cache.get(i) is None for i in small[1:])
    clock.seconds += 0.01
    bigger = full_fetch(cache, 2)  # shard 0: 2 partitions beat small[0]'s 1
    assert bigger != 0 and cache.get(small[0]) is None and cache.get(large[0]) is not None
    clock.seconds += 120.5  # every session is stale now: the least recently used goes
    for _ in range(NUM_SHARDS - 1):
        full_fetch(cache, 1)
    assert full_fetch(cache, 1) != 0  # shard 0 again
    assert cache.get(large[0]) is None and cache.get(bigger) is not None


@pytest.mark.parametrize(
    ("session_id", "index"),
    [
        (1, 0),
        (-5, 0),
        (-(SESSION_ID_RANGE - 1), 0),
        (-SESSION_ID_RANGE, -1),
        (8 * SESSION_ID_RANGE, 8),
    ],
)
def test_shard_index_divides_as_java(session_id: int, index: int) -> None:
    assert shard_index(session_id) == index


@pytest.mark.parametrize("session_id", [2**31 - 1, 8 * SESSION_ID_RANGE, -(2**31)])
@pytest.mark.parametrize("epoch", [1, 0, -1])
def test_ids_no_shard_covers_raise(session_id: int, epoch: int) -> None:
    cache = ShardedSessionCache(1000)
    with pytest.raises(SessionIdOutOfRange):
        cache.new_context(13, session_id, epoch, False, PART, [], {})
    assert cache.get(session_id) is None


def fetch_v13(h: Harness, topic_id: uuid.UUID, session_id: int, epoch: int) -> dict[str, object]:
    topic = {"topic_id": topic_id, "partitions": [partition_body(0, 0, 1024)]}
    return fetch_body(
        [topic], max_wait=0, max_bytes=1 << 20, session_id=session_id, session_epoch=epoch
    )


@pytest.mark.parametrize("epoch", [1, 0, -1])
def test_fetch_naming_an_id_outside_every_shard_is_an_unknown_server_error(epoch: int) -> None:
    """Kafka's FetchManager throws; the request fails as a whole, echoing the session id."""
    h = Harness(1, {"t": 1})
    h.nodes[0].fetcher = NodeFetcher(0, h.state, ShardedSessionCache(1000, clock=h.clock))
    topic_id = h.state.topics["t"].topic_id
    out = h.send(0, h.request(FETCH, 13, fetch_v13(h, topic_id, 2**31 - 1, epoch)))
    assert isinstance(out, Wait)
    response = h.finish(out, FETCH, 13)
    assert response is not None
    assert int(response.error_code) == -1
    assert response.session_id == 2**31 - 1
    assert response.responses == ()
