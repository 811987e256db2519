"""The combined Fetch path (proxy.fetchpath) in the real relay, the dev broker's dispatcher upstream.

Bytes in, bytes out, as in test_session_translate_handler: client frames into
the Relay, upstream frames answered by the dev broker's sans-I/O dispatcher
(the harness: ``tests/support/fetch_world.py``).
"""

from __future__ import annotations

import argparse
from typing import Any

import pytest
from support.fetch_world import ALL, Conn, World, delivered, upstream_fetches

from proxy import config
from proxy.config import FetchPathConfig, InvalidFetchConfig
from proxy.fetchpath import FetchPath
from proxy.observe.metrics import PREFIX, Metrics
from proxy.protocol import codec
from proxy.shaping.limits import Limits
from proxy.shaping.policy import Policy


@pytest.mark.parametrize("version", [12, 13, 17, 18])
def test_unlimited_path_answers_exactly_as_the_broker(version: int) -> None:
    w = World()
    c = Conn(w)
    w.append("events", 2, 3)
    w.append("orders", 1, 5, times=2)
    for cid in (2, 3, 4):
        frame = c.fetch_frame(cid, ALL, version)
        [out] = c.send(frame)
        assert out == w.answer(frame, w.direct)
    assert upstream_fetches(c)[-1].session_epoch >= 1  # incremental upstream
    assert w.path.budget.used == 0


@pytest.mark.parametrize("version", [12, 18])
def test_record_cap_delivers_whole_batches_and_serves_the_rest_from_the_buffer(
    version: int,
) -> None:
    metrics = Metrics(process_metrics=False)
    w = World(FetchPathConfig(limits=Limits(max_records=5)), metrics=metrics)
    c = Conn(w)
    w.append("orders", 0, 3, times=3)  # offsets 0-2, 3-5, 6-8
    names = w if version >= 13 else None
    first = c.fetch(2, [("orders", 0, 0)], version)
    assert delivered(first, names)[("orders", 0)] == [(0, 3)]
    assert first.responses[0].partitions[0].high_watermark == 9
    upstream_before = len(upstream_fetches(c))
    second = c.fetch(3, [("orders", 0, 3)], version)
    assert delivered(second, names)[("orders", 0)] == [(3, 3)]
    # Held batches (3-8) fill the 5-record response: no upstream round.
    assert len(upstream_fetches(c)) == upstream_before
    assert second.responses[0].partitions[0].high_watermark == 9
    third = c.fetch(4, [("orders", 0, 6)], version)
    assert delivered(third, names)[("orders", 0)] == [(6, 3)]
    # 6-8 alone do not fill it: upstream was asked from past the held batches.
    last = upstream_fetches(c)[upstream_before]
    assert last.__version__ == version
    offsets = [p.fetch_offset for t in last.topics for p in t.partitions]
    assert offsets in ([9], [])  # changed partition sent, or the session already had it
    value = metrics.registry.get_sample_value
    assert value(f"{PREFIX}buffered_reuse_hits_total") == 2
    assert value(f"{PREFIX}trimmed_records_total", {"limit": "max_records", "policy": "default"})
    assert w.path.budget.used == 0  # nothing held once the buffer is drained and written


def test_a_long_poll_holds_no_budget_and_its_response_waits_unread_for_room() -> None:
    metrics = Metrics(process_metrics=False)
    w = World(FetchPathConfig(memory_budget_bytes=1 << 20), metrics=metrics)
    budget = w.path.budget
    budget.floor = 1 << 20
    a, b = Conn(w).with_edge(), Conn(w).with_edge()
    assert a.send(a.fetch_frame(2, ALL), answer=False) == []  # a long poll waiting upstream
    assert a.held and budget.used == 0  # holds nothing while it waits (KIP-81)
    assert b.send(b.fetch_frame(2, ALL), answer=False) == []  # so b's goes upstream at once
    assert b.held and b.handler.budget_waits == 0
    hog = budget.try_reserve(budget.capacity)  # responses of others, not yet written
    assert hog is not None
    w.append("orders", 0, 3)
    assert a.release_held() == []  # its response's size is known: no room, it is not read
    assert a.answers and a.handler.budget_waits == 1 and w.path.fetch_waits == 1
    assert metrics.registry.get_sample_value(f"{PREFIX}memory_budget_waits_total") == 1
    hog.release()
    assert a.woken == 1  # the edge asks again from a's task
    a.read_upstream()
    [out] = a.pump()
    assert delivered(codec.decode_response(1, 12, out)[1])[("orders", 0)] == [(0, 3)]
    assert budget.used == 0 and budget.peak <= budget.capacity


