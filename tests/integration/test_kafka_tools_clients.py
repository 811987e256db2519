"""Apache Kafka's own test clients through the proxy, with shaping caps on.

``VerifiableProducer``, ``VerifiableConsumer`` and ``VerifiableShareConsumer`` (the
``kafka-tools`` artifact set, at the broker's 4.x version: ``tests/jvm/kafka-tools``) are
the clients Kafka's own system tests drive: each prints one JSON event per line (every
acknowledged send with its partition and offset, every consumed record with ``--verbose``,
every assignment, revocation and commit).  The proxy runs with small record and byte caps
(``CAPS``: a response carries at most 50 records and 4 KiB per partition), so every
consumer read takes many shaped rounds, most answered from held batches.

- produce, then consume in a classic group, on the dev cluster, Kafka 4.4 and 3.9: every
  acknowledged record consumed exactly once and in order per partition, the group's
  last commits at the end of every partition;
- a producer writing while consumers in a group (classic, and KIP-848's consumer
  protocol) read it, one of them stopped and another started halfway (two rebalances):
  every acknowledged record consumed, within each assignment in order and without a gap,
  none twice unless a commit failed;
- a share group (KIP-932, Kafka 4.4): every acknowledged record delivered, none twice;
- Kafka's transactions system test: ``TransactionalMessageCopier`` copies a topic in
  transactions, aborting about a third of them, then a read_committed consumer reads the
  copy (dev cluster, Kafka 4.4 and 3.9): every record once, none of the aborted ones;
- the command-line tools (``bin/kafka-*.sh``) an operator points at the proxy, Kafka 4.4:
  topics, producer perf, console consumer, consumer groups, offsets, records deletion,
  the metadata quorum, log dirs, features, configs, reassignments, transactions, and
  API versions per broker, which lists the proxy's listeners, not the broker.

Every tool is a JVM started by this test and stopped by its pid.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from support.backends import running, upstream_for
from support.delivery import assert_exactly_once_in_order
from support.kafka import KafkaCluster, jvm_lib, tool_command
from support.stack import ProxyStack

pytestmark = pytest.mark.integration

CAPS = {"max_records": 50, "max_partition_bytes": 4096}
PARTITIONS = 6
TOOL_TIMEOUT = 120.0
"""The most a tool may run (then it is killed by its pid and the test fails)."""

Event = dict[str, Any]


class Tool:
    """One of Kafka's Verifiable* tools, its JSON events collected as it prints them."""

    def __init__(self, main: str, *args: str) -> None:
        command = tool_command(jvm_lib("kafka-tools"), f"org.apache.kafka.tools.{main}", *args)
        self.name = main
        self.events: list[Event] = []
        self._changed = threading.Condition()
        self._err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._err,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"{main}-out", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            with self._changed:
                self.events.append(event)
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    def of(self, name: str) -> list[Event]:
        with self._changed:
            return [e for e in self.events if e.get("name") == name]

    def wait_until(self, done: Callable[[], bool], timeout: float, what: str) -> None:
        """Until *done()* holds (checked on every event), or fail naming *what*."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    break
                self._changed.wait(min(left, 1.0))
        if not done():
            pytest.fail(f"{self.name}: {what} not seen in {timeout:.0f} s; {self.tail()}")

    def finish(self, timeout: float = TOOL_TIMEOUT) -> None:
        """Wait for the tool to exit by itself (it was given --max-messages); rc 0."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.name} did not finish in {timeout:.0f} s; {self.tail()}")
        self._reader.join(10)
        assert code == 0, f"{self.name} exited {code}; {self.tail()}"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGTERM by pid (the tools close their client in a shutdown hook), SIGKILL if it
        does not exit in *timeout*."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        self._reader.join(10)

    def tail(self) -> str:
        self._err.seek(0)
        err = self._err.read().decode(errors="replace")
        return f"last events {self.events[-3:]}, stderr {err[-1500:]!r}"

    def close(self) -> None:
        self.stop()
        self._err.close()


@pytest.fixture
def tools() -> Iterator[list[Tool]]:
    """Every tool a test starts, stopped by its pid when the test ends."""
    started: list[Tool] = []
    try:
        yield started
    finally:
        for tool in started:
            tool.close()


def start(tools: list[Tool], main: str, *args: str) -> Tool:
    tool = Tool(main, *args)
    tools.append(tool)
    return tool


