"""Transactions on the dev cluster: the coordinator's APIs, markers, LSO and read_committed Fetch."""

from __future__ import annotations

from typing import Any

import pytest
from kio.schema.errors import ErrorCode as E
from support.batches import make_batch
from support.dispatch import Harness, Wait
from support.fetch_messages import fetch_body, partition_body

from devbroker.admin import coordinator_node
from devbroker.log import ABORT, COMMIT, PartitionLog, control_batch, control_type
from devbroker.transactions import offsets_partition
from proxy.protocol import records

PRODUCE, FETCH, LIST_OFFSETS, OFFSET_FETCH, FIND_COORDINATOR = 0, 1, 2, 9, 10
INIT_PRODUCER_ID, ADD_PARTITIONS, ADD_OFFSETS, END_TXN, TXN_OFFSET_COMMIT = 22, 24, 25, 26, 28
TXN = records.TRANSACTIONAL_MASK


@pytest.fixture
def h() -> Harness:
    return Harness(3, {"orders": 4})


class Producer:
    """A transactional producer driven by hand (as the Java client's TransactionManager would)."""

    def __init__(self, h: Harness, txn_id: str = "tx-1", timeout_ms: int = 60_000) -> None:
        self.h = h
        self.txn_id = txn_id
        self.coordinator = coordinator_node(h.state.node_ids, txn_id)
        self.timeout_ms = timeout_ms
        self.pid = -1
        self.epoch = -1
        self.seq: dict[int, int] = {}

    def init(self, version: int = 4, **kw: Any) -> Any:
        resp = self.h.call(
            self.coordinator,
            self.h.request(
                INIT_PRODUCER_ID,
                version,
                {"transactional_id": self.txn_id, "transaction_timeout": self.timeout_ms} | kw,
            ),
        )
        if resp.error_code == E.none:
            self.pid, self.epoch, self.seq = resp.producer_id, resp.producer_epoch, {}
        return resp

    def add(self, *partitions: int, version: int = 3, topic: str = "orders", **kw: Any) -> Any:
        data = {
            "v3_and_below_transactional_id": self.txn_id,
            "v3_and_below_producer_id": self.pid,
            "v3_and_below_producer_epoch": self.epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": list(partitions)}],
        } | kw
        resp = self.h.call(self.coordinator, self.h.request(ADD_PARTITIONS, version, data))
        return {
            (t.name, p.partition_index): p.partition_error_code
            for t in resp.results_by_topic_v3_and_below
            for p in t.results_by_partition
        }

    def produce(
        self,
        partition: int,
        count: int = 1,
        *,
        version: int = 12,
        epoch: int | None = None,
        base_timestamp: int = 1000,
    ) -> Any:
        seq = self.seq.get(partition, 0)
        data = make_batch(
            0,
            count,
            attributes=TXN,
            producer_id=self.pid,
            producer_epoch=self.epoch if epoch is None else epoch,
            base_sequence=seq,
            base_timestamp=base_timestamp,
        )
        req = self.h.request(
            PRODUCE,
            version,
            {
                "transactional_id": self.txn_id,
                "acks": -1,
                "timeout": 1000,
                "topic_data": [
                    {"name": "orders", "partition_data": [{"index": partition, "records": data}]}
                ],
            },
        )
        resp = self.h.call(self.h.leader_of("orders", partition), req)
        part = resp.responses[0].partition_responses[0]
        if part.error_code == E.none:
            self.seq[partition] = seq + count
        return part

    def end(self, commit: bool, version: int = 3, **kw: Any) -> Any:
        data = {
            "transactional_id": self.txn_id,
            "producer_id": self.pid,
            "producer_epoch": self.epoch,
            "committed": commit,
        } | kw
        return self.h.call(self.coordinator, self.h.request(END_TXN, version, data)).error_code

    def add_offsets(self, group: str, version: int = 3) -> Any:
        data = {
            "transactional_id": self.txn_id,
            "producer_id": self.pid,
            "producer_epoch": self.epoch,
            "group_id": group,
        }
        return self.h.call(self.coordinator, self.h.request(ADD_OFFSETS, version, data)).error_code

    def commit_offsets(self, group: str, offset: int, version: int = 3, **kw: Any) -> Any:
        data = {
            "transactional_id": self.txn_id,
            "group_id": group,
            "producer_id": self.pid,
            "producer_epoch": self.epoch,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": offset,
                            "committed_leader_epoch": -1,
                            "committed_metadata": "",
                        }
                    ],
                }
            ],
        } | kw
        node = coordinator_node(self.h.state.node_ids, group)
        resp = self.h.call(node, self.h.request(TXN_OFFSET_COMMIT, version, data))
        return resp.topics[0].partitions[0].error_code