def test_closing_a_connection_gives_back_its_budget() -> None:
    w = World(FetchPathConfig(limits=Limits(max_records=1), memory_budget_bytes=1 << 22))
    c = Conn(w).with_edge()
    w.append("orders", 0, 1, times=4)
    c.fetch(2, [("orders", 0, 0)])
    assert w.path.budget.used > 0  # three batches held in the reuse buffer
    c.send(c.fetch_frame(3, ALL), answer=False)
    c.handler.close()
    assert w.path.budget.used == 0


def test_the_whole_budget_is_usable_with_nothing_kept_back() -> None:
    """No working copy: a large response is read in place (``FrameDecoder``'s
    *preallocate*), never joined from pieces, so it never exists twice and the budget
    keeps nothing back for a second copy (it kept budget/16 before)."""
    w = World(FetchPathConfig(memory_budget_bytes=64 << 20))
    budget = w.path.budget
    assert budget.used == 0 and budget.headroom == 64 << 20
    w.path.reload(FetchPathConfig(memory_budget_bytes=1 << 21))
    assert budget.used == 0 and budget.headroom == 1 << 21


def test_reload_applies_new_limits_and_policies_to_live_connections() -> None:
    w = World()
    rd, java = Conn(w, "rdkafka"), Conn(w, "java-app")
    w.append("orders", 0, 2, times=4)
    assert len(delivered(rd.fetch(2, [("orders", 0, 0)]))[("orders", 0)]) == 4
    w.path.reload(
        FetchPathConfig(
            limits=Limits(max_records=4),
            policies=(Policy("java", Limits(max_records=2), client_id="java-*"),),
        )
    )
    assert delivered(rd.fetch(3, [("orders", 0, 0)]))[("orders", 0)] == [(0, 2), (2, 2)]
    assert delivered(java.fetch(2, [("orders", 0, 0)]))[("orders", 0)] == [(0, 2)]


def test_policies_match_listener_names() -> None:
    w = World(FetchPathConfig(policies=(Policy("b2", Limits(max_records=1), listener="broker-2"),)))
    assert w.path.select("x", "broker-2") == ("b2", Limits(max_records=1))
    assert w.path.select("x", "broker-1") == ("default", Limits())
    assert Conn(w, node_id=None).handler.listener == "bootstrap"


def test_fetch_sessions_off_sends_sessionless_full_fetches() -> None:
    w = World(FetchPathConfig(fetch_sessions=False))
    c = Conn(w)
    for cid in (2, 3, 4):
        c.fetch(cid, ALL)
    fetches = upstream_fetches(c)
    assert [(f.session_id, f.session_epoch) for f in fetches] == [(0, -1)] * 3
    assert all(sum(len(t.partitions) for t in f.topics) == 7 for f in fetches)


def test_config_from_raw_names_key_value_and_what_is_allowed() -> None:
    cfg = FetchPathConfig.from_raw(
        {
            "max_records": 100,
            "memory_budget_bytes": 1 << 26,
            "policies": [{"name": "slow", "client_id": "rd*", "max_partition_records": 10}],
        }
    )
    assert cfg.limits == Limits(max_records=100) and cfg.memory_budget_bytes == 1 << 26
    assert cfg.policies[0].limits == Limits(max_partition_records=10)
    with pytest.raises(InvalidFetchConfig, match=r"policies\[1\]\.name.*'a'.*unique"):
        FetchPathConfig.from_raw({"policies": [{"name": "a"}, {"name": "a"}]})


