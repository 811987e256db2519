"""The translator against the dev broker's own sans-I/O Fetch path and session cache.

A second, independent broker model (devbroker.fetch + proxy.sessions.as_broker_cache,
written from Kafka's broker) with real RecordBatch v2 bytes: for any sequence of
appends, session evictions and client fetches, the full response the translator
synthesizes from the upstream session equals what the same broker answers the
client's sessionless fetch directly.
"""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.dev_upstream import PARTITIONS, Upstream, client_fetch

from proxy.protocol import records
from proxy.protocol.codec import encode_request, encode_response
from proxy.sessions.as_client import FetchTranslator, UpstreamFetch
from proxy.sessions.client_fetch import ClientReply


def serve(tr: FetchTranslator, up: Upstream, request: Any) -> tuple[Any, list[Any]]:
    sent = []
    step: UpstreamFetch | ClientReply = tr.begin(request)
    while isinstance(step, UpstreamFetch):
        sent.append(step.request)
        step = tr.complete(up.answer(up.fetcher, step.request))
    return step.response, sent


def other_step(up: Upstream, positions: dict[tuple[str, int], int], step: tuple[Any, ...]) -> bool:
    """Apply an append, an eviction of the upstream sessions or a seek; False: a fetch."""
    if step[0] == "append":
        up.append(*step[1], step[2])
    elif step[0] == "evict":
        up.sessions.clear()
    elif step[0] == "seek":
        positions[step[1]] = step[2]
    else:
        return False
    return True


def advance(
    positions: dict[tuple[str, int], int], up: Upstream, client_version: int, resp: Any
) -> None:
    """The client's next offsets after *resp*: past the records it got, 0 after an
    OFFSET_OUT_OF_RANGE."""
    for t in resp.responses:
        name = t.topic if client_version < 13 else up.state.topics_by_id[t.topic_id].name
        for pd in t.partitions:
            if pd.records:
                positions[(name, int(pd.partition_index))] = list(records.iter_batches(pd.records))[
                    -1
                ].next_offset
            elif int(pd.error_code) == 1:
                positions[(name, int(pd.partition_index))] = 0


other_steps = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(PARTITIONS), st.integers(1, 4)),
    st.tuples(st.just("evict")),
    st.tuples(st.just("seek"), st.sampled_from(PARTITIONS), st.integers(0, 12)),
)
fetch_steps = st.tuples(
    st.just("fetch"),
    st.one_of(st.lists(st.sampled_from(PARTITIONS), unique=True), st.just(PARTITIONS)),
)
step_strategy = st.booleans().flatmap(lambda fetch: fetch_steps if fetch else other_steps)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    upstream_version=st.integers(7, 18),
    client_version=st.integers(4, 18),
    max_slots=st.sampled_from([0, 1000]),
    steps=st.lists(step_strategy, min_size=5, max_size=40),
)
def test_synthesized_responses_equal_the_dev_broker_sessionless_answer(
    upstream_version: int, client_version: int, max_slots: int, steps: list[tuple[Any, ...]]
) -> None:
    client_version = min(client_version, upstream_version)
    up = Upstream(max_slots=max_slots)
    tr = FetchTranslator(up.ids(), upstream_max_version=upstream_version)
    positions = dict.fromkeys(PARTITIONS, 0)
    for step in steps:
        if other_step(up, positions, step):
            continue
        req = client_fetch(up, client_version, [(t, p, positions[(t, p)]) for t, p in step[1]])
        resp, _ = serve(tr, up, req)
        assert resp == up.answer(up.direct, req)
        session = up.sessions.get(tr.session.session_id)
        if session is not None:  # the upstream session mirrors the client's partitions
            assert session.size == len(step[1])
        advance(positions, up, client_version, resp)


def test_idle_consumer_sends_and_receives_almost_nothing_upstream() -> None:
    """The point of the exercise: an idle full-fetch consumer costs O(changes), not O(partitions)."""
    up = Upstream()
    tr = FetchTranslator(up.ids(), upstream_max_version=17)
    req = client_fetch(up, 11, [(t, p, 0) for t, p in PARTITIONS])
    first, sent = serve(tr, up, req)
    full_bytes = len(encode_request(sent[0], 1, "t"))
    for _ in range(3):
        resp, sent = serve(tr, up, req)
        assert resp == first
        upstream_response = up.answer(up.direct, req)
        assert resp == upstream_response
        assert sent[0].topics == () and sent[0].forgotten_topics_data == ()
        assert len(encode_request(sent[0], 1, "t")) < full_bytes / 3