def acked(producer: Tool) -> list[tuple[int, int, str]]:
    """(partition, offset, value) of every send the broker acknowledged, in offset order
    per partition; no send failed."""
    failed = producer.of("producer_send_error")
    assert not failed, f"{len(failed)} sends failed: {failed[:3]}"
    sent = [(e["partition"], e["offset"], e["value"]) for e in producer.of("producer_send_success")]
    return sorted(sent)


def consumed(tool: Tool) -> list[tuple[int, int, str]]:
    return [(e["partition"], e["offset"], e["value"]) for e in tool.of("record_data")]


def produce(tools: list[Tool], bootstrap: str, topic: str, count: int, *extra: str) -> Tool:
    return start(
        tools,
        "VerifiableProducer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--max-messages",
        str(count),
        "--acks",
        "-1",
        *extra,
    )


def consumer(tools: list[Tool], bootstrap: str, topic: str, group: str, *extra: str) -> Tool:
    return start(
        tools,
        "VerifiableConsumer",
        "--bootstrap-server",
        bootstrap,
        "--topic",
        topic,
        "--group-id",
        group,
        "--reset-policy",
        "earliest",
        "--verbose",
        *extra,
    )


# -- produce, then consume: exactly once, in order ------------------------------------------


@pytest.fixture(scope="module", params=("devbroker", "kafka", "kafka39"))
def stack(request: pytest.FixtureRequest) -> Iterator[ProxyStack]:
    backend = str(request.param)
    upstream = upstream_for(request, backend)
    with running(ProxyStack(CAPS, upstream=upstream, name=f"kafka-tools-{backend}")) as s:
        yield s


def test_verifiable_producer_then_consumer_exactly_once_in_order(
    stack: ProxyStack, tools: list[Tool]
) -> None:
    count = 6000
    topic = stack.create_topic(PARTITIONS, prefix="vt")
    producer = produce(tools, stack.bootstrap, topic, count)
    producer.finish()
    sent = acked(producer)
    assert len(sent) == count

    group = f"vt-{uuid.uuid4().hex[:8]}"
    reader = consumer(tools, stack.bootstrap, topic, group, "--max-messages", str(count))
    reader.finish()
    got = consumed(reader)
    assert_exactly_once_in_order(sent, got)
    # the group's last successful commit of each partition is its end (the next offset)
    last: dict[int, int] = {}
    for event in reader.of("offsets_committed"):
        assert event["success"], event
        for o in event["offsets"]:
            last[o["partition"]] = o["offset"]
    ends = {p: o + 1 for p, o, _ in sent}
    assert last == ends


EDGE_SETTINGS = {
    "one byte asked": {"fetch.max.bytes": "1", "max.partition.fetch.bytes": "1"},
    "min bytes never reached": {"fetch.min.bytes": "10000000", "fetch.max.wait.ms": "200"},
    "one record a poll": {"max.poll.records": "1"},
    "read_committed, CRCs checked": {"isolation.level": "read_committed", "check.crcs": "true"},
    "no wait": {"fetch.max.wait.ms": "0"},
}
"""Consumer settings at the edges of a Fetch: KIP-74's progress rule (a first batch goes out
whatever max_bytes says), a min_bytes the data never reaches (the wait's end answers), and
so on."""


def test_verifiable_consumer_with_fetch_settings_at_their_edges(
    stack: ProxyStack, tools: list[Tool], tmp_path: Path
) -> None:
    count = 2000
    topic = stack.create_topic(PARTITIONS, prefix="vte")
    producer = produce(tools, stack.bootstrap, topic, count)
    producer.finish()
    sent = acked(producer)
    for name, settings in EDGE_SETTINGS.items():
        config = tmp_path / "consumer.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
        group = f"vte-{uuid.uuid4().hex[:8]}"
        reader = consumer(
            tools,
            stack.bootstrap,
            topic,
            group,
            "--max-messages",
            str(count),
            "--consumer.config",
            str(config),
        )
        reader.finish()
        if "max.poll.records" in settings:  # (the settings reached the consumer)
            assert {e["count"] for e in reader.of("records_consumed")} == {1}
        try:
            assert_exactly_once_in_order(sent, consumed(reader))
        except AssertionError as exc:
            raise AssertionError(f"{name} ({settings}): {exc}") from exc


# -- a group through two rebalances, with a producer writing --------------------------------


@pytest.fixture(scope="module")
def stack_kafka(kafka: KafkaCluster) -> Iterator[ProxyStack]:
    with running(ProxyStack(CAPS, upstream=kafka, name="kafka-tools-rebalance")) as s:
        yield s


