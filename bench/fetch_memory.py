"""Peak RSS of the proxy process while many consumers drain a topic under a memory budget.

The scenario of tests/integration/test_shaping_budget_clients.py, as a
measurement: a 3-node dev cluster (a thread of this process), the real
``kafka-fetch-proxy run`` process in front of it with ``memory_budget_bytes``,
N confluent-kafka consumers each reading every record.  Reports the proxy's
own accounting (``memory_budget_summary``) and its RSS growth (``VmHWM`` at
the end minus ``VmRSS`` with every consumer connected and idle), per run.

    .venv/bin/python bench/fetch_memory.py                      # this tree, 3 runs
    .venv/bin/python bench/fetch_memory.py --rev HEAD~5 --runs 2  # also a git revision's proxy
    .venv/bin/python bench/fetch_memory.py --trace /tmp/top.txt   # tracemalloc top sites

``--rev`` exports that revision's ``proxy`` package into a temporary directory
and runs it the same way, alternating with this tree's, so both see the same
machine load.  Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import confluent_kafka  # noqa: E402
from support.cluster import ThreadedCluster  # noqa: E402

PARTITIONS = 6
PER_PARTITION = 1500
VALUE = 1000
IDLE_SECONDS = 3.0
DEADLINE = 150.0


def _consume(bootstrap: str, topic: str, progress: list[int], index: int) -> None:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "queued.max.messages.kbytes": 2048,
        }
    )
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        deadline = time.monotonic() + DEADLINE
        while progress[index] < PARTITIONS * PER_PARTITION and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is None:
                    progress[index] += 1
    finally:
        consumer.close()


def _status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"no {field} for pid {pid}")


def run_once(cwd: Path, budget: int, consumers: int, trace: Path | None) -> dict[str, Any]:
    topic = "bulk"
    with (
        ThreadedCluster(nodes=3, topics={topic: PARTITIONS}) as cluster,
        tempfile.TemporaryDirectory() as tmp,
    ):
        config = Path(tmp) / "proxy.toml"
        config.write_text(
            f'upstream = ["{cluster.bootstrap}"]\nlisten = "127.0.0.1:0"\n'
            f'broker_port_base = 0\nlog_level = "info"\nmemory_budget_bytes = {budget}\n'
        )
        args = ["run", "--config", str(config)]
        if trace is None:
            cmd = [sys.executable, "-m", "proxy", *args]
        else:
            cmd = [sys.executable, str(REPO / "bench" / "traced_proxy.py"), str(trace), "--", *args]
        env = dict(os.environ, PYTHONPATH=str(cwd))
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env
        )
        lines: queue.Queue[str] = queue.Queue()
        events: list[dict[str, Any]] = []

        def read_out() -> None:
            for line in proc.stdout or ():
                lines.put(line.strip())

        def read_err() -> None:
            for line in proc.stderr or ():
                if line.startswith("{"):
                    events.append(json.loads(line))

        threading.Thread(target=read_out, daemon=True).start()
        threading.Thread(target=read_err, daemon=True).start()
        try:
            while not (line := lines.get(timeout=30)).startswith("bootstrap="):
                pass
            bootstrap = line.split("=", 1)[1]
            progress = [0] * consumers
            threads = [
                threading.Thread(target=_consume, args=(bootstrap, topic, progress, i))
                for i in range(consumers)
            ]
            for t in threads:
                t.start()
            time.sleep(IDLE_SECONDS)
            baseline = _status_kib(proc.pid, "VmRSS")
            producer = confluent_kafka.Producer(
                {"bootstrap.servers": cluster.bootstrap, "linger.ms": 20}
            )
            for i in range(PER_PARTITION):
                for p in range(PARTITIONS):
                    producer.produce(topic, os.urandom(VALUE), partition=p)
                if i % 200 == 0:
                    producer.poll(0)
            producer.flush(60)
            del producer
            started = time.monotonic()
            for t in threads:
                t.join(DEADLINE + 30)
            drained = time.monotonic() - started
            peak = _status_kib(proc.pid, "VmHWM")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=30)
    summary = next((e for e in events if e.get("event") == "memory_budget_summary"), {})
    return {
        "complete": progress == [PARTITIONS * PER_PARTITION] * consumers,
        "baseline_mib": baseline / 1024,
        "peak_mib": peak / 1024,
        "growth_mib": (peak - baseline) / 1024,
        "accounted_peak_mib": summary.get("peak_bytes", 0) / 2**20,
        "overshoot": summary.get("overshoot_bytes"),
        "drain_s": drained,
    }


def export(rev: str, into: Path) -> Path:
    archive = subprocess.run(
        ["git", "archive", rev, "proxy"], cwd=REPO, check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--budget-mib", type=int, default=64)
    parser.add_argument("--consumers", type=int, default=50)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rev", help="also measure this git revision's proxy package")
    parser.add_argument("--trace", type=Path, help="tracemalloc report of the (last) run here")
    opts = parser.parse_args()
    budget = opts.budget_mib << 20
    trees = {"tree": REPO}
    with tempfile.TemporaryDirectory() as tmp:
        if opts.rev:
            trees[opts.rev] = export(opts.rev, Path(tmp))
        results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
        for n in range(opts.runs):
            for name, cwd in trees.items():
                trace = (
                    opts.trace if (opts.trace and name == "tree" and n == opts.runs - 1) else None
                )
                r = run_once(cwd, budget, opts.consumers, trace)
                results[name].append(r)
                print(
                    f"{name:>10} run {n + 1}: RSS {r['baseline_mib']:.0f} -> {r['peak_mib']:.0f} MiB"
                    f" (+{r['growth_mib']:.1f}), accounted peak {r['accounted_peak_mib']:.1f} MiB,"
                    f" overshoot {r['overshoot']}, drained in {r['drain_s']:.1f}s,"
                    f" complete={r['complete']}",
                    flush=True,
                )
    for name, rs in results.items():
        growth = [r["growth_mib"] for r in rs]
        print(
            f"{name:>10}: RSS growth over {len(rs)} runs: median {statistics.median(growth):.1f},"
            f" max {max(growth):.1f} MiB (budget {opts.budget_mib} MiB)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
