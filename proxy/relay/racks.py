"""Which broker is in which rack, and what each fetch's bytes owe to it (sans-I/O).

Kafka brokers announce their ``broker.rack`` in Metadata v1+ (``brokers[].rack``)
and each partition's leader in ``topics[].partitions[].leader_id``.  The proxy
sees every Metadata response it relays (and asks one itself at discovery), so
:class:`RackMap` learns both from them: node id -> rack, and (topic, partition)
-> leader, keyed by topic name and, from Metadata v10 on, by topic id too (Fetch
v13+ names topics by id).

Against the proxy's own ``rack`` setting, every upstream node is in one of
three :class:`Locality` values: ``same_rack`` (the broker announced the
proxy's rack), ``other_rack`` (it announced another one) or ``unknown`` (the
proxy has no rack, or the broker announced none or is not known yet).

:func:`account` turns the record bytes of one Fetch exchange, each partition
with the node that served it, into a :class:`RackUsage` value: bytes by node
and locality, bytes by topic, and the bytes that stayed in the rack *because*
a replica other than the leader served them.  Those are the cross-zone bytes
avoided, counted precisely as:

    record bytes served by a node in the proxy's rack that is not the
    partition's leader, where the leader (as last learnt from Metadata) is in
    another rack.

Bytes whose partition leader or its rack is not known are never counted as
avoided (an estimate that errs low).  The cost avoided is those bytes times
the ``cross_zone_price_per_gb`` setting divided by 1e9 (a decimal GB, as
cloud price lists count).

:class:`FallbackReason` is the fixed set of reasons a fetch of a partition
went back to its leader instead of a preferred read replica (KIP-392); the
fetch path reports them as values and the edge counts them.

Bounded: at most ``max_brokers`` nodes and ``max_partitions`` partition
leaders (the least recently learnt go first); a rack name is cut to
``MAX_RACK_CHARS``.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ..protocol import codec, error_codes
from ..protocol.apis import METADATA
from ..protocol.errors import DecodeError
from ..protocol.partition_key import PartitionKey, TopicKey

MAX_RACK_CHARS = 255
DEFAULT_MAX_BROKERS = 10_000
DEFAULT_MAX_PARTITIONS = 100_000
MAX_TOPICS_PER_USAGE = 100
"""Topics a :class:`RackUsage` lists one by one; the rest are folded into one ``None`` row."""
BYTES_PER_GB = 1_000_000_000


class Locality(StrEnum):
    """Where an upstream node is, seen from the proxy's rack."""

    SAME_RACK = "same_rack"
    OTHER_RACK = "other_rack"
    UNKNOWN = "unknown"


class FallbackReason(StrEnum):
    """Why a partition was fetched from its leader instead of a preferred read replica."""

    OFFSET_OUT_OF_RANGE = "offset_out_of_range"
    """The replica answered OFFSET_OUT_OF_RANGE (it has not caught up to the offset)."""
    NOT_LEADER_OR_FOLLOWER = "not_leader_or_follower"
    """The replica answered NOT_LEADER_OR_FOLLOWER (or REPLICA_NOT_AVAILABLE): it no
    longer hosts the partition."""
    LEADER_EPOCH = "leader_epoch"
    """The replica answered FENCED_LEADER_EPOCH or UNKNOWN_LEADER_EPOCH (KIP-320)."""
    REPLICA_LAGGING = "replica_lagging"
    """The replica's high watermark is behind what the client has already seen."""
    NOT_IN_ISR = "not_in_isr"
    """Metadata says the preferred replica left the in-sync replicas."""
    REPLICA_UNAVAILABLE = "replica_unavailable"
    """No connection to the replica: it is down, refused, or has no known address."""
    CLIENT_AUTHENTICATED = "client_authenticated"
    """The client authenticates end to end (SASL through the proxy): the proxy never
    borrows another connection's identity, so the fetch stays with the leader."""
    CLIENT_IGNORES_REDIRECT = "client_ignores_redirect"
    """A client given ``preferred_read_replica`` kept asking the leader (it does not
    follow redirects it did not ask for): its connection stops sending the proxy's rack
    (``proxy.relay.rack_fetch``); counted once, when it stops."""
    OLD_FETCH_VERSION = "old_fetch_version"
    """The client's Fetch version (v10 or older) carries no rack and cannot receive a
    redirect, and the proxy does not follow one for it; counted once per connection."""
    OTHER = "other"
    """Any other error from the replica."""


_ERROR_REASONS: Mapping[int, FallbackReason] = {
    error_codes.OFFSET_OUT_OF_RANGE: FallbackReason.OFFSET_OUT_OF_RANGE,
    error_codes.NOT_LEADER_OR_FOLLOWER: FallbackReason.NOT_LEADER_OR_FOLLOWER,
    9: FallbackReason.NOT_LEADER_OR_FOLLOWER,  # REPLICA_NOT_AVAILABLE
    error_codes.FENCED_LEADER_EPOCH: FallbackReason.LEADER_EPOCH,
    error_codes.UNKNOWN_LEADER_EPOCH: FallbackReason.LEADER_EPOCH,
}


