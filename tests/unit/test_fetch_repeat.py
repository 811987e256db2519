"""A sessionless client's fetch, the same again, is answered with the last answer when the
upstream session says nothing changed (``FetchPathHandler._repeat_of``), with no stage
walking its partitions; anything else upstream runs those stages then.  The answers
are checked against the dev broker's own answer to the client's sessionless fetch.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from support.fetch_messages import fetch_body, partition_body
from support.fetch_world import ALL, Conn, World, delivered, upstream_fetches
from support.rawclient import make_request

from proxy import fetchpath
from proxy.config import FetchPathConfig
from proxy.effects import FetchRepeated, SessionSaved, ShapedReport
from proxy.observe.metrics import Metrics
from proxy.protocol import codec
from proxy.protocol.error_codes import FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH
from proxy.protocol.messages import replaced
from proxy.shaping.limits import Limits


def direct(w: World, c: Conn, cid: int, parts: list[tuple[str, int, int]]) -> Any:
    return codec.decode_response(1, 12, w.answer(c.fetch_frame(cid, parts), w.direct))[1]


def _marks(response: Any) -> dict[tuple[str, int], tuple[int, int, int]]:
    return {
        (t.topic, int(p.partition_index)): (
            int(p.high_watermark),
            int(p.last_stable_offset),
            int(p.log_start_offset),
        )
        for t in response.responses
        for p in t.partitions
    }


def answer(c: Conn, cid: int, parts: list[tuple[str, int, int]]) -> bytes:
    [out] = c.send(c.fetch_frame(cid, parts))
    return out


def test_the_same_fetch_again_gets_the_last_answer_from_an_idle_session(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w = World()
    c = Conn(w).with_edge()
    first = [answer(c, cid, ALL) for cid in (1, 2)]  # the session's full fetch, then idle
    assert c.handler.repeats == 0
    decoded = []
    decode = fetchpath.decode_fetch_response_in_ranges
    monkeypatch.setattr(
        fetchpath,
        "decode_fetch_response_in_ranges",
        lambda *a: decoded.append(1) or decode(*a),  # type: ignore[func-returns-value]
    )
    again = [answer(c, cid, ALL) for cid in (3, 4, 5)]
    assert c.handler.repeats == 3
    assert decoded == []  # upstream's "nothing changed" is read from its bytes
    for cid, frame in enumerate(first + again, 1):
        assert frame[:4] == cid.to_bytes(4, "big")
        assert frame[4:] == first[1][4:]
        assert codec.decode_response(1, 12, frame)[1] == direct(w, c, cid, ALL)
    sent = upstream_fetches(c)
    assert len(sent) == 5  # one upstream round each, at the session's next epoch
    assert [int(r.session_epoch) for r in sent[2:]] == [2, 3, 4]
    assert all(r.topics == () and r.forgotten_topics_data == () for r in sent[1:])


def test_the_same_partitions_in_another_order_are_the_same_fetch() -> None:
    """librdkafka moves its first partition to the end on every fetch."""
    w = World()
    c = Conn(w).with_edge()
    answer(c, 1, ALL)
    answer(c, 2, ALL)
    rotated = ALL[3:] + ALL[:3]
    out = answer(c, 3, rotated)
    assert c.handler.repeats == 1
    got = codec.decode_response(1, 12, out)[1]
    assert delivered(got) == delivered(direct(w, c, 3, rotated))


def test_data_upstream_runs_the_skipped_stages_and_delivers_it() -> None:
    w = World(FetchPathConfig(limits=Limits(max_records=2)))
    c = Conn(w).with_edge()
    for cid in (1, 2, 3):
        answer(c, cid, ALL)
    assert c.handler.repeats == 1
    w.append("orders", 1, 1, times=3)  # three batches: the cap of 2 records trims
    got = codec.decode_response(1, 12, answer(c, 4, ALL))[1]
    assert c.handler.repeats == 1  # (it went upstream as a repeat; the answer was new)
    assert delivered(got)[("orders", 1)] == [(0, 1), (1, 1)]
    assert _marks(got)[("orders", 1)] == (3, 3, 0)
    # the rest comes next, from what the proxy held: no repeat while it holds data
    parts = [(t, p, 2 if (t, p) == ("orders", 1) else 0) for t, p, _ in ALL]
    assert delivered(codec.decode_response(1, 12, answer(c, 5, parts))[1])[("orders", 1)] == [
        (2, 1)
    ]
    assert c.handler.repeats == 1
    # idle again at the new offsets (which the upstream session learned when the proxy
    # fetched the three batches): quiet at once, then repeated
    parts = [(t, p, 3 if (t, p) == ("orders", 1) else 0) for t, p, _ in ALL]
    for cid in (6, 7, 8):
        got = codec.decode_response(1, 12, answer(c, cid, parts))[1]
        want = direct(w, c, cid, parts)  # (in the shaper's order: compared per partition)
        assert delivered(got) == delivered(want) and _marks(got) == _marks(want)
    assert c.handler.repeats == 3


def test_another_fetch_is_not_a_repeat() -> None:
    w = World()
    c = Conn(w).with_edge()
    answer(c, 1, ALL)
    answer(c, 2, ALL)
    moved = [(t, p, 5 if (t, p) == ("events", 2) else 0) for t, p, _ in ALL]
    got = codec.decode_response(1, 12, answer(c, 3, moved))[1]
    assert c.handler.repeats == 0
    assert got == direct(w, c, 3, moved)
    fewer = ALL[:-1]
    answer(c, 4, fewer)
    assert c.handler.repeats == 0


def test_an_evicted_upstream_session_is_found_out_by_the_repeat() -> None:
    w = World()
    c = Conn(w).with_edge()
    for cid in (1, 2, 3):
        answer(c, cid, ALL)
    assert c.handler.repeats == 1
    w.upstream_sessions.clear()  # FETCH_SESSION_ID_NOT_FOUND for the next epoch
    w.append("events", 0, 2)
    got = codec.decode_response(1, 12, answer(c, 4, ALL))[1]
    assert got == direct(w, c, 4, ALL)
    assert delivered(got)[("events", 0)] == [(0, 2)]


def test_a_repeat_answered_with_a_session_error_resends_the_whole_fetch() -> None:
    """INVALID_FETCH_SESSION_EPOCH closes the upstream session and the next request is full
    under the same session id (``FetchSessionHandler``): the resend names every partition,
    not the idle session's last request (which named none) at epoch 0."""
    w = World()
    c = Conn(w).with_edge()
    for cid in (1, 2, 3):
        answer(c, cid, ALL)
    assert c.handler.repeats == 1
    (session,) = w.upstream_sessions.sessions()
    session.epoch += 5  # the next repeat's epoch is stale: INVALID_FETCH_SESSION_EPOCH
    sent_before = len(upstream_fetches(c))
    w.append("events", 0, 2)
    got = codec.decode_response(1, 12, answer(c, 4, ALL))[1]
    assert delivered(got)[("events", 0)] == [(0, 2)]
    assert got == direct(w, c, 4, ALL)
    repeat, resend = upstream_fetches(c)[sent_before:]
    assert repeat.topics == () and int(repeat.session_id) == session.id
    # the whole fetch again, as a new session (epoch 0), in one round
    assert int(resend.session_epoch) == 0
    assert sorted((t.topic, int(p.partition)) for t in resend.topics for p in t.partitions) == (
        sorted((t, p) for t, p, _ in ALL)
    )


