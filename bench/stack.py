"""The processes of a benchmark run: one real Kafka broker, haproxy, the proxy.

    with Stack(workdir, proxy_args=[...]) as stack:
        for arr in stack.arrangements():      # direct, haproxy, proxy
            arr.bootstrap, arr.relay_pid

The broker (``tests/support/kafka.py``) has a second listener, ``RELAY``, advertised
at haproxy's port, so haproxy relays Kafka in TCP mode with no address rewriting,
and a third, ``FLOOR``, advertised at the port of ``bench.trio_relay`` (the least a
relay on the proxy's runtime does), which the scenarios that measure it add
(``Stack.trio_relay``).  The proxy is ``kafka-fetch-proxy run`` as a process, in
front of the broker's own listener.  Every process is started here and stopped by
its pid.
"""

from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

KAFKA_JVM_OPTS = (
    "-Xms1g -Xmx1g -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35 "
    "-XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true"
)
"""Kafka's own defaults (kafka-run-class.sh): full JIT, no -XX:TieredStopAtLevel=1."""

ARRANGEMENTS = ("direct", "haproxy", "proxy")
CLK_TCK = os.sysconf("SC_CLK_TCK")
PAGE = os.sysconf("SC_PAGE_SIZE")


def use_bench_jvm_opts() -> None:
    """Full-JIT broker options, unless the caller set KAFKA_FETCH_PROXY_KAFKA_JVM_OPTS.

    Must run before ``support.kafka`` is imported (it reads the variable at import)."""
    os.environ.setdefault("KAFKA_FETCH_PROXY_KAFKA_JVM_OPTS", KAFKA_JVM_OPTS)


# -- /proc ---------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """CPU time of process *pid* (all its threads, live and exited), in seconds.

    Read from the process's CPU-time clock (clock_getcpuclockid(3): Linux encodes it
    as ``(~pid << 3) | CPUCLOCK_SCHED``), which counts nanoseconds; utime + stime of
    /proc/<pid>/stat (the same quantity in 10 ms ticks) where that clock is refused.
    A small fetch costs well under one tick."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rpartition(")")[2].split()
        return (int(fields[11]) + int(fields[12])) / CLK_TCK  # fields 14 and 15 of stat(5)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


# -- haproxy -------------------------------------------------------------------------


def ensure_haproxy() -> str:
    """The haproxy binary; Debian's package is installed with apt-get when missing."""
    path = shutil.which("haproxy")
    if path:
        return path
    print("bench: installing Debian's haproxy (apt-get)", file=sys.stderr, flush=True)
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(
        [*sudo, "apt-get", "update", "-qq"], check=True, env=env, stdin=subprocess.DEVNULL
    )
    subprocess.run(
        [*sudo, "apt-get", "install", "-y", "-qq", "--no-install-recommends", "haproxy"],
        check=True,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
    )
    path = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(path).exists():
        raise RuntimeError("apt-get installed haproxy but there is no haproxy binary")
    return path


HAPROXY_CFG = """\
global
    maxconn {maxconn}
    nbthread 1
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
frontend kafka
    bind 127.0.0.1:{listen}
    default_backend broker
backend broker
    server broker1 127.0.0.1:{target}
"""


def wait_port(
    port: int, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError as exc:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"nothing listens on 127.0.0.1:{port} after {timeout} s"
                ) from exc
            time.sleep(0.05)


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 10.0) -> None:
    """SIGTERM *proc* by its pid, SIGKILL after *timeout*."""
    if proc is None or proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout)


# -- the proxy -------------------------------------------------------------------------


@dataclass
class ProxyProcess:
    proc: subprocess.Popen[bytes]
    bootstrap: str
    metrics: str
    """The /metrics URL the proxy printed."""
    log: Path

    def scrape(self) -> dict[str, float]:
        """The /metrics samples: ``name{labels}`` -> value."""
        with urllib.request.urlopen(self.metrics, timeout=10) as r:
            text = r.read().decode()
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out


def start_proxy(
    upstream: str, log: Path, extra: Sequence[str] = (), *, tree: Path | None = None
) -> ProxyProcess:
    """A proxy process in front of *upstream*; *tree*: run that checkout's ``proxy`` package
    (another revision's, ``bench.compare``) instead of the installed one."""
    from support.procs import read_lines, run_args

    exe = Path(sys.executable).parent / "kafka-fetch-proxy"
    env = None
    if tree is not None:
        # ``-m`` from the checkout, with it first on the path: its package, not the install's
        cmd = [sys.executable, "-m", "proxy"]
        env = {**os.environ, "PYTHONPATH": str(tree)}
    else:
        cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "proxy"]
    cmd += run_args(upstream, *extra)
    with log.open("ab") as err:
        proc = subprocess.Popen(
            cmd,
            cwd=tree or REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=err,
            stdin=subprocess.DEVNULL,
        )
    try:
        lines = read_lines(proc, ("bootstrap", "metrics"), 30.0)
    except BaseException:
        stop(proc)
        raise
    return ProxyProcess(proc, lines["bootstrap"], lines["metrics"], log)


# -- arrangements ------------------------------------------------------------------------


@dataclass
class Arrangement:
    name: str
    bootstrap: str
    relay_pid: int | None
    """haproxy's or the proxy's pid; None for direct connections."""
    proxy: ProxyProcess | None = None


