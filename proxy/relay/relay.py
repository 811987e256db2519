"""Per-connection relay state: the client's pipelined requests, our upstream correlation ids.

One ``Relay`` serves one client connection and its one upstream connection.  It
is sans-I/O: the trio edge feeds it whole frames (``client_frame``,
``upstream_frame``) and sends what it hands back (``take_upstream``,
``take_client``); nothing here touches a socket.

Correlation
    Every request sent upstream gets the relay's *own* correlation id; a FIFO
    of pending upstream entries maps each response back to its handler.  Kafka
    brokers answer one connection's requests in order, so a response whose id
    is not the oldest pending one is a protocol violation and closes the
    connection (Kafka's clients do the same).
Ordering
    Each client request that expects a response takes a *slot* in a client-order
    queue; responses leave in slot order with the client's own correlation id,
    whatever order their handlers complete in.  Produce with acks=0 has no
    response, takes no slot and never stalls the queue.
SASL
    SaslHandshake v1 + SaslAuthenticate are ordinary requests, relayed opaque.
    After a successful SaslHandshake **v0**, the client and broker exchange raw
    SASL tokens in size-prefixed frames *without* Kafka headers; the relay
    forwards that many token frames (PLAIN and OAUTHBEARER: one exchange,
    SCRAM-SHA-256/512: two) untouched, one raw response each, then resumes
    normal relaying.  Other mechanisms over v0 close the connection.
    The broker closes a connection that sends anything else between SaslHandshake
    and the final SaslAuthenticate response (a first authentication or a KIP-368
    re-authentication, ``sasl``).  So a client's SaslHandshake v1+ goes upstream only
    once every earlier request of the client has been answered (a fetch the handler
    holds back, and whatever the proxy sends for it, are done first; the broker too
    handles a connection's requests one at a time), the client's later frames
    waiting behind it in order; and while the exchange is in progress, requests the
    FetchHandler sends wait in the relay and go upstream, in the order they were
    made, once it is over.  Both count against ``max_in_flight``.
Fail closed
    A request at a version whose response would carry broker addresses the
    proxy does not rewrite (``endpoints.refused``; never advertised) closes
    the connection, as Kafka does for a version it does not support.
Bounds
    At most ``max_in_flight`` client requests are awaiting a response; the edge
    stops reading from the client while ``can_accept`` is False.  ``held_bytes``
    is what the relay holds of the client's requests: frames queued upstream and
    not yet taken, and Fetch frames not yet answered (a fetch handler may keep
    one while it waits); the edge counts it against its request-memory bounds
    (``proxy.relay.request_memory``).  A relayed request's frame is let go once
    it is queued upstream, and its correlation id is replaced with one copy of
    the frame, never two, so a request costs at most twice its size for a moment
    and once while it waits.

Plug-in point for Fetch
    Fetch requests go to a ``FetchHandler``, one per client connection (the
    proxy's is ``proxy.fetchpath.FetchPathHandler``; the Relay takes the
    instance).  It receives each Fetch as a ``ClientRequest`` and an
    ``Upstream`` port, and may

    (a) send upstream a *different* request instead of the client's
        (``upstream.send(frame, api_key=, api_version=, on_response=)``; the frame
        is any encoded request, its correlation id is replaced by the relay's);
    (b) answer the client with a *different* response (``request.reply(frame)``;
        any correlation id, the relay writes the client's), at any later time,
        e.g. from the ``on_response`` callback of an upstream request;
    (c) send proxy-originated requests upstream (e.g. Metadata for topic ids)
        whose responses go to its callback and never to the client.

    ``observe(api_key, api_version, frame)`` sees every upstream response the
    relay forwards for other APIs (e.g. Metadata, to learn topic ids).  The
    default, ``PassThroughFetch``, forwards the Fetch unchanged and rewrites
    only NodeEndpoints in the response.  Handlers raise ProtocolError to close
    the connection.  The same ``FetchHandler`` protocol is what the trio edge
    (memory budget, the connection's task) and observation (the sessions it
    holds) speak to the handler through.
"""

from __future__ import annotations

import struct
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..protocol import codec
from ..protocol.apis import API_VERSIONS, FETCH, PRODUCE, SASL_AUTHENTICATE, SASL_HANDSHAKE
from ..protocol.errors import ProtocolError
from ..protocol.fetch_views import decode_fetch_response
from ..protocol.framing import Frame, Gathered, Payload
from ..protocol.varint import read_uvarint
from . import apiversions, endpoints, rack_fetch, rewrite, sasl

