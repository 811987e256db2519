"""The JSON behind ``/debug/sessions``: the proxy's fetch sessions, bounded.

The relay keeps, per client connection, an upstream fetch-session client
(``proxy.sessions.client.FetchSessionClient``).  :func:`sessions_snapshot` turns
them into a JSON-ready dict: one entry per session with its connection, client
id, broker node, session id, the epoch its next request will carry and its
partition count (partition names only on request).  At most ``limit`` sessions
are listed (most partitions first) and at most ``partition_limit`` partitions
per session, so a busy proxy answers with a bounded body; ``total`` and the
``truncated`` flags say what was left out.

The endpoint is off by default (it reveals topic names and client ids); the
relay passes ``lambda: sessions_snapshot(...)`` as ``ObserveApp(debug_sessions=...)``
when enabled.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

DEFAULT_LIMIT = 1000
DEFAULT_PARTITION_LIMIT = 100


class _Metadata(Protocol):
    @property
    def session_id(self) -> int: ...
    @property
    def epoch(self) -> int: ...


class SessionView(Protocol):
    """What a session client exposes (read structurally)."""

    @property
    def next_metadata(self) -> _Metadata: ...
    @property
    def session_partitions(self) -> Sequence[Any]: ...


@dataclass(frozen=True, slots=True)
class SessionEntry:
    connection: str
    """The relay's connection id (as in its log lines)."""
    client_id: str | None
    node_id: int
    session: SessionView


def sessions_snapshot(
    entries: Iterable[SessionEntry],
    *,
    limit: int = DEFAULT_LIMIT,
    with_partitions: bool = False,
    partition_limit: int = DEFAULT_PARTITION_LIMIT,
) -> dict[str, Any]:
    rows = []
    for entry in entries:
        metadata = entry.session.next_metadata
        partitions = entry.session.session_partitions
        row: dict[str, Any] = {
            "connection": entry.connection,
            "client_id": entry.client_id,
            "node_id": entry.node_id,
            "session_id": metadata.session_id,
            "epoch": metadata.epoch,
            "partitions": len(partitions),
        }
        if with_partitions:
            row["partition_names"] = sorted(str(p) for p in partitions)[:partition_limit]
            row["partition_names_truncated"] = len(partitions) > partition_limit
        rows.append(row)
    rows.sort(key=lambda r: (-r["partitions"], r["connection"], r["node_id"]))
    return {
        "total": len(rows),
        "truncated": len(rows) > limit,
        "partitions_cached": sum(r["partitions"] for r in rows),
        "sessions": rows[:limit],
    }
