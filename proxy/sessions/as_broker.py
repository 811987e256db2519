"""The downstream side of fetch sessions: the proxy as the KIP-227 broker toward its clients.

``FetchSessionCache`` (the broker side of KIP-227,
:mod:`proxy.sessions.as_broker_cache`) checks the client's (session id, epoch),
updates its session and says which partitions this fetch covers.
:meth:`DownstreamSessions.open` turns a client's fetch (with or without a
session) into those partitions as one sessionless full fetch at the client's
version; :meth:`DownstreamSessions.answer` turns the complete full response to
it into what the client gets (all of it for a full fetch; for an incremental
one, only partitions with records, a new high watermark or log start offset,
an error, a preferred replica or a diverging epoch, with move-to-end
rotation).  A client's session therefore never depends on the upstream
session: an upstream reset is invisible to it.

Session errors (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH,
FETCH_SESSION_TOPIC_ID_ERROR) are answered at once without going upstream,
as a broker answers them.

A session lives as long as the connection that created it (``close``): Kafka's
clients never carry a session over to a new connection (the Java client's
``FetchSessionHandler.handleError`` makes the next request a full fetch with
epoch 0, which closes the old session and asks for a new one; librdkafka has
no sessions), so a session whose connection is gone would only hold memory
for nobody until evicted.  For the same reason a connection holds one session:
creating a new one closes its previous one, and a session id another
connection created is unknown here (FETCH_SESSION_ID_NOT_FOUND for an
incremental fetch; a full fetch naming it leaves it to its owner).

Two bounds keep the sessions' memory in proportion (about 180 bytes a cached
partition): a session holds at most ``max_fetch_session_partitions``
partitions, and the sessions of every listener together at most
``max_cached_session_partitions`` (:class:`SessionPartitionBound`).  Past
either, the fetch is answered as Kafka answers when its session cache cannot
hold a session: in full, with session id 0 (no session; the client goes on
with full fetches).  Sessionless fetches (epoch -1, or Fetch v4-v6) change no
session: one already in a full fetch's form (each topic listed once, each partition
once, as a rebuild writes it: what librdkafka, aiokafka and sarama send) is its own
full fetch after one walk that checks it, and its answer is upstream's full response
as it is when that is grouped as a broker groups it (``DownstreamFetch.as_listed``);
any other goes through the session cache's sessionless context, as a broker's does.

Values in, values out::

    client = ClientFetch.validate(client_request)   # once, at decode (None: a follower's)
    opened = downstream.open(client)   # -> DownstreamFetch | ClientReply
    full = (the complete full response to opened.request, from upstream)
    reply with downstream.answer(opened, full)

Whatever sits between the two calls (fetch shaping, the upstream session:
:mod:`proxy.fetchpath`) always works on full fetches, whatever the client speaks.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from functools import cache
from itertools import repeat
from operator import attrgetter, eq
from typing import Any

from kio.schema.errors import ErrorCode

from ..protocol.apis import FETCH
from ..protocol.codec import drain
from ..protocol.error_codes import FETCH_SESSION_ID_NOT_FOUND
from ..protocol.errors import ProtocolError
from ..protocol.messages import field_names, kio_class_with, make, request_module, response_module
from ..protocol.partition_key import PartitionKey, TopicKey
from ..protocol.partition_plan import NO_EPOCH, PartitionPlan, fetch_partition, plan_of
from ..protocol.partition_result import result_of
from .as_broker_cache import (
    CachedPartition,
    FetchContext,
    FetchSession,
    FetchSessionCache,
    FullFetchContext,
    IncrementalFetchContext,
    Ranges,
    SessionErrorContext,
    SessionlessFetchContext,
    SessionResponse,
    TopicIdPartition,
)
from .client_fetch import (
    ClientFetch,
    ClientReply,
    consumer_fetch,
    group_runs,
    topic_entries_in_ranges,
)
from .kip227 import FINAL_EPOCH, FIRST_TOPIC_ID_VERSION, INVALID_SESSION_ID, is_full
from .topic_ids import TopicIdMap

DEFAULT_MAX_SESSION_PARTITIONS = 10_000
"""Partitions one client session may hold (setting ``max_fetch_session_partitions``)."""
DEFAULT_MAX_CACHED_SESSION_PARTITIONS = 100_000
"""Partitions all client sessions together may hold (``max_cached_session_partitions``)."""
DEFAULT_MAX_FETCH_PARTITIONS = 20_000
"""Partitions one Fetch may name, with or without a session (``max_fetch_partitions``)."""


class FetchTooLarge(ProtocolError):
    """A Fetch names more partitions than ``max_fetch_partitions``: the connection closes
    (with a log line, as for a frame too large), as Kafka's broker closes a connection whose
    request is beyond what it accepts."""


_partition_limits: weakref.WeakKeyDictionary[FetchSessionCache, int] = weakref.WeakKeyDictionary()


def limit_session_partitions(cache: FetchSessionCache, limit: int) -> None:
    """Sessions of *cache* hold at most *limit* partitions (see ``DownstreamSessions``).

    Kept beside the cache rather than in it: ``FetchSessionCache`` models Kafka's,
    which the dev broker shares and which has no such limit.
    """
    if limit < 1:
        raise ValueError("a session partition limit must be positive")
    _partition_limits[cache] = limit


def session_partition_limit(cache: FetchSessionCache) -> int:
    return _partition_limits.get(cache, DEFAULT_MAX_SESSION_PARTITIONS)


class SessionPartitionBound:
    """The process-wide bound on the partitions cached by client sessions, over every
    listener's cache (Kafka bounds its cache by sessions only; the proxy, a sidecar with
    a memory limit, bounds what they hold)."""

    def __init__(
        self,
        limit: int = DEFAULT_MAX_CACHED_SESSION_PARTITIONS,
        caches: Iterable[FetchSessionCache] = (),
    ) -> None:
        if limit < 0:
            raise ValueError("a cached session partition limit must be >= 0")
        self.limit = limit
        self.caches: list[FetchSessionCache] = list(caches)

    def cached(self) -> int:
        """Partitions cached now, over every cache (a handful: one per listener)."""
        return sum(c.num_partitions for c in self.caches)

    def exceeded(self) -> bool:
        return self.cached() > self.limit


@dataclass(frozen=True, slots=True)
class DownstreamFetch:
    """A client's fetch opened against its session (see :meth:`DownstreamSessions.open`)."""

    request: Any
    """The partitions this fetch covers, as one sessionless full fetch at the client's version."""
    version: int
    context: FetchContext
    by_ref: dict[PartitionKey, TopicIdPartition]
    """Per (topic ref, partition) of the fetch, its session key (empty when ``as_listed``)."""
    covered: int
    """The partitions this fetch covers."""
    as_listed: bool = False
    """A sessionless fetch whose own partitions are the full fetch (each once, one entry per
    run of a topic, nothing a rebuild would change): it passes through without a session
    context's walks, and its answer is the full response as it is (``answer``)."""


