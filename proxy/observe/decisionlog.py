"""Decision logs: one JSON line per Fetch response the proxy shaped, sampled.

Each event says what the proxy did to one response: who asked (client id,
policy), which broker answered (node id), how many partitions were requested,
served and starved, record bytes and records upstream versus delivered, which
limits held data back, which partitions are going unserved, and what the
upstream fetch session saved.  Events carry counts, sizes and partition
identities, never record data or client addresses.

Partitions are named by topic name even when the client fetches by topic id
(Fetch v13+): the proxy's topic name <-> id map, learnt from the Metadata
responses it relays (``proxy.sessions.topic_ids``), is passed in as
``topic_ids``; each starved partition carries the name (``topic``, the id when
the name is not known) and the id (``topic_id``, null when not known).

Rack-aware fetching (schema version 2): the proxy's ``rack``, the upstream
record bytes split by where the broker that served them is (``same_rack``,
``other_rack``, ``unknown``; :func:`proxy.relay.racks.account`), the cross-zone
bytes avoided (in-rack bytes from a replica that is not the partition's
leader, the leader being in another rack), the same by topic
(``rack_by_topic``, at most ``MAX_TOPICS_PER_USAGE`` topics and one row for the
rest), the ``cross_zone_price_per_gb`` in force, and how many partitions the
leader redirected to a preferred read replica.  Version 1 events (without
them) stay readable: the fleet report reads both.

The format is specified field by field in ``schemas/decision-log.schema.json``
(JSON Schema 2020-12); the fleet report (PySpark) reads these files, so every
change to :class:`DecisionEvent` must change the schema and its
``schema_version`` with it (a test checks that they agree).

Sampling: a :class:`Sampler` decides per response whether to write an event.
:class:`RandomSampler` (the default) samples independently at a rate;
:class:`FractionSampler` is deterministic (exactly ``floor(n * rate)`` of the
first ``n``).  Each event records its ``sample_rate`` so readers can scale counts
back up (weight = 1 / sample_rate).

The sink is a text stream: a file opened for append, or stdout.  Nothing is
written on the event loop: ``log`` builds the event's line and queues it for a
writer thread (``proxy.observe.linewriter``), in a queue bounded by
``decision_log_queue_bytes``.  When the queue is full (the disk is slower than
the decisions) the event is dropped at once, never waited for, and counted in
``kafka_fetch_proxy_decision_log_events_total{outcome="queue_full"}``; a failing
sink drops events (``outcome="dropped"``); ``written`` counts lines the sink
took.  Neither ever fails or delays the fetch.  ``close()`` (at shutdown, after
the last connection) writes everything queued, flushes and closes the file,
waiting at most :data:`CLOSE_TIMEOUT_SECONDS` for a stuck disk.
"""

from __future__ import annotations

import json
import random
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import IO, Any, Protocol

import structlog

from ..protocol.partition_key import PartitionKey
from ..relay.racks import RackUsage
from ..shaping.limits import LIMIT_NAMES, limit_kind
from .labels import DecisionOutcome
from .linewriter import LineWriter
from .metrics import Metrics

SCHEMA_VERSION = 2
EVENT_TYPE = "fetch_shaped"
MAX_CLIENT_ID_CHARS = 255
MAX_POLICY_CHARS = 64
MAX_INSTANCE_CHARS = 253  # a Kubernetes pod name
MAX_TOPIC_CHARS = 255
MAX_STARVED_PARTITIONS = 100
DEFAULT_QUEUE_BYTES = 4 * 1024 * 1024
"""Bytes of event lines waiting for the writer thread (the ``decision_log_queue_bytes`` default)."""
CLOSE_TIMEOUT_SECONDS = 10.0
"""How long ``close()`` waits for the writer to write what is queued."""

_log = structlog.get_logger("proxy.observe.decisionlog")


@dataclass(frozen=True, slots=True)
class StarvedPartition:
    """A partition going unserved: its topic's name (else its id), the id if known."""

    topic: str | None
    partition: int
    rounds: int
    topic_id: str | None = None


@dataclass(frozen=True, slots=True)
class TopicRack:
    """One topic's upstream record bytes by where the serving broker is (rack-aware fetching)."""

    topic: str | None
    """The topic's name (else its id); None: the topics past the per-event cap, together."""
    topic_id: str | None
    same_rack_record_bytes: int
    other_rack_record_bytes: int
    unknown_rack_record_bytes: int
    cross_zone_avoided_record_bytes: int


