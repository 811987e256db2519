import struct

import pytest
from crc32c import crc32c

from proxy.protocol import records


def make_batch(
    base_offset: int, count: int, payload: bytes = b"x" * 10, attributes: int = 0
) -> bytes:
    """A syntactically valid v2 batch: header fields plus an opaque body of *payload*."""
    after_crc = (
        struct.pack(">hiqqqhii", attributes, count - 1, 1000, 1000 + count, -1, -1, -1, count)
        + payload
    )
    crc = crc32c(after_crc)
    body = struct.pack(">ibI", 0, 2, crc) + after_crc
    return struct.pack(">qi", base_offset, len(body)) + body


def test_header_fields() -> None:
    b = make_batch(42, 5)
    h = records.read_batch_header(b)
    assert (h.base_offset, h.records_count, h.last_offset, h.next_offset) == (42, 5, 46, 47)
    assert h.size == len(b)
    assert records.verify_crc(b, h)


def test_iter_stops_at_partial_trailing_batch() -> None:
    data = make_batch(0, 2) + make_batch(2, 3) + make_batch(5, 1)[:30]
    hs = list(records.iter_batches(data))
    assert [h.base_offset for h in hs] == [0, 2]
    assert records.complete_prefix_size(data) == hs[-1].end


def test_control_batches_count_zero_records() -> None:
    h = records.read_batch_header(make_batch(0, 1, attributes=records.CONTROL_MASK))
    assert h.is_control and h.counted_records == 0


def test_bad_magic_rejected() -> None:
    b = bytearray(make_batch(0, 1))
    b[16] = 1
    with pytest.raises(records.InvalidRecordBatch):
        records.read_batch_header(b)


def test_base_offset_rewrite_keeps_crc_valid() -> None:
    b = bytearray(make_batch(0, 3))
    records.set_base_offset(b, 0, 1000)
    records.set_partition_leader_epoch(b, 0, 7)
    h = records.read_batch_header(b)
    assert h.base_offset == 1000 and h.partition_leader_epoch == 7
    assert records.verify_crc(b, h)


def test_a_batch_whose_next_offset_overflows_int64_is_rejected() -> None:
    """Found by the long fuzz run: a broker's batch at offset 2**63 - 1 made the next
    upstream fetch offset 2**63, which no Fetch request can carry (struct.error)."""
    last_fitting = make_batch(2**63 - 3, 2)  # offsets 2**63-3 and 2**63-2: next is the max
    assert records.read_batch_header(last_fitting).next_offset == 2**63 - 1
    with pytest.raises(records.InvalidRecordBatch, match="overflow"):
        records.read_batch_header(make_batch(2**63 - 1, 2))
    with pytest.raises(records.InvalidRecordBatch):
        list(records.iter_batches(make_batch(0, 1) + make_batch(2**63 - 2, 2)))
