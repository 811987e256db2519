"""The memory budget taken when a response's size is known, on both backends.

Issue 17's "Done when" (part 3, KIP-81 / KIP-72): a fetch waiting upstream holds no
budget; a response the budget cannot take is not read from its broker connection until
it can (back-pressure); while others wait, no connection takes more than its fair share.
The proxy runs in-process (``ProxyStack``, so its budget and connections can be read) in
front of a one-node dev cluster and of real Kafka (``BACKENDS``), with a 64 MiB budget:
one fetch asks upstream for at most 4 MiB (budget/16), and all 64 MiB are usable.  The clients are raw (``support.rawclient``): what each
fetch asks is exact.  Where the test holds budget itself (``try_reserve``), it stands for
other connections' responses filling it.

The fourth budget property, a client that does not read its responses holding at most
``max_client_buffer_bytes`` and only for ``client_write_timeout_seconds``, is
``test_client_write_timeout.py`` (both backends).

Fails without the feature: on 62c1b6c's parent (budget reserved when a fetch is sent)
the long polls hold 4 MiB each and the normal consumer's fetches wait behind them, and a
fetch waits for budget before it is sent, not after its answer's size is read; without
the fair-share line of ``FetchAdmission.take`` (``if not first and held + nbytes >
self.share()``) the last connection's response is let in while 19 others wait.
"""

from __future__ import annotations

import os
import select
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import confluent_kafka
import pytest
from support.backends import BACKENDS, running, upstream_for
from support.fetch_messages import fetch_body, partition_body
from support.rawclient import RawClient, make_request
from support.stack import ProxyStack

from proxy.protocol.records import iter_batches

pytestmark = pytest.mark.integration

MIB = 1 << 20
BUDGET = 64 * MIB
DEADLINE = 90.0
LONG_POLLS = 20
"""At 4 MiB each (the old grant) they would have needed 80 MiB of the 64."""


@pytest.fixture(scope="module", params=BACKENDS)
def stack(request: pytest.FixtureRequest) -> Iterator[ProxyStack]:
    settings = {"memory_budget_bytes": BUDGET, "max_upstream_wait_ms": 30_000}
    upstream = upstream_for(request, request.param)
    with running(ProxyStack(settings, nodes=1, upstream=upstream, name="budget")) as s:
        yield s


def produce(stack: ProxyStack, topic: str, records: int, value: int) -> None:
    producer = confluent_kafka.Producer(
        {"bootstrap.servers": stack.direct_bootstrap, "linger.ms": 5, "batch.size": 16384}
    )
    for i in range(records):
        producer.produce(topic, os.urandom(value), partition=0)
        if i % 1000 == 999:
            producer.poll(0)
    assert producer.flush(30) == 0


def fetch(
    topic: str, offset: int, *, max_wait_ms: int, max_bytes: int, partition_bytes: int
) -> Any:
    """A sessionless Fetch v12 of partition 0 of *topic*."""
    topic_body = {"topic": topic, "partitions": [partition_body(0, offset, partition_bytes)]}
    return make_request(1, 12, fetch_body([topic_body], max_wait=max_wait_ms, max_bytes=max_bytes))


def records(response: Any) -> tuple[int, int]:
    """(records, next offset) of a Fetch response of one partition, which has no error."""
    [topic] = response.responses
    [part] = topic.partitions
    assert int(part.error_code) == 0, int(part.error_code)
    count, last = 0, -1
    for h in iter_batches(part.records or b""):
        count += h.records_count
        last = h.base_offset + h.records_count
    return count, last


def listener(stack: ProxyStack, topic: str) -> tuple[str, int]:
    """The proxy's listener for the leader of *topic*'s partition 0."""
    leader = stack.leader_of(topic, 0)
    return stack.run_sync(lambda: stack.proxy.book.advertised[leader])


def connect(address: tuple[str, int], name: str, deadline: float) -> RawClient:
    return RawClient(address, client_id=name, deadline=deadline)


def live(stack: ProxyStack, prefix: str) -> list[Any]:
    """The proxy's live connections whose client id starts with *prefix*."""

    def find() -> list[Any]:
        return [
            live
            for live in stack.proxy.live.values()
            if (live.connection.client_id or "").startswith(prefix)
        ]

    return stack.run_sync(find)


def until(check: Callable[[], object], deadline: float, what: str) -> None:
    """Until *check()* holds, looking again every 20 ms up to the test's deadline."""
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def readable(client: RawClient) -> bool:
    """Whether any byte of an answer has reached the client."""
    return bool(select.select([client.sock], [], [], 0)[0])


def budget_of(stack: ProxyStack) -> Any:
    path = stack.proxy.fetch_path
    assert path is not None
    return path


def test_long_polls_waiting_upstream_hold_no_budget_beside_a_normal_consumer(
    stack: ProxyStack,
) -> None:
    deadline = time.monotonic() + DEADLINE
    path = budget_of(stack)
    budget = path.budget
    idle = stack.create_topic(1, prefix="idle")
    normal = stack.create_topic(1, prefix="normal")
    produce(stack, normal, 2000, 1000)
    waits = stack.run_sync(lambda: path.fetch_waits)
    tag = f"longpoll-{uuid.uuid4().hex[:6]}-"
    address = listener(stack, idle)
    polls = [connect(address, f"{tag}{i}", deadline) for i in range(LONG_POLLS)]
    try:
        for c in polls:  # 30 s upstream, 64 MiB asked
            c.send(fetch(idle, 0, max_wait_ms=30_000, max_bytes=64 * MIB, partition_bytes=64 * MIB))

        def started() -> bool:
            handlers = [c.relay.fetch_handler for c in live(stack, tag)]
            return (
                sum(h.upstream_session is not None or h.budget_waits > 0 for h in handlers)
                == LONG_POLLS
            )

        until(started, deadline, "every long poll to start")
        assert stack.run_sync(lambda: path.fetch_waits) == waits  # every one went upstream...
        assert stack.run_sync(lambda: budget.used) == 0  # ...holding nothing
        assert not any(readable(c) for c in polls)  # still waiting there

        # A normal consumer beside them reads everything, never waiting for budget.
        with connect(listener(stack, normal), f"normal-{tag}", deadline) as consumer:
            got, offset = 0, 0
            while got < 2000:
                answer = consumer.request(
                    fetch(normal, offset, max_wait_ms=500, max_bytes=MIB, partition_bytes=MIB)
                )
                count, next_offset = records(answer)
                got, offset = got + count, max(offset, next_offset)
        assert got == 2000
        assert stack.run_sync(lambda: path.fetch_waits) == waits
        assert not any(readable(c) for c in polls)
    finally:
        for c in polls:
            c.close()
    until(lambda: not live(stack, tag), deadline, "the long polls' connections to close")
    assert stack.run_sync(lambda: budget.used) == 0


