"""Raw fetch scripts against a proxy and its upstream: records, and the upstream's side.

:class:`Upstream` creates topics on a stack's upstream (the dev cluster or real Kafka),
writes records to them (plain, or in transactions that commit, abort or stay open, one
batch a call) and reads partitions directly (the oracle of
``tests/integration/test_fetch_scripts_backends.py`` and ``test_fetch_lockstep_backends.py``);
:func:`whole_batches` cuts a records field into its whole batches.
"""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar
from uuid import UUID

import confluent_kafka

from proxy.protocol.records import iter_batches

from .fetch_messages import fetch_body, partition_body
from .rawclient import RawClient, make_request
from .stack import ProxyStack

FETCH, METADATA, API_VERSIONS = 1, 3, 18
READ_COMMITTED = 1
METADATA_V12 = {
    "allow_auto_topic_creation": False,
    "include_cluster_authorized_operations": False,
    "include_topic_authorized_operations": False,
}

TopicPartition = tuple[str, int]
RECORD_SIZES = (20, 200, 900)
"""The value sizes (bytes) of the records ``Upstream.produce`` writes, 1 to 12 a batch."""


@dataclass(frozen=True)
class Batch:
    base: int
    last: int
    data: bytes


def whole_batches(records: Any) -> tuple[list[Batch], int]:
    """The whole batches of a records field (``records.iter_batches``: a partial trailing
    batch is not one), and the field's size in bytes."""
    if records is None:
        return [], 0
    data = bytes(records)
    out = [
        Batch(h.base_offset, h.next_offset - 1, data[h.position : h.position + h.size])
        for h in iter_batches(data)
    ]
    return out, len(data)


def aborted_of(pd: Any) -> set[tuple[int, int]]:
    return {(int(a.producer_id), int(a.first_offset)) for a in pd.aborted_transactions or ()}


# -- the upstream: topics, producers, the oracle ------------------------------------------


class Upstream:
    """Topics on the stack's upstream, producers writing to them, and direct reads."""

    def __init__(
        self,
        stack: ProxyStack,
        deadline: float,
        name: str,
        record_sizes: tuple[int, ...] = RECORD_SIZES,
    ) -> None:
        self.stack = stack
        self.record_sizes = record_sizes
        self.deadline = deadline
        self.topics: dict[str, int] = {}
        bootstrap = stack.direct_bootstrap
        self.plain = confluent_kafka.Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 5000, "acks": "all"}
        )
        self.txn = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 5000,
                "transactional.id": f"{name}-{uuid.uuid4().hex[:8]}",
            }
        )
        self.txn.init_transactions(self._left())
        self.open = False
        self.in_open: set[TopicPartition] = set()
        self.ends: dict[TopicPartition, int] = {}
        """Per partition, the offset after its last record or transaction marker."""
        self.direct_address = self._leader_address()
        self.direct = RawClient(self.direct_address, client_id="oracle", deadline=deadline)

    def _left(self) -> float:
        left = self.deadline - time.monotonic()
        assert left > 0, "the test's deadline has passed"
        return left

    def _leader_address(self) -> str:
        if self.stack.kafka is not None:
            return self.stack.kafka.bootstrap
        return self.stack.direct_bootstrap

    def create(self, partitions: int, prefix: str) -> str:
        name = self.stack.create_topic(partitions, prefix)
        self.topics[name] = partitions
        return name

    def produce(self, rng: random.Random, tp: TopicPartition) -> None:
        """One batch of records to *tp* (a flush ends it): plain, or in a transaction that
        commits, aborts or stays open (a later call ends it)."""
        count, size = rng.randint(1, 12), rng.choice(self.record_sizes)
        if self.open and rng.random() < 0.6:
            self._end(rng)
            return
        self.ends[tp] = self.ends.get(tp, 0) + count
        if rng.random() < 0.4:
            if not self.open:
                self.txn.begin_transaction()
                self.open = True
            self.in_open.add(tp)
            for _ in range(count):
                self.txn.produce(tp[0], b"t" * size, partition=tp[1])
            assert self.txn.flush(self._left()) == 0
            if rng.random() < 0.5:
                self._end(rng)
            return
        for _ in range(count):
            self.plain.produce(tp[0], b"p" * size, partition=tp[1])
        assert self.plain.flush(self._left()) == 0

    def _end(self, rng: random.Random) -> None:
        if rng.random() < 0.5:
            self.txn.abort_transaction(self._left())
        else:
            self.txn.commit_transaction(self._left())
        for tp in self.in_open:  # the marker
            self.ends[tp] += 1
        self._until_decided(sorted(self.in_open))
        self.in_open.clear()
        self.open = False

    def _until_decided(self, partitions: list[TopicPartition]) -> None:
        """Until the transaction's markers are in *partitions* (a broker writes them after
        EndTxn has answered): their last stable offset reaches their high watermark, so
        two reads in a row see the same log."""
        while partitions:
            read = self.read(dict.fromkeys(partitions, 0), READ_COMMITTED)
            partitions = [
                tp for tp in partitions if read[tp].last_stable_offset < read[tp].high_watermark
            ]
            if partitions:
                self._left()  # the deadline bounds the wait
                time.sleep(0.01)  # the broker writing its markers

    def read(
        self, asked: dict[TopicPartition, int], isolation: int, partition_max: int = 1 << 20
    ) -> dict[TopicPartition, Any]:
        """What the broker answers for *asked* (partition -> offset) now, each partition
        read up to *partition_max* bytes (at least what the checked fetch asked)."""
        topics = [
            {
                "topic": topic,
                "partitions": [
                    partition_body(p, offset, partition_max)
                    for (t, p), offset in asked.items()
                    if t == topic
                ],
            }
            for topic in sorted({t for t, _ in asked})
        ]
        body = fetch_body(topics, isolation_level=isolation, max_bytes=50 << 20)
        answer = self.direct.request(make_request(FETCH, 12, body))
        return {
            (t.topic, int(p.partition_index)): p for t in answer.responses for p in t.partitions
        }

    def close(self) -> None:
        if self.open:
            self.txn.abort_transaction(self._left())
        self.direct.close()
        for producer in (self.plain, self.txn):
            producer.close()


