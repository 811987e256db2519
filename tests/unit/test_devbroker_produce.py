"""Produce and InitProducerId on the dev cluster, with Kafka's validation and error codes."""

from __future__ import annotations

import struct

import pytest
from kio.schema.errors import ErrorCode as E
from support.batches import make_batch, make_record_batch
from support.dispatch import Close, Harness, NoReply, Reply

from devbroker.admin import coordinator_node
from proxy.protocol import records

PRODUCE, INIT_PRODUCER_ID = 0, 22
ZSTD, GZIP = 4, 1


@pytest.fixture
def h() -> Harness:
    return Harness(3, {"orders": 12})


def produce_request(
    h: Harness,
    partition: int,
    data: bytes | None,
    *,
    acks: int = -1,
    version: int = 12,
    topic: str = "orders",
) -> object:
    return h.request(
        PRODUCE,
        version,
        {
            "transactional_id": None,
            "acks": acks,
            "timeout": 1000,
            "topic_data": [
                {"name": topic, "partition_data": [{"index": partition, "records": data}]}
            ],
        },
    )


def produce(
    h: Harness, partition: int, data: bytes | None, *, node: int | None = None, **kw: object
) -> object:
    target = h.leader_of("orders", partition) if node is None else node
    resp = h.call(target, produce_request(h, partition, data, **kw))  # type: ignore[arg-type]
    return resp.responses[0].partition_responses[0]


def test_produce_assigns_offsets_by_rewriting_the_header(h: Harness) -> None:
    first = produce(h, 3, make_batch(0, 3))
    second = produce(h, 3, make_batch(0, 2, b"other"))
    assert (first.error_code, first.base_offset) == (E.none, 0)
    assert (second.error_code, second.base_offset) == (E.none, 3)
    part = h.state.partition("orders", 3)
    assert part is not None
    stored = bytes(part.log.data)
    headers = list(records.iter_batches(stored))
    assert [(b.base_offset, b.records_count) for b in headers] == [(0, 3), (3, 2)]
    assert all(records.verify_crc(stored, b) for b in headers)
    # Everything but base offset and leader epoch is kept byte for byte.
    original = make_batch(0, 2, b"other")
    assert stored[headers[1].position + 16 :] == original[16:]


@pytest.mark.parametrize("version", [3, 7, 9, 12])
def test_produce_each_version(h: Harness, version: int) -> None:
    assert produce(h, 0, make_batch(0, 1), version=version).error_code == E.none


def test_not_leader_gets_not_leader_or_follower_with_the_new_leader(h: Harness) -> None:
    leader = h.leader_of("orders", 1)
    other = (leader + 1) % 3
    resp = h.call(other, produce_request(h, 1, make_batch(0, 1)))
    part = resp.responses[0].partition_responses[0]
    assert part.error_code == E.not_leader_or_follower
    assert part.current_leader.leader_id == leader
    assert [(n.node_id, n.port) for n in resp.node_endpoints] == [(leader, 9000 + leader)]
    assert h.state.partition("orders", 1).log.log_end_offset == 0  # type: ignore[union-attr]


