"""The per-connection reuse buffer of whole batches trimmed away from a response.

When a limit trims a partition, the whole batches upstream sent beyond the
cut are kept here, keyed by partition, and go out with the next fetch at the
matching offset instead of being fetched again, so upstream bytes stay close
to delivered bytes under tight limits.  The relay asks upstream for the
partition from :meth:`ReuseBuffer.upstream_offset` (the end of what is held)
and :func:`~proxy.shaping.trim.trim_response` puts the held batches in front.

An entry is dropped when:

- the client fetches the partition at another offset (it seeked, or the
  entry is stale);
- the client's current leader epoch for the partition changes;
- upstream reports an error for the partition;
- upstream's high watermark for it moves backwards (the log was truncated);
- the client fetches at the other isolation level (``FetchShaper._isolation``: what
  was read for read_uncommitted carries no aborted transactions).

Held batches that fill a client's response answer it with no upstream round
(:meth:`~.shaper.FetchShaper.held_answer`); an entry that stays takes upstream's
newer watermarks (``observe``), so what is served from it never goes back.

The buffer is bounded by ``capacity`` bytes per connection and, when given a
:class:`~.budget.MemoryBudget`, holds a reservation for what it keeps: if the
budget has no room the batches are simply not kept (the client's next fetch
goes upstream as usual).  While it holds bytes it is registered with the
budget (``MemoryBudget.holding``), so the budget can shed it without looking
at every connection's buffer.  Only a leading run of whole batches is kept, so what
is held always starts exactly at the client's next offset.
"""

from __future__ import annotations

from collections.abc import Iterator, KeysView
from dataclasses import dataclass

from ..protocol.partition_key import PartitionKey
from .budget import MemoryBudget, Reservation
from .trim import PartitionOutcome, Prefix, Run

NO_EPOCH = -1


@dataclass(slots=True)
class _Entry:
    fetch_offset: int
    prefix: Prefix
    leader_epoch: int
    reservation: Reservation | None
    unserved: PartitionOutcome | None = None
    """The outcome a response that served none of the run gave it (``keep_unserved``):
    the next such response gives it again (``trim_held_in_ranges``)."""

    @property
    def size(self) -> int:
        return self.prefix.run.size


