"""The load run (``python -m bench.load``) in short: 20 consumers and 4 producers for 20 s.

The same command as the long run (RELIABILITY.md, "Load"), against the session's Kafka:
confluent-kafka, Java and kafka-python consumers and producers through one proxy process.
It checks that the harness worked (a sample every second of RSS, file descriptors and
throughput, the JSON, the plot, the summary table as the last output) and that the run had
no error and every consumer received records.  Nothing about speed is asserted; the RSS
slope is not judged in a run this short (the command says so).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.kafka import KafkaCluster

pytestmark = [pytest.mark.kafka, pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
SECONDS = 20
CONSUMERS = 20
PRODUCERS = 4
TIMEOUT = 300.0
"""Seconds the whole command may take (start-up, the run, every client closing)."""


def run_load(args: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.load", *args],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.kill(proc.pid, signal.SIGTERM)  # it stops its proxy and clients on SIGTERM
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            out, err = proc.communicate(timeout=30)
        pytest.fail(f"bench.load overran {TIMEOUT:.0f} s\n{out[-3000:]}\n{err[-3000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_short_load_run_has_no_errors_and_every_consumer_gets_data(
    kafka: KafkaCluster, tmp_path: Path
) -> None:
    out = tmp_path / "load"
    done = run_load(
        [
            "--upstream",
            kafka.bootstrap,
            "--seconds",
            str(SECONDS),
            "--consumers",
            str(CONSUMERS),
            "--producers",
            str(PRODUCERS),
            "--rate",
            "200",
            "--out",
            str(out),
        ]
    )
    result = json.loads((out / "load.json").read_text())
    summary = result["summary"]
    assert done.returncode == 0, (
        f"exit {done.returncode}: {json.dumps(summary['errors'])}\n"
        f"client errors: {summary['client_error_samples']}\n"
        f"proxy errors: {summary['proxy_error_samples']}\n{done.stdout}\n{done.stderr[-3000:]}"
    )
    assert summary["errors"] == {
        "client_errors": 0,
        "proxy_error_log_lines": 0,
        "connection_closes_not_peer_closed": 0,
        "consumers_without_data": 0,
    }

    # Every consumer of every library received records; the producers' records arrived.
    consumers = summary["consumers"]
    assert len(consumers) == CONSUMERS
    assert all(n > 0 for n in consumers.values()), consumers
    libraries = {spec["library"]: 0 for spec in result["plan"]}
    for spec in result["plan"]:
        libraries[spec["library"]] += sum(n for _, n in spec["groups"])
    assert libraries == {"confluent": 12, "java": 4, "kafka-python": 4}
    assert summary["totals"]["produced"] > 0
    assert summary["totals"]["consumed"] >= summary["totals"]["produced"]

    # A sample a second (fewer when a scrape stalls on a starved machine), each with the
    # proxy's RSS and descriptors and the throughput.
    samples = result["samples"]
    times = [s["t"] for s in samples]
    assert times == sorted(times) and times[-1] <= SECONDS
    assert SECONDS // 2 <= len(samples) <= SECONDS + 1
    assert all(s["rss_mib"] > 0 and s["fds"] > 0 for s in samples)
    assert all("consumed_mbps" in s and "produced_mbps" in s for s in samples[1:])
    assert max(s["client_connections"] for s in samples) >= CONSUMERS + PRODUCERS
    assert sum(s["consumed_rps"] for s in samples[1:]) > 0
    assert summary["rss"]["judged"] is False  # 10 s of second half: too short to judge

    # The plot, and the summary table as the command's last output.
    assert (out / "load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    lines = done.stdout.strip().splitlines()
    assert lines[-1].startswith("-----") and lines[0].startswith("-----")
    assert any(line.split() == ["result", "PASS"] for line in lines)