def check_assignments(tool: Tool) -> tuple[set[tuple[int, int]], int]:
    """Within each assignment a consumer reads every partition in order, without a gap or
    a repeat (the topic's offsets are contiguous: one idempotent producer, no
    transactions); after a new assignment it may start again where the group last
    committed.  Returns the (partition, offset) it consumed and how many it consumed."""
    at: dict[int, int] = {}
    seen: set[tuple[int, int]] = set()
    n = 0
    for event in list(tool.events):
        name = event.get("name")
        if name in ("partitions_assigned", "partitions_revoked"):
            for p in event["partitions"]:
                at.pop(p["partition"], None)
        elif name == "record_data":
            p, offset = event["partition"], event["offset"]
            if p in at:
                assert offset == at[p] + 1, (
                    f"{tool.name}: partition {p} read {offset} after {at[p]}"
                )
            at[p] = offset
            seen.add((p, offset))
            n += 1
    return seen, n


def assigned(tool: Tool) -> bool:
    """The tool's consumer owns a partition now (its last assignment was not empty)."""
    events = tool.of("partitions_assigned")
    return bool(events and events[-1]["partitions"])


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_verifiable_consumers_through_rebalances_while_producing(
    stack_kafka: ProxyStack, tools: list[Tool], protocol: str
) -> None:
    count = 10_000
    stack = stack_kafka
    topic = stack.create_topic(PARTITIONS, prefix="vtr")
    group = f"vtr-{uuid.uuid4().hex[:8]}"
    bootstrap = stack.bootstrap
    proto = ("--group-protocol", protocol)
    producer = produce(tools, bootstrap, topic, count, "--throughput", "1000")
    first = consumer(tools, bootstrap, topic, group, *proto)
    second = consumer(tools, bootstrap, topic, group, *proto)
    second.wait_until(lambda: assigned(second), 60, "a partition assigned")
    second.stop()  # a clean leave: the group gives its partitions to the first
    assert second.of("shutdown_complete"), second.tail()
    third = consumer(tools, bootstrap, topic, group, *proto)  # and takes some back
    third.wait_until(lambda: assigned(third), 60, "a partition assigned")
    producer.finish()
    want = {(p, o): v for p, o, v in acked(producer)}
    assert len(want) == count
    readers = (first, second, third)

    def all_read() -> bool:
        return len({(p, o) for t in readers for p, o, _ in consumed(t)}) >= count

    third.wait_until(all_read, 90, "every acknowledged record read by the group")
    first.stop()
    third.stop()
    union: set[tuple[int, int]] = set()
    total = 0
    for tool in readers:
        for p, o, value in consumed(tool):
            assert want.get((p, o)) == value, f"{tool.name} read {(p, o, value)}, not acknowledged"
        seen, n = check_assignments(tool)
        union |= seen
        total += n
    assert union == set(want)
    failed = [e for t in readers for e in t.of("offsets_committed") if not e["success"]]
    duplicates = total - len(union)
    print(
        f"{protocol}: {total} reads of {count} records, {duplicates} repeats, {len(failed)} failed commits"
    )
    assert duplicates == 0 or failed, "records read twice with every commit successful"


# -- a share group ---------------------------------------------------------------------------


def test_verifiable_share_consumer_gets_every_record_once(
    stack_kafka: ProxyStack, tools: list[Tool]
) -> None:
    count = 3000
    stack = stack_kafka
    topic = stack.create_topic(PARTITIONS, prefix="vts")
    producer = produce(tools, stack.bootstrap, topic, count)
    producer.finish()
    want = {(p, o): v for p, o, v in acked(producer)}
    share = start(
        tools,
        "VerifiableShareConsumer",
        "--bootstrap-server",
        stack.bootstrap,
        "--topic",
        topic,
        "--group-id",
        f"vts-{uuid.uuid4().hex[:8]}",
        "--acknowledgement-mode",
        "sync",
        "--offset-reset-strategy",
        "earliest",
        "--max-messages",
        str(count),
        "--verbose",
    )
    share.finish()
    got = consumed(share)
    for p, o, value in got:
        assert want.get((p, o)) == value, f"delivered {(p, o, value)}, not acknowledged"
    assert {(p, o) for p, o, _ in got} == set(want)
    assert len(got) == count, f"{len(got) - len(set(got))} records delivered twice"
    # every delivery acknowledged (sync mode: each poll's records, once processed)
    acknowledged: set[tuple[int, int]] = set()
    for event in share.of("offsets_acknowledged"):
        assert event["success"], event.get("error")
        for part in event["partitions"]:
            acknowledged |= {(part["partition"], o) for o in part["offsets"]}
    assert acknowledged == set(want)


