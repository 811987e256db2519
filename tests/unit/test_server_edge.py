"""The trio edge's cheap paths: the lean socket stream, the lazily re-armed idle timer,
and the kinds the relay hands the edge for its traffic meter.

Real socket pairs for the stream (its job is the socket), in-memory streams and the
autojump clock for the connection.
"""

from __future__ import annotations

import socket
import struct
import weakref

import pytest
import trio
import trio.testing
from support.loopback import tcp_stream_pair

from proxy.protocol.apis import SASL_AUTHENTICATE
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.relay.relay import Relay
from proxy.server.connection import Connection
from proxy.server.idle import IdleTimer
from proxy.server.sockets import LeanSocketStream, lean


async def lean_pair() -> tuple[LeanSocketStream, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return LeanSocketStream(trio.SocketStream(a)), trio.SocketStream(b)


async def test_receive_returns_what_arrived_and_empty_bytes_at_eof() -> None:
    with trio.fail_after(10):
        ours, peer = await lean_pair()
        await peer.send_all(b"hello")
        assert await ours.receive_some(100) == b"hello"
        await peer.aclose()
        assert await ours.receive_some(100) == b""
        await ours.aclose()


async def test_a_send_larger_than_the_socket_buffer_arrives_whole_and_in_order() -> None:
    data = bytes(range(256)) * 40_000  # ~10 MB: the send waits for the reader many times
    received = bytearray()
    with trio.fail_after(30):
        ours, peer = await lean_pair()

        async def read_all() -> None:
            while chunk := await peer.receive_some(65536):
                received.extend(chunk)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_all)
            await ours.send_all(data)
            await ours.send_all(memoryview(b"tail"))
            await ours.send_all(b"")  # nothing to send: returns
            await ours.aclose()
    assert bytes(received) == data + b"tail"


async def test_a_cancelled_receive_consumes_nothing() -> None:
    with trio.fail_after(10):
        ours, peer = await lean_pair()
        with trio.CancelScope() as waiting:

            async def cancel_once_waiting() -> None:
                await trio.testing.wait_all_tasks_blocked()
                waiting.cancel()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_once_waiting)
                await ours.receive_some(100)
        assert waiting.cancelled_caught
        await peer.send_all(b"after")
        assert await ours.receive_some(100) == b"after"
        await ours.aclose()
        await peer.aclose()


async def test_closed_raises_closed_resource_and_a_reset_peer_breaks_the_stream() -> None:
    with trio.fail_after(10):
        ours, peer = await lean_pair()
        await ours.aclose()
        with pytest.raises(trio.ClosedResourceError):
            await ours.receive_some(10)
        with pytest.raises(trio.ClosedResourceError):
            await ours.send_all(b"x")
        await peer.aclose()

        ours, peer = await lean_pair()
        peer.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        await peer.aclose()  # a reset, not a clean close
        with pytest.raises(trio.BrokenResourceError):
            for _ in range(100):  # the first send may still be accepted by the kernel
                await ours.send_all(b"x" * 65536)
        await ours.aclose()


async def test_closing_the_socket_wakes_a_receive_waiting_on_it() -> None:
    with trio.fail_after(10):
        ours, peer = await lean_pair()
        async with trio.open_nursery() as nursery:

            async def close_soon() -> None:
                await trio.testing.wait_all_tasks_blocked()
                await ours.stream.aclose()

            nursery.start_soon(close_soon)
            with pytest.raises(trio.ClosedResourceError):
                await ours.receive_some(10)
        await peer.aclose()


async def tcp_lean_pair() -> tuple[LeanSocketStream, trio.SocketStream]:
    ours, peer = await tcp_stream_pair()
    return LeanSocketStream(ours), peer


async def test_a_body_read_returns_what_has_arrived_and_empty_at_the_connection_end() -> None:
    with trio.fail_after(10):
        ours, peer = await tcp_lean_pair()
        body = bytearray(1000)
        await peer.send_all(b"a" * 100)
        assert await ours.receive_into(memoryview(body)) == 100
        await peer.send_all(b"b" * 900)
        with memoryview(body) as view:
            assert await ours.receive_into(view[100:]) == 900
        assert bytes(body) == b"a" * 100 + b"b" * 900
        await peer.send_all(b"x" * 10)
        await peer.aclose()
        assert await ours.receive_into(memoryview(body)) == 10
        assert await ours.receive_into(memoryview(body)) == 0
        await ours.aclose()


async def test_only_plain_tcp_is_made_lean() -> None:
    a, b = trio.socket.socketpair()
    plain = trio.SocketStream(a)
    assert isinstance(lean(plain), LeanSocketStream)
    memory, _ = trio.testing.memory_stream_pair()
    assert lean(memory) is memory
    a.close()
    b.close()


# --- the idle timer --------------------------------------------------------------------------


