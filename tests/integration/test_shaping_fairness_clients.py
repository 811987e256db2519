"""Fair partition rotation with real clients: the proxy vs the same clients directly.

Eight partitions on one broker: two are produced 50x faster than the other
six.  Each client (confluent-kafka, aiokafka, kafka-python) consumes every
record once through the proxy with tight limits (``max_records``,
``max_response_bytes``; the client keeps its defaults) and once directly
against the dev cluster with the same byte limit set in the client.  A tap on
the client's connection (the proxy's client socket; the dev broker's socket
for direct clients) decodes every Fetch exchange and counts, per partition,
the consecutive responses in which the partition had data (high watermark
above the client's fetch offset) and got none: its starvation in fetch rounds.
Through the proxy the worst slow partition must stay within N = 8 rounds (the
partitions with data); both numbers are printed.

The proxy side runs on both backends, the dev cluster and real Kafka (``taps`` is
parametrised over ``BACKENDS``).  The direct comparison, printed and never
asserted, needs a tap on the broker's sockets, which only the dev cluster has; on
real Kafka it is left out.
"""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import aiokafka
import confluent_kafka
import kafka
import pytest
import trio
from support.backends import BACKENDS, running, upstream_for
from support.sessions import SessionStack

from devbroker.cluster import DevNode
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder
from proxy.protocol.records import iter_batches
from proxy.server.proxy import Proxy

pytestmark = pytest.mark.integration

DEADLINE = 60.0
PARTITIONS = 8
FAST = (0, 1)
SLOW = tuple(range(2, PARTITIONS))
ROUNDS = 60
FAST_PER_ROUND = 50
MAX_RESPONSE_BYTES = 16384
MAX_RECORDS = 100
BOUND = PARTITIONS


class FetchTap:
    """Per connection: Fetch requests seen, then their responses; starvation per partition."""

    def __init__(self, sink: Starvation) -> None:
        self.sink = sink
        self._requests = FrameDecoder(1 << 30)
        self._responses = FrameDecoder(1 << 30)
        self._pending: dict[int, tuple[int, list[Any]]] = {}
        self._offsets: dict[Any, int] = {}
        self._hw: dict[Any, int] = {}
        self._starved: dict[Any, int] = {}

    def client_bytes(self, data: bytes) -> None:
        self._requests.feed(data)
        while (frame := self._requests.next_frame()) is not None:
            header = codec.parse_request_header(frame)
            if header.api_key != 1:
                continue
            _, req = codec.decode_request(frame)
            full = int(getattr(req, "session_epoch", -1)) <= 0
            if full:
                self._offsets = {}
            for t in getattr(req, "forgotten_topics_data", ()):
                ref = getattr(t, "topic_id", None) or t.topic
                for p in t.partitions:
                    self._offsets.pop((ref, int(p)), None)
            for t in req.topics:
                ref = t.topic_id if hasattr(t, "topic_id") else t.topic
                for p in t.partitions:
                    self._offsets[(ref, int(p.partition))] = int(p.fetch_offset)
            self._pending[header.correlation_id] = (header.api_version, list(self._offsets))

    def server_bytes(self, data: bytes) -> None:
        self._responses.feed(data)
        while (frame := self._responses.next_frame()) is not None:
            cid = codec.peek_correlation_id(frame)
            entry = self._pending.pop(cid, None)
            if entry is None:
                continue
            version, wanted = entry
            _, resp = codec.decode_response(1, version, frame)
            delivered = set()
            for t in resp.responses:
                ref = t.topic_id if hasattr(t, "topic_id") else t.topic
                for pd in t.partitions:
                    key = (ref, int(pd.partition_index))
                    self._hw[key] = int(pd.high_watermark)
                    if any(h.counted_records for h in iter_batches(pd.records or b"")):
                        delivered.add(key)
            for key in wanted:
                if key in delivered:
                    self.sink.served(key[1], self._starved.pop(key, 0))
                elif self._hw.get(key, -1) > self._offsets.get(key, 0):
                    self._starved[key] = self._starved.get(key, 0) + 1


class Starvation:
    def __init__(self) -> None:
        self.on = False
        self.worst: dict[int, int] = {}

    def served(self, partition: int, rounds: int) -> None:
        if self.on:
            self.worst[partition] = max(self.worst.get(partition, 0), rounds)

    def slow_max(self) -> int:
        return max((self.worst.get(p, 0) for p in SLOW), default=0)


class TapStream(trio.abc.Stream):
    """The server side of a client connection, tapped (requests in, responses out)."""

    def __init__(self, inner: Any, tap: FetchTap) -> None:
        self.inner = inner
        self.tap = tap
        self.socket = getattr(inner, "socket", None)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.tap.server_bytes(bytes(data))
        await self.inner.send_all(data)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.inner.receive_some(max_bytes)
        self.tap.client_bytes(bytes(data))
        return data

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


@pytest.fixture(scope="module", params=BACKENDS)
def taps(request: pytest.FixtureRequest) -> Iterator[tuple[SessionStack, Starvation, Starvation]]:
    direct, proxied = Starvation(), Starvation()
    serve_broker = DevNode._serve_connection
    serve_client = Proxy._serve_client

    async def broker_side(self: DevNode, stream: Any, decoder: FrameDecoder) -> None:
        await serve_broker(self, TapStream(stream, FetchTap(direct)), decoder)

    async def client_side(self: Proxy, stream: Any, *rest: Any) -> None:
        await serve_client(self, TapStream(stream, FetchTap(proxied)), *rest)

    stack = SessionStack(
        {"max_records": MAX_RECORDS, "max_response_bytes": MAX_RESPONSE_BYTES},
        nodes=1,
        upstream=upstream_for(request, request.param),
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(DevNode, "_serve_connection", broker_side)
        mp.setattr(Proxy, "_serve_client", client_side)
        with running(stack):
            yield stack, direct, proxied


def produce(bootstrap: str, topic: str) -> int:
    """Fast partitions get 50 records for every one a slow partition gets; returns the total."""
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.size": 4096}
    )
    total = 0
    for n in range(ROUNDS):
        for p in FAST:
            for i in range(FAST_PER_ROUND):
                producer.produce(topic, b"f" * 150 + str(i).encode(), partition=p)
                total += 1
        for p in SLOW:
            producer.produce(topic, b"s" * 150 + str(n).encode(), partition=p)
            total += 1
        producer.poll(0)
        time.sleep(0.01)
    assert producer.flush(30) == 0
    return total