# -- transactions: Kafka's copier, then a read_committed consumer ----------------------------


def records_in_log(bootstrap: str, topic: str, partitions: int, timeout: float = 60.0) -> int:
    """Records in *topic*'s log, aborted ones included (read_uncommitted, straight from the
    upstream, not through the proxy)."""
    from kafka import KafkaConsumer, TopicPartition

    reader = KafkaConsumer(
        bootstrap_servers=bootstrap,
        enable_auto_commit=False,
        isolation_level="read_uncommitted",
    )
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        reader.assign(parts)
        reader.seek_to_beginning()
        ends = reader.end_offsets(parts)
        count = 0
        deadline = time.monotonic() + timeout
        while any(reader.position(tp) < ends[tp] for tp in parts):
            assert time.monotonic() < deadline, f"{topic} not read to its end in {timeout} s"
            count += sum(len(batch) for batch in reader.poll(timeout_ms=500).values())
        return count
    finally:
        reader.close()


def test_transactional_copier_then_read_committed_exactly_once(
    stack: ProxyStack, tools: list[Tool], tmp_path: Path
) -> None:
    """Kafka's transactions system test, through the proxy: ``TransactionalMessageCopier``
    (one per input partition) reads its partition read_committed and copies it to the
    output topic in transactions of 50, aborting about a third of them at random
    (``--enable-random-aborts``: the aborted records are in the log), committing its
    group's offsets in each transaction; then a read_committed ``VerifiableConsumer``
    reads the output: every input record exactly once, no aborted one."""
    count, partitions = 3000, 3
    source = stack.create_topic(partitions, prefix="vtx-in")
    target = stack.create_topic(partitions, prefix="vtx-out")
    producer = produce(tools, stack.bootstrap, source, count)
    producer.finish()
    sent = acked(producer)
    group = f"vtx-{uuid.uuid4().hex[:8]}"
    copiers = [
        start(
            tools,
            "TransactionalMessageCopier",
            "--broker-list",
            stack.bootstrap,
            "--input-topic",
            source,
            "--input-partition",
            str(p),
            "--output-topic",
            target,
            "--max-messages",
            "-1",
            "--transaction-size",
            "50",
            "--transactional-id",
            f"{group}-{p}",
            "--consumer-group",
            group,
            "--enable-random-aborts",
            "--use-group-metadata",
        )
        for p in range(partitions)
    ]
    for copier in copiers:
        copier.finish()
    copied = sum(c.events[-1]["totalProcessed"] for c in copiers)
    assert all(c.events[-1]["stage"] == "ShutdownComplete" for c in copiers)
    assert copied == count, [c.events[-1] for c in copiers]

    config = tmp_path / "read_committed.properties"
    config.write_text("isolation.level=read_committed\n")
    reader = consumer(
        tools,
        stack.bootstrap,
        target,
        f"{group}-read",
        "--max-messages",
        str(count),
        "--consumer.config",
        str(config),
    )
    reader.finish()
    values = [value for _, _, value in consumed(reader)]
    assert sorted(values) == sorted(value for _, _, value in sent)  # once each, none aborted
    # in order per partition: a copier writes its input partition in order
    for p in range(partitions):
        offsets = [o for q, o, _ in consumed(reader) if q == p]
        assert offsets == sorted(offsets), f"partition {p} out of order"
    aborted = records_in_log(stack.direct_bootstrap, target, partitions) - count
    print(f"{stack.backend}: {count} records copied, {aborted} aborted records in the log")
    assert aborted > 0, "no transaction was aborted: the read_committed check saw no abort"


# -- Kafka's command-line tools ---------------------------------------------------------------


def cli(main: str, *args: str, timeout: float = 60.0) -> str:
    """One of Kafka's command-line tools (``bin/kafka-*.sh`` run these classes); rc 0, its
    output.  ``subprocess.run`` kills it by its pid if it outlives *timeout*."""
    command = tool_command(jvm_lib("kafka-tools"), main, *args)
    name = main.rsplit(".", 1)[-1]
    try:
        done = subprocess.run(
            command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout
        )
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name} did not finish in {timeout:.0f} s")
    text = done.stdout + done.stderr
    assert done.returncode == 0, f"{name} exited {done.returncode}: {text[-1500:]}"
    return text