def plain(h: Harness, partition: int, count: int = 1) -> Any:
    req = h.request(
        PRODUCE,
        12,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 1000,
            "topic_data": [
                {
                    "name": "orders",
                    "partition_data": [{"index": partition, "records": make_batch(0, count)}],
                }
            ],
        },
    )
    return h.call(h.leader_of("orders", partition), req).responses[0].partition_responses[0]


def fetch(h: Harness, partition: int, offset: int = 0, *, isolation: int, max_bytes: int = 1 << 20):
    topic = {"topic": "orders", "partitions": [partition_body(partition, offset, max_bytes)]}
    body = fetch_body([topic], max_wait=0, max_bytes=1 << 20, isolation_level=isolation)
    req = h.request(FETCH, 12, body)
    outcome = h.send(h.leader_of("orders", partition), req)
    assert isinstance(outcome, Wait)
    resp = h.finish(outcome, FETCH, 12)
    assert resp is not None
    return resp.responses[0].partitions[0]


def list_latest(h: Harness, partition: int, isolation: int) -> int:
    req = h.request(
        LIST_OFFSETS,
        7,
        {
            "replica_id": -1,
            "isolation_level": isolation,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {"partition_index": partition, "current_leader_epoch": -1, "timestamp": -1}
                    ],
                }
            ],
        },
    )
    resp = h.call(h.leader_of("orders", partition), req)
    return int(resp.topics[0].partitions[0].offset)


def batches(data: bytes) -> list[records.BatchHeader]:
    return list(records.iter_batches(data))


# -- markers and the log ------------------------------------------------------------


def test_control_batch_is_a_valid_v2_control_batch() -> None:
    data = control_batch(7, 3, COMMIT, 0, 1234)
    (hdr,) = batches(data)
    assert hdr.is_control and hdr.is_transactional and records.verify_crc(data, hdr)
    assert (hdr.producer_id, hdr.producer_epoch, hdr.records_count) == (7, 3, 1)
    assert hdr.counted_records == 0
    assert control_type(data, hdr) == COMMIT
    assert (
        control_type(control_batch(7, 3, ABORT, 0, 1), batches(control_batch(7, 3, ABORT, 0, 1))[0])
        == ABORT
    )


def txn_batch(pid: int, count: int = 1) -> bytes:
    return make_batch(0, count, attributes=TXN, producer_id=pid, producer_epoch=0, base_sequence=0)


def test_lso_is_the_first_offset_of_the_earliest_open_transaction() -> None:
    log = PartitionLog()
    log.append(make_batch(0, 2), 0)  # 0-1
    log.append(txn_batch(1, 3), 0)  # 2-4, txn of producer 1 opens at 2
    log.append(txn_batch(2), 0)  # 5, producer 2 opens at 5
    assert (log.high_watermark, log.last_stable_offset) == (6, 2)
    log.append(control_batch(1, 0, COMMIT, 0, 0), 0)  # 6
    assert log.last_stable_offset == 5
    log.append(control_batch(2, 0, ABORT, 0, 0), 0)  # 7
    assert log.last_stable_offset == log.high_watermark == 8
    assert [
        (t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset) for t in log.aborted
    ] == [(2, 5, 7, 8)]


