"""The downstream half: the broker side of KIP-227 incremental fetch sessions, sans-I/O.

Modelled on Apache Kafka's ``FetchSession.scala`` (``CachedPartition``,
``FetchSession``, the four ``FetchContext`` kinds, ``FetchSessionCacheShard``
and ``FetchManager.newContext``).  Nothing here knows about logs, sockets or
kio: partitions are named by :class:`TopicIdPartition` and keyed in a session by
its :data:`~proxy.protocol.partition_key.PartitionKey`, request parameters are
a :class:`~proxy.protocol.partition_plan.PartitionPlan` (the one the proxy's own
session upstream uses too), and a response partition of any type ``T`` is
described to the session logic through a
:class:`~proxy.protocol.partition_result.PartitionResult` extracted by a
caller-supplied function.  The dev broker uses it with its own read results;
the proxy, toward clients that open sessions, with kio ``PartitionData``
(:func:`~proxy.protocol.partition_result.result_of`).

The (session_id, epoch) table of KIP-227, as ``new_context`` applies it:

    session_id  epoch   meaning
    0           -1      sessionless full fetch (no session created)
    0           0       full fetch, create a session
    id          0       close session id, full fetch, create a new session
    id          -1      close session id, sessionless full fetch
    id          N>0     incremental fetch in session id at epoch N
    (other: no session with that id -> FETCH_SESSION_ID_NOT_FOUND;
            epoch != the session's -> INVALID_FETCH_SESSION_EPOCH;
            topic-id use differs from the session's -> FETCH_SESSION_TOPIC_ID_ERROR)

The cache is a single shard.  Kafka 3.9+ splits the cache into shards
(KAFKA-9401) to cut lock contention between request handler threads; eviction
then runs per shard.  With one event loop a single shard suffices, and it
behaves exactly like one of Kafka's shards (and like the cache before sharding).

Eviction follows ``FetchSessionCacheShard.tryEvict``: when the cache is full, a
new session may evict (1) the least recently used session if it has been idle
for more than ``eviction_ms``; otherwise (2) the lowest-valued evictable
session, ordered by (privileged, size, id), if the new session's key
(privileged, size, 0) is not lower.  Sessions become evictable only once they
are older than ``eviction_ms``, except that unprivileged (consumer) sessions
are always evictable by privileged (follower) ones.  The comparison scans at
most ``max_slots`` sessions and runs only when the cache is full.
"""

from __future__ import annotations

import random
import secrets
import time
import uuid
from abc import ABC, abstractmethod
from collections.abc import Callable, Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from ..protocol.codec import drain
from ..protocol.error_codes import (
    FETCH_SESSION_ID_NOT_FOUND,
    FETCH_SESSION_TOPIC_ID_ERROR,
    INVALID_FETCH_SESSION_EPOCH,
    NONE,
)
from ..protocol.partition_key import PartitionKey
from ..protocol.partition_plan import PartitionPlan, fetch_partition
from ..protocol.partition_result import PartitionResult

# FINAL_EPOCH, INVALID_SESSION_ID and is_full are re-exported: the dev broker
# (``devbroker.session_cache``) takes them from here.
from .kip227 import FINAL_EPOCH as FINAL_EPOCH
from .kip227 import INITIAL_EPOCH, next_epoch
from .kip227 import INVALID_SESSION_ID as INVALID_SESSION_ID
from .kip227 import is_full as is_full

_INT32_MAX = 2**31 - 1
"""The largest session id."""

DEFAULT_MAX_SLOTS = 1000  # max.incremental.fetch.session.cache.slots
DEFAULT_EVICTION_MS = 120_000  # Kafka's fixed minimum idle time before eviction

T = TypeVar("T")
R = TypeVar("R")
Ranges = Generator[None, None, R]
"""Work cut into ranges: each ``yield`` ends one (the caller runs the next when it likes);
the generator's value is the result.  ``every`` partitions a range, 0: no yield at all."""