_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_CID_MAX = 2**31 - 1
_COPY_ONCE_FROM = 64 * 1024

ResponseCallback = Callable[[bytes], None]


class FrameCallback:
    """A response callback that takes a frame read in place (a ``bytearray``: see
    ``FrameDecoder``'s *preallocate*) as it is.  Any other callback gets such a frame
    as ``bytes`` (a copy): only the Fetch path reads its responses' records as views
    of the frame, and it registers this."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Frame], None]) -> None:
        self.fn = fn

    def __call__(self, frame: Frame) -> None:
        self.fn(frame)


UpstreamKind = tuple[int, bool]
"""What the relay knows of a frame it queued upstream: (api_key, whether a response will
come).  A raw SASL v0 token is (SaslAuthenticate, True), the API KIP-152 later wrapped
them in.  The edge hands these to its traffic meter, which then reads nothing back from
the frame."""


class Upstream(Protocol):
    """What a FetchHandler may do with the upstream connection."""

    def send(
        self,
        frame: bytes,
        *,
        api_key: int,
        api_version: int,
        on_response: ResponseCallback | None,
    ) -> None:
        """Queue ``frame`` (request header + body) upstream; ``on_response(frame)`` gets the answer.

        ``on_response=None`` means the request has no response (acks=0 Produce).
        """

    def rewrite_addresses(self, api_key: int, api_version: int, frame: bytes) -> bytes:
        """The response frame with broker endpoints pointing at the proxy."""

    def rewrite_decoded(self, response: Any) -> Any:
        """A decoded response (to be encoded by the handler) with its NodeEndpoints resolved."""


class SessionMetadata(Protocol):
    @property
    def session_id(self) -> int: ...
    @property
    def epoch(self) -> int: ...


class SessionView(Protocol):
    """The KIP-227 session a handler holds upstream, as observation reads it
    (``proxy.sessions.as_client_session.FetchSessionClient``)."""

    @property
    def next_metadata(self) -> SessionMetadata: ...
    @property
    def session_partitions(self) -> Sequence[Any]: ...


class SessionCacheView(Protocol):
    """The cache of the sessions clients hold with the proxy, as observation reads it
    (``proxy.sessions.as_broker_cache.FetchSessionCache``)."""

    @property
    def num_sessions(self) -> int: ...
    @property
    def num_partitions(self) -> int: ...
    @property
    def evictions(self) -> int: ...


class FetchHandler(Protocol):
    """A client connection's Fetch handler: the one interface the relay, the trio edge and
    observation speak to it through (``proxy.fetchpath.FetchPathHandler``; the relay's
    ``PassThroughFetch`` when it is given none).

    The relay's part: ``handle_fetch`` takes each client Fetch, ``observe`` sees every
    upstream response the relay forwards for other APIs.

    The edge's part (``proxy.server.connection``): the memory budget of a Fetch response is
    asked from its length prefix before its body is read (``reserve_response``; False: the
    upstream connection is not read until the waker says budget was released); work that
    waited resumes in the connection's own task (``bind_waker``, ``resume``); the grants of
    answered fetches are released once their responses are written (``written``); ``close``
    gives back whatever the connection holds when it ends.

    Observation's part (``proxy.observe.session_snapshot``): the sessions it holds, upstream
    (None before its first fetch, or for a handler that holds none) and the cache of its
    clients' sessions (None: it serves none).
    """

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None: ...

    def observe(self, api_key: int, api_version: int, frame: bytes) -> None: ...

    def bind_waker(self, wake: Callable[[], None]) -> None:
        """*wake()* (sync, no I/O) asks the edge to call ``resume()`` from the connection's task."""
        ...

    def resume(self) -> None: ...

    def reserve_response(self, nbytes: int) -> bool: ...

    def written(self) -> None: ...

    def close_session(self, client_id: str | None, answered: Callable[[], None]) -> bool:
        """The client closed: send upstream, as *client_id*, what ends this connection's
        upstream fetch session, if it holds one; *answered()* is called with the broker's
        answer.  False: nothing was sent."""
        ...

    def close(self) -> None: ...

    @property
    def upstream_session(self) -> SessionView | None: ...

    @property
    def session_cache(self) -> SessionCacheView | None: ...


