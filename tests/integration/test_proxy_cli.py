"""`kafka-fetch-proxy run` as a process in front of `kafka-devbroker`: the README demo."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
from support.loopback import API_VERSIONS
from support.procs import devbroker, proxy

from proxy.protocol.framing import encode_frame

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


async def first_lines(proc: trio.Process, prefixes: tuple[str, ...]) -> dict[str, str]:
    """Read stdout until a line starting with each prefix has appeared."""
    assert proc.stdout is not None
    buf = b""
    found: dict[str, str] = {}
    while len(found) < len(prefixes):
        chunk = await proc.stdout.receive_some(4096)
        assert chunk, f"process ended before printing {prefixes}"
        buf += chunk
        for line in buf.decode().splitlines():
            for p in prefixes:
                if line.startswith(p + "="):
                    found[p] = line.split("=", 1)[1]
    return found


async def kcat(*args: str, stdin: bytes | None = None) -> str:
    done = await trio.run_process(
        ["kcat", *args], stdin=stdin, capture_stdout=True, capture_stderr=True, check=False
    )
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    return done.stdout.decode()


def http_get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


async def test_run_in_front_of_devbroker() -> None:
    cli = [sys.executable, "-m", "proxy"]
    with trio.fail_after(60):
        dev = await trio.lowlevel.open_process(
            [sys.executable, "-m", "devbroker", "--nodes", "3", "--port", "0", "--topic", "demo:3"],
            stdout=subprocess.PIPE,
            cwd=REPO,
        )
        try:
            upstream = (await first_lines(dev, ("bootstrap",)))["bootstrap"]
            proxy = await trio.lowlevel.open_process(
                [*cli, "run", "--upstream", upstream, "--listen", "127.0.0.1:0",
                 "--broker-port-base", "0", "--metrics-listen", "127.0.0.1:0"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=REPO,
            )  # fmt: skip
            try:
                lines = await first_lines(proxy, ("bootstrap", "metrics"))
                bootstrap = lines["bootstrap"]
                listing = await kcat("-b", bootstrap, "-L", "-m", "30", "-t", "demo")
                assert " 3 brokers:" in listing and upstream not in listing
                await kcat("-b", bootstrap, "-P", "-t", "demo", "-p", "2", stdin=b"hello\nworld\n")
                out = await kcat("-b", bootstrap, "-C", "-t", "demo", "-p", "2", "-e", "-f", "%s\n")
                assert out.splitlines() == ["hello", "world"]
                base = lines["metrics"].removesuffix("/metrics")
                status, body = await trio.to_thread.run_sync(http_get, base + "/readyz")
                assert status == 200 and json.loads(body)["ready"] is True
                status, body = await trio.to_thread.run_sync(http_get, lines["metrics"])
                assert (
                    status == 200 and b"kafka_fetch_proxy_client_connections_accepted_total" in body
                )
            finally:
                proxy.send_signal(signal.SIGTERM)
                assert await proxy.wait() == 0
            assert proxy.stderr is not None
            logs = b""
            while chunk := await proxy.stderr.receive_some(65536):
                logs += chunk
            events = [
                json.loads(line) for line in logs.decode().splitlines() if line.startswith("{")
            ]
            assert {"listener_bound", "upstream_discovered", "shutdown"} <= {
                e["event"] for e in events
            }
            assert all("hello" not in json.dumps(e) for e in events)  # never a payload
            # The default budget (128 MiB): long polls reserve at most budget/16 each, and the
            # reserved peak stays within the budget.
            summary = next(e for e in events if e["event"] == "memory_budget_summary")
            assert summary["limit_bytes"] == 128 * 1024 * 1024
            assert 0 < summary["peak_bytes"] <= summary["limit_bytes"]
            assert summary["overshoot_bytes"] == 0
        finally:
            dev.send_signal(signal.SIGTERM)
            await dev.wait()


def run_cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        stdin=subprocess.DEVNULL,
    )


@contextmanager
def taken_port() -> Iterator[int]:
    """A loopback port another socket listens on for the duration of the block."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        yield taken.getsockname()[1]