class TopicNames(Protocol):
    """The topic name <-> id map (``proxy.sessions.topic_ids.TopicIdMap``), read structurally."""

    def name_for(self, topic_id: uuid.UUID) -> str | None: ...
    def id_for(self, name: str) -> uuid.UUID | None: ...


@dataclass(frozen=True, slots=True)
class DecisionEvent:
    """One shaped Fetch response.  Field meanings: schemas/decision-log.schema.json."""

    timestamp_ms: int
    instance: str | None
    client_id: str | None
    node_id: int
    policy: str
    api_version: int
    correlation_id: int
    latency_ms: float
    requested_max_bytes: int
    upstream_max_bytes: int
    partitions_requested: int
    partitions_with_data: int
    partitions_served: int
    partitions_trimmed: int
    partitions_starved: int
    starved_partitions: tuple[StarvedPartition, ...]
    max_starvation_rounds: int
    upstream_record_bytes: int
    upstream_records: int
    reused_record_bytes: int
    delivered_record_bytes: int
    delivered_records: int
    buffered_record_bytes: int
    dropped_partial_bytes: int
    upstream_fetch_bytes: int
    sessionless_fetch_bytes: int
    limits_applied: tuple[str, ...]
    progress_exemption: bool
    limits: Mapping[str, int | None]
    sample_rate: float
    rack: str | None = None
    same_rack_record_bytes: int = 0
    other_rack_record_bytes: int = 0
    unknown_rack_record_bytes: int = 0
    cross_zone_avoided_record_bytes: int = 0
    cross_zone_price_per_gb: float | None = None
    preferred_replica_redirects: int = 0
    rack_by_topic: tuple[TopicRack, ...] = ()

    def to_json_obj(self) -> dict[str, object]:
        obj: dict[str, object] = {"schema_version": SCHEMA_VERSION, "event": EVENT_TYPE}
        obj.update(asdict(self))
        obj["starved_partitions"] = [
            {"topic": s.topic, "topic_id": s.topic_id, "partition": s.partition, "rounds": s.rounds}
            for s in self.starved_partitions
        ]
        obj["limits_applied"] = list(self.limits_applied)
        obj["limits"] = dict(self.limits)
        obj["rack_by_topic"] = [asdict(t) for t in self.rack_by_topic]
        return obj

    def to_json_line(self) -> str:
        return json.dumps(self.to_json_obj(), separators=(",", ":"), ensure_ascii=True) + "\n"


class ShapingRecord(Protocol):
    """What the shaping layer reports about one response (proxy.shaping.decision.ShapingDecision).

    Read structurally, so this module does not depend on the shaping package.
    """

    @property
    def api_version(self) -> int: ...
    @property
    def requested_max_bytes(self) -> int: ...
    @property
    def upstream_max_bytes(self) -> int: ...
    @property
    def partitions(self) -> int: ...
    @property
    def partitions_with_data(self) -> int: ...
    @property
    def partitions_served(self) -> int: ...
    @property
    def partitions_trimmed(self) -> int: ...
    @property
    def partitions_starved(self) -> int: ...
    @property
    def max_starvation(self) -> int: ...
    @property
    def upstream_bytes(self) -> int: ...
    @property
    def upstream_records(self) -> int: ...
    @property
    def reused_bytes(self) -> int: ...
    @property
    def delivered_bytes(self) -> int: ...
    @property
    def delivered_records(self) -> int: ...
    @property
    def buffered_bytes(self) -> int: ...
    @property
    def dropped_partial_bytes(self) -> int: ...
    @property
    def limited_by(self) -> Iterable[str]: ...
    @property
    def progress_exemption(self) -> bool: ...
    @property
    def limits(self) -> _HasLimits: ...


class _HasLimits(Protocol):
    def as_dict(self) -> Mapping[str, int | None]: ...


def _clip(value: str | None, limit: int) -> str | None:
    return None if value is None else value[:limit]


