"""Configured fetch limits and how they fold into a client's Fetch request.

Byte limits count record bytes only (the ``records`` field of each partition),
as Kafka's broker does in ``ReplicaManager.readFromLog``: the response header,
topic names and partition metadata are not counted.

KIP-1199 (draft, KAFKA-19554) proposes a ``MaxRecords`` field in FetchRequest.
No Fetch version known to kio 0.6.5 (v4..v18) carries it (only ShareFetch
does), so :func:`client_max_records` finds nothing today and the record limits
come from configuration alone.  It reads the field by name, so once a Fetch
version carries it the smaller of the client's value and the configured cap
applies without further changes here.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ..protocol.codec import drain
from ..protocol.messages import replaced
from ..protocol.partition_key import PartitionKey, topic_key

INT32_MAX = 2**31 - 1

LIMIT_NAMES = (
    "max_response_bytes",
    "max_partition_bytes",
    "max_records",
    "max_partition_records",
)


class LimitKind(StrEnum):
    """What held whole batches back: a configured limit (the value is its config key) or the budget."""

    MAX_RESPONSE_BYTES = "max_response_bytes"
    MAX_PARTITION_BYTES = "max_partition_bytes"
    MAX_RECORDS = "max_records"
    MAX_PARTITION_RECORDS = "max_partition_records"
    MEMORY_BUDGET = "memory_budget"
    OTHER = "other"


# Limit names as trimming spells them (``PartitionOutcome.limited_by``) -> config keys.
_LIMIT_ALIASES: Mapping[str, str] = {
    "response_bytes": LimitKind.MAX_RESPONSE_BYTES.value,
    "partition_bytes": LimitKind.MAX_PARTITION_BYTES.value,
    "response_records": LimitKind.MAX_RECORDS.value,
    "partition_records": LimitKind.MAX_PARTITION_RECORDS.value,
    "memory_budget": LimitKind.MEMORY_BUDGET.value,
}


def limit_kind(name: str) -> str:
    """A limit's config-key name, whichever spelling it arrives in (unknown -> "other")."""
    name = _LIMIT_ALIASES.get(name, name)
    try:
        return LimitKind(name).value
    except ValueError:
        return LimitKind.OTHER.value


class InvalidLimits(ValueError):
    """A configured limit is not a positive 32-bit integer (or None)."""


def _min(*values: int | None) -> int | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


@dataclass(frozen=True, slots=True)
class Limits:
    """Configured caps; None means unlimited.

    - ``max_response_bytes``: record bytes per response, across partitions.
    - ``max_partition_bytes``: record bytes per partition per response.
    - ``max_records``: records per response (control batches count zero).
    - ``max_partition_records``: records per partition per response.
    """

    max_response_bytes: int | None = None
    max_partition_bytes: int | None = None
    max_records: int | None = None
    max_partition_records: int | None = None

    def __post_init__(self) -> None:
        for name in LIMIT_NAMES:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidLimits(f"{name} must be an integer or None, not {value!r}")
            if not 1 <= value <= INT32_MAX:
                raise InvalidLimits(f"{name} must be between 1 and {INT32_MAX}, not {value}")

    @property
    def unlimited(self) -> bool:
        return all(getattr(self, name) is None for name in LIMIT_NAMES)

    def as_dict(self) -> dict[str, int | None]:
        return {name: getattr(self, name) for name in LIMIT_NAMES}


def client_max_records(request: Any) -> int | None:
    """The client's own record cap (KIP-1199 ``MaxRecords``), or None.

    None for every Fetch version in kio 0.6.5: see the module docstring.
    Non-positive values are treated as absent.
    """
    value = getattr(request, "max_records", None)
    if isinstance(value, int) and value > 0:
        return value
    return None


def _iter_partitions(request: Any) -> Iterator[tuple[PartitionKey, Any]]:
    for topic in request.topics:
        key = topic_key(topic)
        for partition in topic.partitions:
            yield (key, int(partition.partition)), partition


def clamp_request(request: Any, limits: Limits, *, max_bytes_cap: int | None = None) -> Any:
    """The request to send upstream: max_bytes and every partition_max_bytes clamped.

    The response limit becomes min(client max_bytes, ``max_response_bytes``,
    *max_bytes_cap*) (the cap the memory budget granted, if any); each
    partition's max_bytes becomes min(its own, ``max_partition_bytes``).  The
    broker then stops reading early.  Record limits have no request field to
    travel in (see the module docstring) and are enforced on the response only.
    Returns *request* itself when nothing changes.
    """
    return drain(clamp_request_in_ranges(request, limits, 0, max_bytes_cap=max_bytes_cap))


