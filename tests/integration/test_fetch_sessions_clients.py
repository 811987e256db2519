"""Real clients through the proxy's default Fetch path (issue 4), against the dev cluster.

The proxy runs exactly as ``kafka-fetch-proxy run`` builds it (``Proxy(settings)``:
upstream fetch sessions and shaping on every connection).  librdkafka
(confluent-kafka) and aiokafka send sessionless full fetches, kafka-python
>= 2.1 uses its own fetch sessions.  Records are produced while the consumer
runs, and every 150 ms the dev cluster either evicts every upstream fetch
session or skews their epochs (INVALID_FETCH_SESSION_EPOCH); each record must
arrive exactly once and in order per partition, and the upstream traffic must
actually use incremental fetches.  Also the issue's measurement: an idle
librdkafka consumer of 1,000 partitions moves at least 20x fewer upstream bytes
per fetch round through the proxy than connected directly (every byte on the
proxy's upstream sockets, and for the direct case every byte on the dev
broker's sockets, length prefixes included, divided by the Fetch requests sent
in the same window).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from support.delivery import assert_exactly_once_in_order
from support.stack import ProxyStack

from proxy.devbroker.cluster import DevNode
from proxy.fetchpath import FetchPathHandler
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder
from proxy.server import proxy as proxy_module
from proxy.server.proxy import Proxy

pytestmark = pytest.mark.integration

DEADLINE = 90.0
PARTITIONS = 64
Record = tuple[int, bytes | None, bytes]


class Traffic:
    """Bytes in both directions on a set of sockets, and the Fetch requests among them."""

    def __init__(self) -> None:
        self.counting = False
        self.bytes = 0
        self.fetches = 0

    def take(self) -> tuple[int, int]:
        out = (self.bytes, self.fetches)
        self.bytes = self.fetches = 0
        return out


class CountingStream(trio.abc.Stream):
    """A stream that counts what passes; *requests_out*: requests leave through send_all."""

    def __init__(self, inner: trio.abc.Stream, traffic: Traffic, *, requests_out: bool) -> None:
        self.inner = inner
        self.traffic = traffic
        self.requests_out = requests_out
        self._requests = FrameDecoder(1 << 30)

    def _requests_seen(self, data: bytes) -> None:
        self._requests.feed(data)
        while (frame := self._requests.next_frame()) is not None:
            if self.traffic.counting and codec.parse_request_header(frame).api_key == 1:
                self.traffic.fetches += 1

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if self.traffic.counting:
            self.traffic.bytes += len(data)
        if self.requests_out:
            self._requests_seen(bytes(data))
        await self.inner.send_all(data)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        if self.traffic.counting:
            self.traffic.bytes += len(data)
        if not self.requests_out:
            self._requests_seen(bytes(data))
        return data

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


class SessionStack(ProxyStack):
    """The default Proxy in front of a dev cluster, with byte counters on both sides."""

    def __init__(self, settings: dict[str, Any] | None = None, *, nodes: int = 3) -> None:
        super().__init__(settings, nodes=nodes, name="session-stack")
        self.handlers: list[FetchPathHandler] = []
        self.proxy_upstream = Traffic()
        """Every byte on the proxy's upstream sockets."""
        self.broker_side = Traffic()
        """Every byte on the dev broker's sockets (direct clients and the proxy alike)."""

    def configure(self, proxy: Proxy) -> None:
        path = proxy.fetch_path  # the default Fetch path, as `run` builds it
        assert path is not None
        new_handler = path.handler

        def keep(node_id: int | None = None) -> FetchPathHandler:
            handler = new_handler(node_id)
            self.handlers.append(handler)
            return handler

        path.handler = keep  # type: ignore[method-assign]

    def create_topic(self, partitions: int, prefix: str = "s") -> str:
        return super().create_topic(partitions, prefix)

    def skew_upstream_epochs(self) -> None:
        """Make the next request of every upstream session fail INVALID_FETCH_SESSION_EPOCH."""

        def skew() -> None:
            for node in self.cluster.nodes:
                for session in node.sessions.sessions():
                    session.epoch += 1

        self.run_sync(skew)

    def upstream_stats(self) -> dict[str, int]:
        def collect() -> dict[str, int]:
            total: dict[str, int] = defaultdict(int)
            for h in self.handlers:
                if h.server is not None:
                    s = h.server.translator.stats
                    total["full"] += s.full_requests
                    total["incremental"] += s.incremental_requests
                    total["resends"] += s.resends
            return dict(total)

        return self.run_sync(collect)

    def client_sessions_created(self) -> int:
        path = self.proxy.fetch_path
        assert path is not None
        return sum(c.sessions_created for c in path.client_session_caches())


