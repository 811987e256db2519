"""Real Kafka clients through the proxy, to the dev cluster and to real Apache Kafka.

Every scenario runs on both backends (``stack`` is parametrised over ``BACKENDS``):
a 3-node dev cluster in the proxy's trio thread (``ProxyStack``), and the session's
single-node Kafka; and once more on the older broker line (Kafka 3.9, ``kafka39``).  The broker-restart scenarios use ``stack3`` instead, whose real
Kafka has three nodes with replication factor 3, so the stopped leader's partitions
move to another broker (SIGTERM: Kafka's controlled shutdown).  The clients
(confluent-kafka/librdkafka, kafka-python, aiokafka, kcat) only ever see the proxy's
bootstrap address.  Every test checks that each record arrives
exactly once, in order per partition, byte-identical, and the tests that can
inspect the client's metadata check it lists only proxy addresses.
"""

from __future__ import annotations

import asyncio
import itertools
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aiokafka
import confluent_kafka
import kafka
import pytest
from confluent_kafka import admin as confluent_admin
from support.backends import BACKENDS, BACKENDS_3, running, upstream_for
from support.delivery import assert_exactly_once_in_order
from support.kafka_python import GROUP_POLL_MS
from support.stack import ProxyStack

pytestmark = pytest.mark.integration

DEADLINE = 60.0  # seconds; every client loop below is bounded by it


@pytest.fixture(scope="module", params=(*BACKENDS, "kafka39"))
def stack(request: pytest.FixtureRequest) -> Iterator[ProxyStack]:
    with running(ProxyStack(upstream=upstream_for(request, request.param))) as s:
        yield s


@pytest.fixture(scope="module", params=BACKENDS_3)
def stack3(request: pytest.FixtureRequest) -> Iterator[ProxyStack]:
    """Three brokers, every partition replicated on each: a leader can stop."""
    with running(ProxyStack(upstream=upstream_for(request, request.param))) as s:
        yield s


# --- record bookkeeping -------------------------------------------------------------------


Record = tuple[int, bytes | None, bytes]  # partition, key, value


def make_records(partitions: int, per_partition: int, tag: str) -> list[Record]:
    return [
        (p, f"k{p}-{i}".encode(), f"{tag}|p{p}|{i}|".encode() + bytes([i % 256]) * (i % 50))
        for i in range(per_partition)
        for p in range(partitions)
    ]


def until(deadline: float, done: Callable[[], bool]) -> Iterator[int]:
    for n in itertools.count():
        if done():
            return
        if time.monotonic() > deadline:
            raise AssertionError("client did not finish before the deadline")
        yield n


def assert_only_proxy_addresses(stack: ProxyStack, seen: set[tuple[str, int]]) -> None:
    assert seen, "the client reported no brokers"
    assert seen <= stack.proxy_addresses()
    assert not seen & stack.broker_addresses()


# --- kcat ---------------------------------------------------------------------------------


def kcat(*args: str, stdin: bytes | None = None) -> str:
    """Run kcat to completion within DEADLINE (killed by its pid if it overruns)."""
    try:
        done = subprocess.run(
            ["kcat", *args], input=stdin, capture_output=True, timeout=DEADLINE, check=False
        )
    except subprocess.TimeoutExpired as overrun:  # subprocess.run has killed it
        stderr = (overrun.stderr or b"").decode(errors="replace")
        raise AssertionError(f"kcat {' '.join(args)} overran {DEADLINE:.0f} s\n{stderr}") from None
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


def test_kcat_metadata_produce_consume(stack: ProxyStack) -> None:
    topic = stack.create_topic(3)
    listing = kcat("-b", stack.bootstrap, "-L", "-m", "30", "-t", topic)
    brokers = {
        (host, int(port)) for host, port in re.findall(r"broker \d+ at ([^:\s]+):(\d+)", listing)
    }
    assert len(brokers) == len(stack.broker_addresses())
    assert_only_proxy_addresses(stack, brokers)
    lines = [f"line-{i}-{'x' * (i % 7)}" for i in range(200)]
    for p in range(3):
        kcat(
            "-b",
            stack.bootstrap,
            "-P",
            "-t",
            topic,
            "-p",
            str(p),
            stdin="\n".join(lines).encode() + b"\n",
        )
    for p in range(3):
        out = kcat("-b", stack.bootstrap, "-C", "-t", topic, "-p", str(p), "-e", "-f", "%o %s\n")
        assert out.splitlines() == [f"{i} {line}" for i, line in enumerate(lines)]


KcatRecord = tuple[int, bytes, bytes]  # partition, key, value


