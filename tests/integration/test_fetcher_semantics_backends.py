"""The fetcher's discard rules on both backends: held data goes when it may no longer be true.

Issue 17's "Done when": a leader change, a truncation and an offset reset discard the
batches the proxy holds ahead of a client (``proxy.shaping.buffer``).  The proxy runs
in-process (``ProxyStack``) in front of a 3-node dev cluster and of real Kafka's 3-node
fixture ``kafka3`` (replication factor 3, so leadership can move with no broker stopped:
``KafkaCluster.move_leader``).  The client is raw (``support.rawclient``): it names its
offsets and leader epochs itself, so each rule is staged exactly.

The settings make every client fetch take held data *and* go upstream: ``max_records``
15 over batches of 10 records delivers one batch and keeps the next, and a reuse buffer
of 3,000 bytes (under 3 batches) never holds enough to fill a response on its own, so
each fetch asks upstream past the held batch and upstream's word (its error, high
watermark, leader epoch) reaches the held batch.  Answers from held data alone, and
watermarks never going back, are tested with real clients in
``test_fetch_ahead_clients.py``.

Fails without the feature: removing the epoch comparison of ``ReuseBuffer._match`` fails
the leader change (the entry is not dropped); removing its offset comparison fails the
offset reset (the batch held for offset 30 goes out for a fetch at 60); removing the
high-watermark comparison of ``FetchShaper.finish`` fails the truncation (records of the
lost log are delivered).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from support.backends import BACKENDS_3, running, upstream_for
from support.batches import make_batch
from support.fetch_messages import fetch_body
from support.rawclient import RawClient, make_request
from support.stack import ProxyStack

from proxy.protocol.records import iter_batches

pytestmark = pytest.mark.integration

DEADLINE = 90.0
BATCHES = 10
PER_BATCH = 10
VALUE = 100
SETTINGS = {"max_records": 15, "reuse_buffer_bytes": 3000}
METADATA_V9 = {
    "allow_auto_topic_creation": False,
    "include_cluster_authorized_operations": False,
    "include_topic_authorized_operations": False,
}
NONE, OFFSET_OUT_OF_RANGE = 0, 1


@pytest.fixture(scope="module", params=BACKENDS_3)
def stack(request: pytest.FixtureRequest) -> Iterator[ProxyStack]:
    upstream = upstream_for(request, request.param)
    with running(ProxyStack(SETTINGS, nodes=3, upstream=upstream, name="semantics")) as s:
        yield s


def produce(stack: ProxyStack, topic: str, batches: int = BATCHES) -> None:
    """*batches* batches of PER_BATCH records to partition 0 (one flush per batch)."""
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": stack.direct_bootstrap,
            "linger.ms": 5000,
            "batch.num.messages": PER_BATCH,
            "acks": "all",
        }
    )
    for b in range(batches):
        for i in range(PER_BATCH):
            producer.produce(topic, f"{b * PER_BATCH + i}".encode().ljust(VALUE, b"."), partition=0)
        assert producer.flush(30) == 0


def leader_and_epoch(stack: ProxyStack, topic: str, deadline: float) -> tuple[int, int]:
    """Partition 0's leader and leader epoch, from Metadata through the proxy."""
    leader, epoch, _ = metadata(stack, topic, deadline)
    return leader, epoch


def metadata(stack: ProxyStack, topic: str, deadline: float) -> tuple[int, int, list[int]]:
    """Partition 0's leader and leader epoch, and every node id, from Metadata through the
    proxy."""
    with RawClient(stack.bootstrap, client_id="semantics-meta", deadline=deadline) as c:
        meta = c.call(3, 9, METADATA_V9 | {"topics": [{"name": topic}]})
    [t] = meta.topics
    [p] = [p for p in t.partitions if int(p.partition_index) == 0]
    return int(p.leader_id), int(p.leader_epoch), sorted(int(b.node_id) for b in meta.brokers)


