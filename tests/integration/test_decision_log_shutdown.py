"""A clean SIGTERM loses no decision-log event.

The decision log is written by a thread of its own (``proxy.observe.linewriter``); at
exit ``kafka-fetch-proxy run`` closes it after the last connection, and closing writes
everything queued before the file is closed.  The proxy says what it did in
``decision_log_closed``: events queued over the run, written, dropped.
"""

from __future__ import annotations

import json
import signal
import subprocess
from pathlib import Path

import pytest
from support.procs import devbroker, proxy

pytestmark = pytest.mark.integration

RECORDS = 5


def kcat(*args: str, stdin: bytes | None = None) -> str:
    done = subprocess.run(["kcat", *args], input=stdin, capture_output=True, timeout=60, check=True)
    return done.stdout.decode()


def test_a_clean_sigterm_writes_every_queued_decision(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    with (
        devbroker("demo:1", nodes=1) as upstream,
        proxy(upstream, "--decision-log", str(path), "--max-records", "1") as p,
    ):
        bootstrap = p.lines["bootstrap"]
        values = b"".join(b"r%d\n" % n for n in range(RECORDS))
        kcat("-b", bootstrap, "-P", "-t", "demo", "-p", "0", stdin=values)
        # every Fetch response the proxy shaped (max_records = 1 trims them) is a decision
        out = kcat("-b", bootstrap, "-C", "-t", "demo", "-p", "0", "-o", "beginning", "-e")
        assert len(out.splitlines()) == RECORDS
        p.proc.send_signal(signal.SIGTERM)
        assert p.proc.wait(30) == 0
        logs = p.stderr()
    events = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    (closed,) = [e for e in events if e["event"] == "decision_log_closed"]
    lines = path.read_text().splitlines()
    assert closed["count"] >= 1, closed
    assert closed["written"] == closed["count"] == len(lines), closed
    assert closed["dropped"] == 0
    assert all(json.loads(line)["event"] == "fetch_shaped" for line in lines)
