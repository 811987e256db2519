"""Label values for metrics, each drawn from a small set that is fixed or capped by construction.

Prometheus keeps one time series per distinct label set, so a label that takes its
values from input (a node id, a policy name from a reloaded config, a client id)
would grow without bound.  Everything here maps an arbitrary input onto a bounded
set: fixed tables with an ``"other"``/``"unknown"`` fallback, and
:class:`BoundedLabel`, which admits the first ``cap`` distinct values it sees and
folds every later one into an overflow value.  The fixed sets the core defines
itself (API names in :mod:`proxy.protocol.apis`, ``Side`` and ``ResetReason`` in
:mod:`proxy.sessions.resets`, ``LimitKind`` in :mod:`proxy.shaping.limits`) are
label values as they are.
"""

from __future__ import annotations

from enum import StrEnum

from ..protocol.apis import API_NAMES

OTHER = "other"
UNKNOWN = "unknown"


def api_name(api_key: int) -> str:
    """The API's name, or ``"unknown"`` for a key outside the table."""
    return API_NAMES.get(api_key, UNKNOWN)


class Direction(StrEnum):
    """Which leg of the relay a message travels on."""

    CLIENT_TO_PROXY = "client_to_proxy"
    PROXY_TO_BROKER = "proxy_to_broker"
    BROKER_TO_PROXY = "broker_to_proxy"
    PROXY_TO_CLIENT = "proxy_to_client"


class CloseCause(StrEnum):
    """Why a connection (client or broker side) ended."""

    PEER_CLOSED = "peer_closed"  # the other end closed cleanly
    UPSTREAM_CLOSED = "upstream_closed"  # client connection closed because its broker link dropped
    PROTOCOL_ERROR = "protocol_error"  # malformed frame or header
    FRAME_TOO_LARGE = "frame_too_large"
    FRAME_TIMEOUT = "frame_timeout"  # a request frame not complete in request_frame_timeout_seconds
    IO_ERROR = "io_error"  # reset, broken pipe, TLS failure
    CLIENT_WRITE_TIMEOUT = "client_write_timeout"  # a write to the client not done in time
    IDLE_TIMEOUT = "idle_timeout"
    FIRST_REQUEST_TIMEOUT = "first_request_timeout"  # no whole request soon after the accept
    DISPLACED = "displaced"  # no whole request yet: its slot given to a newcomer at max_connections
    SHUTDOWN = "shutdown"  # the proxy is stopping
    OTHER = OTHER


class DecisionOutcome(StrEnum):
    WRITTEN = "written"
    SAMPLED_OUT = "sampled_out"
    DROPPED = "dropped"  # the sink failed
    QUEUE_FULL = "queue_full"  # the writer thread was behind: dropped, never waited for


def enum_label(enum: type[StrEnum], value: str, fallback: StrEnum) -> str:
    """``value`` if it is one of ``enum``'s values, else ``fallback``."""
    try:
        return enum(value).value
    except ValueError:
        return fallback.value


class BoundedLabel:
    """Admits the first ``cap`` distinct values; every later one becomes ``overflow``.

    Admitted values stay admitted for the life of the object (of the process), so
    a series never changes its label half-way.  ``cap=0`` admits nothing.
    """

    __slots__ = ("_admitted", "cap", "max_length", "overflow")

    def __init__(self, cap: int, *, overflow: str = OTHER, max_length: int = 64) -> None:
        if cap < 0:
            raise ValueError("cap must be >= 0")
        self.cap = cap
        self.overflow = overflow
        self.max_length = max_length
        self._admitted: set[str] = set()

    def __call__(self, value: str) -> str:
        if value in self._admitted:
            return value
        if len(value) > self.max_length or len(self._admitted) >= self.cap:
            return self.overflow
        self._admitted.add(value)
        return value

    @property
    def admitted(self) -> frozenset[str]:
        return frozenset(self._admitted)
