"""A small, independent model Kafka broker for testing the upstream session translator.

It follows KIP-227 as Apache Kafka implements it (FetchManager, FetchContext,
CachedPartition.maybeUpdateResponseData) over a model log whose "records" are
readable bytes, and can also answer sessionlessly, which is the reference the
translator's synthesized full responses must equal.  Written from the Kafka
sources' behaviour, not from proxy.sessions, so that shared mistakes show.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from proxy.protocol.codec import (
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    response_schema,
)

OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
UNKNOWN_TOPIC_ID = 100
FETCH_SESSION_TOPIC_ID_ERROR = 106
PRE_READ_ERRORS = (UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID)


@dataclass
class ModelPartition:
    high_watermark: int = 0
    last_stable_offset: int = 0
    log_start_offset: int = 0
    preferred_replica: bool = False


@dataclass
class ModelTopic:
    name: str
    topic_id: uuid.UUID
    partitions: list[ModelPartition]


@dataclass
class CachedPart:
    fetch_offset: int
    max_bytes: int
    high_watermark: int = -1
    log_start_offset: int = -1


@dataclass
class ModelSession:
    session_id: int
    epoch: int
    uses_ids: bool
    parts: dict[tuple[Any, int], CachedPart] = field(default_factory=dict)


def _mod(version: int) -> ModuleType:
    import sys

    return sys.modules[response_schema(1, version).__module__]


def _next_epoch(e: int) -> int:
    return 1 if e == 2**31 - 1 else e + 1


class ModelBroker:
    def __init__(self, topics: dict[str, int]) -> None:
        self.topics = {
            name: ModelTopic(name, uuid.uuid4(), [ModelPartition() for _ in range(n)])
            for name, n in topics.items()
        }
        self.sessions: dict[int, ModelSession] = {}
        self._next_id = 1000
        self.cache_full = False
        # One-shot faults
        self.throttle_next = 0
        self.corrupt_next = False
        self.throttled_last = 0
        self.requests_seen = 0

    # -- state changes ------------------------------------------------------------------

    def produce(self, topic: str, p: int, n: int, transactional: bool = False) -> None:
        part = self.topics[topic].partitions[p]
        part.high_watermark += n
        if not transactional and part.last_stable_offset == part.high_watermark - n:
            part.last_stable_offset = part.high_watermark

    def commit(self, topic: str, p: int) -> None:
        """Write a transaction marker: the HW moves with the LSO (as on a real broker)."""
        part = self.topics[topic].partitions[p]
        part.high_watermark += 1
        part.last_stable_offset = part.high_watermark

    def delete_records(self, topic: str, p: int, n: int) -> None:
        part = self.topics[topic].partitions[p]
        part.log_start_offset = min(part.high_watermark, part.log_start_offset + n)

    def by_id(self, topic_id: uuid.UUID) -> ModelTopic | None:
        for t in self.topics.values():
            if t.topic_id == topic_id:
                return t
        return None

    # -- reading ------------------------------------------------------------------------

    def read(
        self, topic_ref: Any, p: int, offset: int, max_bytes: int, *, committed: bool, rack: str
    ) -> dict[str, Any]:
        """One partition's response fields, as ReplicaManager.readFromLog would produce them."""
        topic = (
            self.by_id(topic_ref)
            if isinstance(topic_ref, uuid.UUID)
            else self.topics.get(topic_ref)
        )
        if topic is None or p >= len(topic.partitions):
            code = (
                UNKNOWN_TOPIC_ID if isinstance(topic_ref, uuid.UUID) else UNKNOWN_TOPIC_OR_PARTITION
            )
            return self.error(code)
        part = topic.partitions[p]
        if offset < part.log_start_offset or offset > part.high_watermark:
            return self.error(OFFSET_OUT_OF_RANGE)
        limit = part.last_stable_offset if committed else part.high_watermark
        end = min(limit, offset + max_bytes)
        records = f"{topic.name}/{p}@{offset}..{end}".encode() if end > offset else b""
        aborted: tuple[tuple[int, int], ...] | None = None
        if committed:
            aborted = ((7, offset),) if records and offset % 2 == 0 else ()
        return {
            "error_code": 0,
            "high_watermark": part.high_watermark,
            "last_stable_offset": part.last_stable_offset,
            "log_start_offset": part.log_start_offset,
            "aborted": aborted,
            "preferred": 2 if part.preferred_replica and rack else -1,
            "records": records,
        }

    @staticmethod
    def error(code: int) -> dict[str, Any]:
        return {
            "error_code": code,
            "high_watermark": -1,
            "last_stable_offset": -1,
            "log_start_offset": -1,
            "aborted": None,
            "preferred": -1,
            # Refused before reading (KafkaApis' "erroneous"): null records; read errors: empty.
            "records": None if code in PRE_READ_ERRORS else b"",
        }

    # -- request handling ---------------------------------------------------------------

    def roundtrip(self, request: Any) -> Any:
        """Encode the request, decode it as a broker would, answer, and decode the answer."""
        frame = encode_request(request, 1, "test")
        _, decoded = decode_request(frame)
        response = self.handle(decoded)
        _, back = decode_response(1, int(request.__version__), encode_response(response, 1))
        return back

    def handle(self, req: Any) -> Any:
        self.requests_seen += 1
        self.throttled_last = 0
        version = int(req.__version__)
        uses_ids = version >= 13
        committed = int(req.isolation_level) == 1
        rack = getattr(req, "rack_id", "")
        sid = int(getattr(req, "session_id", 0))
        epoch = int(getattr(req, "session_epoch", -1))
        fetch_data = {
            (t.topic_id if uses_ids else t.topic, int(p.partition)): (
                int(p.fetch_offset),
                int(p.partition_max_bytes),
            )
            for t in req.topics
            for p in t.partitions
        }
        forget = [
            (t.topic_id if uses_ids else t.topic, int(p))
            for t in getattr(req, "forgotten_topics_data", ())
            for p in t.partitions
        ]

        def reads(items: Any) -> list[tuple[tuple[Any, int], dict[str, Any]]]:
            return [
                (k, self.read(k[0], k[1], off, mb, committed=committed, rack=rack))
                for k, (off, mb) in items
            ]

        if epoch in (0, -1):
            self.sessions.pop(sid, None)
            if self.throttle_next:
                return self._throttled(version, 0)
            data = reads(fetch_data.items())
            new_id = 0
            if epoch == 0 and not self.cache_full and version >= 7:
                new_id = self._next_id
                self._next_id += 1
                s = ModelSession(new_id, 1, uses_ids)
                for k, resp in data:
                    off, mb = fetch_data[k]
                    s.parts[k] = CachedPart(
                        off, mb, resp["high_watermark"], resp["log_start_offset"]
                    )
                self.sessions[new_id] = s
            if self.corrupt_next and data:
                self.corrupt_next = False
                data = data[1:]  # a full response missing a partition
            return self._response(version, new_id, data, committed)

        session = self.sessions.get(sid)
        if session is None:
            return self._top_error(version, FETCH_SESSION_ID_NOT_FOUND)
        if session.epoch != epoch:
            return self._top_error(version, INVALID_FETCH_SESSION_EPOCH)
        if session.uses_ids != uses_ids:
            return self._top_error(version, FETCH_SESSION_TOPIC_ID_ERROR)
        for k, (off, mb) in fetch_data.items():
            if k in session.parts:
                session.parts[k].fetch_offset = off
                session.parts[k].max_bytes = mb
            else:
                session.parts[k] = CachedPart(off, mb)
        for k in forget:
            session.parts.pop(k, None)
        if not session.parts:
            del self.sessions[sid]
            return self._response(version, 0, reads(fetch_data.items()), committed)
        session.epoch = _next_epoch(session.epoch)
        if self.throttle_next:
            return self._throttled(version, sid)
        out = []
        for k, cp in list(session.parts.items()):
            resp = self.read(
                k[0], k[1], cp.fetch_offset, cp.max_bytes, committed=committed, rack=rack
            )
            must = bool(resp["records"])
            if cp.high_watermark != resp["high_watermark"]:
                must = True
                cp.high_watermark = resp["high_watermark"]
            if cp.log_start_offset != resp["log_start_offset"]:
                must = True
                cp.log_start_offset = resp["log_start_offset"]
            if resp["preferred"] != -1:
                must = True
            if resp["error_code"] != 0:
                cp.high_watermark = -1
                must = True
            if must:
                out.append((k, resp))
                if resp["records"]:
                    del session.parts[k]
                    session.parts[k] = cp  # move to the end
        if self.corrupt_next:
            self.corrupt_next = False
            out.append((("zz-extra", 0) if not uses_ids else (uuid.uuid4(), 0), self.error(3)))
        return self._response(version, sid, out, committed)

    def sessionless(self, req: Any) -> Any:
        """What a broker answers a sessionless full fetch, at the request's version."""
        version = int(req.__version__)
        uses_ids = version >= 13
        committed = int(req.isolation_level) == 1
        rack = getattr(req, "rack_id", "")
        if self.throttled_last:
            return self._throttled(version, 0, self.throttled_last)
        seen: dict[tuple[Any, int], tuple[int, int]] = {}
        for t in req.topics:
            for p in t.partitions:
                key = (t.topic_id if uses_ids else t.topic, int(p.partition))
                seen.setdefault(key, (int(p.fetch_offset), int(p.partition_max_bytes)))
        data = [
            (k, self.read(k[0], k[1], off, mb, committed=committed, rack=rack))
            for k, (off, mb) in seen.items()
        ]
        return self._response(version, 0, data, committed, count_throttle=False)

    # -- encoding -----------------------------------------------------------------------

    def _throttled(self, version: int, sid: int, throttle: int = 0) -> Any:
        if not throttle:
            self.throttle_next, throttle = 0, self.throttle_next
            self.throttled_last = throttle
        return _make(
            _mod(version).FetchResponse,
            throttle_time=timedelta(milliseconds=throttle),
            error_code=ErrorCode(0),
            session_id=sid,
            responses=(),
        )

    def _top_error(self, version: int, code: int) -> Any:
        return _make(
            _mod(version).FetchResponse,
            throttle_time=timedelta(0),
            error_code=ErrorCode(code),
            session_id=0,
            responses=(),
        )

    def _response(
        self,
        version: int,
        sid: int,
        data: list[tuple[tuple[Any, int], dict[str, Any]]],
        committed: bool,
        count_throttle: bool = True,
    ) -> Any:
        mod = _mod(version)
        # KafkaApis answers the partitions it refused before reading after the others.
        data = sorted(data, key=lambda item: item[1]["error_code"] in PRE_READ_ERRORS)
        topics: list[Any] = []
        run: list[Any] = []
        current: Any = object()
        for (topic, p), r in data:
            if run and topic != current:
                topics.append(
                    _make(
                        mod.FetchableTopicResponse,
                        topic=current,
                        topic_id=current,
                        partitions=tuple(run),
                    )
                )
                run = []
            current = topic
            run.append(
                _make(
                    mod.PartitionData,
                    partition_index=p,
                    error_code=ErrorCode(r["error_code"]),
                    high_watermark=r["high_watermark"],
                    last_stable_offset=r["last_stable_offset"],
                    log_start_offset=r["log_start_offset"],
                    aborted_transactions=None
                    if r["aborted"] is None
                    else tuple(
                        mod.AbortedTransaction(producer_id=a, first_offset=b)
                        for a, b in r["aborted"]
                    ),
                    preferred_read_replica=r["preferred"],
                    records=r["records"],
                )
            )
        if run:
            topics.append(
                _make(
                    mod.FetchableTopicResponse,
                    topic=current,
                    topic_id=current,
                    partitions=tuple(run),
                )
            )
        return _make(
            mod.FetchResponse,
            throttle_time=timedelta(0),
            error_code=ErrorCode(0),
            session_id=sid,
            responses=tuple(topics),
        )


def _make(cls: Any, **kwargs: Any) -> Any:
    names = cls.__dataclass_fields__
    return cls(**{k: v for k, v in kwargs.items() if k in names})
