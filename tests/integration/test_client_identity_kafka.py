"""The client's own identity upstream: a client-id quota applies through the proxy as direct.

Kafka keys its quotas (and request logs, KIP-714 client metrics) on the client id of
each request.  Through the proxy, a sessionless client's fetches (librdkafka) are
reshaped: the proxy sends its own upstream session's Fetch and, for topic ids, its
own Metadata on the client's connection.  Those must carry the client's id, or every
client behind a proxy is one client to the broker.

Against real Kafka 4.4 (fixture ``kafka``): a consumer_byte_rate quota on one client
id; two confluent-kafka consumers (one with the throttled id, one without a quota)
read the same partition through the proxy with a record cap (so every fetch is
reshaped), then the same two directly.  The throttled id gets Fetch responses with a
throttle time (librdkafka's ``throttle_cb``), the other none and every record, through
the proxy exactly as direct.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

import confluent_kafka
import pytest
from support.kafka import KafkaCluster
from support.stack import ProxyStack

from proxy.observe.metrics import Metrics

pytestmark = [pytest.mark.kafka, pytest.mark.integration]

RECORDS = 600
VALUE = b"q" * 1000
QUOTA_BYTES_PER_SECOND = 16 * 1024
"""Far below what one fetch of the topic (~0.6 MB) carries: the first one is throttled."""
THROTTLE_WAIT_SECONDS = 20.0
"""How long the quota'd consumer keeps fetching without seeing a throttle time."""


@dataclass
class Consumed:
    records: int = 0
    throttles: list[int] = field(default_factory=list)
    """throttle_time_ms of each throttled response librdkafka reported."""


def consume(bootstrap: str, topic: str, client_id: str, *, until_throttled: bool) -> Consumed:
    """Read partition 0 from the start as *client_id*: until every record (and, with
    *until_throttled*, until the first throttled response instead), within a deadline."""
    out = Consumed()

    def throttled(event: Any) -> None:
        if event.throttle_time > 0:
            out.throttles.append(int(event.throttle_time * 1000))

    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "client.id": client_id,
            "group.id": f"{client_id}-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
            "throttle_cb": throttled,
            "log_level": 3,
        }
    )
    deadline = time.monotonic() + THROTTLE_WAIT_SECONDS
    try:
        consumer.assign(
            [confluent_kafka.TopicPartition(topic, 0, confluent_kafka.OFFSET_BEGINNING)]
        )
        while time.monotonic() < deadline:
            if until_throttled and out.throttles:
                break
            if not until_throttled and out.records >= RECORDS:
                break
            for msg in consumer.consume(500, 0.2):
                assert msg.error() is None, msg.error()
                out.records += 1
    finally:
        consumer.close()
    return out


@pytest.fixture(scope="module")
def topic(kafka: KafkaCluster) -> str:
    name = kafka.new_topic(1, prefix="quota")
    producer = confluent_kafka.Producer(  # batches of 5: the proxy's record cap trims
        {"bootstrap.servers": kafka.bootstrap, "batch.num.messages": 5, "log_level": 3}
    )
    for _ in range(RECORDS):
        producer.produce(name, VALUE, partition=0)
    assert producer.flush(30) == 0
    return name


def test_a_client_id_quota_applies_per_client_through_the_proxy_as_direct(
    kafka: KafkaCluster, topic: str
) -> None:
    run = uuid.uuid4().hex[:6]
    ids = {
        (route, kind): f"{kind}-{route}-{run}"
        for route in ("direct", "proxy")
        for kind in ("throttled", "free")
    }
    for route in ("direct", "proxy"):  # one quota per route: their windows stay apart
        kafka.set_client_quota(ids[(route, "throttled")], consumer_byte_rate=QUOTA_BYTES_PER_SECOND)

    metrics = Metrics(process_metrics=False)
    stack = ProxyStack({"max_records": 50}, upstream=kafka, metrics=metrics).start()
    try:
        seen = {
            "direct": {
                "free": consume(kafka.bootstrap, topic, ids[("direct", "free")], until_throttled=False),
                "throttled": consume(kafka.bootstrap, topic, ids[("direct", "throttled")], until_throttled=True),
            },
            "proxy": {
                "free": consume(stack.bootstrap, topic, ids[("proxy", "free")], until_throttled=False),
                "throttled": consume(stack.bootstrap, topic, ids[("proxy", "throttled")], until_throttled=True),
            },
        }  # fmt: skip
    finally:
        stack.stop()

    summary = {
        route: {kind: (c.records, len(c.throttles)) for kind, c in kinds.items()}
        for route, kinds in seen.items()
    }
    for route in ("direct", "proxy"):
        free, throttled = seen[route]["free"], seen[route]["throttled"]
        assert free.records == RECORDS and not free.throttles, (route, summary)
        assert throttled.throttles and min(throttled.throttles) > 0, (route, summary)
    # the record cap made the proxy reshape every fetch (its own upstream session's Fetch)
    shaped = sum(
        sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == "kafka_fetch_proxy_shaped_responses_total"
    )
    assert shaped > 0, summary
