"""Real Kafka clients directly against a 3-node dev cluster (no proxy).

confluent-kafka (librdkafka), kafka-python and aiokafka produce to and consume
from 12 partitions, with assign() and with group subscribe(); every record
comes back exactly once, in order per partition, with its key, value, headers
and timestamp; compressed batches are stored exactly as the producer sent them
(the compression codec in the stored batch header is the producer's).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import defaultdict
from typing import Any

import pytest
from support.cluster import ThreadedCluster
from support.kafka_python import GROUP_POLL_MS

from proxy.protocol import records

pytestmark = pytest.mark.integration

PARTITIONS = 12
RECORDS = 240
DEADLINE = 45.0  # seconds; every client loop below is bounded by it
BASE_TS = 1_700_000_000_000

CODEC_IDS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}


class Expected:
    """Records to produce, and a check of what came back."""

    def __init__(self, topic: str, count: int = RECORDS) -> None:
        self.topic = topic
        self.records = [
            {
                "partition": i % PARTITIONS,
                "key": f"key-{i}".encode(),
                "value": (f"value-{i}-" * (1 + i % 7)).encode(),
                "headers": [("idx", str(i).encode()), ("kind", b"test")],
                "timestamp": BASE_TS + i,
            }
            for i in range(count)
        ]

    def check(self, consumed: list[dict[str, Any]]) -> None:
        by_partition: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in consumed:
            by_partition[r["partition"]].append(r)
        expected: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for r in self.records:
            expected[r["partition"]].append(r)
        assert sorted(by_partition) == sorted(expected)
        for p, want in expected.items():
            got = by_partition[p]
            assert [r["offset"] for r in got] == list(range(len(want))), f"partition {p}"
            for g, w in zip(got, want, strict=True):
                assert g["key"] == w["key"]
                assert g["value"] == w["value"]
                assert [(k, bytes(v)) for k, v in g["headers"]] == w["headers"]
                assert g["timestamp"] == w["timestamp"]


def stored_codecs(cluster: ThreadedCluster, topic: str) -> set[int]:
    def codecs() -> set[int]:
        assert cluster.cluster is not None
        out: set[int] = set()
        for p in cluster.cluster.state.topics[topic].partitions:
            out |= {h.compression for h in records.iter_batches(p.log.data)}
        return out

    result: set[int] = cluster.run_sync(codecs)
    return result


def sessions_created(cluster: ThreadedCluster) -> int:
    def count() -> int:
        assert cluster.cluster is not None
        return sum(n.sessions.sessions_created for n in cluster.cluster.nodes)

    result: int = cluster.run_sync(count)
    return result


def assert_stored_with(cluster: ThreadedCluster, compression: str) -> None:
    """The stored batches carry the producer's codec: the broker did not recompress them.

    A client may send a small batch uncompressed when compressing would not
    shrink it (kafka-python does), so uncompressed batches are allowed too.
    """
    codecs = stored_codecs(cluster, "orders")
    assert CODEC_IDS[compression] in codecs
    assert codecs <= {0, CODEC_IDS[compression]}


@pytest.fixture
def cluster(dev_cluster_factory: Any) -> ThreadedCluster:
    c: ThreadedCluster = dev_cluster_factory(3, {"orders": PARTITIONS})
    return c


# -- confluent-kafka ------------------------------------------------------------------


def ck_produce(bootstrap: str, exp: Expected, compression: str = "none", **extra: Any) -> None:
    from confluent_kafka import Producer

    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "compression.type": compression,
            "linger.ms": 5,
            "message.timeout.ms": int(DEADLINE * 1000),
        }
        | extra
    )
    errors: list[Any] = []
    for r in exp.records:
        producer.produce(
            exp.topic,
            key=r["key"],
            value=r["value"],
            partition=r["partition"],
            headers=r["headers"],
            timestamp=r["timestamp"],
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(DEADLINE) == 0
    assert errors == []


def ck_consume(consumer: Any, want: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + DEADLINE
    while len(out) < want and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is None:
            continue
        assert msg.error() is None, msg.error()
        out.append(
            {
                "partition": msg.partition(),
                "offset": msg.offset(),
                "key": msg.key(),
                "value": msg.value(),
                "headers": msg.headers() or [],
                "timestamp": msg.timestamp()[1],
            }
        )
    return out


@pytest.mark.parametrize("compression", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_assign(cluster: ThreadedCluster, compression: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    exp = Expected("orders")
    ck_produce(cluster.bootstrap, exp, compression)
    assert_stored_with(cluster, compression)
    consumer = Consumer(
        {"bootstrap.servers": cluster.bootstrap, "group.id": "unused", "enable.auto.commit": False}
    )
    try:
        consumer.assign([TopicPartition("orders", p, 0) for p in range(PARTITIONS)])
        exp.check(ck_consume(consumer, RECORDS))
    finally:
        consumer.close()


def test_confluent_kafka_idempotent_producer_and_group_of_two(cluster: ThreadedCluster) -> None:
    from confluent_kafka import Consumer

    group = f"ck-{uuid.uuid4()}"
    conf = {
        "bootstrap.servers": cluster.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "session.timeout.ms": 10000,
        "heartbeat.interval.ms": 500,
    }
    first, second = Consumer(conf), Consumer(conf)
    try:
        first.subscribe(["orders"])
        second.subscribe(["orders"])
        deadline = time.monotonic() + DEADLINE
        while time.monotonic() < deadline:
            for c in (first, second):
                assert ck_consume_once(c) == []  # nothing produced yet
            a = {tp.partition for tp in first.assignment()}
            b = {tp.partition for tp in second.assignment()}
            if a and b and len(a) + len(b) == PARTITIONS:
                break
        assert a and b and not a & b and a | b == set(range(PARTITIONS))
        exp = Expected("orders")
        ck_produce(cluster.bootstrap, exp, "lz4", **{"enable.idempotence": True})
        consumed: list[dict[str, Any]] = []
        while len(consumed) < RECORDS and time.monotonic() < deadline:
            for c in (first, second):
                consumed.extend(ck_consume_once(c))
        exp.check(consumed)
        first.commit(asynchronous=False)
        second.commit(asynchronous=False)
    finally:
        first.close()
        second.close()


def ck_consume_once(consumer: Any) -> list[dict[str, Any]]:
    out = []
    for msg in consumer.consume(num_messages=100, timeout=0.2):
        assert msg.error() is None, msg.error()
        out.append(
            {
                "partition": msg.partition(),
                "offset": msg.offset(),
                "key": msg.key(),
                "value": msg.value(),
                "headers": msg.headers() or [],
                "timestamp": msg.timestamp()[1],
            }
        )
    return out


def test_confluent_kafka_subscribe_resumes_from_committed_offsets(cluster: ThreadedCluster) -> None:
    from confluent_kafka import Consumer

    exp = Expected("orders")
    ck_produce(cluster.bootstrap, exp)
    group = f"ck-{uuid.uuid4()}"
    conf = {
        "bootstrap.servers": cluster.bootstrap,
        "group.id": group,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }
    consumer = Consumer(conf)
    consumer.subscribe(["orders"])
    try:
        exp.check(ck_consume(consumer, RECORDS))
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    more = Expected("orders", RECORDS + 24)
    ck_produce(cluster.bootstrap, _tail(more, RECORDS))
    again = Consumer(conf)
    again.subscribe(["orders"])
    try:
        rest = ck_consume(again, 24)
    finally:
        again.close()
    assert sorted((r["partition"], r["offset"]) for r in rest) == sorted(
        (p, RECORDS // PARTITIONS + k) for p in range(PARTITIONS) for k in range(2)
    )


def _tail(exp: Expected, start: int) -> Expected:
    tail = Expected(exp.topic, 0)
    tail.records = exp.records[start:]
    return tail


# -- kafka-python ------------------------------------------------------------------


def kp_produce(bootstrap: str, exp: Expected, compression: str | None) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        compression_type=compression,
        linger_ms=5,
        request_timeout_ms=int(DEADLINE * 1000),
    )
    try:
        futures = [
            producer.send(
                exp.topic,
                key=r["key"],
                value=r["value"],
                partition=r["partition"],
                headers=r["headers"],
                timestamp_ms=r["timestamp"],
            )
            for r in exp.records
        ]
        producer.flush(DEADLINE)
        for f in futures:
            f.get(timeout=DEADLINE)
    finally:
        producer.close(timeout=10)


def kp_consume(consumer: Any, want: int, poll_ms: int = 200) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + DEADLINE
    while len(out) < want and time.monotonic() < deadline:
        for _tp, msgs in consumer.poll(timeout_ms=poll_ms).items():
            for m in msgs:
                out.append(
                    {
                        "partition": m.partition,
                        "offset": m.offset,
                        "key": m.key,
                        "value": m.value,
                        "headers": list(m.headers),
                        "timestamp": m.timestamp,
                    }
                )
    return out


@pytest.mark.parametrize("compression", [None, "gzip", "snappy", "lz4", "zstd"])
def test_kafka_python_assign(cluster: ThreadedCluster, compression: str | None) -> None:
    from kafka import KafkaConsumer, TopicPartition

    exp = Expected("orders")
    kp_produce(cluster.bootstrap, exp, compression)
    assert_stored_with(cluster, compression or "none")
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False)
    try:
        parts = [TopicPartition("orders", p) for p in range(PARTITIONS)]
        consumer.assign(parts)
        consumer.seek_to_beginning()
        exp.check(kp_consume(consumer, RECORDS))
    finally:
        consumer.close()
    # kafka-python >= 2.1 fetches through KIP-227 sessions: one per node it fetches from.
    assert sessions_created(cluster) == 3


def test_kafka_python_subscribe(cluster: ThreadedCluster) -> None:
    from kafka import KafkaConsumer

    exp = Expected("orders")
    ck_produce(cluster.bootstrap, exp, "zstd")
    consumer = KafkaConsumer(
        "orders",
        bootstrap_servers=cluster.bootstrap,
        group_id=f"kp-{uuid.uuid4()}",
        auto_offset_reset="earliest",
        session_timeout_ms=10000,
        heartbeat_interval_ms=500,
    )
    try:
        exp.check(kp_consume(consumer, RECORDS, GROUP_POLL_MS))
        consumer.commit()
        committed = {
            p: consumer.committed(tp) for tp in consumer.assignment() for p in [tp.partition]
        }
        assert committed == {p: RECORDS // PARTITIONS for p in range(PARTITIONS)}
    finally:
        consumer.close()


# -- aiokafka -------------------------------------------------------------------------


async def ak_produce(bootstrap: str, exp: Expected, compression: str | None) -> None:
    from aiokafka import AIOKafkaProducer

    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap, compression_type=compression, linger_ms=5
    )
    await producer.start()
    try:
        futures = [
            await producer.send(
                exp.topic,
                key=r["key"],
                value=r["value"],
                partition=r["partition"],
                headers=r["headers"],
                timestamp_ms=r["timestamp"],
            )
            for r in exp.records
        ]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def ak_consume(consumer: Any, want: int) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + DEADLINE
    while len(out) < want and time.monotonic() < deadline:
        batch = await consumer.getmany(timeout_ms=200)
        for _tp, msgs in batch.items():
            for m in msgs:
                out.append(
                    {
                        "partition": m.partition,
                        "offset": m.offset,
                        "key": m.key,
                        "value": m.value,
                        "headers": list(m.headers),
                        "timestamp": m.timestamp,
                    }
                )
    return out


@pytest.mark.parametrize("compression", [None, "gzip", "snappy", "lz4", "zstd"])
def test_aiokafka_assign(cluster: ThreadedCluster, compression: str | None) -> None:
    from aiokafka import AIOKafkaConsumer, TopicPartition

    exp = Expected("orders")

    async def main() -> list[dict[str, Any]]:
        await ak_produce(cluster.bootstrap, exp, compression)
        consumer = AIOKafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([TopicPartition("orders", p) for p in range(PARTITIONS)])
            await consumer.seek_to_beginning()
            return await ak_consume(consumer, RECORDS)
        finally:
            await consumer.stop()

    consumed = asyncio.run(asyncio.wait_for(main(), DEADLINE + 15))
    assert_stored_with(cluster, compression or "none")
    exp.check(consumed)


def test_aiokafka_subscribe(cluster: ThreadedCluster) -> None:
    from aiokafka import AIOKafkaConsumer

    exp = Expected("orders")

    async def main() -> list[dict[str, Any]]:
        await ak_produce(cluster.bootstrap, exp, "gzip")
        consumer = AIOKafkaConsumer(
            "orders",
            bootstrap_servers=cluster.bootstrap,
            group_id=f"ak-{uuid.uuid4()}",
            auto_offset_reset="earliest",
            session_timeout_ms=10000,
            heartbeat_interval_ms=500,
        )
        await consumer.start()
        try:
            out = await ak_consume(consumer, RECORDS)
            await consumer.commit()
            return out
        finally:
            await consumer.stop()

    exp.check(asyncio.run(asyncio.wait_for(main(), DEADLINE + 15)))


@pytest.mark.parametrize("compression", ["none", "gzip"])
def test_confluent_kafka_offsets_for_times(cluster: ThreadedCluster, compression: str) -> None:
    from confluent_kafka import Consumer, TopicPartition

    exp = Expected("orders")
    ck_produce(cluster.bootstrap, exp, compression, **{"linger.ms": 50})
    per_partition = RECORDS // PARTITIONS
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "unused"})
    try:
        # Partition p holds timestamps BASE_TS + p + 12k at offset k.
        wanted = [
            TopicPartition("orders", p, BASE_TS + p + PARTITIONS * 5 - 1) for p in range(PARTITIONS)
        ]
        found = consumer.offsets_for_times(wanted, timeout=DEADLINE)
        assert [(tp.partition, tp.offset) for tp in found] == [(p, 5) for p in range(PARTITIONS)]
        late = consumer.offsets_for_times(
            [TopicPartition("orders", 0, BASE_TS + RECORDS)], timeout=DEADLINE
        )
        assert late[0].offset == -1  # no record at or after that time: the end (OFFSET_END)
    finally:
        consumer.close()

    def largest_batch() -> int:
        assert cluster.cluster is not None
        return max(
            h.records_count
            for p in cluster.cluster.state.topics["orders"].partitions
            for h in records.iter_batches(p.log.data)
        )

    # The answers come from inside batches, not from their first offsets.
    assert per_partition > 5 and cluster.run_sync(largest_batch) > 5


# -- fault hooks with real clients ---------------------------------------------------------


def test_kafka_python_recovers_from_evicted_fetch_sessions(cluster: ThreadedCluster) -> None:
    from kafka import KafkaConsumer, TopicPartition

    first, second = Expected("orders"), _tail(Expected("orders", 2 * RECORDS), RECORDS)
    ck_produce(cluster.bootstrap, first)
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap, enable_auto_commit=False)
    try:
        consumer.assign([TopicPartition("orders", p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        consumed = kp_consume(consumer, RECORDS)
        created = sessions_created(cluster)
        cluster.evict_fetch_sessions()  # the next incremental fetches get FETCH_SESSION_ID_NOT_FOUND
        ck_produce(cluster.bootstrap, second)
        consumed += kp_consume(consumer, RECORDS)
    finally:
        consumer.close()
    full = Expected("orders", 2 * RECORDS)
    full.check(consumed)
    assert sessions_created(cluster) > created  # the client opened new sessions


def test_confluent_kafka_survives_a_node_restart(cluster: ThreadedCluster) -> None:
    from confluent_kafka import Consumer, TopicPartition

    first, second = Expected("orders"), _tail(Expected("orders", 2 * RECORDS), RECORDS)
    ck_produce(cluster.bootstrap, first)
    consumer = Consumer(
        {
            "bootstrap.servers": cluster.bootstrap_servers,
            "group.id": "unused",
            "enable.auto.commit": False,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 200,
            "topic.metadata.refresh.interval.ms": 500,
        }
    )
    try:
        consumer.assign([TopicPartition("orders", p, 0) for p in range(PARTITIONS)])
        consumed = ck_consume(consumer, RECORDS)
        cluster.stop_node(1)
        cluster.restart_node(1)
        ck_produce(cluster.bootstrap, second)
        consumed += ck_consume(consumer, RECORDS)
    finally:
        consumer.close()
    Expected("orders", 2 * RECORDS).check(consumed)


def test_confluent_kafka_producer_rides_out_dropped_connections(cluster: ThreadedCluster) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition

    exp = Expected("orders")
    producer = Producer(
        {
            "bootstrap.servers": cluster.bootstrap,
            "enable.idempotence": True,
            "linger.ms": 5,
            "reconnect.backoff.ms": 50,
            "message.timeout.ms": int(DEADLINE * 1000),
        }
    )
    errors: list[Any] = []
    for i, r in enumerate(exp.records):
        if i == RECORDS // 2:
            assert producer.flush(DEADLINE) == 0
            cluster.drop_connections()  # every node closes every client connection
        producer.produce(
            exp.topic,
            key=r["key"],
            value=r["value"],
            partition=r["partition"],
            headers=r["headers"],
            timestamp=r["timestamp"],
            on_delivery=lambda err, _msg: errors.append(err) if err else None,
        )
    assert producer.flush(DEADLINE) == 0
    assert errors == []
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "unused"})
    try:
        consumer.assign([TopicPartition("orders", p, 0) for p in range(PARTITIONS)])
        exp.check(ck_consume(consumer, RECORDS))
    finally:
        consumer.close()


# -- admin clients ----------------------------------------------------------------------------


def test_confluent_admin_creates_and_describes_topics(cluster: ThreadedCluster) -> None:
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    futures = admin.create_topics(
        [NewTopic("fresh", 6, 1), NewTopic("orders", 3, 1), NewTopic("wide", 3, 3)],
        operation_timeout=10,
    )
    assert futures["fresh"].result(timeout=DEADLINE) is None
    with pytest.raises(KafkaException) as exists:
        futures["orders"].result(timeout=DEADLINE)
    assert exists.value.args[0].name() == "TOPIC_ALREADY_EXISTS"
    with pytest.raises(KafkaException) as wide:
        futures["wide"].result(timeout=DEADLINE)
    assert wide.value.args[0].name() == "INVALID_REPLICATION_FACTOR"
    meta = admin.list_topics(timeout=DEADLINE)
    assert sorted(meta.brokers) == [0, 1, 2]
    assert len(meta.topics["fresh"].partitions) == 6
    assert {p.leader for p in meta.topics["fresh"].partitions.values()} == {0, 1, 2}
    described = admin.describe_cluster().result(timeout=DEADLINE)
    assert sorted(n.id for n in described.nodes) == [0, 1, 2]


def test_kafka_python_admin_creates_topics(cluster: ThreadedCluster) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic
    from kafka.errors import TopicAlreadyExistsError

    admin = KafkaAdminClient(
        bootstrap_servers=cluster.bootstrap, request_timeout_ms=int(DEADLINE * 1000)
    )
    try:
        admin.create_topics([NewTopic("made-by-kp", 4, 1)])
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("made-by-kp", 4, 1)])
        assert "made-by-kp" in admin.list_topics()
    finally:
        admin.close()
    exp = Expected("made-by-kp", 40)
    for r in exp.records:
        r["partition"] %= 4
    ck_produce(cluster.bootstrap, exp)
    assert sum(cluster.high_watermark("made-by-kp", p) for p in range(4)) == 40


def test_confluent_kafka_static_member_restart_replaces_the_old_member(
    cluster: ThreadedCluster,
) -> None:
    """KIP-345: a consumer restarted with the same group.instance.id takes over its member."""
    from confluent_kafka import Consumer

    exp = Expected("orders")
    ck_produce(cluster.bootstrap, exp)
    group = f"static-{uuid.uuid4()}"
    conf = {
        "bootstrap.servers": cluster.bootstrap,
        "group.id": group,
        "group.instance.id": "instance-1",
        "session.timeout.ms": 60000,
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    }

    def members() -> tuple[list[str], dict[str, str]]:
        assert cluster.cluster is not None
        g = cluster.cluster.coordinator.groups[group]
        return list(g.members), dict(g.static_members)

    first = Consumer(conf)
    first.subscribe(["orders"])
    try:
        exp.check(ck_consume(first, RECORDS))
        first.commit(asynchronous=False)
        old_members, _ = cluster.run_sync(members)
    finally:
        first.close()  # a static member sends no LeaveGroup: its member stays
    assert cluster.run_sync(members)[0] == old_members and len(old_members) == 1
    more = Expected("orders", RECORDS + 24)
    ck_produce(cluster.bootstrap, _tail(more, RECORDS))
    again = Consumer(conf)
    again.subscribe(["orders"])
    try:
        rest = ck_consume(again, 24)
        now_members, static = cluster.run_sync(members)
    finally:
        again.close()
    assert len(rest) == 24
    assert len(now_members) == 1 and now_members != old_members
    assert static == {"instance-1": now_members[0]}