def _topic(key: Any, topic_ids: TopicNames | None) -> tuple[str | None, str | None]:
    """(name, else id; id) of a partition key's topic: a name (Fetch < 13) or a topic id."""
    if isinstance(key, uuid.UUID):
        name = topic_ids.name_for(key) if topic_ids is not None else None
        return (name or str(key))[:MAX_TOPIC_CHARS], str(key)
    if key is None:
        return None, None
    name = str(key)
    topic_id = topic_ids.id_for(name) if topic_ids is not None else None
    return name[:MAX_TOPIC_CHARS], None if topic_id is None else str(topic_id)


def _starved(
    starved: Mapping[PartitionKey, int] | None,
    topic_ids: TopicNames | None = None,
) -> tuple[StarvedPartition, ...]:
    """Most-starved first, capped; topics by name when known (see the module docstring)."""
    if not starved:
        return ()
    rows = []
    for (topic, partition), rounds in starved.items():
        if rounds > 0:
            name, topic_id = _topic(topic, topic_ids)
            rows.append(StarvedPartition(name, int(partition), int(rounds), topic_id))
    rows.sort(key=lambda r: (-r.rounds, r.topic or "", r.partition))
    return tuple(rows[:MAX_STARVED_PARTITIONS])


def event_from_shaping(
    decision: ShapingRecord,
    *,
    timestamp_ms: int,
    client_id: str | None,
    node_id: int,
    policy: str,
    correlation_id: int,
    latency_ms: float,
    sample_rate: float,
    instance: str | None = None,
    starved_partitions: Mapping[PartitionKey, int] | None = None,
    upstream_fetch_bytes: int = 0,
    sessionless_fetch_bytes: int | None = None,
    topic_ids: TopicNames | None = None,
    rack_usage: RackUsage | None = None,
    cross_zone_price_per_gb: float | None = None,
    preferred_replica_redirects: int = 0,
) -> DecisionEvent:
    """Convert the shaping layer's record plus the relay's context into a log event.

    ``starved_partitions`` maps (topic name or id, partition) to the consecutive
    responses it went unserved (the shaping layer's ``ServeRotation.starved()``);
    ``topic_ids`` names the topics a Fetch v13+ client addresses by id.
    ``upstream_fetch_bytes`` is the size of the upstream Fetch request plus
    response frames; ``sessionless_fetch_bytes`` what a full fetch would have
    cost (the session layer's estimate; defaults to ``upstream_fetch_bytes``,
    i.e. nothing saved, when no upstream session was used).
    ``rack_usage`` splits the upstream record bytes by the serving broker's
    rack (:func:`proxy.relay.racks.account`; None: all ``unknown``).
    """
    configured = decision.limits.as_dict()
    return DecisionEvent(
        timestamp_ms=timestamp_ms,
        instance=_clip(instance, MAX_INSTANCE_CHARS),
        client_id=_clip(client_id, MAX_CLIENT_ID_CHARS),
        node_id=node_id,
        policy=policy[:MAX_POLICY_CHARS],
        api_version=decision.api_version,
        correlation_id=correlation_id,
        latency_ms=round(max(latency_ms, 0.0), 3),
        requested_max_bytes=decision.requested_max_bytes,
        upstream_max_bytes=decision.upstream_max_bytes,
        partitions_requested=decision.partitions,
        partitions_with_data=decision.partitions_with_data,
        partitions_served=decision.partitions_served,
        partitions_trimmed=decision.partitions_trimmed,
        partitions_starved=decision.partitions_starved,
        starved_partitions=_starved(starved_partitions, topic_ids),
        max_starvation_rounds=decision.max_starvation,
        upstream_record_bytes=decision.upstream_bytes,
        upstream_records=decision.upstream_records,
        reused_record_bytes=decision.reused_bytes,
        delivered_record_bytes=decision.delivered_bytes,
        delivered_records=decision.delivered_records,
        buffered_record_bytes=decision.buffered_bytes,
        dropped_partial_bytes=decision.dropped_partial_bytes,
        upstream_fetch_bytes=upstream_fetch_bytes,
        sessionless_fetch_bytes=(
            upstream_fetch_bytes if sessionless_fetch_bytes is None else sessionless_fetch_bytes
        ),
        limits_applied=tuple(sorted({limit_kind(n) for n in decision.limited_by})),
        progress_exemption=decision.progress_exemption,
        limits={name: configured.get(name) for name in LIMIT_NAMES},
        sample_rate=sample_rate,
        **_rack_fields(decision.upstream_bytes, rack_usage, topic_ids),
        cross_zone_price_per_gb=cross_zone_price_per_gb,
        preferred_replica_redirects=max(0, int(preferred_replica_redirects)),
    )


