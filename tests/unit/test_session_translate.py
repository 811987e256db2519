"""Sessionless full fetches served through one upstream session, checked against a model broker."""

from __future__ import annotations

import dataclasses
import sys
import uuid
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from support.fetch_messages import fetch_request, fetch_topics
from support.session_broker_model import ModelBroker

from proxy.protocol.codec import request_schema
from proxy.protocol.messages import make
from proxy.sessions.as_client import (
    FetchTranslator,
    UpstreamFetch,
    is_sessionless_fetch,
)
from proxy.sessions.as_client_session import SessionMetadata
from proxy.sessions.client_fetch import ClientFetch, ClientReply, TranslationError
from proxy.sessions.partition_cache import PartitionStateCache
from proxy.sessions.topic_ids import TopicIdMap

TOPICS = {"a": 3, "b": 2, "c": 1}


def _mod(version: int) -> Any:
    return sys.modules[request_schema(1, version).__module__]


def client_request(
    version: int,
    broker: ModelBroker,
    parts: list[tuple[str, int, int, int]],
    *,
    isolation: int = 0,
    rack: str = "",
) -> Any:
    """A sessionless consumer Fetch at *version* for (topic, partition, offset, max_bytes)."""
    mod = _mod(version)
    pairs = []
    for name, p, offset, max_bytes in parts:
        ref: Any = name
        if version >= 13:
            t = broker.topics.get(name)
            ref = t.topic_id if t is not None else uuid.UUID(int=hash(name) & (2**128 - 1))
        fp = make(
            mod.FetchPartition, partition=p, fetch_offset=offset, partition_max_bytes=max_bytes
        )
        pairs.append((ref, fp))
    return fetch_request(
        version,
        fetch_topics(version, pairs),
        max_wait=timedelta(milliseconds=500),
        isolation_level=isolation,
        rack_id=rack,
    )


def serve(translator: FetchTranslator, broker: ModelBroker, request: Any) -> tuple[Any, list[Any]]:
    """Drive one client fetch to completion; returns (client response, upstream requests)."""
    sent = []
    step: UpstreamFetch | ClientReply = translator.begin(request)
    while isinstance(step, UpstreamFetch):
        sent.append(step.request)
        assert len(sent) <= 1 + translator.max_resends
        step = translator.complete(broker.roundtrip(step.request))
    return step.response, sent


def learnt(broker: ModelBroker, names: list[str] | None = None) -> TopicIdMap:
    ids = TopicIdMap()
    for name, t in broker.topics.items():
        if names is None or name in names:
            ids.learn(name, t.topic_id)
    return ids


def all_parts(offset: int = 0, max_bytes: int = 100) -> list[tuple[str, int, int, int]]:
    return [(name, p, offset, max_bytes) for name, n in TOPICS.items() for p in range(n)]


# -- examples --------------------------------------------------------------------------------


def test_first_fetch_is_a_full_session_request_and_answers_everything() -> None:
    broker = ModelBroker(TOPICS)
    broker.produce("a", 0, 5)
    tr = FetchTranslator(learnt(broker), upstream_max_version=17)
    req = client_request(11, broker, all_parts())
    resp, sent = serve(tr, broker, req)
    assert len(sent) == 1
    assert (sent[0].session_id, sent[0].session_epoch) == (0, 0)
    assert sent[0].__version__ == 17
    assert resp == broker.sessionless(req)
    assert tr.session.next_metadata.epoch == 1


def test_idle_fetches_send_nothing_and_still_answer_every_partition() -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=17)
    req = client_request(11, broker, all_parts())
    serve(tr, broker, req)
    for epoch in (1, 2, 3):
        resp, sent = serve(tr, broker, req)
        assert (sent[0].session_epoch, sent[0].topics, sent[0].forgotten_topics_data) == (
            epoch,
            (),
            (),
        )
        assert resp == broker.sessionless(req)
        assert sum(len(t.partitions) for t in resp.responses) == 6


