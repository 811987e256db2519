"""Load run: hundreds of real clients through one proxy for minutes, on loopback.

    .venv/bin/python -m bench.load                       # 200 consumers, 20 producers, 300 s
    .venv/bin/python -m bench.load --seconds 60 --consumers 20 --producers 4
    .venv/bin/python -m bench.load --upstream 127.0.0.1:9092   # an existing Kafka instead
    .venv/bin/python -m bench.load --arrangement both    # direct, then proxy: a baseline

Starts a single-node Apache Kafka 4.x (``tests/support/kafka.py``; or uses ``--upstream``),
one topic, ONE ``kafka-fetch-proxy run`` process in front of it, and client processes
(``bench/load_worker.py``, ``tests/clients/java/LoadConsumer.java``) that all connect
through the proxy: the consumers are 60 % confluent-kafka (librdkafka; threads, at most 40
a process), 20 % the Java client (threads, at most 20 a JVM) and 20 % kafka-python (one
process), in consumer groups of ``--group-size`` per library; the producers are 3/4
confluent-kafka and 1/4 kafka-python (a process per library), sending ``--rate`` records
a second between them.
Everything listens on and connects to 127.0.0.1; every client stops by itself at the
deadline (or when its stdin closes) and every process is stopped by its pid.

Every second it records: records/s and MB/s consumed and produced (as the clients count
them, key plus value), the proxy's delivered records/s and MB/s (its own counters), p99 of
the proxy's Fetch and Produce durations
(``kafka_fetch_proxy_client_request_duration_seconds{api="fetch"}``; Fetch includes the
long-poll wait), p99 end-to-end latency (consume time minus the record's timestamp), the
proxy's RSS (``VmRSS``), open file descriptors, CPU, open connections and memory budget
waits.  Writes ``var/load/<timestamp>/load.json`` and ``load.png`` (RSS and throughput
over time) and prints a summary table as its last output.

The run fails (exit status 1) when any of these is not zero: client errors (exceptions,
failed deliveries, librdkafka error callbacks, ERROR log records of the client libraries,
a client process exiting non-zero), proxy log lines at level error or critical, client
connections the proxy refused or closed for any cause but ``peer_closed`` and broker
connections it closed for any cause but ``peer_closed`` while the load runs (closes
while the clients shut down are reported apart: a client that closes its socket while a
response is being written shows as ``io_error``), consumers that received nothing; or
when the proxy's RSS grows after warm-up: the least-squares slope, over the second half
of the run, of the RSS floor (the least VmRSS of the last 30 s, so that a burst of data
held for a moment does not count, a leak does) above ``--rss-slope-limit`` MiB/min
(default 1.0: a leak of 1.4 GiB a day).  The slope is judged only when the second half lasts at least 60 s;
shorter runs report it as not judged.

``--arrangement direct`` runs the same clients, plan and rate straight to Kafka (the
baseline: no proxy, so the proxy's figures are 0 and RSS is not judged);
``--arrangement both`` runs direct, then proxy, on the same Kafka (a topic each, in
``<out>/direct`` and ``<out>/proxy``) and ends with a comparison of end-to-end latency
p50 / p99 and throughput, overall and by library (``compare.json``): proxy over direct,
and whether both latency figures are within 10 % of direct (issue 17's target).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.clients import JVM_OPTS, clients_dir  # noqa: E402
from support.kafka import KafkaCluster, SetupError, jvm_lib  # noqa: E402
from support.kafka import java as java_binary  # noqa: E402
from support.procs import run_args  # noqa: E402

LATENCY_EDGES_MS = (
    *(1, 2, 3, 5, 7, 10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700),
    *(1000, 1500, 2000, 3000, 5000, 10000, 30000),
)
"""Upper edges of the end-to-end latency buckets every client uses (plus one overflow)."""
CONFLUENT_PER_PROCESS = 40
JAVA_PER_JVM = 20
MIN_JUDGED_SECONDS = 60.0
FLOOR_SECONDS = 30.0
"""The RSS criterion is on the rolling minimum over this many seconds (see rss_floor)."""
MAX_SECONDS = 3600.0
MAX_CLIENTS = 1000
"""Bounds of a run, so that a typo cannot start an endless or enormous one."""
DEFAULT_PROXY_ARGS = "--max-records 500 --memory-budget-bytes 268435456"
DURATION_BUCKETS = "kafka_fetch_proxy_client_request_duration_seconds_bucket"
STOP_GRACE = 90.0
ARRANGEMENT_ORDER = ("direct", "proxy")
"""``--arrangement both``: the baseline first, then the proxy, on one Kafka."""
"""Seconds a client process gets to close its clients after the run, before SIGKILL."""


# -- the plan -------------------------------------------------------------------------------


@dataclass
class WorkerSpec:
    name: str
    library: str  # confluent, kafka-python, java
    groups: list[tuple[str, int]] = field(default_factory=list)
    producers: int = 0
    rate: float = 0.0

    @property
    def consumers(self) -> int:
        return sum(n for _, n in self.groups)


def split(total: int, size: int) -> list[int]:
    """``total`` as chunks of at most ``size``, as even as possible."""
    if total <= 0:
        return []
    parts = math.ceil(total / size)
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts)]


def plan(consumers: int, producers: int, rate: float, group_size: int) -> list[WorkerSpec]:
    java = round(consumers * 0.2)
    kafka_python = round(consumers * 0.2)
    confluent = consumers - java - kafka_python
    kp_producers = producers // 4
    cf_producers = producers - kp_producers
    run_id = uuid.uuid4().hex[:6]

    def groups(library: str, n: int) -> list[tuple[str, int]]:
        return [(f"load-{run_id}-{library}-{i}", k) for i, k in enumerate(split(n, group_size))]

    def assign(specs: list[WorkerSpec], all_groups: list[tuple[str, int]], per: int) -> None:
        """Fill the processes in order with whole groups or parts of them."""
        queue = list(all_groups)
        for spec in specs:
            room = per
            while room and queue:
                name, n = queue.pop(0)
                take = min(n, room)
                spec.groups.append((name, take))
                room -= take
                if n > take:
                    queue.insert(0, (name, n - take))

    cf = [
        WorkerSpec(f"confluent-{i}", "confluent")
        for i in range(len(split(confluent, CONFLUENT_PER_PROCESS)))
    ]
    assign(cf, groups("confluent", confluent), CONFLUENT_PER_PROCESS)
    jv = [WorkerSpec(f"java-{i}", "java") for i in range(len(split(java, JAVA_PER_JVM)))]
    assign(jv, groups("java", java), JAVA_PER_JVM)
    kp = [WorkerSpec("kafka-python-0", "kafka-python")] if kafka_python else []
    assign(kp, groups("kafka-python", kafka_python), kafka_python)
    # Producers have processes of their own, so consumer threads do not slow their pace.
    if cf_producers:
        cf.append(WorkerSpec("confluent-producers", "confluent", producers=cf_producers))
    if kp_producers:
        kp.append(WorkerSpec("kafka-python-producers", "kafka-python", producers=kp_producers))
    specs = cf + jv + kp
    for spec in specs:
        spec.rate = rate * spec.producers / producers if producers else 0.0
    return specs


# -- processes ------------------------------------------------------------------------------


def stop_process(proc: subprocess.Popen[Any], grace: float) -> None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; by pid, only this process."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


class Proxy:
    """The ``kafka-fetch-proxy run`` process; its stderr (JSON log lines) goes to a file."""

    def __init__(self, upstream: str, extra: list[str], log: Path) -> None:
        self.log = log
        cli = REPO / ".venv" / "bin" / "kafka-fetch-proxy"
        command = [str(cli)] if cli.exists() else [sys.executable, "-m", "proxy"]
        args = [*command, *run_args(upstream, *extra)]
        with open(log, "wb") as err:
            self.proc = subprocess.Popen(
                args, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err
            )
        self.lines: dict[str, str] = {}
        self.last_metrics: dict[str, float] = {}
        self.scrape_failures = 0
        found = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:
                key, sep, value = raw.decode(errors="replace").strip().partition("=")
                if sep and key in ("bootstrap", "metrics"):
                    self.lines.setdefault(key, value)
                    if len(self.lines) == 2:
                        found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(30):
            stop_process(self.proc, 10)
            tail = log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the proxy did not start within 30 s:\n{tail}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def bootstrap(self) -> str:
        return self.lines["bootstrap"]

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as {'name{label="v",...}': value}; when the proxy does not answer
        within 5 s (a starved machine), the last answer, and ``scrape_failures`` counts it."""
        try:
            with urllib.request.urlopen(self.lines["metrics"], timeout=5) as resp:
                text = resp.read().decode()
        except OSError:
            self.scrape_failures += 1
            return self.last_metrics
        out: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        self.last_metrics = out
        return out

    def stop(self) -> None:
        stop_process(self.proc, 30)

    def log_levels(self) -> tuple[dict[str, int], dict[str, int], list[str]]:
        """(error/critical lines by event, warning lines by event, first error lines)."""
        errors: dict[str, int] = {}
        warnings: dict[str, int] = {}
        samples: list[str] = []
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                event = {"level": "error", "event": "non-JSON stderr line"}
            level = str(event.get("level", ""))
            name = str(event.get("event", "?"))
            if level in ("error", "critical", "exception"):
                errors[name] = errors.get(name, 0) + 1
                if len(samples) < 10:
                    samples.append(line[:500])
            elif level == "warning":
                warnings[name] = warnings.get(name, 0) + 1
        return errors, warnings, samples