def test_refusals(h: Harness) -> None:
    corrupt = bytearray(make_batch(0, 2))
    corrupt[-1] ^= 0xFF
    old_magic = bytearray(make_batch(0, 1))
    old_magic[16] = 1
    assert produce(h, 0, bytes(corrupt)).error_code == E.corrupt_message
    assert produce(h, 0, make_batch(0, 1) + make_batch(1, 1)).error_code == E.invalid_record
    assert produce(h, 0, bytes(old_magic)).error_code == E.invalid_record
    assert produce(h, 0, None).error_code == E.invalid_record
    assert produce(h, 0, make_batch(0, 1)[:40]).error_code == E.invalid_record  # no whole batch
    future_magic = bytearray(make_batch(0, 1))
    future_magic[16] = 3
    assert produce(h, 0, bytes(future_magic)).error_code == E.corrupt_message
    assert produce(h, 0, struct.pack(">qi", 0, 5) + b"\x00" * 5).error_code == E.corrupt_message
    control = make_batch(0, 1, attributes=records.CONTROL_MASK)
    assert produce(h, 0, control).error_code == E.invalid_record
    assert (
        produce(h, 0, make_batch(0, 1, producer_id=9, producer_epoch=0)).error_code
        == E.invalid_record
    )
    miscounted = bytearray(make_batch(0, 3))
    miscounted[57:61] = struct.pack(">i", 2)  # records count 2, offsets span 3
    miscounted[17:21] = struct.pack(">I", records.compute_crc(miscounted))
    assert produce(h, 0, bytes(miscounted)).error_code == E.invalid_record
    assert (
        produce(h, 0, make_batch(0, 1, attributes=ZSTD), version=6).error_code
        == E.unsupported_compression_type
    )
    assert produce(h, 0, make_batch(0, 1, attributes=ZSTD), version=7).error_code == E.none
    assert produce(h, 0, make_batch(0, 1), acks=2).error_code == E.invalid_required_acks
    assert produce(h, 0, make_batch(0, 1, b"x" * 1_100_000)).error_code == E.message_too_large
    assert (
        produce(
            h,
            0,
            make_batch(
                0,
                1,
                attributes=records.TRANSACTIONAL_MASK,
                producer_id=5,
                producer_epoch=0,
                base_sequence=0,
            ),
        ).error_code
        == E.transactional_id_authorization_failed  # transactional records without an id
    )
    unknown = h.call(0, produce_request(h, 0, make_batch(0, 1), topic="missing"))
    assert unknown.responses[0].partition_responses[0].error_code == E.unknown_topic_or_partition
    assert h.state.partition("orders", 0).log.log_end_offset == 1  # type: ignore[union-attr]


def test_acks_zero_sends_nothing_and_closes_on_error(h: Harness) -> None:
    leader = h.leader_of("orders", 0)
    assert isinstance(h.send(leader, produce_request(h, 0, make_batch(0, 1), acks=0)), NoReply)
    assert h.state.partition("orders", 0).log.log_end_offset == 1  # type: ignore[union-attr]
    other = (leader + 1) % 3
    assert isinstance(h.send(other, produce_request(h, 0, make_batch(0, 1), acks=0)), Close)


def test_acks_one_and_all_answer(h: Harness) -> None:
    leader = h.leader_of("orders", 0)
    for acks in (1, -1):
        assert isinstance(h.send(leader, produce_request(h, 0, make_batch(0, 1), acks=acks)), Reply)


def test_idempotent_producer_sequences(h: Harness) -> None:
    init = h.call(
        0, h.request(INIT_PRODUCER_ID, 4, {"transactional_id": None, "transaction_timeout": 60000})
    )
    assert init.error_code == E.none and init.producer_epoch == 0
    pid = init.producer_id

    def batch(seq: int, n: int = 2, epoch: int = 0) -> bytes:
        return make_batch(0, n, producer_id=pid, producer_epoch=epoch, base_sequence=seq)

    assert produce(h, 0, batch(0)).base_offset == 0
    assert produce(h, 0, batch(2)).base_offset == 2
    # A retry of a recent batch is acknowledged with its first offset, not appended again.
    dup = produce(h, 0, batch(0))
    assert (dup.error_code, dup.base_offset) == (E.none, 0)
    assert h.state.partition("orders", 0).log.log_end_offset == 4  # type: ignore[union-attr]
    assert produce(h, 0, batch(7)).error_code == E.out_of_order_sequence_number
    assert produce(h, 0, batch(4, epoch=1)).error_code == E.out_of_order_sequence_number
    assert produce(h, 0, batch(0, epoch=1)).error_code == E.none
    assert produce(h, 0, batch(2, epoch=0)).error_code == E.invalid_producer_epoch


