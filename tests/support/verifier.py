"""Delivery under faults: a producer and consumers run through the proxy while a test
breaks something, then a check of what every consumer received.

    v = Verifier(bootstrap, topic, partitions=6, assign=1, group=2).start()
    v.wait_flowing()                 # every consumer has received records
    ...stage the fault...
    v.mark("healed")                 # a phase mark, in the report's timeline
    v.wait_progress()                # records sent after the mark reached every consumer
    report = v.finish()              # stop producing, flush, consume all that was acked
    report.check()                   # AssertionError naming what was lost or duplicated

Records: partition ``p``'s ``seq``-th record has key ``p:seq`` and value
``p:seq:<topic>:`` plus padding.  One confluent-kafka producer thread produces
them round-robin over the partitions, paced at ``rate`` records a second (a load
generator's pace, not a synchronisation), with ``acks=all``,
``enable.idempotence=true`` and no local message timeout, so every record is
acknowledged in the end: a delivery failure is a finding, as is any record
lost or duplicated.

Consumers (each its own thread and confluent-kafka client, through the proxy):

``assign``
    every partition assigned from the beginning, no group: every acknowledged
    record exactly once, in order per partition (the partition's log as the
    producer acknowledged it, offset by offset).
``group``
    members of one consumer group subscribing with auto-commit (librdkafka
    stores an offset once poll returned its record): at-least-once, no gap.
    Records received again after a rebalance or a failed commit are counted as
    duplicates and reported; a member going backwards *within* one assignment
    (no rebalance in between) is not a client's semantics and is a finding.

Every wait has an absolute deadline and is an event (a condition notified by the
threads), never a sleep.  The report is a plain dict for printing and JSON.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka

DEFAULT_RECORDS = int(os.environ.get("KAFKA_FETCH_PROXY_FAULT_RECORDS", "1500"))
"""Records each fault produces at least (more while the fault lasts); the long run sets more."""
DEFAULT_RATE = float(os.environ.get("KAFKA_FETCH_PROXY_FAULT_RATE", "150"))
"""Records a second the producer sends."""
MAX_RECORDS = int(os.environ.get("KAFKA_FETCH_PROXY_FAULT_MAX_RECORDS", "100000"))
"""A bound on what one producer sends, whatever happens."""
CLIENT_TIMEOUT_MS = 3000
"""The clients' request timeout (librdkafka socket.timeout.ms / request.timeout.ms)."""
VALUE_PADDING = b"x" * 80


def client_config(bootstrap: str, client_id: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "client.id": client_id,
        "socket.timeout.ms": CLIENT_TIMEOUT_MS,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 1000,
        "log_level": 3,
    }


