"""Structured JSON logs (structlog) with a fixed, documented set of keys.

One JSON object per line on stderr.  Only the keys below ever appear; any
other key given to a logger is dropped by ``_only_documented_keys``, so a
careless call cannot leak a payload or a whole protocol message into the logs.

=================  ==========================================================
key                meaning
=================  ==========================================================
timestamp          ISO 8601 UTC
level              debug, info, warning, error
event              what happened (snake_case, fixed strings)
conn_id            the proxy's id of a client connection (``c<N>``)
client_addr        the client's HOST:PORT
client_id          the client_id of the client's latest request header
listener           ``bootstrap`` or ``broker``
node_id            broker node id the listener / upstream connection stands for
upstream           upstream HOST:PORT
api_key            API key of the request concerned
api_version        its version
correlation_id     the client's correlation id
address            a bound listener address HOST:PORT
error              error text (exception class and message; never payload)
reason             why a connection closed (client_closed, upstream_closed, protocol_error, ...)
attempt            retry attempt number
backoff_seconds    delay before the next retry
in_flight          requests awaiting a response on the connection
count              a count relevant to the event (e.g. brokers discovered)
config_keys        config keys a reload applied (list)
restart_keys       config keys a reload changed that need a restart (list)
limit_bytes        the configured memory budget (memory_budget_summary)
peak_bytes         most bytes reserved against the budget at once (only with a budget)
overshoot_bytes    most the budget was exceeded by data already in memory
setting            the config key a problem is about (e.g. listen_failed: listen)
hint               what the event means for clients and what to do (no payload)
rack               the proxy's rack (rack_configured, rack_brokers; null: none)
node_ids           broker node ids (rack_brokers: those in the proxy's rack)
broker_racks       each broker's broker.rack by node id, from Metadata (null: none)
timeout_seconds    the limit that expired (first_request_timeout, decision_log_close_timeout)
written            decision-log events the sink took over the run (decision_log_closed)
dropped            decision-log events lost over the run: queue full, failing or stuck sink
limit              the limit reached (connection_refused, connection_closed displaced:
                   max_connections)
waited_seconds     how long a connection had been open without a whole request when it
                   gave its slot to a newcomer (connection_closed, reason displaced)
=================  ==========================================================

Per-connection keys are bound with ``structlog.contextvars.bind_contextvars``
at the start of a connection's task, so every line of that task carries them.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

DOCUMENTED_KEYS = frozenset(
    {
        "timestamp",
        "level",
        "event",
        "conn_id",
        "client_addr",
        "client_id",
        "listener",
        "node_id",
        "upstream",
        "api_key",
        "api_version",
        "correlation_id",
        "address",
        "error",
        "reason",
        "attempt",
        "backoff_seconds",
        "in_flight",
        "count",
        "config_keys",
        "restart_keys",
        "limit_bytes",
        "peak_bytes",
        "overshoot_bytes",
        "setting",
        "hint",
        "rack",
        "node_ids",
        "broker_racks",
        "timeout_seconds",
        "written",
        "dropped",
        "limit",
        "waited_seconds",
    }
)

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


def _only_documented_keys(
    logger: Any, method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key in [k for k in event_dict if k not in DOCUMENTED_KEYS]:
        del event_dict[key]
    return event_dict


def configure(level: str = "info", stream: TextIO | None = None) -> None:
    """Send JSON log lines at ``level`` and above to ``stream`` (default stderr)."""
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True, key="timestamp"),
            _only_documented_keys,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.WriteLoggerFactory(stream or sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger() -> Any:
    return structlog.get_logger()
