"""What handling one request produces; see :mod:`devbroker.node`.

Sans-I/O: no trio here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


class Pending(Protocol):
    def poll(self, now: float) -> bool:
        """Re-examine state; True when the response is ready to be completed."""

    def wake_at(self) -> float | None:
        """Monotonic time by which poll must be called again even if nothing changed."""

    def complete(self) -> Any:
        """The response object (call once, after poll returned True)."""


@dataclass(frozen=True, slots=True)
class Reply:
    response: Any
    correlation_id: int


@dataclass(frozen=True, slots=True)
class NoReply:
    pass


@dataclass(frozen=True, slots=True)
class Close:
    reason: str
    """What was wrong (for the log line; never payload)."""
    kind: str = "protocol_error"
    """The log's ``reason`` key: protocol_error, unsupported_request or produce_failed_acks_0."""


@dataclass(frozen=True, slots=True)
class Wait:
    pending: Pending
    correlation_id: int


Outcome = Reply | NoReply | Close | Wait


__all__ = ["Close", "NoReply", "Outcome", "Pending", "Reply", "Wait"]
