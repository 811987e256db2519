"""The byte-level bounds on client requests at the edge (issue 19, "request bytes have no bound").

Four levels: the sans-I/O framing (the non-Produce frame limit from the length prefix
and API key), the sans-I/O request memory (``proxy.relay.request_memory``: the share,
the pool reserved from length prefixes, the per-connection cap, who waits first), the
relay (what it holds of a request, and for how long), ``Connection`` over in-memory
streams (the frame timeout, the pool and the cap as back-pressure), and the whole proxy
in front of an in-process dev cluster over loopback sockets: eight clients each pushing
a 64 MiB frame they never finish while another client is served.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import random
import struct
import sys
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import structlog
import trio
import trio.testing
from kio.schema.fetch.v12 import request as fetch12
from kio.schema.types import BrokerId, TopicName
from kio.static.primitive import i8, i32, i32Timedelta, i64
from support.loopback import API_VERSIONS, request, settings

from devbroker.cluster import DevCluster
from proxy import config
from proxy.observe.metrics import Metrics
from proxy.protocol import codec
from proxy.protocol.errors import FrameTooLarge
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.relay.relay import ClientRequest, PassThroughFetch, Relay, Upstream
from proxy.relay.request_memory import WAIT_OWN, WAIT_POOL, RequestMemory
from proxy.server.connection import Connection
from proxy.server.idle import IdleTimer
from proxy.server.proxy import Proxy

P = "kafka_fetch_proxy_"
MiB = 1 << 20


def resolve(node_id: int, host: str, port: int) -> tuple[str, int]:
    return ("proxy", 9000 + node_id)


def header(api_key: int, version: int, cid: int) -> bytes:
    return struct.pack(">hhi", api_key, version, cid) + b"\x00\x03app"


def produce(cid: int, size: int, acks: int = 1) -> bytes:
    """A Produce v3 frame of *size* bytes (null transactional id, *acks*, padding)."""
    head = header(0, 3, cid) + struct.pack(">hh", -1, acks)
    return head + b"\x00" * (size - len(head))


def opaque(api_key: int, cid: int, size: int) -> bytes:
    head = header(api_key, 2, cid)
    return head + b"x" * (size - len(head))


async def until(changed: Callable[[], Awaitable[None]], ready: Callable[[], bool]) -> None:
    while not ready():
        await changed()


# --- settings -------------------------------------------------------------------------------


def test_the_request_limits_are_settings_with_sidecar_defaults(tmp_path: Path) -> None:
    s = config.validate({"upstream": ["k:9092"]})
    assert s.max_request_frame_bytes == 8 * MiB  # over twice Metadata for 100,000 topics
    assert s.request_frame_timeout_seconds == 30  # Kafka clients' request.timeout.ms
    assert s.max_buffered_request_bytes == 32 * MiB  # the Java producer's buffer.memory
    assert s.max_queued_request_bytes == 8 * MiB
    keys = {key: (flag, env) for key, flag, env in config.option_names()}
    assert keys["max_request_frame_bytes"] == (
        "--max-request-frame-bytes",
        "KAFKA_FETCH_PROXY_MAX_REQUEST_FRAME_BYTES",
    )
    path = tmp_path / "proxy.toml"
    path.write_text('upstream = ["k:1"]\nmax_buffered_request_bytes = 1048576\n')
    s = config.load(
        config_file=path,
        env={"KAFKA_FETCH_PROXY_REQUEST_FRAME_TIMEOUT_SECONDS": "0"},
        flags=argparse.Namespace(cfg__max_queued_request_bytes="65536"),
    )
    assert s.max_buffered_request_bytes == MiB and s.request_frame_timeout_seconds == 0
    assert s.max_queued_request_bytes == 65536
    with pytest.raises(config.ConfigError) as info:
        config.validate({"upstream": ["k:1"], "max_queued_request_bytes": 1000})
    assert "max_queued_request_bytes" in str(info.value) and ">= 65536" in str(info.value)
    with pytest.raises(config.ConfigError):
        config.validate({"upstream": ["k:1"], "request_frame_timeout_seconds": -1})


# --- framing: requests that are not Produce -----------------------------------------------


def test_a_large_request_that_is_not_produce_is_refused_once_its_api_key_is_in() -> None:
    dec = FrameDecoder(MiB, max_request_frame_bytes=1000)
    dec.feed(struct.pack(">i", 1001))
    assert dec.next_frame() is None  # the API key decides, not the body
    dec.feed(struct.pack(">h", 3)[:1])
    assert dec.next_frame() is None
    dec.feed(struct.pack(">h", 3)[1:])
    with pytest.raises(FrameTooLarge) as info:
        dec.next_frame()
    assert info.value.size == 1001 and info.value.limit == 1000
    assert "api key 3, not Produce" in str(info.value)
    assert dec.buffered == 6  # the prefix and the key, nothing of the body


def test_produce_may_use_the_whole_frame_limit_and_small_requests_pass() -> None:
    dec = FrameDecoder(MiB, max_request_frame_bytes=1000)
    big = produce(1, 50_000)
    small = [opaque(key, 2, 1000) for key in (1, 3, 8, 18)]  # at the limit: any API
    stream = b"".join(encode_frame(f) for f in [big, *small])
    for i in range(0, len(stream), 997):  # in pieces that cut prefixes and keys
        dec.feed(stream[i : i + 997])
    assert dec.frames() == [big, *small]
    with pytest.raises(FrameTooLarge):  # one byte more, not Produce
        dec.feed(encode_frame(opaque(1, 3, 1001)))
        dec.frames()


def test_missing_is_what_completes_the_frame_in_progress() -> None:
    dec = FrameDecoder(MiB)
    assert dec.missing is None
    frame = opaque(8, 1, 100_000)
    wire = encode_frame(frame)
    dec.feed(wire[:3])
    assert dec.next_frame() is None and dec.missing is None  # size not known yet
    dec.feed(wire[3:1000])
    assert dec.next_frame() is None and dec.missing == len(wire) - 1000
    dec.feed(wire[1000:])
    assert dec.next_frame() == frame and dec.missing is None


# --- the request memory (sans-I/O) --------------------------------------------------------


def test_between_frames_a_connection_reads_within_its_share_without_the_pool() -> None:
    pool = RequestMemory(10_000, per_connection=50_000, share=1000)
    a = pool.account()
    assert a.next_read(0, 0, None) == 1000
    assert a.next_read(600, 100, None) == 400
    assert a.next_read(200, 20, 300) == 800  # a frame that fits the share: read on past it
    assert pool.used == 0


def test_a_frame_beyond_the_share_is_reserved_whole_and_read_to_its_end_only() -> None:
    pool = RequestMemory(10_000, per_connection=50_000, share=1000)
    a = pool.account()
    assert a.next_read(100, 100, 5000) == 5000  # never a byte of the next frame
    assert pool.used == 100 + 5000 - 1000 == a.reserved
    a.received(5000)
    a.settle(5100)  # complete, queued upstream: still held
    assert pool.used == 4100
    a.settle(0)  # written upstream
    assert pool.used == 0 and a.reserved == 0


def test_a_connection_the_pool_cannot_serve_waits_and_is_woken_when_memory_comes_back() -> None:
    pool = RequestMemory(10_000, per_connection=50_000, share=1000)
    a, b = pool.account(), pool.account()
    woken: list[str] = []
    b.wake = lambda: woken.append("b")
    assert a.next_read(10, 10, 9000) == 9000
    assert b.next_read(10, 10, 5000) == WAIT_POOL and pool.waiting == 1
    assert b.next_read(10, 10, 5000) == WAIT_POOL and not woken  # asking again changes nothing
    a.received(9000)
    a.settle(9010)
    assert not woken  # still held
    a.settle(0)
    assert woken == ["b"] and b.reserved == 4010 and pool.waiting == 0
    assert b.next_read(10, 10, 5000) == 5000


def test_waiters_are_let_in_in_the_order_they_asked_and_nobody_passes_the_first() -> None:
    pool = RequestMemory(10_000, per_connection=50_000, share=1000)
    hog, heavy, light, late = (pool.account() for _ in range(4))
    order: list[str] = []
    for name, acct in (("heavy", heavy), ("light", light), ("late", late)):
        acct.wake = lambda name=name: order.append(name)  # type: ignore[misc]
    assert hog.next_read(0, 0, 10_000) == 10_000  # the pool is full
    assert heavy.next_read(900, 10, 3000) == WAIT_POOL  # holds 900 (whole frames)
    assert light.next_read(10, 10, 3000) == WAIT_POOL
    assert late.next_read(10, 10, 9000) == WAIT_POOL  # large: will not fit beside them
    hog.received(10_000)
    hog.settle(0)
    assert order == ["heavy", "light"] and pool.waiting == 1
    small = pool.account()
    assert small.next_read(0, 0, 2000) == WAIT_POOL  # would fit, but does not pass late
    for acct in (light, heavy):
        acct.received(3000)
        acct.settle(0)
    assert order == ["heavy", "light", "late"]  # late first, then small beside it
    assert pool.waiting == 0 and small.next_read(0, 0, 2000) == 2000


def test_a_frame_larger_than_the_pool_is_let_in_when_the_pool_is_empty() -> None:
    pool = RequestMemory(10_000, per_connection=100_000, share=1000)
    a, big = pool.account(), pool.account()
    woken: list[str] = []
    big.wake = lambda: woken.append("big")
    assert a.next_read(0, 0, 2000) == 2000
    assert big.next_read(0, 0, 50_000) == WAIT_POOL  # larger than the pool: waits for empty
    a.received(2000)
    a.settle(0)
    assert woken == ["big"] and pool.used == 49_000  # alone, so it cannot wait forever
    assert pool.peak_used <= max(pool.limit, 50_000)


def test_a_connection_holds_at_most_its_cap_unless_one_frame_alone_is_larger() -> None:
    pool = RequestMemory(1 << 30, per_connection=4000, share=1000)
    a = pool.account()
    assert a.next_read(3000, 10, 2000) == WAIT_OWN  # 3000 held + 2010: beyond the cap
    assert a.next_read(3500, 0, None) == WAIT_OWN  # nor a read-ahead beyond it
    assert a.next_read(10, 10, 9000) == 9000  # the frame alone: read
    a.received(9000)
    a.settle(0)
    assert pool.used == 0


def test_a_closed_connection_gives_everything_back_and_wakes_the_next() -> None:
    pool = RequestMemory(10_000, per_connection=50_000, share=1000)
    a, b = pool.account(), pool.account()
    woken: list[str] = []
    b.wake = lambda: woken.append("b")
    assert a.next_read(500, 500, 9000) == 9000
    assert b.next_read(0, 0, 3000) == WAIT_POOL
    a.close()
    assert woken == ["b"] and pool.used == b.reserved == 2000
    b.close()
    assert pool.used == 0 and pool.held == 0 and pool.accounts == 0
    b.settle(5000)  # a task of the ended connection, still unwinding
    b.close()
    assert pool.used == 0 and pool.held == 0 and pool.accounts == 0


@pytest.mark.parametrize("seed", range(50))
def test_any_interleaving_drains_every_connection_within_the_bounds(seed: int) -> None:
    """A model of the edge over the real decoder: connections read (as much as they are
    allowed, in random pieces), hand whole frames upstream later, in a random order.
    Nobody waits forever, and what is held never leaves the bounds."""
    rng = random.Random(seed)
    share, limit, cap = 1000, 20_000, 30_000
    pool = RequestMemory(limit, per_connection=cap, share=share)

    class Conn:
        def __init__(self) -> None:
            sizes = [rng.choice((10, 200, 900, 3000, 15_000, 45_000)) for _ in range(8)]
            self.largest = max(sizes) + 4
            self.stream = b"".join(encode_frame(b"\x00\x00" + b"x" * (n - 2)) for n in sizes)
            self.frames = len(sizes)
            self.decoder = FrameDecoder(MiB, max_request_frame_bytes=MiB)
            self.account = pool.account()
            self.account.wake = self.woken
            self.whole = 0  # bytes of whole frames not yet handed upstream
            self.runnable = True

        def woken(self) -> None:
            self.runnable = True

        @property
        def held(self) -> int:
            return self.decoder.buffered + self.whole

    conns = [Conn() for _ in range(6)]
    largest = max(c.largest for c in conns)
    for _ in range(100_000):
        reads = [c for c in conns if c.runnable and c.stream]
        writes = [c for c in conns if c.whole]
        if not reads and not writes:
            break
        c = rng.choice(reads + writes)
        if c in writes and (c not in reads or rng.random() < 0.5):
            c.whole = 0  # handed upstream
            c.account.settle(c.held)
            c.runnable = True  # its own requests drained
        else:
            allowed = c.account.next_read(c.held, c.decoder.buffered, c.decoder.missing)
            if allowed in (WAIT_OWN, WAIT_POOL):
                c.runnable = False
                continue
            assert isinstance(allowed, int) and allowed > 0
            n = min(rng.randint(1, allowed), len(c.stream))
            data, c.stream = c.stream[:n], c.stream[n:]
            c.account.received(n)
            c.decoder.feed(data)
            for frame in c.decoder.frames():
                c.whole += len(frame)
                c.frames -= 1
        total = sum(x.held for x in conns)
        assert total <= pool.used + len(conns) * share, (total, pool.used)
        assert pool.used <= max(limit, largest), pool.used
    assert all(not c.stream and not c.frames and not c.whole for c in conns), "a connection waits"
    for c in conns:
        c.account.settle(0)
        c.account.close()
    assert pool.used == 0 and pool.waiting == 0


# --- the relay: what it holds of a request, and how many copies -----------------------------


class ForwardingFetch(PassThroughFetch):
    """A fetch handler that sends the client's fetch upstream as it is (the pass-through's
    edge part: it holds no memory budget)."""

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None:
        upstream.send(
            request.frame,
            api_key=request.header.api_key,
            api_version=request.header.api_version,
            on_response=request.reply,
        )


class HoldingFetch:
    """A fetch handler that answers only when told (a fetch waiting for memory budget)."""

    def __init__(self) -> None:
        self.requests: list[ClientRequest] = []

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None:
        self.requests.append(request)

    def observe(self, api_key: int, api_version: int, frame: bytes) -> None:
        return None

    def answer(self) -> None:
        request = self.requests.pop(0)
        request.reply(struct.pack(">i", request.header.correlation_id) + b"\x00" * 8)


def test_the_relay_holds_a_fetch_frame_until_it_is_answered() -> None:
    handler = HoldingFetch()
    relay = Relay(resolve, fetch_handler=handler)
    fetches = [opaque(1, c, 3000) for c in range(3)]
    for f in fetches:
        relay.client_frame(f)
    assert relay.held_bytes == 9000
    handler.answer()
    assert relay.held_bytes == 6000
    relay.client_frame(opaque(8, 9, 500))  # relayed: held while queued upstream
    assert relay.held_bytes == 6500
    relay.take_upstream()
    assert relay.held_bytes == 6000


def test_a_relayed_request_is_copied_once_and_not_kept_while_its_answer_is_awaited() -> None:
    relay = Relay(resolve)
    frame = produce(1, 4 * MiB)
    baseline = sys.getrefcount(frame)
    tracemalloc.start()
    try:
        relay.client_frame(frame)
        (sent,) = relay.take_upstream()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sent[8:] == frame[8:] and struct.unpack(">i", sent[4:8]) == (0,)
    assert peak < 1.25 * len(frame)  # one copy for the relay's correlation id, not two
    del sent
    assert relay.in_flight == 1  # its answer is awaited...
    assert sys.getrefcount(frame) == baseline  # ...without keeping its bytes


# --- Connection over in-memory streams --------------------------------------------------------


class Served:
    """A Connection over in-memory streams; the test plays the client and the broker."""

    def __init__(
        self,
        *,
        pool: RequestMemory | None = None,
        fetch_handler: ForwardingFetch | None = None,
        gate: trio.MemoryReceiveChannel[None] | None = None,
        **options: object,
    ) -> None:
        self.gate = gate
        """When given, the broker answers each request only after one item from it."""
        self.client, proxy_client_side = trio.testing.memory_stream_pair()
        proxy_upstream_side, self.broker = trio.testing.memory_stream_pair()
        self.relay = Relay(resolve, fetch_handler=fetch_handler)
        self.conn = Connection(
            proxy_client_side,
            proxy_upstream_side,
            self.relay,
            max_frame_bytes=64 * MiB,
            request_memory=pool,
            **options,  # type: ignore[arg-type]
        )
        self.reason: str | None = None
        self.ended = trio.Event()
        self.upstream_bytes = 0

    def start(self, nursery: trio.Nursery) -> None:
        if self.conn.idle is not None:
            nursery.start_soon(self.conn.idle.run)

        async def run() -> None:
            self.reason = await self.conn.run()
            await trio.aclose_forcefully(self.conn.client)
            await trio.aclose_forcefully(self.conn.upstream)
            self.ended.set()

        async def broker() -> None:  # answers every request with its correlation id
            decoder = FrameDecoder(64 * MiB)
            while data := await self.broker.receive_some(1 << 20):
                self.upstream_bytes += len(data)
                decoder.feed(data)
                for frame in decoder.frames():
                    if self.gate is not None:
                        await self.gate.receive()
                    await self.broker.send_all(encode_frame(frame[4:8] + b"ok"))

        nursery.start_soon(run)
        nursery.start_soon(broker)

    async def answers(self, count: int) -> list[int]:
        decoder = FrameDecoder(MiB)
        got: list[int] = []
        while len(got) < count:
            data = await self.client.receive_some(65536)
            assert data, "closed"
            decoder.feed(data)
            got += [struct.unpack(">i", f[:4])[0] for f in decoder.frames()]
        return got


async def test_a_request_that_is_not_produce_beyond_its_limit_closes_the_connection() -> None:
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            s = Served(max_request_frame_bytes=8 * MiB)
            s.start(nursery)
            await s.client.send_all(encode_frame(produce(1, 9 * MiB)))  # Produce: relayed
            assert await s.answers(1) == [1]
            await s.client.send_all(struct.pack(">ih", 9 * MiB, 3))  # Metadata of 9 MiB
            await s.ended.wait()
    assert s.reason == "protocol_error" and s.conn.outcome.frame_too_large
    assert "api key 3, not Produce" in (s.conn.outcome.error or "")


async def test_a_trickled_frame_is_closed_at_the_frame_timeout(
    autojump_clock: trio.testing.MockClock,
) -> None:
    frame = encode_frame(opaque(8, 1, 10_000))
    with trio.fail_after(3600), structlog.testing.capture_logs() as logs:  # virtual seconds
        async with trio.open_nursery() as nursery:
            s = Served(request_frame_timeout=30.0, idle=IdleTimer(600.0))
            s.start(nursery)
            await s.client.send_all(encode_frame(opaque(8, 0, 100)))  # a whole one first
            assert await s.answers(1) == [0]
            start = trio.current_time()

            async def trickle() -> None:  # one byte every 5 s: each would re-arm an idle timer
                for i in range(len(frame) - 1):
                    await s.client.send_all(frame[i : i + 1])
                    await trio.sleep(5)

            nursery.start_soon(trickle)
            await s.ended.wait()
            nursery.cancel_scope.cancel()
    assert s.reason == "frame_timeout"
    assert 30 <= trio.current_time() - start < 36
    (closed,) = [e for e in logs if e["event"] == "connection_closed"]
    assert closed["log_level"] == "warning" and closed["reason"] == "frame_timeout"
    assert "request_frame_timeout_seconds" in closed["error"]


async def test_time_the_proxy_does_not_read_does_not_count_against_a_frame(
    autojump_clock: trio.testing.MockClock,
) -> None:
    pool = RequestMemory(100_000, per_connection=MiB, share=1000)
    hog = pool.account()
    assert hog.next_read(0, 0, 100_000) == 100_000  # another connection holds the pool
    with trio.fail_after(3600):  # virtual seconds
        async with trio.open_nursery() as nursery:
            s = Served(pool=pool, request_frame_timeout=30.0)
            s.start(nursery)
            await s.client.send_all(encode_frame(produce(1, 50_000)))
            await until(s.conn.wait_changed, lambda: s.conn.reading_paused == WAIT_POOL)
            await trio.sleep(100)  # the proxy does not read it: not the client's delay
            hog.close()
            assert await s.answers(1) == [1]
            nursery.cancel_scope.cancel()
    assert s.reason is None or s.reason == "cancelled"


async def test_a_connection_stops_reading_at_its_cap_of_held_request_bytes() -> None:
    pool = RequestMemory(1 << 30, per_connection=20_000, share=4096)
    answer, gate = trio.open_memory_channel[None](100)
    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            s = Served(pool=pool, fetch_handler=ForwardingFetch(), gate=gate)
            s.start(nursery)
            # 40 pipelined fetches of 3,000 bytes (120 KB), none answered yet
            await s.client.send_all(b"".join(encode_frame(opaque(1, c, 3000)) for c in range(40)))
            await until(s.conn.wait_changed, lambda: s.conn.reading_paused == WAIT_OWN)
            held = s.relay.in_flight
            assert held < 40 and s.conn.request_bytes <= 20_000
            assert s.conn.peak_request_bytes <= 20_000 + 4096
            await answer.send(None)  # one answered: the connection reads on
            await until(s.conn.wait_changed, lambda: s.relay.in_flight >= held)
            assert await s.answers(1) == [0]
            assert s.reason is None
            nursery.cancel_scope.cancel()


async def test_a_connection_waits_for_the_pool_while_small_requests_of_others_pass() -> None:
    pool = RequestMemory(MiB, per_connection=4 * MiB, share=16 * 1024)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            hog, other = Served(pool=pool), Served(pool=pool)
            hog.start(nursery)
            other.start(nursery)
            # the hog sends all but the last byte of a 3 MiB Produce: let in (the pool was
            # empty), it holds the pool
            wire = encode_frame(produce(1, 3 * MiB))
            await hog.client.send_all(wire[:-1])
            await until(hog.conn.wait_changed, lambda: hog.conn.request_bytes >= 3 * MiB - 1)
            # the other's small requests are served from its share
            for c in range(20):
                await other.client.send_all(encode_frame(opaque(8, c, 60)))
                assert await other.answers(1) == [c]
            # its large one waits for the pool: not read, not refused
            await other.client.send_all(encode_frame(produce(99, 512 * 1024)))
            await until(other.conn.wait_changed, lambda: other.conn.reading_paused == WAIT_POOL)
            assert other.conn.request_bytes <= pool.share
            assert pool.held <= pool.bound(2) + 3 * MiB
            # the hog finishes: its frame goes upstream, the pool drains, the other is read
            await hog.client.send_all(wire[-1:])
            assert await hog.answers(1) == [1]
            assert await other.answers(1) == [99]
            nursery.cancel_scope.cancel()
    assert pool.peak_used <= 3 * MiB + 4 - pool.share + 1


async def test_a_closed_connection_lets_go_of_its_partial_frame_at_once() -> None:
    """Issue 19's lean unfinished-frames finding: a connection let into the pool with most of
    a 64 MiB frame kept it resident after its client left, until the cyclic GC ran (the
    Connection is in reference cycles: its account's wake, its tasks' closures).  The pool
    then let the next connection in, so a second 64 MiB came on top of the first: RSS
    +128 MiB for a bound of one frame.  A closed connection holds none of its request bytes,
    however long the Connection object itself is referenced (here: by the test)."""
    pool = RequestMemory(MiB, per_connection=4 * MiB, share=16 * 1024)
    wire = encode_frame(produce(1, 3 * MiB))
    gc.disable()  # only reference counting frees it, as for a Connection in a cycle
    tracemalloc.start()
    try:
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                s = Served(pool=pool)
                s.start(nursery)
                await s.client.send_all(memoryview(wire)[:-1])
                await until(s.conn.wait_changed, lambda: s.conn.request_bytes >= 3 * MiB - 1)
                holding, _ = tracemalloc.get_traced_memory()
                await s.client.aclose()  # the client leaves half a frame
                await s.ended.wait()
                nursery.cancel_scope.cancel()
        after, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        gc.enable()
    assert s.reason == "protocol_error"
    assert s.conn.request_bytes == 0 and pool.held == 0 and pool.used == 0
    assert holding - after > 3 * MiB - 64 * 1024, (holding, after)


# --- the whole proxy, loopback, dev cluster -----------------------------------------------------


async def test_eight_clients_pushing_64_mib_frames_stay_within_the_bound_and_others_are_served() -> (
    None
):
    metrics = Metrics(process_metrics=False)
    frame_size = 64 * MiB
    chunk = b"\x00" * MiB
    with trio.fail_after(60):
        async with DevCluster(nodes=1, topics={"t": 1}) as cluster, trio.open_nursery() as nursery:
            proxy = await nursery.start(Proxy(settings(cluster.bootstrap), metrics=metrics).serve)
            await proxy.discovered.wait()
            port = proxy.bootstrap.port
            pool = proxy.request_memory
            hostile = []
            for _ in range(8):  # each proves its connection is served, then attacks
                stream = await trio.open_tcp_stream("127.0.0.1", port)
                await request(stream, FrameDecoder(MiB), API_VERSIONS)
                hostile.append(stream)
            conns = [live.connection for live in proxy.live.values()]
            assert len(conns) == 8

            async def push(stream: trio.abc.Stream, last: bool) -> None:
                """A 64 MiB Produce frame, all of it but the last byte, as fast as taken."""
                try:
                    await stream.send_all(struct.pack(">i", frame_size) + produce(1, 4092))
                    sent = 4096
                    while sent < frame_size + 3:
                        n = min(len(chunk), frame_size + 3 - sent)
                        await stream.send_all(chunk[:n])
                        sent += n
                except (trio.ClosedResourceError, trio.BrokenResourceError):
                    return  # the test closed it (or the proxy did)
                if last:
                    first_done.set()

            first_done = trio.Event()
            nursery.start_soon(push, hostile[0], True)
            await first_done.wait()  # the first is let in whole: the pool was empty
            await until(conns[0].wait_changed, lambda: conns[0].request_bytes >= frame_size - 1)
            for stream in hostile[1:]:
                nursery.start_soon(push, stream, False)
            for conn in conns[1:]:  # the seven others find the pool taken: not read
                await until(conn.wait_changed, lambda conn=conn: conn.reading_paused == WAIT_POOL)

            # another client is answered meanwhile: its own ApiVersions and fetches
            good = await trio.open_tcp_stream("127.0.0.1", port)
            decoder = FrameDecoder(MiB)
            with trio.fail_after(10):
                for c in range(20):
                    cid, _ = codec.decode_response(
                        18, 3, await request(good, decoder, API_VERSIONS)
                    )
                    assert cid == 7
                    fetch = codec.encode_request(_fetch_request(), 100 + c, "good")
                    _, response = codec.decode_response(1, 12, await request(good, decoder, fetch))
                    assert response.error_code == 0

            # the bound: one frame (let into an empty pool) plus a share per connection
            bound = frame_size + 4 + 9 * pool.share
            assert pool.peak_held <= bound, (pool.peak_held, bound)
            assert all(conn.request_bytes <= pool.share for conn in conns[1:])
            assert pool.waiting == 7

            # the first leaves: the next is let in (nobody waits forever)
            await hostile[0].aclose()
            await trio.testing.wait_all_tasks_blocked(0.05)
            assert conns[0].outcome.reason == "protocol_error"  # it left half a frame
            assert pool.waiting == 6
            assert sum(conn.reading_paused is None for conn in conns[1:]) == 1
            assert pool.peak_held <= bound
            for stream in hostile[1:]:
                await trio.aclose_forcefully(stream)
            await good.aclose()
            nursery.cancel_scope.cancel()
    value = metrics.registry.get_sample_value
    assert not value(f"{P}client_connections_closed_total", {"cause": "frame_too_large"})


def _fetch_request() -> fetch12.FetchRequest:
    return fetch12.FetchRequest(
        cluster_id=None,
        replica_id=BrokerId(-1),
        max_wait=i32Timedelta.parse(datetime.timedelta(milliseconds=0)),
        min_bytes=i32(1),
        max_bytes=i32(MiB),
        isolation_level=i8(0),
        session_id=i32(0),
        session_epoch=i32(-1),
        topics=(
            fetch12.FetchTopic(
                topic=TopicName("t"),
                partitions=(
                    fetch12.FetchPartition(
                        partition=i32(0),
                        current_leader_epoch=i32(-1),
                        fetch_offset=i64(0),
                        last_fetched_epoch=i32(-1),
                        log_start_offset=i64(-1),
                        partition_max_bytes=i32(65536),
                    ),
                ),
            ),
        ),
        forgotten_topics_data=(),
        rack_id="",
    )
