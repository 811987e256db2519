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
and its Metadata for topic ids.  ``SaslExchange`` tells the relay when such
requests must wait: from the client's SaslHandshake (v1+; v0's raw token
exchange only happens before the first request and cannot re-authenticate)
until the exchange is over, which is the first of

- a SaslHandshake or SaslAuthenticate response with an error (the broker
  closes the connection after it anyway);
- a SaslAuthenticate response with a session lifetime (KIP-368, v1+): the
  broker sends one only with the exchange's final response, and always when
  re-authentication is on, which is the only time a connection re-authenticates;
- the mechanism's known number of SaslAuthenticate round trips (PLAIN and
  OAUTHBEARER one, SCRAM two), for brokers that grant no session lifetime;
- a client request that is neither SaslHandshake nor SaslAuthenticate (the
  client has finished: a mechanism of unknown length, such as GSSAPI, on a
  broker without re-authentication).

Sans-I/O and small: the relay keeps the held requests and sends them, in the
order they were made, when ``answered`` or ``client_request`` says the exchange
is over.
"""

from __future__ import annotations

import struct

from ..protocol import codec
from ..protocol.apis import SASL_AUTHENTICATE, SASL_HANDSHAKE
from ..protocol.errors import DecodeError, ProtocolError

_I16 = struct.Struct(">h")

ROUND_TRIPS = {"PLAIN": 1, "OAUTHBEARER": 1, "SCRAM-SHA-256": 2, "SCRAM-SHA-512": 2}
"""SaslAuthenticate round trips of a successful exchange, by mechanism."""


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
