"""One client connection: its upstream link and the two loops that feed the relay.

The client loop reads whole frames (size checked from the length prefix before
buffering), hands them to the sans-I/O ``Relay`` and sends what it queues
upstream; the upstream loop does the reverse.  Whichever side ends first ends
the connection: an upstream drop closes the client (Kafka clients reconnect),
a malformed frame from either side closes this connection with one log line,
and nothing that happens here can reach the rest of the process.
"""

from __future__ import annotations

import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog
import trio

from ..protocol.errors import ProtocolError
from ..protocol.framing import FrameDecoder, Payload, frame_chunks
from ..relay.pipeline import Relay

if TYPE_CHECKING:
    from ..observe.traffic import TrafficMeter

RECEIVE_BYTES = 64 * 1024
UPSTREAM_RECEIVE_BYTES = 256 * 1024
"""Upstream reads are larger than the allocator's mmap threshold (``proxy.server.allocator``),
so the pieces a large Fetch response arrives in are mapped, each given back to the system when
the frame is joined, rather than left as holes in the heap that keep the RSS above the budget
(bench/fetch_memory.py: RSS growth +51..59 MiB against +56..72 with 64 KiB reads, once +176)."""

log = structlog.get_logger("proxy.server")


@dataclass(slots=True)
class _Outcome:
    reason: str | None = None
    error: str | None = None


class Connection:
    """Relays between one client stream and one upstream stream until either ends."""

    def __init__(
        self,
        client: trio.abc.Stream,
        upstream: trio.abc.Stream,
        relay: Relay,
        *,
        max_frame_bytes: int,
        on_request: Callable[[int, int, int], None] | None = None,
        meter: TrafficMeter | None = None,
    ) -> None:
        self.client = client
        self.upstream = upstream
        self.relay = relay
        self.max_frame_bytes = max_frame_bytes
        self.on_request = on_request
        self.meter = meter
        """Counts and times every frame on both legs (proxy.observe.traffic)."""
        self.outcome = _Outcome()
        self._client_lock = trio.Lock()
        self._upstream_lock = trio.Lock()
        self._capacity = trio.Event()
        self._client_id: str | None = None

    @property
    def client_id(self) -> str | None:
        """The client_id of the client's latest request header."""
        return self._client_id

    async def run(self) -> str:
        """Relay until one side ends; returns the reason (see ``proxy.logs``)."""
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._guard, self._client_loop, nursery.cancel_scope)
            nursery.start_soon(self._guard, self._upstream_loop, nursery.cancel_scope)
            if hasattr(self.relay.fetch_handler, "bind_waker"):
                nursery.start_soon(self._guard, self._wake_loop, nursery.cancel_scope)
        reason = self.outcome.reason or "cancelled"
        fields: dict[str, object] = {
            "reason": reason,
            "in_flight": self.relay.in_flight,
            "client_id": self._client_id,
        }
        if self.outcome.error:
            fields["error"] = self.outcome.error
        level = "warning" if reason in ("protocol_error", "internal_error") else "info"
        getattr(log, level)("connection_closed", **fields)
        return reason

    def _finish(self, reason: str, error: str | None = None) -> None:
        if self.outcome.reason is None:
            self.outcome.reason = reason
            self.outcome.error = error

    async def _guard(self, loop: Callable[[], Awaitable[None]], scope: trio.CancelScope) -> None:
        try:
            await loop()
        except ProtocolError as exc:
            self._finish("protocol_error", f"{type(exc).__name__}: {exc}")
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, ssl.SSLError) as exc:
            self._finish("io_error", f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # never let one connection take the process down
            log.exception("connection_failed", error=f"{type(exc).__name__}: {exc}")
            self._finish("internal_error", f"{type(exc).__name__}: {exc}")
        finally:
            scope.cancel()

    async def _client_loop(self) -> None:
        decoder = FrameDecoder(self.max_frame_bytes)
        relay = self.relay
        while True:
            frame = decoder.next_frame()
            if frame is None:
                data = await self.client.receive_some(RECEIVE_BYTES)
                if not data:
                    decoder.close()  # TruncatedFrame if the client left half a frame
                    self._finish("client_closed")
                    return
                decoder.feed(data)
                continue
            while not relay.can_accept:
                self._capacity = trio.Event()
                await self._capacity.wait()
            header = relay.client_frame(frame)
            if self.meter is not None:
                self.meter.client_frame(header, frame, trio.current_time())
            if header is None:  # a raw SASL v0 token: nothing to log
                await self._send_upstream()
                continue
            if header.client_id != self._client_id:
                self._client_id = header.client_id
                structlog.contextvars.bind_contextvars(client_id=header.client_id)
            if self.on_request is not None:
                self.on_request(header.api_key, header.api_version, len(frame))
            log.debug(
                "request",
                api_key=header.api_key,
                api_version=header.api_version,
                correlation_id=header.correlation_id,
            )
            await self._send_upstream()
            await self._flush_client()

    async def _upstream_loop(self) -> None:
        decoder = FrameDecoder(self.max_frame_bytes)
        relay = self.relay
        while True:
            data = await self.upstream.receive_some(UPSTREAM_RECEIVE_BYTES)
            if not data:
                self._finish("upstream_closed")
                return
            decoder.feed(data)
            while (frame := decoder.next_frame()) is not None:
                if self.meter is not None:
                    self.meter.upstream_frame(frame, trio.current_time())
                relay.upstream_frame(frame)
            if relay.can_accept:
                self._capacity.set()
            await self._flush_client()
            await self._send_upstream()

    async def _wake_loop(self) -> None:
        """Fetches that waited outside this connection (the memory budget) resume here.

        The fetch handler (``proxy.fetchpath``) calls the waker from whichever task
        freed budget; the fetch itself continues in this connection's own task.
        """
        handler = self.relay.fetch_handler
        wakeup = trio.Event()

        def wake() -> None:
            wakeup.set()

        handler.bind_waker(wake)  # type: ignore[attr-defined]
        while True:
            await wakeup.wait()
            wakeup = trio.Event()
            handler.resume()  # type: ignore[attr-defined]
            await self._send_upstream()
            await self._flush_client()

    async def _flush_client(self) -> None:
        """Send what the relay queued for the client, then tell the fetch path it was written."""
        await self._send_client()
        written = getattr(self.relay.fetch_handler, "written", None)
        if written is not None:
            written()  # frees the memory budget held by the responses just sent

    async def _send_upstream(self) -> None:
        async with self._upstream_lock:
            frames = self.relay.take_upstream()
            if frames:
                if self.meter is not None:
                    self.meter.upstream_sent(frames, trio.current_time())
                await _write(self.upstream, frames)

    async def _send_client(self) -> None:
        async with self._client_lock:
            frames = self.relay.take_client()
            if frames:
                done = self.meter.client_sent(frames) if self.meter is not None else None
                await _write(self.client, frames)
                if done is not None and self.meter is not None:
                    self.meter.client_written(done, trio.current_time())


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