class TopicIdPartition(NamedTuple):
    """A partition as a fetch request names it, with both its topic's id and name.

    ``topic_id`` is None for requests before v13 (Kafka's zero UUID, as kio
    decodes it); ``topic`` is None when a v13+ topic id did not resolve.
    Equality compares all three fields, like Kafka's ``TopicIdPartition``.

    More than the fetch path's one key (:data:`~proxy.protocol.partition_key.PartitionKey`
    names a topic one way): this cache is Kafka's broker-side cache, shared with the
    dev broker, and a broker reads its logs by name whatever the request names, so a
    partition keeps both, as Kafka's ``CachedPartition`` does, and a name unknown when
    it joined a session on ids is resolved later (``maybe_resolve_unknown_name``).
    The proxy itself reads only the key.  Its identity inside a session (Kafka's
    ``CachedPartition.equals``) is that key, :attr:`session_key`.  A tuple: it is
    hashed several times per partition and fetch, which a tuple does in C.
    """

    topic_id: uuid.UUID | None
    topic: str | None
    partition: int

    @property
    def session_key(self) -> PartitionKey:
        """Identity inside a session: the id when there is one, else the name (CachedPartition.equals)."""
        if self.topic_id is not None:
            return (self.topic_id, self.partition)
        return (self.topic, self.partition)


class CachedPartition:
    """A partition of a session: its last request parameters and last sent HW / log start."""

    __slots__ = (
        "fetch_offset",
        "fetcher_log_start_offset",
        "high_watermark",
        "last_fetched_epoch",
        "leader_epoch",
        "local_log_start_offset",
        "max_bytes",
        "partition",
        "quiet",
        "request",
        "topic",
        "topic_id",
    )

    def __init__(
        self,
        tp: TopicIdPartition,
        req: PartitionPlan,
        high_watermark: int = -1,
        local_log_start_offset: int = -1,
    ) -> None:
        self.topic = tp.topic
        self.topic_id = tp.topic_id
        self.partition = tp.partition
        self.max_bytes = req.partition_max_bytes
        self.fetch_offset = req.fetch_offset
        self.high_watermark = high_watermark
        self.leader_epoch = req.current_leader_epoch
        self.fetcher_log_start_offset = req.log_start_offset
        self.local_log_start_offset = local_log_start_offset
        self.last_fetched_epoch = req.last_fetched_epoch
        self.request: tuple[type, Any] | None = None
        """(kio class, its request ``FetchPartition`` for the plan), see ``request_partition``
        (about 144 bytes; the partition's plan and ``TopicIdPartition`` are not kept: about
        160 bytes more per partition for some 6 % of a 1,000-partition session's fetch)."""
        self.quiet: object = None
        """The last response data given for the partition when it was left out of the
        response (no records, nothing changed): the same object again (a shared empty
        entry, kio's being frozen) is left out again without reading it."""

    @property
    def key(self) -> PartitionKey:
        return self.topic_id_partition.session_key

    @property
    def topic_id_partition(self) -> TopicIdPartition:
        return TopicIdPartition(self.topic_id, self.topic, self.partition)

    def plan(self) -> PartitionPlan:
        """The partition's fetch parameters as its last request gave them."""
        return PartitionPlan(
            self.fetch_offset,
            self.max_bytes,
            self.fetcher_log_start_offset,
            self.leader_epoch,
            self.last_fetched_epoch,
        )

    def update_request_params(self, req: PartitionPlan) -> None:
        self.max_bytes = req.partition_max_bytes
        self.fetch_offset = req.fetch_offset
        self.fetcher_log_start_offset = req.log_start_offset
        self.leader_epoch = req.current_leader_epoch
        self.last_fetched_epoch = req.last_fetched_epoch
        self.request = None

    def request_partition(self, mod: Any) -> Any:
        """The kio request ``FetchPartition`` of *mod*'s version for the partition's plan,
        built once per change of its parameters: an incremental fetch becomes the whole
        session's full fetch (``DownstreamSessions.open``), and most of a large session's
        partitions are the same as in the last one (kio's entities are frozen, so one
        serves every fetch until ``update_request_params``)."""
        cls = mod.FetchPartition
        memo = self.request
        if memo is not None and memo[0] is cls:
            return memo[1]
        entity = fetch_partition(mod, self.partition, self.plan())
        self.request = (cls, entity)
        return entity

    def maybe_resolve_unknown_name(self, topic_names: Mapping[uuid.UUID, str]) -> None:
        if self.topic is None and self.topic_id is not None:
            self.topic = topic_names.get(self.topic_id)

    def maybe_update_response_data(self, outcome: PartitionResult, update: bool) -> bool:
        """True if an incremental response must carry this partition; optionally remember what was sent.

        Included: records, a changed high watermark or log start offset, a
        preferred read replica, an error (which also resets the cached high
        watermark so the partition is re-sent when the error clears), or a
        diverging epoch.
        """
        must_respond = outcome.records_size > 0
        if self.high_watermark != outcome.high_watermark:
            must_respond = True
            if update:
                self.high_watermark = outcome.high_watermark
        if self.local_log_start_offset != outcome.log_start_offset:
            must_respond = True
            if update:
                self.local_log_start_offset = outcome.log_start_offset
        if outcome.preferred_read_replica != -1:
            must_respond = True
        if outcome.error_code != NONE:
            if update:
                self.high_watermark = -1
            must_respond = True
        if outcome.diverging_epoch >= 0:
            must_respond = True
        return must_respond

    def __repr__(self) -> str:
        return (
            f"CachedPartition(topic={self.topic!r}, topic_id={self.topic_id}, "
            f"partition={self.partition}, fetch_offset={self.fetch_offset}, "
            f"max_bytes={self.max_bytes}, high_watermark={self.high_watermark}, "
            f"local_log_start_offset={self.local_log_start_offset})"
        )