def test_init_producer_id_allocates_distinct_ids(h: Harness) -> None:
    ids = {
        h.call(
            n,
            h.request(
                INIT_PRODUCER_ID, 5, {"transactional_id": None, "transaction_timeout": 60000}
            ),
        ).producer_id
        for n in (0, 1, 2, 0)
    }
    assert len(ids) == 4
    other = (coordinator_node(h.state.node_ids, "tx") + 1) % 3
    txn = h.call(
        other,
        h.request(INIT_PRODUCER_ID, 5, {"transactional_id": "tx", "transaction_timeout": 60000}),
    )
    assert txn.error_code == E.not_coordinator


def test_gzip_batches_are_stored_untouched(h: Harness) -> None:
    data = make_batch(0, 4, b"\x1f\x8b opaque compressed bytes", attributes=GZIP)
    assert produce(h, 5, data).error_code == E.none
    stored = bytes(h.state.partition("orders", 5).log.data)  # type: ignore[union-attr]
    assert stored[16:] == data[16:]


def test_producer_state_is_bounded() -> None:
    from devbroker.producers import ProducerStates

    states = ProducerStates(max_producers=3)
    for pid in range(10):
        h = records.read_batch_header(
            make_batch(0, 1, producer_id=pid, producer_epoch=0, base_sequence=0)
        )
        assert states.check(h) == (E.none, None)
        states.record(h, pid)
    assert list(states.entries) == [7, 8, 9]


# -- strictness audit: LogValidator.validateTimestamp (message.timestamp.after.max.ms) ---------

NOW_MS = 1_700_000_000_000
AFTER_MAX_MS = 3_600_000  # Kafka 4.x default of log.message.timestamp.after.max.ms


def at_wall_clock(h: Harness, ms: int) -> None:
    for node in h.nodes:
        node.wall_clock = lambda: ms / 1000.0


def test_records_too_far_in_the_future_get_invalid_timestamp(h: Harness) -> None:
    at_wall_clock(h, NOW_MS)
    ok = make_record_batch([NOW_MS - 10**9, NOW_MS + AFTER_MAX_MS])
    assert produce(h, 0, ok).error_code == E.none
    bad = make_record_batch([NOW_MS, NOW_MS + AFTER_MAX_MS + 1, NOW_MS + AFTER_MAX_MS + 2])
    part = produce(h, 0, bad)
    assert part.error_code == E.invalid_timestamp
    assert [e.batch_index for e in part.record_errors] == [1, 2]
    assert part.error_message == "One or more records have been rejected due to invalid timestamp"
    assert h.state.partition("orders", 0).log.log_end_offset == 2  # type: ignore[union-attr]


def test_future_timestamps_in_gzip_batches_are_found_too(h: Harness) -> None:
    at_wall_clock(h, NOW_MS)
    bad = make_record_batch([NOW_MS, NOW_MS + AFTER_MAX_MS + 5], gzip_body=True)
    part = produce(h, 0, bad)
    assert part.error_code == E.invalid_timestamp
    assert [e.batch_index for e in part.record_errors] == [1]


def test_unreadable_records_are_judged_by_the_batch_max_timestamp(h: Harness) -> None:
    at_wall_clock(h, NOW_MS)
    part = produce(h, 0, make_batch(0, 3, base_timestamp=NOW_MS + AFTER_MAX_MS))
    assert part.error_code == E.invalid_timestamp
    assert produce(h, 0, make_batch(0, 3, base_timestamp=NOW_MS)).error_code == E.none


# -- strictness audit: ProducerAppendInfo.checkSequence after a marker reset the sequences ----


def test_same_epoch_without_sequence_history_must_start_at_zero(h: Harness) -> None:
    part = h.state.partition("orders", 0)
    assert part is not None
    part.producers.record_marker(77, 3)  # a marker moved producer 77 to epoch 3

    def batch(seq: int) -> bytes:
        return make_batch(0, 1, producer_id=77, producer_epoch=3, base_sequence=seq)

    assert produce(h, 0, batch(5)).error_code == E.out_of_order_sequence_number
    assert produce(h, 0, batch(0)).error_code == E.none


# -- strictness audit: KafkaApis.handleProduceRequest keys partitions in a map ----------------


