"""`kafka-fetch-proxy run` as a process: the memory budget under 50 consumers, and config reload.

The proxy is the real CLI process in front of the upstream, on both backends
(``upstream`` is parametrised over ``BACKENDS``): the dev cluster (a thread of this
process) or real Kafka (the session's single node), so its memory is its own: the peak of response data the proxy held
comes from its own accounting (the ``memory_budget_summary`` log line it writes
at exit; reservations, so an upper bound of the data held) and from its peak
RSS (``VmHWM`` in /proc) above the RSS it had with every consumer connected and
idle (so connection state is not counted as response data).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import confluent_kafka
import pytest
from support.backends import BACKENDS, upstream_for
from support.cluster import ThreadedCluster
from support.kafka import KafkaCluster

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BUDGET = 64 * 1024 * 1024
CONSUMERS = 50
PARTITIONS = 6
PER_PARTITION = 1500
VALUE = 1000
DEADLINE = 150.0
IDLE_SECONDS = 3.0


@pytest.fixture(scope="module", params=BACKENDS)
def upstream(request: pytest.FixtureRequest) -> Iterator[ThreadedCluster | KafkaCluster]:
    """What the proxy process fronts: ``.bootstrap`` and ``.create_topic(name, partitions)``."""
    cluster = upstream_for(request, request.param)
    if cluster is not None:
        yield cluster
        return
    with ThreadedCluster(nodes=3) as dev:
        yield dev


def new_topic(upstream: ThreadedCluster | KafkaCluster, prefix: str, partitions: int) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    upstream.create_topic(name, partitions)
    return name


class ProxyProcess:
    """``python -m proxy run --config FILE``; stdout and stderr lines collected by threads."""

    def __init__(self, config_file: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "run", "--config", str(config_file)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        self.stdout: queue.Queue[str] = queue.Queue()
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.all_events: list[dict[str, Any]] = []
        threading.Thread(target=self._read, args=(self.proc.stdout, False), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, True), daemon=True).start()

    def _read(self, pipe: Any, is_log: bool) -> None:
        for line in pipe:
            if not is_log:
                self.stdout.put(line.strip())
            elif line.startswith("{"):
                event = json.loads(line)
                self.all_events.append(event)
                self.events.put(event)

    def line(self, prefix: str, timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        while True:
            line = self.stdout.get(timeout=max(0.01, deadline - time.monotonic()))
            if line.startswith(prefix + "="):
                return line.split("=", 1)[1]

    def event(self, name: str, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            if event.get("event") == name:
                return event

    def memory_kib(self, field: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(f"no {field} in /proc/{self.proc.pid}/status")

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)


def write_config(path: Path, upstream: str, **extra: Any) -> None:
    lines = [
        f'upstream = ["{upstream}"]',
        'listen = "127.0.0.1:0"',
        "broker_port_base = 0",
        'log_level = "info"',
    ]
    tables = {k: v for k, v in extra.items() if isinstance(v, list)}
    lines += [f"{k} = {json.dumps(v)}" for k, v in extra.items() if k not in tables]
    for key, entries in tables.items():  # arrays of tables: [[policies]]
        for entry in entries:
            lines.append(f"[[{key}]]")
            lines += [f"{k} = {json.dumps(v)}" for k, v in entry.items()]
    tmp = path.with_suffix(".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    os.replace(tmp, path)  # atomic, as config managers write files


def consume_all(
    bootstrap: str, topic: str, partitions: int, total: int, progress: list[int], index: int
) -> None:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "queued.max.messages.kbytes": 2048,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(partitions)])
        deadline = time.monotonic() + DEADLINE
        while progress[index] < total and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                assert msg.error() is None, msg.error()
                progress[index] += 1
    finally:
        consumer.close()


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [PARTITIONS, 1])
def test_fifty_consumers_under_a_64_mib_budget(
    tmp_path: Path, upstream: ThreadedCluster | KafkaCluster, partitions: int
) -> None:
    """Six partitions each: grants of budget/16 (4 MiB), about 15 fetches at once.  One
    partition each: grants of one partition's max bytes (1 MiB), every consumer's fetch
    at once, so the budget is filled by more, smaller responses."""
    per_partition = PARTITIONS * PER_PARTITION // partitions  # the same data either way
    total = partitions * per_partition
    topic = new_topic(upstream, "bulk", partitions)
    cluster = upstream
    config_file = tmp_path / "proxy.toml"
    write_config(config_file, cluster.bootstrap, memory_budget_bytes=BUDGET)
    proxy = ProxyProcess(config_file)
    try:
        bootstrap = proxy.line("bootstrap")
        proxy.event("upstream_discovered")
        progress = [0] * CONSUMERS
        threads = [
            threading.Thread(
                target=consume_all, args=(bootstrap, topic, partitions, total, progress, i)
            )
            for i in range(CONSUMERS)
        ]
        for t in threads:
            t.start()
        # Every consumer connected and long-polling the empty topic: the memory the
        # connections themselves take (not response data) is in the baseline.
        time.sleep(IDLE_SECONDS)
        baseline_kib = proxy.memory_kib("VmRSS")
        producer = confluent_kafka.Producer(
            {"bootstrap.servers": cluster.bootstrap, "linger.ms": 20}
        )
        for i in range(per_partition):
            for p in range(partitions):
                producer.produce(topic, os.urandom(VALUE), partition=p)
            if i % 200 == 0:
                producer.poll(0)
        assert producer.flush(60) == 0
        del producer  # closes its broker connections before the cluster stops
        for t in threads:
            t.join(DEADLINE + 30)
        peak_kib = proxy.memory_kib("VmHWM")
    finally:
        assert proxy.stop() == 0
    summary = next(e for e in proxy.all_events if e["event"] == "memory_budget_summary")
    rss_growth = (peak_kib - baseline_kib) * 1024
    print(
        f"{CONSUMERS} consumers of {partitions} partitions, {type(upstream).__name__}, budget {BUDGET >> 20} MiB: accounted peak"
        f" {summary['peak_bytes'] / 2**20:.1f} MiB, overshoot {summary['overshoot_bytes']},"
        f" budget waits {summary['count']}; RSS {baseline_kib >> 10} MiB before,"
        f" peak {peak_kib >> 10} MiB (+{rss_growth / 2**20:.1f} MiB)"
    )
    assert progress == [total] * CONSUMERS  # every consumer got everything
    assert summary["limit_bytes"] == BUDGET
    assert 0 < summary["peak_bytes"] <= BUDGET and summary["overshoot_bytes"] == 0
    # A large response is read in place (never joined from pieces, so never held
    # twice), replies are written from views of the upstream frame,
    # and the allocator gives freed responses back to the system, so the RSS growth
    # is response data the budget bounds, plus some allocator slack.  Measured
    # (bench/fetch_memory.py, 2 cores): +51..59 MiB; before these changes +56..72.
    assert any(
        e["event"] == "allocator_policy" and e["reason"] == "fixed" for e in proxy.all_events
    )
    # Measured at c65378a on a quiet 2-core machine: dev cluster, 6 partitions each,
    # +63.3, +66.1, +68.2, +76.4, +76.6 and +92.2 MiB; 1 partition each +44.8..59.7;
    # Kafka 4.4 +46.7..67.4 (6) and +40.9..56.0 (1).  What is beyond the budget is
    # per-request state and allocator heap the budget does not bound (Python objects
    # of the fetches in flight, free heap not yet given back): usually about 13 MiB,
    # once 28 MiB, with 50 consumers of 6 partitions; the cause of the tail is not
    # found.  The bound asserted is the README's sizing rule (RSS = idle + budget +
    # 32 MiB); it was budget + 10 MiB until runs crossed it (CI's +83.8 at 13d9f6b).
    # With run_ahead (347c473: rounds only into spare budget): +71.1 and +68.0 MiB (dev
    # cluster, 6 and 1 partitions), +78.2 and +55.4 (Kafka 4.4); with a round for every
    # consumer whatever the budget's use, +119.0 and +122.1 (6 partitions).  Rounds up
    # to half the budget (until 2026-11-27): dev cluster, 6 partitions, +65.2..107.6 and
    # once +184.7 at e57a7e1, +70.5..99.8 later (a CI run failed at +99.8); a quarter:
    # +65.0..70.5 in 10 runs, as with no rounds (+64.3..71.2 in 8).  What a round holds
    # can be in memory twice for a while and once in the budget (FetchAdmission.room_ahead).
    assert rss_growth < BUDGET + 32 * 1024 * 1024


def test_config_reload_on_file_change_and_sighup(
    tmp_path: Path, upstream: ThreadedCluster | KafkaCluster
) -> None:
    cluster = upstream
    config_file = tmp_path / "proxy.toml"
    write_config(config_file, cluster.bootstrap, max_records=100)
    proxy = ProxyProcess(config_file)
    try:
        proxy.line("bootstrap")
        write_config(
            config_file,
            cluster.bootstrap,
            max_records=5,
            policies=[{"name": "java", "client_id": "java-*", "max_records": 1}],
        )
        event = proxy.event("config_reloaded")
        assert event["reason"] == "file"
        assert event["config_keys"] == ["max_records", "policies"]
        write_config(config_file, cluster.bootstrap, max_records=-1)
        failed = proxy.event("config_reload_failed")
        assert "max_records" in failed["error"] and "-1" in failed["error"]
        write_config(config_file, cluster.bootstrap, max_records=7, max_frame_bytes=2048)
        event = proxy.event("config_reloaded")
        assert event["config_keys"] == ["max_records", "policies"]
        assert event["restart_keys"] == ["max_frame_bytes"]
        proxy.proc.send_signal(signal.SIGHUP)
        assert proxy.event("config_reloaded")["reason"] == "SIGHUP"
    finally:
        assert proxy.stop() == 0