class PassThroughFetch:
    """The default FetchHandler: Fetch goes through unchanged, NodeEndpoints are rewritten.

    With a ``rack_fetch.RackFetch`` (the proxy's ``rack`` setting), a consumer's Fetch
    v11+ that names no rack goes up carrying the proxy's (``rack_fetch.patch_request``)
    and its answer is read for the redirects the client is given; without one, or for
    any other Fetch, the frame stays opaque bytes.  It holds no memory budget, no
    session and nothing to give back: its edge and observation parts do nothing.
    """

    upstream_session: None = None
    session_cache: None = None

    def __init__(self, rack: rack_fetch.RackFetch | None = None) -> None:
        self.rack = rack
        self.rack_override = False
        """The client's own rack is replaced too (its policy's ``rack_override``)."""

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None:
        h = request.header
        frame = request.frame
        rack = self.rack
        patched = None
        if rack is not None and rack.active:
            patched = rack_fetch.patch_request(h, frame, rack, override=self.rack_override)
            if patched is not None:
                frame = patched[0]

        def on_response(frame: bytes) -> None:
            if patched is not None and rack is not None:
                try:
                    rack.answered(decode_fetch_response(h.api_version, frame))
                except ProtocolError:
                    rack.forget()  # the client gets the frame as it came, and judges it
            request.reply(upstream.rewrite_addresses(h.api_key, h.api_version, frame))

        upstream.send(frame, api_key=h.api_key, api_version=h.api_version, on_response=on_response)

    def observe(self, api_key: int, api_version: int, frame: bytes) -> None:
        return None

    def bind_waker(self, wake: Callable[[], None]) -> None:
        return None

    def resume(self) -> None:
        return None

    def reserve_response(self, nbytes: int) -> bool:
        return True

    def written(self) -> None:
        return None

    def close_session(self, client_id: str | None, answered: Callable[[], None]) -> bool:
        return False  # it holds no session

    def close(self) -> None:
        return None


@dataclass(slots=True, eq=False)
class _Slot:
    correlation_id: int
    response: Payload | None = None
    raw: bool = False
    """A SASL v0 token exchange: the response has no correlation id to restore."""
    held: int = 0
    """Bytes of the request the relay counts as held until it is answered (a Fetch's frame)."""


@dataclass(slots=True, eq=False)
class ClientRequest:
    """A client's request as a handler sees it; ``reply`` answers it (exactly once)."""

    header: codec.RequestHeader
    frame: bytes
    _flush: Callable[[], None] = field(repr=False)
    """The relay's: move answered slots, in order, to what the client is sent."""
    _slot: _Slot | None = field(repr=False)
    _release: Callable[[int], None] | None = field(default=None, repr=False)
    """The relay's: the request's bytes it counted (``_Slot.held``) are no longer held."""

    @property
    def expects_response(self) -> bool:
        return self._slot is not None

    def reply(self, frame: Payload) -> None:
        """Answer with *frame* (bytes, or a ``Gathered`` list of buffers written as one frame)."""
        slot = self._slot
        if slot is None:
            raise ProtocolError("reply to a request that has no response")
        if slot.response is not None:
            raise ProtocolError("request answered twice")
        if slot.raw:
            slot.response = frame
        else:
            if len(frame) < 4:
                raise ProtocolError("response frame too short for a correlation id")
            if isinstance(frame, Gathered) and len(frame.head) < 4:
                frame = frame.join()
            cid = _I32.pack(slot.correlation_id)
            # A handler that encoded the response itself already used the client's
            # id: keep its frame rather than copy a whole Fetch response for 4 bytes.
            if isinstance(frame, Gathered):
                head = frame.head
                if bytes(head[:4]) != cid:
                    frame = frame.with_head(cid + bytes(head[4:]))
                slot.response = frame
            else:
                slot.response = frame if frame.startswith(cid) else cid + frame[4:]
        if slot.held and self._release is not None:
            self._release(slot.held)
            slot.held = 0
        self._flush()


@dataclass(slots=True)
class _Pending:
    correlation_id: int | None
    """None for a raw SASL v0 token (its response carries no correlation id)."""
    api_key: int
    api_version: int
    on_response: ResponseCallback


_SASL_V0_EXCHANGES = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}