class DownstreamSessions:
    """The broker side of fetch sessions toward one client connection."""

    def __init__(
        self,
        sessions: FetchSessionCache,
        topic_ids: TopicIdMap,
        *,
        bound: SessionPartitionBound | None = None,
        max_fetch_partitions: int = DEFAULT_MAX_FETCH_PARTITIONS,
    ) -> None:
        self.sessions = sessions
        self.topic_ids = topic_ids
        self.bound = bound
        self.max_fetch_partitions = max_fetch_partitions
        """The most partitions one Fetch may name (each costs every stage of the fetch path
        CPU on the one event loop; ``FetchTooLarge`` past it)."""
        """Every client session's partitions together (None: no process-wide bound)."""
        self.refused_sessions = 0
        """Sessions refused or closed for holding more partitions than a limit allows."""
        self._session: FetchSession | None = None
        """The session this connection created, while the cache holds it."""

    @property
    def session(self) -> FetchSession | None:
        """The connection's session, if the cache still holds it (not evicted)."""
        own = self._session
        if own is not None and self.sessions.get(own.id) is not own:
            own = self._session = None  # evicted, or closed by the client
        return own

    def expects(self, session_id: int, epoch: int) -> bool:
        """Whether this connection's session is *session_id* and waits for *epoch* (an
        incremental fetch at it would be valid)."""
        own = self.session
        return own is not None and own.id == session_id and own.epoch == epoch

    def next_idle_epoch(self, session_id: int, epoch: int, version: int) -> bool:
        """This connection's session *session_id* takes an incremental fetch at *epoch* that
        names no partition and whose answer carries none (``FetchSessionCache.next_idle_epoch``);
        False, changing nothing, when it is not this connection's or ``open`` would answer
        an error."""
        own = self.session
        if own is None or own.id != session_id:
            return False
        return self.sessions.next_idle_epoch(session_id, epoch, version)

    def close(self) -> None:
        """The connection ended: its session leaves the cache now (not when evicted)."""
        own = self.session
        self._session = None
        if own is not None:
            self.sessions.remove(own)

    def open(self, fetch: ClientFetch) -> DownstreamFetch | ClientReply:
        """The client's fetch as a sessionless full fetch, or the session error to answer."""
        return drain(self.open_in_ranges(fetch, 0))

    def open_in_ranges(
        self, fetch: ClientFetch, every: int
    ) -> Ranges[DownstreamFetch | ClientReply]:
        """``open``, yielding every *every* partitions (0: never) of each walk: reading the
        client's partitions, listing what the fetch covers, building the full fetch.

        The topic-id map is read once, before the first range; the cache (a session
        closed, updated or refused) changes at one point, between the walks; after it,
        only this connection's session is read (no other connection can use it).
        """
        request, version = fetch.request, fetch.version  # (validated: a consumer's v4+)
        named = sum(len(topic.partitions) for topic in request.topics)
        if named > self.max_fetch_partitions:
            raise FetchTooLarge(
                f"a Fetch of {named} partitions is more than max_fetch_partitions"
                f" ({self.max_fetch_partitions})"
            )
        on_ids = version >= FIRST_TOPIC_ID_VERSION
        session_id, epoch = fetch.session_id, fetch.session_epoch
        if session_id == INVALID_SESSION_ID and epoch == FINAL_EPOCH:
            # Sessionless (librdkafka, aiokafka, sarama, kcat: every fetch of theirs): no
            # session to look up or change, so the fetch is its own full fetch when it is
            # already in the form one is built in.
            listed = yield from _as_listed_in_ranges(request, on_ids, every)
            if listed:
                full = _full_fetch(request, request.topics)
                return DownstreamFetch(full, version, _SESSIONLESS, {}, named, as_listed=True)
        names = self.topic_ids.names_by_id()

        def tp(topic: Any, partition: int) -> TopicIdPartition:
            if on_ids:
                return TopicIdPartition(topic.topic_id, names.get(topic.topic_id), partition)
            return TopicIdPartition(None, topic.topic, partition)

        fetch_data: dict[TopicIdPartition, PartitionPlan] = {}
        i = 0
        for topic in request.topics:
            for p in topic.partitions:
                i += 1
                if every and i % every == 0:
                    yield
                fetch_data[tp(topic, int(p.partition))] = plan_of(p)
        to_forget = [
            tp(topic, int(p))
            for topic in getattr(request, "forgotten_topics_data", ())
            for p in topic.partitions
        ]
        own = self.session
        context: FetchContext
        if session_id != INVALID_SESSION_ID and (own is None or own.id != session_id):
            # Not this connection's session (another's, or gone): unknown here.
            if is_full(epoch):
                session_id = INVALID_SESSION_ID  # nothing of ours to close
            else:
                context = SessionErrorContext(FETCH_SESSION_ID_NOT_FOUND, session_id, epoch)
                return ClientReply(
                    drain(
                        _response(
                            version,
                            context.update_and_generate_response_data({}, result_of),
                            None,
                        )
                    )
                )
        size_before = 0 if own is None else own.size
        context = self.sessions.new_context(
            version, session_id, epoch, False, fetch_data, to_forget, names
        )
        context = self._within_limit(context, fetch_data, size_before)
        if isinstance(context, SessionErrorContext):
            result: SessionResponse[Any] = context.update_and_generate_response_data({}, result_of)
            return ClientReply(drain(_response(version, result, None)))
        effective = yield from context.partitions_in_ranges(every)
        by_ref: dict[PartitionKey, TopicIdPartition] = {}
        for i, (t, _) in enumerate(effective, 1):
            if every and i % every == 0:
                yield
            by_ref[(_ref(t, on_ids), t.partition)] = t
        cached = context.cached if isinstance(context, IncrementalFetchContext) else None
        sessionless = yield from _sessionless_request(request, effective, on_ids, every, cached)
        return DownstreamFetch(sessionless, version, context, by_ref, len(by_ref))

    def _within_limit(
        self,
        context: FetchContext,
        fetch_data: dict[TopicIdPartition, PartitionPlan],
        size_before: int,
    ) -> FetchContext:
        """A session larger than the limit is not kept: the fetch is served without one.

        A full fetch that would create it gets what Kafka answers when its session
        cache cannot hold a new session: the full response with session id 0 (the
        client goes on with full fetches).  An incremental fetch that grows a
        session past the limit closes the session and is answered with every
        partition of the session and session id 0, which Kafka's clients read as
        "the broker closed the session" (FetchSessionHandler): their next fetch is
        full, and sessionless from then on.
        """
        limit = session_partition_limit(self.sessions)
        bound = self.bound
        if isinstance(context, FullFetchContext) and (
            len(fetch_data) > limit
            or (bound is not None and bound.cached() + len(fetch_data) > bound.limit)
        ):
            self.refused_sessions += 1
            return SessionlessFetchContext(fetch_data)
        if isinstance(context, IncrementalFetchContext):
            size = context.session.size
            grew = size > size_before
            if size > limit or (grew and bound is not None and bound.exceeded()):
                self.sessions.remove(context.session)
                self._session = None
                self.refused_sessions += 1
                return SessionlessFetchContext(dict(context.partitions()))
        return context

    def answer(self, fetch: DownstreamFetch, full: Any) -> Any:
        """What the client gets, from the complete full response to ``fetch.request``."""
        return drain(self.answer_in_ranges(fetch, full, 0))

    def answer_in_ranges(self, fetch: DownstreamFetch, full: Any, every: int) -> Ranges[Any]:
        """``answer``, yielding every *every* partitions (0: never) of each walk: reading the
        answer, updating the session (or building the one a full fetch creates, which
        enters the cache at one point, after the last range), building the client's."""
        if int(getattr(full, "error_code", 0)) != 0:
            # The upstream kept failing: the client's session moved on, so it must reset.
            return full
        on_ids = fetch.version >= FIRST_TOPIC_ID_VERSION
        if fetch.as_listed:
            return (yield from _sessionless_answer(fetch.version, full, on_ids, every))
        updates: dict[TopicIdPartition, Any] = {}
        i = 0
        for topic in full.responses:
            ref = topic.topic_id if on_ids else topic.topic
            for pd in topic.partitions:
                i += 1
                if every and i % every == 0:
                    yield
                updates[fetch.by_ref[(ref, int(pd.partition_index))]] = pd
        if not updates and fetch.by_ref:
            # Throttled (KIP-219): the upstream side answered with no partitions.
            result: SessionResponse[Any] = fetch.context.throttled_response()
        else:
            result = yield from fetch.context.update_and_generate_response_data_in_ranges(
                updates, result_of, every
            )
            if isinstance(fetch.context, FullFetchContext):
                result = self._created(result)
        return (yield from _response(fetch.version, result, full, every))

    def _created(self, result: SessionResponse[Any]) -> SessionResponse[Any]:
        """Own the session a full fetch just created (closing the previous one), or undo it.

        Other connections' sessions may have grown while this fetch was upstream:
        the bound is checked again now that the session exists, and a session past
        it is closed before the client learns its id (session id 0, as Kafka).
        """
        if result.session_id == INVALID_SESSION_ID:
            return result
        created = self.sessions.get(result.session_id)
        previous = self.session
        if previous is not None and previous is not created:
            self.sessions.remove(previous)
        self._session = created
        if created is not None and self.bound is not None and self.bound.exceeded():
            self.sessions.remove(created)
            self._session = None
            self.refused_sessions += 1
            return dataclasses.replace(result, session_id=INVALID_SESSION_ID)
        return result


