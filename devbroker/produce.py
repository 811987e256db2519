"""Produce (v3+, record batch v2; topic ids from v13) and InitProducerId, as Apache Kafka's broker answers them.

Batches are stored as the raw bytes received; the log assigns base offsets by
rewriting the batch header (the CRC does not cover it).  Validation follows
Kafka's ProduceRequest.validateRecords and LogValidator on the parts the
header shows: exactly one v2 batch per partition, zstd only from v7, CRC,
record count, max.message.bytes, and idempotent producer sequences (duplicates
of one of the last five batches are acknowledged with their original offset).
The answer lists partitions in the order Kafka's hash maps give them
(:func:`_kafka_order`, observed on Kafka 4.4 with acks=-1).

Sans-I/O: no trio here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from proxy.protocol import codec, records
from proxy.protocol.apis import INIT_PRODUCER_ID, PRODUCE

from .build import build
from .jvm_order import (
    champ_order,
    mutable_hash_map_order,
    topic_id_partition_hash,
)
from .log import CorruptRecords, record_timestamps
from .outcome import Close, NoReply

if TYPE_CHECKING:
    from .node import NodeDispatcher, Request
    from .state import PartitionState

MAX_MESSAGE_BYTES = 1048588  # Kafka's message.max.bytes / max.message.bytes default
TIMESTAMP_AFTER_MAX_MS = 3_600_000  # log.message.timestamp.after.max.ms (Kafka 4.x default)
# log.message.timestamp.before.max.ms defaults to Long.MAX_VALUE: no lower bound.
NO_TIMESTAMP = -1
ZSTD = 4


RECORD_OVERHEAD_V0 = 14  # LegacyRecord.RECORD_OVERHEAD_V0: the smallest size a batch may claim
MAGIC_OFFSET = 16
Check = tuple[E, str | None]
Answer = tuple[Any, str | None, int, dict[str, Any]]
"""(topic id, topic name, partition, partition answer) of one produced partition."""
OK: Check = (E.none, None)


def validate_records(version: int, data: bytes | None) -> tuple[Check, bytes]:
    """Kafka's ProduceRequest.validateRecords (v3+), iterating batches as ByteBufferLogInputStream.

    Returns the check and the single batch (Kafka's log drops a trailing
    partial batch, trimInvalidBytes, so only whole-batch bytes are kept).
    """
    buf = data or b""
    pos, batches = 0, []
    while len(buf) - pos >= records.LOG_OVERHEAD:
        size = int.from_bytes(buf[pos + 8 : pos + 12], "big", signed=True)
        if size < RECORD_OVERHEAD_V0:
            return (
                E.corrupt_message,
                f"Record size {size} is less than the minimum record overhead",
            ), b""
        if len(buf) - pos <= MAGIC_OFFSET:
            break
        magic = buf[pos + MAGIC_OFFSET]
        if magic > records.MAGIC_V2:
            return (E.corrupt_message, f"Invalid magic found in record: {magic}"), b""
        if len(buf) - pos < records.LOG_OVERHEAD + size:
            break
        batches.append((pos, magic, records.LOG_OVERHEAD + size))
        pos += records.LOG_OVERHEAD + size
    if not batches:
        return (
            E.invalid_record,
            f"Produce requests with version {version} must have at least one record batch per partition",
        ), b""
    first_pos, magic, size = batches[0]
    if magic != records.MAGIC_V2:
        return (
            E.invalid_record,
            f"Produce requests with version {version} are only allowed to contain record batches with magic version 2",
        ), b""
    if (
        version < 7
        and len(buf) > first_pos + 22
        and buf[first_pos + 22] & records.COMPRESSION_MASK == ZSTD
    ):
        return (
            E.unsupported_compression_type,
            f"Produce requests with version {version} are not allowed to use ZStandard compression",
        ), b""
    if len(batches) > 1:
        return (
            E.invalid_record,
            f"Produce requests with version {version} are only allowed to contain exactly one record batch per partition",
        ), b""
    return OK, bytes(buf[first_pos : first_pos + size])


def validate_batch(batch: bytes, where: str = "") -> tuple[Check, records.BatchHeader | None]:
    """The leader's checks before appending (UnifiedLog.analyzeAndValidateRecords, LogValidator).

    *where* names the partition ("topic-index") in messages.
    """
    base_offset = int.from_bytes(batch[:8], "big", signed=True)
    if base_offset != 0:
        return (
            E.invalid_record,
            f"The baseOffset of the record batch in the append to {where} should be 0,"
            f" but it is {base_offset}",
        ), None
    if len(batch) > MAX_MESSAGE_BYTES:
        return (
            E.message_too_large,
            f"The record batch size {len(batch)} exceeds the maximum {MAX_MESSAGE_BYTES}",
        ), None
    try:
        h = records.read_batch_header(batch)
    except records.InvalidRecordBatch as exc:
        return (E.corrupt_message, f"Record batch is corrupt: {exc}"), None
    if not records.verify_crc(batch, h):
        return (
            E.corrupt_message,
            "Record is corrupt (stored crc does not match the computed crc)",
        ), None
    if h.compression not in records.COMPRESSION_NAMES:
        # CompressionType.forId throws IllegalArgumentException: an unexpected error.
        return (E.unknown_server_error, f"Unknown compression type id: {h.compression}"), None
    if h.last_offset_delta < 0:
        return (E.invalid_record, "Batch has an invalid offset range"), None
    if h.records_count <= 0:
        return (
            E.invalid_record,
            f"Invalid reported count for record batch: {h.records_count}",
        ), None
    if h.records_count != h.last_offset_delta + 1:
        return (E.invalid_record, "Inconsistent batch offset range and count of records"), None
    if h.is_control:
        return (E.invalid_record, "Clients are not allowed to write control records"), None
    if h.producer_id >= 0 and h.base_sequence < 0:
        return (E.invalid_record, f"Invalid sequence number {h.base_sequence}"), None
    return OK, h


def invalid_timestamps(batch: bytes, h: records.BatchHeader, now_ms: int) -> list[int]:
    """LogValidator.validateTimestamp for a CreateTime topic: indexes of records too far ahead.

    Record timestamps are read from uncompressed and gzip batches; for other
    codecs (whose decoders are not dependencies) and unparsable bodies the
    batch's max timestamp stands for its last record.
    """
    limit = now_ms + TIMESTAMP_AFTER_MAX_MS
    stamps = record_timestamps(batch, h, 0)
    if stamps is None:
        late = h.max_timestamp != NO_TIMESTAMP and h.max_timestamp > limit
        return [h.records_count - 1] if late else []
    return [i for i, (_off, ts) in enumerate(stamps) if ts != NO_TIMESTAMP and ts > limit]


def _produce_partition(
    node: NodeDispatcher,
    version: int,
    acks: int,
    transactional_id: str | None,
    topic: str,
    index: int,
    data: bytes | None,
    now: float,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "index": index,
        "base_offset": -1,
        "log_append_time": None,
        "log_start_offset": -1,
        "record_errors": [],
        "error_message": None,
    }
    part = node.state.partition(topic, index)
    if part is None:
        return out | {"error_code": E.unknown_topic_or_partition}
    (error, _message), batch = validate_records(version, data)
    if error:
        # KafkaApis keeps only the error code of validateRecords' exception.
        return out | {"error_code": error}
    if acks not in (-1, 0, 1):
        return out | {"error_code": E.invalid_required_acks}
    if part.leader != node.node_id:
        out["current_leader"] = {"leader_id": part.leader, "leader_epoch": part.leader_epoch}
        return out | {"error_code": E.not_leader_or_follower}
    (error, message), header = validate_batch(batch, f"{topic}-{index}")
    if error:
        return out | {"error_code": error, "error_message": message}
    assert header is not None
    late = invalid_timestamps(batch, header, int(node.wall_clock() * 1000))
    if late:
        limit = int(node.wall_clock() * 1000) + TIMESTAMP_AFTER_MAX_MS
        return out | {
            "error_code": E.invalid_timestamp,
            "error_message": "One or more records have been rejected due to invalid timestamp",
            "record_errors": [
                {
                    "batch_index": i,
                    "batch_index_error_message": f"Timestamp of record {i} is after {limit}",
                }
                for i in late
            ],
        }
    if header.is_transactional:
        if not _ongoing(part, header):
            # AddPartitionsToTxnManager: the partition must be in the producer's transaction
            # (asked only when this partition has no open transaction of this producer epoch);
            # from v12 (transactions V2) the leader adds it to the transaction instead.
            error = node.coordinator.transactions.verify(
                transactional_id,
                header.producer_id,
                header.producer_epoch,
                (topic, index),
                generic=version > 10,
                add_at=now if version > 11 else None,
            )
            if error == E.invalid_txn_state:
                return out | {
                    "error_code": error,
                    "error_message": "Partition was not added to the transaction",
                }
            if error in (E.concurrent_transactions, E.not_coordinator, E.coordinator_not_available):
                # ReplicaManager: retriable verification failures old clients may not retry.
                return out | {"error_code": E.not_enough_replicas}
            if error:
                return out | {"error_code": error}
    elif header.producer_id in part.log.ongoing:
        return out | {
            "error_code": E.invalid_txn_state,
            "error_message": f"Expected transactional write from producer {header.producer_id}",
        }
    states = part.producers if header.producer_id >= 0 else None
    if states is not None:
        seq_error, duplicate_of = states.check(header)
        if seq_error:
            return out | {"error_code": seq_error}
        if duplicate_of is not None:
            return out | {
                "error_code": E.none,
                "base_offset": duplicate_of,
                "log_start_offset": part.log.log_start_offset,
            }
    try:
        result = part.log.append(batch, part.leader_epoch)
    except CorruptRecords as exc:
        return out | {"error_code": E.corrupt_message, "error_message": str(exc)}
    if states is not None:
        states.record(header, result.base_offset)
    return out | {
        "error_code": E.none,
        "base_offset": result.base_offset,
        "log_start_offset": part.log.log_start_offset,
    }


def _topic_name(node: NodeDispatcher, version: int, topic: Any) -> str | None:
    """The topic a produce request names: by name before v13, by id from v13 (None: unknown id)."""
    if version < 13:
        return str(topic.name)
    known = node.state.topics_by_id.get(topic.topic_id) if topic.topic_id is not None else None
    return known.name if known is not None else None


def _known(node: NodeDispatcher, name: str | None, index: int) -> bool:
    return name is not None and node.state.partition(name, index) is not None


def handle_produce(node: NodeDispatcher, req: Request) -> Any:
    body = req.body
    acks = body.acks
    named = [(_topic_name(node, req.version, t), t) for t in body.topic_data]
    # KafkaApis: transactional records need a transactional id (an authorized one).
    txn_refused = body.transactional_id is None and any(
        _first_batch_transactional(p.records) for t in body.topic_data for p in t.partition_data
    )
    # ProduceRequest.validateRecords reads the codec for its ZStandard check (< v7);
    # CompressionType.forId throws out of KafkaApis: the whole request fails.
    codec_refused = (
        not txn_refused
        and req.version < 7
        and any(
            _first_batch_codec(p.records) > ZSTD
            for name, t in named
            for p in t.partition_data
            if _known(node, name, p.index)
        )
    )
    # ReplicaManager: the transactional batches of one request come from one producer.
    pid_refused = not (txn_refused or codec_refused) and (
        len(
            {
                _first_batch_producer(p.records)
                for name, t in named
                for p in t.partition_data
                if _known(node, name, p.index)
                and _first_batch_transactional(p.records)
                and not validate_records(req.version, p.records)[0][0]
            }
        )
        > 1
    )
    # Partitions are keyed by topic-partition, as KafkaApis' maps: one answer each,
    # the last records listed for a partition are the ones written.  From v13 topics
    # are named by id; an id this cluster does not know is UNKNOWN_TOPIC_ID.
    wanted: dict[Any, tuple[str | None, Any, dict[int, bytes | None]]] = {}
    for name, t in named:
        key = t.topic_id if req.version >= 13 else name
        entry = wanted.setdefault(key, (name, t, {}))
        for p in t.partition_data:
            entry[2][p.index] = p.records
    answers: list[Answer] = []
    missing: set[int] = set()  # positions in answers: KafkaApis' nonExistingTopicResponses
    invalid: set[int] = set()  # ... and its invalidRequestResponses
    failed = False
    leaders: set[int] = set()
    for name, t, partitions in wanted.values():
        if req.version >= 13:
            topic_id = t.topic_id
        else:
            known = node.state.topics.get(name) if name is not None else None
            topic_id = known.topic_id if known is not None else None
        for index, data in partitions.items():
            if name is None or not _known(node, name, index):
                missing.add(len(answers))
            elif validate_records(req.version, data)[0][0]:
                invalid.add(len(answers))
            if txn_refused or codec_refused or pid_refused or name is None:
                r: dict[str, Any] = {
                    "index": index,
                    "error_code": E.transactional_id_authorization_failed
                    if txn_refused
                    else E.unknown_server_error
                    if codec_refused
                    else E.invalid_producer_id_mapping
                    if pid_refused
                    else E.unknown_topic_id,
                    "base_offset": -1,
                    "log_append_time": None,
                    "log_start_offset": -1,
                    "record_errors": [],
                    "error_message": None,
                }
            else:
                r = _produce_partition(
                    node, req.version, acks, body.transactional_id, name, index, data, req.now
                )
            if r["error_code"]:
                failed = True
            if r["error_code"] == E.not_leader_or_follower:
                leaders.add(r["current_leader"]["leader_id"])
            answers.append((topic_id, t.name if req.version < 13 else name, index, r))
    if not (txn_refused or codec_refused):  # those fail the request as a whole, as asked
        answers = _kafka_order(answers, missing, invalid)
    responses: list[dict[str, Any]] = []
    by_topic: dict[Any, dict[str, Any]] = {}
    for topic_id, name, _index, r in answers:
        key = topic_id if req.version >= 13 else name
        if key not in by_topic:
            by_topic[key] = {"name": name, "topic_id": topic_id, "partition_responses": []}
            responses.append(by_topic[key])
        by_topic[key]["partition_responses"].append(r)
    if acks == 0:
        # Kafka sends nothing for acks=0, and closes the connection when anything
        # failed so that the producer notices.
        return (
            Close("acks=0 produce request failed", "produce_failed_acks_0") if failed else NoReply()
        )
    endpoints = []
    for n in sorted(leaders):
        if n in node.state.addresses and n not in node.state.stopped_nodes:
            host, port = node.state.addresses[n]
            endpoints.append({"node_id": n, "host": host, "port": port, "rack": None})
    cls = codec.response_schema(PRODUCE, req.version)
    return build(cls, {"responses": responses, "throttle_time": 0, "node_endpoints": endpoints})


def _kafka_order(answers: list[Answer], missing: set[int], invalid: set[int]) -> list[Answer]:
    """The order Kafka 4.4 lists a Produce answer's partitions in (acks=-1, checked against it).

    The partitions ReplicaManager appended come back in a java.util.HashMap
    (DelayedProduce.onComplete), up to 12 of them in 16 buckets; KafkaApis adds the unknown ones and those that
    failed validateRecords (two mutable.HashMaps) into an immutable Map, which keeps
    that order up to four entries and is a hash trie beyond; ProduceResponse then
    groups the iteration by topic.  Keys are TopicIdPartitions.
    """

    def tip_hash(answer: Answer) -> int:
        return topic_id_partition_hash(answer[0], answer[1], answer[2])

    appended = [a for i, a in enumerate(answers) if i not in missing and i not in invalid]
    merged = [
        # A java.util.HashMap filled from a Scala mutable.HashMap: the same buckets,
        # and inside a bucket the Scala map's ascending hash order.
        *mutable_hash_map_order(appended, tip_hash),
        *mutable_hash_map_order([answers[i] for i in sorted(missing)], tip_hash),
        *mutable_hash_map_order([answers[i] for i in sorted(invalid)], tip_hash),
    ]
    return merged if len(merged) <= 4 else champ_order(merged, tip_hash)


def _ongoing(part: PartitionState, h: records.BatchHeader) -> bool:
    """UnifiedLog.hasOngoingTransaction: this producer epoch has an open transaction here."""
    entry = part.producers.entries.get(h.producer_id)
    return (
        h.producer_id in part.log.ongoing and entry is not None and entry.epoch == h.producer_epoch
    )


def _first_batch_codec(data: bytes | None) -> int:
    """The compression codec id of the first v2 batch (-1 when there is none to read)."""
    if data is None or len(data) <= 22 or data[MAGIC_OFFSET] != records.MAGIC_V2:
        return -1
    return data[22] & records.COMPRESSION_MASK


def _first_batch_producer(data: bytes | None) -> tuple[int, int]:
    """(producer id, producer epoch) of the first batch (call only for v2 batches)."""
    assert data is not None
    return (
        int.from_bytes(data[43:51], "big", signed=True),
        int.from_bytes(data[51:53], "big", signed=True),
    )


def _first_batch_transactional(data: bytes | None) -> bool:
    """ProduceRequest's hasTransactionalRecords, from the first batch's attributes."""
    return (
        data is not None
        and len(data) > 22
        and data[MAGIC_OFFSET] == records.MAGIC_V2
        and bool(data[22] & records.TRANSACTIONAL_MASK)
    )


def handle_init_producer_id(node: NodeDispatcher, req: Request) -> Any:
    cls = codec.response_schema(INIT_PRODUCER_ID, req.version)
    if req.body.transactional_id is not None:
        return node.coordinator.transactions.init_producer_id(node.node_id, req)
    pid_given = int(getattr(req.body, "producer_id", -1)) != -1
    epoch_given = int(getattr(req.body, "producer_epoch", -1)) != -1
    if pid_given != epoch_given:
        # KafkaApis: a producer id without an epoch (or the reverse) is an invalid request.
        return build(
            cls,
            {
                "throttle_time": 0,
                "error_code": E.invalid_request,
                "producer_id": -1,
                "producer_epoch": -1,
            },
        )
    pid = node.state.allocate_producer_id()
    return build(
        cls, {"throttle_time": 0, "error_code": E.none, "producer_id": pid, "producer_epoch": 0}
    )


HANDLERS: dict[int, Callable[[NodeDispatcher, Request], Any]] = {
    PRODUCE: handle_produce,
    INIT_PRODUCER_ID: handle_init_producer_id,
}