def produce_acks(header: codec.RequestHeader, frame: bytes) -> int | None:
    """The acks field of a Produce request (None if the version is unknown to us)."""
    pos = header.body_offset
    if pos is None or header.api_version < 3:
        return None
    try:
        if header.header_version == 2:  # flexible: compact nullable transactional_id
            n, pos = read_uvarint(frame, pos)
            pos += max(n - 1, 0)
        else:
            (n,) = _I16.unpack_from(frame, pos)
            pos += 2 + max(n, 0)
        (acks,) = _I16.unpack_from(frame, pos)
    except (struct.error, ProtocolError) as exc:
        raise ProtocolError(f"malformed Produce request: {exc}") from exc
    return int(acks)


_RAW_HEADER = codec.RequestHeader(-1, 0, 0, None, None, None)


def _sasl_v0_mechanism(header: codec.RequestHeader, frame: bytes) -> str | None:
    """The mechanism of a SaslHandshake v0 request (None for any other request)."""
    if header.api_key != SASL_HANDSHAKE or header.api_version != 0 or header.body_offset is None:
        return None
    pos = header.body_offset
    if len(frame) < pos + 2:
        raise ProtocolError("truncated SaslHandshake request")
    (n,) = _I16.unpack_from(frame, pos)
    return frame[pos + 2 : pos + 2 + max(n, 0)].decode("utf-8", errors="replace")


