"""`kafka-fetch-proxy run` as a process in front of `kafka-fetch-proxy devbroker`: the README demo."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
import trio

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
            [*cli, "devbroker", "--nodes", "3", "--port", "0", "--topic", "demo:3"],
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
                listing = await kcat("-b", bootstrap, "-L", "-t", "demo")
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
        finally:
            dev.send_signal(signal.SIGTERM)
            await dev.wait()


def test_run_exits_non_zero_when_the_listen_address_is_taken() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "proxy",
                "run",
                "--upstream",
                "127.0.0.1:1",
                "--listen",
                f"127.0.0.1:{port}",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )
    assert done.returncode == 1
    assert "cannot start" in done.stderr and "Address already in use" in done.stderr