class Direct:
    """The direct arrangement's stand-in for :class:`Proxy`: clients connect to Kafka
    itself, so there is no process to sample, no metrics and no log."""

    pid = None
    scrape_failures = 0

    def __init__(self, upstream: str) -> None:
        self.bootstrap = upstream

    def metrics(self) -> dict[str, float]:
        return {}

    def stop(self) -> None:
        pass

    def log_levels(self) -> tuple[dict[str, int], dict[str, int], list[str]]:
        return {}, {}, []


class Client:
    """One client process; a thread keeps its latest cumulative stats and its final line."""

    def __init__(self, spec: WorkerSpec, command: list[str], out_dir: Path) -> None:
        self.spec = spec
        self.stderr_path = out_dir / f"{spec.name}.stderr"
        self.stdout_path = out_dir / f"{spec.name}.stdout"
        with open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(
                command, cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
            )
        self.stats: dict[str, Any] = {}
        self.final: dict[str, Any] | None = None
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        with open(self.stdout_path, "w") as keep:
            for raw in self.proc.stdout:
                line = raw.decode(errors="replace")
                try:
                    msg = json.loads(line)
                except ValueError:
                    keep.write(line)
                    continue
                if msg.get("op") == "stats":
                    self.stats = msg
                elif msg.get("op") == "final":
                    self.final = msg
                    keep.write(line)

    def close_stdin(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()
            except OSError:
                pass


def java_classes(out: Path) -> Path:
    """Where LoadConsumer.class is: the test clients' build (``tests/clients/build``), or,
    when the shared cache holds a build without it (one made from another checkout), a
    compilation of ``tests/clients/java/LoadConsumer.java`` (and the ``JsonLines.java`` it
    uses, found on the source path) into the run's directory."""
    built = clients_dir() / "java" / "classes"
    if (built / "LoadConsumer.class").exists():
        return built
    source = REPO / "tests" / "clients" / "java" / "LoadConsumer.java"
    classes = out / "classes"
    javac = shutil.which("javac")
    if javac is None:
        raise SetupError("no javac on PATH: run `scripts/setup --test`")
    print(f"{built} has no LoadConsumer.class: compiling it into {classes}", file=sys.stderr)
    subprocess.run(
        [
            javac,
            "-d",
            str(classes),
            "-sourcepath",
            str(source.parent),
            "-cp",
            f"{jvm_lib('clients')}/*",
            str(source),
        ],
        check=True,
        stdin=subprocess.DEVNULL,
        timeout=300,
    )
    return classes


def client_command(
    spec: WorkerSpec, opts: argparse.Namespace, bootstrap: str, out: Path
) -> list[str]:
    edges = ",".join(str(e) for e in LATENCY_EDGES_MS)
    # The clients run a little longer than the sampling, which ends first.
    seconds = str(opts.seconds + 30)
    groups = [a for name, n in spec.groups for a in ("--group", f"{name}:{n}")]
    if spec.library == "java":
        classes = java_classes(out)
        return [
            java_binary(),
            *JVM_OPTS,
            "-cp",
            f"{classes}{os.pathsep}{jvm_lib('clients')}/*",
            "LoadConsumer",
            "--bootstrap",
            bootstrap,
            "--topic",
            opts.topic,
            "--client-id",
            f"load-{spec.name}",
            *groups,
            "--seconds",
            seconds,
            "--latency-edges-ms",
            edges,
        ]
    return [
        sys.executable,
        "-m",
        "bench.load_worker",
        spec.library,
        "--bootstrap",
        bootstrap,
        "--topic",
        opts.topic,
        "--client-id",
        f"load-{spec.name}",
        *groups,
        "--producers",
        str(spec.producers),
        "--rate",
        str(spec.rate),
        "--record-bytes",
        str(opts.record_bytes),
        "--seconds",
        seconds,
        "--latency-edges-ms",
        edges,
    ]


# -- sampling -------------------------------------------------------------------------------


def proc_status(pid: int) -> tuple[float, int, float]:
    """(VmRSS in MiB, open file descriptors, CPU seconds) of a process."""
    rss = 0.0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) / 1024
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return rss, fds, cpu


