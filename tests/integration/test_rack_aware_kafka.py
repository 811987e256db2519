"""Rack-aware fetching with no client configuration, on real Kafka: three brokers in racks
a, b and c (``RackAwareReplicaSelector``), topics of replication factor 3 with leaders on
all three, and the proxy in rack b (``rack = "b"``).

No client sets ``client.rack``.  The proxy sends its rack upstream in their Fetch v11+
(proxy.relay.rack_fetch), the leader answers ``preferred_read_replica`` = the rack-b
broker, the client follows it through the proxy's listener for that broker, and the
rack-b broker serves the records.  What counts is the proxy's own upstream byte counter
per node (``kafka_fetch_proxy_broker_to_proxy_fetch_record_bytes_total{node}``): at
least 95 % of the record bytes each client reads come from the rack-b broker, and every
record arrives exactly once and in order per partition: the Java client, librdkafka,
franz-go, sarama, kafka-python, kcat (assign and group consumer) and a Spark batch read
(Spark's Kafka connector; its SparkSession starts only when that test runs).  The same
holds for librdkafka authenticating with SCRAM-SHA-512 end to end (a second proxy in
front of the cluster's SASL listeners).  Two clients cannot follow a redirect, and the
proxy follows it for them (proxy.relay.read_replica): aiokafka 0.14, which ignores a
redirect unless it set ``client_rack`` (the proxy notices), and a raw Fetch v10 client
(kafka-go's ceiling), whose Fetch has no rack at all.

Faults (a librdkafka consumer through the proxy, tests/support/verifier.py, and an
``acks=1`` flood checked offset by offset): the rack-b broker stopped mid-consumption and
started again (and stopped under a v10 client the proxy follows redirects for), followers left behind by a producer flooding one partition with
``acks=1``, and leaders moved to and from the rack-b broker.  Nothing is lost
or repeated, and the fetches return to the rack-b broker once it is back.

Real Kafka only: the dev cluster models no replicas (a partition has one copy), so there
is no follower to prefer.  One cluster for the module; small data.
"""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aiokafka
import confluent_kafka
import confluent_kafka.admin
import kafka
import pytest
from support import clients, verifier
from support.delivery import assert_exactly_once_in_order
from support.fetch_messages import fetch_body, partition_body
from support.kafka import RACK_AWARE, SCRAM_MECHANISM, KafkaCluster, Security
from support.rawclient import RawClient
from support.stack import ProxyStack

from proxy.observe.metrics import PREFIX, Metrics
from proxy.protocol.records import complete_prefix_size, iter_batches

pytestmark = pytest.mark.integration

RACKS = ("a", "b", "c")
PROXY_RACK = "b"
PARTITIONS = 6
COUNT = 1200  # records per client, over the partitions (~100 KB)
MIN_IN_RACK = 0.95
DEADLINE = 60.0
BYTES = f"{PREFIX}broker_to_proxy_fetch_record_bytes_total"

SASL_USER, SASL_PASSWORD = "racker", "racker-pw"

