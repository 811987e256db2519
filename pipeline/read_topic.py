"""Read Kafka topics through kafka-fetch-proxy into Parquet.

    python -m pipeline.read_topic --bootstrap localhost:9092 --topic orders --output orders.parquet

``--source kafka`` (the default) reads with Spark's own Kafka connector, whose jars
``scripts/setup --test`` puts in the cache (or ``--jars`` / ``$KAFKA_FETCH_PROXY_SPARK_JARS``);
``--source kafka-proxy`` reads with the project's data source, which needs only PyPI
packages (PySpark, confluent-kafka).  Both take the same options and give the same rows.

Runs on ``local[*]`` unless ``--master`` is given (or spark-submit sets one):
``spark-submit --master spark://host:7077 --jars <the connector's jars> pipeline/read_topic.py ...``.
Prints the rows read per partition.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

if __package__ in (None, ""):  # spark-submit runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from pipeline.kafka_source import KafkaProxySource
    from pipeline.spark import (
        ConnectorMissing,
        kafka_connector_jars,
        require_kafka_source,
        session,
        under_spark_submit,
    )
else:
    from .kafka_source import KafkaProxySource
    from .spark import (
        ConnectorMissing,
        kafka_connector_jars,
        require_kafka_source,
        session,
        under_spark_submit,
    )

SOURCES = ("kafka", "kafka-proxy")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="the proxy's bootstrap address")
    parser.add_argument("--topic", required=True, action="append", help="repeatable")
    parser.add_argument("--output", required=True, help="Parquet output directory")
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--ending-offsets", default="latest")
    parser.add_argument("--max-records-per-partition", type=int, default=None)
    parser.add_argument("--master", default=None, help="Spark master (default: local[*])")
    parser.add_argument(
        "--source",
        choices=SOURCES,
        default="kafka",
        help="kafka: Spark's Kafka connector (default); kafka-proxy: the project's "
        "PyPI-only data source",
    )
    parser.add_argument(
        "--jars",
        default=None,
        help="Spark's Kafka connector: a directory of jars or comma-separated jar files "
        "(default: $KAFKA_FETCH_PROXY_SPARK_JARS, else the cache scripts/setup --test fills; "
        "under spark-submit, pass spark-submit --jars instead)",
    )
    args = parser.parse_args(argv)

    try:
        jars = None
        if args.source == "kafka" and not under_spark_submit():
            jars = kafka_connector_jars(args.jars)  # a clear error before Spark starts
        spark = session("kafka-fetch-proxy read_topic", args.master, jars)
        if args.source == "kafka":
            require_kafka_source(spark)
    except ConnectorMissing as exc:
        parser.error(f"--source kafka: {exc}")
    if args.source == "kafka-proxy":
        spark.dataSource.register(KafkaProxySource)
    reader = (
        spark.read.format(args.source)
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", ",".join(args.topic))
        .option("startingOffsets", args.starting_offsets)
        .option("endingOffsets", args.ending_offsets)
        .option("includeHeaders", "true")
    )
    if args.max_records_per_partition:
        reader = reader.option("maxRecordsPerPartition", str(args.max_records_per_partition))
    df = reader.load()
    df.write.mode("overwrite").parquet(args.output)
    written = spark.read.parquet(args.output)
    for row in (
        written.groupBy("topic", "partition").count().orderBy("topic", "partition").collect()
    ):
        print(f"{row['topic']}-{row['partition']}: {row['count']} rows")
    print(f"wrote {written.count()} rows to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