def quantile(q: float, edges: list[float], counts: list[float]) -> float | None:
    """The q-quantile of a histogram (``counts[i]`` in (edges[i-1], edges[i]], the last
    bucket unbounded), interpolated linearly in its bucket as Prometheus'
    ``histogram_quantile`` does; None without observations."""
    total = sum(counts)
    if total <= 0:
        return None
    rank = q * total
    seen = 0.0
    for i, n in enumerate(counts):
        if n > 0 and seen + n >= rank:
            if i >= len(edges):
                return edges[-1]
            low = edges[i - 1] if i > 0 else 0.0
            return low + (edges[i] - low) * (rank - seen) / n
        seen += n
    return edges[-1]


def duration_buckets(m: dict[str, float], api: str) -> tuple[list[float], list[float]]:
    """An API's request duration histogram as (upper edges, per-bucket counts, +Inf last)."""
    cumulative: list[tuple[float, float]] = []
    for key, value in m.items():
        if key.startswith(DURATION_BUCKETS + "{") and f'api="{api}"' in key:
            le = key.split('le="', 1)[1].split('"', 1)[0]
            cumulative.append((math.inf if le == "+Inf" else float(le), value))
    cumulative.sort()
    edges = [le for le, _ in cumulative if le != math.inf]
    counts = [c - (cumulative[i - 1][1] if i else 0.0) for i, (_, c) in enumerate(cumulative)]
    return edges, counts


def window_p99(
    first: tuple[list[float], list[float]], last: tuple[list[float], list[float]]
) -> float | None:
    """p99 of the observations a duration histogram gained between two scrapes."""
    edges, counts = last
    before = first[1] or [0.0] * len(counts)  # no such request yet at the first scrape
    return quantile(0.99, edges, [a - b for a, b in zip(counts, before, strict=True)])


def labelled(m: dict[str, float], name: str) -> dict[str, float]:
    """Samples of one metric, keyed by their label string."""
    return {k[len(name) :]: v for k, v in m.items() if k == name or k.startswith(name + "{")}


def label(key: str, name: str) -> str:
    return key.split(f'{name}="', 1)[1].split('"', 1)[0] if f'{name}="' in key else ""


def closes(m: dict[str, float]) -> dict[str, float]:
    """Connections the proxy closed, by side and cause ({"client/peer_closed": 3, ...})."""
    out: dict[str, float] = {}
    for side, name in (
        ("client", "kafka_fetch_proxy_client_connections_closed_total"),
        ("broker", "kafka_fetch_proxy_broker_connections_closed_total"),
    ):
        for key, value in labelled(m, name).items():
            k = f"{side}/{label(key, 'cause')}"
            out[k] = out.get(k, 0.0) + value
    for key, value in labelled(m, "kafka_fetch_proxy_client_connections_refused_total").items():
        out[f"refused/{label(key, 'reason')}"] = value
    return {k: v for k, v in out.items() if v}


def total(m: dict[str, float], name: str) -> float:
    return sum(labelled(m, name).values())


def sum_stats(clients: list[Client]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "records": 0,
        "bytes": 0,
        "produced": 0,
        "produced_bytes": 0,
        "errors": 0,
        "warnings": 0,
        "latency": [0] * (len(LATENCY_EDGES_MS) + 1),
    }
    for c in clients:
        s = c.stats
        for key in ("records", "bytes", "produced", "produced_bytes", "errors", "warnings"):
            out[key] += int(s.get(key, 0))
        for i, n in enumerate(s.get("latency", ())):
            out["latency"][i] += n
    return out


