"""The partitions of the fetches being processed are bounded for the process (issue 19,
``max_partitions_in_flight``; attack ``nine-big-fetches``).

The harness is test_fetchpath's (the real Relay, the dev broker's dispatcher upstream,
``Conn.with_edge`` as the trio edge).  A fetch takes its partitions before it is decoded
and gives them back once its answer is written or its connection closes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from support.fetch_world import Conn, World, delivered

from proxy import config
from proxy.config import FetchPathConfig
from proxy.fetchpath import FetchPath
from proxy.observe.metrics import PREFIX, Metrics
from proxy.protocol import codec
from proxy.relay.relay import ClientRequest
from proxy.shaping.in_flight import SMALL_FETCH_PARTITIONS, KeptDecodes, PartitionsInFlight

N = SMALL_FETCH_PARTITIONS + 100
"""A large fetch's partitions (it takes from the bound)."""


def world(limit: int, metrics: Any = None) -> tuple[World, list[tuple[str, int, int]]]:
    w = World(FetchPathConfig(max_partitions_in_flight=limit), metrics=metrics)
    w.state.create_topic("big", N)
    for p in range(0, N, 97):
        w.append("big", p, 2)
    return w, [("big", p, 0) for p in range(N)]


def answered(conns: list[Conn], rounds: int = 200) -> dict[int, Any]:
    """Pump every connection, round robin, as their edges would, until each is answered;
    the partitions in flight are checked after every turn."""
    out: dict[int, Any] = {}
    bound = conns[0].world.path.in_flight
    for _ in range(rounds):
        for i, c in enumerate(conns):
            for frame in c.pump():
                out[i] = codec.decode_response(1, 12, frame)[1]
            assert bound.used <= max(bound.limit, N)
        if len(out) == len(conns):
            return out
    raise AssertionError(f"only {sorted(out)} of {len(conns)} answered")


class _Waiter:
    def __init__(self) -> None:
        self.woken = 0

    def wake(self) -> None:
        self.woken += 1


def test_the_bound_is_first_come_first_served_and_lets_a_larger_fetch_in_alone() -> None:
    bound = PartitionsInFlight(1000)
    a, b, c = _Waiter(), _Waiter(), _Waiter()
    assert bound.take(a, 10) == 0  # a small fetch takes nothing and never waits
    assert bound.take(a, 1500) == 1500  # larger than the bound, nothing else in flight
    assert bound.take(b, 600) is None and bound.take(c, 600) is None
    assert bound.waiting == 2 and bound.waits == 2
    assert bound.take(c, 600) is None  # c asks again: still behind b
    assert bound.take(b, 10) == 0  # small ones pass the line
    bound.give_back(1500)
    assert (b.woken, c.woken) == (1, 0)  # only the first in line is told
    assert bound.take(b, 600) == 600 and c.woken == 0  # c does not fit beside it
    bound.leave(c)
    assert bound.waiting == 0 and bound.waits == 2
    bound.give_back(600)
    assert bound.used == 0 and bound.peak_used == 1500


def test_concurrent_large_fetches_never_exceed_the_bound_and_all_are_answered() -> None:
    metrics = Metrics(process_metrics=False)
    w, parts = world(2 * N + 50, metrics)
    conns = [Conn(w).with_edge() for _ in range(5)]
    for c in conns:
        c.relay.client_frame(c.fetch_frame(1, parts))
    bound = w.path.in_flight
    assert bound.used == 2 * N and bound.waiting == 3  # taken before any decode
    value = metrics.registry.get_sample_value
    assert value(f"{PREFIX}partitions_in_flight_waits_total") == 3
    assert value(f"{PREFIX}partitions_in_flight") == 2 * N
    out = answered(conns)
    expected = delivered(Conn(w).fetch(1, parts))  # served alone
    assert all(delivered(r) == expected for r in out.values())
    assert bound.peak_used == 2 * N and bound.used == 0 and bound.waiting == 0
    assert value(f"{PREFIX}partitions_in_flight") == 0


def test_a_fetch_over_the_bound_is_let_in_alone_and_the_next_waits_for_it() -> None:
    w, parts = world(100)
    a, b = Conn(w).with_edge(), Conn(w).with_edge()
    a.relay.client_frame(a.fetch_frame(1, parts))
    b.relay.client_frame(b.fetch_frame(1, parts))
    bound = w.path.in_flight
    assert bound.used == N and bound.waiting == 1
    out = answered([a, b])
    assert len(out) == 2 and bound.peak_used == N and bound.used == 0


def test_small_fetches_of_other_connections_are_answered_while_a_large_one_waits() -> None:
    w, parts = world(N)
    a, b, small = Conn(w).with_edge(), Conn(w).with_edge(), Conn(w).with_edge()
    assert a.send(a.fetch_frame(1, parts), answer=False) == []  # in flight upstream
    b.relay.client_frame(b.fetch_frame(1, parts))
    assert w.path.in_flight.waiting == 1 and not b.relay.take_upstream()
    for cid in range(1, 4):
        assert delivered(small.fetch(cid, [("big", 0, 0)])) == {("big", 0): [(0, 2)]}
    assert b.pump() == []  # still waiting
    assert len(a.release_held()) == 1  # a answered and written: b goes in
    assert b.woken and len(b.pump()) == 1
    assert w.path.in_flight.used == 0


def test_the_count_returns_to_zero_after_a_session_error() -> None:
    w, parts = world(N)
    c = Conn(w).with_edge()
    request = codec.decode_request(c.fetch_frame(1, parts))[1]
    unknown = dataclasses.replace(request, session_id=12345, session_epoch=3)
    [out] = c.send(codec.encode_request(unknown, 1, "rdkafka"))
    assert codec.decode_response(1, 12, out)[1].error_code != 0  # FETCH_SESSION_ID_NOT_FOUND
    assert w.path.in_flight.used == 0 and w.path.in_flight.peak_used == N