@contextmanager
def refusing_port() -> Iterator[int]:
    """A loopback port bound but not listening: connecting to it is refused."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        yield closed.getsockname()[1]


def assert_listen_failure(
    done: subprocess.CompletedProcess[str], address: str, setting: str
) -> None:
    assert done.returncode == 2, done.stderr
    message = [line for line in done.stderr.splitlines() if line.startswith("kafka-fetch-proxy:")]
    assert len(message) == 1, done.stderr
    text = message[0]
    assert f"cannot listen on {address} " in text and f"(setting {setting}" in text, text
    assert "already in use" in text and "ss -ltnp" in text, text
    assert "Traceback" not in done.stderr
    failed = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    startup = next(e for e in failed if e["event"] == "startup_failed")
    assert startup["setting"] == setting and startup["address"] == address, startup


def test_run_names_the_listen_setting_when_its_port_is_taken() -> None:
    with refusing_port() as upstream, taken_port() as port:
        done = run_cli(
            "run", "--upstream", f"127.0.0.1:{upstream}", "--listen", f"127.0.0.1:{port}"
        )
    assert_listen_failure(done, f"127.0.0.1:{port}", "listen")
    assert "--listen / KAFKA_FETCH_PROXY_LISTEN" in done.stderr
    assert "bootstrap=" not in done.stdout


def test_run_names_the_metrics_listen_setting_when_its_port_is_taken() -> None:
    with refusing_port() as upstream, taken_port() as port:
        done = run_cli(
            "run", "--upstream", f"127.0.0.1:{upstream}", "--listen", "127.0.0.1:0",
            "--metrics-listen", f"127.0.0.1:{port}",
        )  # fmt: skip
    assert_listen_failure(done, f"127.0.0.1:{port}", "metrics_listen")
    assert "--metrics-listen" in done.stderr
    assert "bootstrap=" not in done.stdout  # nothing announced before every listener is bound


@pytest.mark.parametrize("setting", ["broker_port_base", "broker_ports"])
def test_run_names_the_broker_listener_setting_and_node_when_its_port_is_taken(
    setting: str,
) -> None:
    with devbroker("t:1", nodes=1) as upstream, taken_port() as port:
        broker = ["--broker-port-base", str(port)]  # node 0's port: base + 0
        if setting == "broker_ports":
            broker = ["--broker-ports", f"0={port}"]
        done = run_cli("run", "--upstream", upstream, "--listen", "127.0.0.1:0", *broker)
    assert_listen_failure(done, f"127.0.0.1:{port}", setting)
    assert "broker node 0's listener" in done.stderr


def test_upstream_unreachable_is_logged_with_address_error_and_what_clients_see() -> None:
    """The README's Troubleshooting section quotes these lines and /readyz's answer."""
    with refusing_port() as upstream_port:
        upstream = f"127.0.0.1:{upstream_port}"
        with proxy(upstream, "--retry-backoff-max-seconds", "0.2") as p:
            base = p.lines["metrics"].removesuffix("/metrics")
            status, body = http_get(base + "/readyz")
            assert status == 503
            assert json.loads(body) == {
                "ready": False,
                "checks": {
                    "bootstrap_listener_bound": True,
                    "broker_listeners_bound": True,
                    "upstream_reachable": False,
                },
            }
            host, port = p.lines["bootstrap"].rsplit(":", 1)
            with socket.create_connection((host, int(port)), timeout=30) as client:
                # the broker connection opens with the client's first request
                client.sendall(encode_frame(API_VERSIONS))
                assert client.recv(1) == b""  # closed by the proxy: nothing to relay to
            deadline = time.monotonic() + 30
            while "connection_closed" not in p.stderr():
                assert time.monotonic() < deadline, p.stderr()
                time.sleep(0.05)
            logs = p.stderr()
    events = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    down = next(e for e in events if e["event"] == "upstream_unreachable")
    assert down["level"] == "warning" and down["upstream"] == upstream
    assert down["error"].startswith("ConnectionRefusedError: "), down
    assert "client connections are closed" in down["hint"] and "/readyz" in down["hint"]
    closed = next(e for e in events if e["event"] == "connection_closed")
    assert closed["reason"] == "upstream_unreachable"
    assert "Disconnected while requesting ApiVersion" in closed["hint"]
    failed = next(e for e in events if e["event"] == "upstream_connect_failed")
    assert failed["upstream"] == upstream and "ConnectionRefusedError" in failed["error"]


def test_the_startup_log_shows_the_rack_and_which_brokers_share_it(tmp_path: Path) -> None:
    """The rack from rack_file at start (rack_configured), then, once discovery has the
    brokers' Metadata, which of them share it (rack_brokers): the dev cluster's brokers
    announce no rack, so a proxy with one is warned that none shares it."""
    rack = tmp_path / "rack"
    rack.write_text("us-east-1b\n")
    with devbroker("demo:1") as upstream, proxy(upstream, "--rack-file", str(rack)) as p:
        deadline = time.monotonic() + 30
        while '"rack_brokers"' not in p.stderr():
            assert time.monotonic() < deadline, p.stderr()
            time.sleep(0.05)
        logs = p.stderr()
    events = [json.loads(line) for line in logs.splitlines() if line.startswith("{")]
    configured = next(e for e in events if e["event"] == "rack_configured")
    assert configured["rack"] == "us-east-1b" and configured["setting"] == "rack_file"
    shared = next(e for e in events if e["event"] == "rack_brokers")
    assert shared["level"] == "warning" and shared["rack"] == "us-east-1b"
    assert shared["node_ids"] == []
    assert shared["broker_racks"] == {"0": None, "1": None, "2": None}
    assert "no broker announces broker.rack 'us-east-1b'" in shared["hint"]


def test_sigterm_while_hundreds_of_connections_close_exits_cleanly() -> None:
    """The drain at SIGTERM starts each connection's wait for quiet in that connection's
    nursery.  A connection whose last task had just ended (its nursery closed, ``run`` not
    resumed yet) once made that start raise trio's "closed to new arrivals" out of the
    proxy: exit status 1 in 8 of 10 such shutdowns (c7404fc).  Three shutdowns here, each
    right after 300 connections closed."""
    frame = encode_frame(API_VERSIONS)
    with devbroker(nodes=1) as upstream:
        for _ in range(3):
            with proxy(upstream) as p:
                host, port = p.lines["bootstrap"].rsplit(":", 1)
                socks = [
                    socket.create_connection((host, int(port)), timeout=10) for _ in range(300)
                ]
                try:
                    for s in socks:
                        s.sendall(frame)
                    for s in socks:
                        assert s.recv(4), "no answer to ApiVersions"
                finally:
                    for s in socks:
                        s.close()
                p.proc.send_signal(signal.SIGTERM)
                code = p.proc.wait(30)
                assert code == 0, p.stderr()[-3000:]
                assert "Traceback" not in p.stderr()
