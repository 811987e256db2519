"""Real clients through the proxy's default Fetch path, on the dev cluster and on real
Apache Kafka.

The proxy runs exactly as ``kafka-fetch-proxy run`` builds it (``Proxy(settings)``:
upstream fetch sessions and shaping on every connection).  librdkafka
(confluent-kafka) and aiokafka send sessionless full fetches, kafka-python
>= 2.1 uses its own fetch sessions.  Records are produced while the consumer
runs; each record must arrive exactly once and in order per partition, and the
upstream traffic must actually use incremental fetches.

Faults.  On the dev cluster, every 150 ms the cluster either evicts every
upstream fetch session or skews their epochs (INVALID_FETCH_SESSION_EPOCH), and
the proxy must hide it (resends counted).  Those two are dev-cluster hooks: real
Kafka cannot stage them from outside.  Its fetch session cache evicts a consumer
session only once it is 120 s old or idle (``MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS``,
fixed), or for a follower's session; and Kafka 3.9+ splits
``max.incremental.fetch.session.cache.slots`` over 8 shards (slots // 8 each, a random
shard per new session).  What a small cache does stage on real Kafka, and on the
dev cluster alike, is the broker *refusing* new sessions (session id 0 in the
answer to a full fetch): ``crowded`` runs more consumers than the cache holds (8
slots, one per shard, on a dev cluster and on a Kafka broker the module starts for
it; 1 or 2 slots would mean no sessions at all), and each must still get every
record once, while the proxy falls back to sessionless upstream fetches for those
refused.

Also the saving upstream fetch sessions are for, on both backends: an idle
librdkafka consumer of 1,000 partitions moves at least 20x fewer upstream bytes
per fetch round through the proxy than connected directly (every byte on the
proxy's upstream sockets, and for the direct case every byte librdkafka itself
counts on its broker sockets, each divided by the Fetch requests sent in the
same window).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aiokafka
import confluent_kafka
import kafka
import pytest
from support.backends import BACKENDS, running, upstream_for
from support.delivery import assert_exactly_once_in_order
from support.kafka import KafkaCluster
from support.sessions import SessionStack, counting_upstream

pytestmark = pytest.mark.integration

DEADLINE = 90.0
PARTITIONS = 64
SLOTS = 8  # a crowded broker's fetch session cache: one slot in each of Kafka's 8 shards
CROWD = 10  # consumers at once, more than the crowded cache holds
Record = tuple[int, bytes | None, bytes]


@pytest.fixture(scope="module", params=BACKENDS)
def stack(request: pytest.FixtureRequest) -> Iterator[SessionStack]:
    """The proxy, its upstream sockets counted, in front of either backend."""
    s = SessionStack(upstream=upstream_for(request, request.param))
    with counting_upstream(s), running(s):
        yield s


@pytest.fixture(scope="module", params=BACKENDS)
def crowded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[SessionStack]:
    """A broker whose fetch session cache holds fewer sessions than ``CROWD`` consumers."""
    if request.param == "devbroker":
        s = SessionStack(nodes=1, dev_options={"session_cache_slots": SLOTS})
        with counting_upstream(s), running(s):
            yield s
        return
    workdir = tmp_path_factory.mktemp("kafka-crowded")
    cluster = KafkaCluster(
        1, workdir=workdir, config={"max.incremental.fetch.session.cache.slots": str(SLOTS)}
    ).start()
    try:
        s = SessionStack(upstream=cluster)
        with counting_upstream(s), running(s):
            yield s
    finally:
        cluster.stop()


def make_records(partitions: int, per_partition: int, tag: str) -> list[Record]:
    return [
        (p, f"k{p}-{i}".encode(), f"{tag}|{p}|{i}|".encode() + b"v" * (i % 40))
        for i in range(per_partition)
        for p in range(partitions)
    ]


class Producing:
    """Produces *records* in the background with confluent-kafka while a consumer runs."""

    def __init__(self, stack: SessionStack, topic: str, records: list[Record]) -> None:
        self.errors: list[Any] = []
        self._thread = threading.Thread(target=self._run, args=(stack, topic, records))

    def __enter__(self) -> Producing:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._thread.join(timeout=DEADLINE)
        assert not self._thread.is_alive()
        assert not self.errors

    def _run(self, stack: SessionStack, topic: str, records: list[Record]) -> None:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": stack.bootstrap, "linger.ms": 5, "acks": "all"}
        )
        for n, (p, k, v) in enumerate(records):
            while True:
                try:
                    producer.produce(
                        topic,
                        v,
                        k,
                        partition=p,
                        on_delivery=lambda err, msg: err and self.errors.append(err),
                    )
                    break
                except BufferError:
                    producer.poll(0.05)
            if n % 2000 == 0:
                producer.poll(0)
                time.sleep(0.01)  # spread production over the consumption
        if producer.flush(DEADLINE) != 0:
            self.errors.append("flush timed out")


class Evicting:
    """On the dev cluster, every 150 ms: evict every upstream session, or skew their epochs.

    Real Kafka has no such hook (see the module docstring): there the block runs
    without faults, and ``active`` is False.
    """

    def __init__(self, stack: SessionStack) -> None:
        self.stack = stack
        self.active = stack.kafka is None
        self.count = 0
        """Faults applied so far."""
        self._resends_before = stack.upstream_stats().get("resends", 0) if self.active else 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Evicting:
        if self.active:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        if self.active:
            self._thread.join(timeout=5)
            assert not self._thread.is_alive()

    def _run(self) -> None:
        turn = 0
        while not self._done.wait(0.15):
            turn += 1
            if turn % 2:
                self.stack.evict_upstream_sessions()
            else:
                self.stack.skew_upstream_epochs()
            self.count += 1

    def pending(self) -> bool:
        """Whether a consumer should keep fetching: until an eviction and an epoch skew have
        both been applied and the proxy has resent at least one fetch after a session error.
        A fast machine drains the records before the first fault; a loaded one can apply
        all three faults within one long poll, so the count of faults alone is not enough."""
        if not self.active:
            return False
        if self.count < 3:
            return True
        return self.stack.upstream_stats().get("resends", 0) <= self._resends_before


def confluent_consumer(bootstrap: str, **conf: Any) -> Any:
    return confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            **conf,
        }
    )


def consume_confluent(
    consumer: Any,
    topic: str,
    partitions: int,
    count: int,
    pending: Callable[[], bool] = lambda: False,
) -> list[Record]:
    consumer.assign(
        [
            confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
            for p in range(partitions)
        ]
    )
    got: list[Record] = []
    deadline = time.monotonic() + DEADLINE
    while len(got) < count or pending():
        assert time.monotonic() < deadline, f"{len(got)} of {count} records"
        for msg in consumer.consume(1000, 0.2):
            assert msg.error() is None, msg.error()
            got.append((msg.partition(), msg.key(), msg.value()))
    return got


def test_confluent_sessionless_consumer_with_upstream_sessions(stack: SessionStack) -> None:
    topic = stack.create_topic(PARTITIONS)
    records = make_records(PARTITIONS, 1600, "rd")  # 102,400 records
    before = stack.upstream_stats()
    consumer = confluent_consumer(stack.bootstrap)
    try:
        with Evicting(stack) as faults, Producing(stack, topic, records):
            got = consume_confluent(consumer, topic, PARTITIONS, len(records), faults.pending)
    finally:
        consumer.close()
    assert_exactly_once_in_order(records, got)
    after = stack.upstream_stats()
    assert after["incremental"] - before.get("incremental", 0) > 0
    if faults.active:
        # evictions and epoch skews happened, and were hidden
        assert after["resends"] - before.get("resends", 0) > 0


def test_kafka_python_session_consumer_through_proxy_sessions(stack: SessionStack) -> None:
    topic = stack.create_topic(PARTITIONS)
    records = make_records(PARTITIONS, 120, "kp")
    before = stack.upstream_stats()
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=stack.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    got: list[Record] = []
    try:
        consumer.assign([kafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        with Evicting(stack) as faults, Producing(stack, topic, records):
            deadline = time.monotonic() + DEADLINE
            while len(got) < len(records) or faults.pending():
                assert time.monotonic() < deadline, f"{len(got)} of {len(records)} records"
                for tp, msgs in consumer.poll(timeout_ms=200).items():
                    got.extend((tp.partition, m.key, m.value) for m in msgs)
    finally:
        consumer.close()
    assert_exactly_once_in_order(records, got)
    assert stack.client_sessions_created() > 0  # the client used sessions with the proxy
    after = stack.upstream_stats()
    assert after["incremental"] - before.get("incremental", 0) > 0  # and the proxy upstream
    if faults.active:
        assert after["resends"] - before.get("resends", 0) > 0


def test_aiokafka_sessionless_consumer(stack: SessionStack) -> None:
    topic = stack.create_topic(PARTITIONS)
    records = make_records(PARTITIONS, 80, "ak")

    async def consume() -> list[Record]:
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=stack.bootstrap,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        await consumer.start()
        try:
            consumer.assign([aiokafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
            await consumer.seek_to_beginning()
            got: list[Record] = []
            while len(got) < len(records):
                batch = await consumer.getmany(timeout_ms=200)
                for tp, msgs in batch.items():
                    got.extend((tp.partition, m.key, m.value) for m in msgs)
            return got
        finally:
            await consumer.stop()

    before = stack.upstream_stats()
    with Producing(stack, topic, records):
        got = asyncio.run(asyncio.wait_for(consume(), DEADLINE))
    assert_exactly_once_in_order(records, got)
    after = stack.upstream_stats()
    assert after["incremental"] > before.get("incremental", 0)


def test_consumers_beyond_the_session_cache_get_every_record(crowded: SessionStack) -> None:
    """More sessionless consumers than the broker's fetch session cache holds: the broker
    refuses some sessions, the proxy serves those consumers with sessionless upstream
    fetches, and every consumer still gets every record once, in order."""
    partitions = 8
    topic = crowded.create_topic(partitions)
    records = make_records(partitions, 100, "crowd")
    traffic = crowded.proxy_upstream
    crowded.run_sync(setattr, traffic, "counting", True)
    before = crowded.upstream_stats()
    consumers = [confluent_consumer(crowded.bootstrap) for _ in range(CROWD)]
    results: list[list[Record] | BaseException] = [[] for _ in consumers]

    def consume(i: int) -> None:
        try:
            results[i] = consume_confluent(consumers[i], topic, partitions, len(records))
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(CROWD)]
    try:
        for t in threads:
            t.start()
        with Producing(crowded, topic, records):
            pass
        for t in threads:
            t.join(DEADLINE + 10)
            assert not t.is_alive()
    finally:
        for c in consumers:
            c.close()
        crowded.run_sync(setattr, traffic, "counting", False)
    for got in results:
        if isinstance(got, BaseException):
            raise got
        assert_exactly_once_in_order(records, got)
    after = crowded.upstream_stats()
    sessionless = crowded.run_sync(lambda: traffic.sessionless_fetches)
    print(
        f"{CROWD} consumers, {crowded.backend}: upstream incremental"
        f" {after['incremental'] - before.get('incremental', 0)},"
        f" sessionless {sessionless} (session refused)"
    )
    assert after["incremental"] - before.get("incremental", 0) > 0  # some got a session
    assert sessionless > 0  # others were refused one, and the proxy fell back
    assert after.get("session_errors", 0) == before.get("session_errors", 0)


class LibrdkafkaTraffic:
    """What librdkafka counts on its own broker sockets (statistics every 100 ms)."""

    def __init__(self) -> None:
        self.snapshots: list[tuple[int, int]] = []

    def stats(self, text: str) -> None:
        brokers = json.loads(text)["brokers"].values()
        total = sum(b["txbytes"] + b["rxbytes"] for b in brokers)
        fetches = sum(b.get("req", {}).get("Fetch", 0) for b in brokers)
        self.snapshots.append((total, fetches))


def idle_bytes_per_fetch(bootstrap: str, stack: SessionStack, topic: str, *, direct: bool) -> float:
    """Bytes per Fetch request of an idle librdkafka consumer of every partition of *topic*:
    on the proxy's upstream sockets, or (*direct*) on the consumer's own broker sockets."""
    seen = LibrdkafkaTraffic()
    consumer = confluent_consumer(
        bootstrap,
        **{"fetch.wait.max.ms": 50, "statistics.interval.ms": 100, "stats_cb": seen.stats},
    )
    traffic = stack.proxy_upstream
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(1000)])
        warm_until = time.monotonic() + 2.0
        while time.monotonic() < warm_until:
            assert consumer.poll(0.1) is None
        first = len(seen.snapshots)
        stack.run_sync(setattr, traffic, "counting", not direct)
        measure_until = time.monotonic() + 2.0
        deadline = time.monotonic() + 30.0

        def counted() -> int:
            if direct:
                return seen.snapshots[-1][1] - seen.snapshots[first][1]
            return int(stack.run_sync(getattr, traffic, "fetches"))

        # At least 2 s and 10 fetches (a loaded machine fetches fewer rounds in 2 s).
        while time.monotonic() < measure_until or len(seen.snapshots) < first + 2 or counted() < 10:
            assert time.monotonic() < deadline, f"only {counted()} fetches in 30 s"
            assert consumer.poll(0.1) is None
        stack.run_sync(setattr, traffic, "counting", False)
        total, fetches = stack.run_sync(traffic.take)
        if direct:
            (b0, f0), (b1, f1) = seen.snapshots[first], seen.snapshots[-1]
            total, fetches = b1 - b0, f1 - f0
    finally:
        consumer.close()
    assert fetches >= 10, fetches
    return float(total) / fetches


def test_idle_librdkafka_consumer_of_1000_partitions_moves_20x_fewer_upstream_bytes(
    stack: SessionStack,
) -> None:
    topic = stack.create_topic(1000)
    direct = idle_bytes_per_fetch(stack.direct_bootstrap, stack, topic, direct=True)
    proxied = idle_bytes_per_fetch(stack.bootstrap, stack, topic, direct=False)
    print(
        f"idle 1000-partition consumer ({stack.backend}): {direct:.0f} B/fetch direct,"
        f" {proxied:.0f} via proxy"
    )
    assert direct >= 20 * proxied, (direct, proxied)