def per_library(clients: list[Client]) -> dict[str, dict[str, Any]]:
    """Cumulative consumed records and latency buckets by client library."""
    out: dict[str, dict[str, Any]] = {}
    for c in clients:
        lib = out.setdefault(
            c.spec.library, {"records": 0, "latency": [0] * (len(LATENCY_EDGES_MS) + 1)}
        )
        lib["records"] += int(c.stats.get("records", 0))
        for i, n in enumerate(c.stats.get("latency", ())):
            lib["latency"][i] += n
    return out


def sample(
    t: float, proxy: Proxy | Direct, clients: list[Client], prev: dict[str, Any] | None
) -> dict[str, Any]:
    """One row of the per-second series; ``prev`` is the previous row's raw counters.
    Direct (no proxy): RSS, descriptors, CPU and the proxy's figures are 0."""
    rss, fds, cpu = proc_status(proxy.pid) if proxy.pid is not None else (0.0, 0, 0.0)
    m = proxy.metrics()
    s = sum_stats(clients)
    raw = {
        "t": t,
        "cpu": cpu,
        "clients": s,
        "delivered": total(m, "kafka_fetch_proxy_proxy_to_client_fetch_records_total"),
        "delivered_bytes": total(m, "kafka_fetch_proxy_proxy_to_client_fetch_record_bytes_total"),
        "requests": total(m, "kafka_fetch_proxy_client_to_proxy_requests_total"),
        "fetch": duration_buckets(m, "fetch"),
        "produce": duration_buckets(m, "produce"),
        "budget_waits": total(m, "kafka_fetch_proxy_memory_budget_waits_total"),
        "per_library": per_library(clients),
    }
    row: dict[str, Any] = {
        "t": round(t, 2),
        "rss_mib": round(rss, 2),
        "fds": fds,
        "client_connections": total(m, "kafka_fetch_proxy_client_connections_open"),
        "broker_connections": total(m, "kafka_fetch_proxy_broker_connections_open"),
        "budget_used_mib": round(total(m, "kafka_fetch_proxy_memory_budget_used_bytes") / 2**20, 2),
        "budget_waits": total(m, "kafka_fetch_proxy_memory_budget_waits_total"),
        "client_errors": s["errors"],
        "client_warnings": s["warnings"],
        "scrape_failures": proxy.scrape_failures,
        "closes": closes(m),
    }
    if prev is not None:
        dt = t - prev["t"]
        p = prev["clients"]
        lat = [a - b for a, b in zip(s["latency"], p["latency"], strict=True)]
        fetch_p99 = window_p99(prev["fetch"], raw["fetch"])
        produce_p99 = window_p99(prev["produce"], raw["produce"])
        e2e_p99 = quantile(0.99, [float(e) for e in LATENCY_EDGES_MS], lat)
        row |= {
            "consumed_rps": round((s["records"] - p["records"]) / dt, 1),
            "consumed_mbps": round((s["bytes"] - p["bytes"]) / dt / 1e6, 3),
            "produced_rps": round((s["produced"] - p["produced"]) / dt, 1),
            "produced_mbps": round((s["produced_bytes"] - p["produced_bytes"]) / dt / 1e6, 3),
            "proxy_delivered_rps": round((raw["delivered"] - prev["delivered"]) / dt, 1),
            "proxy_delivered_mbps": round(
                (raw["delivered_bytes"] - prev["delivered_bytes"]) / dt / 1e6, 3
            ),
            "requests_per_s": round((raw["requests"] - prev["requests"]) / dt, 1),
            "budget_waits_per_s": round((row["budget_waits"] - prev["budget_waits"]) / dt, 1),
            "proxy_cpu_pct": round(100 * (cpu - prev["cpu"]) / dt, 1),
            "fetch_p99_ms": None if fetch_p99 is None else round(fetch_p99 * 1000, 1),
            "produce_p99_ms": None if produce_p99 is None else round(produce_p99 * 1000, 1),
            "e2e_p99_ms": None if e2e_p99 is None else round(e2e_p99, 1),
        }
    return {"row": row, "raw": raw}


# -- the run --------------------------------------------------------------------------------


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"retention.bytes": str(256 << 20), "segment.bytes": str(32 << 20)}
    futures = admin.create_topics([NewTopic(topic, partitions, 1, config=config)])
    futures[topic].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        meta = admin.list_topics(topic, timeout=5).topics.get(topic)
        if meta is not None and meta.error is None and len(meta.partitions) == partitions:
            if all(p.leader >= 0 for p in meta.partitions.values()):
                return
        time.sleep(0.2)
    raise TimeoutError(f"topic {topic} has no leaders after 30 s")


def progress(row: dict[str, Any]) -> None:
    print(
        f"[{row['t']:6.0f} s] consumed {row.get('consumed_rps', 0):8.0f} rec/s "
        f"{row.get('consumed_mbps', 0):6.2f} MB/s, produced {row.get('produced_rps', 0):6.0f} "
        f"rec/s, e2e p99 {row.get('e2e_p99_ms')} ms, RSS {row['rss_mib']:.1f} MiB, "
        f"fds {row['fds']}, conns {row['client_connections']:.0f}, "
        f"client errors {row['client_errors']}",
        file=sys.stderr,
        flush=True,
    )


