"""A client connection's own connections to preferred read replicas (the trio edge of
``proxy.relay.read_replica``).

When the proxy follows ``preferred_read_replica`` for a client (Fetch v10 or
older, or a client that ignores redirects), the fetch path sends those
partitions' fetches to the replica through a :class:`ReplicaLinks`, one per
client connection (so nothing a replica answers is shared between clients, as
the fetch caches are not).  Each replica node gets one connection, opened by
the first fetch for it, with the proxy's own upstream TLS settings: it carries
no identity of the client's.  A connection that carries the client's SASL
identity is never used: the fetch path does not follow redirects for such
clients (``client_authenticated``).

An answer takes its memory budget from its length prefix before its body is
read, as the leader's answers do (``reserve``; while the budget cannot take it
the link is not read): between answers a link reads only the next 4-byte length
prefix, and the reads of a reserved answer stop at its end, so none of an
answer's body is in memory before its budget is taken.  Answers are not handed to the fetch path from the link's task: each finished
callback is queued and the connection's waker is called, so the fetch path runs
them in the connection's own task (``deliver``, from ``FetchPathHandler.resume``)
as it does a fetch that waited for memory budget.  A node whose connection
failed is ``available`` again only ``retry_seconds`` later (its partitions go to
the leader meanwhile).
"""

from __future__ import annotations

import ssl
import struct
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Protocol

import structlog
import trio

from ..config import HostPort
from ..protocol.codec import peek_correlation_id
from ..protocol.errors import ProtocolError
from ..protocol.framing import BodyPool, Frame, FrameDecoder
from .sockets import LeanSocketStream, lean
from .upstream import open_upstream

log = structlog.get_logger("proxy.server")

_I32 = struct.Struct(">i")
RECEIVE_BYTES = 64 * 1024
_PREFIX_BYTES = 4
"""A Kafka frame's length prefix."""
DEFAULT_RETRY_SECONDS = 5.0
_ERRORS = (OSError, ssl.SSLError, trio.BrokenResourceError, trio.ClosedResourceError)


class TaskHost(Protocol):
    """Where the links' tasks run: the client connection's own nursery."""

    @property
    def running(self) -> bool:
        """The connection is being served (its tasks can start)."""

    def start_task(self, task: Callable[[], Awaitable[None]]) -> bool:
        """Start *task* beside the connection's loops; False: the connection has ended."""


@dataclass(slots=True)
class _Send:
    frame: bytes
    on_response: Callable[[Frame], None]
    on_failure: Callable[[], None]


@dataclass(slots=True)
class _Link:
    node: int
    address: HostPort
    queue: deque[_Send] = field(default_factory=deque)
    waiting: deque[tuple[int, _Send]] = field(default_factory=deque)
    ready: trio.Event = field(default_factory=trio.Event)
    next_cid: int = 0


