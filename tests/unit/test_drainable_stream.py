"""``DrainableStream``: after ``drain()`` no byte of the client is read, whether its reader was
waiting for the socket or had just been woken by it (a plain TCP read has no cancel scope of
its own: it checks the drain after its wait)."""

from __future__ import annotations

import socket
from collections.abc import Awaitable, Callable

import trio
import trio.testing

from proxy.server.proxy import DrainableStream
from proxy.server.sockets import LeanSocketStream


def _pair() -> tuple[LeanSocketStream, socket.socket]:
    ours, theirs = socket.socketpair()
    theirs.setblocking(False)
    return LeanSocketStream(trio.SocketStream(trio.socket.from_stdlib_socket(ours))), theirs


async def test_a_read_returns_what_arrived() -> None:
    with trio.fail_after(5):
        lean, peer = _pair()
        stream = DrainableStream(lean)
        peer.send(b"request")
        assert await stream.receive_some(100) == b"request"
        peer.close()
        assert await stream.receive_some(100) == b""


class _Host:
    """The connection as the stream sees it (``TaskHost``): runs the wait for quiet."""

    running = True

    def __init__(self, nursery: trio.Nursery) -> None:
        self.nursery = nursery

    def start_task(self, task: Callable[[], Awaitable[None]]) -> bool:
        self.nursery.start_soon(task)
        return True


class _HeldLean(LeanSocketStream):
    """A plain TCP stream whose wait, once the socket is readable, ends only when the test
    sets ``woken``: the test decides when the reader is rescheduled."""

    __slots__ = ("woken",)

    def __init__(self, stream: trio.SocketStream) -> None:
        super().__init__(stream)
        self.woken = trio.Event()

    async def wait_readable(self) -> None:
        await super().wait_readable()
        await self.woken.wait()


async def test_a_reader_woken_just_before_the_drain_reads_nothing() -> None:
    """The socket wakes the reader, and the drain begins before the reader runs: it parks,
    and the bytes stay in the socket (the connection's end then discards them, as a
    cancelled read would have)."""
    with trio.fail_after(5):
        ours, peer = socket.socketpair()
        peer.setblocking(False)
        lean = _HeldLean(trio.SocketStream(trio.socket.from_stdlib_socket(ours)))
        stream = DrainableStream(lean)
        woken = lean.woken
        got: list[bytes | bytearray] = []

        async def reader() -> None:
            got.append(await stream.receive_some(100))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader)
            peer.send(b"late request")
            await trio.testing.wait_all_tasks_blocked()  # the reader waits on `woken`
            woken.set()  # rescheduled...
            stream.drain()  # ... and the drain begins before it runs
            await trio.testing.wait_all_tasks_blocked()
            assert got == []
            assert stream._parked
            nursery.cancel_scope.cancel()
        assert lean.receive_now(100) == b"late request"  # never read
        peer.close()


async def test_a_drain_while_the_reader_waits_counts_it_as_parked() -> None:
    """A reader waiting for the socket lets a quiet connection close at once."""
    with trio.fail_after(5):
        lean, peer = _pair()
        stream = DrainableStream(lean)

        async def run() -> str:
            await stream.receive_some(100)
            return "read"

        async with trio.open_nursery() as nursery:
            result: list[str] = []
            stream.host = _Host(nursery)

            async def serve() -> None:
                result.append(await stream.serve(run))

            nursery.start_soon(serve)
            await trio.testing.wait_all_tasks_blocked()
            assert nursery.child_tasks and len(nursery.child_tasks) == 1  # no wait before the drain
            stream.drain()
        assert result == ["drained"]
        peer.send(b"after")
        assert lean.receive_now(100) == b"after"  # the drain read nothing
        peer.close()


async def test_a_drain_before_the_connection_runs_ends_it_when_its_reader_parks() -> None:
    """Accepted just before the listeners closed: the drain comes before the connection's
    nursery opens, so the wait for quiet cannot start then; it starts when the reader
    parks, and the connection ends with nothing read."""
    with trio.fail_after(5):
        lean, peer = _pair()
        stream = DrainableStream(lean)
        peer.send(b"request")
        async with trio.open_nursery() as nursery:
            host = _Host(nursery)
            host.running = False
            stream.host = host
            started: list[bool] = []
            real_start = host.start_task

            def start_task(task: Callable[[], Awaitable[None]]) -> bool:
                started.append(host.running)
                return host.running and real_start(task)

            host.start_task = start_task  # type: ignore[method-assign]
            stream.drain()
            assert started == [False]

            async def run() -> str:
                host.running = True  # the connection's nursery is open
                await stream.receive_some(100)
                return "read"

            assert await stream.serve(run) == "drained"
            assert started == [False, True]
        assert lean.receive_now(100) == b"request"  # never read
        peer.close()
