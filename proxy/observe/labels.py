"""Label values for metrics, each drawn from a small set that is fixed or capped by construction.

Prometheus keeps one time series per distinct label set, so a label that takes its
values from input (a node id, a policy name from a reloaded config, a client id)
would grow without bound.  Everything here maps an arbitrary input onto a bounded
set: fixed tables with an ``"other"``/``"unknown"`` fallback, and
:class:`BoundedLabel`, which admits the first ``cap`` distinct values it sees and
folds every later one into an overflow value.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from types import MappingProxyType

OTHER = "other"
UNKNOWN = "unknown"

# Kafka API keys and their names in snake_case (the names of the message
# definitions in Apache Kafka's clients/src/main/resources/common/message/).
# Keys 4-7 are inter-broker APIs that kio does not ship; a client never sends
# them, but a table of names is cheaper than an "unknown" surprise.
API_NAMES: Mapping[int, str] = MappingProxyType(
    {
        0: "produce",
        1: "fetch",
        2: "list_offsets",
        3: "metadata",
        4: "leader_and_isr",
        5: "stop_replica",
        6: "update_metadata",
        7: "controlled_shutdown",
        8: "offset_commit",
        9: "offset_fetch",
        10: "find_coordinator",
        11: "join_group",
        12: "heartbeat",
        13: "leave_group",
        14: "sync_group",
        15: "describe_groups",
        16: "list_groups",
        17: "sasl_handshake",
        18: "api_versions",
        19: "create_topics",
        20: "delete_topics",
        21: "delete_records",
        22: "init_producer_id",
        23: "offset_for_leader_epoch",
        24: "add_partitions_to_txn",
        25: "add_offsets_to_txn",
        26: "end_txn",
        27: "write_txn_markers",
        28: "txn_offset_commit",
        29: "describe_acls",
        30: "create_acls",
        31: "delete_acls",
        32: "describe_configs",
        33: "alter_configs",
        34: "alter_replica_log_dirs",
        35: "describe_log_dirs",
        36: "sasl_authenticate",
        37: "create_partitions",
        38: "create_delegation_token",
        39: "renew_delegation_token",
        40: "expire_delegation_token",
        41: "describe_delegation_token",
        42: "delete_groups",
        43: "elect_leaders",
        44: "incremental_alter_configs",
        45: "alter_partition_reassignments",
        46: "list_partition_reassignments",
        47: "offset_delete",
        48: "describe_client_quotas",
        49: "alter_client_quotas",
        50: "describe_user_scram_credentials",
        51: "alter_user_scram_credentials",
        52: "vote",
        53: "begin_quorum_epoch",
        54: "end_quorum_epoch",
        55: "describe_quorum",
        56: "alter_partition",
        57: "update_features",
        58: "envelope",
        59: "fetch_snapshot",
        60: "describe_cluster",
        61: "describe_producers",
        62: "broker_registration",
        63: "broker_heartbeat",
        64: "unregister_broker",
        65: "describe_transactions",
        66: "list_transactions",
        67: "allocate_producer_ids",
        68: "consumer_group_heartbeat",
        69: "consumer_group_describe",
        70: "controller_registration",
        71: "get_telemetry_subscriptions",
        72: "push_telemetry",
        73: "assign_replicas_to_dirs",
        74: "list_config_resources",
        75: "describe_topic_partitions",
        76: "share_group_heartbeat",
        77: "share_group_describe",
        78: "share_fetch",
        79: "share_acknowledge",
        80: "add_raft_voter",
        81: "remove_raft_voter",
        82: "update_raft_voter",
        83: "initialize_share_group_state",
        84: "read_share_group_state",
        85: "write_share_group_state",
        86: "delete_share_group_state",
        87: "read_share_group_state_summary",
        88: "streams_group_heartbeat",
        89: "streams_group_describe",
        90: "describe_share_group_offsets",
        91: "alter_share_group_offsets",
        92: "delete_share_group_offsets",
    }
)


def api_name(api_key: int) -> str:
    """The API's name, or ``"unknown"`` for a key outside the table."""
    return API_NAMES.get(api_key, UNKNOWN)


class Direction(StrEnum):
    """Which leg of the relay a message travels on."""

    CLIENT_TO_PROXY = "client_to_proxy"
    PROXY_TO_BROKER = "proxy_to_broker"
    BROKER_TO_PROXY = "broker_to_proxy"
    PROXY_TO_CLIENT = "proxy_to_client"


REQUEST_DIRECTIONS = (Direction.CLIENT_TO_PROXY, Direction.PROXY_TO_BROKER)
RESPONSE_DIRECTIONS = (Direction.BROKER_TO_PROXY, Direction.PROXY_TO_CLIENT)


class CloseCause(StrEnum):
    """Why a connection (client or broker side) ended."""

    PEER_CLOSED = "peer_closed"  # the other end closed cleanly
    UPSTREAM_CLOSED = "upstream_closed"  # client connection closed because its broker link dropped
    PROTOCOL_ERROR = "protocol_error"  # malformed frame or header
    FRAME_TOO_LARGE = "frame_too_large"
    IO_ERROR = "io_error"  # reset, broken pipe, TLS failure
    IDLE_TIMEOUT = "idle_timeout"
    SHUTDOWN = "shutdown"  # the proxy is stopping
    OTHER = OTHER


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
    OTHER = OTHER


class LimitKind(StrEnum):
    """The shaping limits (issue 5); the values are the config keys."""

    MAX_RESPONSE_BYTES = "max_response_bytes"
    MAX_PARTITION_BYTES = "max_partition_bytes"
    MAX_RECORDS = "max_records"
    MAX_PARTITION_RECORDS = "max_partition_records"
    MEMORY_BUDGET = "memory_budget"
    OTHER = OTHER


class DecisionOutcome(StrEnum):
    WRITTEN = "written"
    SAMPLED_OUT = "sampled_out"
    DROPPED = "dropped"  # the sink failed


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