def test_a_response_the_budget_cannot_take_waits_unread_until_it_can(stack: ProxyStack) -> None:
    deadline = time.monotonic() + DEADLINE
    path = budget_of(stack)
    budget = path.budget
    topic = stack.create_topic(1, prefix="pressure")
    produce(stack, topic, 400, 1000)  # ~400 KB: one answer of many reads
    hog = stack.run_sync(lambda: budget.try_reserve(budget.headroom))  # others fill it
    assert hog is not None
    name = f"pressure-{uuid.uuid4().hex[:6]}"
    try:
        waits = stack.run_sync(lambda: path.fetch_waits)
        with connect(listener(stack, topic), name, deadline) as client:
            cid = client.send(fetch(topic, 0, max_wait_ms=500, max_bytes=MIB, partition_bytes=MIB))
            until(lambda: stack.run_sync(lambda: path.fetch_waits) == waits + 1, deadline, "a wait")
            [conn] = live(stack, name)
            # The fetch went upstream (it waited for nothing); its answer's size is known
            # and it waits in the broker's socket: that connection is not read.
            assert stack.run_sync(lambda: conn.relay.fetch_handler.upstream_session) is not None
            assert stack.run_sync(lambda: conn.connection.upstream_paused)
            assert not readable(client)
            assert stack.run_sync(lambda: budget.used) == budget.capacity
            stack.run_sync(hog.release)
            count, next_offset = records(client.receive(1, 12, cid))
            assert (count, next_offset) == (400, 400)  # whole, once budget came back
            assert stack.run_sync(lambda: path.fetch_waits) == waits + 1
    finally:
        stack.run_sync(hog.release)  # idempotent


ROOM = 15 * MIB // 4
"""What the budget has room for while the fair-share test holds the rest: 3.75 MiB."""
WAITERS = 19
"""Responses of 4 MiB each waiting: the share is then (64 - 4) MiB / 20 = 3 MiB."""
FAIR_BYTES = 7 * MIB // 2
"""The last connection's response, about 3.5 MiB: within ROOM, beyond the share."""


def test_no_connection_takes_more_than_its_fair_share_while_others_wait(
    stack: ProxyStack,
) -> None:
    deadline = time.monotonic() + DEADLINE
    path = budget_of(stack)
    budget = path.budget
    topic = stack.create_topic(1, prefix="share")
    produce(stack, topic, 4608, 1024)  # 4.5 MiB in batches of 16 KiB
    hog = stack.run_sync(lambda: budget.try_reserve(budget.headroom - ROOM))
    assert hog is not None
    tag = f"share-{uuid.uuid4().hex[:6]}-"
    clients: list[RawClient] = []
    try:
        waits = stack.run_sync(lambda: path.fetch_waits)
        address = listener(stack, topic)
        cids = []
        for i in range(WAITERS):
            clients.append(connect(address, f"{tag}w{i}", deadline))
            four = fetch(topic, 0, max_wait_ms=0, max_bytes=64 * MIB, partition_bytes=4 * MIB)
            cids.append(clients[-1].send(four))
        until(
            lambda: stack.run_sync(lambda: path.fetch_waits) == waits + WAITERS,
            deadline,
            f"{WAITERS} responses of 4 MiB to wait for 3.75 MiB of room",
        )
        last = connect(address, f"{tag}last", deadline)
        clients.append(last)
        cids.append(
            last.send(
                fetch(topic, 0, max_wait_ms=0, max_bytes=64 * MIB, partition_bytes=FAIR_BYTES)
            )
        )

        def waits_or_answered() -> bool:
            assert not readable(last), "let in beyond its fair share while others wait"
            return bool(stack.run_sync(lambda: path.fetch_waits) == waits + WAITERS + 1)

        until(waits_or_answered, deadline, "the last response to wait")
        # It would have fit: the room is as it was, and larger than its response.
        assert stack.run_sync(lambda: budget.headroom) == ROOM
        [conn] = live(stack, f"{tag}last")
        assert stack.run_sync(lambda: conn.connection.upstream_paused)
        assert not readable(last)

        # The rest comes back: every one is served, in turn.
        stack.run_sync(hog.release)
        with ThreadPoolExecutor(len(clients)) as pool:
            answers = list(
                pool.map(
                    lambda cc: records(cc[0].receive(1, 12, cc[1])), zip(clients, cids, strict=True)
                )
            )
        assert all(count > 0 for count, _ in answers), answers
        assert stack.run_sync(lambda: budget.peak) <= budget.capacity
    finally:
        stack.run_sync(hog.release)
        for c in clients:
            c.close()
    until(lambda: not live(stack, tag), deadline, "the connections to close")
    assert stack.run_sync(lambda: budget.used) == 0
