"""Idempotent producer state of one partition (Kafka's ProducerStateManager, reduced).

Tracks, per producer id, the epoch and the sequence ranges of the last five
batches, so that a retried batch is acknowledged with its original offset and a
gap in sequences is refused with OUT_OF_ORDER_SEQUENCE_NUMBER.

Sans-I/O: no trio here.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field

from kio.schema.errors import ErrorCode as E

from proxy.protocol import records

PRODUCER_BATCH_CACHE = 5  # Kafka keeps the metadata of the last 5 batches per producer
MAX_PRODUCERS = 10_000
"""Producer ids remembered per partition; the least recently used is forgotten first, as if
it had expired (Kafka: producer.id.expiration.ms), so its next batch starts afresh."""
INT32_MAX = 2**31 - 1


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    batches: deque[tuple[int, int, int]] = field(
        default_factory=lambda: deque(maxlen=PRODUCER_BATCH_CACHE)
    )
    """(first sequence, last sequence, base offset) of the latest batches."""


class ProducerStates:
    """Idempotent producer state of one partition (Kafka's ProducerStateManager, reduced)."""

    def __init__(self, max_producers: int = MAX_PRODUCERS) -> None:
        self.entries: OrderedDict[int, ProducerEntry] = OrderedDict()
        self.max_producers = max_producers

    def check(self, h: records.BatchHeader) -> tuple[E, int | None]:
        """(error, duplicate base offset) for the batch *h* before it is appended."""
        entry = self.entries.get(h.producer_id)
        last_seq = _last_sequence(h)
        if entry is None:
            return E.none, None
        if h.producer_epoch < entry.epoch:
            return E.invalid_producer_epoch, None
        if h.producer_epoch > entry.epoch:
            return (
                (E.none, None) if h.base_sequence == 0 else (E.out_of_order_sequence_number, None)
            )
        for first, last, base in entry.batches:
            if first == h.base_sequence and last == last_seq:
                return E.none, base
        # ProducerAppendInfo.checkSequence: with no sequence history in this
        # epoch (a marker reset it), the next batch must start at 0.
        previous = entry.batches[-1][1] if entry.batches else -1
        expected = 0 if previous == INT32_MAX else previous + 1
        if h.base_sequence != expected:
            return E.out_of_order_sequence_number, None
        return E.none, None

    def record_marker(self, producer_id: int, producer_epoch: int) -> None:
        """A transaction marker was written: its epoch becomes the producer's (sequences reset).

        ProducerAppendInfo.appendEndTxnMarker (maybeUpdateProducerEpoch).
        """
        entry = self.entries.get(producer_id)
        if entry is None or producer_epoch != entry.epoch:
            self.entries[producer_id] = ProducerEntry(producer_epoch)
        self.entries.move_to_end(producer_id)
        while len(self.entries) > self.max_producers:
            self.entries.popitem(last=False)

    def record(self, h: records.BatchHeader, base_offset: int) -> None:
        entry = self.entries.get(h.producer_id)
        if entry is None or h.producer_epoch != entry.epoch:
            entry = self.entries[h.producer_id] = ProducerEntry(h.producer_epoch)
        self.entries.move_to_end(h.producer_id)
        while len(self.entries) > self.max_producers:
            self.entries.popitem(last=False)
        entry.batches.append((h.base_sequence, _last_sequence(h), base_offset))


def _last_sequence(h: records.BatchHeader) -> int:
    last = h.base_sequence + h.last_offset_delta
    return last - INT32_MAX - 1 if last > INT32_MAX else last
