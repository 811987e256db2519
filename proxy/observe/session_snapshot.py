"""The JSON behind ``/debug/sessions``: the proxy's fetch sessions, bounded.

The relay keeps, per client connection, an upstream fetch-session client
(``proxy.sessions.as_client_session.FetchSessionClient``).  :func:`sessions_snapshot` turns
them into a JSON-ready dict: one entry per session with its connection, client
id, broker node, session id, the epoch its next request will carry and its
partition count (partition names only on request).  At most ``limit`` sessions
are listed (most partitions first) and at most ``partition_limit`` partitions
per session, so a busy proxy answers with a bounded body; ``total`` and the
``truncated`` flags say what was left out.  Under ``downstream``, the sessions
clients hold with the proxy (the proxy acting as their broker): session id,
epoch, partition count and whether it is a follower's, bounded the same way.

The endpoint is off by default (it reveals topic names and client ids); the
proxy passes ``Proxy.debug_sessions`` as ``ObserveApp(debug_sessions=...)`` when
the config's ``debug_sessions`` is true.

How the proxy finds sessions: through each live connection's fetch handler, the
relay's ``FetchHandler`` protocol (``proxy.relay.relay``): its ``upstream_session``
(None before its first fetch, and for a handler that holds none, the pass-through
relay's) and its ``session_cache``, the downstream ``FetchSessionCache`` it serves
clients' sessions from (None: none).  :class:`SessionGauges` sets the fetch-session
gauges from the same state when Prometheus scrapes (``Proxy.metrics_refreshers``).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from ..protocol.partition_key import partition_name
from ..relay.relay import FetchHandler, SessionCacheView, SessionView
from ..sessions.resets import Side
from .metrics import Metrics

DEFAULT_LIMIT = 1000
DEFAULT_PARTITION_LIMIT = 100


class DownstreamSessionView(Protocol):
    """One session a client holds with the proxy (``as_broker_cache.FetchSession``)."""

    @property
    def id(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def privileged(self) -> bool: ...


class DownstreamSessionsView(Protocol):
    """A downstream session cache, listed (``FetchSessionCache.sessions``)."""

    def sessions(self) -> Iterable[DownstreamSessionView]: ...


if TYPE_CHECKING:
    from ..sessions.as_broker_cache import FetchSessionCache

    def _caches_are_listed(cache: FetchSessionCache) -> DownstreamSessionsView:
        return cache  # mypy: a FetchSessionCache is listed as a DownstreamSessionsView


@dataclass(frozen=True, slots=True)
class SessionEntry:
    connection: str
    """The relay's connection id (as in its log lines)."""
    client_id: str | None
    node_id: int | None
    """The broker listener's node id (None: the bootstrap listener)."""
    session: SessionView


def sessions_snapshot(
    entries: Iterable[SessionEntry],
    *,
    limit: int = DEFAULT_LIMIT,
    with_partitions: bool = False,
    partition_limit: int = DEFAULT_PARTITION_LIMIT,
    downstream: Iterable[DownstreamSessionsView] | None = None,
) -> dict[str, Any]:
    """Upstream sessions from ``entries``; ``downstream``: the client-side session caches."""
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
            row["partition_names"] = sorted(partition_name(p) for p in partitions)[:partition_limit]
            row["partition_names_truncated"] = len(partitions) > partition_limit
        rows.append(row)
    rows.sort(key=lambda r: (-r["partitions"], r["connection"]))
    snapshot = {
        "total": len(rows),
        "truncated": len(rows) > limit,
        "partitions_cached": sum(r["partitions"] for r in rows),
        "sessions": rows[:limit],
    }
    if downstream is not None:
        snapshot["downstream"] = downstream_snapshot(downstream, limit=limit)
    return snapshot


def downstream_snapshot(
    caches: Iterable[DownstreamSessionsView], *, limit: int = DEFAULT_LIMIT
) -> dict[str, Any]:
    """The sessions in downstream caches (``FetchSessionCache``: ``sessions()`` with id,
    epoch, size, privileged), most partitions first, at most ``limit``."""
    rows = [
        {
            "session_id": int(session.id),
            "epoch": int(session.epoch),
            "partitions": int(session.size),
            "privileged": bool(session.privileged),
        }
        for cache in caches
        for session in cache.sessions()
    ]
    rows.sort(key=lambda r: (-r["partitions"], r["session_id"]))
    return {
        "total": len(rows),
        "truncated": len(rows) > limit,
        "partitions_cached": sum(r["partitions"] for r in rows),
        "sessions": rows[:limit],
    }


class SessionGauges:
    """Sets the fetch-session gauges from live state, at scrape time.

    Upstream: the sessions the proxy holds with brokers (one per connection that
    fetches through a session; session id 0 means none is open).  Downstream: the
    caches of the sessions clients hold with the proxy, reached through the live
    connections' handlers (or given), each counted once however many connections
    share it; their eviction counters feed
    ``fetch_session_evictions_total{side="downstream"}``.
    """

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._evictions_seen: weakref.WeakKeyDictionary[SessionCacheView, int] = (
            weakref.WeakKeyDictionary()
        )

    def refresh(
        self, handlers: Iterable[FetchHandler], caches: Iterable[SessionCacheView] = ()
    ) -> None:
        active = partitions = 0
        found: dict[int, SessionCacheView] = {id(cache): cache for cache in caches}
        for handler in handlers:
            session = handler.upstream_session
            if session is not None and session.next_metadata.session_id != 0:
                active += 1
                partitions += len(session.session_partitions)
            cache = handler.session_cache
            if cache is not None:
                found[id(cache)] = cache
        self.metrics.set_fetch_sessions(Side.UPSTREAM, active=active, partitions=partitions)
        self.metrics.set_fetch_sessions(
            Side.DOWNSTREAM,
            active=sum(int(c.num_sessions) for c in found.values()),
            partitions=sum(int(c.num_partitions) for c in found.values()),
        )
        for cache in found.values():
            try:
                seen = self._evictions_seen.get(cache, 0)
                self._evictions_seen[cache] = int(cache.evictions)
            except TypeError:  # not weak-referenceable: count nothing rather than twice
                continue
            self.metrics.fetch_session_evicted(Side.DOWNSTREAM, int(cache.evictions) - seen)
