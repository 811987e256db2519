"""Decision logs: events validate against schemas/decision-log.schema.json; sampling; sinks."""

from __future__ import annotations

import dataclasses
import io
import json
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import jsonschema
import pytest
import structlog
import trio
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from proxy.observe.decisionlog import (
    DEFAULT_QUEUE_BYTES,
    SCHEMA_VERSION,
    DecisionEvent,
    DecisionLog,
    FractionSampler,
    RandomSampler,
    event_from_shaping,
)
from proxy.observe.metrics import Metrics
from proxy.shaping.limits import limit_kind

TIMEOUT = 10

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "schemas" / "decision-log.schema.json"
SCHEMA = json.loads(SCHEMA_PATH.read_text())
VALIDATOR = jsonschema.Draft202012Validator(
    SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
)
INT32 = st.integers(-(2**31), 2**31 - 1)
COUNT = st.integers(0, 2**40)


@dataclass(frozen=True)
class FakeLimits:
    values: Mapping[str, int | None] = field(default_factory=dict)

    def as_dict(self) -> Mapping[str, int | None]:
        return self.values


@dataclass(frozen=True)
class FakeDecision:
    """The fields proxy.shaping's ShapingDecision reports (read structurally)."""

    api_version: int = 12
    requested_max_bytes: int = 52428800
    upstream_max_bytes: int = 1048576
    partitions: int = 8
    partitions_with_data: int = 6
    partitions_served: int = 4
    partitions_trimmed: int = 1
    partitions_starved: int = 2
    max_starvation: int = 1
    upstream_bytes: int = 900_000
    upstream_records: int = 9_000
    reused_bytes: int = 0
    delivered_bytes: int = 500_000
    delivered_records: int = 5_000
    buffered_bytes: int = 400_000
    dropped_partial_bytes: int = 1_234
    limited_by: frozenset[str] = frozenset({"response_records"})
    progress_exemption: bool = False
    limits: FakeLimits = FakeLimits({"max_records": 5000, "max_response_bytes": None})


class Flushed(DecisionLog):
    """A DecisionLog whose ``log`` returns once the writer thread wrote the line (the
    tests read the sink right after)."""

    def log(self, *args: Any, **kwargs: Any) -> Any:
        event = super().log(*args, **kwargs)
        assert self.flush(TIMEOUT)
        return event


DECISIONS = "kafka_fetch_proxy_decision_log_events_total"


def event_line() -> str:
    """The line of the event ``log(FakeDecision(), **log_kwargs())`` writes."""
    sink = io.StringIO()
    Flushed(sink, sampler=FractionSampler(1.0)).log(FakeDecision(), **log_kwargs())
    return sink.getvalue()


def log_kwargs(**overrides: Any) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "client_id": "orders-consumer",
        "node_id": 2,
        "policy": "default",
        "correlation_id": 41,
        "latency_ms": 12.5,
    }
    kwargs.update(overrides)
    return kwargs