class FetchSession:
    """One cached session; ``partitions`` keeps the session order (insertion order)."""

    __slots__ = (
        "cached_size",
        "creation_ms",
        "epoch",
        "id",
        "last_used_ms",
        "partitions",
        "privileged",
        "uses_topic_ids",
    )

    def __init__(
        self,
        session_id: int,
        privileged: bool,
        partitions: dict[PartitionKey, CachedPartition],
        uses_topic_ids: bool,
        creation_ms: int,
        last_used_ms: int,
        epoch: int,
    ) -> None:
        self.id = session_id
        self.privileged = privileged
        self.partitions = partitions
        self.uses_topic_ids = uses_topic_ids
        self.creation_ms = creation_ms
        self.last_used_ms = last_used_ms
        self.epoch = epoch
        self.cached_size = -1
        """Size when last touched by the cache; -1 while not in a cache."""

    @property
    def size(self) -> int:
        return len(self.partitions)

    def is_empty(self) -> bool:
        return not self.partitions

    @property
    def last_used_key(self) -> tuple[int, int]:
        return (self.last_used_ms, self.id)

    @property
    def evictable_key(self) -> tuple[bool, int, int]:
        return (self.privileged, self.cached_size, self.id)

    def find(self, tp: TopicIdPartition) -> CachedPartition | None:
        return self.partitions.get(tp.session_key)

    def get_fetch_offset(self, tp: TopicIdPartition) -> int | None:
        cp = self.find(tp)
        return None if cp is None else cp.fetch_offset

    def move_to_end(self, cp: CachedPartition) -> None:
        key = cp.key
        del self.partitions[key]
        self.partitions[key] = cp

    def update(
        self,
        fetch_data: Mapping[TopicIdPartition, PartitionPlan],
        to_forget: Iterable[TopicIdPartition],
    ) -> tuple[list[TopicIdPartition], list[TopicIdPartition], list[TopicIdPartition]]:
        """Apply an incremental request: returns (added, updated, removed).

        New partitions go to the end of the session order; updated ones keep
        their place.  Forgotten partitions are removed after the additions.
        """
        added: list[TopicIdPartition] = []
        updated: list[TopicIdPartition] = []
        removed: list[TopicIdPartition] = []
        for tp, req in fetch_data.items():
            cp = self.partitions.get(tp.session_key)
            if cp is None:
                self.partitions[tp.session_key] = CachedPartition(tp, req)
                added.append(tp)
            else:
                cp.update_request_params(req)
                updated.append(tp)
        for tp in to_forget:
            if self.partitions.pop(tp.session_key, None) is not None:
                removed.append(tp)
        return added, updated, removed

    def __repr__(self) -> str:
        return (
            f"FetchSession(id={self.id}, privileged={self.privileged}, "
            f"partitions={len(self.partitions)}, uses_topic_ids={self.uses_topic_ids}, "
            f"creation_ms={self.creation_ms}, last_used_ms={self.last_used_ms}, epoch={self.epoch})"
        )


