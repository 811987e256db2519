"""Spark reads real Kafka through a running proxy with tight record limits.

Real processes: Apache Kafka (the session ``kafka`` fixture) and ``kafka-fetch-proxy run
--max-records 40 --max-partition-records 15`` in front of it.  A known data set (3000
records over 6 partitions, in producer batches of at most 10 records) is produced
straight to Kafka, then read back through the proxy with each source: Spark's own Kafka
connector (``format("kafka")``, the default, its jars from the cache that ``scripts/setup
--test`` fills) and the project's ``kafka-proxy`` data source (the PyPI-only fallback,
confluent-kafka consumers).  Batch reads and ``Trigger.AvailableNow`` streams must return
exactly the records produced: count, offsets per partition and a checksum of the values;
the proxy's metrics show it held records back while Spark read.  One SparkSession (one
JVM) for the module, stopped by its pid at the end.
"""

from __future__ import annotations

import tempfile
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.kafka import KafkaCluster
from support.procs import Started, proxy

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PARTITIONS = 6
RECORDS = 3000
PER_TRIGGER = 1000
DEADLINE_S = 120
SOURCES = ("kafka", "kafka-proxy")
"""Spark's own connector (the default), the project's data source (the fallback)."""


@pytest.fixture(scope="module")
def spark() -> Iterator[Any]:
    from pipeline.kafka_source import KafkaProxySource
    from pipeline.spark import kafka_connector_jars, require_kafka_source, session, stop

    # A missing or stale connector is a set-up failure (ConnectorMissing), never a skip.
    s = session("kafka-fetch-proxy tests", "local[2]", kafka_connector_jars())
    try:
        require_kafka_source(s)
        s.dataSource.register(KafkaProxySource)
        yield s
    finally:
        stop(s)


@pytest.fixture(scope="module")
def data(kafka: KafkaCluster) -> dict[str, Any]:
    """A fresh topic on real Kafka and the values produced to each partition, in order."""
    from confluent_kafka import Producer

    topic = kafka.new_topic(PARTITIONS, prefix="spark")
    producer = Producer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "linger.ms": 2,
            "batch.num.messages": 10,
            "enable.idempotence": True,  # retries never reorder: offsets are asserted
        }
    )
    expected: dict[int, list[bytes]] = {i: [] for i in range(PARTITIONS)}
    for i in range(RECORDS):
        value = f"value-{i}-{'x' * (i % 37)}".encode()
        producer.produce(topic, key=str(i).encode(), value=value, partition=i % PARTITIONS)
        expected[i % PARTITIONS].append(value)
        if i % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    return {"topic": topic, "expected": expected}


@pytest.fixture(scope="module")
def shaping_proxy(kafka: KafkaCluster) -> Iterator[Started]:
    with proxy(kafka.bootstrap, "--max-records", "40", "--max-partition-records", "15") as p:
        yield p


def _checksum(values: list[bytes]) -> int:
    return sum(zlib.crc32(v) for v in values)


def _trimmed_records(p: Started) -> float:
    with urllib.request.urlopen(p.lines["metrics"], timeout=10) as resp:
        text = resp.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("kafka_fetch_proxy_trimmed_records_total")
    )


def _per_partition(df: Any) -> dict[int, tuple[int, int, int, int, int]]:
    """partition -> (rows, distinct offsets, lowest offset, highest offset, value checksum)."""
    from pyspark.sql import functions as F

    rows = (
        df.groupBy("partition")
        .agg(
            F.count("*").alias("n"),
            F.countDistinct("offset").alias("distinct"),
            F.min("offset").alias("lo"),
            F.max("offset").alias("hi"),
            F.sum(F.crc32("value")).alias("checksum"),
        )
        .collect()
    )
    return {r["partition"]: (r["n"], r["distinct"], r["lo"], r["hi"], r["checksum"]) for r in rows}


def _expected_per_partition(data: dict[str, Any]) -> dict[int, tuple[int, int, int, int, int]]:
    return {
        p: (len(values), len(values), 0, len(values) - 1, _checksum(values))
        for p, values in data["expected"].items()
    }


@pytest.mark.parametrize("source", SOURCES)
def test_batch_read_through_shaping_proxy(
    spark: Any, data: dict[str, Any], shaping_proxy: Started, source: str
) -> None:
    trimmed_before = _trimmed_records(shaping_proxy)
    df = (
        spark.read.format(source)
        .option("kafka.bootstrap.servers", shaping_proxy.lines["bootstrap"])
        .option("subscribe", data["topic"])
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("kafkaConsumer.pollTimeoutMs", str(DEADLINE_S * 1000))
        .load()
    )
    assert _per_partition(df) == _expected_per_partition(data)
    # The proxy really held records back under its limits while this source read.
    assert _trimmed_records(shaping_proxy) > trimmed_before


@pytest.mark.parametrize("source", SOURCES)
def test_stream_available_now_in_rate_limited_micro_batches(
    spark: Any, data: dict[str, Any], shaping_proxy: Started, source: str
) -> None:
    from pyspark.sql import functions as F

    batches: list[tuple[int, list[tuple[int, int, int]]]] = []

    def collect(df: Any, batch_id: int) -> None:
        rows = df.select("partition", "offset", F.crc32("value").alias("crc")).collect()
        batches.append((batch_id, [(r["partition"], r["offset"], r["crc"]) for r in rows]))

    trimmed_before = _trimmed_records(shaping_proxy)
    stream = (
        spark.readStream.format(source)
        .option("kafka.bootstrap.servers", shaping_proxy.lines["bootstrap"])
        .option("subscribe", data["topic"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(PER_TRIGGER))
        .option("kafkaConsumer.pollTimeoutMs", str(DEADLINE_S * 1000))
        .load()
    )
    with tempfile.TemporaryDirectory() as checkpoint:
        query = (
            stream.writeStream.foreachBatch(collect)
            .option("checkpointLocation", checkpoint)
            .trigger(availableNow=True)
            .start()
        )
        try:
            finished = query.awaitTermination(DEADLINE_S)
        finally:
            query.stop()
        assert finished, "streaming query did not finish in time"
        assert query.exception() is None
    # Every micro-batch respected maxOffsetsPerTrigger, so the backlog took several.
    assert [b for b, _ in batches] == list(range(len(batches)))
    assert len(batches) >= RECORDS // PER_TRIGGER
    assert all(0 < len(rows) <= PER_TRIGGER for _, rows in batches)
    seen = [row for _, rows in batches for row in rows]
    assert len(seen) == RECORDS
    expected = {
        (p, offset, zlib.crc32(value))
        for p, values in data["expected"].items()
        for offset, value in enumerate(values)
    }
    assert set(seen) == expected
    assert _trimmed_records(shaping_proxy) > trimmed_before


def test_read_topic_job_defaults_to_sparks_connector(
    spark: Any,
    data: dict[str, Any],
    shaping_proxy: Started,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``python -m pipeline.read_topic`` with its defaults (``--source kafka``), in-process
    (it reuses the module's session), splitting ranges with ``maxRecordsPerPartition``."""
    from pipeline import read_topic

    output = tmp_path / "out.parquet"
    argv = ["--bootstrap", shaping_proxy.lines["bootstrap"], "--topic", data["topic"]]
    argv += ["--output", str(output), "--max-records-per-partition", "200"]
    assert read_topic.main(argv) == 0
    written = spark.read.parquet(str(output))
    assert _per_partition(written) == _expected_per_partition(data)
    assert set(written.columns) >= {"key", "value", "partition", "offset", "headers"}
    assert f"wrote {RECORDS} rows to {output}" in capsys.readouterr().out
