"""Raw fetch scripts against a proxy and its upstream: records, and the upstream's side.

:class:`Upstream` creates topics on a stack's upstream (the dev cluster or real Kafka),
writes records to them (plain, or in transactions that commit, abort or stay open, one
batch a call) and reads partitions directly (the oracle of
``tests/integration/test_fetch_scripts_backends.py`` and ``test_fetch_lockstep_backends.py``);
:func:`whole_batches` cuts a records field into its whole batches.
"""

from __future__ import annotations

import random
import struct
import time
import uuid
from dataclasses import dataclass
from typing import Any

import confluent_kafka

from .fetch_messages import fetch_body, partition_body
from .rawclient import RawClient, make_request
from .stack import ProxyStack

FETCH = 1
READ_COMMITTED = 1

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class Batch:
    base: int
    last: int
    data: bytes


def whole_batches(records: Any) -> tuple[list[Batch], int]:
    """The whole batches of a records field, and its size in bytes."""
    if records is None:
        return [], 0
    data = bytes(records)
    out: list[Batch] = []
    pos = 0
    while pos + 12 <= len(data):
        base, size = struct.unpack_from(">qi", data, pos)
        if pos + 12 + size > len(data):
            break
        (delta,) = struct.unpack_from(">i", data, pos + 23)  # lastOffsetDelta
        out.append(Batch(base, base + delta, data[pos : pos + 12 + size]))
        pos += 12 + size
    return out, len(data)


def aborted_of(pd: Any) -> set[tuple[int, int]]:
    return {(int(a.producer_id), int(a.first_offset)) for a in pd.aborted_transactions or ()}


# -- the upstream: topics, producers, the oracle ------------------------------------------


class Upstream:
    """Topics on the stack's upstream, producers writing to them, and direct reads."""

    def __init__(self, stack: ProxyStack, deadline: float, name: str) -> None:
        self.stack = stack
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
        count, size = rng.randint(1, 12), rng.choice((20, 200, 900))
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

    def read(self, asked: dict[TopicPartition, int], isolation: int) -> dict[TopicPartition, Any]:
        """What the broker answers for *asked* (partition -> offset) now."""
        topics = [
            {
                "topic": topic,
                "partitions": [
                    partition_body(p, offset, 1 << 20)
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