def test_abort_index_records_the_lso_of_other_open_transactions() -> None:
    log = PartitionLog()
    log.append(txn_batch(1), 0)  # 0
    log.append(txn_batch(2), 0)  # 1
    log.append(control_batch(2, 0, ABORT, 0, 0), 0)  # 2: producer 1 still open at 0
    log.append(control_batch(3, 0, ABORT, 0, 0), 0)  # 3: an empty aborted transaction
    assert [
        (t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset) for t in log.aborted
    ] == [
        (2, 1, 2, 0),
        (3, 3, 3, 0),
    ]


def test_aborted_transactions_overlapping_the_read_range() -> None:
    log = PartitionLog()
    log.append(txn_batch(1), 0)  # 0
    log.append(control_batch(1, 0, ABORT, 0, 0), 0)  # 1
    log.append(txn_batch(2), 0)  # 2
    log.append(control_batch(2, 0, ABORT, 0, 0), 0)  # 3
    assert log.aborted_transactions(0, 0, len(log.data)) == [(1, 0), (2, 2)]
    # From offset 2 on only the second transaction can overlap.
    assert log.aborted_transactions(2, log.position_of(2), 10) == [(2, 2)]


def test_offset_index_bounds_the_aborted_transactions_collected() -> None:
    log = PartitionLog()
    big = b"x" * 5000
    log.append(
        make_batch(0, 1, big, attributes=TXN, producer_id=1, producer_epoch=0, base_sequence=0), 0
    )
    log.append(control_batch(1, 0, ABORT, 0, 0), 0)  # 1; index entry (1, pos) after 5000 bytes
    log.append(make_batch(0, 1, big), 0)  # 2
    log.append(txn_batch(2), 0)  # 3
    log.append(control_batch(2, 0, ABORT, 0, 0), 0)  # 4
    first_size = batches(bytes(log.data))[0].size
    # Reading only the first batch: the index's upper bound is offset 1 (its entry at the marker),
    # so the second aborted transaction (first offset 3) is not listed.
    assert log.aborted_transactions(0, 0, first_size) == [(1, 0)]
    assert log.aborted_transactions(0, 0, len(log.data)) == [(1, 0), (2, 3)]


# -- FindCoordinator / InitProducerId --------------------------------------------------


def test_find_coordinator_for_a_transactional_id(h: Harness) -> None:
    resp = h.call(1, h.request(FIND_COORDINATOR, 3, {"key": "tx-1", "key_type": 1}))
    assert (resp.error_code, resp.node_id) == (E.none, coordinator_node([0, 1, 2], "tx-1"))


def test_init_producer_id_bumps_the_epoch_and_keeps_the_id(h: Harness) -> None:
    p = Producer(h)
    first = p.init()
    assert (first.error_code, first.producer_epoch) == (E.none, 0)
    again = p.init()
    assert (again.producer_id, again.producer_epoch) == (first.producer_id, 1)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"transactional_id": ""}, E.invalid_request),
        ({"transaction_timeout": 0}, E.invalid_transaction_timeout),
        ({"transaction_timeout": 900_001}, E.invalid_transaction_timeout),
        ({"producer_id": 5}, E.invalid_request),
        ({"producer_epoch": 5}, E.invalid_request),
    ],
)
def test_init_producer_id_refusals(h: Harness, fields: dict[str, Any], error: E) -> None:
    assert Producer(h).init(version=4, **fields).error_code == error


def test_init_producer_id_not_coordinator(h: Harness) -> None:
    p = Producer(h)
    p.coordinator = (p.coordinator + 1) % 3
    assert p.init().error_code == E.not_coordinator


def test_init_producer_id_with_a_stale_producer_is_fenced(h: Harness) -> None:
    p = Producer(h)
    p.init()
    old = p.pid
    p.init()
    p.init()  # epoch 2, last epoch -1 (fresh inits)
    assert p.init(producer_id=old, producer_epoch=0).error_code == E.producer_fenced
    assert (
        p.init(version=3, producer_id=old, producer_epoch=0).error_code == E.invalid_producer_epoch
    )
    assert p.init(producer_id=old + 99, producer_epoch=2).error_code == E.producer_fenced
    ok = p.init(producer_id=old, producer_epoch=p.epoch)
    assert (ok.error_code, ok.producer_epoch) == (E.none, 3)


