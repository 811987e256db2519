"""KIP-227's vocabulary, which both halves of the sessions package speak.

``as_broker_cache`` and ``as_broker`` (the proxy as the broker toward its clients) and
``as_client_session`` and ``as_client`` (the proxy as a session client toward its
broker) read and write the same fields of a Fetch: its version, its
session id and epoch, its replica id.  Their values and rules are here, once, as
Kafka spells them (``FetchMetadata``: ``INVALID_SESSION_ID``, ``INITIAL_EPOCH``,
``FINAL_EPOCH``, ``nextEpoch``, ``isFull``).
"""

from __future__ import annotations

from typing import Any

INVALID_SESSION_ID = 0
"""No session (a sessionless fetch, or one asking for a new session)."""
INITIAL_EPOCH = 0
"""The epoch of the full fetch that opens a session."""
FINAL_EPOCH = -1
"""The epoch of a full fetch that closes a session, or of a sessionless one."""
MAX_EPOCH = 2**31 - 1
"""The last epoch before the count wraps to 1."""

MIN_CLIENT_VERSION = 4
"""The oldest Fetch version the fetch path serves (older ones pass through)."""
MIN_SESSION_VERSION = 7
"""Fetch v7 introduced session ids and epochs (KIP-227)."""
LAST_TOPIC_NAME_VERSION = 12
"""The last Fetch version that names topics."""
FIRST_TOPIC_ID_VERSION = 13
"""Fetch v13 names topics by id (KIP-516)."""
MAX_VERSION = 18
"""The newest Fetch version the proxy speaks."""


def next_epoch(epoch: int) -> int:
    """The epoch after *epoch*: FINAL stays FINAL, 2**31 - 1 wraps to 1 (never 0)."""
    if epoch < 0:
        return FINAL_EPOCH
    if epoch == MAX_EPOCH:
        return 1
    return epoch + 1


def is_full(epoch: int) -> bool:
    """A request with epoch 0 or -1 is a full fetch request."""
    return epoch in (INITIAL_EPOCH, FINAL_EPOCH)


def replica_id(request: Any) -> int:
    """The replica id of a Fetch request (-1: a consumer; >= 0: a follower broker)."""
    state = getattr(request, "replica_state", None)
    if state is not None:
        return int(state.replica_id)
    return int(getattr(request, "replica_id", -1))