def kcat_records(partitions: int, per_partition: int, tag: str) -> list[KcatRecord]:
    """Records kcat can read and print as lines: no space, colon or newline in them."""
    return [
        (p, f"k{p}-{i}".encode(), f"{tag}|p{p}|{i}|{'x' * (i % 7)}".encode())
        for i in range(per_partition)
        for p in range(partitions)
    ]


def kcat_produce(stack: ProxyStack, topic: str, records: list[KcatRecord]) -> None:
    """Produce (partition, key, value) records with kcat, one run per partition, in order."""
    for p in sorted({r[0] for r in records}):
        lines = b"".join(k + b":" + v + b"\n" for q, k, v in records if q == p)
        kcat("-b", stack.bootstrap, "-P", "-t", topic, "-p", str(p), "-K", ":", stdin=lines)


def kcat_group_consume(
    stack: ProxyStack, topic: str, group: str
) -> list[tuple[int, int, bytes, bytes]]:
    """Consume *topic* with kcat in a balanced consumer group (``-G``) to the end of every
    partition (``-e``); (partition, offset, key, value) in arrival order.  Leaving, kcat
    commits the group's offsets (librdkafka's auto-commit on close)."""
    args = ["-G", group, "-X", "auto.offset.reset=earliest", "-e", "-q", "-f", "%p %o %k %s\n"]
    out = kcat("-b", stack.bootstrap, *args, topic)
    got = []
    for line in out.splitlines():
        p, o, k, v = line.split(" ", 3)
        got.append((int(p), int(o), k.encode(), v.encode()))
    return got


def test_kcat_group_consume_resumes_from_committed_offsets(stack: ProxyStack) -> None:
    """kcat as a balanced group consumer: the first member reads everything once, in
    order per partition; a second one of the same group, after more records, reads only
    the new ones (the offsets committed through the proxy)."""
    topic = stack.create_topic(4)
    group = f"kcatg-{uuid.uuid4().hex[:6]}"
    first = kcat_records(4, 60, "kcat-g1")
    kcat_produce(stack, topic, first)
    got = kcat_group_consume(stack, topic, group)
    assert_exactly_once_in_order(first, [(p, k, v) for p, _, k, v in got])
    for p in range(4):
        assert [o for q, o, _, _ in got if q == p] == list(range(60))
    second = kcat_records(4, 25, "kcat-g2")
    kcat_produce(stack, topic, second)
    got = kcat_group_consume(stack, topic, group)
    assert_exactly_once_in_order(second, [(p, k, v) for p, _, k, v in got])
    for p in range(4):
        assert [o for q, o, _, _ in got if q == p] == list(range(60, 85))


# --- confluent-kafka ----------------------------------------------------------------------


def confluent_produce(stack: ProxyStack, topic: str, records: list[Record], **conf: Any) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": stack.bootstrap, "linger.ms": 5, **conf}
    )
    errors: list[Any] = []
    for p, k, v in records:
        producer.produce(
            topic, v, k, partition=p, on_delivery=lambda err, msg: err and errors.append(err)
        )
        producer.poll(0)
    assert producer.flush(DEADLINE) == 0
    assert not errors


def confluent_consume(
    stack: ProxyStack, topic: str, partitions: int, count: int, group: str | None = None
) -> tuple[list[Record], set[tuple[str, int]]]:
    conf = {
        "bootstrap.servers": stack.bootstrap,
        "group.id": group or f"g-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
    }
    consumer = confluent_kafka.Consumer(conf)
    try:
        if group is None:
            consumer.assign(
                [
                    confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                    for p in range(partitions)
                ]
            )
        else:
            consumer.subscribe([topic])
        got: list[Record] = []
        for _ in until(time.monotonic() + DEADLINE, lambda: len(got) >= count):
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.key(), msg.value()))
        metadata = consumer.list_topics(topic, timeout=10)
        seen = {(b.host, b.port) for b in metadata.brokers.values()}
        return got, seen
    finally:
        consumer.close()


@pytest.mark.parametrize(
    ("acks", "compression"),
    [
        ("0", "none"),
        ("1", "gzip"),
        ("all", "snappy"),
        ("all", "lz4"),
        ("1", "zstd"),
        ("all", "none"),
    ],
)
def test_confluent_produce_and_assign_consume(
    stack: ProxyStack, acks: str, compression: str
) -> None:
    topic = stack.create_topic(4)
    records = make_records(4, 150, f"ck-{acks}-{compression}")
    confluent_produce(stack, topic, records, acks=acks, **{"compression.type": compression})
    got, seen = confluent_consume(stack, topic, 4, len(records))
    assert_exactly_once_in_order(records, got)
    assert_only_proxy_addresses(stack, seen)