def test_init_producer_id_during_a_transaction_aborts_it_and_fences(h: Harness) -> None:
    p = Producer(h)
    p.init()
    p.add(0)
    assert p.produce(0).error_code == E.none
    other = Producer(h)
    assert other.init().error_code == E.concurrent_transactions
    part = h.state.partition("orders", 0)
    assert part is not None
    marker = batches(bytes(part.log.data))[-1]
    assert marker.is_control and marker.producer_epoch == 1
    assert part.log.last_stable_offset == part.log.high_watermark == 2
    retry = other.init()
    assert (retry.error_code, retry.producer_epoch) == (E.none, 2)
    # The old producer is fenced everywhere.
    assert p.produce(0).error_code == E.invalid_producer_epoch
    assert p.end(True) == E.producer_fenced
    assert p.end(True, version=1) == E.invalid_producer_epoch


# -- AddPartitionsToTxn / Produce -------------------------------------------------------


def test_add_partitions_errors(h: Harness) -> None:
    p = Producer(h)
    assert p.add(0) == {("orders", 0): E.invalid_producer_id_mapping}
    p.init()
    assert p.add(0, 99) == {
        ("orders", 0): E.operation_not_attempted,
        ("orders", 99): E.unknown_topic_or_partition,
    }
    assert p.add(0, v3_and_below_producer_epoch=5) == {("orders", 0): E.producer_fenced}
    assert p.add(0, version=1, v3_and_below_producer_epoch=5) == {
        ("orders", 0): E.invalid_producer_epoch
    }
    assert p.add(0, v3_and_below_producer_id=1) == {("orders", 0): E.invalid_producer_id_mapping}
    assert p.add(0, v3_and_below_transactional_id="") == {("orders", 0): E.invalid_request}
    p.coordinator = (p.coordinator + 1) % 3
    assert p.add(0) == {("orders", 0): E.not_coordinator}


@pytest.mark.parametrize(
    ("version", "error"), [(10, E.invalid_txn_state), (11, E.transaction_abortable)]
)
def test_produce_to_a_partition_not_in_the_transaction(h: Harness, version: int, error: E) -> None:
    p = Producer(h)
    p.init()
    p.add(0)
    assert p.produce(1, version=version).error_code == error
    assert p.produce(0, version=version).error_code == E.none


def test_transactional_produce_checks(h: Harness) -> None:
    p = Producer(h)
    p.init()
    p.add(0)
    assert p.produce(0, epoch=p.epoch + 1).error_code == E.invalid_producer_epoch
    pid = p.pid
    p.pid = pid + 50
    assert p.produce(0).error_code == E.invalid_producer_id_mapping
    p.pid = pid
    assert p.produce(0).error_code == E.none
    # A non-transactional batch from a producer with an open transaction.
    req = h.request(
        PRODUCE,
        12,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 1000,
            "topic_data": [
                {
                    "name": "orders",
                    "partition_data": [
                        {
                            "index": 0,
                            "records": make_batch(
                                0, 1, producer_id=pid, producer_epoch=p.epoch, base_sequence=1
                            ),
                        }
                    ],
                }
            ],
        },
    )
    part = h.call(h.leader_of("orders", 0), req).responses[0].partition_responses[0]
    assert part.error_code == E.invalid_txn_state


def test_end_txn_states(h: Harness) -> None:
    p = Producer(h)
    p.init()
    assert p.end(True) == E.invalid_txn_state  # Empty
    p.add(0)
    assert p.end(True, producer_id=1) == E.invalid_producer_id_mapping
    assert p.end(True, producer_epoch=9) == E.producer_fenced
    assert p.end(True) == E.none
    assert p.end(True) == E.none  # a retried commit
    assert p.end(False) == E.invalid_txn_state
    p.add(1)
    assert p.end(False) == E.none
    assert p.end(False) == E.none
    assert p.end(True) == E.invalid_txn_state
    assert p.end(True, transactional_id="") == E.invalid_request


# -- read_committed -------------------------------------------------------------------------


