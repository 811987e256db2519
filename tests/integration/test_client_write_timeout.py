"""A client that stops reading its responses holds little of the memory budget, not for long.

Issue 17 part 3: a client that does not read its responses holds at most
``max_client_buffer_bytes`` of the budget (a Fetch response takes its budget only when
it fits beside what the client has not taken, or when nothing waits for the client), and
only for ``client_write_timeout_seconds``: a write to it that does not complete in that
time closes its connection, which gives the budget its responses held back.  Meanwhile
other clients are served.  On both backends (``BACKENDS``), the proxy in-process
(``ProxyStack``) so its connections and budget can be read.
"""

from __future__ import annotations

import os
import socket
import struct
import time
import uuid
from collections.abc import Iterator
from typing import Any

import confluent_kafka
import pytest
from support.backends import BACKENDS, running, upstream_for
from support.fetch_messages import fetch_body, partition_body
from support.rawclient import make_request
from support.stack import ProxyStack

from proxy.protocol import codec

pytestmark = pytest.mark.integration

LIMIT = 256 * 1024
PARTITION_BYTES = 150 * 1024
"""Each stalled fetch's answer: less than LIMIT, so two of them do not fit in it."""
TIMEOUT_SECONDS = 1.5
RECORDS = 1000
VALUE = 1000
FETCHES = 60
"""Pipelined by the stalled client: far more than the kernel's socket buffers take."""
DEADLINE = 60.0


@pytest.fixture(scope="module", params=BACKENDS)
def stack(request: pytest.FixtureRequest) -> Iterator[ProxyStack]:
    settings = {
        "memory_budget_bytes": 64 * 1024 * 1024,
        "max_client_buffer_bytes": LIMIT,
        "client_write_timeout_seconds": TIMEOUT_SECONDS,
    }
    with running(ProxyStack(settings, upstream=upstream_for(request, request.param))) as s:
        yield s


def fetch(topic: str) -> Any:
    topic_body = {"topic": topic, "partitions": [partition_body(0, 0, PARTITION_BYTES)]}
    return make_request(1, 12, fetch_body([topic_body], max_wait=0, max_bytes=1 << 20))


def produce(bootstrap: str, topic: str) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": bootstrap, "linger.ms": 5, "batch.size": 16384}
    )
    for _ in range(RECORDS):
        producer.produce(topic, os.urandom(VALUE), partition=0)
    assert producer.flush(30) == 0


def consume(bootstrap: str, topic: str, deadline: float) -> int:
    consumer = confluent_kafka.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
        }
    )
    got = 0
    try:
        consumer.assign([confluent_kafka.TopicPartition(topic, 0, 0)])
        while got < RECORDS and time.monotonic() < deadline:
            for msg in consumer.consume(500, 0.2):
                assert msg.error() is None, msg.error()
                got += 1
    finally:
        consumer.close()
    return got


def closed_by_peer(sock: socket.socket, deadline: float) -> bool:
    """Read until the proxy closes the connection (True) or the deadline passes (False)."""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(1 << 20):
                return True
        except ConnectionResetError:
            return True
        except TimeoutError:
            return False
    return False


def test_a_client_that_stops_reading_holds_at_most_its_buffer_and_only_for_the_timeout(
    stack: ProxyStack,
) -> None:
    deadline = time.monotonic() + DEADLINE
    topic = stack.create_topic(1, prefix="stall")
    produce(stack.direct_bootstrap, topic)
    leader = stack.leader_of(topic, 0)
    address = stack.run_sync(lambda: stack.proxy.book.advertised[leader])
    fetch_path = stack.proxy.fetch_path
    assert fetch_path is not None
    budget = fetch_path.budget

    # The stalled client: a receive buffer of a few KiB it never reads, many fetches.
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    try:
        sock.connect(address)
        frames = b""
        for cid in range(1, FETCHES + 1):
            frame = codec.encode_request(fetch(topic), cid, "stalled")
            frames += struct.pack(">i", len(frame)) + frame
        sock.sendall(frames)

        def stalled() -> Any:
            found = [
                live.connection
                for live in stack.proxy.live.values()
                if live.connection.client_id == "stalled"
            ]
            return found[0] if found else None

        conn = None
        while conn is None and time.monotonic() < deadline:
            conn = stack.run_sync(stalled)
            time.sleep(0.05)
        assert conn is not None
        # Others are served meanwhile (the stalled connection holds its buffer at most).
        assert consume(stack.bootstrap, topic, deadline) == RECORDS
        # Its write does not complete: the connection closes after the timeout (read
        # from the proxy's side: reading the socket here would let the write go on)...
        while stack.run_sync(lambda: conn.outcome.reason) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stack.run_sync(lambda: conn.outcome.reason) == "client_write_timeout"
        assert closed_by_peer(sock, deadline)
    finally:
        sock.close()
    # ...having queued at most the limit: a second answer never joined one it had not taken.
    assert 0 < conn.peak_buffered <= LIMIT
    # ...and nothing it held is reserved any more (the consumer closed too).
    while stack.run_sync(lambda: budget.used) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stack.run_sync(lambda: budget.used) == 0
