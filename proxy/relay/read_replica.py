"""The proxy following ``preferred_read_replica`` itself (KIP-392), sans-I/O.

A client on Fetch v10 or older cannot receive a leader's redirect, and some
v11+ clients ignore one they did not ask for (``proxy.relay.rack_fetch``).  For
those, the proxy can do what Kafka's Java consumer does (``SubscriptionState``
keeps a preferred read replica per partition, ``AbstractFetch`` chooses the
node of each partition's next fetch): fetch the redirected partitions from the
replica and answer the client as if the leader had sent the data.  This module
holds the parts of that which are plain values; ``proxy.fetchpath`` calls them
for such clients (between shaping and the upstream session), and the edge owns
the connections to replicas (``proxy.server.replicas``, behind
:class:`ReplicaUpstream`).

One exchange, for the full fetch of one client connection (in the client's
Fetch version, topics keyed as the client names them)::

    routes = replicas.routes(keys, now)               # partition -> replica node
    plan = split(request, routes)                      # FetchSplit
    send plan.leader to the connection's broker (if not None)
    send plan.replicas[node] to each replica node      # ReplicaUpstream, at the edge
    merged = merge(plan, leader_answer, replica_answers, watermarks=..., replicas=...)
    answer the client with merged.response; count merged.served and merged.fallbacks

:class:`ReadReplicas`, one per client connection, maps a partition to its
preferred read replica until an expiry, as the Java consumer keeps one until
``metadata.max.age.ms`` (default 300 s) has passed since the leader named it;
a fallback (below), the replica leaving the in-sync replicas (Metadata), or a
lost connection clears it, and the partition's next fetch goes to the leader,
which may redirect it again.

:func:`split` takes the routed partitions out of the leader's fetch: each
replica gets a sessionless fetch of its partitions carrying the client's
``current_leader_epoch`` (KIP-320: a replica with another epoch answers
FENCED/UNKNOWN_LEADER_EPOCH instead of data of another leader's log).  The
response-level ``max_bytes`` is shared between the parts, so the answers
together are bounded as the client's one fetch was (partition sets are
disjoint, each keeps its ``partition_max_bytes``); each answer takes its memory
budget into the same fetch's grant when its size is known (the edge asks the
fetch path's ``reserve_response`` for the replica's as for the leader's).  When a replica part
exists the leader part does not long-poll (``max_wait`` 0): the leader is asked
only for partitions not redirected yet, whose answer is the redirect itself.

:func:`merge` builds the client's answer in the client's order from the
parts.  A partition a replica could not serve (any partition error: Kafka's
consumer drops the preferred replica on OFFSET_OUT_OF_RANGE, since a follower
may lack an offset the leader has, and on NOT_LEADER_OR_FOLLOWER, REPLICA_NOT_
AVAILABLE and the epoch errors), or every partition of a replica whose
connection was lost or whose answer carried a top-level error, is answered
*empty and without error* at the client's offset and falls back to the leader:
the client asks the same offset again, so nothing is lost or repeated, and no
client resets its offset because a follower lagged.  A replica whose high
watermark stays below the client's fetch offset for ``max_lagging``
consecutive answers falls back too (``replica_lagging``).

:class:`Watermarks` keeps, per partition, the highest high watermark, last
stable offset and log start offset the client was given, and never reports
less: a follower learns the high watermark after the leader.

Bounded: :class:`ReadReplicas` and :class:`Watermarks` keep at most
``max_partitions`` entries (least recently learnt go first), and forget
partitions the client no longer fetches (``retain``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from ..protocol.apis import FETCH
from ..protocol.error_codes import NONE, OFFSET_OUT_OF_RANGE
from ..protocol.framing import Frame
from ..protocol.messages import convert, field_names, make, request_module, response_module
from ..protocol.partition_key import PartitionKey, topic_key
from .racks import FallbackReason, fallback_reason

DEFAULT_EXPIRY_SECONDS = 300.0
"""How long a preferred read replica is followed without the leader naming it again
(the Java consumer's ``metadata.max.age.ms`` default)."""
DEFAULT_MAX_PARTITIONS = 10_000
MIN_REPLICA_FETCH_VERSION = 11
"""A broker serves a consumer's fetch as a follower only from Fetch v11 (the version that
carries client metadata, KIP-392); an older one gets NOT_LEADER_OR_FOLLOWER."""
NAMES_REPLICA_FETCH_VERSION = 12
"""The version a replica fetch of a client below v11 is sent at (the last with topic names)."""
DEFAULT_MAX_LAGGING = 10
"""Consecutive answers of a replica whose high watermark is below the client's fetch
offset before the partition goes back to the leader."""


class ReplicaUpstream(Protocol):
    """The edge's connections to replicas, as the fetch path would use them.

    ``send`` writes one encoded Fetch to *node* on a connection the proxy owns
    (never a client's: one that carries a client's SASL identity is not used for
    another client, so such clients get no replica connection at all and their
    fetches stay with the leader, ``client_authenticated``); exactly one of
    *on_response* (the response frame) or *on_failure* (no connection, or lost
    before the answer) is called later, from :meth:`deliver`, which the fetch path calls
    in the connection's own task when the edge wakes it.
    """

    def available(self, node: int) -> bool: ...
    def deliver(self) -> None:
        """Run the callbacks of what arrived (from the client connection's own task)."""

    def send(
        self,
        node: int,
        frame: bytes,
        *,
        api_version: int,
        on_response: Callable[[Frame], None],
        on_failure: Callable[[], None],
    ) -> None: ...


@dataclass(slots=True)
class _Preferred:
    node: int
    expires: float
    lagging: int = 0


class ReadReplicas:
    """Partition -> preferred read replica, with an expiry (one per client connection)."""

    def __init__(
        self,
        *,
        expiry_seconds: float = DEFAULT_EXPIRY_SECONDS,
        max_partitions: int = DEFAULT_MAX_PARTITIONS,
        max_lagging: int = DEFAULT_MAX_LAGGING,
    ) -> None:
        if expiry_seconds <= 0 or max_partitions <= 0 or max_lagging <= 0:
            raise ValueError("expiry_seconds, max_partitions and max_lagging must be positive")
        self.expiry_seconds = expiry_seconds
        self.max_partitions = max_partitions
        self.max_lagging = max_lagging
        self._by_key: dict[PartitionKey, _Preferred] = {}

    def learn(self, redirects: Mapping[PartitionKey, int], now: float) -> None:
        """The leader named these replicas (``preferred_read_replica``) at *now*."""
        for key, node in redirects.items():
            if node < 0:
                continue
            self._by_key.pop(key, None)
            self._by_key[key] = _Preferred(int(node), now + self.expiry_seconds)
        while len(self._by_key) > self.max_partitions:
            del self._by_key[next(iter(self._by_key))]

    def replica(self, key: PartitionKey, now: float) -> int | None:
        """The replica to fetch *key* from, or None (the leader); an expired one is dropped."""
        entry = self._by_key.get(key)
        if entry is None:
            return None
        if now >= entry.expires:
            del self._by_key[key]
            return None
        return entry.node

    def routes(
        self,
        keys: Iterable[PartitionKey],
        now: float,
        *,
        available: Callable[[int], bool] | None = None,
        in_sync: Callable[[PartitionKey, int], bool | None] | None = None,
    ) -> tuple[dict[PartitionKey, int], list[tuple[PartitionKey, FallbackReason]]]:
        """Which of *keys* go to a replica, and the ones dropped here with why.

        *available*: the edge can reach the node (else ``replica_unavailable``);
        *in_sync*: Metadata's in-sync replicas of the partition include it (False:
        ``not_in_isr``; None: not known, kept).
        """
        routes: dict[PartitionKey, int] = {}
        dropped: list[tuple[PartitionKey, FallbackReason]] = []
        for key in keys:
            node = self.replica(key, now)
            if node is None:
                continue
            if available is not None and not available(node):
                self.clear(key)
                dropped.append((key, FallbackReason.REPLICA_UNAVAILABLE))
            elif in_sync is not None and in_sync(key, node) is False:
                self.clear(key)
                dropped.append((key, FallbackReason.NOT_IN_ISR))
            else:
                routes[key] = node
        return routes, dropped

    def clear(self, key: PartitionKey) -> bool:
        """Fetch *key* from the leader again; True if it had a replica."""
        return self._by_key.pop(key, None) is not None

    def lagged(self, key: PartitionKey, behind: bool) -> bool:
        """The replica answered *key* with its high watermark below the client's offset
        (*behind*) or not; True when that has now happened ``max_lagging`` times in a row
        (the partition is cleared)."""
        entry = self._by_key.get(key)
        if entry is None:
            return False
        entry.lagging = entry.lagging + 1 if behind else 0
        if entry.lagging >= self.max_lagging:
            del self._by_key[key]
            return True
        return False

    def retain(self, keys: Iterable[PartitionKey]) -> None:
        """Forget every partition not in *keys* (the client no longer fetches it)."""
        keep = set(keys)
        for key in [k for k in self._by_key if k not in keep]:
            del self._by_key[key]

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: object) -> bool:
        return key in self._by_key


