"""One partition's log, stored as the raw batch bytes producers sent.

Reads behave like Kafka's ``LogSegment.read``: a read starts at the batch
that contains the fetch offset, is bounded by an upper offset (the high
watermark, or the last stable offset for read_committed) and by ``max_bytes``,
and may therefore end in the middle of a batch (a partial trailing batch),
unless ``min_one_message`` is set, in which case the first batch is returned
whole even when it alone exceeds ``max_bytes`` (KIP-74).

Transactions follow Kafka's ProducerStateManager and transaction index: a
transactional batch opens its producer's transaction at the batch's base
offset; a control batch (COMMIT/ABORT marker, see :func:`control_batch`)
closes it, and an aborted one is added to the aborted-transaction index with
the last stable offset at that point.  The last stable offset is the first
offset of the earliest open transaction (or the high watermark).  The offset
index is modelled as Kafka's (one entry per ``INDEX_INTERVAL_BYTES`` appended),
because read_committed fetches collect aborted transactions up to the offset
it yields for the end of the returned bytes.

Sans-I/O: no trio here.
"""

from __future__ import annotations

import bisect
import struct
import zlib
from dataclasses import dataclass

from crc32c import crc32c

from proxy.protocol import records


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


INDEX_INTERVAL_BYTES = 4096  # index.interval.bytes
ABORT, COMMIT = 0, 1  # ControlRecordType
_CONTROL_ATTRIBUTES = records.TRANSACTIONAL_MASK | records.CONTROL_MASK


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    """An entry of the transaction index (Kafka's AbortedTxn)."""

    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


def _zigzag(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while raw > 0x7F:
        out.append((raw & 0x7F) | 0x80)
        raw >>= 7
    out.append(raw)
    return bytes(out)


def control_batch(
    producer_id: int, producer_epoch: int, control_type: int, coordinator_epoch: int, timestamp: int
) -> bytes:
    """A transaction marker: a v2 control batch of one control record (EndTransactionMarker).

    Key: version 0 and the type (0 abort, 1 commit); value: version 0 and the
    coordinator epoch; no headers.  The base offset is filled in on append.
    """
    key = struct.pack(">hh", 0, control_type)
    value = struct.pack(">hi", 0, coordinator_epoch)
    body = b"\x00" + _zigzag(0) + _zigzag(0)  # attributes, timestamp delta, offset delta
    body += _zigzag(len(key)) + key + _zigzag(len(value)) + value + _zigzag(0)
    record = _zigzag(len(body)) + body
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            _CONTROL_ATTRIBUTES,
            0,
            timestamp,
            timestamp,
            producer_id,
            producer_epoch,
            -1,
            1,
        )
        + record
    )
    head = struct.pack(">ibI", -1, records.MAGIC_V2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(head)) + head


def control_type(data: bytes | bytearray | memoryview, h: records.BatchHeader) -> int:
    """The marker type (ABORT/COMMIT) of a control batch (its first record's key)."""
    body = memoryview(data)[h.position + records.HEADER_SIZE : h.end]
    _length, pos = _varint(body, 0)
    pos += 1  # attributes
    _ts, pos = _varint(body, pos)
    _delta, pos = _varint(body, pos)
    key_length, pos = _varint(body, pos)
    if key_length < 4 or pos + 4 > len(body):
        raise CorruptRecords("control record without a valid key")
    _version, kind = struct.unpack_from(">hh", body, pos)
    return int(kind)


class PartitionLog:
    def __init__(self) -> None:
        self.data = bytearray()
        self._base: list[int] = []  # base offset of each batch
        self._last: list[int] = []  # last offset of each batch
        self._pos: list[int] = []  # byte position of each batch
        self.log_start_offset = 0
        self.log_end_offset = 0
        self.ongoing: dict[int, int] = {}
        """producer id -> first offset of its open transaction (insertion = offset order)."""
        self.aborted: list[AbortedTxn] = []
        """The transaction index, in marker order."""
        self._index: list[tuple[int, int]] = []  # sparse offset index: (offset, position)
        self._since_index = 0

    # Single-replica partitions: everything appended is committed at once.
    @property
    def high_watermark(self) -> int:
        return self.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """First offset of the earliest open transaction, else the high watermark."""
        first = min(self.ongoing.values(), default=self.high_watermark)
        return min(first, self.high_watermark)

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
        markers = [control_type(buf, h) for h in headers if h.is_control]
        first = self.log_end_offset
        next_offset = first
        position = len(self.data)
        for h in headers:
            records.set_base_offset(buf, h.position, next_offset)
            records.set_partition_leader_epoch(buf, h.position, leader_epoch)
            self._base.append(next_offset)
            self._last.append(next_offset + h.last_offset_delta)
            self._pos.append(position + h.position)
            if h.is_transactional and h.producer_id >= 0:
                if h.is_control:
                    self._complete_txn(h.producer_id, next_offset, markers.pop(0))
                else:
                    self.ongoing.setdefault(h.producer_id, next_offset)
            next_offset += h.last_offset_delta + 1
        # LogSegment.append: an index entry (largest offset, start position) per interval.
        if self._since_index > INDEX_INTERVAL_BYTES:
            self._index.append((next_offset - 1, position))
            self._since_index = 0
        self._since_index += len(buf)
        self.data += buf
        self.log_end_offset = next_offset
        return AppendResult(first, next_offset - 1, -1)

    def _complete_txn(self, producer_id: int, marker_offset: int, kind: int) -> None:
        """ProducerAppendInfo.appendEndTxnMarker + UnifiedLog's transaction index update."""
        first = self.ongoing.pop(producer_id, marker_offset)
        if kind == ABORT:
            lso = min(self.ongoing.values(), default=marker_offset + 1)
            self.aborted.append(AbortedTxn(producer_id, first, marker_offset, lso))

    def fetch_upper_bound_offset(self, start_position: int, fetch_size: int) -> int:
        """LogSegment.fetchUpperBoundOffset (offset index), else the log end offset."""
        target = start_position + fetch_size
        for offset, position in self._index:
            if position >= target:
                return offset
        return self.log_end_offset

    def aborted_transactions(
        self, fetch_offset: int, start_position: int, fetch_size: int
    ) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a read_committed fetch returns.

        UnifiedLog.addAbortedTransactions / TransactionIndex.collectAbortedTxns.
        """
        upper = self.fetch_upper_bound_offset(start_position, fetch_size)
        out = []
        for txn in self.aborted:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper:
                out.append((txn.producer_id, txn.first_offset))
            if txn.last_stable_offset >= upper:
                break
        return out

    def position_of(self, fetch_offset: int) -> int:
        """Byte position where a read at *fetch_offset* starts."""
        return self._position_of_offset(fetch_offset)

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