def test_the_count_returns_to_zero_when_connections_close_at_any_point() -> None:
    w, parts = world(N)
    bound = w.path.in_flight
    # Closed between two slices of its fetch; a waiter behind it is then let in.
    a, b = Conn(w).with_edge(), Conn(w).with_edge()
    a.relay.client_frame(a.fetch_frame(1, parts))
    b.relay.client_frame(b.fetch_frame(1, parts))
    a.wakes -= 1
    a.handler.resume()  # decoding
    assert bound.used == N and bound.waiting == 1
    a.handler.close()
    assert bound.used == 0 and b.woken  # b asks again from its edge's turn
    # Closed while waiting upstream for the answer (the cancel of an in-flight fetch).
    assert b.pump(answer=False) == [] and b.held
    assert bound.waiting == 0 and bound.used == N
    c = Conn(w).with_edge()
    c.relay.client_frame(c.fetch_frame(1, parts))
    assert bound.waiting == 1
    c.handler.close()  # closed while waiting for the bound
    assert bound.waiting == 0 and bound.used == N
    b.handler.close()
    assert bound.used == 0
    # Answered but not written yet (written() never came): closing gives it back.
    d = Conn(w).with_edge()
    d.relay.client_frame(d.fetch_frame(1, parts))
    for _ in range(100):
        while d.wakes:
            d.wakes -= 1
            d.handler.resume()
        frames = d.relay.take_upstream()
        if not frames and not d.wakes:
            break
        for f in frames:
            d.relay.upstream_frame(w.answer(f))
    assert d.relay.take_client() and bound.used == N  # answered, not written
    d.handler.close()
    assert bound.used == 0 and bound.waiting == 0


def test_the_setting_comes_from_the_environment_and_zero_is_refused() -> None:
    env = {"KAFKA_FETCH_PROXY_UPSTREAM": "k:9092"}
    assert FetchPathConfig.from_raw(config.load(env=env).raw).max_partitions_in_flight == 20_000
    env["KAFKA_FETCH_PROXY_MAX_PARTITIONS_IN_FLIGHT"] = "5000"
    fetch_config = FetchPathConfig.from_raw(config.load(env=env).raw)
    assert FetchPath(fetch_config).in_flight.limit == 5000
    env["KAFKA_FETCH_PROXY_MAX_PARTITIONS_IN_FLIGHT"] = "0"
    with pytest.raises(config.ConfigError, match=r"max_partitions_in_flight.*value 0"):
        config.load(env=env)


# -- large fetches' decodes kept for their connection's next fetch (KeptDecodes) -----------


class _Keeper:
    def __init__(self) -> None:
        self.forgotten = 0

    def forget_decode(self) -> None:
        self.forgotten += 1


def test_kept_decodes_stay_within_the_limit_the_oldest_forgotten_first() -> None:
    kept = KeptDecodes(1000)
    a, b, c = _Keeper(), _Keeper(), _Keeper()
    assert kept.keep(a, 600) and kept.keep(b, 300)
    assert kept.keep(a, 650)  # in place of its own: nobody else forgets
    assert kept.used == 950 and (a.forgotten, b.forgotten) == (0, 0)
    assert kept.keep(c, 400)  # room: the oldest (b, then a) forget theirs until it fits
    assert (b.forgotten, a.forgotten, c.forgotten) == (1, 1, 0) and kept.used == 400
    assert not kept.keep(a, 1001) and kept.used == 400  # larger than the limit: not kept
    kept.configure(100)  # a reload's smaller limit
    assert c.forgotten == 1 and kept.used == 0
    kept.drop(c)  # dropping what is no longer kept changes nothing
    assert kept.used == 0


def test_a_large_fetch_keeps_its_decode_within_the_count_and_a_close_gives_it_back() -> None:
    """The next fetch of the same partitions, one offset moved, decodes only that entry
    (its other entries are the kept decode's own objects) and answers as a whole decode;
    a second connection's kept decode makes the first forget its own."""
    w, parts = world(N)
    moved = [("big", 0, 2), *parts[1:]]
    alone = Conn(w)
    expected = delivered(alone.fetch(1, moved))  # decoded whole
    alone.handler.close()
    a, b = Conn(w).with_edge(), Conn(w).with_edge()
    a.fetch(1, parts)
    kept = w.path.kept_decodes
    assert kept.used == N and w.path.in_flight.used == 0
    remembered = a.handler._last_decoded
    assert remembered is not None and remembered.parts is not None
    assert delivered(a.fetch(2, moved)) == expected
    now = a.handler._last_decoded
    assert now is not None and now is not remembered
    assert now.decoded.topics[0].partitions[1] is remembered.decoded.topics[0].partitions[1]
    assert kept.used == N
    b.fetch(1, parts)  # room for one (max_partitions_in_flight N): a forgets its own
    assert a.handler._last_decoded is None and kept.used == N
    assert delivered(a.fetch(3, moved)) == expected  # decoded whole
    b.handler.close()
    a.handler.close()
    assert kept.used == 0


def test_a_decode_that_ends_after_its_connection_closed_keeps_nothing() -> None:
    w, parts = world(N)
    c = Conn(w).with_edge()
    frame = c.fetch_frame(1, parts)
    request = codec.parse_request_header(frame)
    handler = c.handler
    handler._claim = N  # as taken from the bound before its decode
    ranges = handler._decode_in_ranges(ClientRequest(request, frame, lambda: None, None), 100)
    next(ranges)  # between two slices
    handler.close()
    assert codec.drain(ranges).topics  # decoded all the same
    assert w.path.kept_decodes.used == 0 and handler._last_decoded is None