class Watermarks:
    """The highest (high watermark, last stable offset, log start offset) a client was given."""

    def __init__(self, *, max_partitions: int = DEFAULT_MAX_PARTITIONS) -> None:
        if max_partitions <= 0:
            raise ValueError("max_partitions must be positive")
        self.max_partitions = max_partitions
        self._seen: dict[PartitionKey, tuple[int, int, int]] = {}

    def get(self, key: PartitionKey) -> tuple[int, int, int] | None:
        return self._seen.get(key)

    def apply(self, key: PartitionKey, pd: Any) -> Any:
        """*pd* (a response partition) with no offset below what the client saw before.

        A partition with an error is passed as it is, and an OFFSET_OUT_OF_RANGE
        (the log was truncated or deleted: the client resets) forgets what was seen.
        """
        code = int(pd.error_code)
        if code != NONE:
            if code == OFFSET_OUT_OF_RANGE:
                self._seen.pop(key, None)
            return pd
        hw, lso, lso_start = (
            int(pd.high_watermark),
            int(pd.last_stable_offset),
            int(pd.log_start_offset),
        )
        before = self._seen.pop(key, None)
        if before is not None:
            hw = max(hw, before[0])
            lso = max(lso, before[1]) if lso >= 0 else lso
            lso_start = max(lso_start, before[2]) if lso_start >= 0 else lso_start
        self._seen[key] = (hw, lso, lso_start)
        while len(self._seen) > self.max_partitions:
            del self._seen[next(iter(self._seen))]
        if (hw, lso, lso_start) == (
            int(pd.high_watermark),
            int(pd.last_stable_offset),
            int(pd.log_start_offset),
        ):
            return pd
        return dataclasses.replace(
            pd, high_watermark=hw, last_stable_offset=lso, log_start_offset=lso_start
        )

    def retain(self, keys: Iterable[PartitionKey]) -> None:
        keep = set(keys)
        for key in [k for k in self._seen if k not in keep]:
            del self._seen[key]

    def __len__(self) -> int:
        return len(self._seen)