class ReuseBuffer:
    def __init__(self, capacity: int, *, budget: MemoryBudget | None = None) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._budget = budget
        self._entries: dict[PartitionKey, _Entry] = {}
        self._size = 0
        self.dropped = 0
        """Entries dropped by an invalidation rule (not by being served)."""

    @property
    def size(self) -> int:
        """Bytes held (what the buffer counts against the memory budget)."""
        return self._size

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def keys(self) -> Iterator[PartitionKey]:
        return iter(list(self._entries))

    def held_within(self, keys: KeysView[PartitionKey]) -> bool:
        """Whether every partition it holds batches for is among *keys* (one C-level set
        comparison: a full fetch's check of what it no longer lists, every fetch)."""
        return self._entries.keys() <= keys

    def put(
        self,
        key: PartitionKey,
        fetch_offset: int,
        run: Run,
        *,
        leader_epoch: int = NO_EPOCH,
        high_watermark: int,
        last_stable_offset: int = -1,
        log_start_offset: int = -1,
        source: Reservation | None = None,
        capacity: int | None = None,
    ) -> int:
        """Keep the leading whole batches of *run* that fit; return the bytes kept.

        *fetch_offset* is where the client will fetch next (the offset after
        the last batch it was given).  Replaces any entry for *key*.  With a
        budget, the kept bytes are split off *source* (the reservation that
        already counts them, e.g. the fetch's) or else newly reserved.
        *capacity*: the bound for this put instead of ``capacity`` (a run-ahead
        round's, which its ask already bounded).
        """
        self.drop(key, counted=False)
        if not run.headers or run.headers[-1].next_offset <= fetch_offset:
            return 0
        room = (self.capacity if capacity is None else capacity) - self._size
        if run.size <= room:
            kept = run  # (the common case: the whole run fits)
        else:
            count = 0
            for h in run.headers:
                if h.end > room:
                    break
                count += 1
            if count == 0:
                return 0
            kept = run.head(count)
        reservation = None
        if self._budget is not None:
            if source is not None and not source.released and source.nbytes >= kept.size:
                reservation = source.split(kept.size)
            else:
                reservation = self._budget.try_reserve(kept.size)
            if reservation is None:
                return 0
        prefix = Prefix(kept, high_watermark, last_stable_offset, log_start_offset)
        self._entries[key] = _Entry(fetch_offset, prefix, leader_epoch, reservation)
        self._size += kept.size
        if self._budget is not None:
            self._budget.holding(self)
        return kept.size

    def upstream_offset(
        self, key: PartitionKey, fetch_offset: int, leader_epoch: int = NO_EPOCH
    ) -> int:
        """Where to fetch *key* upstream for a client fetch at *fetch_offset*.

        The end of the held batches when they match (same offset and epoch);
        otherwise *fetch_offset*, and a mismatching entry is dropped.
        """
        entry = self._match(key, fetch_offset, leader_epoch)
        if entry is None:
            return fetch_offset
        end = entry.prefix.run.next_offset
        assert end is not None
        return end

    def offer(
        self, key: PartitionKey, fetch_offset: int, leader_epoch: int = NO_EPOCH
    ) -> Prefix | None:
        """The held batches for a fetch at *fetch_offset*, if they match (else the entry is
        dropped).  They stay held, counted by the entry's reservation, until the fetch's
        response settles them: ``keep_unserved`` if it served none of them, else
        ``hand_over``."""
        entry = self._match(key, fetch_offset, leader_epoch)
        return None if entry is None else entry.prefix

    def hand_over(self, key: PartitionKey, into: Reservation | None = None) -> None:
        """Remove *key*'s entry; with *into* (the fetch's reservation) the accounting of
        its bytes, still in memory until delivered or put back, moves there instead of
        being released."""
        entry = self._entries.get(key)
        if entry is None:
            return
        if into is not None and entry.reservation is not None:
            into.absorb(entry.reservation)
        self._remove(key)

    def keep_unserved(
        self, key: PartitionKey, outcome: PartitionOutcome, marks: tuple[int, int, int]
    ) -> bool:
        """Whether *key*'s entry still holds *outcome*'s remainder (the run offered, nothing
        of it served); it then stays, with *marks* as its watermarks and *outcome* as the
        one to give again (``unserved``)."""
        entry = self._entries.get(key)
        run = outcome.remainder
        if entry is None or entry.prefix.run is not run:
            return False
        prefix = entry.prefix
        if marks != (prefix.high_watermark, prefix.last_stable_offset, prefix.log_start_offset):
            entry.prefix = Prefix(run, *marks)
        entry.unserved = outcome
        return True

    def unserved(self, key: PartitionKey) -> PartitionOutcome | None:
        """The outcome ``keep_unserved`` last kept with *key*'s run (None: none kept)."""
        entry = self._entries.get(key)
        return None if entry is None else entry.unserved

    def peek(self, key: PartitionKey) -> Prefix | None:
        entry = self._entries.get(key)
        return None if entry is None else entry.prefix

    def observe(
        self,
        key: PartitionKey,
        *,
        error_code: int = 0,
        high_watermark: int | None = None,
        leader_epoch: int | None = None,
        last_stable_offset: int | None = None,
        log_start_offset: int | None = None,
    ) -> bool:
        """Apply upstream's latest word on *key*; True when that dropped its entry.

        An entry that stays takes upstream's newer watermarks (high watermark, last
        stable offset, log start offset), so held batches served later never carry
        older ones than the client has already seen.
        """
        entry = self._entries.get(key)
        if entry is None:
            return False
        prefix = entry.prefix
        if (
            error_code != 0
            or (high_watermark is not None and high_watermark < prefix.high_watermark)
            or (
                leader_epoch is not None
                and leader_epoch != NO_EPOCH
                and entry.leader_epoch != NO_EPOCH
                and leader_epoch != entry.leader_epoch
            )
        ):
            self.drop(key)
            return True
        hw = prefix.high_watermark if high_watermark is None else high_watermark
        lso = prefix.last_stable_offset
        if last_stable_offset is not None:
            lso = max(lso, last_stable_offset)
        start = prefix.log_start_offset
        if log_start_offset is not None:
            start = max(start, log_start_offset)
        if (hw, lso, start) != (
            prefix.high_watermark,
            prefix.last_stable_offset,
            prefix.log_start_offset,
        ):
            entry.prefix = Prefix(prefix.run, hw, lso, start)
        return False

    def drop(self, key: PartitionKey, *, counted: bool = True) -> None:
        if key in self._entries:
            self._remove(key)
            if counted:
                self.dropped += 1

    def clear(self) -> None:
        """Release everything (the connection closed)."""
        for key in list(self._entries):
            self._remove(key)

    def _match(self, key: PartitionKey, fetch_offset: int, leader_epoch: int) -> _Entry | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        if entry.fetch_offset != fetch_offset or entry.leader_epoch != leader_epoch:
            self.drop(key)
            return None
        return entry

    def _remove(self, key: PartitionKey) -> None:
        entry = self._entries.pop(key)
        self._size -= entry.size
        if not self._entries and self._budget is not None:
            self._budget.empty(self)  # before the release below wakes waiting fetches
        if entry.reservation is not None:
            entry.reservation.release()