def test_kafka_command_line_tools_through_the_proxy(
    stack_kafka: ProxyStack, tmp_path: Path
) -> None:
    """The admin side of Kafka's tools through the proxy: topics, producer perf, consumer
    groups, offsets, the metadata quorum, log dirs, features, the cluster id, configs,
    records deletion, reassignments, transactions, API versions per broker (the broker it
    lists is the proxy's listener: the addresses DescribeCluster and Metadata report are
    rewritten, so the tool never reaches the broker itself)."""
    stack = stack_kafka
    b = stack.bootstrap
    t = "org.apache.kafka.tools."
    topic = stack.create_topic(3, prefix="cli")
    made = f"cli-made-{uuid.uuid4().hex[:8]}"
    assert topic in cli(t + "TopicCommand", "--bootstrap-server", b, "--list").split()
    described = cli(t + "TopicCommand", "--bootstrap-server", b, "--describe", "--topic", topic)
    assert "PartitionCount: 3" in described
    assert f"Created topic {made}." in cli(
        t + "TopicCommand",
        "--bootstrap-server",
        b,
        "--create",
        "--topic",
        made,
        "--partitions",
        "2",
    )
    perf = cli(
        t + "ProducerPerformance",
        "--topic",
        topic,
        "--num-records",
        "3000",
        "--record-size",
        "100",
        "--throughput",
        "-1",
        "--command-property",
        f"bootstrap.servers={b}",
        "acks=all",
    )
    assert "3000 records sent" in perf
    offsets = cli(t + "GetOffsetShell", "--bootstrap-server", b, "--topic", topic)
    ends = {
        int(line.split(":")[1]): int(line.split(":")[2])
        for line in offsets.split()
        if line.startswith(topic)
    }
    assert sum(ends.values()) == 3000 and set(ends) == {0, 1, 2}
    group = f"cli-{uuid.uuid4().hex[:8]}"
    consumed = cli(
        t + "consumer.ConsoleConsumer",
        "--bootstrap-server",
        b,
        "--topic",
        topic,
        "--group",
        group,
        "--from-beginning",
        "--max-messages",
        "3000",
        "--timeout-ms",
        "30000",
    )
    assert "Processed a total of 3000 messages" in consumed
    described = cli(
        t + "consumer.group.ConsumerGroupCommand",
        "--bootstrap-server",
        b,
        "--describe",
        "--group",
        group,
    )
    lags = [line.split() for line in described.splitlines() if line.startswith(group)]
    assert len(lags) == 3 and all(row[5] == "0" for row in lags), described  # LAG column
    plan = tmp_path / "delete.json"
    first = min(ends, key=lambda p: -ends[p])
    plan.write_text(
        json.dumps(
            {"partitions": [{"topic": topic, "partition": first, "offset": 5}], "version": 1}
        )
    )
    assert "low_watermark: 5" in cli(
        t + "DeleteRecordsCommand", "--bootstrap-server", b, "--offset-json-file", str(plan)
    )
    earliest = cli(t + "GetOffsetShell", "--bootstrap-server", b, "--topic", topic, "--time", "-2")
    assert f"{topic}:{first}:5" in earliest.split()
    quorum = cli(t + "MetadataQuorumCommand", "--bootstrap-server", b, "describe", "--status")
    fields = dict(line.split(":", 1) for line in quorum.splitlines() if ":" in line)
    assert fields["LeaderId"].strip() == "1", quorum
    cluster_id = cli(t + "ClusterTool", "cluster-id", "--bootstrap-server", b)
    assert f"Cluster ID: {fields['ClusterId'].strip()}" in cluster_id
    assert '"broker":1' in cli(t + "LogDirsCommand", "--bootstrap-server", b, "--describe")
    assert "metadata.version" in cli(t + "FeatureCommand", "--bootstrap-server", b, "describe")
    assert f"Dynamic configs for topic {topic}" in cli(
        t + "ConfigCommand",
        "--bootstrap-server",
        b,
        "--describe",
        "--entity-type",
        "topics",
        "--entity-name",
        topic,
    )
    assert "No partition reassignments found." in cli(
        t + "reassign.ReassignPartitionsCommand", "--bootstrap-server", b, "--list"
    )
    assert "TransactionalId" in cli(t + "TransactionsCommand", "--bootstrap-server", b, "list")
    versions = cli(t + "BrokerApiVersionsCommand", "--bootstrap-server", b)
    listed = {line.split()[0] for line in versions.splitlines() if "(id:" in line}
    proxies = {f"{host}:{port}" for host, port in stack.proxy_addresses()}
    brokers = {f"{host}:{port}" for host, port in stack.broker_addresses()}
    assert listed and listed <= proxies and not listed & brokers, (listed, proxies)
    assert "Fetch(1):" in versions