def direct_answer(stack: ProxyStack, node: int, fetch_request: Any, deadline: float) -> Answer:
    """What broker *node* itself answers (no proxy)."""
    if stack.kafka is not None:
        address = stack.kafka.nodes[node].address
    else:
        address = stack.run_sync(lambda: stack.cluster.node(node).address)
    with RawClient(address, client_id="semantics-probe", deadline=deadline) as c:
        return Answer(c.request(fetch_request))


def until_broker_says(
    stack: ProxyStack, node: int, request: Any, deadline: float, *, error: bool
) -> None:
    """Until broker *node* answers *request* with an error (*error*) or without one: an
    election reaches each broker a moment after Metadata names it."""
    while (direct_answer(stack, node, request, deadline).error != NONE) != error:
        assert time.monotonic() < deadline, f"node {node} has not applied the election"
        time.sleep(0.05)  # the broker applying its metadata, bounded by the deadline


def move_leader(stack: ProxyStack, topic: str, to: int, old_epoch: int, deadline: float) -> int:
    """Make node *to* partition 0's leader (an election: a new leader epoch); the new epoch
    once Metadata through the proxy names both."""
    if stack.kafka is not None:
        stack.kafka.move_leader(topic, 0, to, timeout=max(1.0, deadline - time.monotonic()))
    else:

        def elect() -> None:
            part = stack.cluster.state.partition(topic, 0)
            assert part is not None
            part.leader = to
            part.leader_epoch += 1
            stack.cluster.notify()

        stack.run_sync(elect)
    while True:
        leader, epoch = leader_and_epoch(stack, topic, deadline)
        if leader == to and epoch > old_epoch:
            return epoch
        assert time.monotonic() < deadline, f"Metadata still names {leader} at epoch {epoch}"
        time.sleep(0.1)  # the brokers' metadata catching up, bounded by the deadline


def fetch(topic: str, offset: int, epoch: int) -> Any:
    part = {
        "partition": 0,
        "current_leader_epoch": epoch,
        "fetch_offset": offset,
        "last_fetched_epoch": -1,
        "log_start_offset": -1,
        "partition_max_bytes": 1 << 20,
    }
    return make_request(
        1, 12, fetch_body([{"topic": topic, "partitions": [part]}], max_wait=0, max_bytes=1 << 20)
    )


class Answer:
    def __init__(self, response: Any) -> None:
        [t] = response.responses
        [p] = t.partitions
        self.error = int(p.error_code)
        self.high_watermark = int(p.high_watermark)
        self.batches = list(iter_batches(p.records or b""))

    @property
    def offsets(self) -> list[int]:
        return [h.base_offset + i for h in self.batches for i in range(h.records_count)]


class Client:
    """A raw client on the proxy's listener for one node, and the handler serving it."""

    def __init__(self, stack: ProxyStack, node: int, deadline: float) -> None:
        self.stack = stack
        self.name = f"semantics-{uuid.uuid4().hex[:8]}"
        address = stack.run_sync(lambda: stack.proxy.book.advertised[node])
        self.raw = RawClient(address, client_id=self.name, deadline=deadline)

    def fetch(self, topic: str, offset: int, epoch: int) -> Answer:
        return Answer(self.raw.request(fetch(topic, offset, epoch)))

    def buffer(self) -> Any:
        """The reuse buffer of the proxy's handler of this connection."""

        def find() -> Any:
            [live] = [
                live
                for live in self.stack.proxy.live.values()
                if live.connection.client_id == self.name
            ]
            return live.relay.fetch_handler.shaper.buffer

        return self.stack.run_sync(find)

    def held(self) -> tuple[int, int]:
        """(bytes held, entries dropped by a discard rule) for this connection."""
        buffer = self.buffer()
        return self.stack.run_sync(lambda: (buffer.size, buffer.dropped))

    def read_to_end(self, topic: str, offset: int, epoch: int, end: int) -> list[int]:
        """Every offset from *offset* to *end*, fetching until it is there (no gap, no
        duplicate, in order)."""
        got: list[int] = []
        while offset < end:
            answer = self.fetch(topic, offset, epoch)
            assert answer.error == NONE, answer.error
            assert answer.offsets[:1] in ([], [offset]), (offset, answer.offsets)
            got += answer.offsets
            offset = answer.offsets[-1] + 1 if answer.offsets else offset
        return got

    def close(self) -> None:
        self.raw.close()


