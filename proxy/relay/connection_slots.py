"""``max_connections``: who is let in at the limit, and who gives way.

A connection holds a slot from its accept to its end.  At the limit a newcomer
is refused, as before, unless some connection has not yet sent a whole request:
then the one of those that has waited longest gives its slot to the newcomer
(the edge closes it, with its own log line and counter).  Such a connection
has cost nothing upstream (its broker connection opens at its first relayed
request) and, past the first few milliseconds, is a socket leaked or held by
something that is not a Kafka client: Kafka's clients send ApiVersions as soon
as they connect.  So a leak of silent sockets faster than
``max_connections`` / ``first_request_timeout_seconds`` can no longer lock the
application's own new connections out: each newcomer displaces the oldest
silent socket, and a real client is the youngest silent one only until its
first request arrives.  When every connection has spoken, the newcomer is
refused.

Kafka's broker does the same at its broker-wide ``max.connections`` for its
inter-broker listener (KIP-402): it accepts, then closes its lowest-priority
channel, the least recently active one; on other listeners its acceptor stops
accepting until a slot frees (new connections wait in the listen backlog).
The proxy refuses instead (issue 19: the refusal stays, with its log line and
metric), and chooses among the silent only, oldest first, so that no client
that has spoken, however idle, is ever closed to make room.

Plain bookkeeping, no I/O: *handles* are whatever the edge uses to close a
connection (hashable by identity).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

H = TypeVar("H", bound=Hashable)


class ConnectionSlots(Generic[H]):
    """The open connections counted against ``max_connections``, the silent ones in order."""

    def __init__(self) -> None:
        self._open: dict[H, None] = {}
        self._silent: dict[H, None] = {}
        """Connections without a whole request yet, oldest accept first."""
        self.displaced = 0
        """Connections that gave their slot to a newcomer, since start."""

    def __len__(self) -> int:
        return len(self._open)

    @property
    def silent(self) -> int:
        return len(self._silent)

    def admit(self, handle: H, limit: int) -> tuple[bool, H | None]:
        """A new connection *handle* at a limit of *limit* slots: whether it is let in,
        and the silent connection that gave its slot to it (the caller closes that one).

        Not let in when every slot is held by a connection that has spoken.
        """
        displaced: H | None = None
        if len(self._open) >= limit:
            if not self._silent:
                return False, None
            displaced = next(iter(self._silent))
            del self._silent[displaced]
            del self._open[displaced]  # its end (``leave``) no longer counts
            self.displaced += 1
        self._open[handle] = None
        self._silent[handle] = None
        return True, displaced

    def spoke(self, handle: H) -> None:
        """The connection's first whole request arrived: it keeps its slot."""
        self._silent.pop(handle, None)

    def leave(self, handle: H) -> None:
        """The connection ended (a displaced one's slot is already given away)."""
        self._open.pop(handle, None)
        self._silent.pop(handle, None)
