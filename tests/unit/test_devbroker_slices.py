"""The dev cluster serves a large Fetch in slices: the same bytes, other tasks in between.

A Fetch is decoded, begun (session context), read, answered (session update) and
encoded in ranges of ``SLICE_PARTITIONS`` partitions (``*_in_ranges``), with a
checkpoint between two ranges in the cluster's :class:`~devbroker.cluster.Lane`.
"""

from __future__ import annotations

import random
import struct
import uuid
from collections.abc import Generator
from typing import Any

import pytest
import trio
from crc32c import crc32c
from kio.schema.errors import ErrorCode
from support.fetch_messages import counted, fetch_request, fetch_topics

from devbroker import cli
from devbroker import cluster as cluster_module
from devbroker.cluster import DevCluster, Lane
from devbroker.fetch import NodeFetcher
from devbroker.membership import GroupCoordinator
from devbroker.node import NodeDispatcher
from devbroker.outcome import Wait
from devbroker.session_cache import SESSION_ID_RANGE, ShardedSessionCache
from devbroker.state import ClusterState
from proxy.protocol import codec
from proxy.protocol.framing import encode_frame
from proxy.protocol.messages import make, request_module

NOW = 1000.0
EVERY = 3
A_ID, B_ID, UNKNOWN_ID = uuid.UUID(int=11), uuid.UUID(int=12), uuid.UUID(int=13)


def batch(count: int = 1, payload: int = 39) -> bytes:
    """A valid v2 batch of *count* records."""
    after_crc = (
        struct.pack(">hiqqqhii", 0, count - 1, 1000, 1000 + count, -1, -1, -1, count)
        + b"p" * payload
    )
    body = struct.pack(">ibI", 0, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(body)) + body


def dispatcher() -> NodeDispatcher:
    """Node 1 of a two-node cluster: topics a (30 partitions) and b (12), some with records,
    b-3 led by node 2; the same every time it is called (ids, session ids, clock)."""
    state = ClusterState("dev", [1, 2])
    a = state.create_topic("a", 30, A_ID)
    b = state.create_topic("b", 12, B_ID)
    for p in a.partitions + b.partitions:
        p.leader = 1
    b.partitions[3].leader = 2
    state.addresses.update({1: ("n1.test", 9001), 2: ("n2.test", 9002)})
    for i in (0, 2, 7, 29):
        a.partitions[i].log.append(batch(2), 0)
    b.partitions[5].log.append(batch(1, 3000), 0)
    sessions = ShardedSessionCache(1000, clock=lambda: NOW, rng=random.Random(7))
    fetcher = NodeFetcher(1, state, sessions)
    return NodeDispatcher(1, state, GroupCoordinator(state), fetcher, clock=lambda: NOW)


def part(version: int, index: int, offset: int = 0) -> Any:
    mod = request_module(1, version)
    return make(mod.FetchPartition, partition=index, fetch_offset=offset, partition_max_bytes=1024)


def ref(version: int, name: str) -> Any:
    """How a request names topic *name* at *version*."""
    if version < 13:
        return name
    return {"a": A_ID, "b": B_ID}.get(name, UNKNOWN_ID)


def request(
    version: int,
    parts: list[tuple[str, int, int]],
    forgotten: list[tuple[str, int]] = (),
    **kw: Any,
) -> Any:
    topics = fetch_topics(version, [(ref(version, t), part(version, i, o)) for t, i, o in parts])
    mod = request_module(1, version)
    gone = tuple(
        make(mod.ForgottenTopic, topic=ref(version, t), topic_id=ref(version, t), partitions=(i,))
        for t, i in forgotten
    )
    if version >= 7:
        kw.setdefault("forgotten_topics_data", gone)
    else:
        kw.pop("session_id", None)
        kw.pop("session_epoch", None)
    if version >= 15:
        kw["replica_state"] = make(mod.ReplicaState, replica_id=-1, replica_epoch=-1)
    return fetch_request(version, topics, **kw)


def whole(d: NodeDispatcher, frame: bytes, cid: int) -> bytes:
    outcome = d.handle(frame)
    assert isinstance(outcome, Wait)
    assert outcome.pending.poll(NOW)
    return codec.encode_response(outcome.pending.complete(), cid)


