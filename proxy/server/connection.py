"""One client connection: its upstream link and the loops that feed the relay.

The client loop reads whole frames (size checked from the length prefix before
buffering, memory for them reserved before reading them), hands them to the
sans-I/O ``Relay`` and sends what it queues upstream; the upstream loop does
the reverse, writing the responses to the client as far as its socket takes them
at once; the writer sends the rest, and what the other loops answered.
After every input a loop feeds the relay or its fetch handler, it drains what the
handler did (``drain_effects``: effects as values, turned into metrics and
decision-log events by ``proxy.observe.apply``).
Whichever side ends first ends the connection: an upstream drop closes the
client (Kafka clients reconnect), a malformed frame from either side closes this
connection with one log line, and nothing that happens here can reach the rest
of the process.

Limits (each a setting, see ``proxy.config``):

``max_frame_bytes``
    a frame announcing more is refused from its length prefix, before its
    body is buffered, on both legs (``FrameDecoder``): the connection closes.
``max_request_frame_bytes``
    the same for a client's request that is not a Produce, refused from its
    length prefix and API key (the two bytes after it), as Kafka's broker
    refuses a request beyond ``socket.request.max.bytes``: closed with
    ``FrameTooLarge`` (cause ``frame_too_large``).
``request_frame_timeout`` (``request_frame_timeout_seconds``)
    a request frame must be complete this long after its first bytes arrived,
    not counting the time the proxy itself did not read (back-pressure, the
    request memory below): otherwise the connection closes (reason and cause
    ``frame_timeout``), so trickled bytes cannot keep a partial frame, or the
    memory reserved for it, forever.
``max_buffered_request_bytes``, ``max_queued_request_bytes`` (``RequestMemory``)
    the request bytes a connection holds (partial frames, whole frames not yet
    written upstream, Fetch frames not yet answered) come from a per-process
    pool beyond a 16 KiB share each, and are at most ``max_queued_request_bytes``
    per connection unless one frame alone is larger.  A frame larger than the
    share has its whole size reserved from its length prefix before its body is
    read, and only that frame is read until it is complete; between frames the
    connection reads within its share.  A connection the pool cannot serve is
    not read until memory comes back (back-pressure, never an error;
    ``proxy.relay.request_memory`` says in what order).
``memory_budget_bytes`` (the relay's fetch handler's, ``FetchHandler.reserve_response``)
    a Fetch response takes its size from the memory budget once its length
    prefix is read, before its body is: while the budget cannot take it, the
    upstream connection is not read (``upstream_paused``; the broker's answers
    wait in its socket, KIP-72's muted channel).  When a Fetch response is next
    (or no answer is awaited), only its 4-byte length prefix is read before its
    budget is taken, and reads of a reserved frame stop at its end, so a
    connection waiting for budget holds none of its body; what is in memory
    unreserved is at most one read (``RECEIVE_BYTES``) past a non-Fetch answer.
``max_in_flight`` (the relay's)
    the client loop stops reading while that many requests await a response
    (at most the frame it has started, within its share or reservation, is
    read on).
``max_client_buffer_bytes``
    responses queued for the client and not yet taken by its socket; while
    more than this is queued, the client loop stops reading requests (beyond
    the frame it has started) and the upstream loop stops reading responses (so no further fetch completes or
    starts for this client).  One response may exceed it on its own, so the
    queue holds at most the limit plus one response plus what one upstream
    read completes.  A Fetch response takes its memory budget only when it
    fits in the limit beside what the client has not taken yet, or when
    nothing waits for the client: a client that stops reading holds at most
    max(this, one Fetch response) of the budget.  A client that stops reading
    therefore costs a bounded amount of memory and nothing else: every
    connection has its own loops.
``client_write_timeout`` (``client_write_timeout_seconds``)
    every write of queued responses to the client must complete this long
    after it started; otherwise the connection closes (reason and cause
    ``client_write_timeout``), and with it go the responses it queued and the
    memory budget they held.  Kafka's broker gives a response back only when
    its send completes or its connection closes; a Kafka client gives up on a
    response after its ``request.timeout.ms`` (30 s) anyway, so a client that
    has taken nothing for that long is not going to, and the budget it holds
    serves the others again.
``idle`` (``idle_timeout_seconds``)
    the connection closes (``idle_timeout``) when no request awaits its
    response and no byte has moved to or from the client for the timeout; a
    request waiting upstream (a long-poll Fetch) keeps it open, unless its
    answer is stuck behind responses the client does not read.  The check
    costs one look per timeout period, not a wake-up per message, and no task
    of the connection's own: the process's one ``IdleTimer`` (``idle.py``)
    looks at the earliest moment the connection could be idle long enough and
    again from the latest activity.

Scheduler turns: a request and its response cost the tasks that move them and
nothing else.  The upstream loop writes the responses it read to a plain TCP
client itself, as far as the client's socket takes them at once (the writer
writes the rest and whatever the other loops answered; it is woken only when
something waits for it); a Fetch response's body, right behind the length
prefix read alone, is read without waiting for the socket again; the loops
waiting for room (client full, requests in flight) are woken only when slots
or queued bytes change; an uncontended upstream write takes its lock without a
checkpoint.  ``bench/edge_micro.py`` counts the turns per fetch.
"""