Consume = Callable[[str, str, int, bool], int]


def consume_confluent(bootstrap: str, topic: str, total: int, direct: bool) -> int:
    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"g-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
        "fetch.wait.max.ms": 100,
    }
    if direct:
        conf |= {"fetch.max.bytes": MAX_RESPONSE_BYTES, "max.partition.fetch.bytes": 8192}
        conf |= {"message.max.bytes": MAX_RESPONSE_BYTES}
    consumer = confluent_kafka.Consumer(conf)
    got = 0
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + DEADLINE
        while got < total:
            assert time.monotonic() < deadline, f"{got} of {total}"
            for msg in consumer.consume(500, 0.2):
                assert msg.error() is None, msg.error()
                got += 1
    finally:
        consumer.close()
    return got


def consume_kafka_python(bootstrap: str, topic: str, total: int, direct: bool) -> int:
    kwargs: dict[str, Any] = {"fetch_max_wait_ms": 100}
    if direct:
        kwargs |= {"fetch_max_bytes": MAX_RESPONSE_BYTES, "max_partition_fetch_bytes": 8192}
    consumer = kafka.KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, **kwargs)
    got = 0
    try:
        consumer.assign([kafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        deadline = time.monotonic() + DEADLINE
        while got < total:
            assert time.monotonic() < deadline, f"{got} of {total}"
            got += sum(len(m) for m in consumer.poll(timeout_ms=200).values())
    finally:
        consumer.close()
    return got


def consume_aiokafka(bootstrap: str, topic: str, total: int, direct: bool) -> int:
    async def run() -> int:
        kwargs: dict[str, Any] = {"fetch_max_wait_ms": 100}
        if direct:
            kwargs |= {"fetch_max_bytes": MAX_RESPONSE_BYTES, "max_partition_fetch_bytes": 8192}
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, **kwargs
        )
        await consumer.start()
        got = 0
        try:
            consumer.assign([aiokafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
            await consumer.seek_to_beginning()
            while got < total:
                batch = await consumer.getmany(timeout_ms=200)
                got += sum(len(m) for m in batch.values())
        finally:
            await consumer.stop()
        return got

    return asyncio.run(asyncio.wait_for(run(), DEADLINE))


@pytest.mark.parametrize(
    "consume",
    [consume_confluent, consume_aiokafka, consume_kafka_python],
    ids=["confluent-kafka", "aiokafka", "kafka-python"],
)
def test_slow_partitions_are_served_within_a_bounded_number_of_fetch_rounds(
    taps: tuple[SessionStack, Starvation, Starvation], consume: Consume
) -> None:
    stack, direct_tap, proxy_tap = taps
    results: dict[str, object] = {"direct": "n/a (no broker-side tap on real Kafka)"}
    runs = [(False, proxy_tap, stack.bootstrap)]
    if stack.kafka is None:
        runs.insert(0, (True, direct_tap, stack.direct_bootstrap))
    for direct, tap, bootstrap in runs:
        topic = stack.create_topic(PARTITIONS)
        tap.worst.clear()
        tap.on = True
        try:
            with ThreadResult(consume, bootstrap, topic, direct) as consumer:
                total = produce(stack.direct_bootstrap, topic)
                consumer.total = total
        finally:
            tap.on = False
        assert consumer.result == total
        results["direct" if direct else "proxy"] = tap.slow_max()
    print(
        f"{consume.__name__} ({stack.backend}): max starvation of a slow partition, in fetch rounds:"
        f" direct {results['direct']}, through the proxy {results['proxy']} (bound {BOUND})"
    )
    proxy_max = results["proxy"]
    assert isinstance(proxy_max, int) and proxy_max <= BOUND


class ThreadResult:
    """Runs a consumer in a thread once the total to expect is known."""

    def __init__(self, consume: Consume, bootstrap: str, topic: str, direct: bool) -> None:
        self.total: int | None = None
        self.result: int | None = None
        self.error: BaseException | None = None
        self._ready = threading.Event()
        self._args = (consume, bootstrap, topic, direct)
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ThreadResult:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._ready.set()
        self._thread.join(DEADLINE + 10)
        assert not self._thread.is_alive()
        if self.error is not None:
            raise self.error

    def _run(self) -> None:
        consume, bootstrap, topic, direct = self._args
        try:
            # Consume while producing; the exact total is known once production ends.
            self.result = consume(bootstrap, topic, _Total(self), direct)  # type: ignore[arg-type]
        except BaseException as exc:
            self.error = exc


class _Total:
    """An int-like target that is unknown (infinite) until production has ended."""

    def __init__(self, owner: ThreadResult) -> None:
        self.owner = owner

    def _value(self) -> float:
        return float("inf") if self.owner.total is None else self.owner.total

    def __gt__(self, other: int) -> bool:
        return self._value() > other

    def __lt__(self, other: int) -> bool:
        return self._value() < other

    def __str__(self) -> str:
        return str(self.owner.total)