def test_new_data_and_altered_offsets() -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=17)
    serve(tr, broker, client_request(12, broker, all_parts()))
    broker.produce("b", 1, 3)
    req = client_request(12, broker, all_parts())
    resp, _ = serve(tr, broker, req)
    assert resp == broker.sessionless(req)
    b1 = next(
        p for t in resp.responses if t.topic == "b" for p in t.partitions if p.partition_index == 1
    )
    assert b1.records == b"b/1@0..3" and b1.high_watermark == 3
    # The client advances b-1 to 3: only that partition is sent, as altered.
    parts = [(n, p, 3 if (n, p) == ("b", 1) else 0, 100) for n, p, _, _ in all_parts()]
    req = client_request(12, broker, parts)
    resp, sent = serve(tr, broker, req)
    b_id = broker.topics["b"].topic_id
    assert [(t.topic_id, [p.fetch_offset for p in t.partitions]) for t in sent[0].topics] == [
        (b_id, [3])
    ]
    assert resp == broker.sessionless(req)


def test_partition_set_changes_are_mirrored_upstream() -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=12)
    serve(tr, broker, client_request(12, broker, all_parts()))
    req = client_request(12, broker, [("a", 0, 0, 100), ("c", 0, 0, 100)])
    resp, sent = serve(tr, broker, req)
    forgotten = {(t.topic, p) for t in sent[0].forgotten_topics_data for p in t.partitions}
    assert forgotten == {("a", 1), ("a", 2), ("b", 0), ("b", 1)}
    assert resp == broker.sessionless(req)
    session = broker.sessions[sent[0].session_id]
    assert set(session.parts) == {("a", 0), ("c", 0)}
    # Data on a forgotten partition is not fetched.
    broker.produce("b", 0, 4)
    resp, _ = serve(tr, broker, req)
    assert {t.topic for t in resp.responses} == {"a", "c"}


@pytest.mark.parametrize("fault", ["evict", "epoch", "corrupt"])
def test_session_resets_are_invisible_to_the_client(fault: str) -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=17)
    req = client_request(9, broker, all_parts())
    serve(tr, broker, req)
    serve(tr, broker, req)
    broker.produce("a", 2, 1)
    if fault == "evict":
        broker.sessions.clear()
    elif fault == "epoch":
        for s in broker.sessions.values():
            s.epoch += 5
    else:
        broker.corrupt_next = True
    resp, sent = serve(tr, broker, req)
    assert len(sent) == 2
    assert resp == broker.sessionless(req)
    expected_retry = (0, 0) if fault == "evict" else (sent[0].session_id, 0)
    assert (sent[1].session_id, sent[1].session_epoch) == expected_retry
    stats = tr.stats
    assert stats.resends == 1 and stats.last_problem
    assert (stats.session_errors, stats.invalid_responses) == (
        (0, 1) if fault == "corrupt" else (1, 0)
    )
    assert (stats.full_requests, stats.incremental_requests) == (2, 2)


def test_cache_full_falls_back_to_sessionless_fetches() -> None:
    broker = ModelBroker(TOPICS)
    broker.cache_full = True
    tr = FetchTranslator(learnt(broker), upstream_max_version=17, sessionless_backoff=1)
    req = client_request(17, broker, all_parts())
    epochs = []
    for _ in range(3):
        resp, sent = serve(tr, broker, req)
        assert resp == broker.sessionless(req)
        epochs.append(sent[0].session_epoch)
    assert epochs == [0, -1, 0]
    broker.cache_full = False
    _, sent = serve(tr, broker, req)  # still backing off after the third refusal
    assert sent[0].session_epoch == -1
    _, sent = serve(tr, broker, req)
    assert sent[0].session_epoch == 0
    assert tr.session.next_metadata.epoch == 1


def test_persistent_top_level_error_reaches_the_client() -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=17, max_resends=2)
    req = client_request(17, broker, all_parts())
    step = tr.begin(req)
    assert isinstance(step, UpstreamFetch)
    mod = sys.modules[type(broker.sessionless(req)).__module__]
    bad = mod.FetchResponse(
        throttle_time=timedelta(0), error_code=ErrorCode(58), session_id=0, responses=()
    )
    out: Any = step
    for _ in range(3):
        assert isinstance(out, UpstreamFetch)
        out = tr.complete(bad)
    assert isinstance(out, ClientReply)
    assert out.response.error_code == 58 and out.response.responses == ()
    # The last resend asked for no session at all.
    assert tr.session.next_metadata == SessionMetadata(0, 0)


