"""Scheduler turns per response at the edge (issue 17, per-fetch cost).

A Fetch response's body is read right behind its length prefix without waiting for the
socket again, and a response read from upstream is written to the client by the task
that read it, as far as the client's socket takes it at once; the writer task writes
the rest.  Real socket pairs (the lean stream's job is
the socket); counted, never timed.
"""

from __future__ import annotations

import fcntl
import socket
import struct
import termios

import pytest
import trio
import trio.testing
from support.loopback import tcp_stream_pair

from proxy.protocol.apis import FETCH
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.relay.relay import PassThroughFetch, Relay
from proxy.server.connection import Connection
from proxy.server.sockets import LeanSocketStream


class CountingLean(LeanSocketStream):
    """A lean stream that counts its waited and its immediate reads and notes which task
    read and wrote."""

    __slots__ = ("immediate", "in_place", "partial", "readers", "waited", "writers")

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream)
        self.waited = 0
        self.immediate = 0
        self.readers: list[trio.lowlevel.Task] = []
        self.writers: list[trio.lowlevel.Task] = []
        self.partial = 0
        """``send_now`` calls the kernel did not take whole."""
        self.in_place = 0
        """Reads into a frame's own buffer (``receive_into``, ``receive_into_now``)."""

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        data = await super().receive_some(max_bytes)
        self.waited += 1
        self.readers.append(trio.lowlevel.current_task())
        return data

    def receive_now(self, max_bytes: int) -> bytes | None:
        data = super().receive_now(max_bytes)
        if data is not None:
            self.immediate += 1
            self.readers.append(trio.lowlevel.current_task())
        return data

    async def receive_into(self, view: memoryview) -> int:
        got = await super().receive_into(view)
        self.waited += 1
        self.in_place += 1
        self.readers.append(trio.lowlevel.current_task())
        return got

    def receive_into_now(self, view: memoryview) -> int | None:
        got = super().receive_into_now(view)
        if got is not None:
            self.immediate += 1
            self.in_place += 1
            self.readers.append(trio.lowlevel.current_task())
        return got

    def send_now(self, data: bytes | bytearray | memoryview) -> int:
        self.writers.append(trio.lowlevel.current_task())
        sent = super().send_now(data)
        self.partial += sent < len(data)
        return sent

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        self.writers.append(trio.lowlevel.current_task())
        await super().send_all(data)


class Budget(PassThroughFetch):
    """A FetchHandler that relays fetches as they are and always has budget for their
    responses (what the connection asks of it is counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.reserved: list[int] = []
        self.written_calls = 0

    def written(self) -> None:
        self.written_calls += 1

    def reserve_response(self, nbytes: int) -> bool:
        self.reserved.append(nbytes)
        return True


def fetch_request(cid: int) -> bytes:
    """A frame with Fetch's API key, relayed opaquely (by the pass-through fetch handler)."""
    return struct.pack(">hhi", FETCH, 12, cid) + b"\x00\x03app" + b"\x00" * 8


def socket_pair() -> tuple[CountingLean, trio.SocketStream]:
    a, b = trio.socket.socketpair()
    return CountingLean(trio.SocketStream(a)), trio.SocketStream(b)


async def tcp_socket_pair() -> tuple[CountingLean, trio.SocketStream]:
    ours, peer = await tcp_stream_pair()
    return CountingLean(ours), peer


