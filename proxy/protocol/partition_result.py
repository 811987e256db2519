"""What a Fetch response says of one partition, besides its records' bytes.

The error, the watermarks (high watermark, last stable offset, log start offset),
how many record bytes came, a preferred read replica (KIP-392) and a diverging
epoch (KIP-320).  Both fetch sessions read these and nothing else of an answer's
partition: the broker-side cache toward clients decides from them which partitions
an incremental answer must carry (``sessions.as_broker_cache``, Kafka's
``CachedPartition.maybeUpdateResponseData``; the dev broker builds them from its own
reads), and the proxy's session with its broker remembers the watermarks to complete
full answers (``sessions.as_client``, ``sessions.partition_cache``).  One type and
one reader of a kio ``PartitionData`` (:func:`result_of`) serve both.

Absent values are -1, as on the wire.  A ``NamedTuple``: built per partition of an
answer (positionally, about a third of a slotted frozen dataclass's cost).

:func:`empty_entry` goes the other way for the commonest entry of an answer the proxy
builds itself: a partition without records and without error.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, NamedTuple

from kio.schema.errors import ErrorCode

from .messages import make


class PartitionResult(NamedTuple):
    """One partition of a Fetch response (see the module docstring)."""

    error_code: int
    high_watermark: int
    log_start_offset: int
    records_size: int
    """Bytes of records (0: none, or null)."""
    last_stable_offset: int = -1
    preferred_read_replica: int = -1
    diverging_epoch: int = -1
    """Epoch of the response's DivergingEpoch; -1 (or less) when there is none."""


def result_of(data: Any) -> PartitionResult:
    """The result of a kio ``FetchResponse`` ``PartitionData`` of any version (v4+)."""
    records = data.records
    diverging = getattr(data, "diverging_epoch", None)
    return PartitionResult(
        int(data.error_code),
        int(data.high_watermark),
        int(getattr(data, "log_start_offset", -1)),
        0 if records is None else len(records),
        int(getattr(data, "last_stable_offset", -1)),
        int(getattr(data, "preferred_read_replica", -1)),
        -1 if diverging is None else int(diverging.epoch),
    )


EMPTY_ENTRIES_MAX = 16_384
"""Entries :func:`empty_entry` keeps (about 370 bytes each with their key, by tracemalloc:
at most about 6 MiB); at this many it starts over, and a miss costs what building one did."""

_EMPTY_ENTRIES: dict[tuple[ModuleType, int, int, int, int, bool], Any] = {}


def empty_entry(
    mod: ModuleType,
    partition: int,
    high_watermark: int,
    last_stable_offset: int,
    log_start_offset: int,
    *,
    read_committed: bool,
) -> Any:
    """The ``PartitionData`` of *mod* (a kio Fetch response module) for a partition answered
    without records and without error, with these watermarks (no aborted transactions:
    an empty list under read_committed; no preferred read replica).

    One object per value: kio's entities are frozen, so the stages that build such
    entries (held answers in ``shaping.shaper``, a sessionless client's partitions from
    the upstream session's cache in ``sessions.as_client``) give the same object for the
    same partition state, and its encoding is reused from one response to the next
    whichever stage made it (``writers.Written`` keys by the object).
    """
    key = (mod, partition, high_watermark, last_stable_offset, log_start_offset, read_committed)
    entry = _EMPTY_ENTRIES.get(key)
    if entry is None:
        if len(_EMPTY_ENTRIES) >= EMPTY_ENTRIES_MAX:
            _EMPTY_ENTRIES.clear()
        entry = _EMPTY_ENTRIES[key] = make(
            mod.PartitionData,
            partition_index=partition,
            error_code=ErrorCode.none,
            high_watermark=high_watermark,
            last_stable_offset=last_stable_offset,
            log_start_offset=log_start_offset,
            aborted_transactions=() if read_committed else None,
            preferred_read_replica=-1,
            records=b"",
        )
    return entry