def sliced(d: NodeDispatcher, frame: bytes, cid: int) -> tuple[bytes, int]:
    outcome, yields = counted(d.handle_in_ranges(frame, EVERY))
    assert isinstance(outcome, Wait)
    pending = outcome.pending
    ready, n = counted(pending.poll_in_ranges(NOW, EVERY))
    assert ready
    yields += n
    response, n = counted(pending.complete_in_ranges(EVERY))
    yields += n
    gathered, n = counted(
        codec.encode_response_gathered_in_ranges(
            response, cid, path=codec.FETCH_RESPONSE_PARTITIONS, every=EVERY
        )
    )
    return gathered.join(), yields + n


def scenario(version: int) -> Generator[tuple[Any, str], int, None]:
    """Requests a consumer (and a hostile client) sends; the session id of the answer to a
    request that creates a session comes back through ``send``."""
    everything = [("a", i, 0) for i in range(30)] + [("b", i, 0) for i in range(12)]
    yield request(version, [*everything, ("a", 99, 0), ("c", 0, 0)]), "sessionless"
    yield request(version, everything, isolation_level=1), "read_committed"
    yield request(version, everything[:5], isolation_level=5), "invalid isolation level"
    if version < 7:
        return
    sid = yield request(version, everything, session_id=0, session_epoch=0), "new session"
    assert sid != 0
    changed = [("a", 2, 2), ("a", 31, 0), ("b", 5, 1)]
    yield (
        request(version, changed, [("b", 0), ("b", 1)], session_id=sid, session_epoch=1),
        "incremental",
    )
    yield request(version, [], session_id=sid, session_epoch=2), "incremental, nothing asked"
    yield request(version, [], session_id=sid, session_epoch=2), "stale epoch"
    yield (
        request(version, everything, session_id=8 * SESSION_ID_RANGE, session_epoch=1),
        "session id outside every shard",
    )


@pytest.mark.parametrize("version", [4, 7, 11, 12, 13, 16, 17])
def test_a_fetch_in_slices_answers_the_same_bytes(version: int) -> None:
    plain, ranged = dispatcher(), dispatcher()
    steps = scenario(version)
    req, what = next(steps)
    cid = 1
    while True:
        frame = codec.encode_request(req, cid, "consumer")
        expected = whole(plain, frame, cid)
        got, yields = sliced(ranged, frame, cid)
        assert got == expected, what
        if what == "sessionless":
            assert yields >= 44 // EVERY  # (decoded, begun, read, answered, encoded in ranges)
        _, body = codec.decode_response(1, version, got)
        if what.startswith("new session"):
            assert body.error_code == ErrorCode.none
        cid += 1
        try:
            req, what = steps.send(int(getattr(body, "session_id", 0)))
        except StopIteration:
            break


def test_each_partition_of_a_large_fetch_is_read_once_in_order() -> None:
    d = dispatcher()
    reads: list[int] = []
    assert d.fetcher is not None
    read = d.fetcher.read

    def counting(tp: Any, *args: Any) -> Any:
        reads.append(tp.partition)
        return read(tp, *args)

    d.fetcher.read = counting  # type: ignore[method-assign]
    frame = codec.encode_request(request(12, [("a", i, 0) for i in range(30)]), 1, "c")
    sliced(d, frame, 1)
    assert reads == list(range(30))