@dataclass(frozen=True, slots=True)
class SessionResponse(Generic[T]):
    """The session-level outcome of a fetch: what to put in the FetchResponse."""

    error_code: int
    session_id: int
    partitions: list[tuple[TopicIdPartition, T]]
    """The partitions to send, in response order (already pruned for incremental fetches)."""


class FetchContext(ABC):
    """How one fetch request relates to the session cache (Kafka's FetchContext)."""

    @abstractmethod
    def get_fetch_offset(self, tp: TopicIdPartition) -> int | None: ...

    @abstractmethod
    def partitions(self) -> list[tuple[TopicIdPartition, PartitionPlan]]:
        """The partitions to read, in order (foreachPartition)."""

    def partitions_in_ranges(
        self, every: int
    ) -> Ranges[list[tuple[TopicIdPartition, PartitionPlan]]]:
        """``partitions``, yielding every *every* partitions where it walks them in Python."""
        out = self.partitions()
        yield from ()
        return out

    @abstractmethod
    def update_and_generate_response_data(
        self,
        updates: Mapping[TopicIdPartition, T],
        outcome: Callable[[T], PartitionResult],
    ) -> SessionResponse[T]:
        """Update the session with what was read and select the partitions to send."""

    def update_and_generate_response_data_in_ranges(
        self,
        updates: Mapping[TopicIdPartition, T],
        outcome: Callable[[T], PartitionResult],
        every: int,
    ) -> Ranges[SessionResponse[T]]:
        """``update_and_generate_response_data``, yielding every *every* partitions where it
        walks them; the cache itself (a session created or closed) changes at one point."""
        out = self.update_and_generate_response_data(updates, outcome)
        yield from ()
        return out

    def throttled_response(self) -> SessionResponse[Any]:
        """The empty response sent instead when the fetch is throttled (the session is left alone)."""
        return SessionResponse(NONE, INVALID_SESSION_ID, [])


class SessionErrorContext(FetchContext):
    """The request had a session error: no partitions are read, the error is top-level."""

    def __init__(self, error_code: int, session_id: int, epoch: int) -> None:
        self.error_code = error_code
        self.session_id = session_id
        self.epoch = epoch

    def get_fetch_offset(self, tp: TopicIdPartition) -> int | None:
        return None

    def partitions(self) -> list[tuple[TopicIdPartition, PartitionPlan]]:
        return []

    def update_and_generate_response_data(
        self,
        updates: Mapping[TopicIdPartition, T],
        outcome: Callable[[T], PartitionResult],
    ) -> SessionResponse[T]:
        return SessionResponse(self.error_code, INVALID_SESSION_ID, [])


class _FullRequestContext(FetchContext):
    """A context whose partitions are exactly those of a full request."""

    fetch_data: Mapping[TopicIdPartition, PartitionPlan]

    def get_fetch_offset(self, tp: TopicIdPartition) -> int | None:
        req = self.fetch_data.get(tp)
        return None if req is None else req.fetch_offset

    def partitions(self) -> list[tuple[TopicIdPartition, PartitionPlan]]:
        return list(self.fetch_data.items())


class SessionlessFetchContext(_FullRequestContext):
    """A full fetch that neither uses nor creates a session."""

    def __init__(self, fetch_data: Mapping[TopicIdPartition, PartitionPlan]) -> None:
        self.fetch_data = fetch_data

    def update_and_generate_response_data(
        self,
        updates: Mapping[TopicIdPartition, T],
        outcome: Callable[[T], PartitionResult],
    ) -> SessionResponse[T]:
        return SessionResponse(NONE, INVALID_SESSION_ID, list(updates.items()))


