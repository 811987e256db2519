"""``scripts/demo`` as a new user runs it: it gets ready, and Ctrl-C stops it cleanly.

Ctrl-C in a terminal sends SIGINT to the whole foreground process group; the test
starts the demo in a process group of its own and does the same.  Every port is 0
(the demo's processes pick free ones and print them), the logs go to a temporary
directory, and whatever is left at the end is killed by pid.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
READY = "Ctrl-C stops everything."
SETUP_AND_START_S = 300.0  # scripts/setup runs pip first (seconds when installed)
STOP_S = 30.0


def _group_members(pgid: int) -> list[int]:
    """Pids of the live processes in process group *pgid* (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        state, pgrp = fields[0], int(fields[2])
        if pgrp == pgid and state != "Z":
            found.append(int(entry.name))
    return found


def _read_until(proc: subprocess.Popen[bytes], marker: str, timeout: float) -> str:
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    deadline = time.monotonic() + timeout
    out = b""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while marker.encode() not in out:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"no {marker!r} within {timeout}s:\n{out.decode()[-3000:]}")
            if not sel.select(left):
                continue
            chunk = proc.stdout.read(65536)
            if chunk is None:
                continue
            if not chunk:
                raise AssertionError(
                    f"demo exited ({proc.wait()}) before {marker!r}:\n{out.decode()[-3000:]}"
                )
            out += chunk
    return out.decode(errors="replace")


def _read_rest(proc: subprocess.Popen[bytes]) -> str:
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), True)
    return proc.stdout.read().decode(errors="replace")


def test_ctrl_c_stops_the_demo_cleanly_and_keeps_its_logs(tmp_path: Path) -> None:
    logs = tmp_path / "demo-logs"
    env = {
        **os.environ,
        "DEMO_DEVBROKER_PORT": "0",
        "DEMO_PROXY_PORT": "0",
        "DEMO_BROKER_PORT_BASE": "0",
        "DEMO_METRICS_PORT": "0",
        "DEMO_LOG_DIR": str(logs),
    }
    proc = subprocess.Popen(
        [str(REPO / "scripts" / "demo")],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # its own process group, as a terminal's foreground job
    )
    pgid = proc.pid
    children: list[int] = []
    try:
        before = _read_until(proc, READY, SETUP_AND_START_S)
        children = [pid for pid in _group_members(pgid) if pid != proc.pid]
        assert len(children) >= 2, f"expected the dev cluster and the proxy, found {children}"
        os.killpg(pgid, signal.SIGINT)  # what Ctrl-C does
        status = proc.wait(STOP_S)
        after = _read_rest(proc)
    finally:
        for pid in [proc.pid, *children, *_group_members(pgid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(STOP_S)
        if proc.stdout is not None:
            proc.stdout.close()

    assert status == 0, after
    assert "setup: " in before  # scripts/setup says what it does
    assert f"demo: logs in {logs}/" in before and "kafka-fetch-proxy is running." in before
    assert f"demo: stopped; logs kept in {logs}/" in after
    for bad in ("unexpectedly", "usage", "tail:", "Traceback", "rror"):
        assert bad not in after, after
    assert _group_members(pgid) == [], "processes of the demo are still running"
    for pid in children:
        assert not Path(f"/proc/{pid}").exists(), f"child {pid} is still there"

    # the logs are kept: the proxy's JSON lines, through to its shutdown
    events = [
        json.loads(line)
        for line in (logs / "proxy.log").read_text().splitlines()
        if line.startswith("{")
    ]
    assert {"listener_bound", "upstream_discovered", "shutdown"} <= {e["event"] for e in events}
    assert (logs / "devbroker.out").read_text().startswith("bootstrap=")
