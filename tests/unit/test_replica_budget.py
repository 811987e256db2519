"""A preferred replica's answer takes its memory budget before any of its body is read.

``proxy.server.replicas.ReplicaLinks`` reads a link as the leader's connection is read
(``proxy.server.connection``): between answers only the 4-byte length prefix, then the
budget for the whole answer (``reserve``), then the body up to its end and no further.
"""

from __future__ import annotations

import struct

import trio
import trio.testing

from proxy.config import HostPort
from proxy.protocol.framing import Frame
from proxy.server.replicas import ReplicaLinks, _Link, _Send
from proxy.server.sockets import lean

TIMEOUT = 10


class ScriptedStream(trio.abc.Stream):
    """Hands out *wire* as asked, then waits forever; records every read's size."""

    def __init__(self, wire: bytes) -> None:
        self.wire = wire
        self.sent = 0
        self.asked: list[int] = []

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        assert max_bytes is not None
        self.asked.append(max_bytes)
        if self.sent >= len(self.wire):
            await trio.sleep_forever()
        await trio.lowlevel.checkpoint()
        piece = self.wire[self.sent : self.sent + max_bytes]
        self.sent += len(piece)
        return piece

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        raise AssertionError("not written in this test")

    async def wait_send_all_might_not_block(self) -> None:
        raise AssertionError("not written in this test")

    async def aclose(self) -> None:
        pass


async def test_an_answer_is_reserved_from_its_length_prefix_before_its_body_is_read() -> None:
    body = struct.pack(">i", 0) + bytes(200_000)  # correlation id 0, then the answer
    second = struct.pack(">i", 1) + bytes(1000)
    wire = struct.pack(">i", len(body)) + body + struct.pack(">i", len(second)) + second
    stream = ScriptedStream(wire)
    links = ReplicaLinks(lambda node: None, None, connect_timeout=1.0, max_frame_bytes=1 << 20)
    asked: list[tuple[int, int]] = []  # (bytes asked for, bytes read when asked)
    allow = [False]

    def reserve(nbytes: int) -> bool:
        asked.append((nbytes, stream.sent))
        return allow[0]

    links.reserve = reserve
    answers: list[bytes] = []
    link = _Link(1, HostPort("127.0.0.1", 1))
    for cid in (0, 1):
        link.waiting.append((cid, _Send(b"", answers.append, lambda: None)))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(links._read, link, stream)
            await trio.testing.wait_all_tasks_blocked()
            # Refused: the link waits having read the length prefix and nothing else.
            assert asked == [(len(body), 4)]
            assert stream.sent == 4
            allow[0] = True
            links.deliver()  # a release wakes the link, which asks again and reads on
            while len(answers) < 2:
                await trio.testing.wait_all_tasks_blocked()
                links.deliver()
            nursery.cancel_scope.cancel()
    assert answers == [body, second]
    # The second answer was asked for once its prefix alone was in, not with the
    # first's last read: no read went past the end of a reserved answer.
    assert asked[-1] == (len(second), 4 + len(body) + 4)
    assert max(stream.asked) <= 64 * 1024


async def test_on_plain_tcp_an_answer_is_read_in_place_once_reserved() -> None:
    """The same on a real socket (``LeanSocketStream``, as ``ReplicaLinks`` wraps a plain
    TCP link): nothing of the body is read until its budget is taken, then it is read
    into one buffer of its size, which the fetch path gets as it is (a ``bytearray``)."""
    body = struct.pack(">i", 0) + bytes(range(256)) * 800  # correlation id 0, 204,800 bytes
    a, b = trio.socket.socketpair()
    ours, broker = lean(trio.SocketStream(a)), trio.SocketStream(b)
    links = ReplicaLinks(lambda node: None, None, connect_timeout=1.0, max_frame_bytes=1 << 20)
    asked: list[int] = []
    allow = [False]

    def reserve(nbytes: int) -> bool:
        asked.append(nbytes)
        return allow[0]

    links.reserve = reserve
    answers: list[Frame] = []
    link = _Link(1, HostPort("127.0.0.1", 1))
    link.waiting.append((0, _Send(b"", answers.append, lambda: None)))
    with trio.fail_after(TIMEOUT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(links._read, link, ours)
            await broker.send_all(struct.pack(">i", len(body)) + body)
            while not asked:
                await trio.testing.wait_all_tasks_blocked()
            assert asked == [len(body)] and not answers  # refused: no answer until reserved
            allow[0] = True
            links.deliver()
            while not answers:
                await trio.testing.wait_all_tasks_blocked()
                links.deliver()
            nursery.cancel_scope.cancel()
    [answer] = answers
    assert type(answer) is bytearray and answer == body
    await broker.aclose()
