"""Read Kafka topics through kafka-fetch-proxy into Parquet, with the ``kafka-proxy`` source.

    python -m pipeline.read_topic --bootstrap localhost:9092 --topic orders --output orders.parquet

Runs on ``local[*]`` unless ``--master`` is given (or spark-submit sets one):
``spark-submit --master spark://host:7077 pipeline/read_topic.py ...``.
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
    from pipeline.spark import session
else:
    from .kafka_source import KafkaProxySource
    from .spark import session


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bootstrap", required=True, help="the proxy's bootstrap address")
    parser.add_argument("--topic", required=True, action="append", help="repeatable")
    parser.add_argument("--output", required=True, help="Parquet output directory")
    parser.add_argument("--starting-offsets", default="earliest")
    parser.add_argument("--ending-offsets", default="latest")
    parser.add_argument("--max-records-per-partition", type=int, default=None)
    parser.add_argument("--master", default=None, help="Spark master (default: local[*])")
    args = parser.parse_args(argv)

    spark = session("kafka-fetch-proxy read_topic", args.master)
    spark.dataSource.register(KafkaProxySource)
    reader = (
        spark.read.format("kafka-proxy")
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