def test_schema_keys_flags_and_env() -> None:
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    args = parser.parse_args(
        [
            "--upstream",
            "k:1",
            "--max-records",
            "500",
            "--no-fetch-sessions",
            "--policies",
            '[{"name": "p", "listener": "broker-*", "max_records": 5}]',
        ]
    )
    settings = config.from_args(args, {"KAFKA_FETCH_PROXY_MEMORY_BUDGET_BYTES": "67108864"})
    cfg = FetchPathConfig.from_raw(settings.raw)
    assert cfg.limits.max_records == 500 and not cfg.fetch_sessions
    assert cfg.memory_budget_bytes == 64 << 20 and cfg.policies[0].listener == "broker-*"
    with pytest.raises(config.ConfigError, match=r"key 'max_records'.*-3.*>= 1"):
        config.validate({"upstream": ["k:1"], "max_records": -3})
    with pytest.raises(config.ConfigError, match=r"policies"):
        config.validate({"upstream": ["k:1"], "policies": [{"name": "x", "max_bytes": 1}]})


def test_shaped_responses_reach_the_decision_log_and_metrics() -> None:
    import io
    import json

    from proxy.observe.decisionlog import DecisionLog, FractionSampler

    metrics = Metrics(process_metrics=False)
    sink = io.StringIO()
    w = World(
        FetchPathConfig(
            limits=Limits(max_partition_records=2),
            policies=(Policy("rd", Limits(max_records=3), client_id="rd*"),),
        ),
        metrics=metrics,
    )
    decisions = DecisionLog(sink, sampler=FractionSampler(1.0), metrics=metrics)
    w.decision_log = decisions  # the edge's: the fetch path returns its effects
    c = Conn(w, "rdkafka", node_id=1)
    w.append("orders", 0, 1, times=3)
    w.append("orders", 1, 1, times=3)
    c.fetch(7, [("orders", 0, 0), ("orders", 1, 0)])
    assert decisions.flush(10)  # written by the decision log's thread
    [event] = [json.loads(line) for line in sink.getvalue().splitlines()]
    assert event["policy"] == "rd" and event["node_id"] == 1 and event["correlation_id"] == 7
    assert event["delivered_records"] == 3 and event["partitions_trimmed"] == 2
    assert event["limits"]["max_records"] == 3 and event["limits"]["max_partition_records"] == 2
    assert "rdkafka" == event["client_id"] and "v" * 20 not in sink.getvalue()
    value = metrics.registry.get_sample_value
    assert value(f"{PREFIX}shaped_responses_total", {"policy": "rd"}) == 1
    assert value(f"{PREFIX}limit_applied_total", {"limit": "max_records", "policy": "rd"}) == 1
    assert value(f"{PREFIX}memory_budget_used_bytes") == w.path.budget.used > 0  # buffer


def test_reloader_applies_or_keeps_the_old_config_and_counts() -> None:
    from proxy.server.reload import Reloader

    metrics = Metrics(process_metrics=False)
    start = config.validate({"upstream": ["k:1"], "max_records": 10})
    path = FetchPath(FetchPathConfig.from_raw(start.raw))
    handler = path.handler(1)
    raw: dict[str, Any] = {"upstream": ["k:1"], "max_records": 20, "memory_budget_bytes": 1 << 20}
    reloader = Reloader(lambda: config.validate(raw), path, start, metrics=metrics)
    assert reloader.reload("SIGHUP")
    assert path.config.limits.max_records == 20 and path.budget.capacity == 1 << 20
    assert path.select("any", handler.listener) == ("default", Limits(max_records=20))
    raw["max_records"] = 0
    assert not reloader.reload("file")
    assert path.config.limits.max_records == 20  # the old configuration stays
    raw["max_records"] = 30
    raw["policies"] = [{"name": "x"}, {"name": "x"}]
    assert not reloader.reload("file")
    value = metrics.registry.get_sample_value
    assert value(f"{PREFIX}config_reloads_total") == 1
    assert value(f"{PREFIX}config_reload_failures_total") == 2