from __future__ import annotations

import abc
import logging
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

import structlog
import trio

from ..protocol.apis import FETCH
from ..protocol.errors import FrameTooLarge, ProtocolError
from ..protocol.framing import BodyPool, Buffer, FrameDecoder, Payload, frame_chunks
from ..relay.relay import FetchHandler, Relay
from ..relay.request_memory import WAIT_OWN, WAIT_POOL, RequestMemory
from .idle import IdleTimer, IdleWatch
from .sockets import LeanSocketStream

if TYPE_CHECKING:
    from ..observe.traffic import TrafficMeter

RECEIVE_BYTES = 64 * 1024
UPSTREAM_RECEIVE_BYTES = 256 * 1024
"""Upstream reads are larger than the allocator's mmap threshold (``proxy.server.allocator``),
so the pieces a large Fetch response arrives in are mapped, each given back to the system when
the frame is joined, rather than left as holes in the heap that keep the RSS above the budget
(bench/fetch_memory.py: RSS growth +51..59 MiB against +56..72 with 64 KiB reads, once +176).
They are that large only while data streams in (the previous read filled its buffer): a read
after a short one asks for ``RECEIVE_BYTES``, served from the heap, so a small answer costs
no ``mmap``/``mremap``/``munmap`` (and page fault) of its own; at most the first piece of a
large response comes from the heap."""
_PREFIX_BYTES = 4
"""A Kafka frame's length prefix."""
DEFAULT_MAX_CLIENT_BUFFER_BYTES = 1024 * 1024
_UNBOUNDED = 1 << 62
"""The request memory of a connection given no pool: no limit beyond the share's read sizes."""
SESSION_CLOSE_SECONDS = 1.0
"""How long a connection whose client closed waits for the broker to end its upstream fetch
session (``close_upstream_session``): a fetch waiting upstream is answered first, within
the proxy's ``max_upstream_wait_ms`` (500 ms by default)."""
UPSTREAM_CLOSE_FLUSH_SECONDS = 5.0
"""When the broker closes, how long the responses it sent before may take to reach the client."""

log = structlog.get_logger("proxy.server")


class ImmediateWrites(abc.ABC):
    """A client stream that wraps another (``proxy.server.proxy.DrainableStream``) and says
    whether a response may be written to its socket at once, outside the writer task.
    (A base class, not a Protocol: ``isinstance`` runs for every response written, and a
    runtime-checkable Protocol's walks the class's members each time.)"""

    __slots__ = ()

    @abc.abstractmethod
    def immediate_sender(self) -> Callable[[Buffer], int] | None:
        """The socket's ``send_now``, or None: every write goes through the writer task."""


@dataclass(slots=True)
class _Outcome:
    reason: str | None = None
    error: str | None = None
    frame_too_large: bool = False
    """A length prefix announced more than ``max_frame_bytes`` (metrics cause ``frame_too_large``)."""


