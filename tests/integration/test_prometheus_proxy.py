"""Real Prometheus scrapes a real ``kafka-fetch-proxy run`` process while a real client uses it.

The proxy runs exactly as the container's entrypoint does (``kafka-fetch-proxy
run`` with ``--metrics-listen``), with a record limit, the decision log and
/debug/sessions on, in front of ``kafka-devbroker`` or of real Kafka
(``upstream`` is parametrised over ``BACKENDS``); confluent-kafka
produces and consumes through it; Prometheus (Debian's binary,
tests/support/prometheus.py) scrapes it every second, and the assertions go
through Prometheus's HTTP query API:

- connections, upstream reachability, build info;
- requests and responses by API on all four legs, with latency histograms;
- the upstream Fetch bytes (requests to and responses from brokers) are fewer
  than what the client's own full fetches cost (requests from and responses to
  the client): librdkafka fetches without sessions, the proxy upstream with one;
- records trimmed by the limit, records upstream vs delivered;
- an upstream fetch session was active, and /debug/sessions showed it;
- the decision log's events validate against their JSON Schema.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import pytest
from support.backends import BACKENDS, upstream_for
from support.loopback import free_port
from support.procs import devbroker
from support.prometheus import PrometheusServer, run_prometheus

from proxy.observe import healthcheck

pytestmark = pytest.mark.integration

P = "kafka_fetch_proxy_"
DEADLINE = 60.0
RECORDS = 200
MARKER = uuid.uuid4().hex  # in every record value
PARTITIONS = 3
BATCH = 5  # records per produced batch: the limit below holds whole batches back
MAX_PARTITION_RECORDS = 10
IDLE_SECONDS = 3.0  # idle fetch rounds after the last record, where sessions save most
INSTANCE = "prom-test-proxy"
ROOT = Path(__file__).resolve().parents[2]


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


@pytest.fixture(params=BACKENDS)
def upstream(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(bootstrap, topic): a ``kafka-devbroker`` process, or real Kafka."""
    topic = f"orders-{uuid.uuid4().hex[:10]}"
    cluster = upstream_for(request, request.param)
    if cluster is not None:
        cluster.create_topic(topic, PARTITIONS)
        yield cluster.bootstrap, topic
        return
    with devbroker(f"{topic}:{PARTITIONS}", nodes=3) as bootstrap:
        yield bootstrap, topic


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


def _produce(bootstrap: str, topic: str) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1000})
    for i in range(RECORDS):
        producer.produce(topic, value=f"{MARKER}-{i}".encode(), partition=i % PARTITIONS)
        if (i + 1) % (BATCH * PARTITIONS) == 0:
            assert producer.flush(DEADLINE) == 0  # one small batch per partition
    assert producer.flush(DEADLINE) == 0