def test_a_reload_logs_as_applied_exactly_the_keys_it_applies() -> None:
    """``run_ahead``, ``max_partitions_in_flight``, ``max_fetch_partitions`` and ``rack``
    (also read again from ``rack_file`` at each reload) change live connections' next
    fetches, so the ``config_reloaded`` line lists them as applied, not as needing a
    restart."""
    from structlog.testing import capture_logs

    from proxy.server.reload import Reloader

    start = config.validate({"upstream": ["k:1"]})
    path = FetchPath(FetchPathConfig.from_raw(start.raw))
    live = path.handler(1)
    raw: dict[str, Any] = {
        "upstream": ["k:1"],
        "run_ahead": False,
        "max_partitions_in_flight": 700,
        "max_fetch_partitions": 600,
        "rack": "zone-b",
        "max_frame_bytes": 1 << 20,
    }
    reloader = Reloader(lambda: config.validate(raw), path, start)
    with capture_logs() as logs:
        assert reloader.reload("SIGHUP")
    assert path.config.run_ahead is False
    assert path.in_flight.limit == 700 and path.kept_decodes.limit == 700
    assert path.racks.rack == "zone-b"
    assert live.downstream.max_fetch_partitions == 600  # a connection opened before it
    (event,) = [e for e in logs if e["event"] == "config_reloaded"]
    assert event["config_keys"] == [
        "max_fetch_partitions",
        "max_partitions_in_flight",
        "rack",
        "run_ahead",
    ]
    assert event["restart_keys"] == ["max_frame_bytes"]


def test_responses_waiting_for_budget_are_read_oldest_first() -> None:
    w = World(FetchPathConfig(memory_budget_bytes=1 << 20))
    budget = w.path.budget
    budget.floor = 1 << 20
    a, b = Conn(w).with_edge(), Conn(w).with_edge()
    hog = budget.try_reserve(budget.capacity)
    assert hog is not None
    w.append("orders", 0, 2)
    assert a.send(a.fetch_frame(2, ALL)) == [] and b.send(b.fetch_frame(2, ALL)) == []
    assert a.answers and b.answers and w.path.fetch_waits == 2
    hog.resize(budget.capacity - len(a.answers[0]))  # room for a's response alone
    assert (a.woken, b.woken) == (1, 0)  # the oldest first, as many as the room serves
    a.read_upstream()
    assert len(a.pump()) == 1  # written: its grant goes back, the next waiter is woken
    assert b.woken == 1
    b.read_upstream()
    assert len(b.pump()) == 1
    hog.release()
    assert budget.used == 0


def test_a_response_that_would_wait_sheds_the_reuse_buffers_first() -> None:
    w = World(FetchPathConfig(limits=Limits(max_records=1), memory_budget_bytes=1 << 20))
    budget = w.path.budget
    budget.floor = 1 << 20
    a, b = Conn(w).with_edge(), Conn(w).with_edge()
    w.append("orders", 1, 1, times=40)
    w.append("orders", 0, 1)
    a.fetch(2, [("orders", 1, 0)])
    assert len(a.handler.shaper.buffer) == 1 and budget.used > 1000  # 39 batches held
    hog = budget.try_reserve(budget.headroom)  # no room left but what the buffer holds
    assert hog is not None
    assert delivered(b.fetch(2, [("orders", 0, 0)]))[("orders", 0)] == [(0, 1)]
    assert len(a.handler.shaper.buffer) == 0 and w.path.fetch_waits == 0
    hog.release()
    assert delivered(a.fetch(3, [("orders", 1, 1)]))[("orders", 1)] == [(1, 1)]  # refetched