_SESSIONLESS = SessionlessFetchContext({})
"""The context of every ``as_listed`` fetch (its partitions are its request's)."""


def _as_listed_in_ranges(request: Any, on_ids: bool, every: int = 0) -> Ranges[bool]:
    """True when the sessionless *request*'s topics are the full fetch ``open`` would build
    from them: each topic listed once and not empty, each partition once, and every field
    as a rebuild writes it (epochs as ``plan_of`` keeps them: -1 or more; the fields a
    rebuild leaves out at their defaults).  A topic listed twice, even if a rebuild would
    keep it so, takes the general path.  One walk, no entity built."""
    walked = 0
    refs: set[Any] = set()
    for topic in request.topics:
        ref = topic.topic_id if on_ids else topic.topic
        parts = topic.partitions
        if ref in refs or not parts or not _at_defaults(topic, _TOPIC_FIELDS):
            return False
        refs.add(ref)
        cls: type = type(parts[0])
        others = _other_fields(cls, _PARTITION_FIELDS)
        if others is None:
            return False
        if kio_class_with(cls, ("partition",)) and len(set(map(type, parts))) == 1:
            # kio's partitions of one class (ints): the same checks over runs of *every*
            # partitions by the builtins, without bytecode per partition (every partition
            # of every sessionless fetch comes here)
            listed = yield from _kio_as_listed(parts, cls, others, every, walked)
            if not listed:
                return False
            walked += len(parts)
            continue
        if len({int(p.partition) for p in parts}) != len(parts):
            return False
        for p in parts:
            walked += 1
            if every and walked % every == 0:
                yield
            leader = getattr(p, "current_leader_epoch", NO_EPOCH)
            fetched = getattr(p, "last_fetched_epoch", NO_EPOCH)
            if (leader < 0 and leader != NO_EPOCH) or (fetched < 0 and fetched != NO_EPOCH):
                return False  # plan_of writes -1 for any negative epoch
            if others and not all(getattr(p, n) == d for n, d in others):
                return False
    return True