def test_a_leader_change_discards_held_data(stack: ProxyStack) -> None:
    """The client learns a new leader epoch: the batches held at the old one are dropped
    and its fetch goes upstream from its own offset; a fetch at the old epoch after
    another election gets the broker's error and no held batch, and the held batch goes."""
    deadline = time.monotonic() + DEADLINE
    topic = stack.create_topic(1, prefix="leader")
    produce(stack, topic)
    end = BATCHES * PER_BATCH
    leader, epoch, nodes = metadata(stack, topic, deadline)
    other = next(n for n in nodes if n != leader)
    client = Client(stack, leader, deadline)
    try:
        first = client.fetch(topic, 0, epoch)
        assert first.error == NONE and first.offsets == list(range(10))
        size, dropped = client.held()
        assert size > 0  # the next batch is held

        # An election away and one back: the same broker leads, at a newer epoch.
        away = move_leader(stack, topic, other, epoch, deadline)
        back = move_leader(stack, topic, leader, away, deadline)
        until_broker_says(stack, leader, fetch(topic, 10, back), deadline, error=False)
        answer = client.fetch(topic, 10, back)
        assert answer.error == NONE and answer.offsets == list(range(10, 20))
        size, after = client.held()
        assert after == dropped + 1, "the batch held at the old epoch was not dropped"
        assert size > 0  # 20-29, held at the new epoch

        # Another election; the client does not know yet: the old leader's error, no data.
        newest = move_leader(stack, topic, other, back, deadline)
        until_broker_says(stack, leader, fetch(topic, 30, back), deadline, error=True)
        stale = client.fetch(topic, 20, back)
        assert stale.error != NONE and stale.offsets == [], (stale.error, stale.offsets)
        assert client.held()[0] == 0, "the held batch outlived its leader's error"
    finally:
        client.close()
    until_broker_says(stack, other, fetch(topic, 20, newest), deadline, error=False)
    moved = Client(stack, other, deadline)
    try:
        assert moved.read_to_end(topic, 20, newest, end) == list(range(20, end))
    finally:
        moved.close()


def test_an_offset_reset_discards_held_data(stack: ProxyStack) -> None:
    """A client that fetches at another offset than the one its held batch starts at
    (it seeked, or reset after OFFSET_OUT_OF_RANGE) gets its own offset's records, and the
    held batch is dropped; records deleted under it (DeleteRecords) reset it to the new
    log start, with nothing held from before."""
    deadline = time.monotonic() + DEADLINE
    topic = stack.create_topic(1, prefix="reset")
    produce(stack, topic)
    end = BATCHES * PER_BATCH
    leader, epoch = leader_and_epoch(stack, topic, deadline)
    client = Client(stack, leader, deadline)
    try:
        assert client.read_to_end(topic, 0, epoch, 30) == list(range(30))
        size, dropped = client.held()
        assert size > 0  # 30-39
        # Seek forward past what is held, then back to the start.
        ahead = client.fetch(topic, 60, epoch)
        assert ahead.error == NONE and ahead.offsets == list(range(60, 70))
        assert client.held()[1] == dropped + 1
        back = client.fetch(topic, 0, epoch)
        assert back.error == NONE and back.offsets == list(range(10))
        assert client.held()[1] == dropped + 2

        # Records deleted past the client's offset and past what is held (40 onwards):
        # the client is told OFFSET_OUT_OF_RANGE for its own offset, and resets.
        assert client.read_to_end(topic, 10, epoch, 40) == list(range(10, 40))
        assert client.held()[0] > 0  # 40-49
        delete_records_before(stack, topic, 70, deadline)
        while (answer := client.fetch(topic, 40, epoch)).error == NONE:
            assert answer.offsets == [], "records of the deleted range were delivered"
            assert time.monotonic() < deadline
        assert answer.error == OFFSET_OUT_OF_RANGE
        assert client.held()[0] == 0
        assert client.read_to_end(topic, 70, epoch, end) == list(range(70, end))
    finally:
        client.close()