SHARES: dict[str, float] = {}
"""client -> measured in-rack share of record bytes (printed at the end of the module)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    workdir = tmp_path_factory.mktemp("kafka-racks")
    c = KafkaCluster(
        3,
        workdir=workdir,
        racks=RACKS,
        config={**RACK_AWARE, "auto.leader.rebalance.enable": "false"},
        name="kafka-racks",
        # a SASL listener beside the PLAINTEXT one (whose user is a super user)
        security=Security({SASL_USER: SASL_PASSWORD}, protocol="SASL_PLAINTEXT"),
    ).start()
    try:
        c.allow(SASL_USER, topic="rack-", prefixed=True)
        c.allow(SASL_USER, group="g-", prefixed=True, operations=("READ", "DESCRIBE"))
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def stack(cluster: KafkaCluster) -> Iterator[ProxyStack]:
    s = ProxyStack(
        {"rack": PROXY_RACK}, upstream=cluster, metrics=Metrics(process_metrics=False)
    ).start()
    try:
        yield s
        if SHARES:
            print("\nin-rack share of record bytes, no client.rack:")
            for name, share in SHARES.items():
                print(f"  {name:14} {share:.4f}")
    finally:
        s.stop()


def record_bytes(stack: ProxyStack) -> dict[int, float]:
    """node id -> record bytes the proxy fetched from it so far."""
    registry = stack.metrics.registry
    out = {}
    for node in stack.kafka.nodes if stack.kafka else ():
        out[node] = registry.get_sample_value(BYTES, {"node": str(node)}) or 0.0
    return out


class Measured:
    """Record bytes by node between ``__enter__`` and ``__exit__``."""

    def __init__(self, stack: ProxyStack) -> None:
        self.stack = stack
        self.by_node: dict[int, float] = {}

    def __enter__(self) -> Measured:
        self._before = record_bytes(self.stack)
        return self

    def __exit__(self, *exc: object) -> None:
        after = record_bytes(self.stack)
        self.by_node = {n: after[n] - self._before.get(n, 0.0) for n in after}

    def share(self, node: int) -> float:
        total = sum(self.by_node.values())
        return self.by_node.get(node, 0.0) / total if total else 0.0


def new_topic(cluster: KafkaCluster) -> str:
    topic = cluster.new_topic(PARTITIONS, prefix="rack")
    leaders = {cluster.leader_of(topic, p) for p in range(PARTITIONS)}
    assert leaders == set(cluster.nodes), f"leaders {leaders}: not spread over the brokers"
    return topic


def produce(cluster: KafkaCluster, topic: str, tag: str) -> list[tuple[int, int, str, str]]:
    """``clients.expected`` records, produced directly (acks=all, idempotent): a fresh
    topic's offsets are the per-partition sequence numbers."""
    records = clients.expected(PARTITIONS, COUNT, tag)
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5}
    )
    for p, k, v in records:
        producer.produce(topic, v.encode(), k.encode(), partition=p)
    assert producer.flush(DEADLINE) == 0
    return [(p, int(k.rpartition("-")[2]), k, v) for p, k, v in records]


# -- the consumers, none with a rack ----------------------------------------------------------

Consume = Callable[[ProxyStack, str], list[tuple[int, int, str, str]]]


def java(stack: ProxyStack, topic: str) -> list[tuple[int, int, str, str]]:
    run = clients.java_client(
        stack.bootstrap, clients.assign(topic, PARTITIONS, COUNT), client_id="rack-java"
    )
    return run.records("assign")


def go(program: str) -> Consume:
    def consume(stack: ProxyStack, topic: str) -> list[tuple[int, int, str, str]]:
        run = clients.go_client(
            program,
            stack.bootstrap,
            clients.assign(topic, PARTITIONS, COUNT),
            client_id=f"rack-{program}",
        )
        return run.records("assign")

    return consume


def librdkafka(stack: ProxyStack, topic: str, **conf: Any) -> list[tuple[int, int, str, str]]:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": stack.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "client.id": "rack-librdkafka",
            "enable.auto.commit": False,
            **conf,
        }
    )
    got: list[tuple[int, int, str, str]] = []
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(PARTITIONS)
            ]
        )
        deadline = time.monotonic() + DEADLINE
        while len(got) < COUNT:
            assert time.monotonic() < deadline, f"{len(got)} of {COUNT} records"
            for m in consumer.consume(1000, 0.2):
                assert m.error() is None, m.error()
                got.append((m.partition(), m.offset(), m.key().decode(), m.value().decode()))
    finally:
        consumer.close()
    return got


