"""Accepted client sockets that have not sent a byte yet: one task watches all of them.

A socket a client opens and never writes to (a leaked connection, a port scan, a
probe) used to be a task of its own, parked on a receive until its first byte.
At a burst of them each cost a task spawn, a cancel scope, trio's socket
wrapper and a scheduler step at accept, and another step at its end; the end
of a leak (a thousand sockets closed by the peer at once) woke a thousand
tasks, which trio runs in one scheduler batch that every other client waited
behind (154-178 ms measured, ``bench/attacks.py`` connection-leak).

:class:`SilentSockets` keeps them in a private ``epoll`` set (on Linux; the
set's own descriptor is what trio waits on) with their first-request
deadlines in a heap.  Its one task handles at most ``per_turn`` sockets
(readable ones, then expired ones) per scheduler turn and yields between
turns, so however many sockets wake together, no batch runs more than
``per_turn`` of them.  Per socket it calls back the owner (``proxy.server.proxy``):

- ``on_data(item, sock)``: the first byte is there (not read); the socket is no
  longer watched, the owner serves it;
- ``on_end(item, sock, error)``: the peer closed (``error`` None) or reset it
  before a byte came; the owner closes the socket;
- ``on_expired(item, sock)``: its deadline passed without a byte; the owner
  closes it.

``remove`` takes a socket out without a callback (the owner closes it:
displaced at ``max_connections``, or the proxy stopping).  The callbacks must
not await: they run in the watcher's task.

Elsewhere (no ``select.epoll``) each socket gets a small task in the watcher's
nursery instead, with the same callbacks: correct, without the batching.
"""

from __future__ import annotations

import heapq
import itertools
import math
import select
import socket
from collections.abc import Callable
from typing import Generic, TypeVar

import trio

T = TypeVar("T")

PER_TURN = 16
"""Sockets handled per scheduler turn (readable, then expired): a bound on the batch
others wait behind (70-80 µs of CPU each when the peer closed, a few hundred when its
close writes a log line: an expired deadline)."""

_EPOLL = getattr(select, "epoll", None)
_DONTWAIT = getattr(socket, "MSG_DONTWAIT", 0)
_WATCHED = (
    getattr(select, "EPOLLIN", 1)
    | getattr(select, "EPOLLRDHUP", 0)
    | getattr(select, "EPOLLHUP", 0)
)


