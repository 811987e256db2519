"""Rack-aware fetching, measured: cross-rack bytes per GB consumed, and what a follower adds.

    .venv/bin/python -m bench.racks                      # 256 MB preloaded, 20 s latency runs
    .venv/bin/python -m bench.racks --mb 1024 --repetitions 3
    .venv/bin/python -m bench.racks --smoke --out /tmp/r # tiny sizes (the harness only)

Three real Apache Kafka brokers in racks a, b and c (``broker.rack``,
``replica.selector.class=RackAwareReplicaSelector``; ``tests/support/kafka.py``), one
topic of 6 partitions, replication factor 3, leaders on all three brokers, preloaded
with 1 KiB records.  The consumer is in rack b: a librdkafka consumer
(confluent-kafka, assigned every partition from offset 0) reads every record in each
arrangement, one after the other (alternating order over ``--repetitions``):

- ``direct``: straight to the brokers, no ``client.rack``;
- ``direct_rack``: straight to the brokers with ``client.rack=b``;
- ``proxy``: through ``kafka-fetch-proxy run --rack b`` (the sidecar), no client setting;
- ``proxy_norack``: through the proxy without a rack (today's proxy).

Cross-zone bytes are the bytes the pod receives from brokers outside rack b: for a
direct consumer librdkafka's own per-broker ``rxbytes`` (statistics), for the proxy its
``broker_to_proxy_bytes_total{node}`` (client <-> proxy stays in the pod).  Both are
whole response frames, so Metadata and empty long polls count too.  The result is
``cross_rack_mb_per_gb``: MB (1e6 bytes) from other racks per GB (1e9 bytes) of record
keys and values consumed; ``in_rack_share`` is the bytes from the rack-b broker over
all.  Through the proxy, its own rack metrics are read too (``proxy_*``): in-rack
record bytes, cross-zone bytes avoided and the estimated cost avoided.

The latency a follower adds: a follower learns the high watermark from its next fetch
to the leader, so a record becomes visible on it later than on the leader.  A
producer (``acks=all``) writes at a fixed rate to a partition led by the rack-a broker
while three consumers read it at once: the leader (direct, no rack), the rack-b
follower (direct, ``client.rack=b``) and the follower through the proxy, after a
warm-up that has every reader on its replica.  ``p50_ms``/``p99_ms``/``max_ms`` are
produce-to-consume latencies from the record's create time (on a loaded machine they
include the producer's backlog); ``added_*_ms`` are, record by record, when a reader
got it minus when the leader's reader got the same offset: the follower's own delay,
whatever the producer's.

Output: ``results.json`` and ``racks.md`` (a table) in ``--out`` (default
``bench/results/racks-<time>``), the brokers' and the proxy's logs beside them.  Not a
test: it asserts nothing about speed.  Run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import confluent_kafka

from .stack import REPO, ProxyProcess, start_proxy, stop, use_bench_jvm_opts

RACKS = ("a", "b", "c")
CLIENT_RACK = "b"
PARTITIONS = 6
ARRANGEMENTS = ("direct", "direct_rack", "proxy", "proxy_norack")
LATENCY_READERS = ("leader", "follower", "follower_proxy")
RESULTS = REPO / "bench" / "results"
PREFIX = "kafka_fetch_proxy_"

Numbers = dict[str, float | None]


@dataclass
class Sizes:
    repetitions: int = 1
    mb: int = 256
    record_bytes: int = 1024
    latency_seconds: float = 20.0
    latency_rate: int = 200
    """Records per second the latency producer writes."""
    consume_timeout: float = 600.0


SMOKE = Sizes(mb=4, latency_seconds=3.0, latency_rate=100, consume_timeout=120.0)


def _log(message: str) -> None:
    print(f"bench.racks: {message}", file=sys.stderr, flush=True)


# -- the cluster ----------------------------------------------------------------------------


def start_cluster(workdir: Path) -> Any:
    sys.path.insert(0, str(REPO / "tests"))
    from support.kafka import RACK_AWARE, KafkaCluster

    return KafkaCluster(
        3,
        workdir=workdir,
        racks=RACKS,
        config={**RACK_AWARE, "auto.leader.rebalance.enable": "false"},
        name="bench-racks",
    ).start()


def new_topic(cluster: Any, prefix: str) -> str:
    topic = str(cluster.new_topic(PARTITIONS, prefix=prefix))
    leaders = {cluster.leader_of(topic, p) for p in range(PARTITIONS)}
    if leaders != set(cluster.nodes):
        raise RuntimeError(f"{topic}: leaders {leaders} are not spread over the brokers")
    return topic


def preload(bootstrap: str, topic: str, sizes: Sizes) -> int:
    """Write ``sizes.mb`` MB of records (acks=all); the number of records."""
    count = sizes.mb * 1_000_000 // sizes.record_bytes
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "compression.type": "none"}
    )
    values = [os.urandom(sizes.record_bytes) for _ in range(64)]
    for i in range(count):
        while True:
            try:
                producer.produce(topic, values[i % 64], partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.1)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(300) != 0:
        raise RuntimeError("preload: records left unsent")
    return count


# -- cross-rack bytes ---------------------------------------------------------------------


class BrokerBytes:
    """librdkafka's per-broker received bytes, from its statistics callback."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.rx: dict[int, int] = {}

    def __call__(self, stats_json: str) -> None:
        stats = json.loads(stats_json)
        with self.lock:
            for broker in stats.get("brokers", {}).values():
                node = int(broker.get("nodeid", -1))
                if node >= 0:
                    self.rx[node] = max(self.rx.get(node, 0), int(broker.get("rxbytes", 0)))