def test_v4_client_gets_per_partition_errors_when_resends_run_out() -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=17, max_resends=1)
    req = client_request(4, broker, [("a", 0, 0, 100)])
    step = tr.begin(req)
    mod = sys.modules[type(broker.sessionless(client_request(17, broker, []))).__module__]
    bad = mod.FetchResponse(
        throttle_time=timedelta(0), error_code=ErrorCode(70), session_id=0, responses=()
    )
    assert isinstance(step, UpstreamFetch)
    step2 = tr.complete(bad)
    assert isinstance(step2, UpstreamFetch)
    reply = tr.complete(bad)
    assert isinstance(reply, ClientReply)
    [topic] = reply.response.responses
    assert [int(p.error_code) for p in topic.partitions] == [-1]


def test_names_client_through_id_upstream() -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=17)
    req = client_request(10, broker, [*all_parts(), ("nope", 0, 0, 100)])
    step = tr.begin(req)
    assert isinstance(step, UpstreamFetch)
    # "nope" has no id: the request falls back to names (v12) and asks for its id.
    assert step.request.__version__ == 12 and step.missing_topic_ids == ("nope",)
    reply = tr.complete(broker.roundtrip(step.request))
    assert isinstance(reply, ClientReply) and reply.response == broker.sessionless(req)
    req = client_request(10, broker, all_parts())
    resp, sent = serve(tr, broker, req)
    # All ids known now: upstream moves to ids, which takes a new full request.
    assert sent[0].__version__ == 17 and sent[0].session_epoch == 0
    assert resp == broker.sessionless(req)
    resp, sent = serve(tr, broker, req)
    assert sent[0].session_epoch == 1 and resp == broker.sessionless(req)


def test_stale_topic_id_maps_to_unknown_topic_for_name_clients() -> None:
    broker = ModelBroker(TOPICS)
    ids = learnt(broker)
    ids.learn("a", uuid.uuid4())  # stale: the broker does not know this id
    tr = FetchTranslator(ids, upstream_max_version=17)
    req = client_request(12, broker, [("a", 0, 0, 100)])
    resp, _ = serve(tr, broker, req)
    [topic] = resp.responses
    assert int(topic.partitions[0].error_code) == 3
    assert ids.id_for("a") is None  # forgotten, so the relay re-learns it


def test_id_client_through_name_upstream() -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=12)
    unknown = uuid.uuid4()
    req = client_request(13, broker, [("a", 0, 0, 100)])
    mod = _mod(13)
    req = make(
        mod.FetchRequest,
        max_wait=req.max_wait,
        min_bytes=1,
        topics=(*req.topics, mod.FetchTopic(topic_id=unknown, partitions=req.topics[0].partitions)),
        forgotten_topics_data=(),
    )
    step = tr.begin(req)
    assert isinstance(step, UpstreamFetch) and step.request.__version__ == 12
    assert [t.topic for t in step.request.topics] == ["a"]
    reply = tr.complete(broker.roundtrip(step.request))
    assert isinstance(reply, ClientReply)
    assert reply.response == broker.sessionless(req)


def test_throttled_upstream_gives_an_empty_throttled_response() -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=17)
    req = client_request(17, broker, all_parts())
    serve(tr, broker, req)
    broker.throttle_next = 250
    resp, _ = serve(tr, broker, req)
    assert resp.responses == () and resp.throttle_time == timedelta(milliseconds=250)
    resp, _ = serve(tr, broker, req)
    assert resp == broker.sessionless(req)


def test_preferred_replica_and_aborted_transactions_are_not_replayed() -> None:
    broker = ModelBroker(TOPICS)
    broker.topics["a"].partitions[0].preferred_replica = True
    broker.produce("a", 1, 4, transactional=True)
    broker.commit("a", 1)
    tr = FetchTranslator(learnt(broker), upstream_max_version=17)
    req = client_request(11, broker, all_parts(), isolation=1, rack="r1")
    resp, _ = serve(tr, broker, req)
    assert resp == broker.sessionless(req)
    broker.topics["a"].partitions[0].preferred_replica = False
    parts = [(n, p, 5 if (n, p) == ("a", 1) else 0, 100) for n, p, _, _ in all_parts()]
    req = client_request(11, broker, parts, isolation=1, rack="r1")
    resp, _ = serve(tr, broker, req)
    assert resp == broker.sessionless(req)
    a = next(t for t in resp.responses if t.topic == "a")
    assert [p.preferred_read_replica for p in a.partitions] == [-1, -1, -1]
    assert [p.aborted_transactions for p in a.partitions] == [(), (), ()]