def delete_records_before(stack: ProxyStack, topic: str, offset: int, deadline: float) -> None:
    """Advance partition 0's log start offset to *offset* (Kafka's DeleteRecords)."""
    if stack.kafka is None:

        def delete() -> None:
            part = stack.cluster.state.partition(topic, 0)
            assert part is not None
            part.log.delete_records_before(offset)

        stack.run_sync(delete)
        return
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": stack.kafka.bootstrap})
    tp = confluent_kafka.TopicPartition(topic, 0, offset)
    timeout = max(1.0, deadline - time.monotonic())
    for future in admin.delete_records([tp], request_timeout=timeout).values():
        future.result(timeout=timeout)


@pytest.mark.parametrize("stack", ["devbroker"], indirect=True)
def test_a_truncated_log_discards_held_data(stack: ProxyStack) -> None:
    """Dev cluster only: an unclean leader election truncates partition 0 below what the
    proxy holds and the new leader appends other records at the same offsets; a client
    that sends no leader epoch (-1, as before Fetch v9) is told only by the high watermark
    going back, and must never get a record of the lost log.

    Real Kafka truncates a log only through an unclean election: both followers stopped,
    records acknowledged by the leader alone, the leader stopped and a stale follower
    restarted to lead.  Four broker restarts of the shared ``kafka3`` cluster (tens of
    seconds of JVM start each on this machine) for one rule, and Kafka 4's eligible leader
    replicas may refuse the election; the dev cluster, which exists for faults Kafka
    cannot stage, builds the same divergent log in place."""
    assert stack.kafka is None
    deadline = time.monotonic() + DEADLINE
    topic = stack.create_topic(1, prefix="truncated")
    old, new = 1000, 9000  # base timestamps: which log a batch came from

    def fill(timestamp: int, base: int, batches: int) -> None:
        part = stack.cluster.state.partition(topic, 0)
        assert part is not None
        for b in range(batches):
            payload = f"{timestamp}-{base + b}".encode().ljust(PER_BATCH * VALUE, b".")
            batch = make_batch(0, PER_BATCH, payload, base_timestamp=timestamp)
            part.log.append(batch, part.leader_epoch)
        stack.cluster.notify()

    def truncate_and_diverge() -> None:
        part = stack.cluster.state.partition(topic, 0)
        assert part is not None
        kept = bytes(part.log.data[: next(iter_batches(part.log.data)).size])  # offsets 0-9
        part.log = type(part.log)()
        part.leader_epoch += 1
        part.log.append(kept, part.leader_epoch)

    stack.run_sync(fill, old, 0, BATCHES)
    leader, _ = leader_and_epoch(stack, topic, deadline)
    client = Client(stack, leader, deadline)
    try:
        first = client.fetch(topic, 0, -1)
        assert first.offsets == list(range(10)) and first.high_watermark == 100
        assert client.held()[0] > 0  # 10-19 of the old log
        stack.run_sync(truncate_and_diverge)
        stack.run_sync(fill, new, 1, 3)  # 10-39 of the new log
        got: list[tuple[int, int]] = []
        offset = 10
        while offset < 40:
            answer = client.fetch(topic, offset, -1)
            assert answer.error == NONE, answer.error
            got += [(h.base_offset, h.base_timestamp) for h in answer.batches]
            offset = answer.offsets[-1] + 1 if answer.offsets else offset
            assert time.monotonic() < deadline
        assert got == [(10, new), (20, new), (30, new)], got
    finally:
        client.close()
