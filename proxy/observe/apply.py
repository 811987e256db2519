"""The edge's one consumer of the Fetch path's effects: metrics and decision-log events.

The sans-I/O fetch path (``proxy.fetchpath``) returns what happened as values
(:mod:`proxy.effects`); the trio edge drains a handler's effects after every input
it feeds it (``proxy.server.connection``) and hands them to :func:`apply_effects`,
the only place they become ``Metrics`` calls and ``DecisionLog`` events.  The fetch
path's gauges are read at scrape time instead (:func:`watch_fetch_path`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, assert_never

import structlog

from ..effects import (
    BudgetWait,
    Effect,
    FetchRepeated,
    InFlightWait,
    RanAhead,
    ReplicaFallback,
    SessionReset,
    SessionSaved,
    ShapedReport,
)
from ..shaping.limits import limit_kind

if TYPE_CHECKING:
    from ..fetchpath import FetchPath, FetchPathHandler
    from .decisionlog import DecisionLog
    from .metrics import Metrics

log = structlog.get_logger("proxy.observe")


def watch_fetch_path(metrics: Metrics, path: FetchPath) -> None:
    """The fetch path's gauges, read from its live state at each scrape: the memory budget
    (used, limit), the partitions in flight, the ``cross_zone_price_per_gb`` in force."""
    metrics.read_fetch_gauges(
        memory_budget_used=lambda: path.budget.used,
        memory_budget_limit=lambda: path.config.memory_budget_bytes or 0,  # 0: none
        partitions_in_flight=lambda: path.in_flight.used,
        cross_zone_price=lambda: path.config.cross_zone_price_per_gb,
    )


def drain(
    handler: FetchPathHandler, metrics: Metrics | None, decision_log: DecisionLog | None
) -> None:
    """Take what *handler* did since the last drain and apply it (the edge calls this after
    every input it feeds the handler, which keeps ``handler.effects`` within its bound)."""
    if not handler.effects:  # the usual case: nothing happened worth counting
        return
    effects, dropped = handler.effects.take()
    apply_effects(effects, metrics, decision_log)
    if dropped:
        log.warning("fetch_effects_dropped", count=dropped, limit=handler.effects.limit)


def apply_effects(
    effects: Iterable[Effect], metrics: Metrics | None, decision_log: DecisionLog | None
) -> None:
    """Feed *effects*, oldest first, to *metrics* and *decision_log* (either may be None)."""
    for effect in effects:
        if isinstance(effect, ShapedReport):
            _report(effect, metrics, decision_log)
        elif metrics is None:
            continue
        elif isinstance(effect, SessionSaved):
            metrics.fetch_session_saved(
                request_bytes=effect.request_bytes, response_bytes=effect.response_bytes
            )
        elif isinstance(effect, ReplicaFallback):
            metrics.preferred_replica_fallback(effect.reason, effect.count)
        elif isinstance(effect, SessionReset):
            metrics.fetch_session_reset(effect.side, effect.reason)
        elif isinstance(effect, BudgetWait):
            metrics.memory_budget_wait()
        elif isinstance(effect, InFlightWait):
            metrics.partitions_in_flight_wait()
        elif isinstance(effect, FetchRepeated):
            metrics.fetch_repeated()
        elif isinstance(effect, RanAhead):
            metrics.upstream_fetch_data(effect.node, effect.records, effect.record_bytes)
            metrics.fetch_ran_ahead(effect.held_bytes)
        else:
            assert_never(effect)


def _report(r: ShapedReport, m: Metrics | None, decision_log: DecisionLog | None) -> None:
    d = r.decision
    if m is not None:
        for up in r.upstream:
            m.upstream_fetch_data(up.node, up.records, up.record_bytes)
        # bytes avoided are valued at the price in force when the fetch was served
        m.set_cross_zone_price(r.cross_zone_price_per_gb)
        m.rack_fetch_data(r.rack_usage, client_id=r.client_id)
        if r.redirected_to:
            m.preferred_replica_redirected(r.redirected_to)
        m.delivered_fetch_data(d.delivered_records, d.delivered_bytes, client_id=r.client_id)
        if d.limited_by or d.partitions_trimmed or d.reused_bytes:
            m.shaped_response(r.policy)
        for limit, records, nbytes in d.trimmed_by_limit:
            m.trimmed(limit_kind(limit), records=records, record_bytes=nbytes, policy=r.policy)
        m.buffered_reuse_hits(r.reuse_hits)
        m.starvations(r.starvation_rounds)
    if decision_log is not None:
        decision_log.log(
            d,
            client_id=r.client_id,
            node_id=-1 if r.node_id is None else r.node_id,
            policy=r.policy,
            correlation_id=r.correlation_id,
            latency_ms=r.latency_ms,
            starved_partitions=r.starved_partitions,
            upstream_fetch_bytes=r.upstream_fetch_bytes,
            sessionless_fetch_bytes=r.sessionless_fetch_bytes,
            topic_ids=r.topic_ids,
            rack_usage=r.rack_usage,
            cross_zone_price_per_gb=r.cross_zone_price_per_gb,
            preferred_replica_redirects=len(r.redirected_to),
        )