def test_translator_refuses_session_clients_and_overlapping_fetches() -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=17)
    req = client_request(12, broker, all_parts())
    with pytest.raises(TranslationError):
        tr.complete(req)
    tr.begin(req)
    with pytest.raises(TranslationError):
        tr.begin(req)
    tr.abort()
    assert tr.session.next_metadata.epoch == 0
    session_req = make(_mod(12).FetchRequest, **{**_fields(req), "session_epoch": 0})
    assert not is_sessionless_fetch(session_req)
    # whose fetch it is is settled once, when the client's is decoded: a follower's never
    # reaches the sessions (the fetch path passes it through)
    follower = make(_mod(12).FetchRequest, **{**_fields(req), "replica_id": 1})
    assert ClientFetch.validate(follower) is None
    validated = ClientFetch.validate(req)
    assert validated is not None and validated.sessionless and validated.version == 12
    with pytest.raises(TranslationError):
        tr.begin(session_req)


def _fields(obj: Any) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}


def test_old_upstream_without_sessions() -> None:
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=6)
    req = client_request(5, broker, all_parts())
    for _ in range(2):
        resp, sent = serve(tr, broker, req)
        assert sent[0].__version__ == 6
        assert resp == broker.sessionless(req)


# -- the property ----------------------------------------------------------------------------

PARTITIONS = [(name, p) for name, n in TOPICS.items() for p in range(n)]

ops = st.one_of(
    st.tuples(st.just("produce"), st.sampled_from(PARTITIONS), st.integers(1, 5), st.booleans()),
    st.tuples(st.just("commit"), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("delete"), st.sampled_from(PARTITIONS), st.integers(1, 4)),
    st.tuples(st.just("preferred"), st.sampled_from(PARTITIONS)),
    st.tuples(st.just("seek"), st.sampled_from(PARTITIONS), st.integers(0, 30)),
    st.tuples(st.just("fault"), st.sampled_from(["evict", "epoch", "corrupt", "throttle", "full"])),
    st.tuples(st.just("learn")),
)
fetches = st.tuples(
    st.just("fetch"),
    st.one_of(
        st.lists(st.sampled_from([*PARTITIONS, ("ghost", 0), ("a", 7)]), unique=True),
        st.just(PARTITIONS),
    ),
    st.sampled_from([3, 100]),
)
# Fetches are what the property checks: make them as frequent as all other steps together.
steps_strategy = st.lists(
    st.booleans().flatmap(lambda fetch: fetches if fetch else ops), min_size=10, max_size=60
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    upstream_version=st.integers(4, 18),
    client_version=st.integers(4, 18),
    isolation=st.integers(0, 1),
    rack=st.sampled_from(["", "r1"]),
    known_ids=st.booleans(),
    steps=steps_strategy,
)
def test_synthesized_full_responses_equal_a_sessionless_broker(
    upstream_version: int,
    client_version: int,
    isolation: int,
    rack: str,
    known_ids: bool,
    steps: list[tuple[Any, ...]],
) -> None:
    client_version = min(client_version, upstream_version)  # the relay caps what clients see
    broker = ModelBroker(TOPICS)
    ids = learnt(broker, None if known_ids else ["a"])
    tr = FetchTranslator(ids, upstream_max_version=upstream_version, sessionless_backoff=2)
    positions = {tp: 0 for tp in [*PARTITIONS, ("ghost", 0), ("a", 7)]}
    for step in steps:
        kind = step[0]
        if kind == "produce":
            broker.produce(*step[1], step[2], transactional=step[3])
        elif kind == "commit":
            broker.commit(*step[1])
        elif kind == "delete":
            broker.delete_records(*step[1], step[2])
        elif kind == "preferred":
            part = broker.topics[step[1][0]].partitions[step[1][1]]
            part.preferred_replica = not part.preferred_replica
        elif kind == "seek":
            positions[step[1]] = step[2]
        elif kind == "learn":
            ids = learnt(broker)
            tr.topic_ids = ids
        elif kind == "fault":
            if step[1] == "evict":
                broker.sessions.clear()
            elif step[1] == "epoch":
                for s in broker.sessions.values():
                    s.epoch += 1
            elif step[1] == "corrupt":
                broker.corrupt_next = True
            elif step[1] == "throttle":
                broker.throttle_next = 10
            else:
                broker.cache_full = not broker.cache_full
        else:
            parts = [(t, p, positions[(t, p)], step[2]) for t, p in step[1]]
            req = client_request(client_version, broker, parts, isolation=isolation, rack=rack)
            resp, _ = serve(tr, broker, req)
            assert resp == broker.sessionless(req)
            # The upstream session mirrors exactly the partitions the client asked for.
            session = broker.sessions.get(tr.session.session_id)
            if session is not None:
                assert len(session.parts) == len(set(step[1]))
            # Move on like a consumer: past returned records, or to the log start when out of range.
            for t in resp.responses:
                name = t.topic if client_version < 13 else broker.by_id(t.topic_id)
                name = name if isinstance(name, str) else (name.name if name else None)
                for p in t.partitions:
                    if name is None or (name, p.partition_index) not in positions:
                        continue
                    if p.records:
                        end = int(p.records.decode().rsplit("..", 1)[1])
                        positions[(name, p.partition_index)] = end
                    elif int(p.error_code) == 1:
                        positions[(name, p.partition_index)] = (
                            broker.topics[name].partitions[p.partition_index].log_start_offset
                        )
        # The proxy's per-partition state stays bounded by what the client fetches.
        assert len(tr.cache) <= len(PARTITIONS) + 2


