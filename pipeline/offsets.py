"""Offset-range planning shared by the batch and streaming readers (no Spark, no Kafka I/O).

The option syntax is the one of Spark's built-in Kafka source:

* ``startingOffsets``: ``"earliest"``, ``"latest"`` or JSON ``{"topic": {"0": 23, "1": -2}}``
  where ``-2`` means earliest and ``-1`` latest;
* ``endingOffsets``: ``"latest"`` or JSON, where ``-1`` means latest (``-2`` is refused).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

EARLIEST = -2
LATEST = -1

TopicPartition = tuple[str, int]


class OffsetOptionError(ValueError):
    """An offsets option is malformed; the message names the option and what is allowed."""


@dataclass(frozen=True, slots=True)
class OffsetRange:
    topic: str
    partition: int
    start: int  # inclusive
    end: int  # exclusive

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def parse_offsets_option(
    name: str,
    value: str | None,
    default: str,
    partitions: list[TopicPartition],
    *,
    batch: bool,
) -> dict[TopicPartition, int]:
    """Resolve an option to a symbolic offset (EARLIEST / LATEST) or absolute offset per partition.

    As in Spark's source: a JSON value must name every partition being read; a batch
    query may not start at 'latest' (it would read nothing) and no query may end at
    'earliest'.
    """
    raw = (value if value is not None else default).strip()
    forbidden = EARLIEST if name == "endingOffsets" else (LATEST if batch else None)
    if raw in ("earliest", "latest"):
        sym = EARLIEST if raw == "earliest" else LATEST
        if sym == forbidden:
            raise OffsetOptionError(f"{name}: {raw!r} is not allowed here")
        return dict.fromkeys(partitions, sym)
    try:
        spec = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise OffsetOptionError(
            f"{name}: {raw!r} is neither 'earliest', 'latest' nor JSON like "
            '{"topic": {"0": 23}}'
        ) from exc
    if not isinstance(spec, Mapping):
        raise OffsetOptionError(f"{name}: JSON must be an object of topics")
    out: dict[TopicPartition, int] = {}
    known = set(partitions)
    for topic, per_partition in spec.items():
        if not isinstance(per_partition, Mapping):
            raise OffsetOptionError(f"{name}: {topic!r} must map partitions to offsets")
        for p, off in per_partition.items():
            try:
                tp = (str(topic), int(p))
                off = int(off)
            except (TypeError, ValueError) as exc:
                raise OffsetOptionError(f"{name}: bad partition/offset {p!r}: {off!r}") from exc
            if tp not in known:
                raise OffsetOptionError(f"{name}: {topic}-{p} is not a partition being read")
            if off < EARLIEST or off == forbidden:
                raise OffsetOptionError(
                    f"{name}: offset {off} for {topic}-{p} is not allowed here"
                    " (-2 = earliest, -1 = latest, or an offset >= 0)"
                )
            out[tp] = off
    missing = sorted(set(partitions) - set(out))
    if missing:
        named = ", ".join(f"{t}-{p}" for t, p in missing)
        raise OffsetOptionError(
            f"{name}: JSON must give an offset for every partition; missing {named}"
        )
    return out


def resolve(
    symbolic: Mapping[TopicPartition, int], watermarks: Mapping[TopicPartition, tuple[int, int]]
) -> dict[TopicPartition, int]:
    """Turn EARLIEST/LATEST into the low/high watermark, clamping absolute offsets into range."""
    out = {}
    for tp, off in symbolic.items():
        low, high = watermarks[tp]
        if off == EARLIEST:
            out[tp] = low
        elif off == LATEST:
            out[tp] = high
        else:
            out[tp] = min(max(off, low), high)
    return out


def plan_ranges(
    starts: Mapping[TopicPartition, int], ends: Mapping[TopicPartition, int]
) -> list[OffsetRange]:
    """One range per partition with records to read, in (topic, partition) order."""
    ranges = []
    for tp in sorted(starts):
        start, end = starts[tp], ends[tp]
        if end > start:
            ranges.append(OffsetRange(tp[0], tp[1], start, end))
    return ranges


def cap_offsets(
    starts: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int], max_offsets: int
) -> dict[TopicPartition, int]:
    """End offsets for one micro-batch reading at most *max_offsets* records in total.

    Like Spark's Kafka source, the budget is split across partitions in proportion to
    their backlog (at least one record for a partition with a backlog when the budget
    allows), so a large partition cannot starve the others.
    """
    if max_offsets <= 0:
        raise ValueError("max_offsets must be positive")
    backlog = {tp: max(0, latest[tp] - starts.get(tp, latest[tp])) for tp in latest}
    total = sum(backlog.values())
    if total <= max_offsets:
        return dict(latest)
    ends = {}
    remaining = max_offsets
    for tp in sorted(backlog):
        share = backlog[tp] * max_offsets // total
        if share == 0 and backlog[tp] > 0 and remaining > 0:
            share = 1
        share = min(share, remaining, backlog[tp])
        remaining -= share
        ends[tp] = starts.get(tp, latest[tp]) + share
    return ends