def test_a_repeat_reports_as_a_shaped_response_does() -> None:
    w = World()
    c = Conn(w).with_edge()
    for cid in (1, 2):
        answer(c, cid, ALL)
    c.handler.effects.take()
    answer(c, 3, ALL)
    assert c.handler.repeats == 1
    effects, dropped = c.handler.effects.take()
    assert dropped == 0
    repeated, report, saved = effects
    assert repeated == FetchRepeated()
    assert isinstance(report, ShapedReport) and report.correlation_id == 3
    assert report.decision.delivered_records == 0 and report.upstream_fetch_bytes > 0
    assert isinstance(saved, SessionSaved) and saved.request_bytes > 0


def test_repeats_are_counted_in_the_metrics() -> None:
    metrics = Metrics(process_metrics=False)
    w = World(metrics=metrics)
    c = Conn(w).with_edge()
    for cid in range(1, 6):
        answer(c, cid, ALL)
    assert metrics.registry.get_sample_value("kafka_fetch_proxy_repeated_fetches_total") == 3


def test_a_large_fetch_repeats_and_gives_its_partitions_back() -> None:
    """More than SLICE_PARTITIONS partitions: served in slices, counted in
    max_partitions_in_flight while served, none kept once answered (the repeat keeps
    bytes, not the decoded fetch), and data found by a repeat is delivered."""
    n = fetchpath.SLICE_PARTITIONS + 100
    w = World(FetchPathConfig(max_partitions_in_flight=n))
    w.state.create_topic("big", n)
    c = Conn(w).with_edge()
    parts = [("big", p, 0) for p in range(n)]
    for cid in range(1, 5):
        got = codec.decode_response(1, 12, answer(c, cid, parts))[1]
        assert got == direct(w, c, cid, parts)
        assert w.path.in_flight.used == 0
    assert c.handler.repeats == 2
    w.append("big", n - 1, 2)
    got = codec.decode_response(1, 12, answer(c, 5, parts))[1]
    assert delivered(got)[("big", n - 1)] == [(0, 2)]
    assert _marks(got) == _marks(direct(w, c, 5, parts))
    assert c.handler.repeats == 2 and w.path.in_flight.used == 0


