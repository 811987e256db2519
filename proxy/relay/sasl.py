"""SASL (re-)authentication on a relayed connection: when the proxy must hold its own requests.

Kafka brokers authenticate a connection with SaslHandshake then one or more
SaslAuthenticate round trips; with ``connections.max.reauth.ms`` (KIP-368) the
client does it again, on the same connection, before its session expires.  From
the broker's SaslHandshake until its final SaslAuthenticate response the
connection belongs to the authenticator: any other request there is answered by
closing the connection (Kafka's SaslServerAuthenticator refuses "an unexpected
Kafka request" during authentication).

The client itself never sends anything else in that window, but the proxy sends
requests of its own on the client's connection: the Fetch path's reshaped
fetches (a held-back fetch starting, a resend after an upstream session reset)
and its Metadata for topic ids.  Two rules keep them out of it:

1. The client's SaslHandshake (v1+; v0's raw token exchange only happens before
   the first request and cannot re-authenticate) goes upstream only once every
   earlier request of the client has been answered (``waits_for_earlier``).  A
   client may start re-authenticating with a fetch in flight (Kafka's Java
   client keeps the answers that arrive meanwhile), and that fetch may still be
   waiting in the proxy (for memory budget, or behind the connection's previous
   fetch).  Holding the fetch instead would deadlock: its answer comes before
   the SaslHandshake's, which the client waits for before its SaslAuthenticate.
   The broker, too, reads a connection's next request only once it has answered
   the previous one.
2. While the exchange is in progress, requests the Fetch path sends wait in the
   relay.  ``SaslExchange`` says when: from the SaslHandshake until the exchange
   is over, which is the first of

   - a SaslHandshake or SaslAuthenticate response with an error (the broker
     closes the connection after it anyway);
   - a SaslAuthenticate response with a session lifetime (KIP-368, v1+): the
     broker sends one only with the exchange's final response, and always when
     re-authentication is on, the only time a connection re-authenticates;
   - the mechanism's known number of SaslAuthenticate round trips (PLAIN and
     OAUTHBEARER one, SCRAM two), for brokers that grant no session lifetime;
   - a client request that is neither SaslHandshake nor SaslAuthenticate (the
     client has finished: a mechanism of unknown length, such as GSSAPI, on a
     broker without re-authentication).

Session expiry: the broker closes a connection at its first request after the
session ended, a re-authentication's SaslHandshake included, so clients start
ahead of time (librdkafka at 90 % of the lifetime, the Java client at 85-95 %).
Whatever delays the handshake eats into that margin: the client's fetch in flight
(its long poll), directly as through the proxy, and through the proxy also that
fetch's wait for memory budget.

Sans-I/O and small: the relay keeps the deferred frames and the held requests
and sends them, in order, when this module's answers say so.
"""

from __future__ import annotations

import struct

from ..protocol import codec
from ..protocol.apis import SASL_AUTHENTICATE, SASL_HANDSHAKE
from ..protocol.errors import DecodeError, ProtocolError

_I16 = struct.Struct(">h")

ROUND_TRIPS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
"""SaslAuthenticate round trips of a successful exchange, by mechanism."""


def waits_for_earlier(frame: bytes) -> bool:
    """Whether a client request frame is a SaslHandshake v1+ (see the module docstring)."""
    return (
        len(frame) >= 4
        and int.from_bytes(frame[0:2], "big", signed=True) == SASL_HANDSHAKE
        and int.from_bytes(frame[2:4], "big", signed=True) >= 1
    )


def handshake_mechanism(header: codec.RequestHeader, frame: bytes) -> str | None:
    """The mechanism a SaslHandshake request names (None for any other request)."""
    if header.api_key != SASL_HANDSHAKE or header.body_offset is None:
        return None
    pos = header.body_offset
    if len(frame) < pos + 2:
        raise ProtocolError("truncated SaslHandshake request")
    (n,) = _I16.unpack_from(frame, pos)
    return frame[pos + 2 : pos + 2 + max(n, 0)].decode("utf-8", errors="replace")


class SaslExchange:
    """One connection's SASL exchange as the relay sees it (see the module docstring)."""

    __slots__ = ("_left", "active", "authentications", "handshakes")

    def __init__(self) -> None:
        self.active = False
        """An exchange is in progress: the proxy's own requests wait."""
        self.handshakes = 0
        """SaslHandshake v1+ requests the client sent (every one after the first is a
        re-authentication)."""
        self.authentications = 0
        """Exchanges that ended without an error."""
        self._left: int | None = None
        """SaslAuthenticate round trips still expected (None: unknown)."""

    def begin(self, mechanism: str) -> None:
        """The client sent SaslHandshake (v1+) for *mechanism*."""
        self.active = True
        self.handshakes += 1
        self._left = ROUND_TRIPS.get(mechanism.upper())

    def answered(self, api_key: int, api_version: int, frame: bytes) -> bool:
        """A SaslHandshake or SaslAuthenticate response from the broker; True: the exchange
        is over (the held requests may go)."""
        if not self.active:
            return False
        if api_key == SASL_HANDSHAKE:
            if frame[4:6] != b"\x00\x00":  # error_code (the v0/v1 header has no tags)
                return self._end(ok=False)
            return False
        if api_key != SASL_AUTHENTICATE:
            return False
        try:
            _, body = codec.decode_response(api_key, api_version, frame)
        except DecodeError as exc:
            raise ProtocolError(f"malformed SaslAuthenticate response: {exc}") from exc
        if int(body.error_code) != 0:
            return self._end(ok=False)
        lifetime = getattr(body, "session_lifetime", None)
        if lifetime is not None and lifetime.total_seconds() > 0:
            return self._end(ok=True)
        if self._left is not None:
            self._left -= 1
            if self._left <= 0:
                return self._end(ok=True)
        return False

    def client_request(self, api_key: int) -> bool:
        """A request from the client; True: it ends an exchange in progress."""
        if self.active and api_key not in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            return self._end(ok=True)
        return False

    def _end(self, *, ok: bool) -> bool:
        self.active = False
        self._left = None
        if ok:
            self.authentications += 1
        return True
