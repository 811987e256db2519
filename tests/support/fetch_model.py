"""Fetch requests and responses as kio objects, v2 batches, and a one-topic model broker.

Used by the shaping tests: :func:`make_request`, :func:`make_partition` and
:func:`make_response` build Fetch messages of any version (topic ids from v13),
:func:`delivered` lists the whole batches a response carries, and
:class:`ModelBroker` answers a Fetch the way Kafka's readFromLog does, over the
dev broker's partition logs (``devbroker.log.PartitionLog``).
"""

from __future__ import annotations

import importlib
import struct
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from crc32c import crc32c
from kio.schema.errors import ErrorCode

from devbroker.log import PartitionLog
from proxy.protocol import records
from proxy.protocol.partition_key import PartitionKey

TOPIC_ID = uuid.UUID("00000000-0000-0000-0000-00000000000a")


def batch(
    base_offset: int,
    count: int,
    *,
    payload: int = 10,
    attributes: int = 0,
    producer_id: int = -1,
    epoch: int = 0,
) -> bytes:
    """A valid v2 batch of *count* records with an opaque body of *payload* bytes."""
    after_crc = struct.pack(
        ">hiqqqhii", attributes, count - 1, 1000, 1000 + count, producer_id, 0, -1, count
    ) + bytes((base_offset + i) % 251 for i in range(payload))
    body = struct.pack(">ibI", epoch, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", base_offset, len(body)) + body


def control(base_offset: int, producer_id: int) -> bytes:
    return batch(
        base_offset,
        1,
        attributes=records.CONTROL_MASK | records.TRANSACTIONAL_MASK,
        producer_id=producer_id,
    )


def txn(base_offset: int, count: int, producer_id: int, payload: int = 10) -> bytes:
    return batch(
        base_offset,
        count,
        attributes=records.TRANSACTIONAL_MASK,
        producer_id=producer_id,
        payload=payload,
    )


def schema(version: int, kind: str) -> Any:
    return importlib.import_module(f"kio.schema.fetch.v{version}.{kind}")


def topic_name_or_id(version: int, name: str = "t") -> str | uuid.UUID:
    return TOPIC_ID if version >= 13 else name


def tkey_field(version: int) -> str:
    return "topic_id" if version >= 13 else "topic"


def make_request(
    version: int,
    partitions: Mapping[int, tuple[int, int]],
    *,
    max_bytes: int = 2**31 - 1,
    session_epoch: int = -1,
    isolation_level: int = 0,
    topic: str | uuid.UUID | None = None,
) -> Any:
    """partitions: index -> (fetch offset, partition max bytes)."""
    mod = schema(version, "request")
    tk = topic if topic is not None else topic_name_or_id(version)
    parts = tuple(
        mod.FetchPartition(partition=i, fetch_offset=off, partition_max_bytes=pmax)
        for i, (off, pmax) in partitions.items()
    )
    kwargs: dict[str, Any] = {
        "max_wait": 0,
        "min_bytes": 1,
        "max_bytes": max_bytes,
        "isolation_level": isolation_level,
        "topics": (mod.FetchTopic(**{tkey_field(version): tk, "partitions": parts}),),
    }
    if version >= 7:
        kwargs["session_epoch"] = session_epoch
        kwargs["forgotten_topics_data"] = ()
    import datetime

    kwargs["max_wait"] = datetime.timedelta(0)
    return mod.FetchRequest(**kwargs)


def make_partition(
    version: int,
    index: int,
    data: bytes | None,
    *,
    hw: int = 1000,
    error: int = 0,
    aborted: Sequence[tuple[int, int]] | None = None,
    leader_epoch: int | None = None,
) -> Any:
    mod = schema(version, "response")
    kwargs: dict[str, Any] = {
        "partition_index": index,
        "error_code": ErrorCode(error),
        "high_watermark": hw,
        "last_stable_offset": hw,
        "aborted_transactions": None
        if aborted is None
        else tuple(mod.AbortedTransaction(producer_id=p, first_offset=f) for p, f in aborted),
        "records": data,
    }
    if version >= 5:
        kwargs["log_start_offset"] = 0
    if leader_epoch is not None and version >= 12:
        kwargs["current_leader"] = mod.LeaderIdAndEpoch(leader_id=1, leader_epoch=leader_epoch)
    return mod.PartitionData(**kwargs)


def make_response(version: int, partitions: Sequence[Any], topic: Any = None) -> Any:
    import datetime

    mod = schema(version, "response")
    tk = topic if topic is not None else topic_name_or_id(version)
    kwargs: dict[str, Any] = {
        "throttle_time": datetime.timedelta(0),
        "responses": (
            mod.FetchableTopicResponse(
                **{tkey_field(version): tk, "partitions": tuple(partitions)}
            ),
        ),
    }
    if version >= 7:
        kwargs["error_code"] = ErrorCode(0)
        kwargs["session_id"] = 0
    return mod.FetchResponse(**kwargs)


def delivered(response: Any) -> dict[PartitionKey, list[bytes]]:
    """Delivered whole batches (raw bytes), by partition; asserts there is no partial tail."""
    from proxy.protocol.partition_key import topic_key

    out: dict[PartitionKey, list[bytes]] = {}
    for topic in response.responses:
        for pd in topic.partitions:
            data = pd.records or b""
            hs = list(records.iter_batches(data))
            assert (hs[-1].end if hs else 0) == len(data), "partial batch forwarded"
            out[(topic_key(topic), int(pd.partition_index))] = [
                bytes(data[h.position : h.end]) for h in hs
            ]
    return out


def marks(response: Any) -> dict[int, tuple[int, int, int]]:
    """(high watermark, last stable offset, log start offset) per partition of *response*."""
    return {
        int(pd.partition_index): (
            int(pd.high_watermark),
            int(pd.last_stable_offset),
            int(pd.log_start_offset),
        )
        for t in response.responses
        for pd in t.partitions
    }


def model_logs(spec: Sequence[Sequence[int]]) -> dict[int, PartitionLog]:
    """Partition logs for a ModelBroker: partition i holds one batch of each record count
    in ``spec[i]``, in order, at leader epoch 0."""
    logs = {i: PartitionLog() for i in range(len(spec))}
    for i, counts in enumerate(spec):
        for count in counts:
            logs[i].append(batch(0, count), leader_epoch=0)
    return logs


class ModelBroker:
    """Kafka's readFromLog over devbroker PartitionLogs, for one topic."""

    def __init__(
        self, version: int, logs: Mapping[int, PartitionLog], *, session_order: bool = False
    ) -> None:
        """*session_order*: read partitions in the order of an incremental fetch
        session, moving those that returned data to the end (KIP-227), instead
        of the request's order."""
        self.version = version
        self.logs = logs
        self.bytes_sent = 0
        self.whole_bytes_sent = 0
        self.session_order = session_order
        self._order: list[int] = []

    def fetch(self, request: Any) -> Any:
        limit = int(request.max_bytes)
        min_one = True
        parts = []
        wanted = [p for topic in request.topics for p in topic.partitions]
        if self.session_order:
            by_index = {int(p.partition): p for p in wanted}
            self._order = [i for i in self._order if i in by_index]
            self._order += [i for i in by_index if i not in self._order]
            wanted = [by_index[i] for i in self._order]
        returned = []
        for p in wanted:
            if True:
                log = self.logs[int(p.partition)]
                data = bytes(
                    log.read(
                        int(p.fetch_offset),
                        min(int(p.partition_max_bytes), limit),
                        min_one_message=min_one,
                    )
                )
                if data:
                    min_one = False
                    returned.append(int(p.partition))
                limit = max(0, limit - len(data))
                self.bytes_sent += len(data)
                self.whole_bytes_sent += records.complete_prefix_size(data)
                parts.append(
                    make_partition(self.version, int(p.partition), data, hw=log.high_watermark)
                )
        if self.session_order:
            self._order = [i for i in self._order if i not in returned] + returned
        return make_response(self.version, parts)