class Connection:
    """Relays between one client stream and one upstream stream until either ends."""

    __slots__ = (
        "__weakref__",
        "_account",
        "_changed",
        "_client_id",
        "_decoder",
        "_ended",
        "_last_active",
        "_log_requests",
        "_now",
        "_nursery",
        "_out",
        "_queued",
        "_scope",
        "_unsent",
        "_unsent_done",
        "_upstream_lock",
        "_waker_started",
        "_wakeup",
        "_writer_started",
        "_writing",
        "_writing_client",
        "bodies",
        "buffered",
        "client",
        "client_write_timeout",
        "drain_effects",
        "fetch_handler",
        "idle",
        "max_client_buffer_bytes",
        "max_frame_bytes",
        "meter",
        "on_request",
        "outcome",
        "peak_buffered",
        "peak_request_bytes",
        "reading_paused",
        "relay",
        "request_frame_timeout",
        "request_memory",
        "upstream",
        "upstream_paused",
    )

    def __init__(
        self,
        client: trio.abc.Stream,
        upstream: trio.abc.Stream,
        relay: Relay,
        *,
        max_frame_bytes: int,
        max_client_buffer_bytes: int = DEFAULT_MAX_CLIENT_BUFFER_BYTES,
        idle: IdleTimer | None = None,
        client_write_timeout: float = 0.0,
        on_request: Callable[[int, int, int], None] | None = None,
        meter: TrafficMeter | None = None,
        max_request_frame_bytes: int | None = None,
        request_frame_timeout: float = 0.0,
        request_memory: RequestMemory | None = None,
        drain_effects: Callable[[], None] | None = None,
        bodies: BodyPool | None = None,
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.relay = relay
        self.max_frame_bytes = max_frame_bytes
        self.bodies = bodies
        """Where large upstream frame bodies come from (``FetchPath.bodies``; None: fresh)."""
        self.max_client_buffer_bytes = max_client_buffer_bytes
        self.idle = idle
        """The process's idle timer (``idle.py``); None: never close for idleness."""
        self.client_write_timeout = client_write_timeout
        """Seconds a write to the client may take; 0: no limit."""
        self.on_request = on_request
        self.meter = meter
        """Counts and times every frame on both legs (proxy.observe.traffic)."""
        self.outcome = _Outcome()
        self.fetch_handler: FetchHandler = relay.fetch_handler
        """The relay's fetch handler: the loops below call the edge's part of its
        ``FetchHandler`` protocol (memory budget, its waker, the responses written)."""
        self.drain_effects = drain_effects
        """Takes what the fetch handler did (``proxy.effects``) to the metrics and the
        decision log (``proxy.observe.apply.drain``): called after every input the loops
        feed the handler, so its effects never pile up."""
        self._upstream_lock = trio.Lock()
        self._changed = trio.lowlevel.ParkingLot()
        """Tasks waiting for slots or queued bytes to change (``_notify`` wakes them)."""
        self._queued = trio.lowlevel.ParkingLot()
        """The writer, while nothing is queued for the client."""
        self._out: list[Payload] = []
        self._writing_client = False
        """The writer task is writing to the client (nothing else may meanwhile)."""
        self._unsent: list[Buffer] = []
        """What the client's socket did not take of a write from the upstream loop
        (``_write_client_now``), next one last: the writer writes it before ``_out``."""
        self._unsent_done: list[tuple[int, float]] | None = None
        """The traffic meter's token for ``_unsent`` (``TrafficMeter.client_sent``)."""
        self.buffered = 0
        """Bytes (with length prefixes) queued for the client and not yet taken by its socket."""
        self.peak_buffered = 0
        """The most ``buffered`` ever was (what a test of the limit reads)."""
        self._last_active = 0.0
        self._now: Callable[[], float] = trio.current_time
        """The run's clock (``run`` binds its ``current_time``: one call where
        ``trio.current_time`` makes three, several times per request)."""
        self._client_id: str | None = None
        self._log_requests = True
        """Whether each request gets a debug line (``run()`` asks the logging configuration)."""
        self.request_frame_timeout = request_frame_timeout
        """Seconds a request frame may take once its first bytes arrived; 0: no limit."""
        self._decoder = FrameDecoder(
            max_frame_bytes, max_request_frame_bytes=max_request_frame_bytes
        )
        """The client leg's decoder (what it holds counts as request memory)."""
        if request_memory is None:
            request_memory = RequestMemory(_UNBOUNDED, per_connection=_UNBOUNDED)
        self.request_memory = request_memory
        self._account = request_memory.account()
        self._account.wake = self._notify
        self._writing = 0
        """Bytes of requests taken from the relay and being written upstream."""
        self.peak_request_bytes = 0
        """The most request bytes this connection ever held (what a test of the limits reads)."""
        self.upstream_paused = False
        """The upstream connection is not read: the Fetch response in progress waits for
        memory budget (``FetchHandler.reserve_response``)."""
        self._ended = False
        """``run`` has ended (its nursery is closed to new tasks)."""
        self._nursery: trio.Nursery | None = None
        self._scope: trio.CancelScope | None = None
        """``run``'s nursery and cancel scope, for the tasks started when first needed."""
        self._writer_started = False
        self._waker_started = False
        self._wakeup = trio.Event()
        """Set by the fetch handler's waker; ``_wake_loop`` waits on it (``_bind_waker``)."""
        self.reading_paused: str | None = None
        """Why the client is not read for request memory: ``"own"`` (its requests must
        drain first) or ``"pool"`` (the process's request memory is taken); None: it is."""

    @property
    def client_id(self) -> str | None:
        """The client_id of the client's latest request header."""
        return self._client_id

    @property
    def request_bytes(self) -> int:
        """Request bytes held: partial frames, frames not yet written upstream, Fetch frames
        not yet answered."""
        return self._decoder.buffered + self.relay.held_bytes + self._writing

    @property
    def client_full(self) -> bool:
        """More than ``max_client_buffer_bytes`` waits for the client: reading is paused."""
        return self.buffered > self.max_client_buffer_bytes

    def _client_has_room(self, nbytes: int) -> bool:
        """A response of *nbytes* may be read for the client now: nothing waits for it, or
        both fit in ``max_client_buffer_bytes`` (what a client that stops reading holds of
        the memory budget)."""
        buffered = self.buffered
        return not buffered or buffered + nbytes <= self.max_client_buffer_bytes

    async def wait_changed(self) -> None:
        """Return at the next change of the connection's state (slots freed, queued bytes)."""
        await self._changed.park()

    async def run(self) -> str:
        """Relay until one side ends; returns the reason (see ``proxy.logs``)."""
        self._now = now = trio.lowlevel.current_clock().current_time
        self._last_active = now()
        self._log_requests = _debug_enabled()
        watch: IdleWatch | None = None
        try:
            async with trio.open_nursery() as nursery:
                scope = nursery.cancel_scope
                nursery.start_soon(self._guard, self._client_loop, scope)
                nursery.start_soon(self._guard, self._upstream_loop, scope)
                self._nursery, self._scope = nursery, scope  # (writer and waker: when needed)
                self._bind_waker()
                if self.idle is not None:
                    watch = self.idle.watch(self._idle_check, self._last_active + self.idle.timeout)
        finally:
            self._ended = True  # the nursery is closed: a late wake starts nothing
            if watch is not None:
                watch.cancel()
            if self.drain_effects is not None:
                self.drain_effects()  # what the last inputs did
            self._account.close()  # its request memory goes back to the other connections
            # ... and its bytes go now: whatever still refers to the Connection (its tasks'
            # closures, the proxy's bookkeeping: cycles the GC frees late) must not keep a
            # partial frame resident (up to a whole frame: 64 MiB while the pool lets the
            # next connection in).
            self._decoder = FrameDecoder(self.max_frame_bytes)
        reason = self.outcome.reason or "cancelled"
        fields: dict[str, object] = {
            "reason": reason,
            "in_flight": self.relay.in_flight,
            "client_id": self._client_id,
        }
        if self.buffered:
            fields["buffered_bytes"] = self.buffered
        if self.outcome.error:
            fields["error"] = self.outcome.error
        if reason in ("protocol_error", "internal_error", "frame_timeout", "client_write_timeout"):
            log.warning("connection_closed", **fields)
        else:
            log.info("connection_closed", **fields)
        return reason

    def _finish(self, reason: str, error: str | None = None) -> None:
        if self.outcome.reason is None:
            self.outcome.reason = reason
            self.outcome.error = error

    async def _guard(
        self, loop: Callable[[], Awaitable[None]], scope: trio.CancelScope, *, ends: bool = True
    ) -> None:
        """Run one of the connection's tasks: when it ends (*ends*) or fails, so does the
        connection."""
        failed = True
        try:
            await loop()
            failed = False
        except ProtocolError as exc:
            if self.outcome.reason is None and isinstance(exc, FrameTooLarge):
                self.outcome.frame_too_large = True
            self._finish("protocol_error", f"{type(exc).__name__}: {exc}")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            self._finish("io_error", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # never let one connection take the process down
            log.exception("connection_failed", error=f"{type(exc).__name__}: {exc}")
            self._finish("internal_error", f"{type(exc).__name__}: {exc}")
        finally:
            if ends or failed:
                scope.cancel()

    # --- state changes ---------------------------------------------------------------------

    def _notify(self) -> None:
        """Something the loops wait on changed (slots freed, queued bytes)."""
        if self._changed:  # usually nobody waits: not even a call into the parking lot
            self._changed.unpark_all()

    async def _until(self, ready: Callable[[], bool]) -> None:
        while not ready():
            await self._changed.park()

    def _take_replies(self, *, wake_writer: bool = True) -> None:
        """Move what the relay answered to the writer's queue (call after every relay input),
        and drain the fetch handler's effects.

        Answers free slots and queue bytes: the writer (unless the caller writes them
        itself, *wake_writer* False) and the loops waiting for either are woken.
        Without answers nothing they wait on changed.
        """
        if self.drain_effects is not None:
            self.drain_effects()
        held = self.request_bytes
        if self._account.held != held:  # an answered Fetch gave its frame's bytes back
            self._account.settle(held)
            self._notify()
        frames = self.relay.take_client()
        if frames:
            self._last_active = self._now()  # an answer is activity too
            self._out += frames
            self.buffered += sum(4 + len(f) for f in frames)
            self.peak_buffered = max(self.peak_buffered, self.buffered)
            if wake_writer:
                self._wake_writer()
            self._notify()

    def _can_read_client(self) -> bool:
        return self.relay.can_accept and not self.client_full

    def _settle(self) -> None:
        """What the connection holds of requests went down: memory goes back to the pool,
        and the client loop, if it waits for its own requests to drain, looks again."""
        self._account.settle(self.request_bytes)
        self._notify()

    # --- the loops -------------------------------------------------------------------------

    async def _client_loop(self) -> None:
        decoder = self._decoder
        account = self._account
        timeout = self.request_frame_timeout
        arrived = self._last_active
        paused = 0.0  # seconds since that read the proxy did not read, by its own choice
        deadline: float | None = None
        """When the frame in progress must be complete (None: no frame, or no limit)."""
        while True:
            frame = decoder.next_frame()
            if frame is not None:
                deadline = None
                if not self._can_read_client():
                    # Back-pressure: nothing more is read while max_in_flight requests
                    # await their responses or the client leaves more than its buffer
                    # unread.  What the frames read so far queued goes upstream first.
                    waited = self._now()
                    await self._send_upstream()
                    await self._until(self._can_read_client)
                    paused += self._now() - waited
                self._handle_request(frame, arrived)
                continue
            # Every whole frame of the last read is handled: send what they queued in one
            # write, then read on.  A client that pipelines pays one upstream write (and
            # its scheduler turns) per read, not per request.  A broker slow to take
            # them is not the client's delay either.
            if self.relay.upstream_queued:
                # a partial frame's time does not count while the proxy writes (no frame
                # in progress: nothing to time)
                timed = timeout > 0 and (decoder.buffered or decoder.missing is not None)
                waited = self._now() if timed else 0.0
                await self._send_upstream()
                if timed:
                    stalled = self._now() - waited
                    paused += stalled
                    if deadline is not None:
                        deadline += stalled
            if timeout > 0:
                if not decoder.buffered and decoder.missing is None:
                    deadline = None
                elif deadline is None:
                    # The frame's first bytes came with the last read.
                    deadline = arrived + paused + timeout
            held = self.request_bytes
            self.peak_request_bytes = max(self.peak_request_bytes, held)
            allowed = account.next_read(held, decoder.buffered, decoder.missing)
            if allowed == WAIT_OWN or allowed == WAIT_POOL:
                # Not read until its own requests drain or the pool lets it in; the
                # time it waits is not the client's, so it does not count against it.
                waited = self._now()
                self.reading_paused = str(allowed)
                self._notify()  # whoever watches the connection's state sees the pause
                try:
                    await self._changed.park()
                finally:
                    self.reading_paused = None
                if deadline is not None:
                    deadline += self._now() - waited
                continue
            assert isinstance(allowed, int)
            # A frame that took memory from the pool is read in large pieces (mapped, given
            # back to the system when it is joined: see UPSTREAM_RECEIVE_BYTES).
            size = allowed if allowed <= RECEIVE_BYTES else min(allowed, UPSTREAM_RECEIVE_BYTES)
            try:
                if deadline is None:
                    data = await self.client.receive_some(size)
                else:
                    data = b""
                    with trio.move_on_at(deadline) as scope:
                        data = await self.client.receive_some(size)
                    if scope.cancelled_caught:
                        self._frame_timed_out(decoder)
                        return
            except trio.BrokenResourceError as exc:
                # Reset by the client (a killed process, a socket closed with unread data):
                # its session upstream is as dead as after a clean close.
                self._finish("io_error", f"{type(exc).__name__}: {exc}")
                await self.close_upstream_session()
                return
            if not data:
                decoder.close()  # TruncatedFrame if the client left half a frame
                self._finish("client_closed")
                await self.close_upstream_session()
                return
            arrived = self._last_active = self._now()
            paused = 0.0
            account.received(len(data))
            decoder.feed(data)
            self._notify()  # request bytes held changed (only tasks parked on it look)

    def _frame_timed_out(self, decoder: FrameDecoder) -> None:
        missing = decoder.missing
        size = None if missing is None else decoder.buffered + missing
        self._finish(
            "frame_timeout",
            f"a request frame was not complete {self.request_frame_timeout:g} s after its"
            f" first bytes: {decoder.buffered} of {size if size is not None else 'unknown'}"
            " bytes arrived (request_frame_timeout_seconds)",
        )

    def _handle_request(self, frame: bytes, arrived: float) -> None:
        relay = self.relay
        header = relay.client_frame(frame)
        self._take_replies()
        if self.meter is not None:
            self.meter.client_frame(header, frame, arrived, expects=relay.last_expects)
        if header is None:  # a raw SASL v0 token: nothing to log
            return
        if header.client_id != self._client_id:
            self._client_id = header.client_id
            structlog.contextvars.bind_contextvars(client_id=header.client_id)
        if self.on_request is not None:
            self.on_request(header.api_key, header.api_version, len(frame))
        if self._log_requests:
            log.debug(
                "request",
                api_key=header.api_key,
                api_version=header.api_version,
                correlation_id=header.correlation_id,
            )

    async def _upstream_loop(self) -> None:
        # Its frames' memory is taken from their length prefix: a large body is read in place.
        decoder = FrameDecoder(self.max_frame_bytes, preallocate=True, bodies=self.bodies)
        relay = self.relay
        fetch_handler = self.fetch_handler
        size = RECEIVE_BYTES
        reserved = False  # the frame in progress has its memory budget (a Fetch response's)
        again = False  # the last read waited and filled its buffer: more may be there now
        while True:
            # A client that does not read its responses stops this connection's
            # upstream reads: its broker's answers wait in the broker's socket.
            while self.client_full:
                await self._changed.park()
            # KIP-72: a Fetch response takes its memory budget from its length prefix,
            # before its body is read; while the budget cannot take it, this upstream
            # connection is not read (its other answers are behind it in order anyway).
            if (
                not reserved
                and (missing := decoder.missing) is not None
                and relay.next_response_key == FETCH
            ):
                frame_size = missing + decoder.buffered
                # Its budget is taken only beside what the client has not read yet
                # within max_client_buffer_bytes (or when that is nothing), so a client
                # that stops reading holds at most that much (or one response).
                while not self._client_has_room(frame_size):
                    await self._changed.park()
                while not fetch_handler.reserve_response(frame_size):
                    if self.drain_effects is not None:
                        self.drain_effects()  # it waits: counted now, not when it is read
                    self.upstream_paused = True
                    await self._changed.park()
                self.upstream_paused = False
                reserved = True
            want = size
            if reserved and (missing := decoder.missing):
                want = min(size, missing)  # to its end: what follows is not reserved yet
            elif decoder.missing is None and relay.next_response_key in (FETCH, None):
                # A Fetch response (or one to a request sent while this read waits) is
                # next: read its length prefix alone, so none of its body is in memory
                # before its budget is taken (a connection waiting for budget would hold
                # a whole read of it unaccounted, 64-256 KiB each).
                want = max(1, _PREFIX_BYTES - decoder.buffered)
            upstream = self.upstream
            lean = upstream if isinstance(upstream, LeanSocketStream) else None
            into = decoder.body_view() if lean is not None else None
            if lean is not None and into is not None:
                # A large body (its budget taken): read where it stays, with no pieces
                # to join (``FrameDecoder``'s *preallocate*).
                with into:
                    got = lean.receive_into_now(into) if again else None
                    if got is None:
                        got = await lean.receive_into(into)
                        again = got >= len(into)
                    else:
                        again = False
                if got:
                    decoder.received(got)
            else:
                ready: bytes | None = None
                if again and lean is not None:
                    # The read before waited and filled its buffer (a length prefix read
                    # alone, most often, its body right behind it): read on without
                    # waiting, which would cost a scheduler turn for bytes already here.
                    # Once per waited read, so this loop still yields at least every
                    # other read.
                    ready = lean.receive_now(want)
                    again = False
                if ready is not None:
                    data: bytes | bytearray = ready
                else:
                    data = await upstream.receive_some(want)
                    again = len(data) >= want
                size = UPSTREAM_RECEIVE_BYTES if len(data) >= size else RECEIVE_BYTES
                got = len(data)
                if got:
                    decoder.feed(data)
            if not got:
                # Kafka answers and then closes (a failed SASL authentication, for one):
                # what it answered reaches the client before the client's connection closes.
                with trio.move_on_after(UPSTREAM_CLOSE_FLUSH_SECONDS):
                    await self._until(lambda: not self.buffered)
                self._finish("upstream_closed")
                return
            if not self._take_frames(decoder):
                # No whole frame (a length prefix read alone, a part of a body): nothing
                # reached the relay, so nothing new waits for upstream or the client.
                continue
            reserved = False
            await self._send_upstream()
            self._write_client_now()

    def _take_frames(self, decoder: FrameDecoder) -> bool:
        """Hand the whole frames *decoder* holds to the relay; whether there was one."""
        frame = decoder.next_body()
        if frame is None:
            return False
        meter = self.meter
        now = self._now() if meter is not None else 0.0
        relay = self.relay
        while frame is not None:
            if meter is not None:
                meter.upstream_frame(frame, now)
            relay.upstream_frame(frame)
            frame = decoder.next_body()
        self._take_replies(wake_writer=False)
        return True

    def _write_client_now(self) -> None:
        """Write the queued responses from this task (the upstream loop, which just read
        them), as far as the client's socket takes them at once: no hand-over to the
        writer task, one task switch less per response.  What the socket does not take
        goes to the writer (``_unsent``, first in line), so this never waits for the
        client and ``max_client_buffer_bytes`` bounds a client that stops reading as
        before.  Only on a plain TCP client socket, while the client is not being
        drained (``_client_sender``); otherwise the writer writes everything."""
        if not self._out or self._writing_client or self._unsent:
            if self._out:
                self._wake_writer()
            return
        send_now = self._client_sender()
        if send_now is None:
            self._wake_writer()
            return
        frames, self._out = self._out, []
        meter = self.meter
        done = meter.client_sent(frames) if meter is not None else None
        chunks = frame_chunks(frames)
        frames.clear()
        chunks.reverse()
        moved = False
        now: float | None = None
        try:
            while chunks:
                chunk = chunks[-1]
                sent = send_now(chunk)
                if sent:
                    moved = True
                    self.buffered -= sent
                if sent < len(chunk):
                    # The rest waits for the client: the writer writes it, then what follows.
                    chunks[-1] = memoryview(chunk)[sent:]
                    self._unsent, self._unsent_done = chunks, done
                    self._wake_writer()
                    return
                chunks.pop()
            if done is not None and meter is not None:
                now = self._now()
                meter.client_written(done, now)
            # Every response answered so far is written: its memory budget is free.
            self.fetch_handler.written()
        finally:
            if moved:
                self._last_active = self._now() if now is None else now
                self._notify()

    def _client_sender(self) -> Callable[[Buffer], int] | None:
        """The client's plain TCP socket's ``send_now``, or None: a TLS stream, or a client
        being drained (its ``DrainableStream`` wants to see every write then)."""
        client = self.client
        if isinstance(client, LeanSocketStream):
            return client.send_now
        if isinstance(client, ImmediateWrites):
            return client.immediate_sender()
        return None

    def _wake_writer(self) -> None:
        """Responses wait for the writer: wake it, or start it.  It is started at the first
        response the upstream loop could not write itself (``_write_client_now``), so a
        connection whose answers all went out at once (most small ones) holds no writer
        task.  Once the connection has ended nothing is started."""
        if self._writer_started:
            if self._queued:
                self._queued.unpark_all()
        else:
            self._writer_started = self._start_when_needed(self._writer_loop)

    @property
    def running(self) -> bool:
        """``run`` has begun and not ended: tasks can start beside its loops."""
        return not self._ended and self._nursery is not None

    def start_task(self, task: Callable[[], Awaitable[None]]) -> bool:
        """Start *task* beside the connection's loops, for at most as long as the
        connection lives (a replica link, ``replicas.py``: started by its first fetch, so
        a connection that never follows a replica runs no task for it).  Its end does not
        end the connection; an exception it lets out does, as a loop's.  False: nothing
        started (the connection has ended or not begun)."""
        return self._start_when_needed(task, ends=False)

    def _start_when_needed(self, loop: Callable[[], Awaitable[None]], *, ends: bool = True) -> bool:
        """Start *loop* as one of ``run``'s tasks (the writer, the waker, a replica link:
        tasks most connections never need, started at their first use; *ends*: its end
        ends the connection, see ``_guard``).  False: nothing started, the connection has
        ended (its nursery is closed) or not begun."""
        if not self.running or self._nursery is None or self._scope is None:
            return False
        try:
            self._nursery.start_soon(partial(self._guard, loop, self._scope, ends=ends))
        except RuntimeError:
            # Closed to new arrivals: its last task has ended and ``run`` has not resumed
            # to mark the end yet (other tasks run in between: a drain, another
            # connection's wake).  The connection is ending; nothing is started.
            return False
        return True

    async def _writer_loop(self) -> None:
        """Write the queued responses in order; each buffer is let go once written.

        Responses the upstream loop read are written by that loop as far as the
        socket takes them at once (``_write_client_now``); the writer writes the
        rest, and whatever the other loops queued."""
        while True:
            while not (self._out or self._unsent):
                await self._queued.park()
            self._writing_client = True
            try:
                while self._unsent or self._out:
                    if self._unsent:
                        chunks, done = self._unsent, self._unsent_done
                        self._unsent, self._unsent_done = [], None
                    else:
                        frames, self._out = self._out, []
                        done = self.meter.client_sent(frames) if self.meter is not None else None
                        chunks = frame_chunks(frames)
                        frames.clear()
                        chunks.reverse()
                    if not await self._write_chunks(chunks):
                        return
                    if done is not None and self.meter is not None:
                        self.meter.client_written(done, self._now())
            finally:
                self._writing_client = False
            # Every response answered so far is written: its memory budget is free.
            self.fetch_handler.written()

    async def _write_chunks(self, chunks: list[Buffer]) -> bool:
        """Write *chunks* (in reverse order: the next one last), letting each go once
        written; False when a write timed out (the connection is ending)."""
        timeout = self.client_write_timeout
        while chunks:
            chunk = chunks.pop()
            if timeout > 0:
                with trio.move_on_after(timeout) as scope:
                    await self.client.send_all(chunk)
                if scope.cancelled_caught:
                    self._write_timed_out(len(chunk))
                    return False
            else:
                await self.client.send_all(chunk)
            self.buffered -= len(chunk)
            self._last_active = self._now()
            self._notify()
        return True

    def _write_timed_out(self, nbytes: int) -> None:
        self._finish(
            "client_write_timeout",
            f"the client took not all of a {nbytes}-byte write of its responses in"
            f" {self.client_write_timeout:g} s ({self.buffered} bytes queued for it;"
            " client_write_timeout_seconds)",
        )

    def _bind_waker(self) -> None:
        """Give the fetch handler its waker; the task that serves it (``_wake_loop``) is
        started at the first wake, so a connection that never needs one (no fetch that
        waited for budget, no large fetch: most of them) holds no task, coroutine and
        event for it (a few KiB each of 1,000 idle connections).  A wake once the
        connection has ended (another connection freeing budget) starts nothing."""

        def wake() -> None:
            self._wakeup.set()
            if not self._waker_started:
                self._waker_started = self._start_when_needed(self._wake_loop)

        self.fetch_handler.bind_waker(wake)

    async def _wake_loop(self) -> None:
        """Fetches that waited outside this connection (the memory budget) resume here,
        and a large fetch's slices run here, one per scheduler batch, in the lane.

        The fetch handler (``proxy.fetchpath``) calls the waker from whichever task
        freed budget, or after a slice when another follows; the fetch itself
        continues in this connection's own task.  Every resume holds the process's
        slice lane (``_slice_lane``): a connection keeps it from its first slice to
        the last of the run (until its fetch has a request for upstream, waits for
        budget or is answered; at most ``SLICE_LANE_TURN_SECONDS`` while others
        wait) and checkpoints between two slices, so the other connections' tasks
        run between them while the other large fetches wait their turn in arrival
        order, instead of each taking a slice in every batch (54 large fetches at
        once would otherwise hold the loop for 54 slices per batch, and all be
        decoded at once).
        """
        fetch_handler = self.fetch_handler
        lane = _slice_lane()
        while True:
            await self._wakeup.wait()
            async with lane:
                turn_ends = self._now() + SLICE_LANE_TURN_SECONDS
                while True:
                    self._wakeup = wakeup = trio.Event()
                    fetch_handler.resume()
                    self._notify()  # an upstream loop waiting for budget asks again
                    self._take_replies()
                    if not wakeup.is_set() or self.relay.upstream_queued:
                        break  # (written upstream outside the lane: a slow socket holds no one)
                    if lane.statistics().tasks_waiting and self._now() >= turn_ends:
                        break  # others wait: the next slice queues behind them
                    await trio.lowlevel.checkpoint()  # another slice follows: others run first
            await self._send_upstream()

    def _idle_check(self, now: float) -> float | None:
        """The idle timer's look at this connection (``IdleTimer.watch``): close it if it
        has been idle for the whole timeout (None), else when to look again.  Activity
        only moves ``_last_active``; a request in flight upstream with nothing queued for
        the client (a long poll) is activity that lasts, so it looks again a whole
        timeout later."""
        assert self.idle is not None
        if self._ended or self._scope is None:
            return None
        if self.relay.in_flight and not self.buffered:
            return now + self.idle.timeout  # a request awaits upstream (a long poll)
        deadline = self._last_active + self.idle.timeout
        if now >= deadline:
            self._finish("idle_timeout")
            self._scope.cancel()
            return None
        return deadline

    async def close_upstream_session(self) -> None:
        """The client closed (or reset) the connection, or the proxy drains it
        (``DrainableStream``'s ``before_close``): end its upstream fetch session
        (``FetchHandler.close_session``, as the client id of its latest request), waiting at
        most ``SESSION_CLOSE_SECONDS`` for the broker's answer, as Kafka's Java consumer
        waits for its own on close.  Best effort: a fetch still waiting upstream is answered
        first (a broker answers a connection in order), and the connection ends anyway when
        the time is up."""
        answered = trio.Event()
        if not self.fetch_handler.close_session(self._client_id, answered.set):
            return
        with trio.move_on_after(SESSION_CLOSE_SECONDS):
            await self._send_upstream()
            await answered.wait()

    async def _send_upstream(self) -> None:
        if not self.relay.upstream_queued:
            return  # nothing to send: no lock, no scheduler turn
        lock = self._upstream_lock
        try:
            lock.acquire_nowait()  # uncontended (the usual case): no checkpoint
        except trio.WouldBlock:
            await lock.acquire()  # another task is writing upstream: queue behind it
        try:
            if self.meter is not None:
                frames, kinds = self.relay.take_upstream_with_kinds()
                if frames:
                    self.meter.upstream_sent(frames, self._now(), kinds=kinds)
            else:
                frames = self.relay.take_upstream()
            if frames:
                self._writing = sum(len(f) for f in frames)
                await _write(self.upstream, frames)
        finally:
            lock.release()
            if self._writing:
                self._writing = 0
                self._settle()  # written (or the connection is ending): handed upstream


SLICE_LANE_TURN_SECONDS = 0.25
"""How long one connection keeps the slice lane while others wait for it (``_wake_loop``)."""
_SLICE_LANE: trio.lowlevel.RunVar[trio.Lock] = trio.lowlevel.RunVar("slice_lane")


def _slice_lane() -> trio.Lock:
    """The process's one lane for fetch slices (``_wake_loop``); trio's Lock is fair: it
    passes to the connections that wait, in the order they asked."""
    try:
        return _SLICE_LANE.get()
    except LookupError:
        lane = trio.Lock()
        _SLICE_LANE.set(lane)
        return lane


def _debug_enabled() -> bool:
    """Whether the logging configuration passes debug lines (read once per connection, so a
    request's debug line costs nothing when it would be dropped anyway)."""
    check = getattr(log.bind(), "is_enabled_for", None)
    return True if check is None else bool(check(logging.DEBUG))


async def _write(stream: trio.abc.Stream, frames: list[bytes] | list[Payload]) -> None:
    """Write *frames* size-prefixed, without copying large ones; *frames* is emptied.

    Each buffer is dropped as soon as it is written, so a slow reader holds
    only what it has not read yet (the relay has already let go of them).
    """
    chunks = frame_chunks(frames)
    frames.clear()
    chunks.reverse()
    while chunks:
        await stream.send_all(chunks.pop())