def test_read_committed_stops_at_the_lso_and_lists_aborted(h: Harness) -> None:
    p = Producer(h)
    p.init()
    plain(h, 0)  # 0
    p.add(0)
    p.produce(0, 2)  # 1-2 open
    assert list_latest(h, 0, 1) == 1 and list_latest(h, 0, 0) == 3
    committed = fetch(h, 0, isolation=1)
    assert committed.last_stable_offset == 1 and committed.high_watermark == 3
    assert [b.last_offset for b in batches(committed.records)] == [0]
    assert committed.aborted_transactions == ()
    uncommitted = fetch(h, 0, isolation=0)
    assert [b.last_offset for b in batches(uncommitted.records)] == [0, 2]
    assert uncommitted.aborted_transactions is None
    assert p.end(False) == E.none  # marker at 3
    p.add(0)
    p.produce(0)  # 4
    assert p.end(True) == E.none  # marker at 5
    after = fetch(h, 0, isolation=1)
    assert after.last_stable_offset == after.high_watermark == 6
    got = batches(after.records)
    assert [(b.base_offset, b.is_control) for b in got] == [
        (0, False),
        (1, False),
        (3, True),
        (4, False),
        (5, True),
    ]
    assert [(a.producer_id, a.first_offset) for a in after.aborted_transactions] == [(p.pid, 1)]
    # Reading from after the aborted transaction lists nothing.
    assert fetch(h, 0, 4, isolation=1).aborted_transactions == ()


def test_transaction_timeout_aborts_and_fences(h: Harness) -> None:
    p = Producer(h, timeout_ms=5000)
    p.init()
    p.add(0)
    p.produce(0)
    part = h.state.partition("orders", 0)
    assert part is not None
    h.advance(5.0)
    assert not h.coordinator.transactions.tick(h.now)
    assert part.log.last_stable_offset == 0
    h.advance(0.01)
    assert h.coordinator.transactions.tick(h.now)
    assert part.log.last_stable_offset == part.log.high_watermark == 2
    assert [
        (a.producer_id, a.first_offset) for a in fetch(h, 0, isolation=1).aborted_transactions
    ] == [(p.pid, 0)]
    assert p.end(True) == E.producer_fenced
    assert p.add(0) == {("orders", 0): E.producer_fenced}


# -- offsets in transactions ----------------------------------------------------------------


def offset_fetch(h: Harness, group: str, require_stable: bool) -> Any:
    node = coordinator_node(h.state.node_ids, group)
    req = h.request(
        OFFSET_FETCH,
        7,
        {
            "group_id": group,
            "topics": [{"name": "orders", "partition_indexes": [0]}],
            "require_stable": require_stable,
        },
    )
    return h.call(node, req).topics[0].partitions[0]


def test_txn_offset_commit_needs_add_offsets_and_applies_on_commit(h: Harness) -> None:
    p = Producer(h)
    p.init()
    p.add(0)
    assert p.commit_offsets("g", 5) == E.invalid_txn_state
    assert p.commit_offsets("g", 5, version=4) == E.transaction_abortable
    assert p.add_offsets("g") == E.none
    assert h.coordinator.transactions.txns["tx-1"].partitions >= {offsets_partition("g")}
    assert p.commit_offsets("g", 5) == E.none
    assert p.commit_offsets("", 5) == E.invalid_group_id
    assert p.commit_offsets("g", 5, producer_epoch=9) == E.invalid_producer_epoch
    assert p.commit_offsets("g", 5, generation_id=3, member_id="m") == E.unknown_member_id
    stable = offset_fetch(h, "g", True)
    assert (stable.error_code, stable.committed_offset) == (E.unstable_offset_commit, -1)
    assert offset_fetch(h, "g", False).committed_offset == -1
    assert p.end(True) == E.none
    done = offset_fetch(h, "g", True)
    assert (done.error_code, done.committed_offset) == (E.none, 5)


def test_aborted_txn_offsets_are_dropped(h: Harness) -> None:
    p = Producer(h)
    p.init()
    p.add_offsets("g")
    assert p.commit_offsets("g", 7) == E.none
    assert p.end(False) == E.none
    assert offset_fetch(h, "g", True).committed_offset == -1


