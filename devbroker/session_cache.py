"""A node's fetch session cache split into shards, as Kafka's broker splits it (KAFKA-9401).

Kafka 3.9+ builds ``FetchSessionCache`` from 8 ``FetchSessionCacheShard``s, each
with ``max.incremental.fetch.session.cache.slots / 8`` slots (integer division:
fewer than 8 slots means no sessions at all) and its own session id range
``[max(1, k * R), (k + 1) * R)`` with ``R = 2^31-1 // 8``.  A new session goes
to the next shard in round-robin order, chosen when a full fetch generates its
response (``FullFetchContext.updateAndGenerateResponseData``) whether or not a
session is created; eviction only looks inside that shard.  A request naming a
session id finds its shard by ``session_id / R`` (Java division, towards zero);
an id that maps to no shard (below ``-(R-1)`` or at ``8 * R`` and above) makes
``FetchManager.newContext`` throw, and Kafka answers the whole fetch with
UNKNOWN_SERVER_ERROR (:class:`SessionIdOutOfRange`).

Each shard is a :class:`proxy.sessions.as_broker_cache.FetchSessionCache` (the shard
logic itself); this module adds the routing.  Sans-I/O.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from proxy.protocol.partition_plan import PartitionPlan
from proxy.protocol.partition_result import PartitionResult
from proxy.sessions.as_broker_cache import (
    DEFAULT_EVICTION_MS,
    FINAL_EPOCH,
    INVALID_SESSION_ID,
    FetchContext,
    FetchSession,
    FetchSessionCache,
    FullFetchContext,
    Ranges,
    SessionlessFetchContext,
    SessionResponse,
    TopicIdPartition,
    is_full,
)

NUM_SHARDS = 8  # KafkaBroker.NumFetchSessionCacheShards
SESSION_ID_RANGE = (2**31 - 1) // NUM_SHARDS

T = TypeVar("T")


class SessionIdOutOfRange(Exception):
    """A request named a session id that no cache shard covers (Kafka throws)."""


class CacheShard(FetchSessionCache):
    """One shard: a FetchSessionCache whose new session ids stay in the shard's range."""

    def __init__(
        self,
        shard_num: int,
        max_slots: int,
        eviction_ms: int,
        clock: Callable[[], float],
        rng: random.Random,
    ) -> None:
        super().__init__(max_slots, eviction_ms, clock, rng=rng)
        self.shard_num = shard_num
        self.id_low = max(1, shard_num * SESSION_ID_RANGE)
        self.id_high = (shard_num + 1) * SESSION_ID_RANGE
        self._ids = rng

    def new_session_id(self) -> int:
        while True:
            sid = self._ids.randrange(self.id_low, self.id_high)
            if sid not in self:
                return sid


class _RoundRobinFullContext(FullFetchContext):
    """A full fetch whose session (if any) goes to the shard next in turn at response time."""

    def __init__(
        self,
        owner: ShardedSessionCache,
        fetch_data: Mapping[TopicIdPartition, PartitionPlan],
        uses_topic_ids: bool,
        privileged: bool,
    ) -> None:
        super().__init__(owner.shards[0], fetch_data, uses_topic_ids, privileged)
        self._owner = owner

    def update_and_generate_response_data_in_ranges(
        self,
        updates: Mapping[TopicIdPartition, T],
        outcome: Callable[[T], PartitionResult],
        every: int,
    ) -> Ranges[SessionResponse[T]]:
        # (update_and_generate_response_data runs this at once.)  The shard is taken
        # before the first range, when the response data starts being generated.
        self.cache = self._owner.next_shard()
        return (
            yield from super().update_and_generate_response_data_in_ranges(updates, outcome, every)
        )


def shard_index(session_id: int) -> int:
    """Java's ``sessionId / sessionIdRange`` (truncating towards zero)."""
    q = abs(session_id) // SESSION_ID_RANGE
    return q if session_id >= 0 else -q


class ShardedSessionCache:
    """The fetch sessions of one dev-cluster node: Kafka's FetchSessionCache + FetchManager."""

    def __init__(
        self,
        max_slots: int,
        *,
        eviction_ms: int = DEFAULT_EVICTION_MS,
        clock: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
    ) -> None:
        if max_slots < 0:
            raise ValueError("max_slots must be >= 0")
        rng = rng if rng is not None else random.Random()
        self.max_slots = max_slots
        self.shards = [
            CacheShard(k, max_slots // NUM_SHARDS, eviction_ms, clock, rng)
            for k in range(NUM_SHARDS)
        ]
        self._counter = 0

    def next_shard(self) -> CacheShard:
        """FetchSessionCache.getNextCacheShard: round robin over the shards."""
        shard = self.shards[self._counter % NUM_SHARDS]
        self._counter += 1
        return shard

    def shard_for(self, session_id: int) -> CacheShard:
        index = shard_index(session_id)
        if not 0 <= index < NUM_SHARDS:
            raise SessionIdOutOfRange(f"no fetch session cache shard for session id {session_id}")
        return self.shards[index]

    # -- what the fetch path and the tests read ---------------------------------------

    def get(self, session_id: int) -> FetchSession | None:
        index = shard_index(session_id)
        return self.shards[index].get(session_id) if 0 <= index < NUM_SHARDS else None

    def sessions(self) -> list[FetchSession]:
        return [s for shard in self.shards for s in shard.sessions()]

    @property
    def num_sessions(self) -> int:
        return sum(shard.num_sessions for shard in self.shards)

    @property
    def sessions_created(self) -> int:
        return sum(shard.sessions_created for shard in self.shards)

    @property
    def evictions(self) -> int:
        return sum(shard.evictions for shard in self.shards)

    def __len__(self) -> int:
        return self.num_sessions

    def clear(self) -> None:
        """Fault hook: drop every session (clients then see FETCH_SESSION_ID_NOT_FOUND)."""
        for shard in self.shards:
            shard.clear()

    # -- FetchManager.newContext ----------------------------------------------------------

    def new_context(
        self,
        request_version: int,
        session_id: int,
        epoch: int,
        is_follower: bool,
        fetch_data: Mapping[TopicIdPartition, PartitionPlan],
        to_forget: Sequence[TopicIdPartition],
        topic_names: Mapping[uuid.UUID, str],
    ) -> FetchContext:
        """Route to the shard of the named session; SessionIdOutOfRange if there is none."""
        if is_full(epoch):
            if session_id != INVALID_SESSION_ID:
                self.shard_for(session_id).remove(session_id)
            if epoch == FINAL_EPOCH:
                return SessionlessFetchContext(fetch_data)
            return _RoundRobinFullContext(self, fetch_data, request_version >= 13, is_follower)
        shard = self.shard_for(session_id)
        return shard.new_context(
            request_version, session_id, epoch, is_follower, fetch_data, to_forget, topic_names
        )