def kafka_python(stack: ProxyStack, topic: str) -> list[tuple[int, int, str, str]]:
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=stack.bootstrap, client_id="rack-kafka-python", enable_auto_commit=False
    )
    got: list[tuple[int, int, str, str]] = []
    try:
        consumer.assign([kafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + DEADLINE
        while len(got) < COUNT:
            assert time.monotonic() < deadline, f"{len(got)} of {COUNT} records"
            for tp, msgs in consumer.poll(timeout_ms=200).items():
                got.extend((tp.partition, m.offset, m.key.decode(), m.value.decode()) for m in msgs)
    finally:
        consumer.close()
    return got


def aiokafka_(
    stack: ProxyStack, topic: str, before_stop: Callable[[], None] = lambda: None
) -> list[tuple[int, int, str, str]]:
    """*before_stop* runs once every record has arrived, while the connections are open
    (a closed connection's fetch handler is freed at once, so afterwards it is gone)."""

    async def consume() -> list[tuple[int, int, str, str]]:
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=stack.bootstrap,
            client_id="rack-aiokafka",
            enable_auto_commit=False,
        )
        await consumer.start()
        got: list[tuple[int, int, str, str]] = []
        try:
            consumer.assign([aiokafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
            await consumer.seek_to_beginning()
            while len(got) < COUNT:
                for tp, msgs in (await consumer.getmany(timeout_ms=200)).items():
                    got.extend(
                        (tp.partition, m.offset, m.key.decode(), m.value.decode()) for m in msgs
                    )
            before_stop()
        finally:
            await consumer.stop()
        return got

    return asyncio.run(asyncio.wait_for(consume(), DEADLINE))


def kcat_lines(*args: str) -> list[tuple[int, int, str, str]]:
    """Run kcat (librdkafka 2.0.2) until it has ``COUNT`` records (``-c``), no ``client.rack``,
    killed by its pid if it overruns; (partition, offset, key, value) in arrival order.

    Not ``-e`` (exit at the end of every partition): a follower learns the high watermark
    after the leader, so a partition redirected to it can answer "end of partition" at
    offset 0 just after the records were produced, and kcat then exits without them (seen
    in a fresh-clone run: partitions 0 and 1 missing).  A consumer that keeps polling gets
    them on its next fetch, which is what ``-c`` does."""
    try:
        done = subprocess.run(
            ["kcat", *args, "-c", str(COUNT), "-q", "-f", "%p %o %k %s\n"],
            capture_output=True,
            timeout=DEADLINE,
            check=False,
        )
    except subprocess.TimeoutExpired as overrun:  # subprocess.run has killed it
        raise AssertionError(f"kcat {args} overran {DEADLINE:.0f} s: {overrun.stderr!r}") from None
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    got = []
    for line in done.stdout.decode().splitlines():
        p, o, k, v = line.split(" ", 3)
        got.append((int(p), int(o), k, v))
    return got


def kcat_assign(stack: ProxyStack, topic: str) -> list[tuple[int, int, str, str]]:
    """kcat's simple consumer: every partition assigned, from the beginning."""
    return kcat_lines("-b", stack.bootstrap, "-C", "-o", "beginning", "-t", topic)


def kcat_group(stack: ProxyStack, topic: str) -> list[tuple[int, int, str, str]]:
    """kcat as a balanced group consumer (``-G``)."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    return kcat_lines("-b", stack.bootstrap, "-X", "auto.offset.reset=earliest", "-G", group, topic)


CLIENTS: dict[str, Consume] = {
    "java": java,
    "librdkafka": librdkafka,
    "franz-go": go("franz-go"),
    "sarama": go("sarama"),
    "kafka-python": kafka_python,
    "kcat-assign": kcat_assign,
    "kcat-group": kcat_group,
}


@pytest.mark.parametrize("name", list(CLIENTS))
def test_clients_without_a_rack_read_from_the_proxy_rack(
    name: str, cluster: KafkaCluster, stack: ProxyStack
) -> None:
    topic = new_topic(cluster)
    want = produce(cluster, topic, name)
    with Measured(stack) as measured:
        got = CLIENTS[name](stack, topic)
    assert_exactly_once_in_order(want, got)
    in_rack = cluster.node_in_rack(PROXY_RACK)
    SHARES[name] = share = measured.share(in_rack)
    total = sum(measured.by_node.values())
    assert total >= sum(len(k) + len(v) for _, _, k, v in want)  # the records went through
    assert share >= MIN_IN_RACK, f"{name}: {share:.3f} from rack {PROXY_RACK} {measured.by_node}"


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    """One SparkSession (one JVM, Spark's own Kafka connector and the kafka-clients it
    pins) for the module, started only if a Spark test runs, stopped by its pid."""
    from pipeline.spark import kafka_connector_jars, require_kafka_source, session, stop

    s = session("rack-aware", "local[2]", kafka_connector_jars())
    try:
        require_kafka_source(s)
        yield s
    finally:
        stop(s)


@pytest.mark.slow
def test_spark_batch_read_reads_from_the_proxy_rack(
    cluster: KafkaCluster, stack: ProxyStack, spark: Any
) -> None:
    """Spark's ``spark-sql-kafka-0-10`` batch read (its executors' consumers are the Java
    ``kafka-clients`` the connector pins, 3.9.2, assign mode, no ``client.rack``): every
    record once, at its offset, and at least 95 % of the record bytes from rack b."""
    topic = new_topic(cluster)
    want = produce(cluster, topic, "spark")
    with Measured(stack) as measured:
        rows = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", stack.bootstrap)
            .option("subscribe", topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .option("kafkaConsumer.pollTimeoutMs", str(int(DEADLINE * 1000)))
            .load()
            .select("partition", "offset", "key", "value")
            .collect()
        )
    got = sorted(
        (r["partition"], r["offset"], bytes(r["key"]).decode(), bytes(r["value"]).decode())
        for r in rows
    )
    assert len(got) == len(want)
    assert_exactly_once_in_order(want, got)  # sorted by offset: every one once, at its offset
    SHARES["spark"] = share = measured.share(cluster.node_in_rack(PROXY_RACK))
    assert sum(measured.by_node.values()) >= sum(len(k) + len(v) for _, _, k, v in want)
    assert share >= MIN_IN_RACK, f"{share:.3f} from rack {PROXY_RACK} {measured.by_node}"


def test_aiokafka_ignores_the_redirect_so_the_proxy_follows_it(
    cluster: KafkaCluster, stack: ProxyStack
) -> None:
    """aiokafka 0.14 follows ``preferred_read_replica`` only when it set ``client_rack``
    itself: it would ask the leader again and again and get no records.  The proxy sees
    that (the connection's redirect watch stops) and from then on follows the redirect
    itself (proxy.relay.read_replica): it fetches those partitions from the rack-b broker
    on a connection of its own and answers aiokafka as the leader would, so at least
    95 % of the record bytes come from rack b, exactly once and in order."""
    topic = new_topic(cluster)
    want = produce(cluster, topic, "aiokafka")
    stopped: list[bool] = []

    def watches_stopped() -> None:
        handlers = stack.run_sync(lambda: list(stack.proxy.fetch_path.handlers))
        stopped.append(any(h.rack is not None and h.rack.stopped for h in handlers))

    with Measured(stack) as measured:
        got = aiokafka_(stack, topic, before_stop=watches_stopped)
    assert_exactly_once_in_order(want, got)
    SHARES["aiokafka"] = share = measured.share(cluster.node_in_rack(PROXY_RACK))
    assert stopped == [True]
    assert share >= MIN_IN_RACK, f"{share:.3f} from rack {PROXY_RACK} {measured.by_node}"


def acls_in_effect(cluster: KafkaCluster, topic: str, sasl: dict[str, str]) -> None:
    """Until the SASL user, straight to the brokers, sees *topic* (the authorizer has the
    ACLs); the admin client's threads end when it is dropped on return."""
    admin = confluent_kafka.admin.AdminClient(
        {"bootstrap.servers": cluster.secure_bootstrap, **sasl}
    )
    wait_until(
        "the ACLs in effect",
        lambda: admin.list_topics(topic, timeout=5).topics[topic].error is None,
    )


def test_a_sasl_client_reads_from_the_proxy_rack(cluster: KafkaCluster) -> None:
    """SASL end to end (SCRAM-SHA-512 through a proxy in front of the SASL listeners):
    the rack goes into the client's own Fetch on its own authenticated connection, and
    the client follows the redirect on its own connection to the replica's listener."""
    topic = new_topic(cluster)
    want = produce(cluster, topic, "sasl")
    sasl = {
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": SCRAM_MECHANISM,
        "sasl.username": SASL_USER,
        "sasl.password": SASL_PASSWORD,
    }
    acls_in_effect(cluster, topic, sasl)
    secure = ProxyStack(
        {"rack": PROXY_RACK, "upstream": cluster.secure_bootstrap.split(",")},
        upstream=cluster,
        metrics=Metrics(process_metrics=False),
    ).start()
    try:
        with Measured(secure) as measured:
            got = librdkafka(secure, topic, **sasl)
    finally:
        secure.stop()
    assert_exactly_once_in_order(want, got)
    SHARES["librdkafka, SASL"] = share = measured.share(cluster.node_in_rack(PROXY_RACK))
    assert share >= MIN_IN_RACK, f"{share:.3f} from rack {PROXY_RACK} {measured.by_node}"


def test_a_fetch_v10_client_reads_from_the_proxy_rack(
    cluster: KafkaCluster, stack: ProxyStack
) -> None:
    """A raw Fetch v10 client stands in for segmentio/kafka-go: v10 has no rack id and its
    answer no ``preferred_read_replica``.  The proxy sends its rack in the newer Fetch it
    speaks upstream, follows the leader's redirect itself (proxy.relay.read_replica: the
    partitions fetched from the rack-b broker on a connection of its own) and answers the
    client as the leader would: at least 95 % of the record bytes from rack b, every
    record once and in order."""
    topic = new_topic(cluster)
    want = produce(cluster, topic, "v10")
    counts = {p: sum(1 for r in want if r[0] == p) for p in range(PARTITIONS)}
    deadline = time.monotonic() + DEADLINE
    with RawClient(stack.bootstrap, client_id="rack-v10", deadline=deadline) as c:
        meta = c.call(3, 9, METADATA_V9 | {"topics": [{"name": topic}]})
    brokers = {int(b.node_id): f"{b.host}:{b.port}" for b in meta.brokers}
    by_leader: dict[int, list[int]] = {}
    for t in meta.topics:
        for part in t.partitions:
            by_leader.setdefault(int(part.leader_id), []).append(int(part.partition_index))
    offsets = dict.fromkeys(range(PARTITIONS), 0)
    with Measured(stack) as measured:
        for leader, parts in by_leader.items():
            with RawClient(brokers[leader], client_id="rack-v10", deadline=deadline) as c:
                # as kafka-go does: the proxy learns the upstream's Fetch versions from it
                c.call(18, 3, {"client_software_name": "raw", "client_software_version": "1"})
                while any(offsets[p] < counts[p] for p in parts):
                    fetched = c.call(1, 10, fetch_v10(topic, parts, offsets))
                    assert int(fetched.error_code) == 0
                    for t in fetched.responses:
                        for pd in t.partitions:
                            p = int(pd.partition_index)
                            assert int(pd.error_code) == 0, (p, pd.error_code)
                            data = bytes(pd.records or b"")
                            for h in iter_batches(data[: complete_prefix_size(data)]):
                                assert h.base_offset == offsets[p], (p, h.base_offset, offsets[p])
                                offsets[p] = h.next_offset
    assert offsets == counts  # every record once, in order (batch by batch, no gap or overlap)
    SHARES["fetch v10 (raw)"] = share = measured.share(cluster.node_in_rack(PROXY_RACK))
    assert share >= MIN_IN_RACK, f"{share:.3f} from rack {PROXY_RACK} {measured.by_node}"


METADATA_V9 = {
    "allow_auto_topic_creation": False,
    "include_cluster_authorized_operations": False,
    "include_topic_authorized_operations": False,
}


def fetch_v10(
    topic: str, partitions: list[int], offsets: dict[int, int], partition_max_bytes: int = 1 << 20
) -> dict[str, Any]:
    parts = [partition_body(p, offsets[p], partition_max_bytes) for p in partitions]
    return fetch_body([{"topic": topic, "partitions": parts}], max_wait=500, max_bytes=1 << 20)


# -- faults -----------------------------------------------------------------------------------


def wait_until(what: str, ready: Callable[[], bool], timeout: float = DEADLINE) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"not {what} after {timeout:.0f} s"
        time.sleep(0.1)


def returns_to(stack: ProxyStack, node: int, nbytes: float = 20_000) -> Callable[[], bool]:
    """True once *nbytes* more record bytes came from *node* than when it was made."""
    start = record_bytes(stack)[node]
    return lambda: record_bytes(stack)[node] - start >= nbytes


def test_rack_b_broker_stopped_and_started_again(cluster: KafkaCluster, stack: ProxyStack) -> None:
    in_rack = cluster.node_in_rack(PROXY_RACK)
    topic = new_topic(cluster)
    v = verifier.Verifier(
        stack.bootstrap, topic, PARTITIONS, assign=1, group=0, rate=400, records=800, name="rack-b"
    ).start()
    try:
        v.wait_flowing()
        wait_until("reading from rack b", returns_to(stack, in_rack))
        v.mark("reading from rack b")
        cluster.stop_broker(in_rack)
        v.mark("rack-b stopped")
        v.wait_progress()
        cluster.start_broker(in_rack)
        v.mark("rack-b started")
        v.wait_progress()
        wait_until("reading from rack b again", returns_to(stack, in_rack))
        v.mark("reading from rack b again")
    finally:
        cluster.start_broker(in_rack)
        report = v.finish()
    print("rack-b stop/start:", ", ".join(f"{m} +{t:.1f} s" for m, t in v.marks))
    verifier.REPORTS["rack-b broker stopped"] = report
    verifier.check(report)


def fallbacks(stack: ProxyStack, reason: str) -> float:
    registry = stack.metrics.registry
    name = f"{PREFIX}preferred_replica_fallbacks_total"
    return registry.get_sample_value(name, {"reason": reason}) or 0.0


def test_a_fetch_v10_client_goes_back_to_the_leader_when_rack_b_stops(
    cluster: KafkaCluster, stack: ProxyStack
) -> None:
    """The proxy follows the redirect for a raw Fetch v10 client (partitions led by the
    rack-a broker, served by the rack-b one); the rack-b broker stops after the first
    records came from it: the proxy's connection to it fails, those partitions are
    answered empty (no error) and go back to their leader, and the client reads every
    record once and in order, the rest from the leader."""
    in_rack = cluster.node_in_rack(PROXY_RACK)
    rack_a = cluster.node_in_rack("a")
    topic = new_topic(cluster)
    want = produce(cluster, topic, "v10-stop")
    parts = [p for p in range(PARTITIONS) if cluster.leader_of(topic, p) == rack_a]
    counts = {p: sum(1 for r in want if r[0] == p) for p in parts}
    deadline = time.monotonic() + 2 * DEADLINE
    with RawClient(stack.bootstrap, client_id="rack-v10", deadline=deadline) as c:
        meta = c.call(3, 9, METADATA_V9 | {"topics": [{"name": topic}]})
    address = next(f"{b.host}:{b.port}" for b in meta.brokers if int(b.node_id) == rack_a)
    offsets = dict.fromkeys(parts, 0)
    unavailable = fallbacks(stack, "replica_unavailable") + fallbacks(
        stack, "not_leader_or_follower"
    )
    start = record_bytes(stack)
    stopped: dict[int, float] | None = None
    try:
        with RawClient(address, client_id="rack-v10-stop", deadline=deadline) as c:
            c.call(18, 3, {"client_software_name": "raw", "client_software_version": "1"})
            while any(offsets[p] < counts[p] for p in parts):
                # one small batch per partition and fetch: the stop lands mid-consumption
                fetched = c.call(1, 10, fetch_v10(topic, parts, offsets, 2048))
                assert int(fetched.error_code) == 0
                for t in fetched.responses:
                    for pd in t.partitions:
                        p = int(pd.partition_index)
                        assert int(pd.error_code) == 0, (p, pd.error_code)
                        data = bytes(pd.records or b"")
                        for h in iter_batches(data[: complete_prefix_size(data)]):
                            assert h.base_offset == offsets[p], (p, h.base_offset, offsets[p])
                            offsets[p] = h.next_offset
                if stopped is None and record_bytes(stack)[in_rack] > start[in_rack]:
                    cluster.stop_broker(in_rack)
                    stopped = record_bytes(stack)
    finally:
        cluster.start_broker(in_rack)
    assert stopped is not None, "no record came from rack b before the stop"
    assert offsets == counts  # every record once, in order
    after = record_bytes(stack)
    assert after[rack_a] > stopped[rack_a], "nothing came from the leader after the stop"
    assert (
        fallbacks(stack, "replica_unavailable") + fallbacks(stack, "not_leader_or_follower")
        > unavailable
    )


def test_leaders_change(cluster: KafkaCluster, stack: ProxyStack) -> None:
    """Leaders move mid-consumption (a reassignment that reorders the replicas, then a
    preferred leader election: no broker stops): one partition from the rack-b broker to
    the rack-a one, one from the rack-a broker to the rack-b one."""
    in_rack = cluster.node_in_rack(PROXY_RACK)
    rack_a = cluster.node_in_rack("a")
    topic = new_topic(cluster)
    v = verifier.Verifier(
        stack.bootstrap, topic, PARTITIONS, assign=1, group=0, rate=400, records=800, name="leader"
    ).start()
    try:
        v.wait_flowing()
        wait_until("reading from rack b", returns_to(stack, in_rack))
        led_by_b = next(p for p in range(PARTITIONS) if cluster.leader_of(topic, p) == in_rack)
        led_by_a = next(p for p in range(PARTITIONS) if cluster.leader_of(topic, p) == rack_a)
        cluster.move_leader(topic, led_by_b, rack_a)  # now redirected back to rack b
        cluster.move_leader(topic, led_by_a, in_rack)  # now served by its leader in rack b
        v.mark("leaders moved")
        v.wait_progress()
        wait_until("reading from rack b after the move", returns_to(stack, in_rack))
    finally:
        report = v.finish()
    verifier.REPORTS["leaders moved"] = report
    verifier.check(report)


def test_followers_left_behind_by_an_acks_1_flood(cluster: KafkaCluster, stack: ProxyStack) -> None:
    """A producer floods a partition led outside rack b with acks=1 (the leader answers before the followers
    have the records) while a librdkafka consumer reads it through the proxy: every
    acknowledged record arrives exactly once, in offset order, whichever replica served it,
    and the partition is read from rack b again once the flood is over."""
    in_rack = cluster.node_in_rack(PROXY_RACK)
    topic = new_topic(cluster)
    # a partition led outside rack b: the rack-b broker serves it as a follower
    flooded_p = next(p for p in range(PARTITIONS) if cluster.leader_of(topic, p) != in_rack)
    acked: list[tuple[int, int, str]] = []
    errors: list[Any] = []
    flood_done = threading.Event()

    def flood() -> None:
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": cluster.bootstrap, "acks": 1, "linger.ms": 2}
        )

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                acked.append((msg.partition(), msg.offset(), msg.key().decode()))

        for i in range(20_000):
            while True:
                try:
                    producer.produce(
                        topic, b"f" * 200, f"f-{i}".encode(), flooded_p, on_delivery=delivered
                    )
                    break
                except BufferError:
                    producer.poll(0.01)
        producer.flush(DEADLINE)
        flood_done.set()

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": stack.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "client.id": "rack-flood",
            "enable.auto.commit": False,
        }
    )
    consumer.assign(
        [confluent_kafka.TopicPartition(topic, flooded_p, confluent_kafka.OFFSET_BEGINNING)]
    )
    thread = threading.Thread(target=flood, name="acks-1-flood")
    got: list[tuple[int, int, str]] = []
    thread.start()
    try:
        deadline = time.monotonic() + DEADLINE
        with Measured(stack) as during:
            while not flood_done.is_set() or len(got) < len(acked):
                assert time.monotonic() < deadline, f"{len(got)} of {len(acked)} records"
                for m in consumer.consume(1000, 0.2):
                    assert m.error() is None, m.error()
                    got.append((m.partition(), m.offset(), m.key().decode()))
        print(f"acks=1 flood of partition {flooded_p}: record bytes by node {during.by_node}")
        # after the flood: more records, read from rack b again
        back = returns_to(stack, in_rack, nbytes=50_000)
        producer = confluent_kafka.Producer({"bootstrap.servers": cluster.bootstrap})
        for i in range(500):
            producer.produce(topic, b"g" * 200, f"g-{i}".encode(), flooded_p)
        assert producer.flush(DEADLINE) == 0
        want = len(acked) + 500
        while len(got) < want:
            assert time.monotonic() < deadline, f"{len(got)} of {want} records"
            for m in consumer.consume(1000, 0.2):
                assert m.error() is None, m.error()
                got.append((m.partition(), m.offset(), m.key().decode()))
        wait_until("reading from rack b after the flood", back, timeout=10)
    finally:
        thread.join(DEADLINE)
        consumer.close()
    assert not errors
    flooded = [r for r in got if r[2].startswith("f-")]
    assert flooded == sorted(acked, key=lambda r: r[1])  # each once, in offset order
    assert [o for _, o, _ in got] == list(range(want))