def _consume(bootstrap: str, topic: str, debug_url: str) -> tuple[int, dict[str, object]]:
    """Consume everything, idle a while, and read /debug/sessions while the consumer is live."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "client.id": "prom-test-consumer",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen = 0
        deadline = time.monotonic() + DEADLINE
        while seen < RECORDS and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                assert message.value().decode().startswith(MARKER)
                seen += 1
        idle_until = time.monotonic() + IDLE_SECONDS
        while time.monotonic() < idle_until:
            message = consumer.poll(0.2)
            assert message is None or message.error() is not None, "a record twice"
        with urllib.request.urlopen(debug_url, timeout=10) as response:
            sessions = json.loads(response.read())
        return seen, sessions
    finally:
        consumer.close()


def _consume_with_sessions(
    bootstrap: str, topic: str, prom: PrometheusServer, debug_url: str
) -> int:
    """kafka-python opens a fetch session with the proxy: the downstream side's gauges."""
    import kafka

    consumer = kafka.KafkaConsumer(
        bootstrap_servers=bootstrap,
        client_id="prom-test-session-consumer",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        consumer.assign([kafka.TopicPartition(topic, p) for p in range(PARTITIONS)])
        consumer.seek_to_beginning()
        seen = 0
        deadline = time.monotonic() + DEADLINE
        while seen < RECORDS and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                seen += len(records)
        # while it keeps fetching in its session, a scrape sees the session
        done = threading.Event()

        def keep_fetching() -> None:
            while not done.is_set():
                consumer.poll(timeout_ms=100)

        fetcher = threading.Thread(target=keep_fetching)
        fetcher.start()
        try:
            prom.wait_until(f'{P}fetch_sessions_active{{side="downstream"}}', lambda v: v >= 1)
            prom.wait_until(
                f'{P}fetch_session_partitions_cached{{side="downstream"}}',
                lambda v: v >= PARTITIONS,
            )
            with urllib.request.urlopen(debug_url, timeout=10) as response:
                downstream = json.loads(response.read())["downstream"]
            # one session per broker the client fetches from, covering every partition
            assert downstream["total"] >= 1, downstream
            assert downstream["partitions_cached"] == PARTITIONS, downstream
            assert all(s["session_id"] != 0 and s["epoch"] >= 1 for s in downstream["sessions"])
        finally:
            done.set()
            fetcher.join(timeout=DEADLINE)
        return seen
    finally:
        consumer.close()


def _sum(prom: PrometheusServer, expr: str) -> float:
    value = prom.value(f"sum({expr})")
    return 0.0 if value is None else float(value)


def test_prometheus_scrapes_the_running_proxy(
    tmp_path: Path, processes: list[subprocess.Popen[bytes]], upstream: tuple[str, str]
) -> None:
    bootstrap_upstream, topic = upstream
    metrics_port = free_port()
    decision_log = tmp_path / "decisions.jsonl"
    proxy = _spawn(
        processes,
        "run",
        "--upstream",
        bootstrap_upstream,
        "--listen",
        "127.0.0.1:0",
        "--broker-port-base",
        "0",
        "--metrics-listen",
        f"127.0.0.1:{metrics_port}",
        "--max-partition-records",
        str(MAX_PARTITION_RECORDS),
        "--decision-log",
        str(decision_log),
        "--instance",
        INSTANCE,
        "--debug-sessions",
        stderr=tmp_path / "proxy.log",
    )
    bootstrap = _first_line(proxy, b"bootstrap=", 30)
    address = f"127.0.0.1:{metrics_port}"

    with run_prometheus([address], tmp_path / "prom") as prom:
        prom.wait_for_scrape()
        assert prom.value(f'{P}build_info{{job="kafka-fetch-proxy"}}') == 1
        assert prom.wait_until(f"{P}upstream_brokers_reachable", lambda v: v >= 1) >= 1
        assert healthcheck.main(["--address", address, "--path", "/readyz"], {}) == 0

        _produce(bootstrap, topic)
        seen, sessions = _consume(bootstrap, topic, f"http://{address}/debug/sessions")
        assert seen == RECORDS

        # /debug/sessions showed the consumer's upstream session(s) while it was live
        rows = sessions["sessions"]
        assert isinstance(rows, list) and rows, sessions
        assert {row["client_id"] for row in rows} == {"prom-test-consumer"}  # only one yet
        assert all(row["session_id"] != 0 and row["epoch"] >= 1 for row in rows), rows
        assert sum(row["partitions"] for row in rows) == PARTITIONS

        # connections
        accepted = prom.wait_until(f"{P}client_connections_accepted_total", lambda v: v >= 2)
        assert accepted >= 2  # the producer's and the consumer's connections at least
        closed = f"sum({P}client_connections_closed_total)"
        assert prom.wait_until(closed, lambda v: v >= 1) >= 1  # the consumer closed
        assert prom.value(f"{P}client_connections_open") is not None

        # every leg, by API, with latencies (waiting for the scrape after the consumer left)
        fetch = '{api="fetch"}'
        answered = prom.wait_until(
            f"sum({P}proxy_to_client_responses_total{fetch})", lambda v: v >= 10
        )
        assert _sum(prom, f"{P}client_to_proxy_requests_total{fetch}") >= answered
        assert _sum(prom, f"{P}broker_to_proxy_responses_total{fetch}") >= 1
        assert _sum(prom, f"{P}proxy_to_broker_requests_total{fetch}") >= 1
        for api in ("produce", "metadata", "api_versions"):
            selector = f'{{api="{api}"}}'
            assert _sum(prom, f"{P}proxy_to_client_responses_total{selector}") >= 1, api
            assert _sum(prom, f"{P}broker_to_proxy_responses_total{selector}") >= 1, api
        assert _sum(prom, f"{P}client_request_duration_seconds_count{fetch}") >= answered
        assert _sum(prom, f"{P}broker_request_duration_seconds_count{fetch}") >= 1
        p99 = prom.value(
            f"histogram_quantile(0.99, sum by (le) ({P}client_request_duration_seconds_bucket{fetch}))"
        )
        assert p99 is not None and 0 < p99 <= 30  # fetches long-poll up to max_wait
        assert _sum(prom, f"{P}broker_to_proxy_bytes_total") > 0
        assert _sum(prom, f"{P}proxy_to_broker_bytes_total") > 0

        # upstream Fetch bytes < what the client's sessionless full fetches cost (as of a
        # scrape after every client connection closed)
        prom.wait_until(f"{P}client_connections_open", lambda v: v == 0)
        upstream = _sum(prom, f"{P}proxy_to_broker_request_size_bytes_sum{fetch}") + _sum(
            prom, f"{P}broker_to_proxy_response_size_bytes_sum{fetch}"
        )
        downstream = _sum(prom, f"{P}client_to_proxy_request_size_bytes_sum{fetch}") + _sum(
            prom, f"{P}proxy_to_client_response_size_bytes_sum{fetch}"
        )
        print(f"fetch bytes: upstream {upstream:.0f}, client-side full fetches {downstream:.0f}")
        assert 0 < upstream < downstream
        assert _sum(prom, f"{P}incremental_fetch_saved_bytes_total") > 0
        assert prom.wait_until(
            f'max_over_time({P}fetch_sessions_active{{side="upstream"}}[5m])', lambda v: v >= 1
        )

        # a client that opens fetch sessions with the proxy (the downstream side)
        debug_url = f"http://{address}/debug/sessions"
        assert _consume_with_sessions(bootstrap, topic, prom, debug_url) == RECORDS

        # records from the broker and to the client, counted from batch headers
        assert _sum(prom, f"{P}broker_to_proxy_fetch_records_total") >= RECORDS
        assert _sum(prom, f"{P}proxy_to_client_fetch_records_total") >= RECORDS
        assert _sum(prom, f"{P}proxy_to_client_fetch_record_bytes_total") > 0
        assert _sum(prom, f"{P}broker_to_proxy_fetch_record_bytes_total") > 0

        # the limit trimmed records; every record still arrived (above), once
        trimmed = f'{P}trimmed_records_total{{limit="max_partition_records"}}'
        assert _sum(prom, trimmed) > 0
        assert _sum(prom, f'{P}limit_applied_total{{limit="max_partition_records"}}') >= 1
        assert _sum(prom, f"{P}shaped_responses_total") >= 1

        # decision-log events were written (counted, and in the file)
        written = _sum(prom, f'{P}decision_log_events_total{{outcome="written"}}')
        assert written >= 1

    proxy.send_signal(signal.SIGTERM)
    assert proxy.wait(timeout=15) == 0
    log = (tmp_path / "proxy.log").read_text(errors="replace")
    assert MARKER not in log  # record payloads are never logged

    schema = json.loads((ROOT / "schemas" / "decision-log.schema.json").read_text())
    validator = jsonschema.Draft202012Validator(
        schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
    )
    lines = decision_log.read_text().splitlines()
    assert len(lines) >= written  # the file was flushed and closed at exit
    events = [json.loads(line) for line in lines]
    for event in events:
        errors = [e.message for e in validator.iter_errors(event)]
        assert not errors, (errors, event)
    assert MARKER not in decision_log.read_text()
    assert {e["instance"] for e in events} == {INSTANCE}
    assert {e["client_id"] for e in events} <= {"prom-test-consumer", "prom-test-session-consumer"}
    limited = [e for e in events if "max_partition_records" in e["limits_applied"]]
    assert limited, events[:3]
    assert all(e["limits"]["max_partition_records"] == MAX_PARTITION_RECORDS for e in events)
    # librdkafka fetches without sessions: each event estimates what the upstream exchange
    # would have cost without one, and the proxy's session saved bytes overall
    sessionless = [e for e in events if e["client_id"] == "prom-test-consumer"]
    assert sessionless
    estimated = sum(e["sessionless_fetch_bytes"] for e in sessionless)
    actual = sum(e["upstream_fetch_bytes"] for e in sessionless)
    print(f"decision log: upstream {actual} bytes, sessionless estimate {estimated}")
    assert 0 < actual < estimated
    for e in events:  # the limit held, except for KIP-74's one-batch progress exemption
        cap = MAX_PARTITION_RECORDS * e["partitions_served"]
        assert e["delivered_records"] <= cap or e["progress_exemption"], e
