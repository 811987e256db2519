"""The metrics module: names, labels, bounded cardinality, values read back from the registry."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.index import api_key_map
from prometheus_client import CollectorRegistry, generate_latest

from proxy.observe.labels import (
    BoundedLabel,
    CloseCause,
    DecisionOutcome,
    Direction,
    api_name,
)
from proxy.observe.metrics import (
    CATALOGUE,
    CLIENT_ID_SPEC,
    OPT_IN_SPECS,
    PREFIX,
    ByApi,
    Metrics,
    spec,
)
from proxy.protocol.apis import API_NAMES
from proxy.relay.racks import FallbackReason, Locality, NodeBytes, RackUsage
from proxy.sessions.resets import ResetReason, Side
from proxy.shaping.limits import LimitKind

P = PREFIX


def fresh(**kwargs: int) -> tuple[Metrics, CollectorRegistry]:
    registry = CollectorRegistry()
    return Metrics(registry, **kwargs), registry


def test_api_names_agree_with_kafka_message_definitions_known_to_kio() -> None:
    for key, name in api_key_map.items():
        assert API_NAMES[key] == name
    assert api_name(1) == "fetch"
    assert api_name(-1) == "unknown"
    assert api_name(10_000) == "unknown"


def test_catalogue_follows_the_naming_conventions() -> None:
    names = [s.name for s in CATALOGUE]
    assert len(names) == len(set(names))
    for s in (*CATALOGUE, *OPT_IN_SPECS):
        assert re.fullmatch(r"kafka_fetch_proxy_[a-z0-9_]+", s.name), s.name
        assert s.kind in ("counter", "gauge", "histogram")
        assert (s.kind == "counter") == s.name.endswith("_total"), s.name
        if s.kind == "histogram":
            assert s.name.endswith(("_bytes", "_seconds", "_rounds")), s.name
        assert s.help
        # never per topic-partition or per client address
        assert not {"topic", "partition", "address", "client_address", "host"} & set(s.labels)
    for direction in Direction:
        assert any(n.startswith(f"{P}{direction.value}_") for n in names), direction


def test_every_catalogued_metric_is_registered_with_its_type_and_labels() -> None:
    metrics, registry = fresh(client_id_label_cap=4)
    exercise_everything(metrics)
    families = {f.name: f for f in registry.collect()}
    for s in (*CATALOGUE, *OPT_IN_SPECS):
        # prometheus_client names a counter's family without the _total suffix
        family = families[s.name.removesuffix("_total") if s.kind == "counter" else s.name]
        assert family.type == s.kind
        sample_names = {sample.name for sample in family.samples}
        for series in s.series_names():
            assert series in sample_names, (s.name, series, sample_names)
        for sample in family.samples:
            if sample.name in s.series_names():
                assert set(sample.labels) - {"le"} == set(s.labels), (s.name, sample.labels)


def test_client_id_metric_only_when_enabled() -> None:
    _, registry = fresh()
    assert CLIENT_ID_SPEC.name.removesuffix("_total") not in {f.name for f in registry.collect()}


def exercise_everything(m: Metrics) -> None:
    m.connection_accepted()
    m.connection_closed(CloseCause.PEER_CLOSED)
    m.broker_connection_opened(1)
    m.broker_connection_closed(1, CloseCause.IO_ERROR)
    m.broker_connect_failed(2)
    m.set_brokers_reachable(3)
    m.request(1, Direction.CLIENT_TO_PROXY, 120)
    m.request(1, Direction.PROXY_TO_BROKER, 80, node=1)
    m.response(1, Direction.BROKER_TO_PROXY, 5000, node=1)
    m.response(1, Direction.PROXY_TO_CLIENT, 4000)
    m.client_request_duration(1, 0.01)
    m.broker_request_duration(1, 0.005)
    m.upstream_fetch_data(1, records=10, record_bytes=4500)
    m.delivered_fetch_data(records=8, record_bytes=3600, client_id="app-1")
    m.fetch_session_saved(request_bytes=40, response_bytes=100)
    m.set_fetch_sessions(Side.UPSTREAM, active=1, partitions=8)
    m.fetch_session_evicted(Side.DOWNSTREAM)
    m.fetch_session_reset(Side.UPSTREAM, ResetReason.INVALID_EPOCH)
    m.shaped_response("default")
    m.trimmed(LimitKind.MAX_RECORDS, records=2, record_bytes=900, policy="default")
    m.buffered_reuse_hits((900,))
    m.set_memory_budget(used=1024, limit=64 << 20)
    m.memory_budget_wait()
    m.starvations((2,))
    m.config_reloaded(ok=True)
    m.config_reloaded(ok=False)
    m.decision_logged(DecisionOutcome.WRITTEN)
    m.set_cross_zone_price(0.02)
    m.rack_fetch_data(
        RackUsage("b", (NodeBytes(2, Locality.SAME_RACK, 4000, 4000, 1),), ()), client_id="app-1"
    )
    m.preferred_replica_redirected([2])
    m.preferred_replica_fallback(FallbackReason.OFFSET_OUT_OF_RANGE)


def test_values_read_back_from_the_registry() -> None:
    metrics, r = fresh(client_id_label_cap=4)
    exercise_everything(metrics)
    v = r.get_sample_value
    assert v(f"{P}client_connections_accepted_total") == 1
    assert v(f"{P}client_connections_open") == 0
    assert v(f"{P}client_connections_closed_total", {"cause": "peer_closed"}) == 1
    assert v(f"{P}client_connections_closed_total", {"cause": "io_error"}) == 0
    assert v(f"{P}broker_connections_open", {"node": "1"}) == 0
    assert v(f"{P}broker_connections_closed_total", {"node": "1", "cause": "io_error"}) == 1
    assert v(f"{P}broker_connect_failures_total", {"node": "2"}) == 1
    assert v(f"{P}upstream_brokers_reachable") == 3
    assert v(f"{P}client_to_proxy_requests_total", {"api": "fetch"}) == 1
    assert v(f"{P}client_to_proxy_request_size_bytes_sum", {"api": "fetch"}) == 120
    assert v(f"{P}proxy_to_broker_request_size_bytes_count", {"api": "fetch"}) == 1
    assert v(f"{P}proxy_to_broker_bytes_total", {"node": "1"}) == 80
    assert v(f"{P}broker_to_proxy_bytes_total", {"node": "1"}) == 5000
    assert v(f"{P}broker_to_proxy_responses_total", {"api": "fetch"}) == 1
    assert v(f"{P}proxy_to_client_response_size_bytes_sum", {"api": "fetch"}) == 4000
    assert v(f"{P}client_request_duration_seconds_count", {"api": "fetch"}) == 1
    assert v(f"{P}broker_request_duration_seconds_sum", {"api": "fetch"}) == 0.005
    assert v(f"{P}broker_to_proxy_fetch_records_total", {"node": "1"}) == 10
    assert v(f"{P}broker_to_proxy_fetch_record_bytes_total", {"node": "1"}) == 4500
    assert v(f"{P}proxy_to_client_fetch_records_total") == 8
    assert v(f"{P}proxy_to_client_fetch_record_bytes_total") == 3600
    assert v(f"{P}proxy_to_client_fetch_record_bytes_by_client_total", {"client_id": "app-1"}) == (
        3600
    )
    assert v(f"{P}incremental_fetch_saved_bytes_total", {"kind": "request"}) == 40
    assert v(f"{P}incremental_fetch_saved_bytes_total", {"kind": "response"}) == 100
    assert v(f"{P}fetch_sessions_active", {"side": "upstream"}) == 1
    assert v(f"{P}fetch_session_partitions_cached", {"side": "upstream"}) == 8
    assert v(f"{P}fetch_sessions_active", {"side": "downstream"}) == 0
    assert v(f"{P}fetch_session_evictions_total", {"side": "downstream"}) == 1
    assert v(f"{P}fetch_session_resets_total", {"side": "upstream", "reason": "invalid_epoch"}) == 1
    limit = {"limit": "max_records", "policy": "default"}
    assert v(f"{P}limit_applied_total", limit) == 1
    assert v(f"{P}trimmed_records_total", limit) == 2
    assert v(f"{P}trimmed_bytes_total", limit) == 900
    assert v(f"{P}shaped_responses_total", {"policy": "default"}) == 1
    assert v(f"{P}buffered_reuse_hits_total") == 1
    assert v(f"{P}buffered_reuse_bytes_total") == 900
    assert v(f"{P}memory_budget_used_bytes") == 1024
    assert v(f"{P}memory_budget_limit_bytes") == 64 << 20
    assert v(f"{P}memory_budget_waits_total") == 1
    assert v(f"{P}partition_starvation_rounds_bucket", {"le": "1.0"}) == 0
    assert v(f"{P}partition_starvation_rounds_bucket", {"le": "2.0"}) == 1
    assert v(f"{P}config_reloads_total") == 1
    assert v(f"{P}config_reload_failures_total") == 1
    assert v(f"{P}decision_log_events_total", {"outcome": "written"}) == 1
    assert v(f"{P}decision_log_events_total", {"outcome": "dropped"}) == 0
    assert v(f"{P}build_info", {"version": "0.1.0"}) == 1


def test_wrong_direction_is_a_programming_error() -> None:
    metrics, _ = fresh()
    with pytest.raises(ValueError):
        metrics.request(1, Direction.PROXY_TO_CLIENT, 1)
    with pytest.raises(ValueError):
        metrics.response(1, Direction.CLIENT_TO_PROXY, 1)


def test_unknown_enum_strings_fold_into_other() -> None:
    metrics, r = fresh()
    metrics.connection_accepted()
    metrics.connection_closed("some-new-cause")
    metrics.trimmed("not_a_limit", records=1, record_bytes=1, policy="p")
    metrics.fetch_session_reset(Side.DOWNSTREAM, "weird")
    assert r.get_sample_value(f"{P}client_connections_closed_total", {"cause": "other"}) == 1
    assert r.get_sample_value(f"{P}trimmed_records_total", {"limit": "other", "policy": "p"}) == 1
    assert (
        r.get_sample_value(
            f"{P}fetch_session_resets_total", {"side": "downstream", "reason": "other"}
        )
        == 1
    )


def test_instances_on_separate_registries_are_independent() -> None:
    a, ra = fresh()
    b, rb = fresh()
    a.connection_accepted()
    assert ra.get_sample_value(f"{P}client_connections_accepted_total") == 1
    assert rb.get_sample_value(f"{P}client_connections_accepted_total") == 0
    assert b.registry is rb
    assert spec(f"{P}trimmed_bytes_total").labels == ("limit", "policy")


def test_bounded_label() -> None:
    label = BoundedLabel(2, max_length=5)
    assert [label(x) for x in ("a", "b", "c", "a", "toolong", "b")] == [
        "a",
        "b",
        "other",
        "a",
        "other",
        "b",
    ]
    assert label.admitted == {"a", "b"}
    assert BoundedLabel(0)("x") == "other"
    with pytest.raises(ValueError):
        BoundedLabel(-1)


NODE_CAP = 5
POLICY_CAP = 3
CLIENT_CAP = 4


@settings(max_examples=60, deadline=None)
@given(
    events=st.lists(
        st.tuples(
            st.integers(-(2**15), 2**15 - 1),  # api key
            st.one_of(st.none(), st.integers(-(2**31), 2**31 - 1)),  # node id
            st.text(max_size=80),  # policy name / client id / free-form cause
            st.integers(0, 2**20),  # sizes and counts
        ),
        max_size=60,
    )
)
def test_label_sets_stay_bounded_whatever_the_input(
    events: list[tuple[int, int | None, str, int]],
) -> None:
    metrics, _ = fresh(
        node_label_cap=NODE_CAP, policy_label_cap=POLICY_CAP, client_id_label_cap=CLIENT_CAP
    )
    for api, node, text, n in events:
        metrics.request(api, Direction.CLIENT_TO_PROXY, n)
        metrics.request(api, Direction.PROXY_TO_BROKER, n, node=node)
        metrics.response(api, Direction.BROKER_TO_PROXY, n, node=node)
        metrics.client_request_duration(api, n / 1000)
        metrics.broker_connection_opened(node)
        metrics.broker_connection_closed(node, text)
        metrics.upstream_fetch_data(node, records=n, record_bytes=n)
        metrics.delivered_fetch_data(records=n, record_bytes=n, client_id=text)
        metrics.trimmed(text, records=n, record_bytes=n, policy=text)
        metrics.shaped_response(text)
        metrics.fetch_session_reset(Side.UPSTREAM, text)
        metrics.connection_accepted()
        metrics.connection_closed(text)
        metrics.rack_fetch_data(
            RackUsage(text, (NodeBytes(node, Locality.UNKNOWN, n, 0, n % 2),), ()), client_id=text
        )
        metrics.preferred_replica_redirected([n])
        metrics.preferred_replica_fallback(text)
    apis = len(API_NAMES) + 1
    nodes = NODE_CAP + 1
    policies = POLICY_CAP + 1
    causes = len(CloseCause)
    bound = {
        "client_to_proxy_requests": apis,
        "client_to_proxy_request_size_bytes": apis,
        "proxy_to_broker_requests": apis,
        "broker_to_proxy_responses": apis,
        "client_request_duration_seconds": apis,
        "proxy_to_broker_bytes": nodes,
        "broker_to_proxy_bytes": nodes,
        "broker_connections_open": nodes,
        "broker_connections_closed": nodes * causes,
        "broker_to_proxy_fetch_records": nodes,
        "proxy_to_client_fetch_record_bytes_by_client": CLIENT_CAP + 1,
        "trimmed_records": len(LimitKind) * policies,
        "limit_applied": len(LimitKind) * policies,
        "shaped_responses": policies,
        "fetch_session_resets": len(Side) * len(ResetReason),
        "client_connections_closed": causes,
        "broker_to_proxy_fetch_rack_record_bytes": nodes * len(Locality),
        "broker_to_proxy_fetch_rack_record_bytes_by_client": (CLIENT_CAP + 1) * len(Locality),
        "preferred_replica_redirects": nodes,
        "proxy_to_broker_preferred_replica_fetches": nodes,
        "preferred_replica_fallbacks": len(FallbackReason),
    }
    counts = metrics.label_value_counts()
    for short, limit in bound.items():
        assert counts[P + short] <= limit, (short, counts[P + short])


def test_process_metrics_are_on_the_same_registry_unless_disabled() -> None:
    _, with_process = fresh()
    assert (with_process.get_sample_value("process_resident_memory_bytes") or 0) > 0
    bare = CollectorRegistry()
    Metrics(bare, process_metrics=False)
    assert bare.get_sample_value("process_resident_memory_bytes") is None


# --- per-message series resolved once --------------------------------------------------------


def _exposition_without_created(registry: CollectorRegistry) -> list[str]:
    """The text exposition, minus the ``_created`` lines (timestamps of series creation)."""
    text = generate_latest(registry).decode()
    return [line for line in text.splitlines() if "_created" not in line]


@settings(deadline=None)  # a loaded test machine is no reason to fail (no timed asserts)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([0, 1, 3, 18, 36, 999, -1, 32767]),  # known and unknown API keys
            st.sampled_from(list(Direction)),
            st.integers(min_value=0, max_value=1 << 24),
            st.sampled_from([None, 1, 2]),
            st.floats(min_value=0.0, max_value=60.0),
        ),
        max_size=40,
    )
)
def test_cached_children_expose_what_labels_per_message_exposed(
    events: list[tuple[int, Direction, int, int | None, float]],
) -> None:
    """The legs, durations, node bytes, fetch data and session savings resolved once give
    the exposition that a ``labels()`` call per message gave (the reference below is that
    old code path)."""
    cached, reference = Metrics(process_metrics=False), Metrics(process_metrics=False)
    for api_key, direction, size, node, seconds in events:
        is_request = direction in (Direction.CLIENT_TO_PROXY, Direction.PROXY_TO_BROKER)
        if is_request:
            cached.request(api_key, direction, size, node=node)
        else:
            cached.response(api_key, direction, size, node=node)
        cached.client_request_duration(api_key, seconds)
        cached.broker_request_duration(api_key, seconds)

        api = api_name(api_key)
        stem = f"{direction.value}_{'request' if is_request else 'response'}"
        reference._counters[f"{stem}s_total"].labels(api=api).inc()
        reference._histograms[f"{stem}_size_bytes"].labels(api=api).observe(size)
        if direction is Direction.PROXY_TO_BROKER:
            n = "unknown" if node is None else str(node)
            reference._counters["proxy_to_broker_bytes_total"].labels(node=n).inc(size)
        if direction is Direction.BROKER_TO_PROXY:
            n = "unknown" if node is None else str(node)
            reference._counters["broker_to_proxy_bytes_total"].labels(node=n).inc(size)
        reference._histograms["client_request_duration_seconds"].labels(api=api).observe(seconds)
        reference._histograms["broker_request_duration_seconds"].labels(api=api).observe(seconds)

        cached.upstream_fetch_data(node, records=size % 7, record_bytes=size)
        n = "unknown" if node is None else str(node)
        reference._counters["broker_to_proxy_fetch_records_total"].labels(node=n).inc(size % 7)
        reference._counters["broker_to_proxy_fetch_record_bytes_total"].labels(node=n).inc(size)
        cached.fetch_session_saved(request_bytes=size % 3, response_bytes=size % 5)
        saved = reference._counters["incremental_fetch_saved_bytes_total"]
        if size % 3:
            saved.labels(kind="request").inc(size % 3)
        if size % 5:
            saved.labels(kind="response").inc(size % 5)
    assert _exposition_without_created(cached.registry) == _exposition_without_created(
        reference.registry
    )


def test_the_cache_of_children_holds_only_keys_of_the_api_table() -> None:
    metrics = fresh()[0]
    leg = ByApi(metrics._counters["client_to_proxy_requests_total"])
    for api_key in range(-5, 5000):  # input-controlled keys, mostly outside the table
        leg(api_key)
    assert set(leg._children) <= set(API_NAMES)
    assert leg(4999) == leg(-5)  # every unknown key is the one "unknown" series
    assert leg(1) is leg(1)  # a known key is resolved once