def test_rack_accounting_reaches_the_metrics_and_the_decision_log() -> None:
    """A proxy in rack b on broker 1's listener: bytes of a partition broker 1 follows
    (leader 2, rack a) are in-rack and avoided cross-zone bytes; its own partition's are
    in-rack only.  Racks and leaders come from a Metadata response the relay forwards."""
    import datetime
    import io
    import json

    from kio.schema.errors import ErrorCode
    from kio.schema.metadata.v12 import response as md12
    from kio.schema.types import BrokerId
    from kio.static.primitive import i32, i32Timedelta

    from proxy.observe.decisionlog import DecisionLog, FractionSampler

    metrics = Metrics(process_metrics=False)
    sink = io.StringIO()
    w = World(FetchPathConfig(rack="b", cross_zone_price_per_gb=0.05), metrics=metrics)
    decisions = DecisionLog(sink, sampler=FractionSampler(1.0), metrics=metrics)
    w.decision_log = decisions  # the edge's: the fetch path returns its effects
    c = Conn(w, "rdkafka", node_id=1)
    metadata = md12.MetadataResponse(
        throttle_time=i32Timedelta.parse(datetime.timedelta(0)),
        brokers=tuple(
            md12.MetadataResponseBroker(node_id=BrokerId(n), host="k", port=i32(9092), rack=r)
            for n, r in ((1, "b"), (2, "a"))
        ),
        cluster_id="dev",
        controller_id=BrokerId(1),
        topics=(
            md12.MetadataResponseTopic(
                error_code=ErrorCode.none,
                name="orders",
                topic_id=w.state.topics["orders"].topic_id,
                is_internal=False,
                partitions=tuple(
                    md12.MetadataResponsePartition(
                        error_code=ErrorCode.none,
                        partition_index=i32(p),
                        leader_id=BrokerId(leader),
                        leader_epoch=i32(0),
                        replica_nodes=(BrokerId(1), BrokerId(2)),
                        isr_nodes=(BrokerId(1), BrokerId(2)),
                        offline_replicas=(),
                    )
                    for p, leader in ((0, 2), (1, 1))
                ),
                topic_authorized_operations=i32(-2147483648),
            ),
        ),
    )
    c.handler.observe(3, 12, codec.encode_response(metadata, 5))
    assert w.path.racks.same_rack_nodes() == (1,)
    w.append("orders", 0, 3)
    w.append("orders", 1, 2)
    c.fetch(7, [("orders", 0, 0), ("orders", 1, 0)])
    assert decisions.flush(10)
    [event] = [json.loads(line) for line in sink.getvalue().splitlines()]
    upstream = event["upstream_record_bytes"]
    [orders] = event["rack_by_topic"]
    avoided = orders["cross_zone_avoided_record_bytes"]
    assert event["rack"] == "b" and event["cross_zone_price_per_gb"] == 0.05
    assert event["same_rack_record_bytes"] == orders["same_rack_record_bytes"] == upstream > 0
    assert event["cross_zone_avoided_record_bytes"] == avoided
    assert 0 < avoided < upstream  # orders-0 (followed) only, not orders-1 (led by 1)
    value = metrics.registry.get_sample_value
    rack_bytes = f"{PREFIX}broker_to_proxy_fetch_rack_record_bytes_total"
    assert value(rack_bytes, {"node": "1", "locality": "same_rack"}) == upstream
    assert value(f"{PREFIX}cross_zone_avoided_record_bytes_total") == avoided
    assert value(f"{PREFIX}cross_zone_cost_avoided") == pytest.approx(avoided * 0.05 / 1e9)
    assert value(f"{PREFIX}proxy_to_broker_preferred_replica_fetches_total", {"node": "1"}) == 1
    w.path.reload(FetchPathConfig(rack="b", cross_zone_price_per_gb=0.01))
    assert value(f"{PREFIX}cross_zone_price_per_gb") == 0.01


def test_a_fetch_version_without_a_rack_counts_one_fallback_per_connection() -> None:
    metrics = Metrics(process_metrics=False)
    w = World(FetchPathConfig(rack="b"), metrics=metrics)
    w.append("orders", 0, 1)
    fallbacks = f"{PREFIX}preferred_replica_fallbacks_total"
    old, new = Conn(w, "kafka-go", node_id=1), Conn(w, "rdkafka", node_id=1)
    for cid in (1, 2):
        old.fetch(cid, [("orders", 0, 0)], version=10)
        new.fetch(cid, [("orders", 0, 0)], version=12)
    value = metrics.registry.get_sample_value
    assert value(fallbacks, {"reason": "old_fetch_version"}) == 1
    assert value(fallbacks, {"reason": "client_ignores_redirect"}) == 0


