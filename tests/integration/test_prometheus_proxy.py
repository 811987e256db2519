"""Real Prometheus scrapes a real ``kafka-fetch-proxy run`` process while a real client uses it.

The proxy runs exactly as the container's entrypoint does (``kafka-fetch-proxy
run`` with ``--metrics-listen``), in front of ``kafka-fetch-proxy devbroker``;
confluent-kafka produces and consumes through it; Prometheus (Debian's binary,
tests/support_prometheus.py) scrapes it every second, and the assertions go
through Prometheus's HTTP query API.

The series checked are those the relay reports today (connections, upstream
reachability, build info).  The fetch-session and shaping series (upstream vs
full-fetch bytes, trimmed records) join this test when those layers report to
proxy/observe/metrics.py from the running proxy.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support_prometheus import free_port, run_prometheus

from proxy.observe import healthcheck

pytestmark = pytest.mark.integration

P = "kafka_fetch_proxy_"
DEADLINE = 60.0
RECORDS = 200
MARKER = uuid.uuid4().hex  # in every record value


def _first_line(process: subprocess.Popen[bytes], prefix: bytes, timeout: float) -> str:
    """The value of the first stdout line starting with ``prefix``."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    buffer = b""
    fd = process.stdout.fileno()
    while time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            break
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buffer += chunk
        for line in buffer.splitlines():
            if line.startswith(prefix):
                return line[len(prefix) :].decode().strip()
    raise AssertionError(
        f"no {prefix!r} line within {timeout}s (exit {process.poll()}): {buffer!r}"
    )


@pytest.fixture
def processes() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in reversed(started):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=15)


def _spawn(
    processes: list[subprocess.Popen[bytes]], *args: str, stderr: Path
) -> subprocess.Popen[bytes]:
    with stderr.open("wb") as err:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", *args],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    processes.append(process)
    return process


def _produce_and_consume(bootstrap: str, topic: str) -> int:
    from confluent_kafka import Consumer, Producer, TopicPartition

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for i in range(RECORDS):
        producer.produce(topic, value=f"{MARKER}-{i}".encode(), partition=i % 3)
    assert producer.flush(DEADLINE) == 0
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        seen = 0
        deadline = time.monotonic() + DEADLINE
        while seen < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen += 1
        return seen
    finally:
        consumer.close()


def test_prometheus_scrapes_the_running_proxy(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]]
) -> None:
    topic = "orders"
    cluster = _spawn(
        processes,
        "devbroker",
        "--nodes",
        "3",
        "--port",
        "0",
        "--topic",
        f"{topic}:3",
        stderr=tmp_path / "devbroker.log",
    )
    upstream = _first_line(cluster, b"bootstrap=", 30)
    metrics_port = free_port()
    proxy = _spawn(
        processes,
        "run",
        "--upstream",
        upstream,
        "--listen",
        "127.0.0.1:0",
        "--broker-port-base",
        "0",
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
        stderr=tmp_path / "proxy.log",
    )
    bootstrap = _first_line(proxy, b"bootstrap=", 30)

    with run_prometheus([f"127.0.0.1:{metrics_port}"], tmp_path / "prom") as prom:
        prom.wait_for_scrape()
        assert prom.value(f'{P}build_info{{job="kafka-fetch-proxy"}}') == 1
        assert prom.wait_until(f"{P}upstream_brokers_reachable", lambda v: v >= 1) >= 1
        address = f"127.0.0.1:{metrics_port}"
        assert healthcheck.main(["--address", address, "--path", "/readyz"], {}) == 0

        assert _produce_and_consume(bootstrap, topic) == RECORDS

        accepted = prom.wait_until(f"{P}client_connections_accepted_total", lambda v: v >= 2)
        assert accepted >= 2  # the producer's and the consumer's connections at least
        closed = f"sum({P}client_connections_closed_total)"
        assert prom.wait_until(closed, lambda v: v >= 1) >= 1  # the consumer closed
        assert prom.value(f"{P}client_connections_open") is not None

    proxy.send_signal(signal.SIGTERM)
    assert proxy.wait(timeout=15) == 0
    log = (tmp_path / "proxy.log").read_text(errors="replace")
    assert MARKER not in log  # record payloads are never logged