def upstream_max_bytes(request: Any, limits: Limits, max_bytes_cap: int | None) -> int:
    """The max_bytes ``clamp_request`` gives *request*."""
    if max_bytes_cap is not None and max_bytes_cap < 0:
        raise ValueError("max_bytes_cap must be >= 0")
    out = _min(int(request.max_bytes), limits.max_response_bytes, max_bytes_cap)
    assert out is not None
    return out


def clamp_request_in_ranges(
    request: Any,
    limits: Limits,
    every: int,
    *,
    max_bytes_cap: int | None = None,
    partition_cap: bool = True,
    partition_floor: int | None = None,
) -> Generator[None, None, Any]:
    """``clamp_request``, yielding after every *every* partitions it walks (0: never);
    it reads only the request and *limits*.  *partition_cap* False: ``max_partition_bytes``
    is left to trimming (the shaper running ahead) and the partitions are not walked,
    unless *partition_floor* raises every partition max_bytes above 0 to at least it."""
    new_max = upstream_max_bytes(request, limits, max_bytes_cap)
    cap = limits.max_partition_bytes if partition_cap else None
    floor = None if partition_cap else partition_floor
    topics = request.topics
    if cap is not None or floor is not None:
        new_topics = []
        changed = False
        walked = 0
        for topic in topics:
            parts = []
            topic_changed = False
            for p in topic.partitions:
                if cap is not None and p.partition_max_bytes > cap:
                    p = replaced(p, partition_max_bytes=type(p.partition_max_bytes)(cap))
                    topic_changed = True
                elif floor is not None and 0 < p.partition_max_bytes < floor:
                    p = replaced(p, partition_max_bytes=type(p.partition_max_bytes)(floor))
                    topic_changed = True
                parts.append(p)
                walked += 1
                if every and walked % every == 0:
                    yield
            if topic_changed:
                changed = True
                new_topics.append(replaced(topic, partitions=tuple(parts)))
            else:
                new_topics.append(topic)
        if changed:
            topics = tuple(new_topics)
    if new_max == request.max_bytes and topics is request.topics:
        return request
    return replaced(request, max_bytes=type(request.max_bytes)(new_max), topics=topics)


@dataclass(frozen=True, slots=True)
class ResponseLimits:
    """The limits one response is trimmed to, after folding in the client's request.

    ``partition_bytes_for`` maps partitions to the client's own partition
    max_bytes (clamped by the configured cap); partitions absent from the map
    (e.g. partitions cached in an incremental fetch session and not repeated
    in the request) get ``partition_bytes``.
    """

    response_bytes: int | None = None
    response_records: int | None = None
    partition_bytes: int | None = None
    partition_records: int | None = None
    partition_bytes_for: Mapping[PartitionKey, int] = field(default_factory=dict)

    def bytes_for(self, key: PartitionKey) -> int | None:
        return _min(self.partition_bytes_for.get(key), self.partition_bytes)


def response_limits(
    limits: Limits,
    request: Any,
    *,
    session_partition_max_bytes: Mapping[PartitionKey, int] | None = None,
) -> ResponseLimits:
    """Effective limits for the response to *request* (the client's, unclamped, request).

    Response bytes: min(client max_bytes, ``max_response_bytes``).  Per
    partition: min(client partition_max_bytes, ``max_partition_bytes``).
    Records: min(client MaxRecords if its version has one, ``max_records``).
    *session_partition_max_bytes* supplies the client's partition max_bytes for
    partitions that an incremental session carries without repeating them.
    """
    per_partition: dict[PartitionKey, int] = dict(session_partition_max_bytes or {})
    for key, partition in _iter_partitions(request):
        per_partition[key] = int(partition.partition_max_bytes)
    return response_limits_of(limits, request, per_partition)


def response_limits_of(
    limits: Limits, request: Any, partition_bytes_for: Mapping[PartitionKey, int]
) -> ResponseLimits:
    """``response_limits`` given the client's partition max_bytes already read off
    *request* (and its session's), per partition: *partition_bytes_for* (the shaper reads
    them in its own walk of the request, ``FetchShaper.prepare_in_ranges``)."""
    return ResponseLimits(
        response_bytes=_min(int(request.max_bytes), limits.max_response_bytes),
        response_records=_min(client_max_records(request), limits.max_records),
        partition_bytes=limits.max_partition_bytes,
        partition_records=limits.max_partition_records,
        partition_bytes_for=partition_bytes_for,
    )
