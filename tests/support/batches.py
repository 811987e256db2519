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
