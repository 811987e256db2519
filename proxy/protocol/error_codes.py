"""Kafka error codes the fetch path reads or answers with, by their names in Kafka's ``Errors.java``.

Plain ints, for comparing the ``error_code`` of decoded messages; code that
builds kio messages passes them through kio's ``ErrorCode`` (the complete
table, which a unit test checks these against).
"""

from __future__ import annotations

UNKNOWN_SERVER_ERROR = -1
NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
NOT_LEADER_OR_FOLLOWER = 6
TOPIC_AUTHORIZATION_FAILED = 29
FETCH_SESSION_ID_NOT_FOUND = 70
INVALID_FETCH_SESSION_EPOCH = 71
FENCED_LEADER_EPOCH = 74
UNKNOWN_LEADER_EPOCH = 75
UNKNOWN_TOPIC_ID = 100
INCONSISTENT_TOPIC_ID = 103
FETCH_SESSION_TOPIC_ID_ERROR = 106

FETCH_SESSION_ERRORS = frozenset(
    {FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH, FETCH_SESSION_TOPIC_ID_ERROR}
)
"""The top-level Fetch errors that end a fetch session (KIP-227): a full fetch follows."""
