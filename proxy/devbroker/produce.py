"""Produce (v3+, record batch v2) and InitProducerId, as Apache Kafka's broker answers them.

Batches are stored as the raw bytes received; the log assigns base offsets by
rewriting the batch header (the CRC does not cover it).  Validation follows
Kafka's ProduceRequest.validateRecords and LogValidator on the parts the
header shows: exactly one v2 batch per partition, zstd only from v7, CRC,
record count, max.message.bytes, and idempotent producer sequences (duplicates
of one of the last five batches are acknowledged with their original offset).

Sans-I/O: no trio here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from ..protocol import codec, records
from .build import build
from .log import CorruptRecords
from .outcome import Close, NoReply
from .versions import INIT_PRODUCER_ID, PRODUCE

if TYPE_CHECKING:
    from .node import NodeDispatcher, Request

MAX_MESSAGE_BYTES = 1048588  # Kafka's message.max.bytes / max.message.bytes default
ZSTD = 4


def _validate_record_set(
    version: int, data: bytes | None
) -> tuple[E, str | None, records.BatchHeader | None]:
    """Kafka's ProduceRequest.validateRecords plus the header checks of LogValidator."""
    if not data:
        return (
            E.invalid_record,
            f"Produce requests with version {version} must have at least one record batch per partition",
            None,
        )
    try:
        # Whole batches only; a partial trailing batch means the set is corrupt.
        headers = list(records.iter_batches(data))
    except records.InvalidRecordBatch as exc:
        if len(data) > 16 and data[16] != records.MAGIC_V2:
            return (
                E.invalid_record,
                f"Produce requests with version {version} are only allowed to contain record batches with magic version 2",
                None,
            )
        return E.corrupt_message, str(exc), None
    if not headers:
        return E.corrupt_message, "record set holds no complete batch", None
    first = headers[0]
    if first.compression == ZSTD and version < 7:
        return (
            E.unsupported_compression_type,
            "Produce requests with version < 7 cannot use ZStandard compression",
            None,
        )
    if len(headers) > 1 or headers[-1].end != len(data):
        return (
            E.invalid_record,
            f"Produce requests with version {version} are only allowed to contain exactly one record batch per partition",
            None,
        )
    if first.size > MAX_MESSAGE_BYTES:
        return E.message_too_large, None, None
    if not records.verify_crc(data, first):
        return E.corrupt_message, "Record batch CRC mismatch", None
    if first.is_transactional:
        return E.invalid_txn_state, "The dev cluster does not implement transactions", None
    return E.none, None, first


def _produce_partition(
    node: NodeDispatcher, version: int, acks: int, topic: str, index: int, data: bytes | None
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
    error, message, header = _validate_record_set(version, data)
    if error:
        return out | {"error_code": error, "error_message": message}
    if part.leader != node.node_id:
        out["current_leader"] = {"leader_id": part.leader, "leader_epoch": part.leader_epoch}
        return out | {"error_code": E.not_leader_or_follower}
    if acks not in (-1, 0, 1):
        return out | {"error_code": E.invalid_required_acks}
    assert header is not None and data is not None
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
        result = part.log.append(bytes(data), part.leader_epoch)
    except CorruptRecords as exc:
        return out | {"error_code": E.corrupt_message, "error_message": str(exc)}
    if states is not None:
        states.record(header, result.base_offset)
    return out | {
        "error_code": E.none,
        "base_offset": result.base_offset,
        "log_start_offset": part.log.log_start_offset,
    }


def handle_produce(node: NodeDispatcher, req: Request) -> Any:
    body = req.body
    acks = body.acks
    responses = []
    failed = False
    leaders: set[int] = set()
    for t in body.topic_data:
        parts = []
        for p in t.partition_data:
            r = _produce_partition(node, req.version, acks, t.name, p.index, p.records)
            if r["error_code"]:
                failed = True
            if r["error_code"] == E.not_leader_or_follower:
                leaders.add(r["current_leader"]["leader_id"])
            parts.append(r)
        responses.append({"name": t.name, "partition_responses": parts})
    if body.transactional_id is not None and not failed:
        pass  # a transactional batch was refused above; plain batches ignore the id as Kafka does
    if acks == 0:
        # Kafka sends nothing for acks=0, and closes the connection when anything
        # failed so that the producer notices.
        return Close("acks=0 produce request failed") if failed else NoReply()
    endpoints = []
    for n in sorted(leaders):
        if n in node.state.addresses and n not in node.state.stopped_nodes:
            host, port = node.state.addresses[n]
            endpoints.append({"node_id": n, "host": host, "port": port, "rack": None})
    cls = codec.response_schema(PRODUCE, req.version)
    return build(cls, {"responses": responses, "throttle_time": 0, "node_endpoints": endpoints})


def handle_init_producer_id(node: NodeDispatcher, req: Request) -> Any:
    cls = codec.response_schema(INIT_PRODUCER_ID, req.version)
    if req.body.transactional_id is not None:
        # Transactions are not implemented: no node coordinates a transactional id
        # (FindCoordinator answers COORDINATOR_NOT_AVAILABLE for them).
        return build(
            cls,
            {
                "throttle_time": 0,
                "error_code": E.not_coordinator,
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