class ReplicaLinks:
    """``proxy.relay.read_replica.ReplicaUpstream`` on trio (see the module docstring)."""

    def __init__(
        self,
        address_of: Callable[[int], HostPort | None],
        ssl_context: ssl.SSLContext | None,
        *,
        connect_timeout: float,
        max_frame_bytes: int,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        bodies: BodyPool | None = None,
    ) -> None:
        self._address_of = address_of
        self._ssl = ssl_context
        self._connect_timeout = connect_timeout
        self._max_frame_bytes = max_frame_bytes
        self._bodies = bodies
        self._retry_seconds = retry_seconds
        self._links: dict[int, _Link] = {}
        self._down_until: dict[int, float] = {}
        self._done: list[Callable[[], None]] = []
        self.host: TaskHost | None = None
        """The client connection the links live beside (``Connection``: bound by the
        proxy): a link's task is one of its tasks, started by the link's first fetch."""
        self.wake: Callable[[], None] = lambda: None
        """Asks the connection's task to call ``deliver`` (bound by the fetch path)."""
        self.reserve: Callable[[int], bool] = lambda nbytes: True
        """Memory budget for an answer of *nbytes*, asked from its length prefix before its
        body is read (the fetch path's ``reserve_response``, as for the leader's answers);
        False: the link is not read until the next ``deliver`` (a release woke the
        connection)."""
        self._budget = trio.Event()
        """Set by ``deliver``: links waiting for budget ask again."""

    # -- ReplicaUpstream ---------------------------------------------------------------

    def available(self, node: int) -> bool:
        if self.host is None or not self.host.running or self._address_of(node) is None:
            return False
        until = self._down_until.get(node)
        return until is None or trio.current_time() >= until

    def send(
        self,
        node: int,
        frame: bytes,
        *,
        api_version: int,
        on_response: Callable[[Frame], None],
        on_failure: Callable[[], None],
    ) -> None:
        link = self._links.get(node)
        if link is None:
            address = self._address_of(node)
            link = None if address is None else _Link(node, address)
            if (
                link is None
                or self.host is None
                or not self.host.start_task(partial(self._run, link))
            ):
                self._finished(on_failure)
                return
            self._links[node] = link
        link.queue.append(_Send(frame, on_response, on_failure))
        link.ready.set()

    def deliver(self) -> None:
        """Run the callbacks of the answers (and failures) that arrived (connection's task)."""
        self._budget.set()
        self._budget = trio.Event()
        while self._done:
            done, self._done = self._done, []
            for callback in done:
                callback()

    # -- the links ---------------------------------------------------------------------

    def _finished(self, callback: Callable[[], None]) -> None:
        self._done.append(callback)
        self.wake()

    async def _run(self, link: _Link) -> None:
        stream: trio.abc.Stream | None = None
        try:
            with trio.fail_after(self._connect_timeout):
                stream = lean(await open_upstream(link.address, self._ssl))
            await self._serve(link, stream)
        except (*_ERRORS, trio.TooSlowError, ProtocolError) as exc:
            log.warning(
                "replica_link_failed",
                node_id=link.node,
                upstream=str(link.address),
                error=f"{type(exc).__name__}: {exc}",
            )
        finally:
            self._links.pop(link.node, None)
            self._down_until[link.node] = trio.current_time() + self._retry_seconds
            for _, sent in link.waiting:
                self._done.append(sent.on_failure)
            for sent in link.queue:
                self._done.append(sent.on_failure)
            link.waiting.clear()
            link.queue.clear()
            self.wake()
            if stream is not None:
                await trio.aclose_forcefully(stream)

    async def _serve(self, link: _Link, stream: trio.abc.Stream) -> None:
        """Write and read the link until either fails; raises what failed (not a group)."""
        failed: list[Exception] = []
        async with trio.open_nursery() as nursery:

            async def guarded(loop: Callable[[_Link, trio.abc.Stream], Awaitable[None]]) -> None:
                try:
                    await loop(link, stream)
                except Exception as exc:  # the link ends; the client connection lives on
                    failed.append(exc)
                finally:
                    nursery.cancel_scope.cancel()

            nursery.start_soon(guarded, self._write)
            nursery.start_soon(guarded, self._read)
        if failed:
            if isinstance(failed[0], (*_ERRORS, ProtocolError)):
                raise failed[0]
            raise ProtocolError(f"{type(failed[0]).__name__}: {failed[0]}") from failed[0]

    async def _write(self, link: _Link, stream: trio.abc.Stream) -> None:
        while True:
            await link.ready.wait()
            link.ready = trio.Event()
            while link.queue:
                sent = link.queue.popleft()
                cid = link.next_cid
                link.next_cid = (cid + 1) & 0x7FFFFFFF
                body = bytearray(sent.frame)
                _I32.pack_into(body, 4, cid)  # api key, api version, then the correlation id
                link.waiting.append((cid, sent))
                await stream.send_all(_I32.pack(len(body)) + bytes(body))

    async def _read(self, link: _Link, stream: trio.abc.Stream) -> None:
        # An answer's memory is taken from its length prefix: a large body is read in place.
        decoder = FrameDecoder(self._max_frame_bytes, preallocate=True, bodies=self._bodies)
        in_place = stream if isinstance(stream, LeanSocketStream) else None
        reserved = False  # the answer in progress has its memory budget
        while True:
            if not reserved and (missing := decoder.missing) is not None:
                while not self.reserve(missing + decoder.buffered):
                    await self._budget.wait()  # back-pressure: the answer waits in the socket
                reserved = True
            missing = decoder.missing
            if reserved and missing:
                want = min(RECEIVE_BYTES, missing)  # to its end: the next answer is not reserved
            else:
                # Every answer on a link is a Fetch's: read its length prefix alone, so none
                # of its body is in memory before its budget is taken (as the leader's).
                want = max(1, _PREFIX_BYTES - decoder.buffered)
            into = decoder.body_view() if in_place is not None else None
            if in_place is not None and into is not None:
                with into:
                    got = await in_place.receive_into(into)
                if not got:
                    raise trio.BrokenResourceError("the replica closed the connection")
                decoder.received(got)
            else:
                data = await stream.receive_some(want)
                if not data:
                    raise trio.BrokenResourceError("the replica closed the connection")
                decoder.feed(data)
            while (frame := decoder.next_body()) is not None:
                reserved = False
                cid = peek_correlation_id(frame)
                if not link.waiting or link.waiting[0][0] != cid:
                    raise ProtocolError(f"replica answered correlation id {cid} out of order")
                _, sent = link.waiting.popleft()
                self._finished(partial(sent.on_response, frame))