def seeded_upstream(
    stack: ProxyStack,
    rng: random.Random,
    deadline: float,
    name: str,
    record_sizes: tuple[int, ...] = RECORD_SIZES,
) -> Upstream:
    """Two topics (*name*a: 1 or 3 partitions, *name*b: 2) with a few batches in them."""
    upstream = Upstream(stack, deadline, name, record_sizes)
    try:
        upstream.create(rng.choice((1, 3)), f"{name}a")
        upstream.create(2, f"{name}b")
        partitions = [(t, p) for t, n in upstream.topics.items() for p in range(n)]
        for _ in range(rng.randint(3, 12)):
            upstream.produce(rng, rng.choice(partitions))
    except BaseException:
        upstream.close()
        raise
    return upstream


@dataclass(frozen=True)
class Learnt:
    """What a client learns from Metadata through the proxy: topic ids and its broker."""

    ids: dict[str, UUID]
    names: dict[UUID, str]
    broker: str
    """The proxy's listener for the one broker."""


def learn(stack: ProxyStack, topics: list[str], deadline: float) -> Learnt:
    """Metadata v12 for *topics* through the proxy's bootstrap, as a client asks it."""
    with RawClient(stack.bootstrap, client_id="scripts-meta", deadline=deadline) as c:
        meta = c.call(
            METADATA, 12, METADATA_V12 | {"topics": [{"name": t, "topic_id": None} for t in topics]}
        )
    ids = {t.name: t.topic_id for t in meta.topics}
    [broker] = meta.brokers
    return Learnt(ids, {v: k for k, v in ids.items()}, f"{broker.host}:{broker.port}")


def connect(address: str, client_id: str, deadline: float) -> tuple[RawClient, int]:
    """A raw client that starts as every client does, with ApiVersions, and the highest
    Fetch version the other end offers (a script uses none above it, as clients do not)."""
    raw = RawClient(address, client_id=client_id, deadline=deadline)
    versions = raw.call(
        API_VERSIONS, 3, {"client_software_name": client_id, "client_software_version": "1"}
    )
    [fetch] = [k for k in versions.api_keys if int(k.api_key) == FETCH]
    return raw, int(fetch.max_version)


def script_body(
    ids: dict[str, UUID],
    listed: list[tuple[TopicPartition, dict[str, Any]]],
    forgotten: list[TopicPartition],
    session_id: int,
    epoch: int,
    common: dict[str, Any],
) -> dict[str, Any]:
    """A Fetch body for ``devbroker.build``: *listed* partitions (one topic entry per run of
    a topic, in their order), *forgotten* ones, the session's id and epoch, and *common*
    fields (``fetch_body``'s defaults otherwise)."""

    def grouped(items: list[tuple[TopicPartition, Any]]) -> list[dict[str, Any]]:
        runs: list[tuple[str, list[Any]]] = []
        for (topic, _), value in items:
            if runs and runs[-1][0] == topic:
                runs[-1][1].append(value)
            else:
                runs.append((topic, [value]))
        return [{"topic": t, "topic_id": ids[t], "partitions": values} for t, values in runs]

    return fetch_body(
        grouped(listed),
        session_id=session_id,
        session_epoch=epoch,
        forgotten_topics_data=grouped([(tp, tp[1]) for tp in forgotten]),
        **common,
    )


class ScriptClient(Protocol):
    def step(self, rng: random.Random, label: str) -> None: ...

    def close(self) -> None: ...


C = TypeVar("C", bound=ScriptClient)


def run_seeded(
    stack: ProxyStack,
    seed: int,
    steps: int,
    deadline: float,
    name: str,
    make: Callable[[ProxyStack, Upstream, float], C],
    record_sizes: tuple[int, ...] = RECORD_SIZES,
) -> C:
    """*steps* steps of the client *make* builds over a :func:`seeded_upstream` (records of
    *record_sizes*), drawn from ``random.Random(seed)``; the client (closed) for its
    findings."""
    rng = random.Random(seed)
    upstream = seeded_upstream(stack, rng, deadline, f"{name}{seed}", record_sizes)
    client = None
    try:
        client = make(stack, upstream, deadline)
        for step in range(steps):
            client.step(rng, f"seed {seed} step {step}")
        return client
    finally:
        if client is not None:
            client.close()
        upstream.close()