def test_idle_thousand_partition_consumer_moves_twenty_times_fewer_bytes() -> None:
    """The issue's measurement at the sans-I/O level: bytes per idle fetch round, both ways."""
    up = Upstream()
    for i in range(10):
        up.state.create_topic(f"t{i}", 100)
    parts = [(f"t{i}", p, 0) for i in range(10) for p in range(100)]
    tr = FetchTranslator(up.ids(), upstream_max_version=17)
    for version in (4, 11, 12):  # librdkafka, aiokafka, ... speak names
        req = client_fetch(up, version, parts)
        direct = len(encode_request(req, 1, "rdkafka")) + len(
            encode_response(up.answer(up.direct, req), 1)
        )
        serve(tr, up, req)  # the session's full fetch
        step = tr.begin(req)
        assert isinstance(step, UpstreamFetch)
        upstream_response = up.answer(up.fetcher, step.request)
        proxied = len(encode_request(step.request, 1, "proxy")) + len(
            encode_response(upstream_response, 1)
        )
        reply = tr.complete(upstream_response)
        assert isinstance(reply, ClientReply) and reply.response == up.answer(up.direct, req)
        assert direct >= 20 * proxied, (direct, proxied)


def serve_repeating(
    tr: FetchTranslator, up: Upstream, request: Any, last: tuple[Any, Any] | None
) -> tuple[Any, bool]:
    """``serve``, as the fetch path serves a fetch equal to the last one answered from an
    idle session: ``repeat``, then ``complete_quiet`` (the last answer again) or, when
    upstream had something, ``complete`` as usual.  (answer, whether it was the last one)."""
    step: UpstreamFetch | ClientReply | None = None
    if last is not None and last[0] == request and tr.quiet:
        step = tr.repeat()
        if step is not None:
            assert step.request.topics == () and step.request.forgotten_topics_data == ()
            answer = up.answer(up.fetcher, step.request)
            if tr.complete_quiet(answer):
                return last[1], True
            step = tr.complete(answer)
    if step is None:
        step = tr.begin(request)
    while isinstance(step, UpstreamFetch):
        step = tr.complete(up.answer(up.fetcher, step.request))
    return step.response, False


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    upstream_version=st.integers(7, 18),
    client_version=st.integers(4, 18),
    max_slots=st.sampled_from([0, 1000]),
    steps=st.lists(st.one_of(st.tuples(st.just("again")), step_strategy), min_size=5, max_size=40),
)
def test_a_repeated_fetch_gets_what_the_broker_answers_directly(
    upstream_version: int, client_version: int, max_slots: int, steps: list[tuple[Any, ...]]
) -> None:
    """Repeats (the same fetch again, answered from the idle session with no walk of its
    partitions) between appends, evictions of the upstream session and seeks: every
    answer is the dev broker's answer to the client's sessionless fetch, and an idle
    session's answer is repeated once it has been quiet."""
    client_version = min(client_version, upstream_version)
    up = Upstream(max_slots=max_slots)
    tr = FetchTranslator(up.ids(), upstream_max_version=upstream_version)
    positions = dict.fromkeys(PARTITIONS, 0)
    last: tuple[Any, Any] | None = None
    wanted = list(PARTITIONS)
    for step in steps:
        if other_step(up, positions, step):
            continue
        if step[0] == "fetch":
            wanted = step[1]
        req = client_fetch(up, client_version, [(t, p, positions[(t, p)]) for t, p in wanted])
        resp, repeated = serve_repeating(tr, up, req, last)
        assert resp == up.answer(up.direct, req)
        last = (req, resp)
        if not repeated:
            advance(positions, up, client_version, resp)


def test_an_idle_session_repeats_with_no_partition_sent() -> None:
    up = Upstream()
    tr = FetchTranslator(up.ids(), upstream_max_version=17)
    req = client_fetch(up, 11, [(t, p, 0) for t, p in PARTITIONS])
    last = None
    repeats = []
    for _ in range(4):
        resp, repeated = serve_repeating(tr, up, req, last)
        assert resp == up.answer(up.direct, req)
        repeats.append(repeated)
        last = (req, resp)
    # the full fetch, then the first incremental (quiet), then repeats
    assert repeats == [False, False, True, True]
    up.append("orders", 2, 3)  # data: the repeat's answer is not empty, complete takes it
    resp, repeated = serve_repeating(tr, up, req, last)
    assert not repeated and resp == up.answer(up.direct, req)
    assert any(pd.records for t in resp.responses for pd in t.partitions)
    assert not tr.quiet