def _kio_as_listed(
    parts: tuple[Any, ...],
    cls: type,
    others: tuple[tuple[str, Any], ...],
    every: int,
    walked: int,
) -> Ranges[bool]:
    """``_as_listed_in_ranges``'s checks of one topic's partitions, all of kio's class
    *cls*: each partition once, no epoch below -1, the other fields at their defaults.
    Yields where the per-partition walk would (after every *every* partitions of the
    request, *walked* of them before these)."""
    if len(set(map(_PARTITION, parts))) != len(parts):
        return False
    names = field_names(cls)
    epochs = [attrgetter(n) for n in ("current_leader_epoch", "last_fetched_epoch") if n in names]
    step = every or len(parts)
    for start in range(0, len(parts), step):
        run = parts[start : start + step]
        for epoch in epochs:
            if min(map(epoch, run)) < NO_EPOCH:
                return False  # plan_of writes -1 for any negative epoch
        for name, default in others:
            if not all(map(eq, map(attrgetter(name), run), repeat(default))):
                return False
        if every:
            for _ in range((walked + len(run)) // every - walked // every):
                yield
        walked += len(run)
    return True


_PARTITION = attrgetter("partition")


def _sessionless_answer(version: int, full: Any, on_ids: bool, every: int) -> Ranges[Any]:
    """A sessionless client's answer: the full response with no session (id 0), its topic
    entries one per run of a topic.  Upstream's full response is usually that already, and
    goes out as it is; else it is regrouped as ``_response`` does for a session context."""
    mod = response_module(FETCH, version)
    canonical = type(full) is mod.FetchResponse and (
        getattr(full, "session_id", INVALID_SESSION_ID) == INVALID_SESSION_ID  # (v7+)
    )
    previous: Any = _NO_REF
    for i, topic in enumerate(full.responses if canonical else (), 1):
        if every and i % every == 0:
            yield  # (a topic entry per partition is possible: 20,000 of them)
        ref = topic.topic_id if on_ids else topic.topic
        if (
            ref == previous
            or not topic.partitions
            or type(topic) is not mod.FetchableTopicResponse
            or not _at_defaults(topic, _TOPIC_FIELDS)  # (the same names in responses)
        ):
            canonical = False
            break
        previous = ref
    if canonical:
        return full
    # the same as a session context's answer: each partition once (the last answer for
    # it, at the place of the first), in the full response's order
    answered: dict[tuple[Any, int], Any] = {}
    walked = 0
    for topic in full.responses:
        ref = topic.topic_id if on_ids else topic.topic
        for pd in topic.partitions:
            walked += 1
            if every and walked % every == 0:
                yield
            answered[(ref, int(pd.partition_index))] = pd
    pairs = [(ref, pd) for (ref, _), pd in answered.items()]
    return (
        yield from _response_of_pairs(
            version, int(ErrorCode.none), INVALID_SESSION_ID, pairs, full, every
        )
    )


def _ref(tp: TopicIdPartition, on_ids: bool) -> TopicKey:
    return tp.topic_id if on_ids else tp.topic


def _sessionless_request(
    request: Any,
    effective: list[tuple[TopicIdPartition, PartitionPlan]],
    on_ids: bool,
    every: int = 0,
    cached: list[CachedPartition] | None = None,
) -> Ranges[Any]:
    """The client's fetch as one sessionless full fetch at its own version (*cached*: the
    session's partitions in *effective*'s order, whose entities serve unchanged ones)."""
    topics = yield from _listed_as_is(request, effective, on_ids, every)
    if topics is None:
        mod = request_module(FETCH, int(request.__version__))
        topics = yield from _rebuilt_topics_in_ranges(mod, effective, on_ids, every, cached)
    return _full_fetch(request, topics)


def _full_fetch(request: Any, topics: Any) -> Any:
    """The client's *request* with *topics*, as one sessionless full fetch at its version."""
    mod = request_module(FETCH, int(request.__version__))
    return consumer_fetch(
        mod,
        request,
        session_id=INVALID_SESSION_ID,
        session_epoch=FINAL_EPOCH,
        topics=topics,
        forgotten=(),
    )


_TOPIC_FIELDS = frozenset({"topic", "topic_id", "partitions"})
_PARTITION_FIELDS = frozenset(
    {
        "partition",
        "fetch_offset",
        "partition_max_bytes",
        "log_start_offset",
        "current_leader_epoch",
        "last_fetched_epoch",
    }
)


@cache
def _other_fields(cls: type, known: frozenset[str]) -> tuple[tuple[str, Any], ...] | None:
    """(name, default) of the fields of *cls* a rebuild leaves at their defaults (None: one has none)."""
    out = []
    for f in dataclasses.fields(cls):
        if f.name in known:
            continue
        if f.default is dataclasses.MISSING:
            return None
        out.append((f.name, f.default))
    return tuple(out)


def _at_defaults(entity: Any, known: frozenset[str]) -> bool:
    cls: type = type(entity)
    others = _other_fields(cls, known)
    return others is not None and all(getattr(entity, n) == d for n, d in others)


def _listed_as_is(
    request: Any,
    effective: list[tuple[TopicIdPartition, PartitionPlan]],
    on_ids: bool,
    every: int = 0,
) -> Ranges[tuple[Any, ...] | None]:
    """The request's own topics when they are what ``_rebuilt_topics`` would build, else None.

    A sessionless client's full fetch usually is (each partition once, one entry per run
    of a topic): reusing it spares building a kio entity per partition on every fetch.
    """
    topics = request.topics
    i = 0
    previous: Any = _NO_REF
    for topic in topics:
        ref = topic.topic_id if on_ids else topic.topic
        if ref == previous or not topic.partitions or not _at_defaults(topic, _TOPIC_FIELDS):
            return None
        previous = ref
        for p in topic.partitions:
            if i >= len(effective):
                return None
            t, req = effective[i]
            i += 1
            if every and i % every == 0:
                yield
            if (
                _ref(t, on_ids) != ref
                or t.partition != p.partition
                or p.fetch_offset != req.fetch_offset
                or p.partition_max_bytes != req.partition_max_bytes
                or getattr(p, "log_start_offset", -1) != req.log_start_offset
                or getattr(p, "current_leader_epoch", NO_EPOCH) != req.current_leader_epoch
                or getattr(p, "last_fetched_epoch", NO_EPOCH) != req.last_fetched_epoch
                or not _at_defaults(p, _PARTITION_FIELDS)
            ):
                return None
    return topics if i == len(effective) else None


_NO_REF = object()


def _rebuilt_topics(
    mod: Any, effective: list[tuple[TopicIdPartition, PartitionPlan]], on_ids: bool
) -> tuple[Any, ...]:
    return drain(_rebuilt_topics_in_ranges(mod, effective, on_ids, 0))


def _rebuilt_topics_in_ranges(
    mod: Any,
    effective: list[tuple[TopicIdPartition, PartitionPlan]],
    on_ids: bool,
    every: int,
    cached: list[CachedPartition] | None = None,
) -> Ranges[tuple[Any, ...]]:
    topics = []
    done = 0
    for ref, items in group_runs(effective, lambda item: _ref(item[0], on_ids)):
        partitions = []
        for t, req in items:
            done += 1
            if every and done % every == 0:
                yield
            if cached is None:
                partitions.append(fetch_partition(mod, t.partition, req))
            else:  # the session's partition: its entity, rebuilt only when its plan changed
                partitions.append(cached[done - 1].request_partition(mod))
        topics.append(make(mod.FetchTopic, topic=ref, topic_id=ref, partitions=tuple(partitions)))
    return tuple(topics)


def _response(
    version: int, result: SessionResponse[Any], full: Any | None, every: int = 0
) -> Ranges[Any]:
    on_ids = version >= FIRST_TOPIC_ID_VERSION
    pairs = ((_ref(tp, on_ids), pd) for tp, pd in result.partitions)
    return (
        yield from _response_of_pairs(
            version, result.error_code, result.session_id, pairs, full, every
        )
    )


def _response_of_pairs(
    version: int,
    error_code: int,
    session_id: int,
    pairs: Iterable[tuple[Any, Any]],
    full: Any | None,
    every: int = 0,
) -> Ranges[Any]:
    """``_response`` from (topic ref, partition data) pairs."""
    mod = response_module(FETCH, version)
    topics: list[Any] = []
    # one entry per run of a topic, as a broker groups them
    yield from topic_entries_in_ranges(mod, pairs, topics, every)
    return make(
        mod.FetchResponse,
        throttle_time=full.throttle_time if full is not None else timedelta(0),
        error_code=ErrorCode(error_code),
        session_id=session_id,
        responses=tuple(topics),
        node_endpoints=getattr(full, "node_endpoints", ()) if full is not None else (),
    )
