"""The fetch path returns what happened as values (``proxy.effects``), with no Metrics or
decision log anywhere: one case of each kind, read from the handler's ``effects``.

The harness is test_fetchpath's (``support.fetch_world``); with neither metrics nor a
decision log in the world, nothing drains the effects, so the test reads them itself.
"""

from __future__ import annotations

from support.fetch_world import ALL, Conn, World

from proxy.config import FetchPathConfig
from proxy.effects import (
    BudgetWait,
    Effect,
    Effects,
    InFlightWait,
    ReplicaFallback,
    SessionReset,
    SessionSaved,
    ShapedReport,
)
from proxy.relay.racks import FallbackReason
from proxy.sessions.resets import ResetReason, Side
from proxy.shaping.in_flight import SMALL_FETCH_PARTITIONS
from proxy.shaping.limits import Limits


def taken(c: Conn) -> list[Effect]:
    effects, dropped = c.handler.effects.take()
    assert dropped == 0
    return effects


def test_a_shaped_response_is_reported_with_its_saving_and_a_reset_as_values() -> None:
    w = World(FetchPathConfig(limits=Limits(max_records=2)))
    c = Conn(w, "rdkafka", node_id=1)
    w.append("orders", 0, 1, times=3)
    c.fetch(7, [("orders", 0, 0)])
    report, saved = taken(c)
    assert isinstance(report, ShapedReport)
    assert (report.client_id, report.node_id, report.correlation_id) == ("rdkafka", 1, 7)
    assert report.policy == "default" and report.decision.delivered_records == 2
    assert report.upstream[0].node == 1 and report.upstream[0].records == 3
    assert report.sessionless_fetch_bytes is not None and report.latency_ms >= 0
    assert isinstance(saved, SessionSaved) and saved.request_bytes >= 0
    for cid in (8, 9):
        c.fetch(cid, [("orders", 0, 2)])  # an incremental session upstream
    taken(c)
    w.upstream_sessions.clear()  # evicted: the next fetch gets FETCH_SESSION_ID_NOT_FOUND
    c.fetch(10, [("orders", 0, 3)])
    assert SessionReset(Side.UPSTREAM, ResetReason.SESSION_ID_NOT_FOUND) in taken(c)


def test_waits_and_fallbacks_are_values() -> None:
    # a Fetch version without a rack: one fallback for the connection
    w = World(FetchPathConfig(rack="b"))
    old = Conn(w, "kafka-go", node_id=1)
    w.append("orders", 0, 1)
    old.fetch(1, [("orders", 0, 0)], version=10)
    assert ReplicaFallback(FallbackReason.OLD_FETCH_VERSION) in taken(old)

    # a response that must wait for memory budget
    w = World(FetchPathConfig(memory_budget_bytes=1 << 20))
    budget = w.path.budget
    budget.floor = 1 << 20
    a = Conn(w).with_edge()
    a.send(a.fetch_frame(2, ALL), answer=False)
    hog = budget.try_reserve(budget.capacity)
    assert hog is not None
    w.append("orders", 0, 3)
    assert a.release_held() == []
    assert taken(a) == [BudgetWait()]
    hog.release()

    # a large fetch that must wait for max_partitions_in_flight
    n = SMALL_FETCH_PARTITIONS + 1
    w = World(FetchPathConfig(max_partitions_in_flight=n))
    w.state.create_topic("big", n)
    assert w.path.in_flight.take(object(), n) == n  # type: ignore[arg-type]
    big = Conn(w).with_edge()
    assert big.send(big.fetch_frame(2, [("big", p, 0) for p in range(n)])) == []
    assert taken(big) == [InFlightWait()]


def test_effects_are_bounded_when_nobody_drains_them() -> None:
    effects = Effects(limit=2)
    for _ in range(5):
        effects.add(BudgetWait())
    assert len(effects) == 2 and effects.dropped == 3
    assert effects.take() == ([BudgetWait(), BudgetWait()], 3)
    assert len(effects) == 0 and effects.dropped == 0


def test_starved_partitions_are_named_only_when_a_decision_log_wants_them() -> None:
    def first_report(starved_detail: bool) -> ShapedReport:
        w = World(FetchPathConfig(limits=Limits(max_records=1)))
        w.path.starved_detail = starved_detail  # the proxy sets it when a decision log is open
        c = Conn(w, "rdkafka", node_id=1)
        w.append("orders", 0, 1, times=2)
        w.append("orders", 1, 1, times=2)
        c.fetch(2, [("orders", 0, 0), ("orders", 1, 0)])
        [report] = [e for e in taken(c) if isinstance(e, ShapedReport)]
        assert report.decision.partitions_starved == 1
        return report

    assert first_report(False).starved_partitions is None  # no copy made for nobody
    assert list(first_report(True).starved_partitions.values()) == [1]  # type: ignore[union-attr]