class FullFetchContext(_FullRequestContext):
    """A full fetch that tries to create a new session once the response is known."""

    def __init__(
        self,
        cache: FetchSessionCache,
        fetch_data: Mapping[TopicIdPartition, PartitionPlan],
        uses_topic_ids: bool,
        privileged: bool,
    ) -> None:
        self.cache = cache
        self.fetch_data = fetch_data
        self.uses_topic_ids = uses_topic_ids
        self.privileged = privileged

    def update_and_generate_response_data(
        self,
        updates: Mapping[TopicIdPartition, T],
        outcome: Callable[[T], PartitionResult],
    ) -> SessionResponse[T]:
        return drain(self.update_and_generate_response_data_in_ranges(updates, outcome, 0))

    def update_and_generate_response_data_in_ranges(
        self,
        updates: Mapping[TopicIdPartition, T],
        outcome: Callable[[T], PartitionResult],
        every: int,
    ) -> Ranges[SessionResponse[T]]:
        """The session's partitions are built range by range (nothing shared is touched);
        the session is created (or not) in the cache at one point, after the last range."""
        # The session order is the response order (which may differ from the request order).
        cached: dict[PartitionKey, CachedPartition] = {}
        unrequested: TopicIdPartition | None = None
        for i, (tp, data) in enumerate(list(updates.items()), 1):
            if every and i % every == 0:
                yield
            req = self.fetch_data.get(tp)
            if req is None:
                unrequested = tp
                break
            o = outcome(data)
            cached[tp.session_key] = CachedPartition(tp, req, o.high_watermark, o.log_start_offset)

        def create_partitions() -> dict[PartitionKey, CachedPartition]:
            if unrequested is not None:  # (only when a session is created, as before)
                raise KeyError(f"response partition {unrequested} was not requested")
            return cached

        session_id = self.cache.maybe_create_session(
            self.cache.now_ms(),
            self.privileged,
            len(updates),
            self.uses_topic_ids,
            create_partitions,
        )
        return SessionResponse(NONE, session_id, list(updates.items()))


class IncrementalFetchContext(FetchContext):
    """A fetch inside an existing session; the session was updated when this context was made."""

    def __init__(
        self, session: FetchSession, request_epoch: int, topic_names: Mapping[uuid.UUID, str]
    ) -> None:
        self.session = session
        self.request_epoch = request_epoch
        self.topic_names = topic_names
        self.cached: list[CachedPartition] = []

    def get_fetch_offset(self, tp: TopicIdPartition) -> int | None:
        return self.session.get_fetch_offset(tp)

    def partitions(self) -> list[tuple[TopicIdPartition, PartitionPlan]]:
        return drain(self.partitions_in_ranges(0))

    def partitions_in_ranges(
        self, every: int
    ) -> Ranges[list[tuple[TopicIdPartition, PartitionPlan]]]:
        """The session's partitions (a copy of its order, taken before the first range;
        ``cached`` keeps their ``CachedPartition`` in the same order)."""
        out = []
        session = self.session
        self.cached = cached = list(session.partitions.values())
        for i, cp in enumerate(cached, 1):
            if every and i % every == 0:
                yield
            if session.uses_topic_ids:
                cp.maybe_resolve_unknown_name(self.topic_names)
            out.append((cp.topic_id_partition, cp.plan()))
        return out

    def _epoch_still_ours(self) -> bool:
        # Another request in this session may have moved the epoch on meanwhile.
        return self.session.epoch == next_epoch(self.request_epoch)

    def update_and_generate_response_data(
        self,
        updates: Mapping[TopicIdPartition, T],
        outcome: Callable[[T], PartitionResult],
    ) -> SessionResponse[T]:
        return drain(self.update_and_generate_response_data_in_ranges(updates, outcome, 0))

    def update_and_generate_response_data_in_ranges(
        self,
        updates: Mapping[TopicIdPartition, T],
        outcome: Callable[[T], PartitionResult],
        every: int,
    ) -> Ranges[SessionResponse[T]]:
        """Between two ranges only this session is half-updated (its connection's next
        fetch waits for this one; no other connection can use it)."""
        if not self._epoch_still_ours():
            return SessionResponse(INVALID_FETCH_SESSION_EPOCH, self.session.id, [])
        selected: list[tuple[TopicIdPartition, T]] = []
        for i, (tp, data) in enumerate(list(updates.items()), 1):
            if every and i % every == 0:
                yield
            cp = self.session.find(tp)
            if cp is None:  # not in the session (cannot happen for data read from partitions())
                selected.append((tp, data))
                continue
            if data is cp.quiet:
                continue  # what was left out last time, unchanged: left out again
            o = outcome(data)
            if cp.maybe_update_response_data(o, update=True):
                cp.quiet = None
                selected.append((tp, data))
                if o.records_size > 0:
                    # Partitions that returned data go to the end of the session order,
                    # so the next fetch starts with the others (fairness).
                    self.session.move_to_end(cp)
            elif o.records_size == 0:
                # (never data with records: it would keep its frame in memory)
                cp.quiet = data
        return SessionResponse(NONE, self.session.id, selected)

    def throttled_response(self) -> SessionResponse[Any]:
        if not self._epoch_still_ours():
            return SessionResponse(INVALID_FETCH_SESSION_EPOCH, self.session.id, [])
        return SessionResponse(NONE, self.session.id, [])


