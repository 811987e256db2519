"""RecordBatch (magic v2) headers, read without decompressing anything.

Layout of a v2 batch (DefaultRecordBatch):

    offset  size  field
    0       8     baseOffset
    8       4     batchLength        (bytes after this field)
    12      4     partitionLeaderEpoch
    16      1     magic              (2)
    17      4     crc                (crc32c of bytes 21..end)
    21      2     attributes
    23      4     lastOffsetDelta
    27      8     baseTimestamp
    35      8     maxTimestamp
    43      8     producerId
    51      2     producerEpoch
    53      4     baseSequence
    57      4     recordsCount
    61            records...

The CRC does not cover baseOffset, batchLength, partitionLeaderEpoch or magic,
so a broker assigns offsets and epochs by rewriting those fields in place.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

from crc32c import crc32c

from .errors import ProtocolError

HEADER_SIZE = 61
LOG_OVERHEAD = 12  # baseOffset + batchLength
MAGIC_V2 = 2

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET = struct.Struct(">q")
_EPOCH = struct.Struct(">i")
_PREFIX = struct.Struct(">qi")

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_MASK = 0x08
TRANSACTIONAL_MASK = 0x10
CONTROL_MASK = 0x20
DELETE_HORIZON_MASK = 0x40

COMPRESSION_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}


class InvalidRecordBatch(ProtocolError):
    """A batch header is malformed (bad magic, impossible length, CRC mismatch)."""


@dataclass(frozen=True, slots=True)
class BatchHeader:
    position: int
    """Byte position of the batch within the buffer it was read from."""
    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size(self) -> int:
        """Total bytes of the batch, length prefix included."""
        return LOG_OVERHEAD + self.batch_length

    @property
    def end(self) -> int:
        return self.position + self.size

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_MASK)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_MASK)

    @property
    def counted_records(self) -> int:
        """Records as counted by record limits: control batches count zero."""
        return 0 if self.is_control else self.records_count


_INT64_MAX = 2**63 - 1


def read_batch_header(buf: bytes | bytearray | memoryview, position: int = 0) -> BatchHeader:
    """Parse the header of the batch starting at *position*; raise if it is not whole.

    Only the header must be present; use :func:`iter_batches` to know whether
    the batch body is complete too.
    """
    if len(buf) - position < HEADER_SIZE:
        raise InvalidRecordBatch("buffer too short for a record batch header")
    fields = _HEADER.unpack_from(buf, position)
    header = BatchHeader(position, *fields)
    if header.magic != MAGIC_V2:
        raise InvalidRecordBatch(f"unsupported record batch magic {header.magic}")
    if header.batch_length < HEADER_SIZE - LOG_OVERHEAD:
        raise InvalidRecordBatch(f"record batch length {header.batch_length} is too small")
    if header.next_offset > _INT64_MAX:
        # The offset after the batch is where the next fetch starts: it must be an int64.
        raise InvalidRecordBatch(
            f"record batch offsets {header.base_offset}+{header.last_offset_delta} overflow int64"
        )
    return header


def iter_batches(buf: bytes | bytearray | memoryview) -> Iterator[BatchHeader]:
    """Yield the headers of the whole batches in *buf*, in order.

    Stops silently at a trailing partial batch (a fetch response may end in
    one: KIP-74 / log slicing); use :func:`complete_prefix_size` to learn where
    the whole batches end.  Raises InvalidRecordBatch for malformed data.
    """
    pos = 0
    n = len(buf)
    while n - pos >= LOG_OVERHEAD:
        _base, length = _PREFIX.unpack_from(buf, pos)
        if length < HEADER_SIZE - LOG_OVERHEAD:
            raise InvalidRecordBatch(f"record batch length {length} is too small")
        if n - pos < LOG_OVERHEAD + length:
            return  # partial trailing batch
        yield read_batch_header(buf, pos)
        pos += LOG_OVERHEAD + length


def complete_prefix_size(buf: bytes | bytearray | memoryview) -> int:
    """Bytes of *buf* taken by whole batches (the rest is a partial trailing batch)."""
    end = 0
    for header in iter_batches(buf):
        end = header.end
    return end


def compute_crc(batch: bytes | bytearray | memoryview) -> int:
    return int(crc32c(bytes(memoryview(batch)[21:])))


def verify_crc(batch: bytes | bytearray | memoryview, header: BatchHeader) -> bool:
    body = memoryview(batch)[header.position + 21 : header.end]
    return int(crc32c(bytes(body))) == header.crc


def set_base_offset(batch: bytearray, position: int, base_offset: int) -> None:
    _OFFSET.pack_into(batch, position, base_offset)


def set_partition_leader_epoch(batch: bytearray, position: int, epoch: int) -> None:
    _EPOCH.pack_into(batch, position + 12, epoch)
