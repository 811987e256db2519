"""The transaction coordinator, as Apache Kafka 4.4's TransactionCoordinator runs it.

InitProducerId with a transactional id, AddPartitionsToTxn (v0-v3, the client
form; v4-v5, the brokers' batched form, verify-only or add), AddOffsetsToTxn
and EndTxn, plus the checks that the partition leaders and the group
coordinator ask of it (Kafka's AddPartitionsToTxnManager verification, KIP-890
part 1).

Transactions V2 (KIP-890 part 2; the dev cluster finalizes ``transaction.version``
2 as Kafka 4.4 does): EndTxn v5 ends every transaction with a bumped epoch,
which the markers carry and the answer returns (so the producer's sequences
restart at 0), accepts an abort with nothing ongoing (bumping again) and
recognises a retry with the previous epoch; transactional Produce v12+ and
TxnOffsetCommit v5 have their leader add the partition to the transaction
instead of only verifying it (:meth:`TransactionCoordinator.verify`).
Kafka completes a transaction asynchronously after answering EndTxn (a
request in between gets CONCURRENT_TRANSACTIONS); the dev cluster writes the
markers at once when the leaders are up.

Each transactional id belongs to the node that leads its ``__transaction_state``
partition (hash of the id modulo 50); the others answer NOT_COORDINATOR.
States: Empty -> Ongoing -> PrepareCommit/PrepareAbort -> CompleteCommit/
CompleteAbort.  EndTxn moves to PrepareCommit/PrepareAbort and writes the
markers (control batches, :func:`devbroker.log.control_batch`) to every
partition of the transaction whose leader is up, committing or dropping the
pending transactional offsets; markers for stopped leaders wait
(:meth:`TransactionCoordinator.retry_markers`, called when a node restarts and
on every tick), and until the last one is written the transaction stays in its
Prepare state, where Kafka answers CONCURRENT_TRANSACTIONS.  An InitProducerId for a transactional id whose transaction is
ongoing aborts it with a bumped epoch (fencing the old producer) and answers
CONCURRENT_TRANSACTIONS, as Kafka does; :meth:`TransactionCoordinator.tick`
aborts (and fences) transactions that outlived their timeout.

Sans-I/O: no trio here; ``now`` is the cluster clock in seconds.
"""

from __future__ import annotations

import enum
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kio.schema.errors import ErrorCode as E

from proxy.protocol import codec
from proxy.protocol.apis import ADD_OFFSETS_TO_TXN, ADD_PARTITIONS_TO_TXN, END_TXN, INIT_PRODUCER_ID

from .admin import OFFSETS_TOPIC_PARTITIONS, coordinator_node, partition_for
from .build import build, ms
from .log import ABORT, COMMIT, control_batch
from .state import ClusterState

if TYPE_CHECKING:
    from .membership import GroupCoordinator
    from .node import Request

MAX_TIMEOUT_MS = 900_000  # transaction.max.timeout.ms
CLEANUP_INTERVAL_SECONDS = 10.0  # transaction.abort.timed.out.transaction.cleanup.interval.ms
OFFSETS_TOPIC = "__consumer_offsets"
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
EPOCH_EXHAUSTED = 2**15 - 2  # Short.MaxValue - 1
COORDINATOR_EPOCH = 0
MAX_TRANSACTIONAL_IDS = 10_000
"""Transactional ids kept; beyond it the least recently initialised idle one is forgotten,
as if it had expired (Kafka: transactional.id.expiration.ms)."""

TopicPartition = tuple[str, int]


class TxnState(enum.Enum):
    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


@dataclass(slots=True)
class TxnMetadata:
    transactional_id: str
    producer_id: int
    producer_epoch: int = NO_PRODUCER_EPOCH
    last_producer_epoch: int = NO_PRODUCER_EPOCH
    previous_producer_id: int = NO_PRODUCER_ID
    timeout_ms: int = 60_000
    state: TxnState = TxnState.EMPTY
    partitions: set[TopicPartition] = field(default_factory=set)
    start_time: float = -1.0
    pending_markers: set[TopicPartition] = field(default_factory=set)
    """Partitions still waiting for this transaction's marker (PrepareCommit/PrepareAbort)."""
    next_producer_id: int = NO_PRODUCER_ID
    """Transactions V2: the producer id taken when EndTxn exhausted the epoch (from completion on)."""

    @property
    def epoch_exhausted(self) -> bool:
        return self.producer_epoch >= EPOCH_EXHAUSTED


