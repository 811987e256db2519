"""The real-Kafka fixture itself: brokers start, answer, and are stopped by pid."""

from __future__ import annotations

import os

import pytest
import support.kafka as support_kafka
from confluent_kafka import Consumer, Producer, TopicPartition
from support.kafka import KafkaCluster


def test_single_node_serves_and_versions(kafka: KafkaCluster) -> None:
    assert kafka.version.startswith("4.")
    topic = kafka.new_topic(2)
    p = Producer({"bootstrap.servers": kafka.bootstrap})
    for i in range(10):
        p.produce(topic, value=b"v%d" % i, partition=i % 2)
    assert p.flush(30) == 0
    c = Consumer(
        {"bootstrap.servers": kafka.bootstrap, "group.id": "g", "enable.auto.commit": False}
    )
    c.assign([TopicPartition(topic, 0, 0), TopicPartition(topic, 1, 0)])
    got: list[bytes] = []
    for _ in range(100):
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value())
        if len(got) == 10:
            break
    c.close()
    assert sorted(got) == sorted(b"v%d" % i for i in range(10))


def test_three_nodes_stop_and_restart_a_broker(kafka3: KafkaCluster) -> None:
    topic = kafka3.new_topic(3)
    leaders = {kafka3.leader_of(topic, p) for p in range(3)}
    assert leaders <= {1, 2, 3}
    node = kafka3.nodes[2]
    assert node.proc is not None
    pid = node.proc.pid
    kafka3.stop_broker(2)
    assert node.proc is None
    assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z"
    kafka3.start_broker(2)
    assert node.proc is not None and node.proc.poll() is None
    assert 2 in kafka3._admin().list_topics(timeout=10).brokers


def test_older_broker(kafka39: KafkaCluster) -> None:
    assert kafka39.version.startswith("3.9.")
    topic = kafka39.new_topic(1)
    assert kafka39.leader_of(topic, 0) == 1


def test_a_topic_larger_than_one_request_is_created_in_steps(
    kafka: KafkaCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """KRaft refuses to create 10,000 partitions in one request (more than 10,000 metadata
    records): create_topic creates, then grows, a larger topic in steps.  Checked here with
    steps of 3, so the test stays small."""
    monkeypatch.setattr(support_kafka, "MAX_PARTITIONS_PER_REQUEST", 3)
    topic = kafka.new_topic(8, prefix="steps")
    meta = kafka._admin().list_topics(topic, timeout=10)
    assert sorted(meta.topics[topic].partitions) == list(range(8))