def slope_per_minute(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, MiB) points, in MiB per minute."""
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    if sxx == 0:
        return None
    return 60 * sum((x - mx) * (y - my) for x, y in points) / sxx


def rss_floor(rows: list[dict[str, Any]]) -> list[tuple[float, float]]:
    """(t, the least RSS of the FLOOR_SECONDS up to t) for every sample: what the proxy
    keeps, without the transient peaks of bursts of data it holds for a moment."""
    out = []
    for i, r in enumerate(rows):
        window = [x["rss_mib"] for x in rows[: i + 1] if x["t"] >= r["t"] - FLOOR_SECONDS]
        out.append((r["t"], min(window)))
    return out


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarize(
    opts: argparse.Namespace,
    rows: list[dict[str, Any]],
    steady: tuple[dict[str, Any], dict[str, Any]],
    clients: list[Client],
    end_closes: dict[str, float],
    proxy_log: tuple[dict[str, int], dict[str, int], list[str]],
) -> dict[str, Any]:
    first, last = steady
    window = [r for r in rows if r["t"] >= opts.warmup and "consumed_rps" in r]
    half = [(r["t"], r["rss_mib"]) for r in rows if r["t"] >= opts.seconds / 2]
    raw_slope = slope_per_minute(half)
    floor = rss_floor(rows)
    slope = slope_per_minute([(t, v) for t, v in floor if t >= opts.seconds / 2])
    judged = len(half) >= 3 and opts.seconds / 2 >= MIN_JUDGED_SECONDS
    after = [r["rss_mib"] for r in rows if r["t"] >= opts.warmup] or [rows[-1]["rss_mib"]]
    at_warmup = next((r for r in rows if r["t"] >= opts.warmup), rows[-1])

    lat = [
        a - b for a, b in zip(last["clients"]["latency"], first["clients"]["latency"], strict=True)
    ]
    fetch_p99 = window_p99(first["fetch"], last["fetch"])
    produce_p99 = window_p99(first["produce"], last["produce"])
    e2e_p99 = quantile(0.99, [float(e) for e in LATENCY_EDGES_MS], lat)
    e2e_p50 = quantile(0.50, [float(e) for e in LATENCY_EDGES_MS], lat)
    seconds = max(last["t"] - first["t"], 1e-9)
    by_library: dict[str, dict[str, Any]] = {}
    for lib, now in last["per_library"].items():
        then = first["per_library"].get(lib, {"records": 0, "latency": [0] * len(now["latency"])})
        d = [a - b for a, b in zip(now["latency"], then["latency"], strict=True)]
        p50 = quantile(0.50, [float(e) for e in LATENCY_EDGES_MS], d)
        p99 = quantile(0.99, [float(e) for e in LATENCY_EDGES_MS], d)
        by_library[lib] = {
            "consumed_rps": round((now["records"] - then["records"]) / seconds, 1),
            "e2e_p50_ms": None if p50 is None else round(p50, 1),
            "e2e_p99_ms": None if p99 is None else round(p99, 1),
        }

    client_errors = 0
    samples: list[str] = []
    warnings: list[str] = []
    consumers: dict[str, int] = {}
    exits: dict[str, int | None] = {}
    for c in clients:
        exits[c.spec.name] = c.proc.returncode
        if c.final is None:
            client_errors += 1
            samples.append(f"{c.spec.name}: no final report (exit {c.proc.returncode})")
        else:
            client_errors += int(c.final["errors"])
            samples += [f"{c.spec.name}: {s}" for s in c.final["error_samples"]]
            warnings += [f"{c.spec.name}: {s}" for s in c.final.get("warning_samples", ())]
            consumers |= c.final["consumers"]
        if c.proc.returncode != 0:
            client_errors += 1
            samples.append(f"{c.spec.name}: exit status {c.proc.returncode}")
    idle = sorted(k for k, v in consumers.items() if v == 0)
    during = rows[-1]["closes"]
    bad_closes = {k: v for k, v in during.items() if not k.endswith("/peer_closed") and v}
    proxy_errors, proxy_warnings, proxy_samples = proxy_log
    errors = {
        "client_errors": client_errors,
        "proxy_error_log_lines": sum(proxy_errors.values()),
        "connection_closes_not_peer_closed": int(sum(bad_closes.values())),
        "consumers_without_data": len(idle),
    }
    rss_ok = not judged or (slope is not None and slope <= opts.rss_slope_limit)
    return {
        "passed": not any(errors.values()) and rss_ok,
        "errors": errors,
        "rss": {
            "start_mib": rows[0]["rss_mib"],
            "at_warmup_mib": at_warmup["rss_mib"],
            "max_after_warmup_mib": max(after),
            "end_mib": rows[-1]["rss_mib"],
            "second_half_slope_mib_per_min": None if slope is None else round(slope, 3),
            "second_half_raw_slope_mib_per_min": (
                None if raw_slope is None else round(raw_slope, 3)
            ),
            "floor_window_s": FLOOR_SECONDS,
            "slope_limit_mib_per_min": opts.rss_slope_limit,
            "judged": judged,
            "ok": rss_ok,
        },
        "steady": {
            "from_s": opts.warmup,
            "consumed_rps": round(mean([r["consumed_rps"] for r in window]), 1),
            "consumed_mbps": round(mean([r["consumed_mbps"] for r in window]), 3),
            "produced_rps": round(mean([r["produced_rps"] for r in window]), 1),
            "produced_mbps": round(mean([r["produced_mbps"] for r in window]), 3),
            "proxy_delivered_mbps": round(mean([r["proxy_delivered_mbps"] for r in window]), 3),
            "requests_per_s": round(mean([r["requests_per_s"] for r in window]), 1),
            "proxy_cpu_pct": round(mean([r["proxy_cpu_pct"] for r in window]), 1),
            "fetch_p99_ms": None if fetch_p99 is None else round(fetch_p99 * 1000, 1),
            "produce_p99_ms": None if produce_p99 is None else round(produce_p99 * 1000, 1),
            "e2e_p50_ms": None if e2e_p50 is None else round(e2e_p50, 1),
            "e2e_p99_ms": None if e2e_p99 is None else round(e2e_p99, 1),
            "budget_waits": rows[-1]["budget_waits"] - at_warmup["budget_waits"],
            "fds_max": max((r["fds"] for r in window), default=rows[-1]["fds"]),
            "client_connections_max": max((r["client_connections"] for r in window), default=0),
        },
        "by_library": by_library,
        "totals": {
            "consumed": last["clients"]["records"],
            "produced": last["clients"]["produced"],
            "client_warnings": last["clients"]["warnings"],
        },
        "closes_during_run": during,
        "closes_at_end": end_closes,
        "proxy_error_events": proxy_errors,
        "proxy_warning_events": proxy_warnings,
        "proxy_error_samples": proxy_samples,
        "client_error_samples": samples[:40],
        "client_warning_samples": warnings[:40],
        "consumers_without_data": idle,
        "client_exit_status": exits,
        "consumers": consumers,
    }


def plot(
    rows: list[dict[str, Any]], summary: dict[str, Any], opts: argparse.Namespace, path: Path
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [r["t"] for r in rows]
    fig, (ax_rss, ax_tp) = plt.subplots(2, 1, figsize=(8, 5.5), sharex=True, dpi=80)
    ax_rss.plot(t, [r["rss_mib"] for r in rows], color="tab:red", label="proxy RSS (MiB)")
    ax_rss.plot(
        t,
        [v for _, v in rss_floor(rows)],
        color="darkred",
        linestyle=":",
        label=f"RSS floor ({FLOOR_SECONDS:.0f} s min)",
    )
    slope = summary["rss"]["second_half_slope_mib_per_min"]
    ax_rss.axvline(opts.warmup, color="grey", linestyle=":", label="end of warm-up")
    ax_rss.axvline(opts.seconds / 2, color="grey", linestyle="--", label="second half")
    ax_rss.set_ylabel("RSS (MiB)")
    ax_fd = ax_rss.twinx()
    ax_fd.plot(t, [r["fds"] for r in rows], color="tab:blue", alpha=0.5, label="open fds")
    ax_fd.set_ylabel("open fds")
    ax_rss.set_ylim(bottom=0)
    ax_fd.set_ylim(bottom=0)
    ax_rss.set_title(
        f"{opts.consumers} consumers, {opts.producers} producers, {summary.get('arrangement', 'proxy')}; "
        f"RSS floor slope (2nd half) {slope} MiB/min",
        fontsize=10,
    )
    lines = ax_rss.get_legend_handles_labels()
    lines2 = ax_fd.get_legend_handles_labels()
    ax_rss.legend(lines[0] + lines2[0], lines[1] + lines2[1], loc="lower right", fontsize=8)
    tp = [r for r in rows if "consumed_mbps" in r]
    ax_tp.plot([r["t"] for r in tp], [r["consumed_mbps"] for r in tp], label="consumed MB/s")
    ax_tp.plot([r["t"] for r in tp], [r["produced_mbps"] for r in tp], label="produced MB/s")
    ax_tp.set_ylabel("MB/s (key + value)")
    ax_tp.set_xlabel("seconds")
    ax_tp.set_ylim(bottom=0)
    ax_tp.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def table(
    summary: dict[str, Any], opts: argparse.Namespace, specs: list[WorkerSpec], out: Path
) -> str:
    st, rss, err = summary["steady"], summary["rss"], summary["errors"]
    mix: dict[str, int] = {}
    for s in specs:
        mix[s.library] = mix.get(s.library, 0) + s.consumers
    slope = rss["second_half_slope_mib_per_min"]
    verdict = "ok" if rss["ok"] else "FAIL"
    if not rss["judged"]:
        verdict = f"not judged (second half < {MIN_JUDGED_SECONDS:.0f} s)"
    rows = [
        ("run", str(out)),
        ("arrangement", summary.get("arrangement", "proxy")),
        ("duration", f"{opts.seconds:.0f} s (steady state from {opts.warmup:.0f} s)"),
        ("consumers", ", ".join(f"{n} {lib}" for lib, n in mix.items() if n)),
        ("producers", f"{opts.producers} ({opts.rate:.0f} records/s of {opts.record_bytes} B)"),
        ("load average (1 min) at start/end", opts.load_average),
        ("consumed", f"{st['consumed_rps']:.0f} records/s, {st['consumed_mbps']:.2f} MB/s"),
        ("produced", f"{st['produced_rps']:.0f} records/s, {st['produced_mbps']:.2f} MB/s"),
        ("proxy delivered (its counters)", f"{st['proxy_delivered_mbps']:.2f} MB/s"),
        ("proxy requests", f"{st['requests_per_s']:.0f}/s, CPU {st['proxy_cpu_pct']:.0f} %"),
        (
            "p99 in the proxy: Fetch (long poll), Produce",
            f"{st['fetch_p99_ms']} ms, {st['produce_p99_ms']} ms",
        ),
        ("memory budget waits", f"{st['budget_waits']:.0f}"),
        ("end-to-end latency p50 / p99", f"{st['e2e_p50_ms']} / {st['e2e_p99_ms']} ms"),
        (
            "proxy RSS start / warm-up / max / end",
            f"{rss['start_mib']:.1f} / {rss['at_warmup_mib']:.1f} / "
            f"{rss['max_after_warmup_mib']:.1f} / {rss['end_mib']:.1f} MiB",
        ),
        (
            f"RSS floor ({FLOOR_SECONDS:.0f} s min) slope, 2nd half",
            f"{slope} MiB/min (limit {rss['slope_limit_mib_per_min']}): {verdict}",
        ),
        (
            "open fds (max), client connections (max)",
            f"{st['fds_max']}, {st['client_connections_max']:.0f}",
        ),
        ("client errors", str(err["client_errors"])),
        ("proxy error log lines", str(err["proxy_error_log_lines"])),
        (
            "warnings (not failing): client, proxy",
            f"{summary['totals']['client_warnings']}, "
            f"{sum(summary['proxy_warning_events'].values())}",
        ),
        ("closes not peer_closed", str(err["connection_closes_not_peer_closed"])),
        ("consumers without data", str(err["consumers_without_data"])),
        ("result", "PASS" if summary["passed"] else "FAIL"),
    ]
    width = max(len(k) for k, _ in rows)
    rule = "-" * (width + 2 + max(len(v) for _, v in rows))
    body = [f"{k:<{width}}  {v}" for k, v in rows]
    return "\n".join([rule, *body, rule])


def loadavg() -> str:
    return Path("/proc/loadavg").read_text().split()[0]


def run(opts: argparse.Namespace) -> int:
    out: Path = opts.out or REPO / "var" / "load" / time.strftime("%Y%m%d-%H%M%S")
    out.mkdir(parents=True, exist_ok=True)
    arrangements = ARRANGEMENT_ORDER if opts.arrangement == "both" else (opts.arrangement,)
    load_start = loadavg()
    cluster: KafkaCluster | None = None
    tmp = tempfile.TemporaryDirectory(prefix="kfp-load-")
    results: dict[str, dict[str, Any]] = {}
    tables: dict[str, str] = {}
    try:
        upstream = opts.upstream
        if upstream is None:
            print("starting Kafka...", file=sys.stderr, flush=True)
            # Kafka's own default delay (the test fixtures use 0): the consumers of a group
            # that start together join one rebalance instead of a storm of them.
            config = {"group.initial.rebalance.delay.ms": "3000"}
            cluster = KafkaCluster(1, workdir=Path(tmp.name), version="4", config=config).start()
            upstream = cluster.bootstrap
        for arrangement in arrangements:
            sub = out / arrangement if len(arrangements) > 1 else out
            sub.mkdir(parents=True, exist_ok=True)
            results[arrangement], tables[arrangement] = run_arrangement(
                opts, arrangement, upstream, sub, load_start
            )
    finally:
        if cluster is not None:
            cluster.stop()
            log = cluster.nodes[1].log
            if log.exists():
                (out / "kafka-server.log").write_bytes(log.read_bytes()[-(8 << 20) :])
        tmp.cleanup()
    for arrangement in arrangements:
        if len(arrangements) > 1:
            print(f"{arrangement}:", flush=True)
        print(tables[arrangement], flush=True)
    if len(arrangements) > 1:
        compared = compare({a: r["summary"] for a, r in results.items()})
        (out / "compare.json").write_text(json.dumps(compared, indent=1))
        print(compare_table(compared), flush=True)
    return 0 if all(r["summary"]["passed"] for r in results.values()) else 1


def run_arrangement(
    opts: argparse.Namespace, arrangement: str, upstream: str, out: Path, load_start: str
) -> tuple[dict[str, Any], str]:
    """One load run of *arrangement* (``proxy``: every client through one proxy process;
    ``direct``: the same clients straight to Kafka) on a topic of its own; its result
    document (written to ``out/load.json``) and summary table."""
    specs = plan(opts.consumers, opts.producers, opts.rate, opts.group_size)
    topic = opts.topic if opts.arrangement != "both" else f"{opts.topic}-{arrangement}"
    run_opts = argparse.Namespace(**{**vars(opts), "topic": topic})
    proxy: Proxy | Direct | None = None
    clients: list[Client] = []
    rows: list[dict[str, Any]] = []
    raws: list[dict[str, Any]] = []
    try:
        create_topic(upstream, topic, opts.partitions)
        if arrangement == "proxy":
            proxy = Proxy(upstream, shlex.split(opts.proxy_args), out / "proxy.log")
            print(
                f"proxy pid {proxy.pid} at {proxy.bootstrap}; "
                f"starting {len(specs)} client processes",
                file=sys.stderr,
                flush=True,
            )
        else:
            proxy = Direct(upstream)
            print(
                f"direct to {upstream}; starting {len(specs)} client processes",
                file=sys.stderr,
                flush=True,
            )
        began = time.monotonic()
        for spec in specs:
            direct = opts.producers_direct and spec.producers > 0
            bootstrap = upstream if direct else proxy.bootstrap
            clients.append(Client(spec, client_command(spec, run_opts, bootstrap, out), out))
        prev: dict[str, Any] | None = None
        tick = 0
        while True:
            now = time.monotonic() - began
            if now > opts.seconds:
                break
            s = sample(now, proxy, clients, prev)
            rows.append(s["row"])
            raws.append(s["raw"])
            prev = s["raw"]
            if tick % 10 == 0:
                progress(s["row"])
            tick += 1
            time.sleep(max(0.0, began + tick - time.monotonic()))
        for c in clients:
            c.close_stdin()
        deadline = time.monotonic() + STOP_GRACE
        for c in clients:
            try:
                c.proc.wait(max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                stop_process(c.proc, 10)
            c.thread.join(10)
        final_metrics = proxy.metrics()
        end_closes = closes(final_metrics)
        # Every series as the run left it (durations by API, on both legs), for diagnosis.
        (out / "metrics-end.txt").write_text(
            "".join(f"{k} {v}\n" for k, v in sorted(final_metrics.items()))
        )
    finally:
        for c in clients:
            c.close_stdin()
            stop_process(c.proc, 10)
        if proxy is not None:
            proxy.stop()
    assert proxy is not None
    run_opts.load_average = f"{load_start} / {loadavg()}"
    steady_start = next((r for r in raws if r["t"] >= opts.warmup), raws[-1])
    summary = summarize(
        run_opts, rows, (steady_start, raws[-1]), clients, end_closes, proxy.log_levels()
    )
    summary["arrangement"] = arrangement
    if arrangement == "direct":  # there is no proxy whose memory could grow
        summary["rss"] |= {"judged": False, "ok": True}
        summary["passed"] = not any(summary["errors"].values())
    plot(rows, summary, run_opts, out / "load.png")
    result = {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(run_opts).items()},
        "plan": [vars(s) for s in specs],
        "latency_edges_ms": LATENCY_EDGES_MS,
        "summary": summary,
        "samples": rows,
    }
    (out / "load.json").write_text(json.dumps(result, indent=1))
    return result, table(summary, run_opts, specs, out)


def compare(summaries: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """End-to-end latency and throughput through the proxy against direct, overall and by
    library: each figure of both, and proxy / direct (issue 17's target: within 10 %)."""

    def pair(d: float | None, p: float | None) -> dict[str, float | None]:
        ratio = None if d is None or p is None or d <= 0 else round(p / d, 3)
        return {"direct": d, "proxy": p, "proxy_over_direct": ratio}

    d, p = summaries["direct"], summaries["proxy"]
    out: dict[str, Any] = {
        key: pair(d["steady"][key], p["steady"][key])
        for key in ("e2e_p50_ms", "e2e_p99_ms", "consumed_rps", "produced_rps")
    }
    out["by_library"] = {
        lib: {
            key: pair(d["by_library"].get(lib, {}).get(key), p["by_library"][lib].get(key))
            for key in ("e2e_p50_ms", "e2e_p99_ms", "consumed_rps")
        }
        for lib in p["by_library"]
    }
    out["within_10_percent"] = all(
        out[k]["proxy_over_direct"] is not None and out[k]["proxy_over_direct"] <= 1.10
        for k in ("e2e_p50_ms", "e2e_p99_ms")
    )
    return out


def compare_table(compared: dict[str, Any]) -> str:
    rows = [("", "direct / proxy (proxy over direct)")]

    def cell(v: dict[str, float | None]) -> str:
        ratio = v["proxy_over_direct"]
        return f"{v['direct']} / {v['proxy']}" + (f" ({ratio:.2f}x)" if ratio else "")

    for key in ("e2e_p50_ms", "e2e_p99_ms", "consumed_rps", "produced_rps"):
        rows.append((key, cell(compared[key])))
    for lib, figures in compared["by_library"].items():
        for key in ("e2e_p50_ms", "e2e_p99_ms"):
            rows.append((f"{lib} {key}", cell(figures[key])))
    rows.append(("end-to-end within 10 % of direct", str(compared["within_10_percent"])))
    width = max(len(k) for k, _ in rows)
    rule = "-" * (width + 2 + max(len(v) for _, v in rows))
    return "\n".join([rule, *(f"{k:<{width}}  {v}" for k, v in rows), rule])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.load", description=__doc__.split("\n", 1)[0]
    )
    parser.add_argument("--seconds", type=float, default=300.0, help="length of the run")
    parser.add_argument("--consumers", type=int, default=200)
    parser.add_argument("--producers", type=int, default=20)
    parser.add_argument("--rate", type=float, default=500.0, help="records/s, all producers")
    parser.add_argument("--record-bytes", type=int, default=2000, help="value size")
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--group-size", type=int, default=20, help="consumers per group")
    parser.add_argument(
        "--warmup", type=float, help="seconds before steady state (default: min(60, 1/4 run))"
    )
    parser.add_argument("--rss-slope-limit", type=float, default=1.0, help="MiB/min")
    parser.add_argument(
        "--producers-direct",
        action="store_true",
        help="a control: producers connect to Kafka directly, only consumers use the proxy",
    )
    parser.add_argument(
        "--arrangement",
        choices=("proxy", "direct", "both"),
        default="proxy",
        help="proxy: every client through one proxy (default); direct: the same clients "
        "straight to Kafka (the baseline); both: direct, then proxy, and a comparison",
    )
    parser.add_argument("--proxy-args", default=DEFAULT_PROXY_ARGS, help="more proxy flags")
    parser.add_argument("--upstream", help="an existing Kafka (HOST:PORT) instead of a new one")
    parser.add_argument("--topic", help="topic to create (default: load-<random>)")
    parser.add_argument("--out", type=Path, help="output directory (default var/load/<time>)")
    opts = parser.parse_args(argv)
    if not (0 < opts.seconds <= MAX_SECONDS):
        parser.error(f"--seconds must be in (0, {MAX_SECONDS:.0f}]")
    if not (0 <= opts.consumers <= MAX_CLIENTS and 0 <= opts.producers <= MAX_CLIENTS):
        parser.error(f"--consumers and --producers must be in [0, {MAX_CLIENTS}]")
    if opts.group_size > opts.partitions:
        parser.error("--group-size must not exceed --partitions (every consumer gets data)")
    if opts.warmup is None:
        opts.warmup = min(60.0, opts.seconds / 4)
    opts.topic = opts.topic or f"load-{uuid.uuid4().hex[:8]}"
    # SIGTERM unwinds like Ctrl-C: the finally blocks stop the clients, the proxy and Kafka.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    return run(opts)


if __name__ == "__main__":
    sys.exit(main())
