"""One client process of the load run (``bench/load.py`` starts these; not run by hand).

    python -m bench.load_worker confluent --bootstrap HOST:PORT --topic T --client-id P \\
        --group NAME:COUNT [--group ...] --producers N --rate R --record-bytes B --seconds S

``confluent`` (librdkafka through confluent-kafka) or ``kafka-python``: every consumer and
every producer is a thread with its own client.  Consumers subscribe in their group (classic
protocol, auto commit, earliest); producers send ``rate`` records a second between them
(acks=all), each record's timestamp being its send time, so a consumer measures end-to-end
latency as its clock minus the record's timestamp.

Output, JSON lines on stdout, the protocol ``tests/clients/java/LoadConsumer.java`` speaks
too: every ``--report-ms`` a cumulative ``{"op": "stats", "records", "bytes", "produced",
"produced_bytes", "errors", "warnings", "latency": [...]}``, and at the end ``{"op":
"final", "consumers": {id: records}, "producers": {id: records}, "errors", "warnings",
"error_samples"}``.  An error is anything a client reports as one: an exception, a consumed
message carrying an error, a failed delivery, librdkafka's error callback, an ERROR log
record of the client library; WARNING log records are counted apart.  The process stops by
itself at the deadline, or earlier when stdin closes.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

# kafka-python 3.0.x leaves a group leader with no partitions when poll()'s timeout runs
# out during a rejoin (README); with 200 ms, about one short load run in ten had a
# consumer that fetched nothing.  poll returns as soon as records arrive.
from support.kafka_python import GROUP_POLL_MS

REPORT_MS = 500
MAX_ERROR_SAMPLES = 20
TICK = 0.05
"""Producers send what is due every TICK seconds."""


@dataclass
class Counts:
    """One client's counters; only its own thread writes them, the reporter sums them."""

    records: int = 0
    bytes: int = 0
    latency: list[int] = field(default_factory=list)