def test_transactional_records_need_a_transactional_id(h: Harness) -> None:
    p = Producer(h)
    p.init()
    p.add(0)
    p.txn_id = "tx-1"
    data = make_batch(
        0, 1, attributes=TXN, producer_id=p.pid, producer_epoch=p.epoch, base_sequence=0
    )
    req = h.request(
        PRODUCE,
        12,
        {
            "transactional_id": None,
            "acks": -1,
            "timeout": 1000,
            "topic_data": [
                {"name": "orders", "partition_data": [{"index": 0, "records": data}]},
                {"name": "orders", "partition_data": [{"index": 1, "records": make_batch(0, 1)}]},
            ],
        },
    )
    resp = h.call(h.leader_of("orders", 0), req)
    codes = [p.error_code for t in resp.responses for p in t.partition_responses]
    assert codes == [E.transactional_id_authorization_failed] * 2


# -- strictness audit: ListOffsets and the last fetchable offset (Partition.fetchOffsetForTimestamp)


def list_offset(
    h: Harness, timestamp: int, isolation: int, replica_id: int = -1
) -> tuple[int, int]:
    req = h.request(
        LIST_OFFSETS,
        8,
        {
            "replica_id": replica_id,
            "isolation_level": isolation,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {"partition_index": 0, "current_leader_epoch": -1, "timestamp": timestamp}
                    ],
                }
            ],
        },
    )
    p = h.call(h.leader_of("orders", 0), req).topics[0].partitions[0]
    assert p.error_code == E.none
    return int(p.offset), int(p.timestamp)


def test_timestamp_lookups_past_the_lso_find_nothing_for_read_committed(h: Harness) -> None:
    p = Producer(h)
    p.init()
    plain(h, 0)  # offset 0, max timestamp 1001 (make_batch)
    p.add(0)
    assert p.produce(0, base_timestamp=5000).error_code == E.none  # offset 1, open transaction
    assert list_offset(h, 2000, 0) == (1, 5001)
    assert list_offset(h, 2000, 1) == (-1, -1)
    assert list_offset(h, -3, 1) == (-1, -1)  # the max timestamp is in the open transaction
    assert list_offset(h, 500, 1) == (0, 1001)
    # A debugging replica (-2) is not a client: no isolation, the log end offset.
    assert list_offset(h, -1, 1, replica_id=-2)[0] == 2


# -- strictness audit: verification needs the transaction coordinator (AddPartitionsToTxnManager)


def test_verification_with_the_coordinator_down_gets_not_enough_replicas(h: Harness) -> None:
    p = Producer(h)
    p.init()
    p.add(0, 1)
    assert p.produce(0).error_code == E.none
    assert (p.coordinator, h.leader_of("orders", 0), h.leader_of("orders", 1)) == (2, 0, 1)
    h.state.stopped_nodes.add(p.coordinator)
    # Partition 0 has the producer's open transaction: no verification, the write goes on.
    assert p.produce(0).error_code == E.none
    # Partition 1's first transactional write must be verified: the coordinator is down.
    assert p.produce(1).error_code == E.not_enough_replicas
    assert p.commit_offsets("g", 1) == E.coordinator_not_available