class Stack:
    """One broker, haproxy in front of its RELAY listener, the proxy in front of it."""

    def __init__(self, workdir: Path, *, proxy_args: Sequence[str] = ()) -> None:
        self.workdir = workdir
        self.proxy_args = list(proxy_args)
        self.cluster = None
        self.haproxy: subprocess.Popen[bytes] | None = None
        self.proxies: list[ProxyProcess] = []
        self.trio_relay_proc: subprocess.Popen[bytes] | None = None
        self._arrangements: dict[str, Arrangement] = {}
        self._fds_at_start = 0

    def __enter__(self) -> Stack:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _start(self) -> None:
        from support.kafka import KafkaCluster
        from support.loopback import free_port

        haproxy = ensure_haproxy()
        relay_port = free_port()
        floor_port = free_port()
        self.cluster = KafkaCluster(
            1,
            workdir=self.workdir / "kafka",
            # haproxy's and the bare trio relay's: each a listener advertising its relay
            listeners={"RELAY": relay_port, "FLOOR": floor_port},
            # a scenario's topics are deleted after it (drop_topics): their files go at once
            config={"log.segment.bytes": str(256 * 1024 * 1024), "file.delete.delay.ms": "0"},
        ).start()
        node = self.cluster.nodes[1]
        self._fds_at_start = self._broker_fds()
        cfg = self.workdir / "haproxy.cfg"
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        maxconn = max(1000, min(40000, (soft - 200) // 2))  # haproxy needs 2 fds per connection
        cfg.write_text(
            HAPROXY_CFG.format(listen=relay_port, target=node.extra["RELAY"], maxconn=maxconn)
        )
        with (self.workdir / "haproxy.log").open("ab") as log:
            self.haproxy = subprocess.Popen(
                [haproxy, "-db", "-f", str(cfg)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        wait_port(relay_port, proc=self.haproxy)
        with (self.workdir / "trio_relay.log").open("ab") as err:
            self.trio_relay_proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "bench.trio_relay",
                    "--listen",
                    f"127.0.0.1:{floor_port}",
                    "--upstream",
                    f"127.0.0.1:{node.extra['FLOOR']}",
                ],
                cwd=REPO,
                stdout=subprocess.DEVNULL,
                stderr=err,
                stdin=subprocess.DEVNULL,
            )
        wait_port(floor_port, proc=self.trio_relay_proc)
        proxy = self.start_proxy(self.proxy_args, "proxy")
        self._arrangements = {
            "direct": Arrangement("direct", node.address, None),
            "haproxy": Arrangement("haproxy", f"127.0.0.1:{relay_port}", self.haproxy.pid),
            "trio_relay": Arrangement(
                "trio_relay", f"127.0.0.1:{floor_port}", self.trio_relay_proc.pid
            ),
            "proxy": Arrangement("proxy", proxy.bootstrap, proxy.proc.pid, proxy),
        }

    def start_proxy(self, args: Sequence[str], name: str) -> ProxyProcess:
        assert self.cluster is not None
        proxy = start_proxy(
            self.cluster.nodes[1].address, self.workdir / f"{name}.stderr.log", args
        )
        self.proxies.append(proxy)
        return proxy

    def trio_relay(self) -> Arrangement:
        """``bench.trio_relay`` in front of the broker's FLOOR listener, which advertises the
        relay's port (as RELAY does haproxy's): the floor of any relay on Python and trio,
        for the scenarios that measure it (``fetch_cpu``, ``latency``)."""
        return self._arrangements["trio_relay"]

    def arrangements(self, proxy: ProxyProcess | None = None) -> list[Arrangement]:
        """direct, haproxy, proxy (*proxy*: another proxy process in the proxy's place)."""
        out = [self._arrangements["direct"], self._arrangements["haproxy"]]
        if proxy is None:
            out.append(self._arrangements["proxy"])
        else:
            out.append(Arrangement("proxy", proxy.bootstrap, proxy.proc.pid, proxy))
        return out

    def drop_topics(self, timeout: float = 120.0) -> None:
        """Delete every topic the scenarios made, and wait until the broker has let go of
        their files.  The broker keeps a file open per partition, so the scenarios' 20,000+
        partitions would pass the open-file limit (20,000 here) if they all lived at once."""
        assert self.cluster is not None
        self.cluster.delete_topics(self.cluster.topics(), timeout=60.0)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.cluster.topics() and self._broker_fds() <= self._fds_at_start + 1000:
                return
            time.sleep(0.5)
        print(
            f"bench: the broker still has {self._broker_fds()} open files after deleting the "
            f"topics ({self._fds_at_start} at start)",
            file=sys.stderr,
            flush=True,
        )

    def _broker_fds(self) -> int:
        return sum(1 for _ in Path(f"/proc/{self.broker_pid}/fd").iterdir())

    @property
    def broker_pid(self) -> int:
        assert self.cluster is not None
        proc = self.cluster.nodes[1].proc
        assert proc is not None
        return proc.pid

    def close(self) -> None:
        for proxy in self.proxies:
            stop(proxy.proc)
            if proxy.proc.stdout is not None:
                proxy.proc.stdout.close()
        self.proxies = []
        stop(self.haproxy)
        self.haproxy = None
        stop(self.trio_relay_proc)
        self.trio_relay_proc = None
        if self.cluster is not None:
            self.cluster.stop()