def _rack_fields(
    upstream_bytes: int, usage: RackUsage | None, topic_ids: TopicNames | None
) -> dict[str, Any]:
    if usage is None:
        return {"unknown_rack_record_bytes": upstream_bytes}
    rows = []
    for t in usage.by_topic:
        name, topic_id = _topic(t.topic, topic_ids)
        rows.append(
            TopicRack(
                name,
                topic_id,
                t.same_rack_bytes,
                t.other_rack_bytes,
                t.unknown_rack_bytes,
                t.avoided_bytes,
            )
        )
    return {
        "rack": _clip(usage.rack, MAX_TOPIC_CHARS),
        "same_rack_record_bytes": usage.same_rack_bytes,
        "other_rack_record_bytes": usage.other_rack_bytes,
        "unknown_rack_record_bytes": usage.unknown_rack_bytes,
        "cross_zone_avoided_record_bytes": usage.avoided_bytes,
        "rack_by_topic": tuple(rows),
    }


class Sampler(Protocol):
    rate: float

    def sample(self) -> bool: ...


def _check_rate(rate: float) -> float:
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"sample rate must be between 0 and 1, not {rate}")
    return float(rate)


class RandomSampler:
    """Each response is logged with probability ``rate``, independently."""

    def __init__(self, rate: float, rng: Callable[[], float] | None = None) -> None:
        self.rate = _check_rate(rate)
        self._rng = rng if rng is not None else random.Random().random

    def sample(self) -> bool:
        if self.rate >= 1.0:
            return True
        return self.rate > 0.0 and self._rng() < self.rate


class FractionSampler:
    """Deterministic: of the first n responses, exactly floor(n * rate) are logged, evenly spread."""

    def __init__(self, rate: float) -> None:
        self.rate = _check_rate(rate)
        self._seen = 0
        self._taken = 0

    def sample(self) -> bool:
        self._seen += 1
        if self._taken < int(self._seen * self.rate + 1e-9):
            self._taken += 1
            return True
        return False


