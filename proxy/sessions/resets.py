"""Which side a fetch session is on, and why one ended: the values session metrics count by.

The proxy holds fetch sessions on two sides: with the brokers, as their client
(``Side.UPSTREAM``, :mod:`.as_client` and :mod:`.as_client_session`), and with clients, as their broker
(``Side.DOWNSTREAM``, :mod:`.as_broker`).  Both are small fixed sets, so
:mod:`proxy.observe` uses them as Prometheus label values as they are.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

from ..protocol.error_codes import (
    FETCH_SESSION_ID_NOT_FOUND,
    FETCH_SESSION_TOPIC_ID_ERROR,
    INVALID_FETCH_SESSION_EPOCH,
)


class Side(StrEnum):
    """Which fetch-session cache: the proxy's sessions with brokers, or clients' sessions with it."""

    UPSTREAM = "upstream"
    DOWNSTREAM = "downstream"


class ResetReason(StrEnum):
    """Why a fetch session was dropped and a full fetch followed.

    The first three mirror the broker errors that end a session in Apache Kafka's
    FetchSessionHandler (FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH,
    FETCH_SESSION_TOPIC_ID_ERROR); the rest are the proxy's own causes.
    """

    SESSION_ID_NOT_FOUND = "session_id_not_found"
    INVALID_EPOCH = "invalid_epoch"
    TOPIC_ID_ERROR = "topic_id_error"
    UPSTREAM_RECONNECT = "upstream_reconnect"
    LEADERSHIP_CHANGE = "leadership_change"
    CLIENT_FULL_FETCH = "client_full_fetch"
    CLOSED = "closed"
    OTHER = "other"


RESET_REASONS: Mapping[int, ResetReason] = MappingProxyType(
    {
        FETCH_SESSION_ID_NOT_FOUND: ResetReason.SESSION_ID_NOT_FOUND,
        INVALID_FETCH_SESSION_EPOCH: ResetReason.INVALID_EPOCH,
        FETCH_SESSION_TOPIC_ID_ERROR: ResetReason.TOPIC_ID_ERROR,
    }
)
"""The reset reason of each top-level Fetch error that ends a session (``FETCH_SESSION_ERRORS``)."""