def test_confluent_group_subscribe(stack: ProxyStack) -> None:
    topic = stack.create_topic(6)
    records = make_records(6, 50, "ck-group")
    confluent_produce(stack, topic, records, acks="all")
    got, seen = confluent_consume(
        stack, topic, 6, len(records), group=f"grp-{uuid.uuid4().hex[:6]}"
    )
    assert_exactly_once_in_order(records, got)
    assert_only_proxy_addresses(stack, seen)


def test_confluent_admin_creates_topics(stack: ProxyStack) -> None:
    admin = confluent_admin.AdminClient({"bootstrap.servers": stack.bootstrap})
    name = f"admin-{uuid.uuid4().hex[:8]}"
    futures = admin.create_topics(
        [confluent_admin.NewTopic(name, num_partitions=5, replication_factor=1)]
    )
    futures[name].result(timeout=DEADLINE)
    assert name in stack.topic_names()
    md = admin.list_topics(name, timeout=10)
    assert len(md.topics[name].partitions) == 5
    assert_only_proxy_addresses(stack, {(b.host, b.port) for b in md.brokers.values()})
    cluster = admin.describe_cluster(request_timeout=10).result(timeout=DEADLINE)  # DescribeCluster
    assert_only_proxy_addresses(stack, {(n.host, n.port) for n in cluster.nodes})
    assert len(cluster.nodes) == len(stack.broker_addresses())


# --- kafka-python -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acks", "compression"), [(0, None), (1, "gzip"), ("all", None), ("all", "lz4")]
)
def test_kafka_python_produce_and_consume(
    stack: ProxyStack, acks: Any, compression: str | None
) -> None:
    topic = stack.create_topic(3)
    records = make_records(3, 100, f"kp-{acks}-{compression}")
    producer = kafka.KafkaProducer(
        bootstrap_servers=stack.bootstrap, acks=acks, compression_type=compression, linger_ms=5
    )
    try:
        futures = [producer.send(topic, value=v, key=k, partition=p) for p, k, v in records]
        producer.flush(timeout=DEADLINE)
        for f in futures:
            f.get(timeout=DEADLINE)
    finally:
        producer.close(timeout=10)
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=stack.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=int(DEADLINE * 1000),
    )
    try:
        consumer.assign([kafka.TopicPartition(topic, p) for p in range(3)])
        consumer.seek_to_beginning()
        got: list[Record] = []
        for _ in until(time.monotonic() + DEADLINE, lambda: len(got) >= len(records)):
            for tp, msgs in consumer.poll(timeout_ms=200).items():
                got.extend((tp.partition, m.key, m.value) for m in msgs)
        seen = {(b.host, b.port) for b in consumer._client.cluster.brokers()}
    finally:
        consumer.close()
    assert_exactly_once_in_order(records, got)
    assert_only_proxy_addresses(stack, seen)


def test_kafka_python_group_subscribe(stack: ProxyStack) -> None:
    topic = stack.create_topic(4)
    records = make_records(4, 60, "kp-group")
    producer = kafka.KafkaProducer(bootstrap_servers=stack.bootstrap, acks="all")
    try:
        for p, k, v in records:
            producer.send(topic, value=v, key=k, partition=p)
        producer.flush(timeout=DEADLINE)
    finally:
        producer.close(timeout=10)
    consumer = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=stack.bootstrap,
        group_id=f"kpg-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
    )
    try:
        got: list[Record] = []
        for _ in until(time.monotonic() + DEADLINE, lambda: len(got) >= len(records)):
            for tp, msgs in consumer.poll(timeout_ms=GROUP_POLL_MS).items():
                got.extend((tp.partition, m.key, m.value) for m in msgs)
        consumer.commit()
    finally:
        consumer.close()
    assert_exactly_once_in_order(records, got)