def test_a_fetch_sent_upstream_long_polls_at_most_max_upstream_wait_ms() -> None:
    import dataclasses
    from datetime import timedelta

    from support.dev_upstream import client_fetch as make_fetch

    w = World(FetchPathConfig(max_upstream_wait_ms=500))

    class _Up:
        state = w.state

    def sent(wait_ms: int) -> timedelta:
        """The max_wait upstream of a client's long poll (left unanswered) asking *wait_ms*."""
        c = Conn(w)
        request = make_fetch(_Up(), 12, ALL)  # type: ignore[arg-type]
        request = dataclasses.replace(request, max_wait=timedelta(milliseconds=wait_ms))
        c.send(codec.encode_request(request, 2, c.client_id), answer=False)
        [fetch] = upstream_fetches(c)
        wait: timedelta = fetch.max_wait
        return wait

    assert sent(30_000) == timedelta(milliseconds=500)  # 30 s asked, 500 ms upstream
    assert sent(100) == timedelta(milliseconds=100)  # a shorter one keeps its own
    w.path.reload(FetchPathConfig(max_upstream_wait_ms=50))  # reloaded: the next fetch
    assert sent(30_000) == timedelta(milliseconds=50)
    assert FetchPathConfig.from_raw({}).max_upstream_wait_ms == 500
    parser = argparse.ArgumentParser()
    config.add_arguments(parser)
    args = parser.parse_args(["--upstream", "k:1", "--max-upstream-wait-ms", "250"])
    assert FetchPathConfig.from_raw(config.from_args(args, {}).raw).max_upstream_wait_ms == 250
    env = {"KAFKA_FETCH_PROXY_MAX_UPSTREAM_WAIT_MS": "100"}
    args = parser.parse_args(["--upstream", "k:1"])
    assert FetchPathConfig.from_raw(config.from_args(args, env).raw).max_upstream_wait_ms == 100
    with pytest.raises(config.ConfigError, match=r"key 'max_upstream_wait_ms'.*-1.*>= 0"):
        config.validate({"upstream": ["k:1"], "max_upstream_wait_ms": -1})


def test_other_traffic_never_waits_for_the_budget() -> None:
    """Heartbeats, commits and metadata go upstream at once, whatever the budget (KIP-81 exempts
    coordinator traffic); only the order a connection's answers leave in can hold one back."""
    from devbroker.build import build
    from proxy.protocol.apis import HEARTBEAT, METADATA, OFFSET_COMMIT

    def request(api_key: int, version: int, data: dict[str, Any], cid: int) -> bytes:
        return codec.encode_request(build(codec.request_schema(api_key, version), data), cid, "app")

    def others(first_cid: int) -> list[bytes]:
        commit = {
            "group_id": "g",
            "generation_id_or_member_epoch": -1,
            "member_id": "",
            "group_instance_id": None,
            "topics": [
                {
                    "name": "orders",
                    "partitions": [
                        {
                            "partition_index": 0,
                            "committed_offset": 1,
                            "committed_leader_epoch": -1,
                            "committed_metadata": None,
                        }
                    ],
                }
            ],
        }
        beat = {"group_id": "g", "generation_id": 1, "member_id": "m", "group_instance_id": None}
        return [
            request(METADATA, 1, {"topics": None}, first_cid),
            request(HEARTBEAT, 4, beat, first_cid + 1),
            request(OFFSET_COMMIT, 8, commit, first_cid + 2),
        ]

    w = World(FetchPathConfig(memory_budget_bytes=1 << 20))
    budget = w.path.budget
    budget.floor = 1 << 20
    b, c = Conn(w).with_edge(), Conn(w).with_edge()
    hog = budget.try_reserve(budget.capacity)  # the budget is taken
    assert hog is not None
    w.append("orders", 0, 1)
    assert b.send(b.fetch_frame(2, ALL)) == []  # b's response waits for budget, unread
    assert b.answers and b.handler.budget_waits == 1
    # Another connection's non-fetch requests: answered at once, in order.
    answers = c.send(*others(10))
    assert [codec.peek_correlation_id(f) for f in answers] == [10, 11, 12]
    # The same connection pipelines them behind its waiting fetch: they go upstream at
    # once (the broker sees the heartbeat and the commit in time), but Kafka answers a
    # connection's requests in order, so their answers are read after the fetch's.
    assert b.send(*others(3)) == []
    up = [codec.parse_request_header(f).api_key for f in b.upstream_frames]
    assert up == [1, METADATA, HEARTBEAT, OFFSET_COMMIT]
    hog.release()
    assert b.woken == 1
    b.read_upstream()
    answers = b.pump()
    assert [codec.peek_correlation_id(f) for f in answers] == [2, 3, 4, 5]