def opaque_request(cid: int) -> bytes:
    return struct.pack(">hhi", 8, 2, cid) + b"\x00\x03app"


class Served:
    def __init__(self, idle_timeout: float) -> None:
        self.client, client_side = trio.testing.memory_stream_pair()
        upstream_side, self.broker = trio.testing.memory_stream_pair()
        self.conn = Connection(
            client_side,
            upstream_side,
            Relay(lambda node, host, port: (host, port)),
            max_frame_bytes=1 << 20,
            idle=IdleTimer(idle_timeout),
        )
        self.reason: str | None = None
        self.ended = trio.Event()
        self.hold = 0.0
        """Seconds the broker waits before each answer (a long poll)."""

    async def run(self) -> None:
        assert self.conn.idle is not None
        async with trio.open_nursery() as timers:
            timers.start_soon(self.conn.idle.run)
            self.reason = await self.conn.run()
            self.ended.set()
            timers.cancel_scope.cancel()

    async def broker_loop(self) -> None:
        decoder = FrameDecoder(1 << 20)
        while data := await self.broker.receive_some(65536):
            decoder.feed(data)
            for frame in decoder.frames():
                await trio.sleep(self.hold)
                await self.broker.send_all(encode_frame(frame[4:8] + b"ok"))

    async def round_trip(self, cid: int) -> None:
        await self.client.send_all(encode_frame(opaque_request(cid)))
        assert await self.client.receive_some(100) == encode_frame(struct.pack(">i", cid) + b"ok")


async def test_activity_before_the_timeout_moves_the_close_to_a_timeout_after_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(7200):  # virtual seconds
        async with trio.open_nursery() as nursery:
            s = Served(idle_timeout=600)
            nursery.start_soon(s.run)
            nursery.start_soon(s.broker_loop)
            for cid in range(5):  # every 400 s: never idle for 600
                await s.round_trip(cid)
                await trio.sleep(400)
                assert s.reason is None
            await s.round_trip(99)
            answered = trio.current_time()
            await s.ended.wait()
            nursery.cancel_scope.cancel()
    assert s.reason == "idle_timeout"
    assert 600 <= trio.current_time() - answered < 601


async def test_long_polls_back_to_back_keep_it_open_then_it_closes_a_timeout_later(
    autojump_clock: trio.testing.MockClock,
) -> None:
    with trio.fail_after(20_000):  # virtual seconds
        async with trio.open_nursery() as nursery:
            s = Served(idle_timeout=600)
            s.hold = 500  # each answer takes most of a timeout
            nursery.start_soon(s.run)
            nursery.start_soon(s.broker_loop)
            for cid in range(6):  # 3,000 s with a request always waiting upstream
                await s.round_trip(cid)
                assert s.reason is None
            answered = trio.current_time()
            await s.ended.wait()
            nursery.cancel_scope.cancel()
    assert s.reason == "idle_timeout"
    assert 600 <= trio.current_time() - answered < 601


# --- what the relay tells the edge about frames it queues upstream --------------------------


def test_the_relay_gives_each_upstream_frame_its_kind_raw_sasl_tokens_included() -> None:
    relay = Relay(lambda node, host, port: (host, port))
    mechanism = b"PLAIN"
    handshake = (
        struct.pack(">hhi", 17, 0, 1) + b"\x00\x03app" + struct.pack(">h", len(mechanism))
    ) + mechanism
    relay.client_frame(handshake)
    frames, kinds = relay.take_upstream_with_kinds()
    assert kinds == [(17, True)] and len(frames) == 1
    relay.upstream_frame(struct.pack(">i", 0) + b"\x00\x00" + b"\x00\x00\x00\x00")
    token = b"\x00user\x00secret"
    assert relay.client_frame(token) is None and relay.last_expects
    frames, kinds = relay.take_upstream_with_kinds()
    assert frames == [token] and kinds == [(SASL_AUTHENTICATE, True)]


# --- start-up heap out of the collector's reach ------------------------------------------------


def test_freezing_the_startup_heap_leaves_full_collections_only_what_came_after() -> None:
    import gc

    from proxy.server.cli import freeze_startup_heap

    try:
        freeze_startup_heap()
        frozen = gc.get_freeze_count()
        assert frozen > 1000  # this interpreter's modules and classes, at least
        later = [[n] for n in range(100)]  # allocated after: collectable as before
        assert gc.is_tracked(later[0])
        # None of them joined the frozen set.  It can only shrink meanwhile: another thread
        # of this process (a client library's, from an earlier test) may free frozen
        # objects, which once made an equality check fail (424,479 -> 424,464).
        assert gc.get_freeze_count() <= frozen

        class Cycle:
            me: object = None

        cycle = Cycle()
        cycle.me = cycle
        gone = weakref.ref(cycle)
        del cycle
        gc.collect()
        assert gone() is None  # a cycle made after the freeze is still collected
    finally:
        gc.unfreeze()