def test_a_partition_listed_twice_is_written_once_with_the_last_records(h: Harness) -> None:
    req = h.request(
        PRODUCE,
        9,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 1000,
            "topic_data": [
                {"name": "orders", "partition_data": [{"index": 0, "records": make_batch(0, 2)}]},
                {"name": "orders", "partition_data": [{"index": 0, "records": make_batch(0, 5)}]},
            ],
        },
    )
    resp = h.call(h.leader_of("orders", 0), req)
    assert [(t.name, [p.index for p in t.partition_responses]) for t in resp.responses] == [
        ("orders", [0])
    ]
    log = h.state.partition("orders", 0).log  # type: ignore[union-attr]
    assert log.log_end_offset == 5 and log.batch_count == 1


# -- strictness audit: UnifiedLog.analyzeAndValidateRecords -----------------------------------


def test_a_client_batch_must_have_base_offset_zero(h: Harness) -> None:
    part = produce(h, 0, make_batch(7, 1))
    assert part.error_code == E.invalid_record
    assert part.error_message == (
        "The baseOffset of the record batch in the append to orders-0 should be 0, but it is 7"
    )


def test_an_unknown_compression_codec_is_an_unexpected_error(h: Harness) -> None:
    # CompressionType.forId throws for codec ids above zstd (4).
    assert produce(h, 0, make_batch(0, 1, attributes=5)).error_code == E.unknown_server_error
    assert h.state.partition("orders", 0).log.log_end_offset == 0  # type: ignore[union-attr]
    # Below v7 the ZStandard check of ProduceRequest.validateRecords throws first, failing the
    # whole request (every partition, known or not listed after it).
    req = h.request(
        PRODUCE,
        6,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 1000,
            "topic_data": [
                {
                    "name": "orders",
                    "partition_data": [
                        {"index": 0, "records": make_batch(0, 1)},
                        {"index": 1, "records": make_batch(0, 1, attributes=6)},
                    ],
                }
            ],
        },
    )
    resp = h.call(h.leader_of("orders", 0), req)
    codes = [p.error_code for t in resp.responses for p in t.partition_responses]
    assert codes == [E.unknown_server_error, E.unknown_server_error]
    assert h.state.partition("orders", 0).log.log_end_offset == 0  # type: ignore[union-attr]


# -- Produce v13: topics by id -------------------------------------------------------------


def produce_v13(h: Harness, topic_id: object, partitions: list[int], node: int = 0) -> object:
    req = h.request(
        PRODUCE,
        13,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 1000,
            "topic_data": [
                {
                    "topic_id": topic_id,
                    "partition_data": [
                        {"index": p, "records": make_batch(0, 1)} for p in partitions
                    ],
                }
            ],
        },
    )
    return h.call(node, req)  # type: ignore[arg-type]


def test_produce_v13_names_the_topic_by_id(h: Harness) -> None:
    topic_id = h.state.topics["orders"].topic_id
    leader = h.leader_of("orders", 2)
    resp = produce_v13(h, topic_id, [2], leader)
    (topic,) = resp.responses  # type: ignore[attr-defined]
    assert topic.topic_id == topic_id
    assert [(p.index, p.error_code, p.base_offset) for p in topic.partition_responses] == [
        (2, E.none, 0)
    ]
    part = h.state.partition("orders", 2)
    assert part is not None and part.log.log_end_offset == 1


def test_produce_v13_unknown_topic_id_and_partition(h: Harness) -> None:
    import uuid

    bogus = uuid.UUID(int=7)
    resp = produce_v13(h, bogus, [0, 1])
    (topic,) = resp.responses  # type: ignore[attr-defined]
    assert topic.topic_id == bogus
    assert [p.error_code for p in topic.partition_responses] == [E.unknown_topic_id] * 2
    known = h.state.topics["orders"].topic_id
    resp = produce_v13(h, known, [99])
    assert resp.responses[0].partition_responses[0].error_code == E.unknown_topic_or_partition  # type: ignore[attr-defined]
