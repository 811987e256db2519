"""What the Fetch path did, as values: the edge turns them into metrics and decision-log events.

The sans-I/O core (:mod:`proxy.fetchpath`) neither counts nor logs.  Each handler
appends what happened to its :class:`Effects` (a fetch that waited for budget or
for ``max_partitions_in_flight``, bytes a session saved, an upstream session
reset, partitions that went back to their leader, one shaped response's
report); the trio edge (``proxy.server.connection``) drains them after every
input it feeds the handler and hands them to one function,
:func:`proxy.observe.apply.apply_effects`, which alone calls ``Metrics`` and the
``DecisionLog``.  Gauges (budget used, partitions in flight, the cross-zone
price) are not effects: the metrics read them from the fetch path at scrape
time (``proxy.observe.apply.watch_fetch_path``).

Every value is frozen and holds no I/O.  A :class:`ShapedReport` carries what
the decision log and the shaping metrics need, computed when the response was
made (the latency, the starved partitions of that moment); its one live
reference is the process's topic-id map, read only to name topics when the
event is built, right after the input that made it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .protocol.partition_key import PartitionKey
from .relay.racks import FallbackReason, RackUsage
from .sessions.resets import ResetReason, Side
from .sessions.topic_ids import TopicIdMap
from .shaping.decision import ShapingDecision

MAX_EFFECTS = 4096
"""The most effects a handler keeps undrained.  The edge drains after every input, and one
input makes a few effects per fetch it serves (a fetch makes at most a dozen: its report, its
saving, its resets, one fallback per reason), for at most ``max_in_flight`` fetches; past
this bound a drain was skipped, and further effects are counted in ``Effects.dropped``
instead of kept, so nothing grows from input."""


@dataclass(frozen=True, slots=True)
class BudgetWait:
    """A Fetch response waited for memory budget (counted once per response, not per retry)."""


@dataclass(frozen=True, slots=True)
class InFlightWait:
    """A fetch waited for ``max_partitions_in_flight`` before its decode (counted once)."""


@dataclass(frozen=True, slots=True)
class FetchRepeated:
    """A sessionless fetch, the same as the last one, got the last answer again from an idle
    upstream session, with no stage walking its partitions (``FetchPathHandler._repeat_of``)."""


@dataclass(frozen=True, slots=True)
class RanAhead:
    """A round the proxy ran ahead of its client (``run_ahead``): what upstream sent for it,
    and what the reuse buffer kept for the client's next fetch."""

    node: int | None
    records: int
    record_bytes: int
    held_bytes: int


@dataclass(frozen=True, slots=True)
class SessionSaved:
    """What a sessionless client's full fetch would have cost upstream, minus what it did."""

    request_bytes: int
    response_bytes: int


@dataclass(frozen=True, slots=True)
class SessionReset:
    """A fetch session ended and a full fetch followed."""

    side: Side
    reason: ResetReason


@dataclass(frozen=True, slots=True)
class ReplicaFallback:
    """*count* partition fetches went back to the leader instead of a preferred read replica."""

    reason: FallbackReason
    count: int = 1


@dataclass(frozen=True, slots=True)
class UpstreamData:
    """Record batches one broker returned for a shaped response (headers, never payloads)."""

    node: int | None
    records: int
    record_bytes: int


@dataclass(frozen=True, slots=True)
class ShapedReport:
    """One shaped response: what the shaping metrics and the decision log record of it."""

    decision: ShapingDecision
    client_id: str | None
    node_id: int | None
    """The listener's broker (None: the bootstrap listener)."""
    policy: str
    correlation_id: int
    latency_ms: float
    upstream: tuple[UpstreamData, ...]
    """Where the records came from, per broker (the leader, or preferred replicas)."""
    rack_usage: RackUsage
    redirected_to: tuple[int, ...]
    """The preferred read replica named for each partition redirected (KIP-392)."""
    reuse_hits: tuple[int, ...]
    """Bytes of each run of held batches served from the reuse buffer."""
    starvation_rounds: tuple[int, ...]
    """Fetch rounds since each partition with data was last served (0s left out)."""
    starved_partitions: Mapping[PartitionKey, int] | None
    """Every starved partition and its count, when the fetch path's ``starved_detail``
    says a decision log wants them (None: none starved, or not asked)."""
    upstream_fetch_bytes: int
    sessionless_fetch_bytes: int | None
    topic_ids: TopicIdMap
    cross_zone_price_per_gb: float


Effect = (
    BudgetWait
    | InFlightWait
    | FetchRepeated
    | RanAhead
    | SessionSaved
    | SessionReset
    | ReplicaFallback
    | ShapedReport
)


class Effects:
    """A handler's effects not yet drained by the edge, at most ``limit`` of them.

    The edge calls :meth:`take` after every input it feeds the handler, so the list
    holds what one input made; should a drain be skipped, what exceeds ``limit`` is
    counted in ``dropped`` (the edge logs the count) rather than kept.
    """

    __slots__ = ("_items", "dropped", "limit")

    def __init__(self, limit: int = MAX_EFFECTS) -> None:
        self._items: list[Effect] = []
        self.limit = limit
        self.dropped = 0
        """Effects not kept because ``limit`` were waiting (taken back to 0 by ``take``)."""

    def __len__(self) -> int:
        return len(self._items)

    def add(self, effect: Effect) -> None:
        if len(self._items) < self.limit:
            self._items.append(effect)
        else:
            self.dropped += 1

    def take(self) -> tuple[list[Effect], int]:
        """Everything added since the last call, oldest first, and how many were dropped."""
        items, self._items = self._items, []
        dropped, self.dropped = self.dropped, 0
        return items, dropped
