"""Build syntactically valid RecordBatch v2 bytes (header fields plus an opaque body)."""

from __future__ import annotations

import struct

from crc32c import crc32c


def make_batch(
    base_offset: int = 0,
    count: int = 1,
    payload: bytes = b"x" * 10,
    attributes: int = 0,
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    base_timestamp: int = 1000,
) -> bytes:
    """A v2 batch of *count* records whose body is *payload* (not real records).

    The dev broker never decodes records, so an opaque body is enough to test
    offsets, sizes, CRCs and producer sequences.  Timestamps run from
    *base_timestamp* to *base_timestamp* + *count*.
    """
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            attributes,
            count - 1,
            base_timestamp,
            base_timestamp + count,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
        + payload
    )
    body = struct.pack(">ibI", 0, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", base_offset, len(body)) + body


def _zigzag(value: int) -> bytes:
    raw = (value << 1) ^ (value >> 63)
    out = bytearray()
    while True:
        b = raw & 0x7F
        raw >>= 7
        if raw:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def make_record_batch(
    timestamps: list[int], *, values: list[bytes] | None = None, gzip_body: bool = False
) -> bytes:
    """A v2 batch of real records (null keys, no headers) with the given timestamps."""
    import gzip

    vals = values or [f"v{i}".encode() for i in range(len(timestamps))]
    base_ts = min(timestamps)
    body = bytearray()
    for i, (ts, value) in enumerate(zip(timestamps, vals, strict=True)):
        rec = b"\x00" + _zigzag(ts - base_ts) + _zigzag(i) + _zigzag(-1)
        rec += _zigzag(len(value)) + value + _zigzag(0)
        body += _zigzag(len(rec)) + rec
    payload = gzip.compress(bytes(body)) if gzip_body else bytes(body)
    count = len(timestamps)
    after_crc = (
        struct.pack(
            ">hiqqqhii",
            1 if gzip_body else 0,
            count - 1,
            base_ts,
            max(timestamps),
            -1,
            -1,
            -1,
            count,
        )
        + payload
    )
    head = struct.pack(">ibI", 0, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(head)) + head
