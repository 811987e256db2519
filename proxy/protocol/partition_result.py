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
"""

from __future__ import annotations

from typing import Any, NamedTuple


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