# -- defensive paths and small parts ---------------------------------------------------------


def test_an_omitted_partition_whose_last_report_was_an_error_resets_the_session() -> None:
    """After an error the broker must resend the partition; omitting it is a broken response."""
    broker = ModelBroker(TOPICS)
    tr = FetchTranslator(learnt(broker), upstream_max_version=12)
    req = client_request(12, broker, [("a", 0, 0, 100), ("a", 1, 99, 100)])  # a-1 out of range
    resp, _ = serve(tr, broker, req)
    assert [int(p.error_code) for p in resp.responses[0].partitions] == [0, 1]
    step = tr.begin(req)
    assert isinstance(step, UpstreamFetch) and step.request.session_epoch == 1
    mod = sys.modules[type(resp).__module__]
    lying = mod.FetchResponse(
        throttle_time=timedelta(0),
        error_code=ErrorCode(0),
        session_id=step.request.session_id,
        responses=(),
    )
    again = tr.complete(lying)
    assert isinstance(again, UpstreamFetch)
    assert (again.request.session_id, again.request.session_epoch) == (step.request.session_id, 0)
    reply = tr.complete(broker.roundtrip(again.request))
    assert isinstance(reply, ClientReply) and reply.response == broker.sessionless(req)


def test_partition_cache_bounds_and_lookup() -> None:
    cache = PartitionStateCache()
    a0, a1 = ("a", 0), ("a", 1)
    cache.record(a0, high_watermark=5, last_stable_offset=4, log_start_offset=1, error_code=0)
    cache.record(a1, high_watermark=-1, last_stable_offset=-1, log_start_offset=-1, error_code=1)
    state = cache.lookup(a0)
    assert state is not None and (state.high_watermark, state.last_stable_offset) == (5, 4)
    assert cache.lookup(a1) is None and cache.get(a1) is not None
    cache.retain([a1])
    assert a0 not in cache and len(cache) == 1


def test_topic_id_map_learns_from_metadata_and_stays_bounded() -> None:
    from kio.schema.metadata.v12 import response as md

    ids = TopicIdMap(max_topics=2)
    t1, t2, t3 = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()

    def topic(name: str, tid: uuid.UUID, code: int = 0) -> Any:
        return md.MetadataResponseTopic(
            error_code=ErrorCode(code), name=name, topic_id=tid, is_internal=False, partitions=()
        )

    resp = md.MetadataResponse(
        throttle_time=timedelta(0),
        brokers=(),
        cluster_id=None,
        controller_id=md.BrokerId(1),
        topics=(topic("x", t1), topic("y", t2), topic("bad", t3, code=3)),
    )
    ids.learn_metadata(resp)
    assert (ids.id_for("x"), ids.name_for(t2), ids.id_for("bad")) == (t1, "y", None)
    assert ids.missing_ids(["x", "bad", "bad", "z"]) == ["bad", "z"]
    ids.learn("x", t3)  # topic recreated
    assert ids.name_for(t1) is None and ids.name_for(t3) == "x"
    ids.learn("z", uuid.uuid4())
    assert len(ids) == 2 and ids.id_for("y") is None  # least recently learnt went first
    ids.learn("w", uuid.UUID(int=0))
    assert ids.id_for("w") is None
    ids.forget_name("x")
    assert ids.name_for(t3) is None