# -- a session client's idle fetch (KIP-227: an incremental fetch naming nothing) ----------


def session_frame(
    cid: int, session_id: int, epoch: int, parts: list[tuple[str, int, int]], version: int = 12
) -> bytes:
    """A session client's Fetch (Java's consumer): *parts* listed (none: nothing changed)."""
    topics: dict[str, list[Any]] = {}
    for topic, p, offset in parts:
        topics.setdefault(topic, []).append(partition_body(p, offset, 1 << 20))
    body = fetch_body(
        [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        session_id=session_id,
        session_epoch=epoch,
        max_wait=timedelta(0),  # (the dev broker here answers at once, never waits)
    )
    return codec.encode_request(make_request(1, version, body), cid, "java")


class SessionClient:
    """The same session fetches sent to the proxy (through *c*) and to the dev broker
    directly, each with the session id its side gave; answers compared but for that id."""

    def __init__(self, w: World, c: Conn) -> None:
        self.w, self.c = w, c
        self.ids = {"proxy": 0, "direct": 0}
        self.epoch = 0

    def fetch(
        self, cid: int, parts: list[tuple[str, int, int]], epoch: int | None = None
    ) -> tuple[Any, Any]:
        e = self.epoch if epoch is None else epoch
        [out] = self.c.send(session_frame(cid, self.ids["proxy"], e, parts))
        mine = codec.decode_response(1, 12, out)[1]
        theirs = codec.decode_response(
            1, 12, self.w.answer(session_frame(cid, self.ids["direct"], e, parts), self.w.direct)
        )[1]
        if epoch is None and int(mine.error_code) == 0:
            if e == 0:
                self.ids = {"proxy": int(mine.session_id), "direct": int(theirs.session_id)}
            self.epoch = e + 1
        return mine, theirs


def same_but_session(mine: Any, theirs: Any) -> bool:
    return bool(replaced(mine, session_id=0) == replaced(theirs, session_id=0))


def test_a_session_clients_idle_fetch_again_gets_the_last_answer() -> None:
    """A Java consumer with nothing new to read sends an incremental fetch naming no
    partition, at the next epoch, round after round: once the upstream session is idle,
    it is answered with the last answer's bytes (the session's epoch moving on as Kafka's
    does) and no stage walks the session's partitions; data upstream runs them again."""
    w = World()
    c = Conn(w).with_edge()
    s = SessionClient(w, c)
    mine, theirs = s.fetch(1, ALL)  # the full fetch creates the session
    assert same_but_session(mine, theirs) and int(mine.session_id) > 0
    for cid in range(2, 8):
        mine, theirs = s.fetch(cid, [])
        assert same_but_session(mine, theirs) and mine.responses == ()
    assert c.handler.repeats >= 4
    repeats = c.handler.repeats
    w.append("events", 0, 2)
    mine, theirs = s.fetch(8, [])
    assert same_but_session(mine, theirs)
    assert delivered(mine) == {("events", 0): [(0, 2)]}
    assert c.handler.repeats == repeats  # (upstream had data: the stages ran)
    mine, theirs = s.fetch(9, [("events", 0, 2)])
    assert same_but_session(mine, theirs) and mine.responses == ()
    for cid in range(10, 14):
        assert same_but_session(*s.fetch(cid, []))
    assert c.handler.repeats > repeats
    # an old epoch is refused as Kafka refuses it, not repeated
    mine, theirs = s.fetch(14, [], epoch=s.epoch - 2)
    assert int(mine.error_code) == int(theirs.error_code) == INVALID_FETCH_SESSION_EPOCH
    assert same_but_session(*s.fetch(15, []))


def test_a_session_evicted_under_a_repeat_gets_the_session_error() -> None:
    """The session leaves the cache while a repeat's upstream round is out (another
    connection's session took its place): the client gets FETCH_SESSION_ID_NOT_FOUND,
    as a broker answers a fetch of a session it no longer has."""
    w = World()
    c = Conn(w).with_edge()
    s = SessionClient(w, c)
    s.fetch(1, ALL)
    for cid in range(2, 5):
        s.fetch(cid, [])
    repeats = c.handler.repeats
    assert repeats >= 1
    assert c.send(session_frame(5, s.ids["proxy"], s.epoch, []), answer=False) == []
    assert c.handler.repeats == repeats and c.held  # the repeat's round is out
    cache = w.path.sessions_for(1)
    cache.remove(s.ids["proxy"])
    [out] = c.release_held()
    got = codec.decode_response(1, 12, out)[1]
    assert int(got.error_code) == FETCH_SESSION_ID_NOT_FOUND and got.responses == ()
    assert c.handler.repeats == repeats