def test_transactional_ids_kept_are_bounded(h: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    from devbroker import transactions

    monkeypatch.setattr(transactions, "MAX_TRANSACTIONAL_IDS", 3)
    busy = Producer(h, "busy")
    busy.init()
    busy.add(0)  # ongoing: never forgotten
    for i in range(5):
        idle = Producer(h, f"idle-{i}")
        assert idle.init().error_code == E.none
    kept = h.coordinator.transactions.txns
    assert len(kept) == 3 and "busy" in kept and "idle-4" in kept


def test_transactional_batches_of_two_producers_in_one_request_fail_it(h: Harness) -> None:
    """ReplicaManager: "Transactional records contained more than one producer ID"."""
    p = Producer(h)
    p.init()
    p.add(0, 3)
    assert h.leader_of("orders", 0) == h.leader_of("orders", 3)

    def txn(pid: int) -> bytes:
        return make_batch(
            0, 1, attributes=TXN, producer_id=pid, producer_epoch=p.epoch, base_sequence=0
        )

    req = h.request(
        PRODUCE,
        12,
        {
            "transactional_id": p.txn_id,
            "acks": -1,
            "timeout": 1000,
            "topic_data": [
                {
                    "name": "orders",
                    "partition_data": [
                        {"index": 0, "records": txn(p.pid)},
                        {"index": 3, "records": txn(p.pid + 1)},
                    ],
                }
            ],
        },
    )
    resp = h.call(h.leader_of("orders", 0), req)
    codes = [x.error_code for t in resp.responses for x in t.partition_responses]
    assert codes == [E.invalid_producer_id_mapping] * 2
    assert h.state.partition("orders", 0).log.log_end_offset == 0  # type: ignore[union-attr]


def test_an_exhausted_epoch_rotates_the_producer_id(h: Harness) -> None:
    p = Producer(h)
    p.init()
    first = p.pid
    h.coordinator.transactions.txns["tx-1"].producer_epoch = 2**15 - 2
    p.epoch = 2**15 - 2
    resp = p.init(producer_id=first, producer_epoch=2**15 - 2)
    assert (resp.error_code, resp.producer_epoch) == (E.none, 0)
    assert resp.producer_id != first
    # A retry of that call (its answer lost) is recognised through the previous id.
    retry = p.init(producer_id=first, producer_epoch=2**15 - 2)
    assert (retry.error_code, retry.producer_id, retry.producer_epoch) == (
        E.none,
        resp.producer_id,
        0,
    )


# -- strictness audit: markers wait for down leaders (TransactionMarkerChannelManager) --------


def test_markers_for_a_down_leader_keep_the_transaction_completing(h: Harness) -> None:
    p = Producer(h)
    p.init()
    p.add(0, 1)
    p.produce(0)
    p.produce(1)
    down = h.leader_of("orders", 1)
    assert down not in (p.coordinator, h.leader_of("orders", 0))
    h.state.stopped_nodes.add(down)
    assert p.end(True) == E.none  # answered once PrepareCommit is logged
    txns = h.coordinator.transactions
    assert txns.txns["tx-1"].state.value == "PrepareCommit"
    part0, part1 = h.state.partition("orders", 0), h.state.partition("orders", 1)
    assert part0 is not None and part1 is not None
    assert part0.log.last_stable_offset == part0.log.high_watermark == 2  # marker written
    assert part1.log.last_stable_offset == 0  # still open there
    assert p.end(True) == E.concurrent_transactions
    assert p.end(False) == E.invalid_txn_state
    assert p.add(0) == {("orders", 0): E.concurrent_transactions}
    assert Producer(h).init().error_code == E.concurrent_transactions
    h.state.stopped_nodes.discard(down)
    assert txns.retry_markers()
    assert txns.txns["tx-1"].state.value == "CompleteCommit"
    assert part1.log.last_stable_offset == part1.log.high_watermark == 2
    assert p.end(True) == E.none


# -- transactions V2 (KIP-890 part 2) ------------------------------------------------------


def end_v5(p: Producer, commit: bool, epoch: int | None = None) -> tuple[Any, int, int]:
    data = {
        "transactional_id": p.txn_id,
        "producer_id": p.pid,
        "producer_epoch": p.epoch if epoch is None else epoch,
        "committed": commit,
    }
    r = p.h.call(p.coordinator, p.h.request(END_TXN, 5, data))
    return r.error_code, r.producer_id, r.producer_epoch


def test_api_versions_finalizes_transaction_version_2(h: Harness) -> None:
    r = h.call(
        0,
        h.request(18, 3, {"client_software_name": "t", "client_software_version": "1"}),
    )
    finalized = {f.name: (f.min_version_level, f.max_version_level) for f in r.finalized_features}
    assert finalized == {"transaction.version": (2, 2)}
    assert r.finalized_features_epoch > 0
    versions = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert versions[END_TXN][1] == 5 and versions[ADD_PARTITIONS][1] == 5
    assert versions[TXN_OFFSET_COMMIT][1] == 5


def test_produce_v12_adds_the_partition_and_v11_does_not(h: Harness) -> None:
    p = Producer(h)
    assert p.init().error_code == E.none
    assert p.produce(0, version=11).error_code == E.transaction_abortable
    assert p.produce(0, version=12).error_code == E.none
    assert p.produce(1, version=12).error_code == E.none
    assert end_v5(p, commit=True) == (E.none, p.pid, 1)
    for partition in (0, 1):
        part = h.state.partition("orders", partition)
        assert part is not None
        marker = list(records.iter_batches(part.log.data))[-1]
        assert marker.is_control and control_type(part.log.data, marker) == COMMIT
        assert marker.producer_epoch == 1


def test_end_txn_v5_bumps_the_epoch_and_resets_sequences(h: Harness) -> None:
    p = Producer(h)
    p.init()
    assert p.produce(0, 2).error_code == E.none
    assert end_v5(p, commit=True) == (E.none, p.pid, 1)
    # A retry with the previous epoch is recognised; the old epoch is fenced elsewhere.
    assert end_v5(p, commit=True) == (E.none, p.pid, 1)
    assert p.add(1) == {("orders", 1): E.producer_fenced}
    assert p.produce(1).error_code == E.invalid_producer_epoch
    p.epoch = 1
    assert p.produce(0).error_code == E.out_of_order_sequence_number  # sequence 2
    p.seq = {}
    assert p.produce(0).error_code == E.none
    assert end_v5(p, commit=False) == (E.none, p.pid, 2)
    # An abort with nothing ongoing bumps again; a retry of it answers the same epoch.
    p.epoch = 2
    assert end_v5(p, commit=False) == (E.none, p.pid, 3)
    assert end_v5(p, commit=False) == (E.none, p.pid, 3)
    assert end_v5(p, commit=True, epoch=3) == (E.invalid_txn_state, -1, -1)
    assert end_v5(p, commit=False, epoch=1) == (E.producer_fenced, -1, -1)


def test_txn_offset_commit_v5_adds_the_offsets_partition(h: Harness) -> None:
    p = Producer(h)
    p.init()
    group = "g-v2"
    node = coordinator_node(h.state.node_ids, group)
    data = {
        "transactional_id": p.txn_id,
        "group_id": group,
        "producer_id": p.pid,
        "producer_epoch": p.epoch,
        "generation_id": -1,
        "member_id": "",
        "group_instance_id": None,
        "topics": [
            {
                "name": "orders",
                "partitions": [
                    {
                        "partition_index": 0,
                        "committed_offset": 7,
                        "committed_leader_epoch": -1,
                        "committed_metadata": None,
                    }
                ],
            }
        ],
    }
    v4 = h.call(node, h.request(TXN_OFFSET_COMMIT, 4, data))
    assert v4.topics[0].partitions[0].error_code == E.transaction_abortable
    v5 = h.call(node, h.request(TXN_OFFSET_COMMIT, 5, data))
    assert v5.topics[0].partitions[0].error_code == E.none
    assert offsets_partition(group) in h.coordinator.transactions.txns[p.txn_id].partitions


def test_add_partitions_v4_is_the_batched_form(h: Harness) -> None:
    p = Producer(h)
    p.init()

    def batched(verify_only: bool, version: int = 4) -> dict[Any, Any]:
        data = {
            "transactions": [
                {
                    "transactional_id": p.txn_id,
                    "producer_id": p.pid,
                    "producer_epoch": p.epoch,
                    "verify_only": verify_only,
                    "topics": [{"name": "orders", "partitions": [2]}],
                }
            ]
        }
        r = h.call(p.coordinator, h.request(ADD_PARTITIONS, version, data))
        assert r.error_code == E.none
        return {
            (t.transactional_id, x.name, y.partition_index): y.partition_error_code
            for t in r.results_by_transaction
            for x in t.topic_results
            for y in x.results_by_partition
        }

    assert batched(True) == {(p.txn_id, "orders", 2): E.transaction_abortable}
    assert batched(False, 5) == {(p.txn_id, "orders", 2): E.none}
    assert batched(True) == {(p.txn_id, "orders", 2): E.none}