async def test_a_large_fetch_lets_other_tasks_run_between_its_slices(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A task that counts its turns sees them go on while one Fetch of 1,000 partitions is
    read (before, the reads were one step of the loop: every one saw the same count)."""
    monkeypatch.setattr(cluster_module, "SLICE_PARTITIONS", 50)
    turns = 0
    seen: list[int] = []
    read = NodeFetcher.read

    def counting(self: NodeFetcher, *args: Any) -> Any:
        seen.append(turns)
        return read(self, *args)

    monkeypatch.setattr(NodeFetcher, "read", counting)

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await trio.lowlevel.checkpoint()
            turns += 1

    frame = codec.encode_request(
        fetch_request(12, fetch_topics(12, [("wide", part(12, i)) for i in range(1000)])), 5, "c"
    )
    with trio.fail_after(30):
        async with DevCluster(nodes=1, topics={"wide": 1000}) as dev, trio.open_nursery() as n:
            n.start_soon(count_turns)
            host, port = dev.bootstrap.rsplit(":", 1)
            stream = await trio.open_tcp_stream(host, int(port))
            async with stream:
                await stream.send_all(encode_frame(frame))
                answer = b""
                while len(answer) < 4 or len(answer) < 4 + int.from_bytes(answer[:4], "big"):
                    chunk = await stream.receive_some(1 << 16)
                    assert chunk, "closed before the answer"
                    answer += chunk
            n.cancel_scope.cancel()
    assert codec.peek_correlation_id(answer[4:]) == 5
    assert len(seen) == 1000
    # 20 slices, a turn of the counter between two: trio runs a turn's tasks in either
    # order, so two slices in a row may see the same count, never three.
    assert len(set(seen)) >= 1000 // 50 // 2


def ranges(log: list[str], name: str, count: int) -> Generator[None, None, str]:
    for _ in range(count):
        log.append(name)
        yield
    return name


def after(log: list[str], name: str) -> list[str]:
    """What *log* holds after the last *name*."""
    return log[len(log) - log[::-1].index(name) :]


async def _until(predicate: Any) -> None:
    while not predicate():
        await trio.lowlevel.checkpoint()


async def test_the_lane_goes_to_the_request_that_arrived_first() -> None:
    lane = Lane()
    log: list[str] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as n:
            n.start_soon(lane.run, ranges(log, "holder", 50), 5.0)
            await _until(lambda: lane._busy)
            n.start_soon(lane.run, ranges(log, "late", 3), 9.0)
            n.start_soon(lane.run, ranges(log, "early", 3), 1.0)
            await _until(lambda: len(lane._waiting) == 2)
    # Each one's first range ran at once, outside the lane; the others in the lane.
    assert after(log, "holder") == ["early"] * 2 + ["late"] * 2
    assert not lane._busy and not lane._waiting


async def test_a_cancelled_request_leaves_the_lane_to_the_others() -> None:
    lane = Lane()
    log: list[str] = []
    with trio.fail_after(10):
        async with trio.open_nursery() as n:
            holder = trio.CancelScope()
            waiter = trio.CancelScope()

            async def run_in(scope: trio.CancelScope, name: str, count: int, at: float) -> None:
                with scope:
                    await lane.run(ranges(log, name, count), at)

            n.start_soon(run_in, holder, "holder", 10**6, 1.0)
            await _until(lambda: lane._busy)
            n.start_soon(run_in, waiter, "waiter", 10, 2.0)
            n.start_soon(lane.run, ranges(log, "last", 4), 3.0)
            await _until(lambda: len(lane._waiting) == 2)
            waiter.cancel()  # waiting: it leaves the queue
            await _until(lambda: len(lane._waiting) == 1)
            holder.cancel()  # in the lane: it hands the lane on
    assert log.count("waiter") == 1  # its first range only
    # The first ranges ran at once, outside the lane, whenever trio ran those tasks: before
    # or after the holder's last range (a cancel delivered at the holder's next checkpoint
    # can come before it logs again).  The lane's own ranges after the holder's: last's 3.
    in_lane = list(log)
    in_lane.remove("waiter")
    in_lane.remove("last")
    assert after(in_lane, "holder") == ["last"] * 3
    assert not lane._busy and not lane._waiting


def test_the_command_freezes_its_start_and_leaves_the_collector_its_young_generations(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(cli.gc, "collect", lambda *a: calls.append(("collect", *a)))
    monkeypatch.setattr(cli.gc, "freeze", lambda: calls.append(("freeze",)))
    monkeypatch.setattr(cli.gc, "get_threshold", lambda: (700, 10, 10))
    monkeypatch.setattr(cli.gc, "set_threshold", lambda *t: calls.append(("set_threshold", *t)))
    cli._collect_young()
    assert calls == [("collect",), ("freeze",), ("set_threshold", 700, 10, 2**31 - 1)]