class SilentSockets(Generic[T]):
    """Sockets without a byte yet, each with an owner's *item* and a deadline (see the module)."""

    def __init__(
        self,
        on_data: Callable[[T, socket.socket], None],
        on_end: Callable[[T, socket.socket, OSError | None], None],
        on_expired: Callable[[T, socket.socket], None],
        *,
        per_turn: int = PER_TURN,
        use_epoll: bool = True,
    ) -> None:
        self.on_data = on_data
        self.on_end = on_end
        self.on_expired = on_expired
        self.per_turn = per_turn
        self._items: dict[int, tuple[socket.socket, T]] = {}
        """Watched sockets by descriptor."""
        self._deadlines: list[tuple[float, int, int, T]] = []
        """(deadline, sequence, descriptor, item), a heap; entries of sockets no longer
        watched are dropped when reached, and the heap rebuilt when they dominate."""
        self._seq = itertools.count()
        self._epoll = _EPOLL() if use_epoll and _EPOLL is not None else None
        self._wait: trio.CancelScope | None = None
        self._nursery: trio.Nursery | None = None
        self._tasks: dict[int, trio.CancelScope] = {}
        """Without epoll: each socket's own waiting task."""

    def __len__(self) -> int:
        return len(self._items)

    def add(self, sock: socket.socket, item: T, deadline: float = math.inf) -> None:
        """Watch *sock* (non-blocking, not yet read) until its first byte, its end or *deadline*."""
        fd = sock.fileno()
        self._items[fd] = (sock, item)
        if self._epoll is None:
            assert self._nursery is not None, "run() first"
            scope = trio.CancelScope(deadline=deadline)
            self._tasks[fd] = scope
            self._nursery.start_soon(self._watch_one, fd, sock, item, scope)
            return
        self._epoll.register(fd, _WATCHED)
        if deadline != math.inf:
            if len(self._deadlines) > 2 * len(self._items) + 64:
                self._rebuild()
            heapq.heappush(self._deadlines, (deadline, next(self._seq), fd, item))
            if self._wait is not None and deadline < self._wait.deadline:
                self._wait.deadline = deadline

    def remove(self, sock: socket.socket) -> bool:
        """Stop watching *sock* (the caller closes it); False if it was not watched."""
        fd = sock.fileno()
        if fd < 0 or self._items.pop(fd, None) is None:
            return False
        self._unwatch(fd, sock)
        return True

    def items(self) -> list[tuple[socket.socket, T]]:
        """The watched sockets and their items (a copy)."""
        return list(self._items.values())

    def _unwatch(self, fd: int, sock: socket.socket) -> None:
        if self._epoll is not None:
            if not self._epoll.closed:  # closed: run() ended, the owner closes what is left
                self._epoll.unregister(fd)
        else:
            scope = self._tasks.pop(fd, None)
            if scope is not None:
                scope.cancel()
                trio.lowlevel.notify_closing(sock)  # its task waits on it

    def _rebuild(self) -> None:
        self._deadlines = [
            entry
            for entry in self._deadlines
            if (watched := self._items.get(entry[2])) is not None and watched[1] is entry[3]
        ]
        heapq.heapify(self._deadlines)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Watch until cancelled (the sockets still watched then stay the owner's to close)."""
        if self._epoll is None:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                task_status.started()
                await trio.sleep_forever()
        epoll = self._epoll
        assert epoll is not None
        task_status.started()
        try:
            while True:
                busy = self._turn(epoll)
                if busy:  # more may be ready: let others run, then go on without waiting
                    await trio.lowlevel.checkpoint()
                    continue
                deadline = self._deadlines[0][0] if self._deadlines else math.inf
                with trio.CancelScope(deadline=deadline) as self._wait:
                    await trio.lowlevel.wait_readable(epoll)
                self._wait = None
        finally:
            self._wait = None
            epoll.close()

    def _turn(self, epoll: select.epoll) -> bool:
        """Handle up to ``per_turn`` sockets; True when that bound was reached."""
        done = 0
        for fd, _events in epoll.poll(0, self.per_turn):
            watched = self._items.pop(fd, None)
            if watched is None:  # pragma: no cover  (unregistered sockets are not reported)
                continue
            epoll.unregister(fd)
            sock, item = watched
            self._first_byte(sock, item)
            done += 1
        now = trio.current_time()
        deadlines = self._deadlines
        while done < self.per_turn and deadlines and deadlines[0][0] <= now:
            _, _, fd, item = heapq.heappop(deadlines)
            watched = self._items.get(fd)
            if watched is None or watched[1] is not item:
                continue  # served, closed or removed before its deadline
            del self._items[fd]
            epoll.unregister(fd)
            self.on_expired(item, watched[0])
            done += 1
        return done >= self.per_turn

    def _first_byte(self, sock: socket.socket, item: T) -> None:
        if not self._peeked(sock, item):  # woken without data: watch again
            self._items[sock.fileno()] = (sock, item)
            if self._epoll is not None:
                self._epoll.register(sock.fileno(), _WATCHED)

    def _peeked(self, sock: socket.socket, item: T) -> bool:
        """Calls back on what a peek at the first byte finds (data, the peer's close or a
        reset) and says so; False: nothing there yet (the caller watches it again)."""
        try:
            data = sock.recv(1, socket.MSG_PEEK | _DONTWAIT)
        except BlockingIOError:
            return False
        except OSError as exc:
            self.on_end(item, sock, exc)
            return True
        if data:
            self.on_data(item, sock)
        else:
            self.on_end(item, sock, None)
        return True

    async def _watch_one(
        self, fd: int, sock: socket.socket, item: T, scope: trio.CancelScope
    ) -> None:
        with scope:
            while True:
                try:
                    await trio.lowlevel.wait_readable(sock)
                except trio.ClosedResourceError:
                    return  # removed
                if self._items.pop(fd, None) is None:
                    return
                del self._tasks[fd]
                if self._peeked(sock, item):
                    return
                self._items[fd] = (sock, item)
                self._tasks[fd] = scope
        if scope.cancelled_caught and self._items.get(fd, (None, None))[1] is item:
            del self._items[fd]
            del self._tasks[fd]
            self.on_expired(item, sock)
