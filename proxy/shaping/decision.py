"""The record of one shaped Fetch response, for logs and metrics.

Plain values only: counts, byte sizes, limit names.  It never holds record
data or topic names (log keys must stay small and payload-free); partitions
appear as counts, and the worst starvation as a number.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

from ..protocol.codec import drain
from .limits import Limits
from .trim import PartitionOutcome, TrimResult


@dataclass(frozen=True, slots=True)
class ShapingDecision:
    api_version: int
    requested_max_bytes: int
    """max_bytes the client asked for."""
    upstream_max_bytes: int
    """max_bytes sent upstream (after the caps and the memory budget)."""
    limits: Limits
    partitions: int
    """Partitions in the response."""
    partitions_with_data: int
    partitions_served: int
    partitions_trimmed: int
    """Partitions with whole batches held back by a limit."""
    partitions_starved: int
    """Partitions with data that got none in this response."""
    max_starvation: int
    """Most consecutive responses any partition with data has gone unserved (after this one)."""
    upstream_bytes: int
    upstream_records: int
    reused_bytes: int
    """Bytes served from the reuse buffer instead of upstream."""
    delivered_bytes: int
    delivered_records: int
    buffered_bytes: int
    """Trimmed-away bytes kept in the reuse buffer for the next fetch."""
    dropped_partial_bytes: int
    """Bytes of partial trailing batches upstream sent and we dropped."""
    unshaped_partitions: int = 0
    """Partitions passed through untouched (legacy message format)."""
    limited_by: frozenset[str] = field(default_factory=frozenset)
    """Limits that held whole batches back: response_bytes, response_records, partition_bytes, partition_records."""
    progress_exemption: bool = False
    """A single batch went out beyond a limit under the KIP-74 progress guarantee."""
    trimmed_records: int = 0
    """Records in whole batches held back by a limit (kept for reuse or dropped)."""
    trimmed_bytes: int = 0
    trimmed_by_limit: tuple[tuple[str, int, int], ...] = ()
    """(limit, records, bytes) held back, per limit that stopped a partition; a
    partition stopped by two limits at once counts under both."""

    @classmethod
    def from_trim(
        cls,
        result: TrimResult,
        *,
        api_version: int,
        requested_max_bytes: int,
        upstream_max_bytes: int,
        limits: Limits,
        buffered_bytes: int = 0,
        max_starvation: int = 0,
    ) -> ShapingDecision:
        steps = cls.from_trim_in_ranges(
            result,
            0,
            api_version=api_version,
            requested_max_bytes=requested_max_bytes,
            upstream_max_bytes=upstream_max_bytes,
            limits=limits,
            buffered_bytes=buffered_bytes,
            max_starvation=max_starvation,
        )
        return drain(steps)

    @classmethod
    def from_trim_in_ranges(
        cls,
        result: TrimResult,
        every: int,
        *,
        api_version: int,
        requested_max_bytes: int,
        upstream_max_bytes: int,
        limits: Limits,
        buffered_bytes: int = 0,
        max_starvation: int = 0,
        partitions: int | None = None,
    ) -> Generator[None, None, ShapingDecision]:
        """``from_trim``, yielding after every *every* outcomes (0: never).  *partitions*:
        how many the response lists, when *result* trimmed only some of them (the rest
        had nothing on offer); None: one per outcome."""
        # one pass over the outcomes (this runs for every shaped fetch)
        outs = result.outcomes.values()
        with_data: list[PartitionOutcome] = []
        served = trimmed = starved = unshaped = 0
        upstream_bytes = upstream_records = reused = dropped = 0
        delivered_bytes = delivered_records = 0
        trimmed_records = trimmed_bytes = 0
        exempt = False
        for walked, o in enumerate(outs, 1):
            if every and walked % every == 0:
                yield
            if not o.offered_bytes and not o.upstream_bytes and o.shaped:
                # nothing on offer or from upstream (most partitions of a sessionless
                # fetch): every count below is 0 for it
                continue
            delivered_bytes += o.delivered_bytes
            delivered_records += o.delivered_records
            upstream_bytes += o.upstream_bytes
            upstream_records += o.upstream_records
            reused += o.reused_bytes
            dropped += o.dropped_partial_bytes
            if o.delivered_batches:
                served += 1
            if not o.shaped:
                unshaped += 1
            if o.exempt:
                exempt = True
            if o.had_data:
                with_data.append(o)
                remainder = o.remainder
                if remainder.headers:
                    trimmed += 1
                if not o.delivered_batches:
                    starved += 1
                trimmed_records += remainder.records
                trimmed_bytes += remainder.size
        by_limit = (yield from _by_limit_in_ranges(with_data, every)) if trimmed else ()
        return cls(
            api_version=api_version,
            requested_max_bytes=requested_max_bytes,
            upstream_max_bytes=upstream_max_bytes,
            limits=limits,
            partitions=len(outs) if partitions is None else partitions,
            partitions_with_data=len(with_data),
            partitions_served=served,
            partitions_trimmed=trimmed,
            partitions_starved=starved,
            max_starvation=max_starvation,
            upstream_bytes=upstream_bytes,
            upstream_records=upstream_records,
            reused_bytes=reused,
            delivered_bytes=delivered_bytes,
            delivered_records=delivered_records,
            buffered_bytes=buffered_bytes,
            dropped_partial_bytes=dropped,
            unshaped_partitions=unshaped,
            limited_by=result.limited_by,
            progress_exemption=exempt,
            trimmed_records=trimmed_records,
            trimmed_bytes=trimmed_bytes,
            trimmed_by_limit=by_limit,
        )


def _by_limit_in_ranges(
    outcomes: list[PartitionOutcome], every: int
) -> Generator[None, None, tuple[tuple[str, int, int], ...]]:
    totals: dict[str, list[int]] = {}
    for walked, o in enumerate(outcomes, 1):
        if every and walked % every == 0:
            yield
        if not o.remainder.headers:
            continue
        for name in o.limited_by:
            entry = totals.setdefault(name, [0, 0])
            entry[0] += o.remainder.records
            entry[1] += o.remainder.size
    return tuple((name, r, b) for name, (r, b) in sorted(totals.items()))