def consume_all(
    bootstrap: str, topic: str, count: int, timeout: float, **config: Any
) -> tuple[int, BrokerBytes]:
    """Read *count* records of every partition from offset 0; (record bytes, broker bytes)."""
    rx = BrokerBytes()
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-racks-{time.monotonic_ns()}",
            "enable.auto.commit": False,
            "statistics.interval.ms": 200,
            "stats_cb": rx,
            **config,
        }
    )
    consumer.assign([confluent_kafka.TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    seen = nbytes = 0
    deadline = time.monotonic() + timeout
    try:
        while seen < count:
            if time.monotonic() > deadline:
                raise TimeoutError(f"consumed {seen}/{count} records in {timeout} s")
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is None:
                    seen += 1
                    nbytes += len(msg.value() or b"") + len(msg.key() or b"")
        # one more statistics interval, so rxbytes covers the last responses
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            consumer.poll(0.1)
    finally:
        consumer.close()
    return nbytes, rx


def _proxy_bytes(proxy: ProxyProcess) -> dict[str, float]:
    return proxy.scrape()


def _by_node(samples: dict[str, float], name: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for key, value in samples.items():
        if key.startswith(PREFIX + name + "{") and 'node="' in key:
            node = key.split('node="', 1)[1].split('"', 1)[0]
            if node.isdigit():
                out[int(node)] = out.get(int(node), 0.0) + value
    return out


def _sum(samples: dict[str, float], name: str, label: str = "") -> float:
    return sum(v for k, v in samples.items() if k.startswith(PREFIX + name) and (label in k))


def cross_rack(
    cluster: Any,
    topic: str,
    count: int,
    arrangement: str,
    proxies: dict[str, ProxyProcess],
    sizes: Sizes,
) -> Numbers:
    in_rack_node = cluster.node_in_rack(CLIENT_RACK)
    proxy = proxies.get(arrangement)
    if proxy is None:
        config = {"client.rack": CLIENT_RACK} if arrangement == "direct_rack" else {}
        started = time.monotonic()
        consumed, rx = consume_all(cluster.bootstrap, topic, count, sizes.consume_timeout, **config)
        seconds = time.monotonic() - started
        by_node = {n: float(b) for n, b in rx.rx.items()}
        extra: Numbers = {}
    else:
        before = _proxy_bytes(proxy)
        started = time.monotonic()
        consumed, _ = consume_all(proxy.bootstrap, topic, count, sizes.consume_timeout)
        seconds = time.monotonic() - started
        time.sleep(0.2)  # the last response's counters
        after = _proxy_bytes(proxy)
        b0, b1 = (_by_node(s, "broker_to_proxy_bytes_total") for s in (before, after))
        by_node = {n: b1.get(n, 0.0) - b0.get(n, 0.0) for n in b1}
        rack = "broker_to_proxy_fetch_rack_record_bytes_total"

        def delta(name: str, label: str = "") -> float:
            return _sum(after, name, label) - _sum(before, name, label)

        same = delta(rack, 'locality="same_rack"')
        total = delta(rack)
        extra = {
            "proxy_in_rack_record_share": same / total if total else None,
            "proxy_cross_zone_avoided_mb": delta("cross_zone_avoided_record_bytes_total") / 1e6,
            "proxy_cost_avoided_usd": delta("cross_zone_cost_avoided"),
            "proxy_redirects": delta("preferred_replica_redirects_total"),
        }
    total = sum(by_node.values())
    other = sum(v for n, v in by_node.items() if n != in_rack_node)
    gb = consumed / 1e9
    return {
        "consumed_mb": consumed / 1e6,
        "received_mb": total / 1e6,
        "cross_rack_mb": other / 1e6,
        "cross_rack_mb_per_gb": (other / 1e6) / gb if gb else None,
        "in_rack_share": (total - other) / total if total else None,
        "seconds": seconds,
        **extra,
    }


# -- the latency a follower adds -------------------------------------------------------


def _reader(
    bootstrap: str,
    topic: str,
    partition: int,
    stop_at: list[float],
    out: list[float],
    seen: dict[int, float],
    **config: Any,
) -> Callable[[], None]:
    def run() -> None:
        consumer = confluent_kafka.Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-latency-{time.monotonic_ns()}",
                "enable.auto.commit": False,
                "fetch.wait.max.ms": 100,
                **config,
            }
        )
        consumer.assign([confluent_kafka.TopicPartition(topic, partition, 0)])
        try:
            while not stop_at or time.time() < stop_at[0]:
                msg = consumer.poll(0.1)
                if msg is not None and msg.error() is None:
                    now = time.time() * 1000.0
                    seen[int(msg.offset())] = now
                    kind, ts = msg.timestamp()
                    if kind == confluent_kafka.TIMESTAMP_CREATE_TIME:
                        out.append(now - ts)
        finally:
            consumer.close()

    return run


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def follower_latency(cluster: Any, proxy: ProxyProcess, sizes: Sizes) -> dict[str, Numbers]:
    topic = new_topic(cluster, "bench-latency")
    leader_rack = next(r for r in RACKS if r != CLIENT_RACK)
    leader = cluster.node_in_rack(leader_rack)
    partition = next(p for p in range(PARTITIONS) if cluster.leader_of(topic, p) == leader)
    samples: dict[str, list[float]] = {name: [] for name in LATENCY_READERS}
    seen: dict[str, dict[int, float]] = {name: {} for name in LATENCY_READERS}
    """reader -> offset -> when it got the record (ms since the epoch)."""
    stop_at: list[float] = []
    readers = {
        "leader": _reader(
            cluster.bootstrap, topic, partition, stop_at, samples["leader"], seen["leader"]
        ),
        "follower": _reader(
            cluster.bootstrap,
            topic,
            partition,
            stop_at,
            samples["follower"],
            seen["follower"],
            **{"client.rack": CLIENT_RACK},
        ),
        "follower_proxy": _reader(
            proxy.bootstrap,
            topic,
            partition,
            stop_at,
            samples["follower_proxy"],
            seen["follower_proxy"],
        ),
    }
    threads = [threading.Thread(target=r, name=n, daemon=True) for n, r in readers.items()]
    for t in threads:
        t.start()
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 0}
    )
    # warm-up: every reader has found the partition (the followers: been redirected and
    # read from the follower) and the producer its leader before timing starts
    warm_up = 20
    for _ in range(warm_up):
        producer.produce(topic, b"w" * 100, partition=partition)
    producer.flush(60)
    deadline = time.monotonic() + 120.0
    while any(len(s) < warm_up for s in samples.values()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"latency warm-up: { ({n: len(s) for n, s in samples.items()}) }")
        time.sleep(0.1)
    time.sleep(1.0)
    for s in samples.values():
        s.clear()
    first = max(max(v, default=-1) for v in seen.values()) + 1
    """The first offset timed (the warm-up's are not)."""
    interval = 1.0 / sizes.latency_rate
    end = time.monotonic() + sizes.latency_seconds
    next_at = time.monotonic()
    while time.monotonic() < end:
        producer.produce(topic, b"x" * 100, partition=partition)
        producer.poll(0)
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
    producer.flush(30)
    stop_at.append(time.time() + 2.0)
    for t in threads:
        t.join(30)
    lead = seen["leader"]
    out: dict[str, Numbers] = {}
    for name, values in samples.items():
        # per record: when this reader got it minus when the leader's reader did
        added = [t - lead[o] for o, t in seen[name].items() if o >= first and o in lead]
        out[name] = {
            "records": float(len(values)),
            "p50_ms": _quantile(values, 0.5),
            "p99_ms": _quantile(values, 0.99),
            "max_ms": max(values) if values else None,
            "added_p50_ms": _quantile(added, 0.5),
            "added_p99_ms": _quantile(added, 0.99),
            "added_max_ms": max(added) if added else None,
        }
    return out


