"""Spark reads Kafka through a running proxy with tight record limits (issue 7).

Real processes: ``kafka-fetch-proxy devbroker`` and ``kafka-fetch-proxy run
--max-records ... --max-partition-records ...``; a known data set is produced
through the proxy with confluent-kafka, then read back with
``spark.read.format("kafka-proxy")`` (batch) and ``spark.readStream`` (two
micro-batches), which read with confluent-kafka consumers pointed at the proxy.
"""

from __future__ import annotations

import tempfile
import urllib.request
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from support.procs import devbroker, proxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

TOPIC = "spark"
PARTITIONS = 6
RECORDS = 3000
DEADLINE_S = 120


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pipeline.kafka_source import KafkaProxySource
    from pipeline.spark import session

    s = session("kafka-fetch-proxy tests", "local[2]")
    s.dataSource.register(KafkaProxySource)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def stack() -> Iterator[dict[str, Any]]:
    """A dev cluster, a shaping proxy in front of it, and a known data set produced through it."""
    from confluent_kafka import Producer

    with (
        devbroker(f"{TOPIC}:{PARTITIONS}") as upstream,
        proxy(upstream, "--max-records", "40", "--max-partition-records", "15") as p,
    ):
        bootstrap = p.lines["bootstrap"]
        producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 2, "batch.num.messages": 10}
        )
        expected: dict[int, list[bytes]] = {i: [] for i in range(PARTITIONS)}
        for i in range(RECORDS):
            value = f"value-{i}-{'x' * (i % 37)}".encode()
            producer.produce(TOPIC, key=str(i).encode(), value=value, partition=i % PARTITIONS)
            expected[i % PARTITIONS].append(value)
            if i % 500 == 0:
                producer.poll(0)
        assert producer.flush(30) == 0
        yield {"bootstrap": bootstrap, "expected": expected, "metrics": p.lines["metrics"]}


def _checksum(values: list[bytes]) -> int:
    return sum(zlib.crc32(v) for v in values)


def _trimmed_records(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kafka_fetch_proxy_trimmed_records_total")
    )


def test_batch_read_through_shaping_proxy(spark: Any, stack: dict[str, Any]) -> None:
    from pyspark.sql import functions as F

    df = (
        spark.read.format("kafka-proxy")
        .option("kafka.bootstrap.servers", stack["bootstrap"])
        .option("subscribe", TOPIC)
        .option("kafkaConsumer.pollTimeoutMs", str(DEADLINE_S * 1000))
        .load()
    )
    per_partition = {
        r["partition"]: r
        for r in df.groupBy("partition")
        .agg(
            F.count("*").alias("n"),
            F.min("offset").alias("lo"),
            F.max("offset").alias("hi"),
            F.countDistinct("offset").alias("distinct"),
            F.sum(F.crc32("value")).alias("checksum"),
        )
        .collect()
    }
    expected = stack["expected"]
    assert sorted(per_partition) == list(range(PARTITIONS))
    for p, values in expected.items():
        row = per_partition[p]
        assert (row["n"], row["distinct"], row["lo"], row["hi"]) == (
            len(values),
            len(values),
            0,
            len(values) - 1,
        )
        assert row["checksum"] == _checksum(values)
    # The proxy really held records back under its limits while Spark read.
    assert _trimmed_records(stack["metrics"]) > 0


def test_stream_two_micro_batches(spark: Any, stack: dict[str, Any]) -> None:
    batches: list[tuple[int, list[tuple[int, int]]]] = []

    def collect(df: Any, batch_id: int) -> None:
        rows = df.select("partition", "offset").collect()
        batches.append((batch_id, [(r["partition"], r["offset"]) for r in rows]))

    stream = (
        spark.readStream.format("kafka-proxy")
        .option("kafka.bootstrap.servers", stack["bootstrap"])
        .option("subscribe", TOPIC)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(RECORDS // 2))
        .load()
    )
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (
            stream.writeStream.foreachBatch(collect)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(DEADLINE_S), "streaming query did not finish in time"
        assert query.exception() is None
    assert [b for b, _ in batches] == [0, 1]
    assert [len(rows) for _, rows in batches] == [RECORDS // 2, RECORDS // 2]
    seen = [x for _, rows in batches for x in rows]
    expected = {(p, o) for p, vs in stack["expected"].items() for o in range(len(vs))}
    assert len(seen) == len(set(seen)) and set(seen) == expected
