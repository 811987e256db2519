"""`kafka-devbroker` (``python -m devbroker``) as a process, and kcat against the dev cluster."""

from __future__ import annotations

import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import tomllib
import uuid
from pathlib import Path
from typing import Any

import pytest
from support.cluster import ThreadedCluster

from devbroker import cli

pytestmark = pytest.mark.integration

KCAT = shutil.which("kcat")
TIMEOUT = 30


def kcat(*args: str, stdin: bytes | None = None) -> str:
    assert KCAT is not None, "kcat is installed on these machines"
    done = subprocess.run(
        [KCAT, *args], input=stdin, capture_output=True, timeout=TIMEOUT, check=True
    )
    return done.stdout.decode()


def test_kcat_metadata_lists_brokers_and_topics(dev_cluster: ThreadedCluster) -> None:
    out = kcat("-L", "-b", dev_cluster.bootstrap)
    assert " 3 brokers:" in out
    assert 'topic "orders" with 12 partitions:' in out
    for node in range(3):
        assert f"broker {node} at 127.0.0.1:" in out
    for p in range(12):
        leader = dev_cluster.leader_of("orders", p)
        assert f"partition {p}, leader {leader}, replicas: {leader}, isrs: {leader}" in out


def test_kcat_produce_and_consume(dev_cluster: ThreadedCluster) -> None:
    lines = [f"line-{i}" for i in range(20)]
    kcat(
        "-P",
        "-b",
        dev_cluster.bootstrap,
        "-t",
        "orders",
        "-p",
        "5",
        stdin="\n".join(lines).encode(),
    )
    assert dev_cluster.high_watermark("orders", 5) == 20
    out = kcat(
        "-C",
        "-b",
        dev_cluster.bootstrap,
        "-t",
        "orders",
        "-p",
        "5",
        "-o",
        "beginning",
        "-e",
        "-f",
        "%p %o %s\n",
    )
    assert out.splitlines() == [f"5 {i} line-{i}" for i in range(20)]


def test_kcat_group_consumer(dev_cluster: ThreadedCluster) -> None:
    for p in (0, 7):
        kcat("-P", "-b", dev_cluster.bootstrap, "-t", "orders", "-p", str(p), stdin=b"a\nb\nc")
    out = kcat(
        "-C",
        "-b",
        dev_cluster.bootstrap,
        "-G",
        f"kcat-{uuid.uuid4()}",
        "-o",
        "beginning",
        "-e",
        "-q",
        "-f",
        "%p %o %s\n",
        "orders",
    )
    assert sorted(out.splitlines()) == sorted(
        f"{p} {o} {v}" for p in (0, 7) for o, v in enumerate("abc")
    )


class DevbrokerProcess:
    """The CLI in a subprocess; its stdout lines are read by a thread so reads can time out."""

    def __init__(self, *args: str) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "devbroker", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            cwd=Path(__file__).resolve().parents[2],
        )
        self._lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self._lines.put(raw.decode().strip())
        self._lines.put("")

    def readline(self) -> str:
        try:
            return self._lines.get(timeout=TIMEOUT)
        except queue.Empty:
            self.proc.kill()
            pytest.fail("devbroker printed nothing in time")

    def stop(self, sig: int) -> int:
        return stop(self.proc, sig)


def stop(proc: subprocess.Popen[bytes], sig: int) -> int:
    proc.send_signal(sig)
    try:
        return proc.wait(timeout=TIMEOUT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=TIMEOUT)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_prints_bootstrap_first_and_exits_zero_on_signal(sig: Any) -> None:
    dev = DevbrokerProcess("--nodes", "3", "--port", "0", "--topic", "orders:12", "--topic", "x:3")
    try:
        first = dev.readline()
        assert first.startswith("bootstrap=127.0.0.1:"), first
        bootstrap = first.split("=", 1)[1]
        out = kcat("-L", "-b", bootstrap)
        assert 'topic "orders" with 12 partitions:' in out
        assert 'topic "x" with 3 partitions:' in out
        assert " 3 brokers:" in out
    finally:
        rc = dev.stop(sig)
    assert rc == 0


def free_port_pair() -> int:
    """A port P with P and P+1 free right now (loopback)."""
    import socket

    for _ in range(20):
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", 0))
            base = int(a.getsockname()[1])
            try:
                b.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
            return base
    pytest.fail("no two consecutive free ports")


def test_cli_nodes_listen_on_consecutive_ports() -> None:
    base = free_port_pair()
    dev = DevbrokerProcess("--nodes", "2", "--port", str(base))
    try:
        lines = [dev.readline() for _ in range(3)]
        assert lines == [
            f"bootstrap=127.0.0.1:{base}",
            f"node=0 address=127.0.0.1:{base}",
            f"node=1 address=127.0.0.1:{base + 1}",
        ]
    finally:
        assert dev.stop(signal.SIGTERM) == 0


def test_cli_rejects_a_bad_topic_spec() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "devbroker", "--topic", "orders"],
        capture_output=True,
        timeout=TIMEOUT,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 2
    assert b"NAME:PARTITIONS" in done.stderr


def test_cli_reports_a_port_in_use() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "devbroker", "--nodes", "2", "--port", str(port - 1)],
            capture_output=True,
            timeout=TIMEOUT,
            cwd=Path(__file__).resolve().parents[2],
        )
    assert done.returncode == 1
    assert done.stderr.decode().startswith("cannot listen:")
    assert done.stdout == b""


def test_devbroker_is_installed_with_its_own_command() -> None:
    """A top-level package of its own, with its own command, checked by mypy; that the
    proxy never imports it is one of the import contracts (``lint-imports``)."""
    root = Path(__file__).resolve().parents[2]
    project = tomllib.loads((root / "pyproject.toml").read_text())
    assert project["project"]["scripts"]["kafka-devbroker"] == "devbroker.__main__:run"
    assert "devbroker*" in project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert "devbroker" in project["tool"]["mypy"]["packages"]
    args = cli.build_parser().parse_args(["--nodes", "1", "--port", "0", "--topic", "t:2"])
    assert (args.nodes, args.port, args.topic) == (1, 0, [("t", 2)])