# -- one exchange ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FetchSplit:
    """One client fetch split between its leader and preferred replicas."""

    request: Any
    """The client's full fetch, as it was (its order is the answer's order)."""
    leader: Any | None
    """The fetch for the connection's broker; None when every partition goes to a replica."""
    replicas: Mapping[int, Any]
    """Replica node -> the sessionless fetch of its partitions."""
    routes: Mapping[PartitionKey, int]
    offsets: Mapping[PartitionKey, int]
    """The client's fetch offset of each routed partition (for the empty answers)."""


def requested_keys(request: Any) -> list[PartitionKey]:
    """The partitions of a full fetch, in its order."""
    return [(topic_key(t), int(p.partition)) for t in request.topics for p in t.partitions]


def _subset(request: Any, keep: Callable[[PartitionKey], bool]) -> tuple[Any, ...]:
    topics = []
    for t in request.topics:
        key = topic_key(t)
        parts = tuple(p for p in t.partitions if keep((key, int(p.partition))))
        if parts:
            topics.append(
                t if len(parts) == len(t.partitions) else dataclasses.replace(t, partitions=parts)
            )
    return tuple(topics)


def split(request: Any, routes: Mapping[PartitionKey, int]) -> FetchSplit:
    """*request* (a full fetch) split by *routes* (see the module docstring)."""
    keys = requested_keys(request)
    routes = {k: n for k, n in routes.items() if k in set(keys)}
    if not routes:
        return FetchSplit(request, request, {}, {}, {})
    nodes = sorted(set(routes.values()))
    leader_topics = _subset(request, lambda k: k not in routes)
    parts = len(nodes) + (1 if leader_topics else 0)
    share = max(1, int(request.max_bytes) // parts)
    leader = None
    if leader_topics:
        leader = dataclasses.replace(
            request, topics=leader_topics, max_bytes=share, max_wait=timedelta(0)
        )
    replicas: dict[int, Any] = {}
    for node in nodes:
        mine = {k for k, n in routes.items() if n == node}
        fields: dict[str, Any] = {
            "topics": _subset(request, mine.__contains__),
            "max_bytes": share,
            "session_id": 0,
            "session_epoch": -1,
            "forgotten_topics_data": (),
        }
        replicas[node] = dataclasses.replace(request, **fields)
    offsets = {
        (topic_key(t), int(p.partition)): int(p.fetch_offset)
        for t in request.topics
        for p in t.partitions
        if (topic_key(t), int(p.partition)) in routes
    }
    return FetchSplit(request, leader, replicas, routes, offsets)


def replica_request(request: Any, rack: str) -> Any:
    """A replica part of :func:`split` as it goes to the replica: at least Fetch v11
    (v12 for an older client; its topics are named), carrying the proxy's *rack*."""
    version = int(request.__version__)
    if version >= MIN_REPLICA_FETCH_VERSION:
        return dataclasses.replace(request, rack_id=rack)
    mod = request_module(FETCH, NAMES_REPLICA_FETCH_VERSION)
    topics = tuple(
        make(
            mod.FetchTopic,
            topic=t.topic,
            partitions=tuple(convert(p, mod.FetchPartition) for p in t.partitions),
        )
        for t in request.topics
    )
    return make(
        mod.FetchRequest,
        replica_id=-1,
        max_wait=request.max_wait,
        min_bytes=request.min_bytes,
        max_bytes=request.max_bytes,
        isolation_level=request.isolation_level,
        session_id=0,
        session_epoch=-1,
        topics=topics,
        forgotten_topics_data=(),
        rack_id=rack,
    )


def as_version(response: Any, version: int) -> Any:
    """A Fetch *response* (of a replica request) at the client's *version*."""
    if int(response.__version__) == version:
        return response
    mod = response_module(FETCH, version)
    topics = []
    for t in response.responses:
        parts = []
        for pd in t.partitions:
            aborted = pd.aborted_transactions
            if aborted is not None:
                aborted = tuple(convert(a, mod.AbortedTransaction) for a in aborted)
            kind: type = type(pd)
            fields = {f: getattr(pd, f) for f in field_names(kind)}
            fields["aborted_transactions"] = aborted
            parts.append(make(mod.PartitionData, **fields))
        topics.append(make(mod.FetchableTopicResponse, topic=t.topic, partitions=tuple(parts)))
    return make(
        mod.FetchResponse,
        throttle_time=response.throttle_time,
        error_code=response.error_code,
        session_id=response.session_id,
        responses=tuple(topics),
    )


@dataclass(frozen=True, slots=True)
class Fallback:
    """A partition that goes back to its leader, and why."""

    key: PartitionKey
    node: int
    reason: FallbackReason


@dataclass(frozen=True, slots=True)
class Merged:
    """The client's answer for one split exchange, and what it is made of."""

    response: Any
    served: tuple[tuple[PartitionKey, int | None, int], ...]
    """(partition, node that served it (None: the leader), record bytes), for
    ``racks.account``; a partition answered empty after a fallback is not in it."""
    fallbacks: tuple[Fallback, ...]
    redirects: Mapping[PartitionKey, int]
    """Partitions the leader's answer redirected (learnt into :class:`ReadReplicas`)."""


def _partitions(response: Any | None) -> dict[PartitionKey, tuple[Any, Any]]:
    """(topic entry, partition) of every partition of a response, by key."""
    if response is None:
        return {}
    return {
        (topic_key(t), int(pd.partition_index)): (t, pd)
        for t in response.responses
        for pd in t.partitions
    }


def _records_size(pd: Any) -> int:
    records = getattr(pd, "records", None)
    return len(records) if records else 0


def merge(
    plan: FetchSplit,
    leader: Any | None,
    replicas: Mapping[int, Any | None],
    *,
    watermarks: Watermarks,
    read_replicas: ReadReplicas,
    now: float,
    leader_redirects: Mapping[PartitionKey, int] | None = None,
) -> Merged:
    """The client's answer from the parts of *plan* (see the module docstring).

    *leader_redirects*: the redirects of the leader's answer as the upstream sent
    it, for a client whose Fetch version has no ``preferred_read_replica`` (the
    answer converted to its version lost the field; the partition is empty).

    *leader*: the leader part's answer (at the client's version; None when
    ``plan.leader`` is None).  *replicas*: node -> its answer at the client's
    version, or None when the connection failed or none could be opened.  A
    leader answer with a top-level error is the client's answer as it is (the
    client asks everything again; the replicas' records are not delivered, so
    they are fetched again, not lost).
    """
    if leader is not None and int(getattr(leader, "error_code", 0)) != NONE:
        return Merged(leader, (), (), {})
    mod = response_module(FETCH, int(plan.request.__version__))
    fallbacks: list[Fallback] = []
    from_leader = _partitions(leader)
    from_replicas: dict[PartitionKey, tuple[Any, Any]] = {}
    answers = [
        a
        for a in (leader, *replicas.values())
        if a is not None and int(getattr(a, "error_code", 0)) == NONE
    ]
    for node, answer in replicas.items():
        if answer is None or int(getattr(answer, "error_code", 0)) != NONE:
            reason = FallbackReason.REPLICA_UNAVAILABLE if answer is None else FallbackReason.OTHER
            for key, to in plan.routes.items():
                if to == node and read_replicas.clear(key):
                    fallbacks.append(Fallback(key, node, reason))
            continue
        from_replicas.update(_partitions(answer))

    redirects: dict[PartitionKey, int] = {
        k: n for k, n in (leader_redirects or {}).items() if k not in plan.routes and n >= 0
    }
    served: list[tuple[PartitionKey, int | None, int]] = []
    topics: list[Any] = []
    for t in plan.request.topics:
        tkey = topic_key(t)
        entry = None
        parts: list[Any] = []
        for p in t.partitions:
            key = (tkey, int(p.partition))
            routed = plan.routes.get(key)
            hit = (from_replicas if routed is not None else from_leader).get(key)
            pd = None
            if hit is not None:
                entry, pd = entry or hit[0], hit[1]
            if pd is not None and routed is None:
                replica = int(getattr(pd, "preferred_read_replica", -1))
                if replica >= 0 and int(pd.error_code) == NONE:
                    redirects[key] = replica
                    pd = _without_redirect(pd)  # the proxy follows it, the client never sees it
                served.append((key, None, _records_size(pd)))
            elif pd is not None and routed is not None:
                pd = _replica_partition(key, routed, pd, plan, read_replicas, fallbacks)
                if pd is not None:
                    served.append((key, routed, _records_size(pd)))
            if pd is None:  # nothing usable: empty and without error, asked again
                pd = _placeholder(mod, key, int(p.fetch_offset), watermarks)
            parts.append(watermarks.apply(key, pd))
        if entry is None:
            entry = _topic_entry(mod, t)
        topics.append(dataclasses.replace(entry, partitions=tuple(parts)))
    read_replicas.learn(redirects, now)
    if answers:
        base = answers[0]
        slowest = max(answers, key=lambda a: _millis(getattr(a, "throttle_time", 0)))
        response = dataclasses.replace(base, responses=tuple(topics))
        if hasattr(slowest, "throttle_time"):
            response = dataclasses.replace(response, throttle_time=slowest.throttle_time)
    else:
        response = make(
            mod.FetchResponse,
            throttle_time=timedelta(0),
            error_code=ErrorCode(NONE),
            session_id=0,
            responses=tuple(topics),
        )
    return Merged(response, tuple(served), tuple(fallbacks), redirects)


def _replica_partition(
    key: PartitionKey,
    node: int,
    pd: Any,
    plan: FetchSplit,
    read_replicas: ReadReplicas,
    fallbacks: list[Fallback],
) -> Any | None:
    """A replica's answer for *key*, or None when it falls back to the leader."""
    code = int(pd.error_code)
    if code != NONE:
        if read_replicas.clear(key):
            fallbacks.append(Fallback(key, node, fallback_reason(code)))
        return None
    behind = not _records_size(pd) and int(pd.high_watermark) < plan.offsets.get(key, 0)
    if read_replicas.lagged(key, behind):
        fallbacks.append(Fallback(key, node, FallbackReason.REPLICA_LAGGING))
    return pd


def _without_redirect(pd: Any) -> Any:
    """A leader's redirect answer as a client that does not follow it gets it: empty."""
    return dataclasses.replace(pd, records=None, preferred_read_replica=-1)


def _placeholder(mod: Any, key: PartitionKey, offset: int, watermarks: Watermarks) -> Any:
    """An empty, error-free answer for *key* at the client's *offset* (never below what
    the client saw: the watermarks raise it)."""
    seen = watermarks.get(key)
    return make(
        mod.PartitionData,
        partition_index=key[1],
        error_code=ErrorCode(NONE),
        high_watermark=max(offset, seen[0]) if seen else offset,
        last_stable_offset=max(offset, seen[1]) if seen else offset,
        log_start_offset=seen[2] if seen else -1,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=None,
    )


def _topic_entry(mod: Any, request_topic: Any) -> Any:
    """A response topic entry for a topic no part answered."""
    cls = mod.FetchableTopicResponse
    field = "topic_id" if "topic_id" in field_names(cls) else "topic"
    return make(cls, **{field: topic_key(request_topic), "partitions": ()})


def _millis(value: Any) -> int:
    if isinstance(value, timedelta):
        return int(value / timedelta(milliseconds=1))
    return int(value)