def queued(stream: CountingLean) -> int:
    """Bytes the kernel holds for *stream* to read (``FIONREAD``)."""
    got = fcntl.ioctl(stream.stream.socket.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return int(struct.unpack("i", got)[0])


async def read_frame(stream: trio.SocketStream, decoder: FrameDecoder) -> bytes:
    while (frame := decoder.next_frame()) is None:
        data = await stream.receive_some(1 << 16)
        assert data, "closed before a whole frame"
        decoder.feed(data)
    return frame


@pytest.mark.parametrize("body_bytes", [100, 200_000])
async def test_a_fetch_response_is_read_behind_its_prefix_and_written_by_the_reading_task(
    body_bytes: int,
) -> None:
    with trio.fail_after(10):
        client_side, client = socket_pair()
        upstream_side, broker = socket_pair()
        budget = Budget()
        conn = Connection(
            client_side,
            upstream_side,
            Relay(lambda node, host, port: (host, port), fetch_handler=budget),
            max_frame_bytes=1 << 20,
        )
        body = bytes(range(256)) * (body_bytes // 256) + b"z" * (body_bytes % 256)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await client.send_all(encode_frame(fetch_request(7)))
            request = await read_frame(broker, FrameDecoder(1 << 20))
            upstream_side.waited = upstream_side.immediate = 0
            upstream_side.readers.clear()
            # The whole answer is in the proxy's socket before it reads any of it.
            await broker.send_all(encode_frame(request[4:8] + body))
            answer = await read_frame(client, FrameDecoder(1 << 21))
            assert answer == struct.pack(">i", 7) + body
            assert budget.reserved == [4 + body_bytes]
            # The prefix read alone waited; the body behind it did not wait again.
            assert upstream_side.immediate >= 1
            if body_bytes < 65536:
                assert (upstream_side.waited, upstream_side.immediate) == (1, 1)
                assert upstream_side.in_place == 0  # a small body is cut from the receive buffer
            else:  # a large one is read where it stays, its budget taken from the prefix
                assert upstream_side.in_place >= 1
            # Every read of the answer and every write of it ran in one task.
            reader = upstream_side.readers[0]
            assert set(upstream_side.readers) == {reader}
            assert set(client_side.writers) == {reader}
            nursery.cancel_scope.cancel()
        assert budget.written_calls >= 1


async def test_a_large_body_is_read_piece_by_piece_as_it_arrives() -> None:
    """A body arriving in pieces is read piece by piece, each as soon as it is there: a
    reader that left them unread until more came (a raised ``SO_RCVLOWAT``) left them
    unacknowledged on loopback, and a broker writing a 64 KiB answer waited for its
    tail-loss probe to send again (5-10 ms, two fetches in five; sockets.py)."""
    with trio.fail_after(10):
        client_side, client = socket_pair()
        upstream_side, broker = await tcp_socket_pair()
        conn = Connection(
            client_side,
            upstream_side,
            Relay(lambda node, host, port: (host, port), fetch_handler=Budget()),
            max_frame_bytes=1 << 20,
        )
        body = bytes(range(256)) * 800  # 200 KiB: read in place
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await client.send_all(encode_frame(fetch_request(7)))
            request = await read_frame(broker, FrameDecoder(1 << 20))
            frame = encode_frame(request[4:8] + body)
            sent = 0
            for piece in (1000, 1000, 5000):
                await broker.send_all(frame[sent : sent + piece])
                sent += piece
                while queued(upstream_side):  # until the proxy has read the piece
                    await trio.testing.wait_all_tasks_blocked()
                low_water = upstream_side.stream.socket.getsockopt(
                    socket.SOL_SOCKET, socket.SO_RCVLOWAT
                )
                assert low_water == 1  # its next wait wakes at the next byte
            assert upstream_side.in_place >= 2
            await broker.send_all(frame[sent:])
            answer = await read_frame(client, FrameDecoder(1 << 21))
            assert answer == struct.pack(">i", 7) + body
            nursery.cancel_scope.cancel()


async def test_what_other_tasks_answer_is_still_written_in_order() -> None:
    """Answers the relay gives the client loop (here: requests pipelined behind the
    writes of the upstream loop) reach the client whole and in order."""
    with trio.fail_after(10):
        client_side, client = socket_pair()
        upstream_side, broker = socket_pair()
        conn = Connection(
            client_side,
            upstream_side,
            Relay(lambda node, host, port: (host, port)),
            max_frame_bytes=1 << 20,
        )
        cids = list(range(1, 41))

        async def answer_all() -> None:
            decoder = FrameDecoder(1 << 20)
            for _ in cids:
                request = await read_frame(broker, decoder)
                await broker.send_all(encode_frame(request[4:8] + b"r" * 3000))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            nursery.start_soon(answer_all)
            for cid in cids:
                await client.send_all(encode_frame(fetch_request(cid)))
            decoder = FrameDecoder(1 << 20)
            got = [await read_frame(client, decoder) for _ in cids]
            nursery.cancel_scope.cancel()
        assert [struct.unpack_from(">i", f)[0] for f in got] == cids
        assert all(f[4:] == b"r" * 3000 for f in got)
        assert conn.buffered == 0


async def test_what_the_client_socket_does_not_take_at_once_the_writer_writes_in_order() -> None:
    """A client that is slow to read: the upstream loop writes what its socket takes and
    never waits for it (it reads the next answers meanwhile), the writer writes the rest,
    and the client gets every byte in order."""
    with trio.fail_after(20):
        client_side, client = socket_pair()
        upstream_side, broker = socket_pair()
        conn = Connection(
            client_side,
            upstream_side,
            Relay(lambda node, host, port: (host, port)),
            max_frame_bytes=4 << 20,
            max_client_buffer_bytes=16 << 20,
        )
        cids = list(range(1, 9))
        bodies = [bytes([cid]) * (1 << 20) for cid in cids]  # 8 MiB: beyond the buffers

        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            for cid in cids:
                await client.send_all(encode_frame(fetch_request(cid)))
            decoder = FrameDecoder(1 << 20)
            for body in bodies:  # the upstream requests come in the client's order
                request = await read_frame(broker, decoder)
                await broker.send_all(encode_frame(request[4:8] + body))
            # Every answer is read from upstream while the client reads nothing.
            while conn.relay.in_flight:
                await conn.wait_changed()
            assert client_side.partial >= 1
            reader = upstream_side.readers[-1]
            assert any(task is not reader for task in client_side.writers)  # the writer
            decoder = FrameDecoder(4 << 20)
            got = [await read_frame(client, decoder) for _ in cids]
            nursery.cancel_scope.cancel()
        assert [struct.unpack_from(">i", f)[0] for f in got] == cids
        assert [f[4:] for f in got] == bodies


async def test_receive_now_returns_none_until_bytes_arrive_and_empty_bytes_at_eof() -> None:
    with trio.fail_after(10):
        ours, peer = socket_pair()
        assert ours.receive_now(10) is None
        await peer.send_all(b"abc")
        assert ours.receive_now(2) == b"ab"
        assert ours.receive_now(10) == b"c"
        assert ours.receive_now(10) is None
        await peer.aclose()
        assert ours.receive_now(10) == b""
        with pytest.raises(ValueError):
            ours.receive_now(0)
        await ours.aclose()
        with pytest.raises(trio.ClosedResourceError):
            ours.receive_now(10)