# -- report -----------------------------------------------------------------------------


def _mean(runs: list[Numbers], key: str) -> float | None:
    values = [r[key] for r in runs if r.get(key) is not None]
    return statistics.fmean(v for v in values if v is not None) if values else None


def markdown(results: dict[str, Any]) -> str:
    def fmt(v: float | None, spec: str = ".1f") -> str:
        return "-" if v is None else format(v, spec)

    lines = [
        "### Rack-aware fetching (`python -m bench.racks`)",
        "",
        f"Consumer in rack {CLIENT_RACK}; 3 brokers in racks {', '.join(RACKS)}; "
        f"{results['sizes']['mb']} MB preloaded over {PARTITIONS} partitions (RF 3, leaders "
        f"spread), librdkafka {confluent_kafka.libversion()[0]}; mean of "
        f"{results['sizes']['repetitions']} run(s).",
        "",
        "| arrangement | cross-rack MB per GB consumed | in-rack share of bytes received "
        "| MB received | seconds |",
        "|---|---|---|---|---|",
    ]
    for arr in ARRANGEMENTS:
        runs = results["cross_rack"].get(arr, [])
        lines.append(
            f"| {arr} | {fmt(_mean(runs, 'cross_rack_mb_per_gb'))} | "
            f"{fmt(_mean(runs, 'in_rack_share'), '.4f')} | {fmt(_mean(runs, 'received_mb'))} | "
            f"{fmt(_mean(runs, 'seconds'))} |"
        )
    proxy = results["cross_rack"].get("proxy", [])
    if proxy:
        lines += [
            "",
            "Through the proxy (its own metrics): in-rack share of record bytes "
            f"{fmt(_mean(proxy, 'proxy_in_rack_record_share'), '.4f')}, cross-zone bytes "
            f"avoided {fmt(_mean(proxy, 'proxy_cross_zone_avoided_mb'))} MB, estimated cost "
            f"avoided ${fmt(_mean(proxy, 'proxy_cost_avoided_usd'), '.5f')} at $0.02/GB.",
        ]
    lines += [
        "",
        f"Latency a follower adds ({results['sizes']['latency_rate']} records/s for "
        f"{results['sizes']['latency_seconds']} s, acks=all; p50/p99/max: produce to "
        "consume; added: per record, after the leader's reader got it):",
        "",
        "| reader | records | p50 ms | p99 ms | max ms | added p50 ms | added p99 ms "
        "| added max ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name in LATENCY_READERS:
        runs = results["latency"].get(name, [])
        lines.append(
            f"| {name} | {fmt(_mean(runs, 'records'), '.0f')} | {fmt(_mean(runs, 'p50_ms'))} | "
            f"{fmt(_mean(runs, 'p99_ms'))} | {fmt(_mean(runs, 'max_ms'))} | "
            f"{fmt(_mean(runs, 'added_p50_ms'))} | {fmt(_mean(runs, 'added_p99_ms'))} | "
            f"{fmt(_mean(runs, 'added_max_ms'))} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.racks", description=__doc__.split("\n\n")[0])
    p.add_argument("--smoke", action="store_true", help="tiny sizes (the harness only)")
    p.add_argument("--mb", type=int, help="MB preloaded and consumed per arrangement")
    p.add_argument("--repetitions", type=int, help="alternating repetitions (default 1)")
    p.add_argument("--latency-seconds", type=float)
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    use_bench_jvm_opts()
    sizes = dataclasses.replace(SMOKE if args.smoke else Sizes())
    for field, value in (
        ("mb", args.mb),
        ("repetitions", args.repetitions),
        ("latency_seconds", args.latency_seconds),
    ):
        if value is not None:
            setattr(sizes, field, value)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out or RESULTS / f"racks-{stamp}{'-smoke' if args.smoke else ''}"
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "load_average_at_start": os.getloadavg(),
        "sizes": dataclasses.asdict(sizes),
        "cross_rack": {},
        "latency": {},
    }
    work = Path(tempfile.mkdtemp(prefix="bench-racks-"))
    cluster = None
    proxies: dict[str, ProxyProcess] = {}
    try:
        _log("starting 3 brokers in racks a, b, c")
        cluster = start_cluster(work / "kafka")
        upstream = next(iter(cluster.nodes.values())).address
        proxies["proxy"] = start_proxy(upstream, work / "proxy.log", ["--rack", CLIENT_RACK])
        proxies["proxy_norack"] = start_proxy(upstream, work / "proxy-norack.log")
        topic = new_topic(cluster, "bench-racks")
        count = preload(cluster.bootstrap, topic, sizes)
        _log(f"preloaded {count} records ({sizes.mb} MB) into {topic}")
        for arr in ARRANGEMENTS:  # connections and listeners warm before anything is timed
            cross_rack(cluster, topic, min(count, 200), arr, proxies, sizes)
        order = list(ARRANGEMENTS)
        for rep in range(sizes.repetitions):
            for arr in order if rep % 2 == 0 else reversed(order):
                numbers = cross_rack(cluster, topic, count, arr, proxies, sizes)
                results["cross_rack"].setdefault(arr, []).append(numbers)
                _log(f"{arr} #{rep + 1}: {numbers}")
            for name, numbers in follower_latency(cluster, proxies["proxy"], sizes).items():
                results["latency"].setdefault(name, []).append(numbers)
                _log(f"latency {name} #{rep + 1}: {numbers}")
        results["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    finally:
        for proxy in proxies.values():
            stop(proxy.proc)
            if proxy.proc.stdout is not None:
                proxy.proc.stdout.close()
        if cluster is not None:
            cluster.stop()
            logs = out / "logs"
            logs.mkdir(exist_ok=True)
            for log in [*work.glob("*.log"), *work.glob("kafka/node-*/server.log")]:
                shutil.copy(log, logs / f"{log.parent.name}-{log.name}")
        shutil.rmtree(work, ignore_errors=True)
        (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "racks.md").write_text(markdown(results))
    print(markdown(results))
    _log(f"results in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
