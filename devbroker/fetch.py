"""Fetch (v4+) for one dev-cluster node, as Apache Kafka's broker answers it.

Sans-I/O.  The trio edge calls :meth:`NodeFetcher.begin` with a decoded kio
FetchRequest, then :meth:`PendingFetch.poll` when the request arrives and each
time cluster state changes (a produce), and :meth:`PendingFetch.complete` once
poll returned True or ``max_wait_ms`` has passed.  The three steps follow
Kafka's broker:

- ``begin`` is ``KafkaApis.handleFetchRequest`` up to the read: the request's
  partitions are resolved (names for < v13, topic ids for v13+), the session
  context is made (``FetchManager.newContext``: session table, epoch checks,
  session update, see :mod:`proxy.sessions.as_broker_cache`, in the cache shard of
  :mod:`.session_cache`), and partitions that are
  unknown are set aside with UNKNOWN_TOPIC_ID / UNKNOWN_TOPIC_OR_PARTITION.
- ``poll`` is ``ReplicaManager.fetchMessages`` (first call: read the logs and
  answer at once when max_wait <= 0, nothing is readable, min_bytes are
  available, a partition has an error or a diverging epoch) and then
  ``DelayedFetch.tryComplete`` (later calls: bytes available per partition,
  capped by its max_bytes, against min_bytes; leadership / epoch changes).
- ``complete`` re-reads the logs if the fetch waited
  (``DelayedFetch.onComplete``), lets the session context pick the partitions
  to send (``updateAndGenerateResponseData``) and builds the response.

Each step has a ``*_in_ranges`` form (``begin_in_ranges``, ``poll_in_ranges``,
``complete_in_ranges``) that yields after every *every* partitions it walks, so
that the edge can serve other connections between two ranges; the plain forms run
all ranges at once.  The session context is made at one point of ``begin``, and
the session updated at one point of ``complete``
(``update_and_generate_response_data_in_ranges``).

Reads (``ReplicaManager.readFromLog``) go through the partitions in request
order (full fetch) or session order (incremental fetch), with the request's
max_bytes (capped at the broker's fetch.max.bytes) shrinking by what each
partition returned.  KIP-74: until a partition has returned data, the first
batch is returned whole even if larger than the limits (minOneMessage); after
that reads are byte-limited and may end in a partial trailing batch, but a
partition whose first batch does not fit returns nothing (Kafka replaces an
incomplete first entry with an empty record set for v3+).

Partition errors are Kafka's, in Kafka's order: UNKNOWN_TOPIC_ID (v13+ id not
known) and UNKNOWN_TOPIC_OR_PARTITION before reading (empty aborted list,
listed after the partitions that were read); then per read NOT_LEADER_OR_FOLLOWER,
INCONSISTENT_TOPIC_ID, FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH (checked
against current_leader_epoch), OFFSET_OUT_OF_RANGE, and a diverging epoch
when last_fetched_epoch disagrees with the leader epoch cache (rebuilt from
batch headers, so only requests carrying last_fetched_epoch pay for a scan).
From v16, NOT_LEADER_OR_FOLLOWER and FENCED_LEADER_EPOCH carry CurrentLeader
and the response lists the live leaders' NodeEndpoints (not to a follower, replica
id >= 0: Kafka sends followers no NodeEndpoints).

read_committed (isolation_level 1) reads up to the last stable offset and
returns the aborted transactions (producer id, first offset) that overlap the
returned range, as UnifiedLog.addAbortedTransactions collects them from the
transaction index (up to the offset index's upper bound for the bytes read).

Not modelled, because the dev cluster has none of it: replica selection
(preferred read replica), quotas and throttling, down-conversion (v4+ only),
tiered storage.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from kio.schema.errors import ErrorCode

from proxy.protocol import records
from proxy.protocol.apis import FETCH
from proxy.protocol.codec import drain
from proxy.protocol.error_codes import (
    FENCED_LEADER_EPOCH,
    INCONSISTENT_TOPIC_ID,
    NONE,
    NOT_LEADER_OR_FOLLOWER,
    OFFSET_OUT_OF_RANGE,
    UNKNOWN_LEADER_EPOCH,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from proxy.protocol.messages import make, response_module
from proxy.protocol.partition_plan import PartitionPlan, plan_of
from proxy.protocol.partition_result import PartitionResult
from proxy.sessions.as_broker_cache import (
    FetchContext,
    Ranges,
    SessionlessFetchContext,
    TopicIdPartition,
)

from .log import OffsetOutOfRange
from .session_cache import SessionIdOutOfRange
from .state import ClusterState, PartitionState

DEFAULT_FETCH_MAX_BYTES = 55 * 1024 * 1024  # broker fetch.max.bytes
CONSUMER_REPLICA_ID = -1
FUTURE_LOCAL_REPLICA_ID = -3

# Isolation (Kafka's FetchIsolation).
LOG_END = 0
HIGH_WATERMARK = 1
TXN_COMMITTED = 2

_ONE_MS = timedelta(milliseconds=1)


def _tick(every: int) -> Callable[[], bool]:
    """A counter of partitions walked: True at every *every*-th one (never when 0)."""
    done = 0

    def tick() -> bool:
        nonlocal done
        done += 1
        return bool(every) and done % every == 0

    return tick


@dataclass(slots=True)
class ReadResult:
    """One partition of the response before it becomes a kio PartitionData."""

    error: int
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    records: bytes = b""
    aborted_transactions: tuple[tuple[int, int], ...] | None = None
    """(producer id, first offset) pairs; None is a null list."""
    diverging_epoch: tuple[int, int] | None = None
    """(epoch, end_offset) when the fetch offset diverges from this log (KIP-320/595)."""
    current_leader: tuple[int, int] = (-1, -1)

    @property
    def records_size(self) -> int:
        return len(self.records)

    def outcome(self) -> PartitionResult:
        return PartitionResult(
            error_code=self.error,
            high_watermark=self.high_watermark,
            log_start_offset=self.log_start_offset,
            records_size=self.records_size,
            last_stable_offset=self.last_stable_offset,
            diverging_epoch=-1 if self.diverging_epoch is None else self.diverging_epoch[0],
        )


def _error_result(error: int) -> ReadResult:
    """A read that failed: unknown offsets, no records, a null aborted-transactions list."""
    return ReadResult(error)


def _refused(error: int) -> ReadResult:
    """A partition refused before reading (FetchResponse.partitionResponse).

    Its aborted-transactions list is the schema default (empty, not null); its
    null records become an empty record set when KafkaApis builds the response.
    """
    return ReadResult(error, aborted_transactions=())


def _partition_outcome(result: ReadResult) -> PartitionResult:
    return result.outcome()


def _epoch_entries(part: PartitionState) -> list[tuple[int, int]]:
    """The leader epoch cache (epoch, start offset), rebuilt from the batch headers.

    Like Kafka's LeaderEpochFileCache: an epoch is recorded when the first
    batch written in it is appended, the current leader epoch starts at the
    log end offset if nothing was written in it yet, and entries below the log
    start offset are folded into one starting at the log start offset.
    """
    log = part.log
    entries: list[tuple[int, int]] = []
    for h in records.iter_batches(log.data):
        if not entries or h.partition_leader_epoch > entries[-1][0]:
            entries.append((h.partition_leader_epoch, h.base_offset))
    if not entries or part.leader_epoch > entries[-1][0]:
        entries.append((part.leader_epoch, log.log_end_offset))
    below = [i for i, (_e, start) in enumerate(entries) if start < log.log_start_offset]
    if below:
        last = below[-1]
        entries = [(entries[last][0], log.log_start_offset), *entries[last + 1 :]]
    return entries


def end_offset_for_epoch(part: PartitionState, epoch: int) -> tuple[int, int] | None:
    """(epoch, end offset) for a requested leader epoch, or None when undefined."""
    entries = _epoch_entries(part)
    if epoch < 0:
        return None
    if entries[-1][0] == epoch:
        return (epoch, part.log.log_end_offset)
    higher = next((e for e in entries if e[0] > epoch), None)
    if higher is None:
        return None
    floor = [e for e in entries if e[0] <= epoch]
    if not floor:
        return (epoch, higher[1])
    return (floor[-1][0], higher[1])


@dataclass(frozen=True, slots=True)
class _Params:
    version: int
    replica_id: int
    max_wait_ms: int
    min_bytes: int
    max_bytes: int
    isolation: int

    @property
    def is_from_follower(self) -> bool:
        return self.replica_id >= 0


class SessionManager(Protocol):
    """FetchManager.newContext: a ShardedSessionCache (a node), or one FetchSessionCache."""

    def new_context(
        self,
        request_version: int,
        session_id: int,
        epoch: int,
        is_follower: bool,
        fetch_data: Mapping[TopicIdPartition, PartitionPlan],
        to_forget: Sequence[TopicIdPartition],
        topic_names: Mapping[uuid.UUID, str],
    ) -> FetchContext: ...


class NodeFetcher:
    """Answers Fetch requests for one node of the dev cluster."""

    def __init__(
        self,
        node_id: int,
        state: ClusterState,
        sessions: SessionManager,
        endpoints: Callable[[], Mapping[int, tuple[str, int]]] | None = None,
        *,
        fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES,
    ) -> None:
        self.node_id = node_id
        self.state = state
        self.sessions = sessions
        self.endpoints = endpoints
        self.fetch_max_bytes = fetch_max_bytes

    def begin(self, request: Any, api_version: int) -> PendingFetch:
        return drain(self.begin_in_ranges(request, api_version, 0))

    def begin_in_ranges(self, request: Any, api_version: int, every: int) -> Ranges[PendingFetch]:
        """``begin``, yielding after every *every* partitions it walks; the session
        context is made (``new_context``) at one point, between two ranges."""
        tick = _tick(every)
        version = int(api_version)
        topic_names: dict[uuid.UUID, str] = {}
        if version >= 13:
            topic_names = {tid: t.name for tid, t in self.state.topics_by_id.items()}
        fetch_data: dict[TopicIdPartition, PartitionPlan] = {}
        for topic in request.topics:
            if version >= 13:
                tid = topic.topic_id
                name = topic_names.get(tid) if tid is not None else None
            else:
                tid, name = None, topic.topic
            for p in topic.partitions:
                if tick():
                    yield
                fetch_data[TopicIdPartition(tid, name, int(p.partition))] = plan_of(p)
        to_forget: list[TopicIdPartition] = []
        for forgotten in getattr(request, "forgotten_topics_data", ()):
            if version >= 13:
                tid = forgotten.topic_id
                name = topic_names.get(tid) if tid is not None else None
            else:
                tid, name = None, forgotten.topic
            for i in forgotten.partitions:
                if tick():
                    yield
                to_forget.append(TopicIdPartition(tid, name, int(i)))

        if version >= 15:
            replica_id = int(request.replica_state.replica_id)
        else:
            replica_id = int(getattr(request, "replica_id", CONSUMER_REPLICA_ID))
        try:
            context = self.sessions.new_context(
                version,
                int(getattr(request, "session_id", 0)),
                int(getattr(request, "session_epoch", -1)),
                replica_id >= 0,
                fetch_data,
                to_forget,
                topic_names,
            )
        except SessionIdOutOfRange:
            # FetchManager.newContext throws; KafkaApis answers FetchRequest.getErrorResponse.
            params = _Params(version, replica_id, 0, 0, 0, LOG_END)
            return PendingFetch(
                self, request, params, SessionlessFetchContext({}), [], [], UNKNOWN_SERVER_ERROR
            )

        erroneous: list[tuple[TopicIdPartition, ReadResult]] = []
        interesting: list[tuple[TopicIdPartition, PartitionPlan]] = []
        for tp, req in (yield from context.partitions_in_ranges(every)):
            if tick():
                yield
            if tp.topic is None:
                erroneous.append((tp, _refused(UNKNOWN_TOPIC_ID)))
            elif self.state.partition(tp.topic, tp.partition) is None:
                erroneous.append((tp, _refused(UNKNOWN_TOPIC_OR_PARTITION)))
            else:
                interesting.append((tp, req))

        max_wait_ms = request.max_wait // _ONE_MS
        fetch_max_bytes = min(int(request.max_bytes), self.fetch_max_bytes)
        min_bytes = min(int(request.min_bytes), fetch_max_bytes)
        isolation_level = int(request.isolation_level)
        invalid_isolation = isolation_level not in (0, 1)
        if replica_id >= 0 or replica_id == FUTURE_LOCAL_REPLICA_ID:
            isolation = LOG_END
        elif isolation_level == 1:
            isolation = TXN_COMMITTED
        else:
            isolation = HIGH_WATERMARK
        params = _Params(version, replica_id, max_wait_ms, min_bytes, fetch_max_bytes, isolation)
        return PendingFetch(
            self,
            request,
            params,
            context,
            interesting,
            erroneous,
            # Kafka parses the isolation level only when it is about to read, and
            # fails the whole request (UNKNOWN_SERVER_ERROR) when it is invalid.
            request_error=UNKNOWN_SERVER_ERROR if invalid_isolation and interesting else None,
        )

    # -- reading (ReplicaManager.readFromLog) ---------------------------------

    def _hosted(self, tp: TopicIdPartition) -> tuple[PartitionState | None, int]:
        """getPartitionOrException: the partition if this node leads it, else an error."""
        assert tp.topic is not None
        part = self.state.partition(tp.topic, tp.partition)
        if part is None:
            return None, UNKNOWN_TOPIC_OR_PARTITION
        if part.leader != self.node_id:
            # The topic exists but this node holds no replica (single-replica partitions).
            return part, NOT_LEADER_OR_FOLLOWER
        return part, NONE

    def _local_log_error(self, part: PartitionState, req: PartitionPlan, params: _Params) -> int:
        """Partition.localLogWithEpochOrThrow (+ the follower check of fetchRecords)."""
        if req.current_leader_epoch >= 0:  # (Kafka's Optional: -1 is empty)
            if part.leader_epoch > req.current_leader_epoch:
                return FENCED_LEADER_EPOCH
            if part.leader_epoch < req.current_leader_epoch:
                return UNKNOWN_LEADER_EPOCH
        if params.is_from_follower:
            # Partitions have a single replica: no broker is a follower of this one.
            return UNKNOWN_LEADER_EPOCH if req.current_leader_epoch >= 0 else NOT_LEADER_OR_FOLLOWER
        return NONE

    def _upper_bound(self, part: PartitionState, isolation: int) -> int:
        log = part.log
        if isolation == LOG_END:
            return log.log_end_offset
        if isolation == TXN_COMMITTED:
            return log.last_stable_offset
        return log.high_watermark

    def read(
        self,
        tp: TopicIdPartition,
        req: PartitionPlan,
        params: _Params,
        limit_bytes: int,
        min_one_message: bool,
    ) -> ReadResult:
        adjusted = min(req.partition_max_bytes, limit_bytes)
        part, error = self._hosted(tp)
        if part is None or error != NONE:
            return _error_result(error)
        if tp.topic_id is not None and tp.topic_id != part.topic_id:
            return _error_result(INCONSISTENT_TOPIC_ID)
        error = self._local_log_error(part, req, params)
        if error != NONE:
            return _error_result(error)
        log = part.log
        hw, lso, log_start = log.high_watermark, log.last_stable_offset, log.log_start_offset
        committed = params.isolation == TXN_COMMITTED

        def ok(data: bytes, *, aborted: bool = committed) -> ReadResult:
            return ReadResult(
                NONE,
                high_watermark=hw,
                last_stable_offset=lso,
                log_start_offset=log_start,
                records=data,
                aborted_transactions=() if aborted else None,
            )

        offset = req.fetch_offset
        if req.last_fetched_epoch >= 0:
            end = end_offset_for_epoch(part, req.last_fetched_epoch)
            if end is None or offset < log_start:
                return _error_result(OFFSET_OUT_OF_RANGE)
            end_epoch, end_offset = end
            if end_epoch < req.last_fetched_epoch or end_offset < offset:
                result = ok(b"", aborted=False)
                result.diverging_epoch = (end_epoch, end_offset)
                return result
        if offset < log_start or offset > log.log_end_offset:
            return _error_result(OFFSET_OUT_OF_RANGE)
        bound = self._upper_bound(part, params.isolation)
        if offset >= bound:
            return ok(b"")
        if adjusted < 0:
            # LogSegment.read refuses a negative size; Kafka reports it as an unexpected error.
            return _error_result(UNKNOWN_SERVER_ERROR)
        view = log.read(offset, adjusted, min_one_message=min_one_message, upper_bound=bound)
        try:
            data = bytes(view)
        finally:
            view.release()  # a live export would stop the log's bytearray from growing
        if data and not min_one_message and _first_batch_incomplete(data):
            # ReplicaManager.checkFetchDataInfo: v3+ never return a lone partial first batch.
            return ok(b"", aborted=False)
        result = ok(data)
        if committed:
            start = log.position_of(offset)
            result.aborted_transactions = tuple(log.aborted_transactions(offset, start, len(data)))
        return result

    def read_all(
        self, partitions: list[tuple[TopicIdPartition, PartitionPlan]], params: _Params
    ) -> list[tuple[TopicIdPartition, ReadResult]]:
        return drain(self.read_all_in_ranges(partitions, params, 0))

    def read_all_in_ranges(
        self,
        partitions: list[tuple[TopicIdPartition, PartitionPlan]],
        params: _Params,
        every: int,
    ) -> Ranges[list[tuple[TopicIdPartition, ReadResult]]]:
        """``read_all``, yielding after every *every* partitions read (each partition is
        read whole, in one range, as Kafka reads one partition's log under its lock)."""
        tick = _tick(every)
        limit = params.max_bytes
        min_one_message = True  # Fetch v3+ (hardMaxBytesLimit is for v0-v2)
        out = []
        for tp, req in partitions:
            if tick():
                yield
            result = self.read(tp, req, params, limit, min_one_message)
            size = result.records_size
            if size > 0:
                min_one_message = False
            limit = max(0, limit - size)
            out.append((tp, result))
        return out

    def bytes_available(
        self, tp: TopicIdPartition, req: PartitionPlan, params: _Params
    ) -> int | None:
        """DelayedFetch.tryComplete for one partition: bytes it could return, or None to complete now."""
        part, error = self._hosted(tp)
        if part is None or error != NONE:
            return None  # cases A-C: no longer leader / unknown partition
        if self._local_log_error(part, req, params) != NONE:
            return None  # case E: epoch fenced (or otherwise refused)
        end = self._upper_bound(part, params.isolation)
        offset = req.fetch_offset
        if offset > end:
            return None  # case F: the log was truncated below the fetch offset
        available = 0
        if offset < end:
            if req.partition_max_bytes < 0:
                available = req.partition_max_bytes
            else:
                try:
                    view = part.log.read(
                        offset, req.partition_max_bytes, min_one_message=False, upper_bound=end
                    )
                except OffsetOutOfRange:
                    return None
                available = len(view)
                view.release()
        if req.last_fetched_epoch >= 0:  # case H: diverging epoch appeared
            found = end_offset_for_epoch(part, req.last_fetched_epoch)
            if found is None or found[0] < req.last_fetched_epoch or found[1] < offset:
                return None
        return available

    def current_leader(
        self, tp: TopicIdPartition
    ) -> tuple[tuple[int, int], tuple[int, str, int] | None]:
        """KafkaApis.getCurrentLeader: ((leader id, epoch), endpoint of the leader if alive)."""
        part = self.state.partition(tp.topic, tp.partition) if tp.topic is not None else None
        if part is None:
            return (-1, -1), None
        leader = part.leader
        endpoint = None
        if leader >= 0 and leader not in self.state.stopped_nodes:
            addresses = self._endpoint_map()
            if leader in addresses:
                host, port = addresses[leader]
                endpoint = (leader, host, port)
        return (leader, part.leader_epoch), endpoint

    def _endpoint_map(self) -> Mapping[int, tuple[str, int]]:
        if self.endpoints is not None:
            return self.endpoints()
        addresses = getattr(self.state, "addresses", None)
        return addresses if isinstance(addresses, Mapping) else {}


def _first_batch_incomplete(data: bytes) -> bool:
    if len(data) < records.LOG_OVERHEAD:
        return True
    return len(data) < records.LOG_OVERHEAD + int.from_bytes(data[8:12], "big", signed=True)


class PendingFetch:
    """One Fetch request between arrival and response."""

    def __init__(
        self,
        fetcher: NodeFetcher,
        request: Any,
        params: _Params,
        context: FetchContext,
        interesting: list[tuple[TopicIdPartition, PartitionPlan]],
        erroneous: list[tuple[TopicIdPartition, ReadResult]],
        request_error: int | None = None,
    ) -> None:
        self._fetcher = fetcher
        # The decoded request (an object per partition) is kept only for an error
        # response; otherwise it is freed once the fetch has begun.
        self._request = request if request_error is not None else None
        self._params = params
        self.context = context
        self._interesting = interesting
        self._erroneous = erroneous
        self._request_error = request_error
        self.max_wait_ms = params.max_wait_ms
        self.min_bytes = params.min_bytes
        self._results: list[tuple[TopicIdPartition, ReadResult]] | None = None
        self._polled = False
        self._ready = False
        self._completed = False

    def poll(self) -> bool:
        """(Re)check the logs; True when the fetch should be answered now."""
        return drain(self.poll_in_ranges(0))

    def poll_in_ranges(self, every: int) -> Ranges[bool]:
        """``poll``, yielding after every *every* partitions it looks at."""
        if self._ready:
            return True
        if not self._polled:
            self._polled = True
            self._ready = yield from self._first_read(every)
        else:
            self._ready = yield from self._try_complete(every)
        return self._ready

    def _first_read(self, every: int) -> Ranges[bool]:
        if self._request_error is not None or not self._interesting:
            return True
        results = yield from self._fetcher.read_all_in_ranges(
            self._interesting, self._params, every
        )
        readable = sum(r.records_size for _tp, r in results)
        if (
            self._params.max_wait_ms <= 0
            or readable >= self._params.min_bytes
            or any(r.error != NONE or r.diverging_epoch is not None for _tp, r in results)
        ):
            self._results = results
            return True
        return False

    def _try_complete(self, every: int) -> Ranges[bool]:
        tick = _tick(every)
        accumulated = 0
        for tp, req in self._interesting:
            if tick():
                yield
            available = self._fetcher.bytes_available(tp, req, self._params)
            if available is None:
                return True
            accumulated += available
        return accumulated >= self._params.min_bytes

    def complete(self) -> Any:
        """The kio FetchResponse at the request's version; call exactly once."""
        return drain(self.complete_in_ranges(0))

    def complete_in_ranges(self, every: int) -> Ranges[Any]:
        """``complete``, yielding after every *every* partitions of each pass over them
        (the session changes at one point, see ``update_and_generate_response_data_in_ranges``)."""
        if self._completed:
            raise RuntimeError("PendingFetch.complete() called twice")
        self._completed = True
        if self._request_error is not None:
            return (yield from self._error_response(self._request_error, every))
        if self._results is None:
            # Answering after a wait (or without a poll): read again, as DelayedFetch.onComplete does.
            self._results = (
                (
                    yield from self._fetcher.read_all_in_ranges(
                        self._interesting, self._params, every
                    )
                )
                if self._interesting
                else []
            )
        partitions: dict[TopicIdPartition, ReadResult] = dict(self._results)
        for tp, result in self._erroneous:
            partitions[tp] = result
        endpoints: dict[int, tuple[str, int]] = {}
        if self._params.version >= 16:
            tick = _tick(every)
            for tp, result in partitions.items():
                if tick():
                    yield  # (only the results change meanwhile, never the dict)
                if result.error in (NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH):
                    leader, endpoint = self._fetcher.current_leader(tp)
                    result.current_leader = leader
                    if endpoint is not None:
                        endpoints[endpoint[0]] = (endpoint[1], endpoint[2])
        if self._params.is_from_follower:
            # KafkaApis answers a follower with updateAndGenerateResponseData(partitions,
            # Seq.empty): CurrentLeader is set, NodeEndpoints stay empty.
            endpoints = {}
        session = yield from self.context.update_and_generate_response_data_in_ranges(
            partitions, _partition_outcome, every
        )
        return (
            yield from self._build(
                session.error_code, session.session_id, session.partitions, endpoints, every
            )
        )

    def _build(
        self,
        error_code: int,
        session_id: int,
        partitions: list[tuple[TopicIdPartition, ReadResult]],
        endpoints: Mapping[int, tuple[str, int]],
        every: int,
    ) -> Ranges[Any]:
        tick = _tick(every)
        version = self._params.version
        schema = response_module(FETCH, version)
        topics: list[tuple[TopicIdPartition, list[Any]]] = []
        for tp, r in partitions:
            if tick():
                yield
            fields: dict[str, Any] = {
                "partition_index": tp.partition,
                "error_code": ErrorCode(r.error),
                "high_watermark": r.high_watermark,
                "last_stable_offset": r.last_stable_offset,
                "log_start_offset": r.log_start_offset,
                "aborted_transactions": None
                if r.aborted_transactions is None
                else tuple(
                    schema.AbortedTransaction(producer_id=pid, first_offset=first)
                    for pid, first in r.aborted_transactions
                ),
                "preferred_read_replica": -1,
                "records": r.records,
            }
            if version >= 12:
                epoch, end_offset = r.diverging_epoch or (-1, -1)
                fields["diverging_epoch"] = schema.EpochEndOffset(
                    epoch=epoch, end_offset=end_offset
                )
                leader_id, leader_epoch = r.current_leader
                fields["current_leader"] = schema.LeaderIdAndEpoch(
                    leader_id=leader_id, leader_epoch=leader_epoch
                )
            pd = make(schema.PartitionData, **fields)
            if topics and _same_topic(topics[-1][0], tp):
                topics[-1][1].append(pd)
            else:
                topics.append((tp, [pd]))
        responses = tuple(
            make(
                schema.FetchableTopicResponse,
                topic=tp.topic,
                topic_id=tp.topic_id,
                partitions=tuple(pds),
            )
            for tp, pds in topics
        )
        node_endpoints = (
            tuple(
                schema.NodeEndpoint(node_id=node, host=host, port=port, rack=None)
                for node, (host, port) in sorted(endpoints.items())
            )
            if version >= 16
            else ()
        )
        return make(
            schema.FetchResponse,
            throttle_time=timedelta(0),
            error_code=ErrorCode(error_code),
            session_id=session_id,
            responses=responses,
            node_endpoints=node_endpoints,
        )

    def _error_response(self, error: int, every: int) -> Ranges[Any]:
        """FetchRequest.getErrorResponse: top-level error; < v13 also every requested partition.

        This response skips KafkaApis' conversion step, so its partitions keep
        partitionResponse's null records (and empty aborted-transactions list).
        """
        tick = _tick(every)
        version = self._params.version
        schema = response_module(FETCH, version)
        request = self._request
        assert request is not None  # (kept when there is a request error)
        responses: list[Any] = []
        if version < 13:
            for t in request.topics:
                partitions = []
                for p in t.partitions:
                    if tick():
                        yield
                    partitions.append(
                        make(
                            schema.PartitionData,
                            partition_index=p.partition,
                            error_code=ErrorCode(error),
                            high_watermark=-1,
                            aborted_transactions=(),
                            records=None,
                        )
                    )
                responses.append(
                    make(schema.FetchableTopicResponse, topic=t.topic, partitions=tuple(partitions))
                )
        return make(
            schema.FetchResponse,
            throttle_time=timedelta(0),
            error_code=ErrorCode(error),
            session_id=int(getattr(request, "session_id", 0)),
            responses=tuple(responses),
        )


def _same_topic(a: TopicIdPartition, b: TopicIdPartition) -> bool:
    # FetchResponse.toMessage groups consecutive partitions of one topic (by id when there is one).
    if a.topic_id is not None:
        return a.topic_id == b.topic_id
    return a.topic == b.topic
