"""Real clients through the proxy with upstream fetch sessions (issue 4), against the dev cluster.

The proxy runs with ``SessionFetchHandler`` on every connection: librdkafka
(confluent-kafka) and aiokafka send sessionless full fetches, kafka-python
>= 2.1 uses its own fetch sessions.  Records are produced while the consumer
runs, and every 150 ms the dev cluster either evicts every upstream fetch
session or skews their epochs (INVALID_FETCH_SESSION_EPOCH); each record must
arrive exactly once and in order per partition, and the upstream traffic must
actually use incremental fetches.  Also the issue's measurement: an idle
librdkafka consumer of 1,000 partitions moves at least 20x fewer upstream Fetch
bytes per fetch round through the sessions than through a pass-through proxy
(counted on the upstream Fetch frames, length prefixes included).
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import trio

from proxy import config
from proxy.devbroker.cluster import DevCluster
from proxy.relay.pipeline import ClientRequest, FetchHandler, PassThroughFetch, Upstream
from proxy.server.proxy import Proxy
from proxy.sessions.broker import FetchSessionCache
from proxy.sessions.handler import SessionFetchHandler
from proxy.sessions.topic_ids import TopicIdMap

pytestmark = pytest.mark.integration

DEADLINE = 90.0
PARTITIONS = 64
Record = tuple[int, bytes | None, bytes]


@dataclass
class Traffic:
    """Upstream Fetch traffic of the connections that were open while counting."""

    requests: int = 0
    bytes: int = 0
    counting: bool = False


class _CountingPort:
    def __init__(self, upstream: Upstream, traffic: Traffic) -> None:
        self._upstream = upstream
        self._traffic = traffic

    def send(
        self,
        frame: bytes,
        *,
        api_key: int,
        api_version: int,
        on_response: Callable[[bytes], None] | None,
    ) -> None:
        traffic = self._traffic
        counted = traffic.counting and api_key == 1
        if counted:
            traffic.requests += 1
            traffic.bytes += 4 + len(frame)  # with the length prefix, as on the socket

        def counting_response(response: bytes) -> None:
            if counted:
                traffic.bytes += 4 + len(response)
            assert on_response is not None
            on_response(response)

        self._upstream.send(
            frame,
            api_key=api_key,
            api_version=api_version,
            on_response=None if on_response is None else counting_response,
        )

    def rewrite_addresses(self, api_key: int, api_version: int, frame: bytes) -> bytes:
        return self._upstream.rewrite_addresses(api_key, api_version, frame)


class Counting:
    """A FetchHandler wrapper counting the upstream Fetch bytes (requests and responses)."""

    def __init__(self, inner: FetchHandler, traffic: Traffic) -> None:
        self.inner = inner
        self.traffic = traffic

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None:
        self.inner.handle_fetch(request, _CountingPort(upstream, self.traffic))

    def observe(self, api_key: int, api_version: int, frame: bytes) -> None:
        self.inner.observe(api_key, api_version, frame)


class SessionStack:
    """DevCluster + Proxy(fetch_handler_factory=SessionFetchHandler) in a trio thread."""

    def __init__(self) -> None:
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="session-stack", daemon=True)
        self.handlers: list[SessionFetchHandler] = []
        self.topic_ids = TopicIdMap()
        self.client_sessions = FetchSessionCache()
        self.sessions_enabled = True
        """Which FetchHandler new client connections get (sessions, or plain pass-through)."""
        self.fetch_traffic = Traffic()
        self.cluster: DevCluster
        self.proxy: Proxy
        self._token: trio.lowlevel.TrioToken
        self._stop: trio.Event

    def _factory(self) -> FetchHandler:
        inner: FetchHandler
        if self.sessions_enabled:
            handler = SessionFetchHandler(self.client_sessions, self.topic_ids)
            self.handlers.append(handler)
            inner = handler
        else:
            inner = PassThroughFetch()
        return Counting(inner, self.fetch_traffic)

    def start(self) -> SessionStack:
        self._thread.start()
        if not self._ready.wait(timeout=30):
            raise RuntimeError("stack did not start in 30 s")
        if self._error is not None:
            raise RuntimeError("stack failed") from self._error
        return self

    def _run(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as exc:
            self._error = exc
            self._ready.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        self._token = trio.lowlevel.current_trio_token()
        async with DevCluster(nodes=3) as cluster:
            settings = config.validate(
                {
                    "upstream": [cluster.bootstrap],
                    "listen": "127.0.0.1:0",
                    "broker_port_base": 0,
                    "connect_timeout_seconds": 5,
                    "retry_backoff_initial_seconds": 0.05,
                    "retry_backoff_max_seconds": 0.5,
                }
            )
            async with trio.open_nursery() as nursery:
                proxy = await nursery.start(
                    Proxy(settings, fetch_handler_factory=self._factory).serve
                )
                with trio.fail_after(20):
                    await proxy.discovered.wait()
                self.cluster, self.proxy = cluster, proxy
                self._ready.set()
                await self._stop.wait()
                nursery.cancel_scope.cancel()

    def stop(self) -> None:
        trio.from_thread.run_sync(self._stop.set, trio_token=self._token)
        self._thread.join(timeout=30)
        assert not self._thread.is_alive(), "stack did not stop"

    @property
    def bootstrap(self) -> str:
        assert self.proxy.bootstrap is not None
        return f"127.0.0.1:{self.proxy.bootstrap.port}"

    def create_topic(self, partitions: int) -> str:
        name = f"s-{uuid.uuid4().hex[:10]}"
        trio.from_thread.run_sync(
            self.cluster.create_topic, name, partitions, trio_token=self._token
        )
        return name

    def evict_upstream_sessions(self) -> None:
        trio.from_thread.run_sync(self.cluster.evict_fetch_sessions, trio_token=self._token)

    def skew_upstream_epochs(self) -> None:
        """Make the next request of every upstream session fail INVALID_FETCH_SESSION_EPOCH."""

        def skew() -> None:
            for node in self.cluster.nodes:
                for session in node.sessions.sessions():
                    session.epoch += 1

        trio.from_thread.run_sync(skew, trio_token=self._token)

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

        return trio.from_thread.run_sync(collect, trio_token=self._token)


@pytest.fixture(scope="module")
def stack() -> Iterator[SessionStack]:
    s = SessionStack().start()
    try:
        yield s
    finally:
        s.stop()


def make_records(partitions: int, per_partition: int, tag: str) -> list[Record]:
    return [
        (p, f"k{p}-{i}".encode(), f"{tag}|{p}|{i}|".encode() + b"v" * (i % 40))
        for i in range(per_partition)
        for p in range(partitions)
    ]


def assert_exactly_once_in_order(sent: list[Record], got: list[Record]) -> None:
    want: dict[int, list[Record]] = defaultdict(list)
    have: dict[int, list[Record]] = defaultdict(list)
    for r in sent:
        want[r[0]].append(r)
    for r in got:
        have[r[0]].append(r)
    assert set(have) == set(want)
    for p in want:
        assert have[p] == want[p], f"partition {p}: {len(have[p])} received, {len(want[p])} sent"


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
    assert stack.client_sessions.sessions_created > 0  # the client used sessions with the proxy


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


def idle_fetch_bytes_per_round(stack: SessionStack, topic: str, partitions: int) -> float:
    """Upstream Fetch bytes per upstream fetch of an idle librdkafka consumer of *topic*."""
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": stack.bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 50,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        warm_until = time.monotonic() + 2.0
        while time.monotonic() < warm_until:
            assert consumer.poll(0.1) is None
        traffic = stack.fetch_traffic
        trio.from_thread.run_sync(
            lambda: setattr(traffic, "counting", True), trio_token=stack._token
        )
        measure_until = time.monotonic() + 2.0
        while time.monotonic() < measure_until:
            assert consumer.poll(0.1) is None
        trio.from_thread.run_sync(
            lambda: setattr(traffic, "counting", False), trio_token=stack._token
        )
        requests, total = traffic.requests, traffic.bytes
        traffic.requests = traffic.bytes = 0
    finally:
        consumer.close()
    assert requests >= 10, requests
    return total / requests


def test_idle_librdkafka_consumer_of_1000_partitions_moves_20x_fewer_upstream_bytes(
    stack: SessionStack,
) -> None:
    topic = stack.create_topic(1000)
    try:
        stack.sessions_enabled = False
        direct = idle_fetch_bytes_per_round(stack, topic, 1000)
    finally:
        stack.sessions_enabled = True
    through_sessions = idle_fetch_bytes_per_round(stack, topic, 1000)
    assert direct >= 20 * through_sessions, (direct, through_sessions)