def fallback_reason(error_code: int) -> FallbackReason:
    """The fallback reason for a partition error a preferred replica answered."""
    return _ERROR_REASONS.get(int(error_code), FallbackReason.OTHER)


def _rack(value: Any) -> str | None:
    if not isinstance(value, str) or not value:
        return None
    return value[:MAX_RACK_CHARS]


class RackMap:
    """Node -> rack and partition -> leader, learnt from Metadata; the proxy's own rack."""

    def __init__(
        self,
        rack: str | None = None,
        *,
        max_brokers: int = DEFAULT_MAX_BROKERS,
        max_partitions: int = DEFAULT_MAX_PARTITIONS,
    ) -> None:
        if max_brokers <= 0 or max_partitions <= 0:
            raise ValueError("max_brokers and max_partitions must be positive")
        self.rack = _rack(rack)
        """The proxy's own rack (the ``rack`` setting); None: rack-unaware."""
        self._max_brokers = max_brokers
        self._max_partitions = max_partitions
        self._racks: dict[int, str | None] = {}
        self._leaders: dict[PartitionKey, int] = {}
        self._isr: dict[PartitionKey, frozenset[int]] = {}
        """The in-sync replicas of each partition whose leader is known (same bound)."""

    # -- learning ----------------------------------------------------------------

    def learn_broker(self, node_id: int, rack: str | None) -> None:
        """Record that *node_id* announced *rack* (None or empty: no rack)."""
        if node_id < 0:
            return
        self._racks.pop(node_id, None)
        self._racks[node_id] = _rack(rack)
        while len(self._racks) > self._max_brokers:
            del self._racks[next(iter(self._racks))]

    def learn_leader(
        self,
        topic: TopicKey,
        partition: int,
        leader: int,
        isr: Iterable[int] | None = None,
    ) -> None:
        """*leader* leads (topic, partition) now, with in-sync replicas *isr* (None: not
        known); a negative leader forgets it."""
        key = (topic, int(partition))
        self._leaders.pop(key, None)
        self._isr.pop(key, None)
        if leader < 0:
            return
        self._leaders[key] = int(leader)
        if isr is not None:
            self._isr[key] = frozenset(int(n) for n in isr)
        while len(self._leaders) > self._max_partitions:
            oldest = next(iter(self._leaders))
            del self._leaders[oldest]
            self._isr.pop(oldest, None)

    def learn_metadata(self, response: Any) -> None:
        """Learn from a decoded Metadata response (racks from v1 on, leaders always).

        A response with a top-level error (v13+) teaches nothing; a topic or
        partition with an error forgets that partition's leader.
        """
        if int(getattr(response, "error_code", 0)) != 0:
            return
        for broker in getattr(response, "brokers", ()):
            self.learn_broker(int(broker.node_id), getattr(broker, "rack", None))
        for topic in getattr(response, "topics", ()):
            name = getattr(topic, "name", None)
            topic_id = getattr(topic, "topic_id", None)
            keys: list[TopicKey] = []
            if isinstance(name, str) and name:
                keys.append(name)
            if isinstance(topic_id, uuid.UUID) and topic_id.int != 0:
                keys.append(topic_id)
            topic_ok = int(getattr(topic, "error_code", 0)) == 0
            for p in getattr(topic, "partitions", ()):
                ok = topic_ok and int(getattr(p, "error_code", 0)) == 0
                leader = int(p.leader_id) if ok else -1
                isr = getattr(p, "isr_nodes", None)
                for key in keys:
                    self.learn_leader(key, int(p.partition_index), leader, isr)

    # -- reading -----------------------------------------------------------------

    def rack_of(self, node_id: int | None) -> str | None:
        return None if node_id is None else self._racks.get(node_id)

    def knows(self, node_id: int) -> bool:
        return node_id in self._racks

    def racks(self) -> dict[int, str | None]:
        """Every known node and its rack (a copy)."""
        return dict(self._racks)

    def same_rack_nodes(self) -> tuple[int, ...]:
        """The known nodes in the proxy's rack, sorted (empty when the proxy has no rack)."""
        if self.rack is None:
            return ()
        return tuple(sorted(n for n, r in self._racks.items() if r == self.rack))

    def locality(self, node_id: int | None) -> Locality:
        if self.rack is None:
            return Locality.UNKNOWN
        rack = self.rack_of(node_id)
        if rack is None:
            return Locality.UNKNOWN
        return Locality.SAME_RACK if rack == self.rack else Locality.OTHER_RACK

    def leader_of(self, topic: TopicKey, partition: int) -> int | None:
        return self._leaders.get((topic, int(partition)))

    def in_sync(self, key: PartitionKey, node: int) -> bool | None:
        """Is *node* among the in-sync replicas of *key*, as Metadata last said (None: not
        known)?  A preferred read replica that left them goes back to the leader."""
        isr = self._isr.get(key)
        return None if isr is None else node in isr

    def __len__(self) -> int:
        return len(self._leaders)


