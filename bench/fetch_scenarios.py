"""Issue 17's scenarios (g)-(j): shaped consumption, idle consumers, budget starvation, Kafka's tools.

Registered beside the six of ``bench/scenarios.py`` (``bench/run.py`` merges
:data:`SCENARIOS`), measured the same way: each case of each scenario once per
arrangement (direct, haproxy, proxy), alternating, ``repetitions`` times, every
``measure`` returning a flat ``{metric: float | None}``.

- ``shaped_partitions`` (g): kcat reads a preloaded topic of 100, 1,000 and 10,000
  partitions through a proxy started with ``--max-records 500 --max-partition-bytes
  65536`` (``shaping_args``); direct and haproxy read it unshaped, which is the baseline
  the issue's ratios are against.  Broker CPU per GB is the broker's price of the caps.
  ``direct_capped`` reads it directly with kcat asking no more per fetch than the
  proxy's caps give (:func:`capped_kcat_options`): what responses of that size cost a
  client and the broker with no proxy, the floor of any shaping proxy.
- ``idle_consumers`` (h): N librdkafka consumers (confluent-kafka, one process) each
  assigned one partition of an empty topic, long-polling with librdkafka's default
  ``fetch.wait.max.ms`` (500 ms) through a proxy with the default memory budget.
  ``ms_per_fetch`` is the mean time between two fetches of one consumer; what the proxy
  adds per fetch is its ``ms_per_fetch`` minus direct's (the report computes it).
- ``budget_starvation`` (i): one normal consumer (a raw connection sending a
  sessionless Fetch of a partition that has data every 10 ms, or as soon as the last
  answer came) alone, and beside ``starvation_hogs`` connections that long-poll an
  empty partition with ``max_bytes`` and ``partition_max_bytes`` of 64 MiB.  Its fetch
  latency is request to whole response; a fetch still unanswered at the end of the
  window counts with the time it has waited, so a starved consumer shows as a p99 of
  the window's length, not as no numbers.
- ``kafka_tools`` (j): Apache Kafka's own ``ConsumerPerformance``
  (kafka-consumer-perf-test) reading a preloaded topic, and ``EndToEndLatency``
  (one record at a time, produce then consume, acks=1), from the ``kafka-tools``
  artifact set (``tests/jvm/kafka-tools``, the broker's version; ``scripts/setup
  --test`` resolves it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import struct
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import confluent_kafka

from . import fetchloop
from .scenarios import (
    FETCH,
    Numbers,
    Probe,
    Sample,
    Scenario,
    Shaping,
    Sizes,
    _metric_delta,
    _per,
    _quantile,
    _relay_cpu,
    _stats_totals,
    leader_address,
    preload,
)
from .stack import Arrangement, Stack

MIB = 1 << 20


def _topic(stack: Stack, prefix: str, partitions: int) -> str:
    """A new topic, given time for its leaders on a loaded machine (a 1,000-partition
    topic took over 60 s with the machine's load average at 20)."""
    assert stack.cluster is not None
    return stack.cluster.create_topic(
        f"{prefix}-{uuid.uuid4().hex[:8]}",
        partitions,
        timeout=min(290.0, max(180.0, partitions / 20)),
    )


BUDGET_WAITS = "kafka_fetch_proxy_memory_budget_waits_total"


# -- (g) shaped consumption against partition count -------------------------------------------

DIRECT_CAPPED = "direct_capped"
"""Direct connections, kcat itself asking at most what the proxy's caps let through."""


def capped_kcat_options(sizes: Sizes) -> tuple[str, ...]:
    """librdkafka settings for responses no larger than ``shaping_args`` make them (read
    by the proxy's own parser): the partition cap as ``fetch.message.max.bytes``
    (max.partition.fetch.bytes), the record cap as ``fetch.max.bytes`` of that many
    records (librdkafka has no record cap; it wants ``message.max.bytes`` no larger than
    ``fetch.max.bytes``)."""
    from proxy import config

    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    args = parser.parse_args(["--upstream", "127.0.0.1:9092", *sizes.shaping_args])
    limits = config.FetchPathConfig.from_raw(config.from_args(args, {}).raw).limits
    records, partition = limits.max_records, limits.max_partition_bytes
    if records is None or partition is None:
        flag = "--max-records" if records is None else "--max-partition-bytes"
        raise ValueError(
            f"shaping_args {list(sizes.shaping_args)} have no {flag}: no capped direct read"
        )
    response = records * sizes.record_bytes
    return (
        "-X", f"fetch.message.max.bytes={partition}",
        "-X", f"fetch.max.bytes={response}",
        "-X", f"message.max.bytes={response}",
    )  # fmt: skip


class ShapedPartitions(Shaping):
    """(g) as ``shaping``, over 100 / 1,000 / 10,000 partitions and a smaller topic."""

    name = "shaped_partitions"
    title = "Shaped consumption against partition count (g)"
    description = (
        "kcat (librdkafka) reads every record of a topic preloaded with `shaped_mb` MB of 1 KiB "
        "records (uncompressed) over `shaped_partitions` partitions, from the beginning. The "
        "proxy is a second process started with `shaping_args` (`--max-records 500 "
        "--max-partition-bytes 65536`); direct and haproxy read unshaped: that is the baseline. "
        "direct_capped: direct again, kcat asking per fetch no more than the caps let through "
        "(fetch.max.bytes of `max-records` records, fetch.message.max.bytes the partition cap): "
        "what responses of that size cost with no proxy. "
        "broker_cpu_s_per_gb: the broker's CPU seconds per GB of records delivered; "
        "upstream_over_delivered: record bytes from the broker over record bytes delivered."
    )

    def cases(self, sizes: Sizes) -> list[str]:
        return [f"{p} partitions" for p in sizes.shaped_partitions]

    def arrangements(self, stack: Stack) -> list[Arrangement]:
        direct, *relays, proxy = super().arrangements(stack)
        capped = Arrangement(DIRECT_CAPPED, direct.bootstrap, None)
        return [direct, *relays, capped, proxy]

    def kcat_options(self, arr: Arrangement, sizes: Sizes) -> tuple[str, ...]:
        return capped_kcat_options(sizes) if arr.name == DIRECT_CAPPED else ()

    def prepare(self, stack: Stack, sizes: Sizes) -> None:
        assert stack.cluster is not None
        self.records = max(1, sizes.shaped_mb * 1_000_000 // sizes.record_bytes)
        self._prepare_warm_up(stack, sizes)
        for case, count in zip(self.cases(sizes), sizes.shaped_partitions, strict=True):
            topic = _topic(stack, "shaped", count)
            preload(stack.cluster.bootstrap, topic, count, self.records, sizes, "none")
            self.topics[case] = topic
        self.proxy = stack.start_proxy(self.proxy_args(sizes), "proxy-shaped")


# -- (h) idle consumers under the default budget ----------------------------------------------

IDLE_CONSUMER_PARTITIONS = 10


class IdleConsumers(Scenario):
    """(h) N idle librdkafka consumers long-polling through the default memory budget."""

    name = "idle_consumers"
    title = "Idle consumers under the default memory budget (h)"
    description = (
        "N confluent-kafka consumers (librdkafka, threads of one process), each assigned one of "
        f"{IDLE_CONSUMER_PARTITIONS} partitions of an empty topic, long-poll with librdkafka's "
        "defaults (fetch.wait.max.ms 500) through the proxy's default settings (128 MiB "
        "budget). Fetches are librdkafka's own count (statistics, `req.Fetch`) over the "
        "window; ms_per_fetch is the mean, over consumers, of the window over that consumer's "
        "fetches (500 ms plus what the path adds); budget_waits_per_s: the proxy's "
        "memory_budget_waits_total."
    )

    def __init__(self) -> None:
        self.topic = ""

    def cases(self, sizes: Sizes) -> list[str]:
        return [f"{n} consumers" for n in sizes.idle_consumers]

    def prepare(self, stack: Stack, sizes: Sizes) -> None:
        self.topic = _topic(stack, "idlec", IDLE_CONSUMER_PARTITIONS)

    def measure(self, stack: Stack, arr: Arrangement, case: str, sizes: Sizes) -> Numbers:
        n = int(case.split()[0])
        probe = Probe(arr, stack.broker_pid)
        stats_ms = int(max(100, min(1000, sizes.idle_seconds * 1000 / 4)))
        # per consumer: (monotonic seconds, librdkafka's Fetch requests so far)
        marks: list[list[tuple[float, float]]] = [[] for _ in range(n)]

        def on_stats(i: int) -> Callable[[str], None]:
            def cb(js: str) -> None:
                fetches, _ = _stats_totals(json.loads(js))
                marks[i].append((time.monotonic(), fetches))

            return cb

        group = f"idlec-{uuid.uuid4().hex[:8]}"
        consumers: list[Any] = []
        try:
            for i in range(n):
                c = confluent_kafka.Consumer(
                    {
                        "bootstrap.servers": arr.bootstrap,
                        "group.id": group,
                        "enable.auto.commit": False,
                        "statistics.interval.ms": stats_ms,
                        "stats_cb": on_stats(i),
                        "log_level": 0,
                    }
                )
                c.assign(
                    [confluent_kafka.TopicPartition(self.topic, i % IDLE_CONSUMER_PARTITIONS, 0)]
                )
                consumers.append(c)
            window: list[Sample] = []

            def poll_until(deadline: float) -> None:
                while time.monotonic() < deadline:
                    for c in consumers:
                        c.poll(0)
                    time.sleep(0.02)

            poll_until(time.monotonic() + sizes.idle_warmup)
            window.append(probe.sample())
            poll_until(time.monotonic() + sizes.idle_seconds)
            window.append(probe.sample())
            poll_until(time.monotonic() + 2.5 * stats_ms / 1000)  # the stats after the window
        finally:
            for c in consumers:
                c.close()
        a, b = window
        rates: list[float] = []
        intervals: list[float] = []
        for points in marks:
            inside = [
                (t, f)
                for t, f in points
                if a.at - stats_ms / 1000 <= t <= b.at + 2 * stats_ms / 1000
            ]
            if len(inside) < 2:
                raise RuntimeError("idle_consumers: too few librdkafka statistics in the window")
            (t0, f0), (t1, f1) = inside[0], inside[-1]
            rates.append((f1 - f0) / (t1 - t0))
            intervals.append((t1 - t0) / (f1 - f0) * 1000 if f1 > f0 else (t1 - t0) * 1000)
        seconds = b.at - a.at
        fetches = sum(rates) * seconds
        relay_fetches = fetches
        if arr.proxy is not None:
            relay_fetches = _metric_delta(a, b, FETCH)
        return {
            "fetches_per_s": sum(rates),
            "ms_per_fetch": sum(intervals) / len(intervals),
            "max_ms_per_fetch": max(intervals),
            "relay_core_percent": _per(_relay_cpu(a, b), seconds, 100),
            "relay_cpu_ms_per_fetch": _per(_relay_cpu(a, b), relay_fetches, 1000),
            "budget_waits_per_s": (
                _metric_delta(a, b, BUDGET_WAITS) / seconds if arr.proxy is not None else None
            ),
        }


# -- (i) budget starvation --------------------------------------------------------------------

NORMAL_INTERVAL = 0.010
NORMAL_PARTITION_BYTES = 65536
HOG_BYTES = 64 * MIB


def fetch_frame(
    topic: str,
    offset: int,
    *,
    max_wait_ms: int,
    max_bytes: int,
    partition_max_bytes: int,
    correlation_id: int = 0,
) -> bytearray:
    """A length-prefixed sessionless Fetch v12 of partition 0 from *offset*."""
    from support.rawclient import make_request

    from proxy.protocol import codec

    request = make_request(
        1,
        12,
        {
            "replica_id": -1,
            "max_wait": max_wait_ms,
            "min_bytes": 1,
            "max_bytes": max_bytes,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": offset,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": partition_max_bytes,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )
    frame = codec.encode_request(request, correlation_id, "bench-starvation")
    return bytearray(struct.pack(">i", len(frame)) + frame)


async def starvation(
    normal_address: str,
    normal_topic: str,
    normal_records: int,
    hog_address: str,
    hog_topic: str,
    *,
    hogs: int,
    hog_wait_ms: int,
    warmup: float,
    duration: float,
    on_window_start: Callable[[], None],
    on_window_end: Callable[[], None],
) -> tuple[list[float], int]:
    """(the normal consumer's fetch latencies in the window, in ms; the hogs' answers)."""
    host, _, port = hog_address.rpartition(":")
    hog_conns = await fetchloop._open(host, int(port), hogs) if hogs else []
    host, _, port = normal_address.rpartition(":")
    ((reader, writer),) = await fetchloop._open(host, int(port), 1)
    stride = max(1, normal_records // 64)
    frames = [
        fetch_frame(
            normal_topic,
            (k * stride) % normal_records,
            max_wait_ms=500,
            max_bytes=1 * MIB,
            partition_max_bytes=NORMAL_PARTITION_BYTES,
        )
        for k in range(64)
    ]
    hog_answers = 0
    latencies: list[float] = []
    window = [0.0, 0.0]
    pending: list[float] = []  # the send time of the normal fetch in flight, if any

    async def hog(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        nonlocal hog_answers
        frame = fetch_frame(
            hog_topic,
            0,
            max_wait_ms=hog_wait_ms,
            max_bytes=HOG_BYTES,
            partition_max_bytes=HOG_BYTES,
        )
        cid = 0
        while True:
            cid += 1
            struct.pack_into(">i", frame, 8, cid)
            w.write(frame)
            await fetchloop._read_frame(r)
            hog_answers += 1

    async def normal() -> None:
        cid = 0
        next_at = time.monotonic()
        while True:
            cid += 1
            frame = frames[cid % len(frames)]
            struct.pack_into(">i", frame, 8, cid)
            sent = time.monotonic()
            pending[:] = [sent]
            writer.write(frame)
            await fetchloop._read_frame(reader)
            done = time.monotonic()
            pending.clear()
            if window[0] and sent >= window[0] and not window[1]:
                latencies.append((done - sent) * 1000)
            next_at = max(next_at + NORMAL_INTERVAL, done)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))

    tasks = [asyncio.create_task(hog(r, w)) for r, w in hog_conns]
    try:
        await asyncio.sleep(warmup / 2)  # the hogs take their grants first
        tasks.append(asyncio.create_task(normal()))
        await asyncio.sleep(warmup / 2)
        for task in tasks:
            if task.done():
                task.result()
        on_window_start()
        hogs_before = hog_answers
        window[0] = time.monotonic()
        await asyncio.sleep(duration)
        window[1] = time.monotonic()
        on_window_end()
        if pending:  # unanswered at the end: counts with its wait so far
            latencies.append((window[1] - pending[0]) * 1000)
        for task in tasks:
            if task.done():
                task.result()
        return latencies, hog_answers - hogs_before
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await fetchloop._close([*hog_conns, (reader, writer)])


class BudgetStarvation(Scenario):
    """(i) a normal consumer's fetch latency, alone and beside connections hoarding budget."""

    name = "budget_starvation"
    title = "Budget starvation: a normal consumer beside long polls with large max_bytes (i)"
    description = (
        "A normal consumer (one raw connection, sessionless Fetch v12 of a partition holding "
        "`starvation_records` 1 KiB records, partition_max_bytes 64 KiB, a fetch every 10 ms "
        "or as soon as the last answer came) alone, and beside `starvation_hogs` connections "
        f"long-polling an empty partition (max_wait `starvation_hog_wait_ms`, max_bytes and "
        f"partition_max_bytes {HOG_BYTES // MIB} MiB). Latency: request sent to whole response "
        "read; a fetch unanswered at the window's end counts with its wait so far. "
        "hog_fetches_per_s: answers the long polls got."
    )

    def __init__(self) -> None:
        self.normal_topic = ""
        self.hog_topic = ""

    def cases(self, sizes: Sizes) -> list[str]:
        return ["alone", f"beside {sizes.starvation_hogs} long polls"]

    def prepare(self, stack: Stack, sizes: Sizes) -> None:
        assert stack.cluster is not None
        self.normal_topic = _topic(stack, "starve-normal", 1)
        preload(
            stack.cluster.bootstrap,
            self.normal_topic,
            1,
            sizes.starvation_records,
            sizes,
            "none",
        )
        self.hog_topic = _topic(stack, "starve-hog", 1)

    def measure(self, stack: Stack, arr: Arrangement, case: str, sizes: Sizes) -> Numbers:
        hogs = 0 if case == "alone" else sizes.starvation_hogs
        probe = Probe(arr, stack.broker_pid)
        edges: list[Sample] = []
        latencies, hog_answers = asyncio.run(
            starvation(
                leader_address(arr.bootstrap, self.normal_topic),
                self.normal_topic,
                sizes.starvation_records,
                leader_address(arr.bootstrap, self.hog_topic),
                self.hog_topic,
                hogs=hogs,
                hog_wait_ms=sizes.starvation_hog_wait_ms,
                warmup=sizes.fetch_warmup,
                duration=sizes.starvation_seconds,
                on_window_start=lambda: edges.append(probe.sample()),
                on_window_end=lambda: edges.append(probe.sample()),
            )
        )
        a, b = edges
        ms = sorted(latencies)
        seconds = b.at - a.at
        return {
            "p50_ms": _quantile(ms, 0.5),
            "p99_ms": _quantile(ms, 0.99),
            "max_ms": ms[-1],
            "fetches_per_s": len(ms) / seconds,
            "hog_fetches_per_s": hog_answers / seconds if hogs else None,
            "relay_core_percent": _per(_relay_cpu(a, b), seconds, 100),
            "budget_waits_per_s": (
                _metric_delta(a, b, BUDGET_WAITS) / seconds if arr.proxy is not None else None
            ),
        }


# -- (j) Kafka's own tools --------------------------------------------------------------------

TOOLS_JVM_OPTS = ("-Xmx512m", "-XX:+UseG1GC", "-Djava.awt.headless=true")
PERF = "org.apache.kafka.tools.ConsumerPerformance"
E2E = "org.apache.kafka.tools.EndToEndLatency"


def tools_command(main: str, *args: str) -> list[str]:
    from support.kafka import java, jvm_lib

    return [java(), *TOOLS_JVM_OPTS, "-cp", f"{jvm_lib('kafka-tools')}/*", main, *args]


def run_tool(cmd: list[str], timeout: float) -> str:
    try:
        proc = subprocess.run(
            cmd, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
        )
    except subprocess.TimeoutExpired as exc:  # subprocess.run kills the child itself
        raise RuntimeError(f"{cmd[-12:]} did not finish in {timeout:.0f} s") from exc
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(cmd[4:6])} exited {proc.returncode}: {(proc.stdout + proc.stderr)[-1500:]}"
        )
    return proc.stdout


def parse_consumer_performance(out: str) -> dict[str, float]:
    """The CSV line of ``ConsumerPerformance --hide-header`` (4.x column order)."""
    for line in reversed(out.strip().splitlines()):
        cells = [c.strip() for c in line.split(",")]
        if len(cells) >= 10:
            try:
                return {
                    "mib": float(cells[2]),
                    "records": float(cells[4]),
                    "rebalance_ms": float(cells[6]),
                    "fetch_ms": float(cells[7]),
                }
            except ValueError:
                continue
    raise RuntimeError(f"no result line in ConsumerPerformance's output: {out[-800:]!r}")


def parse_end_to_end(out: str) -> dict[str, float]:
    """``Avg latency: X ms`` and ``Percentiles: 50th = a, 99th = b, 99.9th = c`` (ms)."""
    avg = re.search(r"Avg latency:\s*([\d.]+)", out)
    pct = re.search(r"50th = ([\d.]+), 99th = ([\d.]+), 99.9th = ([\d.]+)", out)
    if avg is None or pct is None:
        raise RuntimeError(f"no latency lines in EndToEndLatency's output: {out[-800:]!r}")
    return {
        "avg_ms": float(avg[1]),
        "p50_ms": float(pct[1]),
        "p99_ms": float(pct[2]),
        "p999_ms": float(pct[3]),
    }


class KafkaTools(Scenario):
    """(j) kafka-consumer-perf-test (ConsumerPerformance) and EndToEndLatency, Kafka's own."""

    name = "kafka_tools"
    title = "Apache Kafka's own tools: ConsumerPerformance and EndToEndLatency (j)"
    description = (
        "Kafka's `org.apache.kafka.tools.ConsumerPerformance` (kafka-consumer-perf-test, a Java "
        "consumer in a group of its own) reads every record of a topic preloaded with "
        "`tools_mb` MB of 1 KiB records over 8 partitions; mb_per_s is record bytes over its "
        "fetch time (its fetch.time.ms: group join excluded). `EndToEndLatency` sends "
        "`tools_latency_records` records of 100 bytes one at a time (acks=1) and consumes each "
        "before the next; its average and percentiles (whole ms as the tool prints them). "
        "Both from the kafka-tools artifact set at the broker's version, one JVM per run."
    )
    PARTITIONS = 8

    def __init__(self) -> None:
        self.perf_topic = ""
        self.e2e_topic = ""
        self.records = 0

    def cases(self, sizes: Sizes) -> list[str]:
        return ["ConsumerPerformance", "EndToEndLatency"]

    def prepare(self, stack: Stack, sizes: Sizes) -> None:
        assert stack.cluster is not None
        tools_command(PERF)  # fails now, naming the missing artifact set, not mid-run
        self.records = max(1, sizes.tools_mb * 1_000_000 // sizes.record_bytes)
        self.perf_topic = _topic(stack, "perf", self.PARTITIONS)
        preload(
            stack.cluster.bootstrap, self.perf_topic, self.PARTITIONS, self.records, sizes, "none"
        )
        self.e2e_topic = _topic(stack, "e2e", 1)

    def measure(self, stack: Stack, arr: Arrangement, case: str, sizes: Sizes) -> Numbers:
        probe = Probe(arr, stack.broker_pid)
        if case == "ConsumerPerformance":
            cmd = tools_command(
                PERF,
                "--bootstrap-server", arr.bootstrap,
                "--topic", self.perf_topic,
                "--num-records", str(self.records),
                "--group", f"perf-{uuid.uuid4().hex[:8]}",
                "--timeout", "30000",
                "--hide-header",
            )  # fmt: skip
            before = probe.sample()
            got = parse_consumer_performance(run_tool(cmd, 120 + self.records / 2000))
            after = probe.sample()
            gb = got["records"] * sizes.record_bytes / 1e9
            return {
                "mb_per_s": gb * 1000 / (got["fetch_ms"] / 1000) if got["fetch_ms"] > 0 else None,
                "records": got["records"],
                "rebalance_ms": got["rebalance_ms"],
                "relay_cpu_s_per_gb": _per(_relay_cpu(before, after), gb),
                "broker_cpu_s_per_gb": _per(after.broker_cpu - before.broker_cpu, gb),
            }
        cmd = tools_command(
            E2E,
            "--bootstrap-server", arr.bootstrap,
            "--topic", self.e2e_topic,
            "--num-records", str(sizes.tools_latency_records),
            "--producer-acks", "1",
            "--record-size", "100",
        )  # fmt: skip
        before = probe.sample()
        got = parse_end_to_end(run_tool(cmd, 120 + sizes.tools_latency_records / 50))
        after = probe.sample()
        return {
            "avg_ms": got["avg_ms"],
            "p50_ms": got["p50_ms"],
            "p99_ms": got["p99_ms"],
            "p999_ms": got["p999_ms"],
            "relay_core_percent": _per(_relay_cpu(before, after), after.at - before.at, 100),
        }


SCENARIOS: dict[str, Callable[[], Scenario]] = {
    "shaped_partitions": ShapedPartitions,
    "idle_consumers": IdleConsumers,
    "budget_starvation": BudgetStarvation,
    "kafka_tools": KafkaTools,
}