class DecisionLog:
    """Queues sampled :class:`DecisionEvent` lines for a writer thread (see the module docstring)."""

    def __init__(
        self,
        sink: IO[str],
        *,
        sampler: Sampler,
        metrics: Metrics | None = None,
        instance: str | None = None,
        clock: Callable[[], float] = time.time,
        close_sink: bool = False,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
    ) -> None:
        self.sink = sink
        self.sampler = sampler
        self.metrics = metrics
        self.instance = instance
        self.clock = clock
        self._writer = LineWriter(
            sink,
            max_queued_bytes=queue_bytes,
            on_written=self._written,
            on_failed=self._failed,
            close_sink=close_sink,
            name="decision-log-writer",
        )
        self._failing = False
        """The sink's latest write failed (one warning per failing stretch); the writer's."""
        self._full = False
        """The latest event found the queue full (one warning per stretch); the loop's."""
        self.queued = 0
        """Events queued for the writer (the loop's count)."""
        self.queue_full = 0
        """Events dropped because the queue was full (the loop's count)."""
        self.written = 0
        """Events the sink took (the writer thread's count)."""
        self.failed = 0
        """Events lost to a failing sink (the writer thread's count)."""

    @classmethod
    def open(
        cls,
        target: str,
        *,
        sample_rate: float,
        metrics: Metrics | None = None,
        instance: str | None = None,
        queue_bytes: int = DEFAULT_QUEUE_BYTES,
    ) -> DecisionLog:
        """``target`` is a file path (appended to) or ``-`` for stdout."""
        sampler = RandomSampler(sample_rate)
        if target in ("-", "stdout"):
            return cls(
                sys.stdout,
                sampler=sampler,
                metrics=metrics,
                instance=instance,
                queue_bytes=queue_bytes,
            )
        sink = open(target, "a", encoding="utf-8")  # the writer flushes after each batch
        return cls(
            sink,
            sampler=sampler,
            metrics=metrics,
            instance=instance,
            close_sink=True,
            queue_bytes=queue_bytes,
        )

    def _count(self, outcome: DecisionOutcome, n: int = 1) -> None:
        if self.metrics is not None:
            self.metrics.decision_logged(outcome, n)

    def log(
        self,
        decision: ShapingRecord,
        *,
        client_id: str | None,
        node_id: int,
        policy: str,
        correlation_id: int,
        latency_ms: float,
        starved_partitions: Mapping[PartitionKey, int] | None = None,
        upstream_fetch_bytes: int = 0,
        sessionless_fetch_bytes: int | None = None,
        topic_ids: TopicNames | None = None,
        rack_usage: RackUsage | None = None,
        cross_zone_price_per_gb: float | None = None,
        preferred_replica_redirects: int = 0,
    ) -> DecisionEvent | None:
        """Sample, then queue one event; returns the event queued (None if not).

        Arguments as :func:`event_from_shaping`; nothing is built when sampled out.
        """
        if not self.sampler.sample():
            self._count(DecisionOutcome.SAMPLED_OUT)
            return None
        event = event_from_shaping(
            decision,
            timestamp_ms=int(self.clock() * 1000),
            client_id=client_id,
            node_id=node_id,
            policy=policy,
            correlation_id=correlation_id,
            latency_ms=latency_ms,
            sample_rate=self.sampler.rate,
            instance=self.instance,
            starved_partitions=starved_partitions,
            upstream_fetch_bytes=upstream_fetch_bytes,
            sessionless_fetch_bytes=sessionless_fetch_bytes,
            topic_ids=topic_ids,
            rack_usage=rack_usage,
            cross_zone_price_per_gb=cross_zone_price_per_gb,
            preferred_replica_redirects=preferred_replica_redirects,
        )
        return event if self.write(event) else None

    def write(self, event: DecisionEvent) -> bool:
        """Queue an already-built event (no sampling); False if it was dropped (queue full).

        Never blocks: the writer thread writes it (``written``) or finds the sink
        failing (``dropped``); ``flush()`` waits for that.
        """
        if self._writer.put(event.to_json_line()):
            self._full = False
            self.queued += 1
            return True
        self.queue_full += 1
        self._count(DecisionOutcome.QUEUE_FULL)
        if not self._full:
            self._full = True
            _log.warning(
                "decision_log_queue_full",
                limit_bytes=self._writer.max_queued_bytes,
                hint="the decision log's sink is slower than the decisions: events are dropped"
                ' (kafka_fetch_proxy_decision_log_events_total{outcome="queue_full"}) until'
                " it catches up; lower decision_log_sample_rate or raise"
                " decision_log_queue_bytes",
            )
        return False

    @property
    def queue_bytes(self) -> int:
        """The queue's bound (``decision_log_queue_bytes``)."""
        return self._writer.max_queued_bytes

    def flush(self, timeout: float | None = None) -> bool:
        """Wait (blocking: not on the event loop) until every queued event is written."""
        return self._writer.flush(timeout)

    def close(self) -> None:
        """Write what is queued (at most ``CLOSE_TIMEOUT_SECONDS``), flush and close the sink.

        Logs ``decision_log_closed`` with the counts of the whole run: ``count``
        events queued, ``written`` of them taken by the sink, ``dropped`` lost (the
        queue full, the sink failing, or still queued when the timeout ran out).
        """
        left = self._writer.close(CLOSE_TIMEOUT_SECONDS)
        if left:
            _log.warning(
                "decision_log_close_timeout",
                count=left,
                timeout_seconds=CLOSE_TIMEOUT_SECONDS,
                hint="the decision log's sink did not take the queued events in time",
            )
        _log.info(
            "decision_log_closed",
            count=self.queued,
            written=self.written,
            dropped=self.queue_full + self.failed + left,
        )

    # --- the writer thread's reports ---------------------------------------------------------

    def _written(self, n: int) -> None:
        self._failing = False
        self.written += n
        self._count(DecisionOutcome.WRITTEN, n)

    def _failed(self, n: int, error: BaseException) -> None:
        self.failed += n
        self._count(DecisionOutcome.DROPPED, n)
        if not self._failing:
            _log.warning("decision_log_write_failed", error=repr(error))
            self._failing = True
