"""What the proxy remembers per partition of an upstream session, to complete full responses.

An incremental response omits a partition when, by the broker's inclusion rules
(Kafka's ``CachedPartition.maybeUpdateResponseData``), nothing about it changed
since the broker last sent it: no records at the session's fetch offset, the same
high watermark and log start offset, no error, no preferred read replica and no
diverging epoch.  So a sessionless broker, asked at that moment, would have
answered exactly: the last high watermark, last stable offset and log start
offset this session reported, no error, no records, no preferred read replica
(-1), no diverging epoch, and aborted transactions ``[]`` under READ_COMMITTED
(``None`` otherwise; they only accompany records).  That is all this cache
keeps: the preferred read replica, aborted transactions and diverging epoch
must *not* be replayed for an omitted partition, because their presence alone
would have made the broker include it.

After an error the broker forgets the partition's high watermark (sets it to
-1), so the next response must include the partition again; an omitted
partition whose last report was an error is therefore a broken response, and
``lookup`` says so by returning None.

The cache only holds partitions of the current session (``retain``), so it is
bounded by the number of partitions a client fetches.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..protocol.partition_key import PartitionKey


@dataclass(frozen=True, slots=True)
class PartitionState:
    high_watermark: int
    last_stable_offset: int
    log_start_offset: int
    error_code: int = 0
    answers: dict[Any, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)
    """What a full response said for the partition while this state held (the kio
    entity, by how it was built): an idle partition's entry is built once, not on
    every fetch.  Bounded: a state is replaced by the next report, and the
    translator keys it by (client version, read_committed)."""


class PartitionStateCache:
    def __init__(self) -> None:
        self._states: dict[PartitionKey, PartitionState] = {}
        self._retained: tuple[PartitionKey, ...] | None = None
        """The keys of the last ``retain``, while every key held is among them."""
        self._retained_set: frozenset[PartitionKey] = frozenset()

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, key: object) -> bool:
        return key in self._states

    def record(
        self,
        key: PartitionKey,
        *,
        high_watermark: int,
        last_stable_offset: int,
        log_start_offset: int,
        error_code: int,
    ) -> None:
        """Remember what the upstream broker just reported for *key*."""
        if self._retained is not None and key not in self._retained_set:
            self._retained = None
        self._states[key] = PartitionState(
            high_watermark, last_stable_offset, log_start_offset, error_code
        )

    def lookup(self, key: PartitionKey) -> PartitionState | None:
        """The state to report for an omitted partition, or None if omission is impossible."""
        state = self._states.get(key)
        if state is None or state.error_code != 0:
            return None
        return state

    def get(self, key: PartitionKey) -> PartitionState | None:
        return self._states.get(key)

    def retain(self, keys: Iterable[PartitionKey]) -> None:
        """Forget every partition not in *keys* (the partitions of the session)."""
        keys = tuple(keys)
        if keys == self._retained:
            return  # the same session as last time, and nothing was recorded outside it
        keep = frozenset(keys)
        for key in [k for k in self._states if k not in keep]:
            del self._states[key]
        self._retained, self._retained_set = keys, keep

    def clear(self) -> None:
        self._states.clear()