class Errors(logging.Handler):
    """Counts errors and warnings from every source, keeps the first few messages."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.errors = 0
        self.warnings = 0
        self.samples: list[str] = []
        self.warning_samples: list[str] = []
        self._lock = threading.Lock()

    def error(self, where: str, what: object) -> None:
        with self._lock:
            self.errors += 1
            if len(self.samples) < MAX_ERROR_SAMPLES:
                self.samples.append(f"{where}: {what}")

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.ERROR:
            exc = record.exc_info[1] if record.exc_info else None
            detail = f" ({exc!r})" if exc is not None else ""
            self.error(f"log {record.name}", record.getMessage() + detail)
        else:
            with self._lock:
                self.warnings += 1
                if len(self.warning_samples) < MAX_ERROR_SAMPLES:
                    self.warning_samples.append(f"log {record.name}: {record.getMessage()}")


class Worker:
    def __init__(self, opts: argparse.Namespace) -> None:
        self.opts = opts
        self.edges: list[int] = [int(x) for x in opts.latency_edges_ms.split(",")]
        self.stop = threading.Event()
        self.deadline = time.monotonic() + opts.seconds
        self.errors = Errors()
        self.consumers: dict[str, Counts] = {}
        self.producers: dict[str, Counts] = {}
        self.lock = threading.Lock()

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline

    def consumed(self, counts: Counts, size: int, timestamp_ms: int) -> None:
        counts.records += 1
        counts.bytes += size
        age = int(time.time() * 1000) - timestamp_ms
        counts.latency[bisect.bisect_left(self.edges, age)] += 1

    def new_counts(self, table: dict[str, Counts], client_id: str) -> Counts:
        counts = Counts(latency=[0] * (len(self.edges) + 1))
        with self.lock:
            table[client_id] = counts
        return counts

    def report(self, op: str = "stats") -> None:
        with self.lock:
            consumers = list(self.consumers.values())
            producers = list(self.producers.values())
        latency = [0] * (len(self.edges) + 1)
        for c in consumers:
            for i, n in enumerate(c.latency):
                latency[i] += n
        line = {
            "op": op,
            "records": sum(c.records for c in consumers),
            "bytes": sum(c.bytes for c in consumers),
            "produced": sum(p.records for p in producers),
            "produced_bytes": sum(p.bytes for p in producers),
            "errors": self.errors.errors,
            "warnings": self.errors.warnings,
            "latency": latency,
        }
        print(json.dumps(line), flush=True)

    def final(self) -> None:
        self.report()
        with self.lock:
            line = {
                "op": "final",
                "consumers": {k: c.records for k, c in self.consumers.items()},
                "producers": {k: p.records for k, p in self.producers.items()},
                "errors": self.errors.errors,
                "warnings": self.errors.warnings,
                "error_samples": list(self.errors.samples),
                "warning_samples": list(self.errors.warning_samples),
            }
        print(json.dumps(line), flush=True)

    def pace(self, send: Callable[[int], None], rate: float) -> None:
        """Call ``send(i)`` for i = 0, 1, ... at ``rate`` a second until the run ends."""
        started = time.monotonic()
        sent = 0
        while self.running():
            due = int((time.monotonic() - started) * rate)
            while sent < due and self.running():
                send(sent)
                sent += 1
            time.sleep(TICK)


# -- confluent-kafka ------------------------------------------------------------------------


def confluent_consumer(w: Worker, client_id: str, group: str) -> None:
    import confluent_kafka

    counts = w.new_counts(w.consumers, client_id)
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": w.opts.bootstrap,
            "client.id": client_id,
            "group.id": group,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": True,
            "queued.max.messages.kbytes": 4096,
            "error_cb": lambda err: w.errors.error(client_id, err),
            "logger": logging.getLogger(f"librdkafka.{client_id}"),
        }
    )
    try:
        consumer.subscribe([w.opts.topic])
        while w.running():
            for msg in consumer.consume(500, 0.2):
                err = msg.error()
                if err is not None:
                    w.errors.error(client_id, err)
                    continue
                size = len(msg.key() or b"") + len(msg.value() or b"")
                w.consumed(counts, size, msg.timestamp()[1])
    except Exception as exc:
        w.errors.error(client_id, repr(exc))
    finally:
        try:
            consumer.close()
        except Exception as exc:
            w.errors.error(client_id, f"close: {exc!r}")


def confluent_producer(w: Worker, client_id: str, rate: float) -> None:
    import confluent_kafka

    counts = w.new_counts(w.producers, client_id)
    producer = confluent_kafka.Producer(
        {
            "bootstrap.servers": w.opts.bootstrap,
            "client.id": client_id,
            "acks": "all",
            "linger.ms": 5,
            "error_cb": lambda err: w.errors.error(client_id, err),
            "logger": logging.getLogger(f"librdkafka.{client_id}"),
        }
    )
    values = [os.urandom(w.opts.record_bytes) for _ in range(16)]

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            w.errors.error(client_id, f"delivery: {err}")
        else:
            counts.records += 1
            counts.bytes += len(msg.key() or b"") + len(msg.value() or b"")

    def send(i: int) -> None:
        key = f"{client_id}-{i}".encode()
        while True:
            try:
                producer.produce(w.opts.topic, values[i % 16], key, on_delivery=delivered)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                producer.poll(0.1)
        producer.poll(0)

    try:
        w.pace(send, rate)
        left = producer.flush(30)
        if left:
            w.errors.error(client_id, f"{left} records undelivered after flush")
    except Exception as exc:
        w.errors.error(client_id, repr(exc))


# -- kafka-python ---------------------------------------------------------------------------


def kafka_python_consumer(w: Worker, client_id: str, group: str) -> None:
    from kafka import KafkaConsumer

    counts = w.new_counts(w.consumers, client_id)
    consumer = None
    try:
        consumer = KafkaConsumer(
            w.opts.topic,
            bootstrap_servers=w.opts.bootstrap,
            client_id=client_id,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=True,
        )
        while w.running():
            for records in consumer.poll(timeout_ms=GROUP_POLL_MS).values():
                for r in records:
                    size = max(r.serialized_key_size, 0) + max(r.serialized_value_size, 0)
                    w.consumed(counts, size, r.timestamp)
    except Exception as exc:
        w.errors.error(client_id, repr(exc))
    finally:
        if consumer is not None:
            try:
                consumer.close()
            except Exception as exc:
                w.errors.error(client_id, f"close: {exc!r}")


def kafka_python_producer(w: Worker, client_id: str, rate: float) -> None:
    from kafka import KafkaProducer

    counts = w.new_counts(w.producers, client_id)
    values = [os.urandom(w.opts.record_bytes) for _ in range(16)]
    producer = None

    def delivered(md: Any) -> None:
        counts.records += 1
        counts.bytes += max(md.serialized_key_size, 0) + max(md.serialized_value_size, 0)

    def send(i: int) -> None:
        assert producer is not None
        future = producer.send(w.opts.topic, values[i % 16], f"{client_id}-{i}".encode())
        future.add_callback(delivered)
        future.add_errback(lambda exc: w.errors.error(client_id, f"delivery: {exc!r}"))

    try:
        producer = KafkaProducer(
            bootstrap_servers=w.opts.bootstrap, client_id=client_id, acks="all", linger_ms=5
        )
        w.pace(send, rate)
        producer.flush(30)
    except Exception as exc:
        w.errors.error(client_id, repr(exc))
    finally:
        if producer is not None:
            try:
                producer.close(30)
            except Exception as exc:
                w.errors.error(client_id, f"close: {exc!r}")


LIBRARIES = {
    "confluent": (confluent_consumer, confluent_producer),
    "kafka-python": (kafka_python_consumer, kafka_python_producer),
}


def watch_stdin(stop: threading.Event) -> None:
    """End-of-file on stdin (the parent closed it, or died) stops the run."""
    while sys.stdin.buffer.read1(256):
        pass
    stop.set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("library", choices=sorted(LIBRARIES))
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--client-id", required=True)
    parser.add_argument("--group", action="append", default=[], help="NAME:COUNT consumers")
    parser.add_argument("--producers", type=int, default=0)
    parser.add_argument("--rate", type=float, default=0.0, help="records/s, all producers")
    parser.add_argument("--record-bytes", type=int, default=1000)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--report-ms", type=int, default=REPORT_MS)
    parser.add_argument("--latency-edges-ms", required=True)
    opts = parser.parse_args(argv)

    w = Worker(opts)
    for name in ("kafka", "librdkafka"):
        logging.getLogger(name).addHandler(w.errors)
        logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger(name).propagate = False
    consume, produce = LIBRARIES[opts.library]
    threads: list[threading.Thread] = []
    n = 0
    for spec in opts.group:
        group, _, count = spec.rpartition(":")
        for _ in range(int(count)):
            client_id = f"{opts.client_id}-c{n}"
            threads.append(threading.Thread(target=consume, args=(w, client_id, group)))
            n += 1
    for i in range(opts.producers):
        client_id = f"{opts.client_id}-p{i}"
        rate = opts.rate / opts.producers
        threads.append(threading.Thread(target=produce, args=(w, client_id, rate)))
    threading.Thread(target=watch_stdin, args=(w.stop,), daemon=True).start()
    for t in threads:
        t.start()
    while w.running():
        w.stop.wait(opts.report_ms / 1000)
        w.report()
    for t in threads:
        t.join(60)
    alive = [t.name for t in threads if t.is_alive()]
    if alive:
        w.errors.error("worker", f"{len(alive)} client threads did not stop within 60 s")
    w.final()
    sys.stdout.flush()
    os._exit(0)  # client threads that did not stop must not keep the process alive


if __name__ == "__main__":
    sys.exit(main())
