"""The project's commands as real processes, for tests with blocking clients (Spark, kcat).

    with devbroker("orders:6") as upstream, proxy(upstream, "--max-records", "50") as p:
        p.lines["bootstrap"]

Each process must print ``KEY=VALUE`` lines on stdout (``bootstrap=``, ``metrics=``);
start-up waits for them with an absolute timeout, and the process is stopped
(SIGTERM, then SIGKILL) when the block ends.  Its stderr goes to a file whose
tail is shown if start-up fails.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "proxy"]  # kafka-fetch-proxy
DEVBROKER_CLI = [sys.executable, "-m", "devbroker"]  # kafka-devbroker


@dataclass
class Started:
    proc: subprocess.Popen[bytes]
    lines: dict[str, str] = field(default_factory=dict)
    stderr_path: Path | None = None

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace") if self.stderr_path else ""


def read_lines(
    proc: subprocess.Popen[bytes], keys: Sequence[str], timeout: float
) -> dict[str, str]:
    assert proc.stdout is not None
    os.set_blocking(proc.stdout.fileno(), False)
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    buf = b""
    found: dict[str, str] = {}
    try:
        while len(found) < len(keys):
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {keys} lines within {timeout}s")
            if not sel.select(left):
                continue
            chunk = proc.stdout.read(65536)
            if chunk is None:  # nothing to read after all
                continue
            if not chunk:
                raise RuntimeError(f"process exited (code {proc.poll()}) before printing {keys}")
            buf += chunk
            for line in buf.decode(errors="replace").splitlines():
                key, sep, value = line.partition("=")
                if sep and key in keys:
                    found.setdefault(key, value)
    finally:
        sel.close()
    return found


@contextmanager
def started(
    args: Sequence[str], keys: Sequence[str], timeout: float = 60.0, cli: Sequence[str] = CLI
) -> Iterator[Started]:
    with tempfile.NamedTemporaryFile(prefix="proc-", suffix=".err", delete=False) as err:
        err_path = Path(err.name)
    with open(err_path, "wb") as err_file:
        proc = subprocess.Popen(
            [*cli, *args],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=err_file,
            stdin=subprocess.DEVNULL,
        )
    s = Started(proc, stderr_path=err_path)
    try:
        try:
            s.lines = read_lines(proc, keys, timeout)
        except (TimeoutError, RuntimeError) as exc:
            what = " ".join(["python", *cli[1:], *args])
            raise RuntimeError(f"{what} did not start: {exc}\n{s.stderr()[-3000:]}") from exc
        yield s
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
        err_path.unlink(missing_ok=True)


@contextmanager
def devbroker(*topics: str, nodes: int = 3) -> Iterator[str]:
    """A dev cluster process; yields its bootstrap address."""
    args = ["--nodes", str(nodes), "--port", "0"]
    for t in topics:
        args += ["--topic", t]
    with started(args, ("bootstrap",), cli=DEVBROKER_CLI) as s:
        yield s.lines["bootstrap"]


def run_args(upstream: str, *extra: str) -> list[str]:
    """``kafka-fetch-proxy`` arguments for a proxy in front of *upstream* on loopback, every
    port chosen at run time (it prints ``bootstrap=`` and ``metrics=``)."""
    return [
        "run",
        "--upstream",
        upstream,
        "--listen",
        "127.0.0.1:0",
        "--broker-port-base",
        "0",
        "--metrics-listen",
        "127.0.0.1:0",
        *extra,
    ]


@contextmanager
def proxy(upstream: str, *extra: str) -> Iterator[Started]:
    """A proxy process in front of *upstream*; ``.lines`` has ``bootstrap`` and ``metrics``."""
    with started(run_args(upstream, *extra), ("bootstrap", "metrics")) as s:
        yield s