class FetchSessionCache:
    """A bounded cache of fetch sessions (one Kafka cache shard) plus ``FetchManager.newContext``.

    ``clock`` returns seconds (like ``time.monotonic``); times are kept in ms.
    Counters a metrics layer can read: ``num_sessions``,
    ``num_partitions`` (partitions cached over all sessions), ``evictions``,
    ``sessions_created``.
    """

    def __init__(
        self,
        max_slots: int = DEFAULT_MAX_SLOTS,
        eviction_ms: int = DEFAULT_EVICTION_MS,
        clock: Callable[[], float] = time.monotonic,
        *,
        rng: random.Random | None = None,
    ) -> None:
        if max_slots < 0:
            raise ValueError("max_slots must be >= 0")
        self.max_slots = max_slots
        self.eviction_ms = eviction_ms
        self._clock = clock
        self._rng = rng if rng is not None else secrets.SystemRandom()
        """Session ids come from the OS's CSPRNG (``secrets``): a client must not guess
        another's; tests of the dev broker pass a seeded ``random.Random``."""
        self._sessions: dict[int, FetchSession] = {}
        self._evictable_by_all: dict[int, FetchSession] = {}
        self._evictable_by_privileged: dict[int, FetchSession] = {}
        self.num_partitions = 0
        self.evictions = 0
        self.sessions_created = 0

    def now_ms(self) -> int:
        return int(self._clock() * 1000)

    @property
    def num_sessions(self) -> int:
        return len(self._sessions)

    def __len__(self) -> int:
        return len(self._sessions)

    def __contains__(self, session_id: object) -> bool:
        return session_id in self._sessions

    def get(self, session_id: int) -> FetchSession | None:
        return self._sessions.get(session_id)

    def sessions(self) -> list[FetchSession]:
        return list(self._sessions.values())

    def new_session_id(self) -> int:
        """An unpredictable positive id, unique in this cache (never 0)."""
        while True:
            sid = self._rng.randrange(1, _INT32_MAX)
            if sid not in self._sessions:
                return sid

    def maybe_create_session(
        self,
        now_ms: int,
        privileged: bool,
        size: int,
        uses_topic_ids: bool,
        create_partitions: Callable[[], dict[PartitionKey, CachedPartition]],
    ) -> int:
        """Create a session if there is room (possibly by evicting one); its id, or 0."""
        if len(self._sessions) < self.max_slots or self._try_evict(
            privileged, (privileged, size, 0), now_ms
        ):
            session = FetchSession(
                self.new_session_id(),
                privileged,
                create_partitions(),
                uses_topic_ids,
                now_ms,
                now_ms,
                next_epoch(INITIAL_EPOCH),
            )
            self._sessions[session.id] = session
            self.sessions_created += 1
            self.touch(session, now_ms)
            return session.id
        return INVALID_SESSION_ID

    def _try_evict(self, privileged: bool, key: tuple[bool, int, int], now_ms: int) -> bool:
        if not self._sessions:
            return False
        lru = min(self._sessions.values(), key=lambda s: s.last_used_key)
        if now_ms - lru.last_used_ms > self.eviction_ms:
            self.remove(lru)
            self.evictions += 1
            return True
        candidates = self._evictable_by_privileged if privileged else self._evictable_by_all
        if not candidates:
            return False
        victim = min(candidates.values(), key=lambda s: s.evictable_key)
        if key < victim.evictable_key:
            return False
        self.remove(victim)
        self.evictions += 1
        return True

    def remove(self, session: FetchSession | int) -> FetchSession | None:
        sid = session if isinstance(session, int) else session.id
        removed = self._sessions.pop(sid, None)
        self._evictable_by_all.pop(sid, None)
        self._evictable_by_privileged.pop(sid, None)
        if removed is not None:
            self.num_partitions -= removed.cached_size
            removed.cached_size = -1
        return removed

    def touch(self, session: FetchSession, now_ms: int) -> None:
        """Record a use: update last-used time, cached size and evictability."""
        session.last_used_ms = now_ms
        if session.cached_size != -1:
            self.num_partitions -= session.cached_size
        self._evictable_by_all.pop(session.id, None)
        self._evictable_by_privileged.pop(session.id, None)
        session.cached_size = session.size
        old_enough = now_ms - session.creation_ms > self.eviction_ms
        if not session.privileged or old_enough:
            self._evictable_by_privileged[session.id] = session
        if old_enough:
            self._evictable_by_all[session.id] = session
        self.num_partitions += session.cached_size

    def clear(self) -> None:
        """Fault hook: drop every session (clients then see FETCH_SESSION_ID_NOT_FOUND)."""
        for session in self._sessions.values():
            session.cached_size = -1
        self._sessions.clear()
        self._evictable_by_all.clear()
        self._evictable_by_privileged.clear()
        self.num_partitions = 0

    def next_idle_epoch(self, session_id: int, epoch: int, request_version: int) -> bool:
        """``new_context`` for an incremental fetch of session *session_id* at *epoch* that
        names and forgets no partition, without making its context: the session is used
        (touched) and its epoch moves on.  False, changing nothing, when ``new_context``
        would answer an error (no such session, another epoch, the other topic-id use).
        For a fetch whose answer is known to carry no partition (the proxy's repeat of
        an idle session client's fetch); the session's partitions are not visited."""
        session = self._sessions.get(session_id)
        if session is None or self._incremental_error(session, epoch, request_version):
            return False
        if session.is_empty():  # (new_context would close it: not for this shortcut)
            return False
        self._next_epoch(session)
        return True

    @staticmethod
    def _incremental_error(session: FetchSession, epoch: int, request_version: int) -> int:
        """The error an incremental fetch at *epoch* of *request_version* gets from the
        session it names (NONE: it may go on)."""
        if session.epoch != epoch:
            return INVALID_FETCH_SESSION_EPOCH
        if session.uses_topic_ids != (request_version >= 13):
            return FETCH_SESSION_TOPIC_ID_ERROR
        return NONE

    def _next_epoch(self, session: FetchSession) -> None:
        """An incremental fetch of *session* was taken: it is used now, its epoch moves on."""
        self.touch(session, self.now_ms())
        session.epoch = next_epoch(session.epoch)

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
        """FetchManager.newContext: check (session_id, epoch), update the session, pick the context."""
        if is_full(epoch):
            if session_id != INVALID_SESSION_ID:
                # Any session named in a full fetch request is closed.
                self.remove(session_id)
            if epoch == FINAL_EPOCH:
                return SessionlessFetchContext(fetch_data)
            return FullFetchContext(self, fetch_data, request_version >= 13, is_follower)
        session = self._sessions.get(session_id)
        if session is None:
            return SessionErrorContext(FETCH_SESSION_ID_NOT_FOUND, session_id, epoch)
        error = self._incremental_error(session, epoch, request_version)
        if error:
            return SessionErrorContext(error, session_id, epoch)
        session.update(fetch_data, to_forget)
        if session.is_empty():
            # Forgetting every partition closes the session; this fetch is sessionless.
            self.remove(session)
            return SessionlessFetchContext(fetch_data)
        self._next_epoch(session)
        return IncrementalFetchContext(session, epoch, topic_names)
