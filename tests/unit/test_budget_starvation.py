"""Memory taken when a response's size is known (issue 17 part 3, KIP-81 / KIP-72), on loopback.

The proxy in-process in front of the dev cluster, spoken to in raw Fetch frames:
long polls with large max_bytes hold no budget while they wait upstream, so a
normal consumer beside them keeps receiving (before: each long poll held
budget/16 for its whole wait and the consumer's fetches queued behind them);
and a response the budget cannot take is not read from its broker connection
until budget comes back (back-pressure), then arrives whole.
"""

from __future__ import annotations

import trio
import trio.testing
from support.batches import make_batch
from support.fetch_messages import fetch_body, partition_body
from support.loopback import request, settings
from support.rawclient import make_request
from support.trio_waits import until

from devbroker.cluster import DevCluster
from proxy.fetchpath import FetchPath
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.protocol.records import iter_batches
from proxy.server.proxy import Proxy

TIMEOUT = 30
HOGS = 20
RECORDS = 2000
MIB = 1 << 20


def fetch(topic: str, offset: int, *, max_wait_ms: int, max_bytes: int, cid: int) -> bytes:
    """A sessionless Fetch v12 of partition 0 of *topic* from *offset*."""
    topic_body = {"topic": topic, "partitions": [partition_body(0, offset, max_bytes)]}
    body = fetch_body([topic_body], max_wait=max_wait_ms, max_bytes=max_bytes)
    return codec.encode_request(make_request(1, 12, body), cid, "t")


def records(frame: bytes) -> tuple[int, int]:
    """(records, next offset) of a Fetch v12 response of one partition."""
    _, response = codec.decode_response(1, 12, frame)
    [topic] = response.responses
    [part] = topic.partitions
    assert int(part.error_code) == 0
    count, last = 0, -1
    for h in iter_batches(part.records or b""):
        count += h.records_count
        last = h.base_offset + h.records_count
    return count, last


def fill(cluster: DevCluster, topic: str, count: int, per_batch: int, payload: int) -> None:
    """*count* records in batches of *per_batch* with *payload* bytes of (opaque) records each."""
    part = cluster.state.partition(topic, 0)
    assert part is not None
    for _ in range(count // per_batch):
        part.log.append(make_batch(0, per_batch, b"x" * payload), part.leader_epoch)


async def test_long_polls_with_large_max_bytes_hold_no_budget_beside_a_normal_consumer() -> None:
    with trio.fail_after(TIMEOUT):
        topics = {"hog": 1, "normal": 1}
        async with DevCluster(nodes=1, topics=topics) as cluster, trio.open_nursery() as nursery:
            fill(cluster, "normal", RECORDS, per_batch=10, payload=10_000)
            # 16 MiB: each long poll would have been granted 1 MiB for its whole wait,
            # and the 30 s upstream wait keeps them waiting throughout the test.
            proxy = await nursery.start(
                Proxy(
                    settings(
                        cluster.bootstrap,
                        memory_budget_bytes=16 * MIB,
                        max_upstream_wait_ms=30_000,
                    )
                ).serve
            )
            await proxy.discovered.wait()
            path: FetchPath = proxy.fetch_path
            budget = path.budget
            port = proxy.bootstrap.port
            hogs = [await trio.open_tcp_stream("127.0.0.1", port) for _ in range(HOGS)]
            for n, stream in enumerate(hogs):
                frame = fetch("hog", 0, max_wait_ms=30_000, max_bytes=64 * MIB, cid=n)
                await stream.send_all(encode_frame(frame))
            await until(
                lambda: (
                    sum(h.upstream_session is not None or h.budget_waits > 0 for h in path.handlers)
                    == HOGS
                )
            )
            assert path.fetch_waits == 0  # every long poll went upstream ...
            assert budget.used == 0  # ... holding nothing while it waits

            # A normal consumer beside them reads everything, never waiting for budget.
            normal = await trio.open_tcp_stream("127.0.0.1", port)
            decoder = FrameDecoder(64 * MIB)
            got, offset, cid = 0, 0, 100
            while got < RECORDS:
                frame = fetch("normal", offset, max_wait_ms=500, max_bytes=64 * 1024, cid=cid)
                count, offset = records(await request(normal, decoder, frame))
                got += count
                cid += 1
            assert got == RECORDS and path.fetch_waits == 0
            assert budget.peak <= budget.capacity
            for stream in [*hogs, normal]:
                await stream.aclose()
            nursery.cancel_scope.cancel()


async def test_a_response_the_budget_cannot_take_is_not_read_until_it_can() -> None:
    with trio.fail_after(TIMEOUT):
        async with DevCluster(nodes=1, topics={"t": 1}) as cluster, trio.open_nursery() as nursery:
            fill(cluster, "t", 4000, per_batch=100, payload=4096)  # 160 KiB: several reads
            proxy = await nursery.start(
                Proxy(settings(cluster.bootstrap, memory_budget_bytes=16 * MIB)).serve
            )
            await proxy.discovered.wait()
            path: FetchPath = proxy.fetch_path
            budget = path.budget
            hog = budget.try_reserve(budget.headroom)  # others' responses fill the budget
            assert hog is not None
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap.port)
            decoder = FrameDecoder(64 * MIB)
            answer: list[bytes] = []

            async def consume() -> None:
                frame = fetch("t", 0, max_wait_ms=500, max_bytes=MIB, cid=1)
                answer.append(await request(stream, decoder, frame))

            nursery.start_soon(consume)
            await until(lambda: path.fetch_waits == 1)  # its size is known: it waits, unread
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert answer == [] and budget.used == budget.capacity
            # the fetch was sent (it waited for nothing); its answer waits in the socket
            assert [h.upstream_session is not None for h in path.handlers] == [True]
            hog.release()
            await until(lambda: bool(answer))
            assert records(answer[0]) == (4000, 4000)  # whole, once budget came back
            await stream.aclose()
            nursery.cancel_scope.cancel()