def learn_from_frame(racks: RackMap, api_version: int, frame: bytes) -> None:
    """Learn from a Metadata response frame (one that does not decode teaches nothing)."""
    try:
        _, response = codec.decode_response(METADATA, api_version, frame)
    except DecodeError:
        return  # not ours to judge: the client gets the frame as it came
    racks.learn_metadata(response)


# -- accounting ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class NodeBytes:
    """Record bytes one upstream node served in one exchange."""

    node: int | None
    locality: Locality
    record_bytes: int
    avoided_bytes: int
    """Of those, the cross-zone bytes avoided (see the module docstring)."""
    follower_partitions: int
    """Partitions it served that it does not lead (a preferred read replica)."""


@dataclass(frozen=True, slots=True)
class TopicBytes:
    """Record bytes of one topic in one exchange, by locality of the node that served them."""

    topic: TopicKey
    """Name or id as the fetch named it; None: the topics past ``MAX_TOPICS_PER_USAGE``."""
    same_rack_bytes: int
    other_rack_bytes: int
    unknown_rack_bytes: int
    avoided_bytes: int


@dataclass(frozen=True, slots=True)
class RackUsage:
    """Where one Fetch exchange's record bytes came from, seen from the proxy's rack."""

    rack: str | None
    by_node: tuple[NodeBytes, ...]
    by_topic: tuple[TopicBytes, ...]

    def _sum(self, locality: Locality) -> int:
        return sum(n.record_bytes for n in self.by_node if n.locality is locality)

    @property
    def same_rack_bytes(self) -> int:
        return self._sum(Locality.SAME_RACK)

    @property
    def other_rack_bytes(self) -> int:
        return self._sum(Locality.OTHER_RACK)

    @property
    def unknown_rack_bytes(self) -> int:
        return self._sum(Locality.UNKNOWN)

    @property
    def avoided_bytes(self) -> int:
        return sum(n.avoided_bytes for n in self.by_node)

    @property
    def follower_partitions(self) -> int:
        return sum(n.follower_partitions for n in self.by_node)


NO_USAGE = RackUsage(None, (), ())


def account(racks: RackMap, served: Iterable[tuple[PartitionKey, int | None, int]]) -> RackUsage:
    """The :class:`RackUsage` of one exchange.

    *served* lists each partition of the response as ``((topic, partition),
    node, record_bytes)``: the node that served it (the listener's broker, or
    the preferred replica the proxy fetched it from) and the record bytes that
    came from upstream for it (zero for a partition with no data: it still
    counts as a follower partition when a non-leader served it).
    """
    nodes: dict[int | None, list[int]] = {}
    locality_of: dict[int | None, Locality] = {}
    topics: dict[TopicKey, list[int]] = {}
    for (topic, partition), node, nbytes in served:
        loc = locality_of.get(node)
        if loc is None:
            loc = locality_of[node] = racks.locality(node)
        leader = racks.leader_of(topic, partition)
        follower = node is not None and leader is not None and leader != node
        avoided = (
            nbytes
            if follower
            and loc is Locality.SAME_RACK
            and racks.locality(leader) is Locality.OTHER_RACK
            else 0
        )
        n = nodes.setdefault(node, [0, 0, 0])
        n[0] += nbytes
        n[1] += avoided
        n[2] += int(follower)
        if nbytes:
            t = topics.get(topic)
            if t is None:
                t = topics[topic] = [0, 0, 0, 0]
            t[(Locality.SAME_RACK, Locality.OTHER_RACK, Locality.UNKNOWN).index(loc)] += nbytes
            t[3] += avoided
    by_node = tuple(
        NodeBytes(node, locality_of[node], v[0], v[1], v[2]) for node, v in nodes.items()
    )
    rows = sorted(topics.items(), key=lambda kv: -sum(kv[1][:3]))
    by_topic = [TopicBytes(t, *v) for t, v in rows[:MAX_TOPICS_PER_USAGE]]
    if len(rows) > MAX_TOPICS_PER_USAGE:
        rest = [sum(v[i] for _, v in rows[MAX_TOPICS_PER_USAGE:]) for i in range(4)]
        by_topic.append(TopicBytes(None, *rest))
    return RackUsage(racks.rack, by_node, tuple(by_topic))


def cost(nbytes: int, price_per_gb: float) -> float:
    """The price of *nbytes* crossing zones at *price_per_gb* (per decimal GB)."""
    return nbytes * price_per_gb / BYTES_PER_GB
