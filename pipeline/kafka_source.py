"""``spark.read.format("kafka-proxy")``: Kafka through kafka-fetch-proxy, as a PySpark data source.

The fallback for Spark's own Kafka connector (``format("kafka")``, the pipeline's
default), which is a Maven artifact (see pipeline/spark.py); this source needs only
PyPI packages, PySpark and confluent-kafka, and gives the same rows.  The driver
plans one Spark input partition per Kafka partition and offset range (split further
by ``maxRecordsPerPartition``); each executor task reads its range with a
confluent-kafka consumer pointed at ``kafka.bootstrap.servers`` (the proxy's
bootstrap address).  Rows have the schema of Spark's built-in Kafka source.

Options (names as in Spark's built-in source):

=============================  =================================================
``kafka.bootstrap.servers``    required; any other ``kafka.*`` option is passed
                               to the consumer (e.g. ``kafka.fetch.max.bytes``)
``subscribe``                  comma-separated topics, or
``assign``                     JSON ``{"topic": [0, 1]}``
``startingOffsets``            batch default ``earliest``, stream ``latest``
``endingOffsets``              batch only, default ``latest``
``maxOffsetsPerTrigger``       stream: records per micro-batch, all partitions
``maxRecordsPerPartition``     split ranges into Spark partitions of this size
``includeHeaders``             ``true`` adds the ``headers`` column
``kafkaConsumer.pollTimeoutMs`` give up when a range makes no progress this long
                               (default 120000)
=============================  =================================================
"""

from __future__ import annotations

import datetime
import json
import time
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)

from .offsets import (
    OffsetOptionError,
    OffsetRange,
    TopicPartition,
    cap_offsets,
    parse_offsets_option,
    plan_ranges,
    resolve,
)

try:  # PySpark >= 4.2: admission control and Trigger.AvailableNow for streaming sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
except ImportError:  # pragma: no cover - older PySpark calls latestOffset() without arguments
    ReadAllAvailable = ReadMaxRows = None  # type: ignore[assignment,misc]

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        pass


BASE_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_SCHEMA = ", headers array<struct<key: string, value: binary>>"

_CONTROLLED = {"group.id", "enable.auto.commit", "enable.partition.eof", "auto.offset.reset"}


class KafkaRangePartition(InputPartition):
    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(rng)
        self.range = rng


def _consumer_conf(options: Mapping[str, str]) -> dict[str, Any]:
    conf: dict[str, Any] = {}
    for key, value in options.items():
        if key.lower().startswith("kafka."):
            name = key[len("kafka.") :]
            if name in _CONTROLLED:
                raise OffsetOptionError(
                    f"option {key!r} is managed by the source and cannot be set"
                )
            conf[name] = value
    if "bootstrap.servers" not in conf:
        raise OffsetOptionError("option 'kafka.bootstrap.servers' is required")
    conf["group.id"] = f"kafka-proxy-spark-{uuid.uuid4()}"  # never committed
    conf["enable.auto.commit"] = False
    return conf


def _split(rng: OffsetRange, max_records: int | None) -> list[OffsetRange]:
    if not max_records or rng.size <= max_records:
        return [rng]
    return [
        OffsetRange(rng.topic, rng.partition, s, min(s + max_records, rng.end))
        for s in range(rng.start, rng.end, max_records)
    ]