# --- aiokafka -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("acks", "compression", "group"), [(1, None, False), ("all", "gzip", True), (0, None, True)]
)
def test_aiokafka_produce_and_consume(
    stack: ProxyStack, acks: Any, compression: str | None, group: bool
) -> None:
    topic = stack.create_topic(3)
    records = make_records(3, 80, f"ak-{acks}-{compression}")

    async def scenario() -> tuple[list[Record], set[tuple[str, int]]]:
        producer = aiokafka.AIOKafkaProducer(
            bootstrap_servers=stack.bootstrap, acks=acks, compression_type=compression
        )
        await producer.start()
        try:
            for p, k, v in records:
                await producer.send(topic, value=v, key=k, partition=p)
            await producer.flush()
        finally:
            await producer.stop()
        if group:
            consumer = aiokafka.AIOKafkaConsumer(
                topic,
                bootstrap_servers=stack.bootstrap,
                group_id=f"akg-{uuid.uuid4().hex[:6]}",
                auto_offset_reset="earliest",
                enable_auto_commit=False,
            )
        else:
            consumer = aiokafka.AIOKafkaConsumer(
                bootstrap_servers=stack.bootstrap,
                auto_offset_reset="earliest",
                enable_auto_commit=False,
            )
        await consumer.start()
        try:
            if not group:
                consumer.assign([aiokafka.TopicPartition(topic, p) for p in range(3)])
                await consumer.seek_to_beginning()
            got: list[Record] = []
            while len(got) < len(records):
                batch = await consumer.getmany(timeout_ms=200)
                for tp, msgs in batch.items():
                    got.extend((tp.partition, m.key, m.value) for m in msgs)
            seen = {(b.host, b.port) for b in consumer._client.cluster.brokers()}
            return got, seen
        finally:
            await consumer.stop()

    async def bounded() -> tuple[list[Record], set[tuple[str, int]]]:
        return await asyncio.wait_for(scenario(), DEADLINE)

    got, seen = asyncio.run(bounded())
    assert_exactly_once_in_order(records, got)
    assert_only_proxy_addresses(stack, seen)


# --- failure: a broker stops mid-consumption and comes back --------------------------------


def test_node_restart_mid_consumption_confluent(stack3: ProxyStack) -> None:
    stack = stack3
    topic = stack.create_topic(6)
    first = make_records(6, 40, "before")
    confluent_produce(stack, topic, first, acks="all")
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": stack.bootstrap,
            "group.id": f"restart-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 500,
        }
    )
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(6)
            ]
        )
        got: list[Record] = []

        def drain(target: int) -> None:
            for _ in until(time.monotonic() + DEADLINE, lambda: len(got) >= target):
                msg = consumer.poll(0.2)
                if msg is None or msg.error() is not None:
                    continue  # transport errors while the node is down are expected
                got.append((msg.partition(), msg.key(), msg.value()))

        drain(len(first))
        victim = stack.leader_of(topic, 1)
        stack.stop_node(victim)
        for _ in range(10):  # keep polling while the node is down
            msg = consumer.poll(0.1)
            assert msg is None or msg.error() is not None
        stack.restart_node(victim)
        second = make_records(6, 40, "after")
        confluent_produce(stack, topic, second, acks="all")
        drain(len(first) + len(second))
    finally:
        consumer.close()
    assert_exactly_once_in_order(first + second, got)


def test_node_restart_mid_consumption_kafka_python_group(stack3: ProxyStack) -> None:
    stack = stack3
    topic = stack.create_topic(6)
    first = make_records(6, 30, "kp-before")
    second = make_records(6, 30, "kp-after")
    producer = kafka.KafkaProducer(
        bootstrap_servers=stack.bootstrap, acks="all", retries=20, retry_backoff_ms=100
    )
    consumer = kafka.KafkaConsumer(
        topic,
        bootstrap_servers=stack.bootstrap,
        group_id=f"kprestart-{uuid.uuid4().hex[:6]}",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        reconnect_backoff_ms=50,
        reconnect_backoff_max_ms=500,
    )
    got: list[Record] = []

    def drain(target: int) -> None:
        for _ in until(time.monotonic() + DEADLINE, lambda: len(set(got)) >= target):
            for tp, msgs in consumer.poll(timeout_ms=GROUP_POLL_MS).items():
                got.extend((tp.partition, m.key, m.value) for m in msgs)
            if got:
                try:
                    consumer.commit()
                except kafka.errors.KafkaError:
                    pass  # the coordinator may be the node that is down

    try:
        for p, k, v in first:
            producer.send(topic, value=v, key=k, partition=p)
        producer.flush(timeout=DEADLINE)
        drain(len(first))
        victim = stack.leader_of(topic, 2)
        stack.stop_node(victim)
        consumer.poll(timeout_ms=300)
        stack.restart_node(victim)
        for p, k, v in second:
            producer.send(topic, value=v, key=k, partition=p)
        producer.flush(timeout=DEADLINE)
        drain(len(first) + len(second))
    finally:
        consumer.close()
        producer.close(timeout=10)
    # a group consumer may see records again after a rebalance (at-least-once between
    # commits); nothing may be lost, and the first deliveries are in order per partition
    first_seen = list(dict.fromkeys(got))
    assert_exactly_once_in_order(first + second, first_seen)