@pytest.fixture(scope="module", autouse=True)
def counting_sockets() -> Iterator[SessionStack]:
    """Count bytes on the dev broker's sockets and on the proxy's upstream sockets."""
    stack = SessionStack()
    serve = DevNode._serve_connection
    connect = proxy_module.open_upstream

    async def broker_side(self: DevNode, stream: Any, decoder: FrameDecoder) -> None:
        wrapped = CountingStream(stream, stack.broker_side, requests_out=False)
        await serve(self, wrapped, decoder)  # type: ignore[arg-type]

    async def upstream(*args: Any, **kwargs: Any) -> trio.abc.Stream:
        stream = await connect(*args, **kwargs)
        return CountingStream(stream, stack.proxy_upstream, requests_out=True)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DevNode, "_serve_connection", broker_side)
        mp.setattr(proxy_module, "open_upstream", upstream)
        stack.start()
        try:
            yield stack
        finally:
            stack.stop()


@pytest.fixture(scope="module")
def stack(counting_sockets: SessionStack) -> SessionStack:
    return counting_sockets


def make_records(partitions: int, per_partition: int, tag: str) -> list[Record]:
    return [
        (p, f"k{p}-{i}".encode(), f"{tag}|{p}|{i}|".encode() + b"v" * (i % 40))
        for i in range(per_partition)
        for p in range(partitions)
    ]


confluent_kafka = pytest.importorskip("confluent_kafka")
kafka = pytest.importorskip("kafka")
aiokafka = pytest.importorskip("aiokafka")


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


def evicting(stack: SessionStack, done: threading.Event) -> threading.Thread:
    def run() -> None:
        turn = 0
        while not done.wait(0.15):
            turn += 1
            if turn % 2:
                stack.evict_upstream_sessions()
            else:
                stack.skew_upstream_epochs()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_confluent_sessionless_consumer_with_upstream_sessions(stack: SessionStack) -> None:
    topic = stack.create_topic(PARTITIONS)
    records = make_records(PARTITIONS, 1600, "rd")  # 102,400 records
    before = stack.upstream_stats()
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": stack.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        }
    )
    got: list[Record] = []
    done = threading.Event()
    try:
        consumer.assign(
            [
                confluent_kafka.TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING)
                for p in range(PARTITIONS)
            ]
        )
        evictor = evicting(stack, done)
        with Producing(stack, topic, records):
            deadline = time.monotonic() + DEADLINE
            while len(got) < len(records):
                assert time.monotonic() < deadline, f"{len(got)} of {len(records)} records"
                for msg in consumer.consume(1000, 0.2):
                    assert msg.error() is None, msg.error()
                    got.append((msg.partition(), msg.key(), msg.value()))
    finally:
        done.set()
        consumer.close()
    evictor.join(timeout=5)
    assert_exactly_once_in_order(records, got)
    after = stack.upstream_stats()
    assert after["incremental"] - before.get("incremental", 0) > 0
    assert after["resends"] - before.get("resends", 0) > 0  # evictions happened and were hidden


def test_kafka_python_session_consumer_through_proxy_sessions(stack: SessionStack) -> None:
    topic = stack.create_topic(PARTITIONS)
    records = make_records(PARTITIONS, 120, "kp")
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=stack.bootstrap,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    got: list[Record] = []
    done = threading.Event()
    try:
        consumer.assign([kafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        evictor = evicting(stack, done)
        with Producing(stack, topic, records):
            deadline = time.monotonic() + DEADLINE
            while len(got) < len(records):
                assert time.monotonic() < deadline, f"{len(got)} of {len(records)} records"
                for tp, msgs in consumer.poll(timeout_ms=200).items():
                    got.extend((tp.partition, m.key, m.value) for m in msgs)
    finally:
        done.set()
        consumer.close()
    evictor.join(timeout=5)
    assert_exactly_once_in_order(records, got)
    assert stack.client_sessions_created() > 0  # the client used sessions with the proxy


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


def idle_bytes_per_fetch(
    bootstrap: str, traffic: Traffic, stack: SessionStack, topic: str
) -> float:
    """Bytes per Fetch request of an idle librdkafka consumer of every partition of *topic*."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(1000)])
        warm_until = time.monotonic() + 2.0
        while time.monotonic() < warm_until:
            assert consumer.poll(0.1) is None
        stack.run_sync(setattr, traffic, "counting", True)
        measure_until = time.monotonic() + 2.0
        while time.monotonic() < measure_until:
            assert consumer.poll(0.1) is None
        stack.run_sync(setattr, traffic, "counting", False)
        total, fetches = stack.run_sync(traffic.take)
    finally:
        consumer.close()
    assert fetches >= 10, fetches
    return float(total) / fetches


def test_idle_librdkafka_consumer_of_1000_partitions_moves_20x_fewer_upstream_bytes(
    stack: SessionStack,
) -> None:
    topic = stack.create_topic(1000)
    direct = idle_bytes_per_fetch(stack.direct_bootstrap, stack.broker_side, stack, topic)
    proxied = idle_bytes_per_fetch(stack.bootstrap, stack.proxy_upstream, stack, topic)
    print(f"idle 1000-partition consumer: {direct:.0f} B/fetch direct, {proxied:.0f} via proxy")
    assert direct >= 20 * proxied, (direct, proxied)
