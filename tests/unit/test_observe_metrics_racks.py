"""Rack-aware fetching's metrics: in-rack and cross-rack bytes, redirects, fallbacks, cost avoided."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from proxy.observe.metrics import PREFIX, Metrics
from proxy.relay.racks import FallbackReason, RackMap, account

P = PREFIX


def fresh(**kwargs: int) -> tuple[Metrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return Metrics(registry, process_metrics=False, **kwargs), registry


def rack_b() -> RackMap:
    """A proxy in rack b; brokers 1, 2, 3 in racks a, b, c; orders-0 led by 1, orders-1 by 2."""
    m = RackMap("b")
    for node, rack in ((1, "a"), (2, "b"), (3, "c")):
        m.learn_broker(node, rack)
    m.learn_leader("orders", 0, 1)
    m.learn_leader("orders", 1, 2)
    m.learn_leader("orders", 2, 3)
    return m


def test_bytes_by_node_and_locality_and_the_cost_avoided() -> None:
    metrics, r = fresh()
    v = r.get_sample_value
    metrics.set_cross_zone_price(0.02)
    racks = rack_b()
    # the follower in rack b serves orders-0 (leader in a): 3e9 bytes avoided
    metrics.rack_fetch_data(account(racks, [(("orders", 0), 2, 3_000_000_000)]))
    # the leader in rack c serves orders-2: cross-rack
    metrics.rack_fetch_data(account(racks, [(("orders", 2), 3, 500)]))
    # the in-rack leader serves orders-1: in rack, nothing avoided (it would be anyway)
    metrics.rack_fetch_data(account(racks, [(("orders", 1), 2, 700)]))
    family = f"{P}broker_to_proxy_fetch_rack_record_bytes_total"
    assert v(family, {"node": "2", "locality": "same_rack"}) == 3_000_000_700
    assert v(family, {"node": "3", "locality": "other_rack"}) == 500
    assert v(family, {"node": "2", "locality": "other_rack"}) is None
    assert v(f"{P}cross_zone_avoided_record_bytes_total") == 3_000_000_000
    assert v(f"{P}cross_zone_price_per_gb") == 0.02
    assert v(f"{P}cross_zone_cost_avoided") == pytest.approx(0.06)
    # one fetch was served by a replica that does not lead what it served
    assert v(f"{P}proxy_to_broker_preferred_replica_fetches_total", {"node": "2"}) == 1
    assert v(f"{P}proxy_to_broker_preferred_replica_fetches_total", {"node": "3"}) is None


def test_a_new_price_values_only_the_bytes_read_after_it() -> None:
    metrics, r = fresh()
    racks = rack_b()
    metrics.set_cross_zone_price(0.02)
    metrics.rack_fetch_data(account(racks, [(("orders", 0), 2, 1_000_000_000)]))
    metrics.set_cross_zone_price(0.01)
    metrics.rack_fetch_data(account(racks, [(("orders", 0), 2, 1_000_000_000)]))
    assert r.get_sample_value(f"{P}cross_zone_cost_avoided") == pytest.approx(0.03)
    assert r.get_sample_value(f"{P}cross_zone_price_per_gb") == 0.01


def test_unknown_rack_without_a_proxy_rack_and_empty_partitions_count_no_bytes() -> None:
    metrics, r = fresh()
    racks = RackMap(None)
    racks.learn_broker(1, "a")
    metrics.rack_fetch_data(account(racks, [(("orders", 0), 1, 40), (("orders", 1), None, 0)]))
    family = f"{P}broker_to_proxy_fetch_rack_record_bytes_total"
    assert r.get_sample_value(family, {"node": "1", "locality": "unknown"}) == 40
    assert r.get_sample_value(family, {"node": "unknown", "locality": "unknown"}) is None
    assert r.get_sample_value(f"{P}cross_zone_avoided_record_bytes_total") == 0
    assert r.get_sample_value(f"{P}cross_zone_cost_avoided") == 0


def test_bytes_by_client_id_only_when_enabled_and_capped() -> None:
    racks = rack_b()
    by_client = f"{P}broker_to_proxy_fetch_rack_record_bytes_by_client_total"
    metrics, r = fresh()
    metrics.rack_fetch_data(account(racks, [(("orders", 0), 2, 10)]), client_id="app")
    assert r.get_sample_value(by_client, {"client_id": "app", "locality": "same_rack"}) is None
    metrics, r = fresh(client_id_label_cap=1)
    metrics.rack_fetch_data(account(racks, [(("orders", 0), 2, 10)]), client_id="app")
    metrics.rack_fetch_data(account(racks, [(("orders", 2), 3, 5)]), client_id="app")
    metrics.rack_fetch_data(account(racks, [(("orders", 2), 3, 7)]), client_id="other-app")
    assert r.get_sample_value(by_client, {"client_id": "app", "locality": "same_rack"}) == 10
    assert r.get_sample_value(by_client, {"client_id": "app", "locality": "other_rack"}) == 5
    assert r.get_sample_value(by_client, {"client_id": "other", "locality": "other_rack"}) == 7


def test_redirects_by_replica_named() -> None:
    metrics, r = fresh()
    metrics.preferred_replica_redirected([2, 2, 3])
    metrics.preferred_replica_redirected([])
    family = f"{P}preferred_replica_redirects_total"
    assert r.get_sample_value(family, {"node": "2"}) == 2
    assert r.get_sample_value(family, {"node": "3"}) == 1


def test_fallbacks_by_reason_preset_at_zero_and_unknown_reasons_fold_into_other() -> None:
    metrics, r = fresh()
    family = f"{P}preferred_replica_fallbacks_total"
    for reason in FallbackReason:
        assert r.get_sample_value(family, {"reason": reason.value}) == 0
    metrics.preferred_replica_fallback(FallbackReason.NOT_LEADER_OR_FOLLOWER, 3)
    metrics.preferred_replica_fallback("replica_unavailable")
    metrics.preferred_replica_fallback("a reason from the future")
    metrics.preferred_replica_fallback(FallbackReason.LEADER_EPOCH, 0)
    assert r.get_sample_value(family, {"reason": "not_leader_or_follower"}) == 3
    assert r.get_sample_value(family, {"reason": "replica_unavailable"}) == 1
    assert r.get_sample_value(family, {"reason": "other"}) == 1
    assert r.get_sample_value(family, {"reason": "leader_epoch"}) == 0