def offsets_partition(group_id: str) -> TopicPartition:
    """The ``__consumer_offsets`` partition that AddOffsetsToTxn adds for *group_id*."""
    return (OFFSETS_TOPIC, partition_for(group_id, OFFSETS_TOPIC_PARTITIONS))


class TransactionCoordinator:
    """Every transactional id of the dev cluster; each node answers only for the ids it owns."""

    def __init__(
        self,
        state: ClusterState,
        groups: GroupCoordinator,
        *,
        max_timeout_ms: int = MAX_TIMEOUT_MS,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.state = state
        self.groups = groups
        self.max_timeout_ms = max_timeout_ms
        self.wall_clock = wall_clock
        self.txns: OrderedDict[str, TxnMetadata] = OrderedDict()

    def handlers(self) -> dict[int, Callable[[int, Request], Any]]:
        return {
            ADD_PARTITIONS_TO_TXN: self.add_partitions,
            ADD_OFFSETS_TO_TXN: self.add_offsets,
            END_TXN: self.end_txn,
        }

    def is_coordinator(self, node_id: int, transactional_id: str) -> bool:
        return coordinator_node(self.state.node_ids, transactional_id) == node_id

    # -- InitProducerId ----------------------------------------------------------

    def init_producer_id(self, node_id: int, req: Request) -> Any:
        b = req.body
        cls = codec.response_schema(INIT_PRODUCER_ID, req.version)

        def respond(error: E, pid: int = NO_PRODUCER_ID, epoch: int = NO_PRODUCER_EPOCH) -> Any:
            if req.version < 4 and error == E.producer_fenced:
                error = E.invalid_producer_epoch
            data = {"throttle_time": 0, "error_code": error, "producer_id": pid}
            return build(cls, data | {"producer_epoch": epoch})

        expected_pid = int(getattr(b, "producer_id", NO_PRODUCER_ID))
        expected_epoch = int(getattr(b, "producer_epoch", NO_PRODUCER_EPOCH))
        if (expected_pid == NO_PRODUCER_ID) != (expected_epoch == NO_PRODUCER_EPOCH):
            return respond(E.invalid_request)
        expected = None if expected_pid == NO_PRODUCER_ID else (expected_pid, expected_epoch)
        txn_id: str = b.transactional_id
        timeout_ms = ms(b.transaction_timeout)
        if not txn_id:
            return respond(E.invalid_request)
        if not 0 < timeout_ms <= self.max_timeout_ms:
            return respond(E.invalid_transaction_timeout)
        if not self.is_coordinator(node_id, txn_id):
            return respond(E.not_coordinator)
        meta = self.txns.get(txn_id)
        if meta is None:
            meta = self.txns[txn_id] = TxnMetadata(txn_id, self.state.allocate_producer_id())
            self._forget_idle()
        self.txns.move_to_end(txn_id)
        if expected is not None and not (
            meta.producer_epoch == NO_PRODUCER_EPOCH
            or expected[0] == meta.producer_id
            or (expected[0] == meta.previous_producer_id and expected[1] >= EPOCH_EXHAUSTED)
        ):
            return respond(E.producer_fenced)
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return respond(E.concurrent_transactions)
        if meta.state is TxnState.ONGOING:
            # Fence the producer: abort with a bumped epoch, let the client retry.
            self._fence_and_abort(meta)
            return respond(E.concurrent_transactions)
        if meta.epoch_exhausted and (expected is None or expected[1] == meta.producer_epoch):
            meta.previous_producer_id = meta.producer_id
            meta.producer_id = self.state.allocate_producer_id()
            meta.last_producer_epoch = meta.producer_epoch if expected is not None else -1
            meta.producer_epoch = 0
        elif expected is None:
            # TransactionMetadata.prepareIncrementProducerEpoch: a fresh producer.
            meta.last_producer_epoch = NO_PRODUCER_EPOCH
            meta.producer_epoch += 1
        elif meta.producer_epoch == NO_PRODUCER_EPOCH or expected[1] == meta.producer_epoch:
            # A producer recovering from an error, and nobody fenced it: bump.
            meta.last_producer_epoch = meta.producer_epoch
            meta.producer_epoch += 1
        elif expected[1] != meta.last_producer_epoch:
            return respond(E.producer_fenced)
        # else: a retry of a bump whose answer was lost gets the same epoch again.
        meta.timeout_ms = timeout_ms
        meta.state, meta.partitions, meta.start_time = TxnState.EMPTY, set(), -1.0
        return respond(E.none, meta.producer_id, meta.producer_epoch)

    def _forget_idle(self) -> None:
        """Bound the transactional ids kept (oldest first; ongoing transactions stay)."""
        excess = len(self.txns) - MAX_TRANSACTIONAL_IDS
        for txn_id in [t for t, m in self.txns.items() if m.state is not TxnState.ONGOING]:
            if excess <= 0:
                break
            del self.txns[txn_id]
            excess -= 1

    # -- AddPartitionsToTxn / AddOffsetsToTxn --------------------------------------

    def _check_producer(self, node_id: int, txn_id: str, pid: int, epoch: int) -> E | TxnMetadata:
        if not txn_id:
            return E.invalid_request
        if not self.is_coordinator(node_id, txn_id):
            return E.not_coordinator
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != pid:
            return E.invalid_producer_id_mapping
        if meta.producer_epoch != epoch:
            return E.producer_fenced
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return E.concurrent_transactions
        return meta

    def _add(
        self, node_id: int, now: float, txn_id: str, pid: int, epoch: int, tps: set[TopicPartition]
    ) -> E:
        """TransactionCoordinator.handleAddPartitionsToTransaction."""
        checked = self._check_producer(node_id, txn_id, pid, epoch)
        if isinstance(checked, E):
            return checked
        meta = checked
        if meta.state is TxnState.ONGOING and tps <= meta.partitions:
            return E.none
        if meta.state is not TxnState.ONGOING:
            meta.start_time = now
            meta.partitions = set()
        meta.partitions |= tps
        meta.state = TxnState.ONGOING
        return E.none

    def add_partitions(self, node_id: int, req: Request) -> Any:
        """KafkaApis.handleAddPartitionsToTxnRequest: the client form (v0-v3) and, from v4, the
        brokers' batched form (several transactions, each possibly verify-only).

        Versions above 3 are transactions V2 (TransactionVersion.transactionVersionForAddPartitionsToTxn).
        """
        b = req.body
        cls = codec.response_schema(ADD_PARTITIONS_TO_TXN, req.version)
        if req.version < 4:
            wanted = [(t.name, int(p)) for t in b.v3_and_below_topics for p in t.partitions]
            codes = self._add_one(
                node_id,
                req,
                b.v3_and_below_transactional_id,
                b.v3_and_below_producer_id,
                b.v3_and_below_producer_epoch,
                wanted,
                verify_only=False,
            )
            return build(
                cls, {"throttle_time": 0, "results_by_topic_v3_and_below": _by_topic(codes)}
            )
        results = []
        for txn in b.transactions:
            wanted = [(t.name, int(p)) for t in txn.topics for p in t.partitions]
            codes = self._add_one(
                node_id,
                req,
                txn.transactional_id,
                txn.producer_id,
                txn.producer_epoch,
                wanted,
                verify_only=bool(txn.verify_only),
            )
            results.append(
                {"transactional_id": txn.transactional_id, "topic_results": _by_topic(codes)}
            )
        return build(
            cls, {"throttle_time": 0, "error_code": E.none, "results_by_transaction": results}
        )

    def _add_one(
        self,
        node_id: int,
        req: Request,
        txn_id: str,
        pid: int,
        epoch: int,
        wanted: list[TopicPartition],
        *,
        verify_only: bool,
    ) -> dict[TopicPartition, E]:
        unknown = {tp for tp in wanted if self.state.partition(*tp) is None}
        if unknown:
            return {
                tp: E.unknown_topic_or_partition if tp in unknown else E.operation_not_attempted
                for tp in wanted
            }
        if verify_only:
            return self._verify_partitions(node_id, txn_id, pid, epoch, wanted)
        error = self._add(node_id, req.now, txn_id, pid, epoch, set(wanted))
        if req.version < 2 and error == E.producer_fenced:
            error = E.invalid_producer_epoch
        return dict.fromkeys(wanted, error)

    def _verify_partitions(
        self, node_id: int, txn_id: str, pid: int, epoch: int, wanted: list[TopicPartition]
    ) -> dict[TopicPartition, E]:
        """TransactionCoordinator.handleVerifyPartitionsInTransaction."""
        if not txn_id:
            return dict.fromkeys(wanted, E.invalid_request)
        if not self.is_coordinator(node_id, txn_id):
            return dict.fromkeys(wanted, E.not_coordinator)
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != pid:
            return dict.fromkeys(wanted, E.invalid_producer_id_mapping)
        if meta.producer_epoch != epoch:
            return dict.fromkeys(wanted, E.producer_fenced)
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return dict.fromkeys(wanted, E.concurrent_transactions)
        return {
            tp: E.none
            if tp in meta.partitions and meta.state is TxnState.ONGOING
            else E.transaction_abortable
            for tp in wanted
        }

    def add_offsets(self, node_id: int, req: Request) -> Any:
        b = req.body
        cls = codec.response_schema(ADD_OFFSETS_TO_TXN, req.version)
        error = self._add(
            node_id,
            req.now,
            b.transactional_id,
            b.producer_id,
            b.producer_epoch,
            {offsets_partition(b.group_id)},
        )
        if req.version < 2 and error == E.producer_fenced:
            error = E.invalid_producer_epoch
        return build(cls, {"throttle_time": 0, "error_code": error})

    # -- verification (AddPartitionsToTxnManager) -----------------------------------

    def verify(
        self,
        txn_id: str | None,
        pid: int,
        epoch: int,
        tp: TopicPartition,
        generic: bool,
        *,
        add_at: float | None = None,
    ) -> E:
        """The error a leader gives a transactional write to *tp* (none when it is in the txn).

        handleVerifyPartitionsInTransaction, with AddPartitionsToTxnManager's
        translation: PRODUCER_FENCED becomes INVALID_PRODUCER_EPOCH and
        TRANSACTION_ABORTABLE stays only for *generic* (Produce v11+,
        TxnOffsetCommit v4+) callers, else INVALID_TXN_STATE.

        With *add_at* (the cluster clock; transactions V2: Produce v12+, TxnOffsetCommit
        v5+, Kafka's ADD_PARTITION operation) the leader asks the coordinator to add the
        partition instead (AddPartitionsToTxn v5, not verify-only).
        """
        if not txn_id:
            return E.invalid_request
        owner = coordinator_node(self.state.node_ids, txn_id)
        if owner in self.state.stopped_nodes:
            return E.coordinator_not_available  # its __transaction_state leader is down
        if add_at is not None:
            error = self._add(owner, add_at, txn_id, pid, epoch, {tp})
            return E.invalid_producer_epoch if error == E.producer_fenced else error
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != pid:
            return E.invalid_producer_id_mapping
        if meta.producer_epoch != epoch:
            return E.invalid_producer_epoch
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            return E.concurrent_transactions
        if tp in meta.partitions and meta.state is TxnState.ONGOING:
            return E.none
        return E.transaction_abortable if generic else E.invalid_txn_state

    # -- EndTxn ------------------------------------------------------------------------

    def end_txn(self, node_id: int, req: Request) -> Any:
        b = req.body
        cls = codec.response_schema(END_TXN, req.version)
        if req.version >= 5:  # TransactionVersion.transactionVersionForEndTxn: V2
            error, pid, epoch = self._end_v2(
                node_id, b.transactional_id, b.producer_id, b.producer_epoch, b.committed
            )
            data = {"throttle_time": 0, "error_code": error}
            return build(cls, data | {"producer_id": pid, "producer_epoch": epoch})
        error = self._end(node_id, b.transactional_id, b.producer_id, b.producer_epoch, b.committed)
        if req.version < 2 and error == E.producer_fenced:
            error = E.invalid_producer_epoch
        return build(cls, {"throttle_time": 0, "error_code": error})

    def _end_v2(
        self, node_id: int, txn_id: str, pid: int, epoch: int, commit: bool
    ) -> tuple[E, int, int]:
        """TransactionCoordinator.endTransaction with transactions V2 (EndTxn v5).

        Every completion bumps the epoch (prepareAbortOrCommit), the markers carry the
        new epoch and the answer returns it; an abort is also accepted with nothing
        ongoing (Empty, CompleteCommit, CompleteAbort: an "empty abort" that bumps the
        epoch once more), and a retry with the previous epoch is recognised.
        """
        if not txn_id:
            return _failed(E.invalid_request)
        if not self.is_coordinator(node_id, txn_id):
            return _failed(E.not_coordinator)
        meta = self.txns.get(txn_id)
        if meta is None:
            return _failed(E.invalid_producer_id_mapping)
        current = (meta.producer_id, meta.producer_epoch)
        retry_on_overflow = (
            meta.previous_producer_id == pid
            and epoch == EPOCH_EXHAUSTED
            and meta.producer_epoch == 0
        )
        retry_on_bump = meta.producer_epoch == epoch + 1
        if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
            valid = retry_on_bump
        elif meta.state in (TxnState.COMPLETE_COMMIT, TxnState.COMPLETE_ABORT):
            valid = retry_on_bump or retry_on_overflow or meta.producer_epoch == epoch
        else:
            valid = meta.producer_epoch == epoch
        is_retry = retry_on_bump or retry_on_overflow
        if meta.producer_id != pid and not retry_on_overflow:
            return _failed(E.invalid_producer_id_mapping)
        if not valid:
            return _failed(E.producer_fenced)
        s = meta.state
        if s is TxnState.ONGOING:
            self._complete_v2(meta, commit)
            return E.none, meta.producer_id, meta.producer_epoch
        if s is TxnState.COMPLETE_COMMIT:
            if commit:
                return (E.none, *current) if is_retry else _failed(E.invalid_txn_state)
            if is_retry:
                return _failed(E.invalid_txn_state)
        elif s is TxnState.COMPLETE_ABORT:
            if commit:
                return _failed(E.invalid_txn_state)
            if is_retry:
                return (E.none, *current)
        elif s is TxnState.PREPARE_COMMIT:
            return _failed(E.concurrent_transactions if commit else E.invalid_txn_state)
        elif s is TxnState.PREPARE_ABORT:
            return _failed(E.invalid_txn_state if commit else E.concurrent_transactions)
        elif commit:  # Empty
            return _failed(E.invalid_txn_state)
        # An abort with nothing ongoing: PrepareAbort with no partitions, a bumped epoch.
        meta.start_time = -1.0
        meta.partitions = set()
        self._complete_v2(meta, commit=False)
        return E.none, meta.producer_id, meta.producer_epoch

    def _complete_v2(self, meta: TxnMetadata, commit: bool) -> None:
        """prepareAbortOrCommit with epoch bump (a new producer id once the epoch is exhausted)."""
        if meta.epoch_exhausted:
            meta.next_producer_id = self.state.allocate_producer_id()
        if meta.producer_epoch < 2**15 - 1:
            meta.last_producer_epoch = meta.producer_epoch
            meta.producer_epoch += 1
        self._complete(meta, commit)

    def _end(self, node_id: int, txn_id: str, pid: int, epoch: int, commit: bool) -> E:
        if not txn_id:
            return E.invalid_request
        if not self.is_coordinator(node_id, txn_id):
            return E.not_coordinator
        meta = self.txns.get(txn_id)
        if meta is None or meta.producer_id != pid:
            return E.invalid_producer_id_mapping
        if epoch != meta.producer_epoch:
            return E.producer_fenced
        if meta.state is TxnState.ONGOING:
            self._complete(meta, commit)
            return E.none
        if meta.state is TxnState.COMPLETE_COMMIT:
            return E.none if commit else E.invalid_txn_state
        if meta.state is TxnState.COMPLETE_ABORT:
            return E.invalid_txn_state if commit else E.none
        if meta.state is TxnState.PREPARE_COMMIT:
            return E.concurrent_transactions if commit else E.invalid_txn_state
        if meta.state is TxnState.PREPARE_ABORT:
            return E.invalid_txn_state if commit else E.concurrent_transactions
        return E.invalid_txn_state  # Empty

    def _complete(self, meta: TxnMetadata, commit: bool) -> None:
        """PrepareCommit/PrepareAbort, then the markers (TransactionMarkerChannelManager)."""
        meta.state = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
        meta.pending_markers = set(meta.partitions)
        self._send_markers(meta)

    def _send_markers(self, meta: TxnMetadata) -> bool:
        """Write the markers whose partition leaders are up; complete when none is left."""
        commit = meta.state is TxnState.PREPARE_COMMIT
        kind = COMMIT if commit else ABORT
        timestamp = int(self.wall_clock() * 1000)
        sent = False
        for topic, index in sorted(meta.pending_markers):
            if topic == OFFSETS_TOPIC:
                leader = self.state.node_ids[index % len(self.state.node_ids)]
                if leader in self.state.stopped_nodes:
                    continue
                self.groups.offsets.complete_txn_offsets(index, meta.producer_id, commit)
            else:
                part = self.state.partition(topic, index)
                if part is not None:  # topics are never deleted
                    if part.leader in self.state.stopped_nodes:
                        continue
                    marker = control_batch(
                        meta.producer_id, meta.producer_epoch, kind, COORDINATOR_EPOCH, timestamp
                    )
                    part.log.append(marker, part.leader_epoch)
                    part.producers.record_marker(meta.producer_id, meta.producer_epoch)
            meta.pending_markers.discard((topic, index))
            sent = True
        if not meta.pending_markers:
            meta.state = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
            meta.partitions = set()
            meta.start_time = -1.0
            if meta.next_producer_id != NO_PRODUCER_ID:
                # prepareComplete: the new producer id starts at epoch 0.
                meta.previous_producer_id = meta.producer_id
                meta.producer_id, meta.next_producer_id = meta.next_producer_id, NO_PRODUCER_ID
                meta.producer_epoch, meta.last_producer_epoch = 0, NO_PRODUCER_EPOCH
        return sent

    def retry_markers(self) -> bool:
        """Send the markers that waited for a leader to come back; True if any was written."""
        sent = False
        for meta in self.txns.values():
            if meta.state in (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT):
                sent = self._send_markers(meta) or sent
        return sent

    def _fence_and_abort(self, meta: TxnMetadata) -> None:
        """prepareFenceProducerEpoch + endTransaction(ABORT) with the bumped epoch."""
        if meta.producer_epoch < 2**15 - 1:
            meta.producer_epoch += 1
        meta.last_producer_epoch = NO_PRODUCER_EPOCH
        self._complete(meta, commit=False)

    # -- time ------------------------------------------------------------------------

    def tick(self, now: float) -> bool:
        """Abort (and fence) the ongoing transactions older than their timeout; True if any.

        Kafka's abortTimedOutTransactions; the cluster edge calls it every
        ``CLEANUP_INTERVAL_SECONDS``, as Kafka's scheduler does.
        """
        expired = [
            m
            for m in self.txns.values()
            if m.state is TxnState.ONGOING and now > m.start_time + m.timeout_ms / 1000.0
        ]
        for meta in expired:
            self._fence_and_abort(meta)
        return self.retry_markers() or bool(expired)


def _failed(error: E) -> tuple[E, int, int]:
    """An EndTxn v5 error answer: Kafka returns no producer id and epoch with it."""
    return error, NO_PRODUCER_ID, NO_PRODUCER_EPOCH


def _by_topic(codes: dict[TopicPartition, E]) -> list[dict[str, Any]]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, index), code in codes.items():
        topics.setdefault(topic, []).append(
            {"partition_index": index, "partition_error_code": code}
        )
    return [{"name": t, "results_by_partition": ps} for t, ps in topics.items()]