@dataclass
class _Consumer:
    name: str
    kind: str  # "assign" or "group"
    received: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(partition, seq, offset, assignment generation) in the order received."""
    highest: dict[int, int] = field(default_factory=dict)
    """partition -> highest seq received."""
    generation: int = 0
    errors: Counter[str] = field(default_factory=Counter)
    rewinds: list[str] = field(default_factory=list)
    last: dict[int, tuple[int, int]] = field(default_factory=dict)
    """partition -> (generation, offset) of the last record received."""


class Verifier:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        *,
        assign: int = 1,
        group: int = 2,
        rate: float = DEFAULT_RATE,
        records: int = DEFAULT_RECORDS,
        name: str = "fault",
        config: dict[str, Any] | None = None,
    ) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.rate = rate
        self.records = records
        self.name = name
        self.config = dict(config or {})
        """Added to every client's configuration (e.g. SASL settings)."""
        self.group_id = f"{name}-{topic}"
        self.consumers = [_Consumer(f"assign-{i + 1}", "assign") for i in range(assign)]
        self.consumers += [_Consumer(f"group-{i + 1}", "group") for i in range(group)]
        self._cond = threading.Condition()
        self._stop_producing = threading.Event()
        self._stop_consuming = threading.Event()
        self.sent = [0] * partitions
        self.acked: dict[int, list[tuple[int, int]]] = defaultdict(list)
        """partition -> (seq, offset) acknowledged, in callback order."""
        self.failed: list[tuple[str, str]] = []
        self.flush_left = 0
        self.producer_errors: Counter[str] = Counter()
        self.marks: list[tuple[str, float]] = []
        self._began = 0.0
        self._threads: list[threading.Thread] = []
        self._crashed: list[str] = []

    # -- running ---------------------------------------------------------------------

    def start(self) -> Verifier:
        self._began = time.monotonic()
        self.mark("start")
        for c in self.consumers:
            self._spawn(self._consume, c, name=f"{self.name}-{c.name}")
        self._spawn(self._produce, name=f"{self.name}-producer")
        return self

    def _spawn(self, target: Any, *args: Any, name: str) -> None:
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # reported by check(), never swallowed
                with self._cond:
                    self._crashed.append(f"{name}: {type(exc).__name__}: {exc}")
                    self._cond.notify_all()
                raise

        thread = threading.Thread(target=run, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def mark(self, phase: str) -> None:
        with self._cond:
            self.marks.append((phase, round(time.monotonic() - self._began, 3)))

    def _produce(self) -> None:
        conf = (
            client_config(self.bootstrap, f"{self.name}-producer")
            | self.config
            | {
                "acks": "all",
                "enable.idempotence": True,
                "message.timeout.ms": 0,  # never give up locally: a failure is a finding
                "request.timeout.ms": CLIENT_TIMEOUT_MS,
                "linger.ms": 5,
                "retry.backoff.ms": 50,
                "error_cb": self._producer_error,
            }
        )
        producer = confluent_kafka.Producer(conf)
        interval = 1.0 / self.rate
        due = time.monotonic()
        i = 0
        while not self._stop_producing.is_set() and i < MAX_RECORDS:
            p = i % self.partitions
            seq = self.sent[p]
            key = f"{p}:{seq}".encode()
            try:
                producer.produce(
                    self.topic,
                    key + b":" + self.topic.encode() + b":" + VALUE_PADDING,
                    key,
                    partition=p,
                    on_delivery=self._delivered,
                )
            except BufferError:
                producer.poll(0.05)
                continue
            with self._cond:
                self.sent[p] += 1
            i += 1
            due += interval
            while (left := due - time.monotonic()) > 0:
                producer.poll(left)
            producer.poll(0)
        self.flush_left = producer.flush(120)
        with self._cond:
            self._cond.notify_all()

    def _producer_error(self, err: Any) -> None:
        with self._cond:
            self.producer_errors[err.name()] += 1

    def _delivered(self, err: Any, msg: Any) -> None:
        key = msg.key().decode()
        with self._cond:
            if err is not None:
                self.failed.append((key, str(err)))
            else:
                p, seq = (int(x) for x in key.split(":"))
                self.acked[p].append((seq, msg.offset()))
            self._cond.notify_all()

    def _consume(self, c: _Consumer) -> None:
        conf = (
            client_config(self.bootstrap, f"{self.name}-{c.name}")
            | self.config
            | {
                "group.id": self.group_id if c.kind == "group" else f"{self.group_id}-{c.name}",
                "auto.offset.reset": "earliest",
                "enable.auto.commit": c.kind == "group",
                "auto.commit.interval.ms": 500,
                "session.timeout.ms": 10000,
                "heartbeat.interval.ms": 1000,
                "error_cb": lambda err: self._consumer_error(c, err),
            }
        )
        consumer = confluent_kafka.Consumer(conf)
        try:
            if c.kind == "assign":
                consumer.assign(
                    [
                        confluent_kafka.TopicPartition(
                            self.topic, p, confluent_kafka.OFFSET_BEGINNING
                        )
                        for p in range(self.partitions)
                    ]
                )
            else:

                def assigned(_consumer: Any, _partitions: Any) -> None:
                    with self._cond:
                        c.generation += 1

                consumer.subscribe([self.topic], on_assign=assigned, on_revoke=assigned)
            while not self._stop_consuming.is_set():
                messages = consumer.consume(500, 0.2)
                with self._cond:
                    for m in messages:
                        error = m.error()
                        if error is not None:
                            c.errors[error.name()] += 1
                            continue
                        self._received(c, m)
                    self._cond.notify_all()
        finally:
            consumer.close()

    def _consumer_error(self, c: _Consumer, err: Any) -> None:
        with self._cond:
            c.errors[err.name()] += 1

    def _received(self, c: _Consumer, m: Any) -> None:
        p, seq = (int(x) for x in m.key().decode().split(":"))
        offset = m.offset()
        if p != m.partition() or not m.value().startswith(m.key() + b":" + self.topic.encode()):
            c.errors["corrupt_record"] += 1
        last = c.last.get(p)
        if last is not None and last[0] == c.generation and offset <= last[1]:
            c.rewinds.append(f"p{p}: offset {offset} after {last[1]} in one assignment")
        c.last[p] = (c.generation, offset)
        c.received.append((p, seq, offset, c.generation))
        c.highest[p] = max(seq, c.highest.get(p, -1))

    # -- waiting ---------------------------------------------------------------------

    def _wait(self, what: str, ready: Any, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not ready():
                if self._crashed:
                    raise AssertionError(f"{what}: a client thread failed: {self._crashed}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"{what}: not within {timeout:.0f} s; {self._progress()}")
                self._cond.wait(left)

    def _progress(self) -> str:
        acked = sum(len(v) for v in self.acked.values())
        seen = {c.name: len(c.received) for c in self.consumers}
        return f"sent {sum(self.sent)}, acked {acked}, received {seen}"

    def _reached(self, target: list[int]) -> bool:
        """Every partition's record ``target[p]`` received by every consumer (group: by one)."""
        group = [c for c in self.consumers if c.kind == "group"]
        for p, seq in enumerate(target):
            if any(c.highest.get(p, -1) < seq for c in self.consumers if c.kind == "assign"):
                return False
            if group and max(c.highest.get(p, -1) for c in group) < seq:
                return False
        return True

    def wait_flowing(self, records: int = 20, timeout: float = 60.0) -> None:
        """Until every consumer received records of every partition (``records`` of each)."""
        self._wait("traffic flowing", lambda: self._reached([records] * self.partitions), timeout)

    def wait_progress(self, timeout: float = 90.0) -> None:
        """Until records sent after now reached every consumer, on every partition."""
        with self._cond:
            target = [n + 1 for n in self.sent]
        self._wait("progress after the fault", lambda: self._reached(target), timeout)

    def finish(self, timeout: float = 120.0) -> dict[str, Any]:
        """Produce up to ``records`` in all, flush, let the consumers receive all acked.

        The wait for production is *timeout* plus what the records still to send take at
        ``rate``, so the long run (``KAFKA_FETCH_PROXY_FAULT_RECORDS``) gets the time it needs.
        """
        with self._cond:
            left = max(0, self.records - sum(self.sent))
        self._wait(
            "records produced", lambda: sum(self.sent) >= self.records, timeout + left / self.rate
        )
        self._stop_producing.set()
        self.mark("production stopped")
        producer = self._threads[-1]
        producer.join(timeout)
        assert not producer.is_alive(), "the producer did not flush in time"

        def all_received() -> bool:
            return self._reached([len(self.acked[p]) - 1 for p in range(self.partitions)])

        try:
            self._wait("every acknowledged record received", all_received, timeout)
        finally:
            self.mark("consumed")
            self._stop_consuming.set()
            for t in self._threads:
                t.join(30)
        return self.report()

    # -- the verdict -----------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        acked = {p: sorted(self.acked[p]) for p in range(self.partitions)}
        producer_order = []
        unknown_offsets = 0
        for p, entries in acked.items():
            seqs = [s for s, _ in entries]
            # librdkafka can acknowledge a record without its offset (an idempotent retry
            # the broker answered as a duplicate of a batch already written): such a record
            # is still checked to be consumed once, but has no offset to order here.
            offsets = [o for _, o in entries if o is not None]
            unknown_offsets += len(entries) - len(offsets)
            if seqs != list(range(len(seqs))) or offsets != sorted(set(offsets)):
                producer_order.append(p)
        out: dict[str, Any] = {
            "topic": self.topic,
            "partitions": self.partitions,
            "produced": sum(self.sent),
            "acknowledged": sum(len(v) for v in acked.values()),
            "acknowledged_without_offset": unknown_offsets,
            "delivery_failures": len(self.failed),
            "unflushed": self.flush_left,
            "producer_out_of_order_partitions": producer_order,
            "producer_errors": dict(self.producer_errors),
            "timeline_seconds": [[phase, t] for phase, t in self.marks],
            "threads_failed": list(self._crashed),
            "consumers": {},
        }
        group_seen: dict[int, Counter[int]] = defaultdict(Counter)
        for c in self.consumers:
            per_partition: dict[int, list[int]] = defaultdict(list)
            for p, seq, _offset, _gen in c.received:
                per_partition[p].append(seq)
            lost = duplicated = out_of_order = 0
            for p in range(self.partitions):
                want = len(acked[p])
                got = per_partition[p]
                counts = Counter(got)
                lost += sum(1 for s in range(want) if s not in counts)
                duplicated += sum(n - 1 for n in counts.values())
                out_of_order += sum(1 for a, b in itertools.pairwise(got) if b <= a)
                if c.kind == "group":
                    group_seen[p].update(got)
            out["consumers"][c.name] = {
                "kind": c.kind,
                "received": len(c.received),
                "lost": lost if c.kind == "assign" else None,
                "duplicated": duplicated,
                "out_of_order": out_of_order,
                "unacknowledged": sum(
                    1 for p, s in ((p, s) for p, s, _, _ in c.received) if s >= len(acked[p])
                ),
                "rewinds_within_assignment": len(c.rewinds),
                "rewind_examples": c.rewinds[:5],
                "assignments": c.generation,
                "errors": dict(c.errors),
            }
        if group_seen:
            want_total = sum(len(v) for v in acked.values())
            distinct = sum(
                sum(1 for s in range(len(acked[p])) if s in group_seen[p])
                for p in range(self.partitions)
            )
            out["group"] = {
                "received": sum(sum(c.values()) for c in group_seen.values()),
                "distinct": distinct,
                "gaps": want_total - distinct,
                "duplicates": sum(sum(c.values()) for c in group_seen.values()) - distinct,
            }
        return out


def check(report: dict[str, Any]) -> None:
    """Fail naming every way the run lost, duplicated or reordered records."""
    problems = []
    if report["threads_failed"]:
        problems.append(f"client threads failed: {report['threads_failed']}")
    if report["delivery_failures"] or report["unflushed"]:
        problems.append(
            f"producer: {report['delivery_failures']} delivery failures,"
            f" {report['unflushed']} unflushed"
        )
    if report["acknowledged"] != report["produced"]:
        problems.append(f"produced {report['produced']}, acknowledged {report['acknowledged']}")
    if report["producer_out_of_order_partitions"]:
        problems.append(
            "acknowledged sequences or offsets not in order on partitions "
            f"{report['producer_out_of_order_partitions']}"
        )
    for name, c in report["consumers"].items():
        if c["unacknowledged"]:
            problems.append(f"{name}: {c['unacknowledged']} records nobody acknowledged")
        if c["rewinds_within_assignment"]:
            problems.append(f"{name}: went backwards within an assignment: {c['rewind_examples']}")
        if c.get("errors", {}).get("corrupt_record"):
            problems.append(f"{name}: {c['errors']['corrupt_record']} corrupt records")
        if c["kind"] == "assign" and (c["lost"] or c["duplicated"] or c["out_of_order"]):
            problems.append(
                f"{name} (assign): lost {c['lost']}, duplicated {c['duplicated']},"
                f" out of order {c['out_of_order']}"
            )
    group = report.get("group")
    if group is not None and group["gaps"]:
        problems.append(f"group: {group['gaps']} acknowledged records never received")
    assert not problems, "; ".join(problems)


REPORTS: dict[str, dict[str, Any]] = {}
"""The fault reports recorded in this process, by fault (the run's closing table)."""


def summary_table(reports: dict[str, dict[str, Any]]) -> list[str]:
    """One line per fault: what was produced, acknowledged and received, and what was lost,
    duplicated or out of order (assigning consumers exactly once; the group at least once)."""
    head = ("fault", "produced", "acked", "assign rcvd", "lost", "dup", "disorder")
    head += ("group distinct", "group dup", "gaps")
    rows = [head]
    others = []
    for fault, r in reports.items():
        if "consumers" not in r:  # no records (the SIGTERM tests): its own line below
            facts = ", ".join(f"{k} {v}" for k, v in r.items() if k not in ("fault", "staged"))
            others.append(f"{fault}: {facts}")
            continue
        assign = [c for c in r["consumers"].values() if c["kind"] == "assign"]
        group = r.get("group") or {}
        rows.append(
            (
                fault,
                str(r["produced"]),
                str(r["acknowledged"]),
                _received(assign),
                str(sum(c["lost"] or 0 for c in assign)),
                str(sum(c["duplicated"] for c in assign)),
                str(sum(c["out_of_order"] for c in assign)),
                str(group.get("distinct", "-")),
                str(group.get("duplicates", "-")),
                str(group.get("gaps", "-")),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    table = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    return table + others


def _received(consumers: list[dict[str, Any]]) -> str:
    counts = {c["received"] for c in consumers}
    if len(counts) == 1 and len(consumers) > 1:
        return f"{len(consumers)} x {counts.pop()}"
    return "/".join(str(c["received"]) for c in consumers) or "-"
