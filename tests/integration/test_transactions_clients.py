"""Transactions with real clients: the upstream directly, and through the proxy.

Every scenario runs on both backends, the dev cluster and real Kafka
(``backend`` is parametrised over ``BACKENDS``), in each of three modes:
directly, through the proxy, and through the proxy with a record limit.

A confluent-kafka transactional producer commits and aborts transactions over
three partitions; consumers with isolation.level=read_committed
(confluent-kafka, kafka-python, aiokafka) get every committed record exactly
once and no aborted one, read_uncommitted consumers get both.  Each partition
ends with a committed sentinel record, so a consumer is done once it has seen
every sentinel (records arrive in order per partition).  Through the proxy the
same runs with --max-partition-records 3, so that the aborted-transaction
lists are cut to each delivered part of a partition.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import aiokafka
import confluent_kafka
import kafka
import pytest
from support.backends import BACKENDS, running, upstream_for
from support.kafka import KafkaCluster
from support.stack import ProxyStack

from proxy.observe.metrics import Metrics

pytestmark = pytest.mark.integration

DEADLINE = 60.0  # seconds; every client loop below is bounded by it
PARTITIONS = 3
SENTINEL = b"sentinel"


class Stack(ProxyStack):
    """The upstream (a 3-node dev cluster, or real Kafka), behind a Proxy with
    *proxy_settings* unless they are None."""

    def __init__(
        self, proxy_settings: dict[str, Any] | None, upstream: KafkaCluster | None
    ) -> None:
        super().__init__(
            proxy_settings,
            with_proxy=proxy_settings is not None,
            metrics=Metrics(process_metrics=False),
            name="txn-stack",
            upstream=upstream,
        )
        self.proxy_settings = proxy_settings

    def create_topic(self, partitions: int, prefix: str = "txn") -> str:
        return super().create_topic(partitions, prefix)

    def trimmed_records(self, limit: str) -> float:
        total = 0.0
        for family in self.metrics.registry.collect():
            for sample in family.samples:
                if (
                    sample.name.endswith("trimmed_records_total")
                    and sample.labels.get("limit") == limit
                ):
                    total += sample.value
        return total

    def aborted_count(self, topic: str) -> int | None:
        """Aborted transactions in the dev cluster's logs (None: real Kafka does not say;
        there the read_uncommitted tests show the aborted records are in the log)."""
        if self.kafka is not None:
            return None

        def count() -> int:
            return sum(len(p.log.aborted) for p in self.cluster.state.topics[topic].partitions)

        return self.run_sync(count)


@pytest.fixture(scope="module", params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(
    scope="module",
    params=[None, {}, {"max_partition_records": 3}],
    ids=["direct", "proxy", "proxy-max-partition-records-3"],
)
def stack(request: pytest.FixtureRequest, backend: str) -> Iterator[Stack]:
    with running(Stack(request.param, upstream_for(request, backend))) as s:
        yield s


class Scenario:
    """What the transactional producer wrote, and what each isolation level must deliver."""

    def __init__(self, topic: str) -> None:
        self.topic = topic
        self.committed: list[tuple[int, bytes]] = []
        self.aborted: list[tuple[int, bytes]] = []


def produce_transactions(stack: Stack) -> Scenario:
    """Committed, aborted, interleaved with a second producer, then committed sentinels."""
    topic = stack.create_topic(PARTITIONS)
    s = Scenario(topic)
    tag = uuid.uuid4().hex[:6]

    def producer(name: str) -> Any:
        p = confluent_kafka.Producer(
            {
                "bootstrap.servers": stack.bootstrap,
                "transactional.id": f"{name}-{tag}",
                "linger.ms": 2,
                "transaction.timeout.ms": 60000,
            }
        )
        p.init_transactions(DEADLINE)
        return p

    def txn(p: Any, records: list[tuple[int, bytes]], commit: bool) -> None:
        p.begin_transaction()
        for partition, value in records:
            p.produce(topic, value, partition=partition)
        if commit:
            p.commit_transaction(DEADLINE)
            s.committed.extend(records)
        else:
            p.flush(DEADLINE)  # the aborted records really are in the log
            p.abort_transaction(DEADLINE)
            s.aborted.extend(records)

    a, b = producer("a"), producer("b")
    for round_ in range(4):
        for p, name in ((a, "a"), (b, "b")):
            recs = [(i % PARTITIONS, f"{name}-{round_}-{i}".encode()) for i in range(7)]
            txn(p, recs, commit=(round_ + (name == "b")) % 2 == 0)
    # b opens a transaction that a's commits overtake, then aborts it.
    b.begin_transaction()
    open_recs = [(i % PARTITIONS, f"b-open-{i}".encode()) for i in range(5)]
    for partition, value in open_recs:
        b.produce(topic, value, partition=partition)
    b.flush(DEADLINE)
    txn(a, [(i % PARTITIONS, f"a-mid-{i}".encode()) for i in range(5)], commit=True)
    b.abort_transaction(DEADLINE)
    s.aborted.extend(open_recs)
    txn(a, [(p, SENTINEL) for p in range(PARTITIONS)], commit=True)
    aborted = stack.aborted_count(topic)
    assert aborted is None or aborted >= 5
    return s


def check(s: Scenario, got: list[tuple[int, bytes]], committed_only: bool) -> None:
    expected = s.committed if committed_only else s.committed + s.aborted
    assert sorted(got) == sorted(expected)  # exactly once: no duplicates, nothing missing
    if committed_only:
        assert not set(got) & set(s.aborted)
    for p in range(PARTITIONS):
        mine = [v for part, v in got if part == p]
        assert mine[-1] == SENTINEL


def done(got: list[tuple[int, bytes]]) -> bool:
    return sum(1 for _p, v in got if v == SENTINEL) >= PARTITIONS


def consume_confluent(stack: Stack, topic: str, isolation: str) -> list[tuple[int, bytes]]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": stack.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": isolation,
        }
    )
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(PARTITIONS)
            ]
        )
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + DEADLINE
        while not done(got):
            assert time.monotonic() < deadline, f"timed out with {len(got)} records"
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.value()))
        return got
    finally:
        consumer.close()


def consume_kafka_python(stack: Stack, topic: str, isolation: str) -> list[tuple[int, bytes]]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=stack.bootstrap,
        isolation_level=isolation,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=int(DEADLINE * 1000),
    )
    try:
        consumer.assign([kafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
        got: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + DEADLINE
        while not done(got):
            assert time.monotonic() < deadline, f"timed out with {len(got)} records"
            for records in consumer.poll(timeout_ms=200).values():
                got.extend((r.partition, r.value) for r in records)
        return got
    finally:
        consumer.close()


def consume_aiokafka(stack: Stack, topic: str, isolation: str) -> list[tuple[int, bytes]]:
    async def run() -> list[tuple[int, bytes]]:
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=stack.bootstrap,
            isolation_level=isolation,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
        )
        await consumer.start()
        try:
            consumer.assign([aiokafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
            got: list[tuple[int, bytes]] = []
            while not done(got):
                batch = await consumer.getmany(timeout_ms=200)
                for records in batch.values():
                    got.extend((r.partition, r.value) for r in records)
            return got
        finally:
            await consumer.stop()

    async def bounded() -> list[tuple[int, bytes]]:
        return await asyncio.wait_for(run(), DEADLINE)

    return asyncio.run(bounded())


CONSUMERS = {
    "confluent": consume_confluent,
    "kafka-python": consume_kafka_python,
    "aiokafka": consume_aiokafka,
}


@pytest.fixture(scope="module")
def scenario(stack: Stack) -> Scenario:
    return produce_transactions(stack)


@pytest.mark.parametrize("client", sorted(CONSUMERS))
def test_read_committed_delivers_committed_records_once_and_no_aborted(
    stack: Stack, scenario: Scenario, client: str
) -> None:
    got = CONSUMERS[client](stack, scenario.topic, "read_committed")
    check(scenario, got, committed_only=True)
    if stack.proxy_settings and "max_partition_records" in stack.proxy_settings:
        # The proxy really cut the partitions (and their aborted-transaction lists).
        assert stack.trimmed_records("max_partition_records") > 0


@pytest.mark.parametrize("client", sorted(CONSUMERS))
def test_read_uncommitted_delivers_both(stack: Stack, scenario: Scenario, client: str) -> None:
    got = CONSUMERS[client](stack, scenario.topic, "read_uncommitted")
    check(scenario, got, committed_only=False)


def test_consume_transform_produce_commits_offsets_in_the_transaction(stack: Stack) -> None:
    """send_offsets_to_transaction: AddOffsetsToTxn + TxnOffsetCommit, applied on commit only."""
    source = stack.create_topic(1)
    plain = confluent_kafka.Producer({"bootstrap.servers": stack.bootstrap})
    for i in range(6):
        plain.produce(source, f"in-{i}".encode(), partition=0)
    assert plain.flush(DEADLINE) == 0
    group = f"ctp-{uuid.uuid4().hex[:8]}"
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": stack.bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "isolation.level": "read_committed",
        }
    )
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": stack.bootstrap, "transactional.id": f"ctp-{group}"}
    )
    try:
        producer.init_transactions(DEADLINE)
        consumer.assign(
            [confluent_kafka.TopicPartition(source, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        seen = 0
        deadline = time.monotonic() + DEADLINE
        while seen < 3:
            assert time.monotonic() < deadline
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                seen += 1

        def send(offset: int, commit: bool) -> None:
            producer.begin_transaction()
            producer.send_offsets_to_transaction(
                [confluent_kafka.TopicPartition(source, 0, offset)],
                consumer.consumer_group_metadata(),
                DEADLINE,
            )
            if commit:
                producer.commit_transaction(DEADLINE)
            else:
                producer.abort_transaction(DEADLINE)

        send(3, commit=True)
        send(5, commit=False)
        committed = consumer.committed([confluent_kafka.TopicPartition(source, 0)], DEADLINE)
        assert committed[0].offset == 3
    finally:
        consumer.close()


@pytest.fixture
def timeout_upstream(request: pytest.FixtureRequest, backend: str) -> Iterator[Any]:
    """The upstream directly, its transaction coordinator checking for timed-out
    transactions often: a dev cluster (0.1 s), or real Kafka (the fixture's 1 s)."""
    kafka_cluster = upstream_for(request, backend)
    if kafka_cluster is not None:
        yield kafka_cluster
        return
    from support.cluster import ThreadedCluster

    with ThreadedCluster(3, {}, txn_cleanup_interval=0.1) as cluster:
        yield cluster


def test_a_timed_out_transaction_is_aborted_and_its_producer_fenced(
    timeout_upstream: Any,
) -> None:
    """transaction.timeout.ms passes: the coordinator aborts (bumping the epoch) on its tick."""
    cluster = timeout_upstream
    slow = f"slow-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(slow, 1)
    tp = confluent_kafka.TopicPartition(slow, 0)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "transactional.id": f"slow-{uuid.uuid4().hex[:6]}",
            "transaction.timeout.ms": 1000,
        }
    )
    producer.init_transactions(DEADLINE)
    producer.begin_transaction()
    producer.produce(slow, b"never-committed", partition=0)
    assert producer.flush(DEADLINE) == 0
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        # The coordinator's abort marker lands at offset 1: the high watermark becomes 2.
        deadline = time.monotonic() + DEADLINE
        while consumer.get_watermark_offsets(tp, timeout=DEADLINE, cached=False)[1] < 2:
            assert time.monotonic() < deadline, "the transaction was never aborted"
            producer.poll(0.1)
        with pytest.raises(confluent_kafka.KafkaException) as failure:
            producer.commit_transaction(DEADLINE)
        error = failure.value.args[0]
        assert error.fatal() or error.txn_requires_abort()
        consumer.assign([confluent_kafka.TopicPartition(slow, 0, 0)])
        # The high watermark is 2 (record + abort marker); read_committed delivers nothing.
        low, high = consumer.get_watermark_offsets(tp, timeout=DEADLINE)
        assert (low, high) == (0, 2)
        got = []
        deadline = time.monotonic() + DEADLINE
        while consumer.position([tp])[0].offset < 2:
            assert time.monotonic() < deadline
            msg = consumer.poll(0.1)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
        assert got == []
    finally:
        consumer.close()