class _Planner:
    """Driver-side metadata look-ups, through a short-lived consumer."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.options = options
        self.conf = _consumer_conf(options)
        self.timeout = int(options.get("kafkaConsumer.pollTimeoutMs", "120000")) / 1000

    def partitions(self) -> list[TopicPartition]:
        from confluent_kafka import Consumer

        subscribe = self.options.get("subscribe")
        assign = self.options.get("assign")
        if (subscribe is None) == (assign is None):
            raise OffsetOptionError(
                "exactly one of the options 'subscribe' or 'assign' is required"
            )
        if assign is not None:
            try:
                spec = json.loads(assign)
                return sorted((str(t), int(p)) for t, ps in spec.items() for p in ps)
            except (json.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
                raise OffsetOptionError(
                    f"option 'assign': {assign!r} is not JSON like {{\"topic\": [0, 1]}}"
                ) from exc
        topics = [t.strip() for t in (subscribe or "").split(",") if t.strip()]
        if not topics:
            raise OffsetOptionError("option 'subscribe' names no topic")
        consumer = Consumer(self.conf)
        try:
            out = []
            for topic in topics:
                md = consumer.list_topics(topic, timeout=self.timeout)
                tmd = md.topics.get(topic)
                if tmd is None or tmd.error is not None or not tmd.partitions:
                    raise OffsetOptionError(f"topic {topic!r} does not exist: {tmd and tmd.error}")
                out += [(topic, p) for p in tmd.partitions]
            return sorted(out)
        finally:
            consumer.close()

    def watermarks(self, tps: list[TopicPartition]) -> dict[TopicPartition, tuple[int, int]]:
        from confluent_kafka import Consumer
        from confluent_kafka import TopicPartition as KTP

        consumer = Consumer(self.conf)
        try:
            return {
                tp: tuple(  # type: ignore[misc]
                    consumer.get_watermark_offsets(KTP(*tp), timeout=self.timeout, cached=False)
                )
                for tp in tps
            }
        finally:
            consumer.close()


def read_range(
    conf: Mapping[str, Any], rng: OffsetRange, include_headers: bool, timeout_s: float
) -> Iterator[tuple[Any, ...]]:
    """Yield the rows of one offset range, reading with a confluent-kafka consumer."""
    from confluent_kafka import Consumer, KafkaError, KafkaException
    from confluent_kafka import TopicPartition as KTP

    consumer = Consumer({**conf, "enable.partition.eof": True, "auto.offset.reset": "error"})
    try:
        consumer.assign([KTP(rng.topic, rng.partition, rng.start)])
        next_offset = rng.start
        last_progress = time.monotonic()
        while next_offset < rng.end:
            msg = consumer.poll(1.0)
            if msg is None:
                if time.monotonic() - last_progress > timeout_s:
                    raise TimeoutError(
                        f"no records from {rng.topic}-{rng.partition} at offset {next_offset}"
                        f" for {timeout_s:.0f}s (kafkaConsumer.pollTimeoutMs)"
                    )
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    # Offsets up to the end may be missing (compaction, transaction
                    # markers): once the log end is past the range, the range is done.
                    if msg.offset() >= rng.end:
                        break
                    continue
                raise KafkaException(err)
            offset = msg.offset()
            if offset < next_offset:
                continue
            if offset >= rng.end:
                break
            ts_type, ts = msg.timestamp()
            row: tuple[Any, ...] = (
                msg.key(),
                msg.value(),
                msg.topic(),
                msg.partition(),
                offset,
                datetime.datetime.fromtimestamp(ts / 1000, tz=datetime.UTC) if ts >= 0 else None,
                # confluent-kafka: 1 CreateTime, 2 LogAppendTime; Spark: 0 and 1.
                max(ts_type - 1, 0),
            )
            if include_headers:
                row += ([(k, v) for k, v in (msg.headers() or [])],)
            yield row
            next_offset = offset + 1
            last_progress = time.monotonic()
    finally:
        consumer.close()


def _to_json_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(partition)] = off
    return out


def _from_json_offsets(doc: Mapping[str, Mapping[str, int]]) -> dict[TopicPartition, int]:
    return {(t, int(p)): int(o) for t, ps in doc.items() for p, o in ps.items()}


class KafkaProxySource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "kafka-proxy"

    def _include_headers(self) -> bool:
        return str(self.options.get("includeHeaders", "false")).lower() == "true"

    def schema(self) -> str:
        return BASE_SCHEMA + (HEADERS_SCHEMA if self._include_headers() else "")

    def reader(self, schema: Any) -> DataSourceReader:
        return _BatchReader(self.options, self._include_headers())

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return _StreamReader(self.options, self._include_headers())


class _RangeReading:
    def __init__(self, options: Mapping[str, str], include_headers: bool) -> None:
        self.options = options  # PySpark's CaseInsensitiveDict: keep it, keys are lower-cased
        self.include_headers = include_headers
        self.planner = _Planner(options)
        raw = options.get("maxRecordsPerPartition")
        self.max_records = int(raw) if raw else None
        if self.max_records is not None and self.max_records <= 0:
            raise OffsetOptionError("option 'maxRecordsPerPartition' must be a positive integer")

    def _input_partitions(self, ranges: list[OffsetRange]) -> list[KafkaRangePartition]:
        return [KafkaRangePartition(r) for rng in ranges for r in _split(rng, self.max_records)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, KafkaRangePartition)
        yield from read_range(
            self.planner.conf, partition.range, self.include_headers, self.planner.timeout
        )


class _BatchReader(_RangeReading, DataSourceReader):
    def partitions(self) -> list[KafkaRangePartition]:
        tps = self.planner.partitions()
        marks = self.planner.watermarks(tps)
        starts = resolve(
            parse_offsets_option(
                "startingOffsets", self.options.get("startingOffsets"), "earliest", tps, batch=True
            ),
            marks,
        )
        ends = resolve(
            parse_offsets_option(
                "endingOffsets", self.options.get("endingOffsets"), "latest", tps, batch=True
            ),
            marks,
        )
        return self._input_partitions(plan_ranges(starts, ends))


class _StreamReader(_RangeReading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, options: Mapping[str, str], include_headers: bool) -> None:
        super().__init__(options, include_headers)
        raw = options.get("maxOffsetsPerTrigger")
        self.max_offsets = int(raw) if raw else None
        if self.max_offsets is not None and self.max_offsets <= 0:
            raise OffsetOptionError("option 'maxOffsetsPerTrigger' must be a positive integer")
        self._last_end: dict[TopicPartition, int] | None = None
        self._target: dict[TopicPartition, int] | None = None  # Trigger.AvailableNow

    def prepareForTriggerAvailableNow(self) -> None:
        """Trigger.AvailableNow: read up to the log ends as they are now, then stop."""
        tps = self.planner.partitions()
        self._target = {tp: high for tp, (_low, high) in self.planner.watermarks(tps).items()}

    def initialOffset(self) -> dict[str, dict[str, int]]:
        tps = self.planner.partitions()
        marks = self.planner.watermarks(tps)
        starts = resolve(
            parse_offsets_option(
                "startingOffsets", self.options.get("startingOffsets"), "latest", tps, batch=False
            ),
            marks,
        )
        self._last_end = starts
        return _to_json_offsets(starts)

    def getDefaultReadLimit(self) -> Any:
        if ReadMaxRows is not None and self.max_offsets:
            return ReadMaxRows(self.max_offsets)
        return ReadAllAvailable() if ReadAllAvailable is not None else None

    def latestOffset(
        self, start: dict[str, Any] | None = None, limit: Any = None
    ) -> dict[str, Any]:
        tps = self.planner.partitions()
        marks = self.planner.watermarks(tps)
        latest = {tp: high for tp, (_low, high) in marks.items()}
        if self._target is not None:
            latest = {tp: min(high, self._target.get(tp, 0)) for tp, high in latest.items()}
        if start is not None:
            begin = _from_json_offsets(start)
        else:  # PySpark < 4.2 does not pass the start: remember our last answer
            begin = dict(self._last_end or latest)
        for tp, (low, _high) in marks.items():
            begin.setdefault(tp, low)  # a partition added since: read it from the start
            latest[tp] = max(latest[tp], begin[tp])
        cap: int | None
        if limit is None:
            cap = self.max_offsets
        elif ReadMaxRows is not None and isinstance(limit, ReadMaxRows):
            cap = limit.max_rows
        else:
            cap = None  # ReadAllAvailable
        end = cap_offsets(begin, latest, cap) if cap else latest
        self._last_end = end
        return _to_json_offsets(end)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> list[KafkaRangePartition]:
        begin = _from_json_offsets(start)
        finish = _from_json_offsets(end)
        new = [tp for tp in finish if tp not in begin]
        if new:  # partitions added since the previous batch: read them from their start
            for tp, (low, _high) in self.planner.watermarks(new).items():
                begin[tp] = low
        return self._input_partitions(plan_ranges(begin, finish))

    def commit(self, end: dict[str, Any]) -> None:
        """Spark's checkpoint is the source of truth; nothing is committed to Kafka."""
