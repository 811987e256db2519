"""Per-connection traffic accounting: every frame on the four legs, by API, with latencies.

One :class:`TrafficMeter` per client connection watches the frames the trio
edge moves (sans-I/O: it is told the time, it never reads a clock) and reports
them to :class:`~proxy.observe.metrics.Metrics`:

- ``client_frame``: a request from the client (``client_to_proxy``);
- ``upstream_sent``: the frames just taken from the relay for the broker
  (``proxy_to_broker``; these include requests the proxy makes itself, such as
  a session's Fetch or a Metadata lookup for topic ids);
- ``upstream_frame``: a response from the broker (``broker_to_proxy``) and the
  round trip of the request it answers (``broker_request_duration_seconds``);
- ``client_sent``: responses taken for the client (``proxy_to_client``) and, once
  written, each one's time since its request arrived
  (``client_request_duration_seconds``).

What the relay already parsed is passed in, never read again from the frames:
the request's header, whether it takes a response (``expects``: the relay has
read a Produce's acks), and for the frames sent upstream each one's API key and
whether it will be answered (``kinds``, from ``Relay.take_upstream_with_kinds``).
The series are resolved once
(:class:`~proxy.observe.metrics.Leg`; the node's bytes counters at first use):
no ``labels()`` call per message.

Responses carry no API key, so the meter keeps two FIFOs that mirror the
relay's: one per client request that will be answered (client order: the relay
answers in request order), one per upstream request that will be answered
(brokers answer a connection in order).  Produce with acks=0 has no response on
either leg and is not queued.  Raw SASL v0 tokens (no Kafka header) are counted
as ``sasl_authenticate``, the API that KIP-152 later wrapped them in.  The FIFOs
hold one small tuple per request in flight, so they are bounded by the relay's
own bounds (``max_in_flight`` client requests, and the requests a fetch handler
keeps in flight upstream).

Downstream session resets: when a Fetch response to the client (v7+, where
sessions exist) carries a session error at the top level -- the proxy, acting as
the client's broker, did not find its session (FETCH_SESSION_ID_NOT_FOUND), saw
the wrong epoch (INVALID_FETCH_SESSION_EPOCH) or a topic-id mismatch
(FETCH_SESSION_TOPIC_ID_ERROR) -- the client must start over with a full fetch:
``fetch_session_resets_total{side="downstream"}`` counts it by reason.  Only the
two bytes of the error code are read (after the header and throttle_time_ms).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..protocol import codec
from ..protocol.apis import FETCH, SASL_AUTHENTICATE
from ..protocol.codec import skip_tagged_fields
from ..protocol.errors import ProtocolError
from ..protocol.framing import Frame, Gathered, Payload
from ..relay.relay import UpstreamKind
from ..sessions.resets import RESET_REASONS, Side
from .labels import Direction
from .metrics import Metrics

UNKNOWN_API = -1
FETCH_SESSIONS_SINCE = 7  # KIP-227
FETCH_FLEXIBLE_SINCE = 12  # response header v1 (tagged fields) from here


def fetch_error_code(api_version: int, frame: bytes | bytearray) -> int | None:
    """The top-level error_code of a Fetch response frame (v7+), None if it is too short."""
    pos = 4  # correlation id
    try:
        if api_version >= FETCH_FLEXIBLE_SINCE:
            pos = skip_tagged_fields(frame, pos)  # response header v1
    except ProtocolError:
        return None
    pos += 4  # throttle_time_ms
    if len(frame) < pos + 2:
        return None
    return int.from_bytes(frame[pos : pos + 2], "big", signed=True)


class TrafficMeter:
    """Counts and times one client connection's frames (see the module docstring)."""

    __slots__ = (
        "_broker_durations",
        "_client",
        "_client_durations",
        "_from_broker",
        "_from_broker_bytes",
        "_from_client",
        "_to_broker",
        "_to_broker_bytes",
        "_to_client",
        "_upstream",
        "metrics",
        "node",
    )

    def __init__(self, metrics: Metrics, *, node: int | None = None) -> None:
        self.metrics = metrics
        self.node = node
        self._client: list[tuple[int, int, float]] = []  # (api_key, version, arrival)
        self._upstream: list[tuple[int, float]] = []  # (api_key, sent)
        legs = metrics.legs
        self._from_client = legs[Direction.CLIENT_TO_PROXY]
        self._to_broker = legs[Direction.PROXY_TO_BROKER]
        self._from_broker = legs[Direction.BROKER_TO_PROXY]
        self._to_client = legs[Direction.PROXY_TO_CLIENT]
        self._to_broker_bytes: Any = None  # resolved at first use, as labels() would be
        self._from_broker_bytes: Any = None
        self._client_durations = metrics.client_durations
        self._broker_durations = metrics.broker_durations

    @property
    def awaiting(self) -> tuple[int, int]:
        """(client requests, upstream requests) awaiting their response."""
        return len(self._client), len(self._upstream)

    def client_frame(
        self, header: codec.RequestHeader | None, frame: bytes, now: float, *, expects: bool
    ) -> None:
        """A request frame the relay accepted; ``header`` None: a raw SASL v0 token.

        ``expects``: whether it takes a response, as the relay decided
        (``Relay.last_expects``; a raw token always does).
        """
        if header is None:
            api_key, api_version = SASL_AUTHENTICATE, 0
            expects = True
        else:
            api_key, api_version = header.api_key, header.api_version
        self._from_client(api_key, len(frame))
        if expects:
            self._client.append((api_key, api_version, now))

    def upstream_sent(
        self, frames: list[bytes], now: float, *, kinds: Sequence[UpstreamKind]
    ) -> None:
        """Frames taken from the relay for the broker, in order, about to be written.

        ``kinds``: each frame's (api_key, expects a response) as the relay queued
        it (``Relay.take_upstream_with_kinds``).
        """
        upstream = self._upstream
        for frame, (api_key, expects) in zip(frames, kinds, strict=True):
            size = len(frame)
            self._to_broker(api_key, size)
            if self._to_broker_bytes is None:
                self._to_broker_bytes = self.metrics.node_bytes(
                    self.node, Direction.PROXY_TO_BROKER
                )
            self._to_broker_bytes.inc(size)
            if expects:
                upstream.append((api_key, now))

    def upstream_frame(self, frame: Frame, now: float) -> None:
        """A response frame from the broker (before the relay handles it)."""
        if self._upstream:
            api_key, sent = self._upstream.pop(0)
            self._broker_durations(api_key, max(0.0, now - sent))
        else:  # nothing pending: the relay closes the connection over it
            api_key = UNKNOWN_API
        size = len(frame)
        self._from_broker(api_key, size)
        if self._from_broker_bytes is None:
            self._from_broker_bytes = self.metrics.node_bytes(self.node, Direction.BROKER_TO_PROXY)
        self._from_broker_bytes.inc(size)

    def client_sent(self, frames: Sequence[Payload]) -> list[tuple[int, float]]:
        """Responses taken for the client, in order; returns what ``client_written`` needs."""
        done = []
        for frame in frames:
            api_key, api_version, arrival = (
                self._client.pop(0) if self._client else (UNKNOWN_API, 0, float("nan"))
            )
            self._to_client(api_key, len(frame))
            if api_key == FETCH and api_version >= FETCH_SESSIONS_SINCE:
                head = bytes(frame.head) if isinstance(frame, Gathered) else frame
                reason = RESET_REASONS.get(fetch_error_code(api_version, head) or 0)
                if reason is not None:
                    self.metrics.fetch_session_reset(Side.DOWNSTREAM, reason)
            done.append((api_key, arrival))
        return done

    def client_written(self, done: list[tuple[int, float]], now: float) -> None:
        """The responses ``client_sent`` returned have been written to the client."""
        for api_key, arrival in done:
            if arrival == arrival:  # not NaN
                self._client_durations(api_key, max(0.0, now - arrival))