def test_rack_metrics_show_in_rack_bytes_avoided_bytes_and_their_cost(
    cluster: KafkaCluster, stack: ProxyStack
) -> None:
    """The proxy's rack metrics on real Kafka (issue 18 part 4): what a client with no rack
    reads through the proxy in rack b is in-rack; the bytes of partitions led in racks a
    and c are cross-zone bytes avoided, valued at the default price (0.02 per GB)."""
    value = stack.metrics.registry.get_sample_value
    in_rack = cluster.node_in_rack(PROXY_RACK)
    rack_bytes = f"{PREFIX}broker_to_proxy_fetch_rack_record_bytes_total"

    def now() -> dict[str, float]:
        return {
            "same": value(rack_bytes, {"node": str(in_rack), "locality": "same_rack"}) or 0.0,
            "other": sum(
                value(rack_bytes, {"node": str(n), "locality": "other_rack"}) or 0.0
                for n in cluster.nodes
            ),
            "avoided": value(f"{PREFIX}cross_zone_avoided_record_bytes_total") or 0.0,
            "cost": value(f"{PREFIX}cross_zone_cost_avoided") or 0.0,
            "redirects": value(f"{PREFIX}preferred_replica_redirects_total", {"node": str(in_rack)})
            or 0.0,
            "follower_fetches": value(
                f"{PREFIX}proxy_to_broker_preferred_replica_fetches_total", {"node": str(in_rack)}
            )
            or 0.0,
        }

    topic = new_topic(cluster)
    want = produce(cluster, topic, "metrics")
    led_elsewhere = [p for p in range(PARTITIONS) if cluster.leader_of(topic, p) != in_rack]
    before = now()
    got = librdkafka(stack, topic)
    after = now()
    assert_exactly_once_in_order(want, got)
    d = {k: after[k] - before[k] for k in after}
    assert d["same"] >= sum(len(k) + len(v) for _, _, k, v in want)
    assert d["other"] <= 0.05 * d["same"], d
    assert 0 < d["avoided"] < d["same"], d  # the partitions rack b leads avoid nothing
    assert d["cost"] == pytest.approx(d["avoided"] * 0.02 / 1e9)
    assert d["redirects"] >= len(led_elsewhere) > 0, d
    assert d["follower_fetches"] >= 1, d