def test_schema_is_valid_and_documents_every_field() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    names = {f.name for f in dataclasses.fields(DecisionEvent)} | {"schema_version", "event"}
    assert set(SCHEMA["properties"]) == names
    assert set(SCHEMA["required"]) == names
    assert SCHEMA["additionalProperties"] is False
    assert SCHEMA["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    for name, prop in SCHEMA["properties"].items():
        assert len(prop.get("description", "")) > 20, name
    # units are in the names: byte counts end in _bytes, durations and times in _ms
    for name in names:
        if "byte" in name:
            assert name.endswith("_bytes"), name
        if "latency" in name or "timestamp" in name:
            assert name.endswith("_ms"), name


def test_logged_event_validates_and_carries_the_context() -> None:
    sink = io.StringIO()
    metrics = Metrics(CollectorRegistry())
    log = Flushed(
        sink, sampler=FractionSampler(1.0), metrics=metrics, instance="pod-7", clock=lambda: 1700.5
    )
    event = log.log(FakeDecision(), **log_kwargs())
    assert event is not None
    (line,) = sink.getvalue().splitlines()
    obj = json.loads(line)
    VALIDATOR.validate(obj)
    assert obj["timestamp_ms"] == 1_700_500
    assert obj["instance"] == "pod-7"
    assert obj["client_id"] == "orders-consumer"
    assert obj["node_id"] == 2
    assert obj["limits_applied"] == ["max_records"]
    assert obj["limits"] == {
        "max_response_bytes": None,
        "max_partition_bytes": None,
        "max_records": 5000,
        "max_partition_records": None,
    }
    assert obj["upstream_record_bytes"] == 900_000
    assert obj["delivered_records"] == 5_000
    assert obj["sample_rate"] == 1.0
    assert obj["starved_partitions"] == []
    assert obj["upstream_fetch_bytes"] == obj["sessionless_fetch_bytes"] == 0
    written = metrics.registry.get_sample_value(
        "kafka_fetch_proxy_decision_log_events_total", {"outcome": "written"}
    )
    assert written == 1


def test_log_lines_hold_no_payload_or_topic_fields() -> None:
    line = DecisionLog(io.StringIO(), sampler=FractionSampler(1.0))
    event = line.log(FakeDecision(), **log_kwargs())
    assert event is not None
    keys = set(event.to_json_obj())
    assert not {"topic", "topics", "records", "value", "key", "address", "host"} & keys


@settings(max_examples=200, deadline=None)
@given(
    decision=st.builds(
        FakeDecision,
        api_version=st.integers(0, 18),
        requested_max_bytes=INT32,
        upstream_max_bytes=INT32,
        partitions=COUNT,
        partitions_with_data=COUNT,
        partitions_served=COUNT,
        partitions_trimmed=COUNT,
        partitions_starved=COUNT,
        max_starvation=COUNT,
        upstream_bytes=COUNT,
        upstream_records=COUNT,
        reused_bytes=COUNT,
        delivered_bytes=COUNT,
        delivered_records=COUNT,
        buffered_bytes=COUNT,
        dropped_partial_bytes=COUNT,
        limited_by=st.frozensets(
            st.sampled_from(
                [
                    "response_bytes",
                    "partition_bytes",
                    "response_records",
                    "partition_records",
                    "max_records",
                    "memory_budget",
                    "something_new",
                ]
            )
        ),
        progress_exemption=st.booleans(),
        limits=st.builds(
            FakeLimits,
            st.fixed_dictionaries(
                {},
                optional={
                    k: st.one_of(st.none(), st.integers(1, 2**31 - 1))
                    for k in (
                        "max_response_bytes",
                        "max_partition_bytes",
                        "max_records",
                        "max_partition_records",
                    )
                },
            ),
        ),
    ),
    client_id=st.one_of(st.none(), st.text(max_size=400)),
    policy=st.text(min_size=1, max_size=100),
    node_id=INT32,
    correlation_id=INT32,
    latency_ms=st.floats(-1.0, 1e6, allow_nan=False),
    sample_rate=st.floats(0.0001, 1.0),
    timestamp_ms=st.integers(0, 2**45),
    instance=st.one_of(st.none(), st.text(max_size=300)),
    starved=st.dictionaries(
        st.tuples(st.one_of(st.none(), st.text(max_size=300), st.uuids()), INT32),
        st.integers(0, 2**31),
        max_size=150,
    ),
    upstream_fetch_bytes=COUNT,
    saved=st.one_of(st.none(), COUNT),
)
def test_every_event_validates_against_the_schema(
    decision: FakeDecision,
    client_id: str | None,
    policy: str,
    node_id: int,
    correlation_id: int,
    latency_ms: float,
    sample_rate: float,
    timestamp_ms: int,
    instance: str | None,
    starved: dict[tuple[object, int], int],
    upstream_fetch_bytes: int,
    saved: int | None,
) -> None:
    event = event_from_shaping(
        decision,
        timestamp_ms=timestamp_ms,
        client_id=client_id,
        node_id=node_id,
        policy=policy,
        correlation_id=correlation_id,
        latency_ms=latency_ms,
        sample_rate=sample_rate,
        instance=instance,
        starved_partitions=starved,
        upstream_fetch_bytes=upstream_fetch_bytes,
        sessionless_fetch_bytes=None if saved is None else upstream_fetch_bytes + saved,
    )
    line = event.to_json_line()
    assert line.endswith("\n") and "\n" not in line[:-1]
    assert line.isascii()
    obj = json.loads(line)
    VALIDATOR.validate(obj)
    assert obj["limits_applied"] == sorted(obj["limits_applied"])
    rounds = [p["rounds"] for p in obj["starved_partitions"]]
    assert rounds == sorted(rounds, reverse=True)
    assert len(rounds) == min(100, sum(1 for r in starved.values() if r > 0))
    assert obj["sessionless_fetch_bytes"] >= obj["upstream_fetch_bytes"]


def test_starved_partitions_and_session_savings() -> None:
    topic_id = uuid.UUID(int=7)
    sink = io.StringIO()
    log = Flushed(sink, sampler=FractionSampler(1.0))
    log.log(
        FakeDecision(),
        **log_kwargs(),
        starved_partitions={("orders", 3): 2, (topic_id, 0): 5, ("orders", 1): 0},
        upstream_fetch_bytes=1_000,
        sessionless_fetch_bytes=4_000,
    )
    obj = json.loads(sink.getvalue())
    VALIDATOR.validate(obj)
    assert obj["starved_partitions"] == [  # no topic map given: the id stands for the name
        {"topic": str(topic_id), "topic_id": str(topic_id), "partition": 0, "rounds": 5},
        {"topic": "orders", "topic_id": None, "partition": 3, "rounds": 2},
    ]
    assert (obj["upstream_fetch_bytes"], obj["sessionless_fetch_bytes"]) == (1_000, 4_000)


def test_starved_partitions_of_fetch_v13_clients_are_named_from_the_topic_map() -> None:
    """Fetch v13+ keys partitions by topic id: the event names them from what Metadata taught."""
    from proxy.sessions.topic_ids import TopicIdMap

    orders, payments, unknown = uuid.UUID(int=7), uuid.UUID(int=8), uuid.UUID(int=9)
    topics = TopicIdMap()
    topics.learn("orders", orders)
    topics.learn("payments", payments)
    sink = io.StringIO()
    Flushed(sink, sampler=FractionSampler(1.0)).log(
        FakeDecision(api_version=13),
        **log_kwargs(),
        starved_partitions={(orders, 0): 5, (payments, 2): 3, (unknown, 1): 1},
        topic_ids=topics,
    )
    obj = json.loads(sink.getvalue())
    VALIDATOR.validate(obj)
    assert obj["starved_partitions"] == [
        {"topic": "orders", "topic_id": str(orders), "partition": 0, "rounds": 5},
        {"topic": "payments", "topic_id": str(payments), "partition": 2, "rounds": 3},
        {"topic": str(unknown), "topic_id": str(unknown), "partition": 1, "rounds": 1},
    ]
    # a client on names (Fetch < 13) gets the id alongside when Metadata told it
    sink = io.StringIO()
    Flushed(sink, sampler=FractionSampler(1.0)).log(
        FakeDecision(), **log_kwargs(), starved_partitions={("orders", 4): 2}, topic_ids=topics
    )
    obj = json.loads(sink.getvalue())
    VALIDATOR.validate(obj)
    assert obj["starved_partitions"] == [
        {"topic": "orders", "topic_id": str(orders), "partition": 4, "rounds": 2}
    ]


def test_events_without_topic_id_still_validate() -> None:
    """topic_id is optional: files written before it was added stay valid."""
    sink = io.StringIO()
    Flushed(sink, sampler=FractionSampler(1.0)).log(
        FakeDecision(), **log_kwargs(), starved_partitions={("orders", 0): 1}
    )
    obj = json.loads(sink.getvalue())
    for entry in obj["starved_partitions"]:
        del entry["topic_id"]
    VALIDATOR.validate(obj)


def test_the_fleet_report_can_derive_its_spark_schema() -> None:
    """The PySpark pipeline builds its read schema from this JSON Schema (pipeline/spark.py)."""
    from pipeline.spark import spark_schema

    struct = spark_schema("decision-log.schema.json")
    assert set(struct.fieldNames()) == set(SCHEMA["properties"])
    starved = struct["starved_partitions"].dataType.elementType
    assert starved.fieldNames() == ["topic", "topic_id", "partition", "rounds"]


def test_limit_names_map_to_config_keys() -> None:
    assert limit_kind("response_bytes") == "max_response_bytes"
    assert limit_kind("partition_records") == "max_partition_records"
    assert limit_kind("max_records") == "max_records"
    assert limit_kind("nonsense") == "other"


def test_fraction_sampler_is_exact_and_evenly_spread() -> None:
    sampler = FractionSampler(0.25)
    picks = [sampler.sample() for _ in range(100)]
    assert sum(picks) == 25
    assert picks[:8] == [False, False, False, True, False, False, False, True]
    assert sum(FractionSampler(0.0).sample() for _ in range(50)) == 0
    assert sum(FractionSampler(1.0).sample() for _ in range(50)) == 50
    with pytest.raises(ValueError):
        FractionSampler(1.5)


def test_random_sampler_uses_the_injected_source() -> None:
    values = iter([0.05, 0.5, 0.09, 0.11])
    sampler = RandomSampler(0.1, rng=lambda: next(values))
    assert [sampler.sample() for _ in range(4)] == [True, False, True, False]
    assert RandomSampler(0.0).sample() is False
    assert RandomSampler(1.0).sample() is True
    with pytest.raises(ValueError):
        RandomSampler(-0.1)


def test_sampled_out_events_are_counted_not_written() -> None:
    sink = io.StringIO()
    metrics = Metrics(CollectorRegistry())
    log = Flushed(sink, sampler=FractionSampler(0.5), metrics=metrics)
    results = [log.log(FakeDecision(), **log_kwargs()) for _ in range(10)]
    assert sum(r is not None for r in results) == 5
    assert len(sink.getvalue().splitlines()) == 5
    value = metrics.registry.get_sample_value
    assert value("kafka_fetch_proxy_decision_log_events_total", {"outcome": "sampled_out"}) == 5
    for line in sink.getvalue().splitlines():
        assert json.loads(line)["sample_rate"] == 0.5


def test_file_sink_appends_json_lines(tmp_path: Path) -> None:
    path = tmp_path / "decisions.jsonl"
    path.write_text("")
    log = DecisionLog.open(str(path), sample_rate=1.0, instance="i-1")
    for correlation_id in range(3):
        log.log(FakeDecision(), **log_kwargs(correlation_id=correlation_id))
    # the writer flushes after each batch: visible before close
    assert log.flush(TIMEOUT)
    lines = path.read_text().splitlines()
    assert [json.loads(line)["correlation_id"] for line in lines] == [0, 1, 2]
    log.close()
    again = DecisionLog.open(str(path), sample_rate=1.0)
    again.log(FakeDecision(), **log_kwargs())
    again.close()
    assert len(path.read_text().splitlines()) == 4
    for line in path.read_text().splitlines():
        VALIDATOR.validate(json.loads(line))


def test_stdout_sink(capsys: pytest.CaptureFixture[str]) -> None:
    log = DecisionLog.open("-", sample_rate=1.0)
    log.log(FakeDecision(), **log_kwargs())
    log.close()
    out = capsys.readouterr().out  # structlog, unconfigured in tests, prints there too
    (line,) = [line for line in out.splitlines() if '"event":"fetch_shaped"' in line]
    VALIDATOR.validate(json.loads(line))


def test_a_failing_sink_drops_events_and_keeps_going() -> None:
    class BrokenSink(io.StringIO):
        def write(self, s: str) -> int:
            raise OSError("disk full")

    metrics = Metrics(CollectorRegistry())
    log = DecisionLog(BrokenSink(), sampler=FractionSampler(1.0), metrics=metrics)
    assert log.log(FakeDecision(), **log_kwargs()) is not None  # queued; the writer fails
    assert log.flush(TIMEOUT)
    assert log.log(FakeDecision(), **log_kwargs()) is not None
    assert log.flush(TIMEOUT)
    value = metrics.registry.get_sample_value
    assert value("kafka_fetch_proxy_decision_log_events_total", {"outcome": "dropped"}) == 2
    assert value("kafka_fetch_proxy_decision_log_events_total", {"outcome": "written"}) == 0
    closed = io.StringIO()
    closed.close()
    log = DecisionLog(closed, sampler=FractionSampler(1.0), metrics=metrics)
    log.log(FakeDecision(), **log_kwargs())
    log.close()
    assert value("kafka_fetch_proxy_decision_log_events_total", {"outcome": "dropped"}) == 3


class StuckSink(io.StringIO):
    """A sink whose writes block until ``release`` is set, as a stalled disk does.

    A write on the event loop's thread does not block (it would hang the test): it is
    recorded in ``on_loop``, which the tests expect to stay empty."""

    def __init__(self, loop_thread: int) -> None:
        super().__init__()
        self.loop_thread = loop_thread
        self.on_loop: list[str] = []
        self.entered = threading.Event()
        self.release = threading.Event()

    def write(self, s: str) -> int:
        if threading.get_ident() == self.loop_thread:
            self.on_loop.append(s)
        else:
            self.entered.set()
            assert self.release.wait(TIMEOUT)
        return super().write(s)


async def test_a_stuck_sink_never_blocks_the_loop_and_drops_are_counted() -> None:
    metrics = Metrics(CollectorRegistry())
    value = metrics.registry.get_sample_value
    line = len(event_line())
    sink = StuckSink(threading.get_ident())
    log = DecisionLog(sink, sampler=FractionSampler(1.0), metrics=metrics, queue_bytes=3 * line)
    with trio.fail_after(TIMEOUT):
        assert log.log(FakeDecision(), **log_kwargs()) is not None
        if not sink.on_loop:  # today's code wrote it on the loop: the asserts below say so
            await trio.to_thread.run_sync(sink.entered.wait, TIMEOUT)  # the writer is stuck
        # While the disk is stuck the loop runs on: every decision returns at once, two
        # more fit in the queue (the stuck line still counts against it), the rest drop.
        results = []
        for _ in range(50):
            results.append(log.log(FakeDecision(), **log_kwargs()))
            await trio.lowlevel.checkpoint()
        assert sink.on_loop == []
        assert sum(r is not None for r in results) == 2
        assert value(DECISIONS, {"outcome": "queue_full"}) == 48
        assert value(DECISIONS, {"outcome": "written"}) == 0
        sink.release.set()
        assert await trio.to_thread.run_sync(log.flush, TIMEOUT)
    assert value(DECISIONS, {"outcome": "written"}) == 3
    assert len(sink.getvalue().splitlines()) == 3
    assert log.log(FakeDecision(), **log_kwargs()) is not None  # room again
    log.close()
    assert len(sink.getvalue().splitlines()) == 4


def test_close_writes_everything_queued_then_closes_the_file(tmp_path: Path) -> None:
    """What a clean SIGTERM does (``kafka-fetch-proxy run`` closes the log after the
    connections): nothing queued is lost, even when the disk is slow at that moment."""

    class SlowFile(StuckSink):
        def __init__(self, file: IO[str]) -> None:
            super().__init__(loop_thread=-1)
            self.file = file

        def write(self, s: str) -> int:
            super().write(s)  # blocks until released
            return self.file.write(s)

        def flush(self) -> None:
            self.file.flush()

        def close(self) -> None:
            self.file.close()
            super().close()

    path = tmp_path / "decisions.jsonl"
    sink = SlowFile(path.open("a", encoding="utf-8"))
    log = DecisionLog(sink, sampler=FractionSampler(1.0), close_sink=True)
    for correlation_id in range(100):
        assert log.log(FakeDecision(), **log_kwargs(correlation_id=correlation_id)) is not None
    assert sink.entered.wait(TIMEOUT)
    with structlog.testing.capture_logs() as logs:
        closer = threading.Thread(target=log.close)
        closer.start()
        sink.release.set()  # the disk recovers while close() waits
        closer.join(TIMEOUT)
    assert not closer.is_alive()
    assert sink.file.closed
    (closed,) = [e for e in logs if e["event"] == "decision_log_closed"]
    assert (closed["count"], closed["written"], closed["dropped"]) == (100, 100, 0)
    ids = [json.loads(line)["correlation_id"] for line in path.read_text().splitlines()]
    assert ids == list(range(100))


def test_a_writer_that_cannot_finish_in_time_leaves_close_with_a_count() -> None:
    from proxy.observe.linewriter import LineWriter

    sink = StuckSink(loop_thread=-1)
    writer = LineWriter(sink, max_queued_bytes=1 << 20)
    assert writer.put("a\n") and sink.entered.wait(TIMEOUT)
    assert writer.put("b\n") and writer.put("c\n")
    assert writer.close(timeout=0.01) == 3  # the stuck line and two queued
    assert not writer.put("d\n")  # closed: refused
    sink.release.set()
    assert writer.flush(TIMEOUT)
    assert sink.getvalue() == "a\nb\nc\n"


def test_converts_the_shaping_layers_decision_record() -> None:
    from proxy.shaping.decision import ShapingDecision
    from proxy.shaping.limits import Limits

    decision = ShapingDecision(
        api_version=13,
        requested_max_bytes=52_428_800,
        upstream_max_bytes=65_536,
        limits=Limits(max_response_bytes=65_536, max_partition_records=50),
        partitions=6,
        partitions_with_data=4,
        partitions_served=3,
        partitions_trimmed=2,
        partitions_starved=1,
        max_starvation=2,
        upstream_bytes=70_000,
        upstream_records=700,
        reused_bytes=1_000,
        delivered_bytes=60_000,
        delivered_records=150,
        buffered_bytes=11_000,
        dropped_partial_bytes=500,
        limited_by=frozenset({"response_bytes", "partition_records"}),
        progress_exemption=True,
    )
    sink = io.StringIO()
    Flushed(sink, sampler=FractionSampler(1.0)).log(
        decision, **log_kwargs(), starved_partitions={("orders", 5): 2}
    )
    obj = json.loads(sink.getvalue())
    VALIDATOR.validate(obj)
    assert obj["limits_applied"] == ["max_partition_records", "max_response_bytes"]
    assert obj["limits"] == {
        "max_response_bytes": 65_536,
        "max_partition_bytes": None,
        "max_records": None,
        "max_partition_records": 50,
    }
    assert obj["partitions_requested"] == 6
    assert obj["max_starvation_rounds"] == 2
    assert (obj["upstream_record_bytes"], obj["reused_record_bytes"]) == (70_000, 1_000)
    assert (obj["delivered_record_bytes"], obj["delivered_records"]) == (60_000, 150)
    assert obj["buffered_record_bytes"] == 11_000
    assert obj["progress_exemption"] is True


def test_the_queue_bound_is_a_setting(tmp_path: Path) -> None:
    from proxy import config
    from proxy.observe.settings import ObserveSettings

    env = {"KAFKA_FETCH_PROXY_UPSTREAM": "k:1"}
    default = ObserveSettings.from_settings(config.load(env=env), {})
    assert default.decision_log_queue_bytes == DEFAULT_QUEUE_BYTES == 4 * 1024 * 1024
    env["KAFKA_FETCH_PROXY_DECISION_LOG"] = str(tmp_path / "d.jsonl")
    env["KAFKA_FETCH_PROXY_DECISION_LOG_QUEUE_BYTES"] = "65536"
    settings = config.load(env=env)
    values, sources = config.effective(settings)  # what check-config shows
    assert values["decision_log_queue_bytes"] == 65536
    assert sources["decision_log_queue_bytes"] == (
        "environment KAFKA_FETCH_PROXY_DECISION_LOG_QUEUE_BYTES"
    )
    log = ObserveSettings.from_settings(settings, {}).open_decision_log(None)
    assert log is not None
    try:
        assert log.queue_bytes == 65536
    finally:
        log.close()
    env["KAFKA_FETCH_PROXY_DECISION_LOG_QUEUE_BYTES"] = "1000"
    with pytest.raises(config.ConfigError, match=r"decision_log_queue_bytes.*>= 65536"):
        config.load(env=env)