class Relay:
    """The sans-I/O relay for one client connection (see the module docstring)."""

    def __init__(
        self,
        resolve: rewrite.Resolver,
        *,
        fetch_handler: FetchHandler | None = None,
        max_in_flight: int = 512,
    ) -> None:
        if max_in_flight <= 0:
            raise ValueError("max_in_flight must be positive")
        self._resolve = resolve
        self.fetch_handler: FetchHandler = fetch_handler or PassThroughFetch()
        self.max_in_flight = max_in_flight
        self._slots: list[_Slot] = []
        self._pending: list[_Pending] = []
        self._to_upstream: list[bytes] = []
        self._queued_bytes = 0
        """Bytes of the frames in ``_to_upstream``."""
        self._fetch_bytes = 0
        """Bytes of the client's Fetch frames not yet answered."""
        self._upstream_kinds: list[UpstreamKind] = []
        """One entry per frame of ``_to_upstream``, in the same order."""
        self._to_client: list[Payload] = []
        self._next_cid = 0
        self._raw_tokens = 0  # SASL v0 token frames still expected from the client
        self.last_expects = True
        """Whether the latest client request takes a response (False: Produce with acks=0)."""
        self.sasl = sasl.SaslExchange()
        """The connection's SASL exchange (its counts are what tests and logs read)."""
        self._held: list[tuple[bytes, int, int, ResponseCallback | None]] = []
        """The FetchHandler's sends made while ``sasl.active``, in order."""
        self._deferred: list[bytes] = []
        """Client frames from a SaslHandshake on, while earlier requests await answers."""
        self._deferred_bytes = 0
        self._draining = False
        self._upstream_port: Upstream = _Port(self._send_or_hold, resolve)

    # --- state the edge reads ------------------------------------------------------------

    @property
    def can_accept(self) -> bool:
        return len(self._slots) + len(self._deferred) < self.max_in_flight

    @property
    def in_flight(self) -> int:
        return len(self._slots) + len(self._deferred)

    @property
    def pending_upstream(self) -> int:
        return len(self._pending)

    @property
    def next_response_key(self) -> int | None:
        """The API key of the response upstream sends next (None: none awaited, or a raw
        SASL token): what the edge learns a frame in progress is before reading its body."""
        if not self._pending or self._pending[0].correlation_id is None:
            return None
        return self._pending[0].api_key

    @property
    def upstream_queued(self) -> bool:
        """Whether frames wait to be taken by ``take_upstream``."""
        return bool(self._to_upstream)

    @property
    def held_bytes(self) -> int:
        """Request bytes the relay holds: frames queued upstream, Fetch frames not answered,
        frames waiting behind a SaslHandshake (``_deferred``)."""
        return self._queued_bytes + self._fetch_bytes + self._deferred_bytes

    def take_upstream(self) -> list[bytes]:
        out, self._to_upstream = self._to_upstream, []
        self._upstream_kinds = []
        self._queued_bytes = 0
        return out

    def take_upstream_with_kinds(self) -> tuple[list[bytes], list[UpstreamKind]]:
        """``take_upstream()`` and, for each frame, its ``UpstreamKind``."""
        kinds, self._upstream_kinds = self._upstream_kinds, []
        out, self._to_upstream = self._to_upstream, []
        self._queued_bytes = 0
        return out, kinds

    def take_client(self) -> list[Payload]:
        out, self._to_client = self._to_client, []
        return out

    # --- inputs --------------------------------------------------------------------------

    def client_frame(self, frame: bytes) -> codec.RequestHeader | None:
        """A whole request frame from the client (None: it was a raw SASL v0 token)."""
        if not self.can_accept:
            raise ProtocolError(f"more than {self.max_in_flight} requests in flight")
        if not self._draining and not self._raw_tokens:
            if self._deferred or (self._slots and sasl.waits_for_earlier(frame)):
                return self._defer(frame)
        if self._raw_tokens:
            self._raw_tokens -= 1
            raw_slot = _Slot(0, raw=True)
            self._slots.append(raw_slot)
            self._to_upstream.append(frame)
            self._queued_bytes += len(frame)
            self._upstream_kinds.append((SASL_AUTHENTICATE, True))
            self.last_expects = True
            token = ClientRequest(_RAW_HEADER, frame, self._flush_slots, raw_slot)
            self._pending.append(_Pending(None, -1, 0, token.reply))
            return None
        header = codec.parse_request_header(frame)
        if endpoints.refused(header.api_key, header.api_version):
            # Fail closed (endpoints.py): never advertised, and Kafka closes the
            # connection on a request version it does not support.
            raise ProtocolError(
                f"api_key={header.api_key} v{header.api_version} is not relayed: its response"
                " would carry broker addresses the proxy does not rewrite"
            )
        if self.sasl.client_request(header.api_key):
            self._release_held()  # the client has finished authenticating
        expects = not (header.api_key == PRODUCE and produce_acks(header, frame) == 0)
        self.last_expects = expects
        slot = _Slot(header.correlation_id) if expects else None
        if slot is not None:
            self._slots.append(slot)
        request = ClientRequest(header, frame, self._flush_slots, slot, self._release_fetch)
        key = header.api_key
        if key == FETCH:
            if slot is not None:
                slot.held = len(frame)
                self._fetch_bytes += len(frame)
            self.fetch_handler.handle_fetch(request, self._upstream_port)
        elif key == API_VERSIONS and not apiversions.supports_request_version(header.api_version):
            request.reply(apiversions.unsupported_version_response(header.correlation_id))
        else:
            self._forward(request)
        return header

    def upstream_frame(self, frame: Frame) -> None:
        """A whole response frame from upstream."""
        if self._pending and self._pending[0].correlation_id is None:
            self._pending.pop(0).on_response(bytes(frame))  # a raw SASL v0 token answer
            return
        cid = codec.peek_correlation_id(frame)
        if not self._pending:
            raise ProtocolError(f"upstream sent correlation id {cid} with no request pending")
        entry = self._pending[0]
        if entry.correlation_id != cid:
            raise ProtocolError(
                f"upstream correlation id {cid} does not match the oldest request"
                f" ({entry.correlation_id})"
            )
        self._pending.pop(0)
        callback = entry.on_response
        if isinstance(frame, bytearray):
            if isinstance(callback, FrameCallback):
                callback(frame)
            else:
                callback(bytes(frame))
            return
        callback(frame)

    # --- internals -----------------------------------------------------------------------

    def _release_fetch(self, nbytes: int) -> None:
        self._fetch_bytes -= nbytes

    def _forward(self, request: ClientRequest) -> None:
        h = request.header
        if not request.expects_response:
            self._send(request.frame, h.api_key, h.api_version, None)
            return

        mechanism = _sasl_v0_mechanism(h, request.frame)
        if h.api_key == SASL_HANDSHAKE and h.api_version >= 1:
            self.sasl.begin(sasl.handshake_mechanism(h, request.frame) or "")

        def on_response(frame: bytes) -> None:
            if self.sasl.active and self.sasl.answered(h.api_key, h.api_version, frame):
                self._release_held()
            if mechanism is not None and frame[4:6] == b"\x00\x00":  # error_code NONE
                exchanges = _SASL_V0_EXCHANGES.get(mechanism)
                if exchanges is None:
                    raise ProtocolError(f"SASL mechanism {mechanism!r} over SaslHandshake v0")
                self._raw_tokens = exchanges
            if h.api_key == API_VERSIONS:
                frame = apiversions.rewrite_api_versions(h.api_version, frame)
            elif rewrite.needs_rewrite(h.api_key, h.api_version):
                frame = rewrite.rewrite_response(h.api_key, h.api_version, frame, self._resolve)
            self.fetch_handler.observe(h.api_key, h.api_version, frame)
            request.reply(frame)

        self._send(request.frame, h.api_key, h.api_version, on_response)
        # The response callback keeps the request (to answer it), not its bytes: a large
        # Produce is held once, queued upstream, not a second time until its answer.
        request.frame = b""

    def _send(
        self, frame: bytes, api_key: int, api_version: int, on_response: ResponseCallback | None
    ) -> None:
        if len(frame) < 8:
            raise ProtocolError("request frame too short for a header")
        cid = self._next_cid
        self._next_cid = 0 if cid == _CID_MAX else cid + 1
        if len(frame) < _COPY_ONCE_FROM:
            frame = frame[:4] + _I32.pack(cid) + frame[8:]
        else:  # one copy of a large frame (slicing it first would make two)
            with memoryview(frame) as view:
                frame = b"".join((view[:4], _I32.pack(cid), view[8:]))
        self._to_upstream.append(frame)
        self._queued_bytes += len(frame)
        self._upstream_kinds.append((api_key, on_response is not None))
        if on_response is not None:
            self._pending.append(_Pending(cid, api_key, api_version, on_response))

    def _send_or_hold(
        self, frame: bytes, api_key: int, api_version: int, on_response: ResponseCallback | None
    ) -> None:
        """The FetchHandler's send: held while a SASL exchange is in progress."""
        if self.sasl.active:
            if len(frame) < 8:
                raise ProtocolError("request frame too short for a header")
            self._held.append((frame, api_key, api_version, on_response))
        else:
            self._send(frame, api_key, api_version, on_response)

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for frame, api_key, api_version, on_response in held:
            self._send(frame, api_key, api_version, on_response)

    def _defer(self, frame: bytes) -> codec.RequestHeader:
        """Keep a client frame until the requests before its SaslHandshake are answered."""
        header = codec.parse_request_header(frame)
        self.last_expects = not (header.api_key == PRODUCE and produce_acks(header, frame) == 0)
        self._deferred.append(frame)
        self._deferred_bytes += len(frame)
        return header

    def _drain_deferred(self) -> None:
        """Relay the deferred frames, in order, up to a SaslHandshake that must wait again."""
        self._draining = True
        try:
            deferred = self._deferred
            while deferred and not (self._slots and sasl.waits_for_earlier(deferred[0])):
                frame = deferred.pop(0)
                self._deferred_bytes -= len(frame)
                self.client_frame(frame)
        finally:
            self._draining = False

    def _flush_slots(self) -> None:
        slots = self._slots
        while slots and slots[0].response is not None:
            response = slots.pop(0).response
            assert response is not None
            self._to_client.append(response)
        if self._deferred and not slots and not self._draining:
            self._drain_deferred()  # the requests before a SaslHandshake are answered


class _Port:
    """The ``Upstream`` a FetchHandler gets: the relay's send and its address rule.

    It holds the relay's send weakly: the relay holds the port (and the handler that
    keeps it), and a strong reference back would leave a closed connection's relay, and
    its fetch handler, in a reference cycle until a full collection (every 60 s,
    ``server.cli``).  Once the relay is gone, a send goes nowhere.
    """

    __slots__ = ("_resolve", "_send")

    def __init__(
        self,
        send: Callable[[bytes, int, int, ResponseCallback | None], None],
        resolve: rewrite.Resolver,
    ) -> None:
        self._send = weakref.WeakMethod(send)
        self._resolve = resolve

    def send(
        self,
        frame: bytes,
        *,
        api_key: int,
        api_version: int,
        on_response: ResponseCallback | None,
    ) -> None:
        send = self._send()
        if send is not None:
            send(frame, api_key, api_version, on_response)

    def rewrite_addresses(self, api_key: int, api_version: int, frame: bytes) -> bytes:
        return rewrite.rewrite_response(api_key, api_version, frame, self._resolve)

    def rewrite_decoded(self, response: Any) -> Any:
        return rewrite.rewrite_node_endpoints(response, self._resolve)
