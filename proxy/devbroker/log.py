"""One partition's log, stored as the raw batch bytes producers sent.

Reads behave like Kafka's ``LogSegment.read``: a read starts at the batch
that contains the fetch offset, is bounded by an upper offset (the high
watermark, or the last stable offset for read_committed) and by ``max_bytes``,
and may therefore end in the middle of a batch (a partial trailing batch),
unless ``min_one_message`` is set, in which case the first batch is returned
whole even when it alone exceeds ``max_bytes`` (KIP-74).

Sans-I/O: no trio here.
"""

from __future__ import annotations

import bisect
import zlib
from dataclasses import dataclass

from ..protocol import records


class OffsetOutOfRange(Exception):
    def __init__(self, offset: int, log_start: int, log_end: int) -> None:
        super().__init__(f"offset {offset} outside [{log_start}, {log_end}]")
        self.offset = offset


class CorruptRecords(Exception):
    """A produced record set is not a sequence of valid v2 batches (Kafka: CORRUPT_MESSAGE)."""


@dataclass(frozen=True, slots=True)
class AppendResult:
    base_offset: int
    last_offset: int
    log_append_time: int  # -1: CreateTime topics


class PartitionLog:
    def __init__(self) -> None:
        self.data = bytearray()
        self._base: list[int] = []  # base offset of each batch
        self._last: list[int] = []  # last offset of each batch
        self._pos: list[int] = []  # byte position of each batch
        self.log_start_offset = 0
        self.log_end_offset = 0

    # Single-replica partitions: everything appended is committed at once.
    @property
    def high_watermark(self) -> int:
        return self.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        return self.log_end_offset

    @property
    def batch_count(self) -> int:
        return len(self._base)

    def append(self, record_set: bytes, leader_epoch: int) -> AppendResult:
        """Validate and append a producer's record set; assign offsets in the batch headers."""
        if not record_set:
            raise CorruptRecords("empty record set")
        buf = bytearray(record_set)
        headers = []
        try:
            for h in records.iter_batches(buf):
                if not records.verify_crc(buf, h):
                    raise CorruptRecords(f"CRC mismatch in batch at byte {h.position}")
                if h.records_count <= 0 or h.last_offset_delta != h.records_count - 1:
                    raise CorruptRecords("record count does not match last offset delta")
                headers.append(h)
        except records.InvalidRecordBatch as exc:
            raise CorruptRecords(str(exc)) from exc
        if not headers or headers[-1].end != len(buf):
            raise CorruptRecords("record set ends in a partial batch")
        first = self.log_end_offset
        next_offset = first
        for h in headers:
            records.set_base_offset(buf, h.position, next_offset)
            records.set_partition_leader_epoch(buf, h.position, leader_epoch)
            self._base.append(next_offset)
            self._last.append(next_offset + h.last_offset_delta)
            self._pos.append(len(self.data) + h.position)
            next_offset += h.last_offset_delta + 1
        self.data += buf
        self.log_end_offset = next_offset
        return AppendResult(first, next_offset - 1, -1)

    def _position_of_offset(self, offset: int) -> int:
        """Byte position of the first batch whose last offset >= offset (or end of data)."""
        i = bisect.bisect_left(self._last, offset)
        return self._pos[i] if i < len(self._pos) else len(self.data)

    def read(
        self,
        fetch_offset: int,
        max_bytes: int,
        *,
        min_one_message: bool,
        upper_bound: int | None = None,
    ) -> memoryview:
        """Bytes to return for a fetch at *fetch_offset* (possibly ending mid-batch)."""
        if max_bytes < 0:
            raise ValueError("max_bytes must be >= 0")
        if fetch_offset < self.log_start_offset or fetch_offset > self.log_end_offset:
            raise OffsetOutOfRange(fetch_offset, self.log_start_offset, self.log_end_offset)
        bound = self.high_watermark if upper_bound is None else upper_bound
        if fetch_offset >= bound:
            return memoryview(b"")
        i = bisect.bisect_left(self._last, fetch_offset)
        if i >= len(self._pos):
            return memoryview(b"")
        start = self._pos[i]
        max_position = self._position_of_offset(bound)
        first_size = (self._pos[i + 1] if i + 1 < len(self._pos) else len(self.data)) - start
        adjusted = max(max_bytes, first_size) if min_one_message else max_bytes
        size = min(max_position - start, adjusted)
        if size <= 0:
            return memoryview(b"")
        return memoryview(self.data)[start : start + size]

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after *timestamp* (ListOffsets).

        Like Kafka's LogSegment.findOffsetByTimestamp: the first batch whose max
        timestamp qualifies, then the first record in it (from the log start
        offset on) whose timestamp does.  Record timestamps are read for
        uncompressed and gzip batches; for other codecs (whose decoders are not
        dependencies) the batch's first offset and max timestamp are reported.
        """
        for i, pos in enumerate(self._pos):
            if self._last[i] < self.log_start_offset:
                continue
            h = records.read_batch_header(self.data, pos)
            if h.max_timestamp < timestamp:
                continue
            stamps = record_timestamps(self.data, h, self._base[i])
            if stamps is None:
                return max(self._base[i], self.log_start_offset), h.max_timestamp
            for offset, ts in stamps:
                if offset >= self.log_start_offset and ts >= timestamp:
                    return offset, ts
        return None

    def max_timestamp(self) -> tuple[int, int] | None:
        """(offset, timestamp) of the record with the largest timestamp (ListOffsets -3, KIP-734).

        The first record holding it when record timestamps are readable,
        else the last offset of the batch holding it.
        """
        best: tuple[int, int] | None = None
        for i, pos in enumerate(self._pos):
            h = records.read_batch_header(self.data, pos)
            if best is not None and h.max_timestamp <= best[1]:
                continue
            stamps = record_timestamps(self.data, h, self._base[i])
            if stamps is None:
                best = (self._base[i] + h.last_offset_delta, h.max_timestamp)
            else:
                top = max(stamps, key=lambda r: (r[1], -r[0]))
                best = (top[0], top[1])
        return best

    def delete_records_before(self, offset: int) -> None:
        """Advance the log start offset (DeleteRecords / retention), for OFFSET_OUT_OF_RANGE tests."""
        if offset > self.log_end_offset:
            raise OffsetOutOfRange(offset, self.log_start_offset, self.log_end_offset)
        self.log_start_offset = max(self.log_start_offset, offset)


def _varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    """A zigzag-encoded varint/varlong (Kafka's ByteUtils.readVarint/readVarlong)."""
    raw = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise CorruptRecords("truncated or oversized varint in a record")
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7


def record_timestamps(
    data: bytes | bytearray | memoryview, h: records.BatchHeader, base_offset: int
) -> list[tuple[int, int]] | None:
    """(offset, timestamp) of each record of a stored batch; None when its codec is not readable.

    Only for ListOffsets by timestamp, never on the fetch path.
    """
    body = memoryview(data)[h.position + records.HEADER_SIZE : h.end]
    if h.compression == 1:
        try:
            body = memoryview(zlib.decompress(bytes(body), 16 + zlib.MAX_WBITS))
        except zlib.error:
            return None
    elif h.compression != 0:
        return None
    out = []
    pos = 0
    try:
        for i in range(h.records_count):
            length, pos = _varint(body, pos)
            end = pos + length
            ts_delta, p = _varint(body, pos + 1)  # skip the attributes byte
            offset_delta, p = _varint(body, p)
            if length <= 0 or p > end or offset_delta != i:
                return None
            out.append((base_offset + offset_delta, h.base_timestamp + ts_delta))
            pos = end
    except CorruptRecords:
        return None
    return out if pos == len(body) else None
