"""Clients that use fetch sessions themselves, served by the proxy as their session broker.

The reference is the dev broker answering the same client directly: for any
sequence of session requests (built by a Java-style session handler), appends
and evictions, the client gets byte-for-byte the same responses through the
proxy (downstream session cache + upstream session via the translator) as from
the broker itself, including session ids, epochs, errors and which partitions
an incremental response includes.
"""

from __future__ import annotations

import random
import sys
import uuid
from datetime import timedelta
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.dev_upstream import PARTITIONS, Upstream
from support.fetch_messages import fetch_request, fetch_topics

from devbroker.fetch import NodeFetcher
from proxy.protocol import records
from proxy.protocol.codec import request_schema
from proxy.protocol.messages import make
from proxy.protocol.partition_key import PartitionKey
from proxy.protocol.partition_plan import PartitionPlan
from proxy.sessions.as_broker import DownstreamSessions
from proxy.sessions.as_broker_cache import FetchSessionCache
from proxy.sessions.as_client import FetchTranslator, UpstreamFetch
from proxy.sessions.as_client_session import (
    FetchSessionClient,
    SessionRequest,
)
from proxy.sessions.client_fetch import ClientFetch, ClientReply


def client(request: Any) -> ClientFetch:
    """*request* validated as the fetch path validates a client's Fetch, once, at decode."""
    validated = ClientFetch.validate(request)
    assert validated is not None  # a consumer's
    return validated


def session_request(version: int, sreq: SessionRequest) -> Any:
    """The kio request a session-using client sends for *sreq*."""
    mod = sys.modules[request_schema(1, version).__module__]

    def grouped(keys: list[PartitionKey]) -> list[tuple[Any, list[PartitionKey]]]:
        out: list[tuple[Any, list[PartitionKey]]] = []
        for k in keys:
            if out and out[-1][0] == k[0]:
                out[-1][1].append(k)
            else:
                out.append((k[0], [k]))
        return out

    topics = fetch_topics(
        version,
        (
            (
                k[0],
                make(
                    mod.FetchPartition,
                    partition=k[1],
                    fetch_offset=sreq.to_send[k].fetch_offset,
                    partition_max_bytes=sreq.to_send[k].partition_max_bytes,
                ),
            )
            for k in sreq.to_send
        ),
    )
    forgotten = tuple(
        make(mod.ForgottenTopic, topic=ref, topic_id=ref, partitions=tuple(k[1] for k in keys))
        for ref, keys in grouped(list(sreq.to_forget))
    )
    return fetch_request(
        version,
        topics,
        session_id=sreq.metadata.session_id,
        session_epoch=sreq.metadata.epoch,
        forgotten_topics_data=forgotten,
    )


class Setup:
    def __init__(self, upstream_version: int, seed: int) -> None:
        self.up = Upstream()
        self.translator = FetchTranslator(self.up.ids(), upstream_max_version=upstream_version)
        self.proxy_sessions = FetchSessionCache(rng=random.Random(seed))
        self.downstream = DownstreamSessions(self.proxy_sessions, self.translator.topic_ids)
        self.direct_sessions = FetchSessionCache(rng=random.Random(seed))
        self.direct = NodeFetcher(1, self.up.state, self.direct_sessions)

    def through_proxy(self, request: Any) -> tuple[Any, int]:
        upstream_requests = 0
        opened = self.downstream.open(client(request))
        if isinstance(opened, ClientReply):  # a session error: not sent upstream
            return opened.response, upstream_requests
        step: UpstreamFetch | ClientReply = self.translator.begin(opened.request)
        while isinstance(step, UpstreamFetch):
            upstream_requests += 1
            step = self.translator.complete(self.up.answer(self.up.fetcher, step.request))
        return self.downstream.answer(opened, step.response), upstream_requests

    def key(self, version: int, topic: str, p: int) -> PartitionKey:
        return (self.up.state.topics[topic].topic_id if version >= 13 else topic, p)


def keys_of(response: Any, version: int) -> list[PartitionKey]:
    return [
        (t.topic_id if version >= 13 else t.topic, int(p.partition_index))
        for t in response.responses
        for p in t.partitions
    ]


def test_session_client_full_then_incremental_through_the_proxy() -> None:
    s = Setup(17, seed=3)
    client = FetchSessionClient()
    version = 12
    want = {s.key(version, t, p): PartitionPlan(0, 1 << 20) for t, p in PARTITIONS}
    s.up.append("orders", 1, 2)
    seen = []
    for _ in range(3):
        req = session_request(version, client.build(want, uses_topic_ids=False))
        resp, _ = s.through_proxy(req)
        assert resp == s.up.answer(s.direct, req)
        assert client.handle_response(
            error_code=int(resp.error_code),
            session_id=int(resp.session_id),
            throttle_time_ms=0,
            partitions=keys_of(resp, version),
        ).ok
        seen.append(len(keys_of(resp, version)))
    # Full, then only orders-1 (its records at offset 0 are returned again each time).
    assert seen[0] == len(PARTITIONS) and seen[1] == 1
    assert resp.session_id != 0


def test_session_errors_are_answered_without_going_upstream() -> None:
    s = Setup(17, seed=4)
    mod = sys.modules[request_schema(1, 12).__module__]
    req = make(
        mod.FetchRequest,
        max_wait=timedelta(0),
        min_bytes=1,
        session_id=12345,
        session_epoch=3,
        topics=(),
        forgotten_topics_data=(),
    )
    resp, upstream_requests = s.through_proxy(req)
    assert upstream_requests == 0
    assert (int(resp.error_code), resp.session_id, resp.responses) == (70, 0, ())


other_steps = st.one_of(
    st.tuples(st.just("append"), st.sampled_from(PARTITIONS), st.integers(1, 4)),
    st.tuples(st.just("evict_upstream")),
    st.tuples(st.just("evict_client_session")),
    st.tuples(st.just("seek"), st.sampled_from(PARTITIONS), st.integers(0, 12)),
)
fetch_steps = st.tuples(
    st.just("fetch"),
    st.one_of(st.lists(st.sampled_from(PARTITIONS), unique=True), st.just(PARTITIONS)),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    upstream_version=st.integers(7, 18),
    client_version=st.integers(7, 18),
    seed=st.integers(0, 1000),
    steps=st.lists(
        st.booleans().flatmap(lambda fetch: fetch_steps if fetch else other_steps),
        min_size=5,
        max_size=40,
    ),
)
def test_session_clients_see_exactly_what_the_broker_would_send(
    upstream_version: int, client_version: int, seed: int, steps: list[tuple[Any, ...]]
) -> None:
    client_version = min(client_version, upstream_version)
    s = Setup(upstream_version, seed)
    client = FetchSessionClient(sessionless_backoff=0)
    positions = dict.fromkeys(PARTITIONS, 0)
    on_ids = client_version >= 13
    for step in steps:
        if step[0] == "append":
            s.up.append(*step[1], step[2])
        elif step[0] == "evict_upstream":
            s.up.sessions.clear()
        elif step[0] == "evict_client_session":
            s.proxy_sessions.clear()
            s.direct_sessions.clear()
        elif step[0] == "seek":
            positions[step[1]] = step[2]
        else:
            want = {
                s.key(client_version, t, p): PartitionPlan(positions[(t, p)], 1 << 20)
                for t, p in step[1]
            }
            req = session_request(client_version, client.build(want, uses_topic_ids=on_ids))
            resp, _ = s.through_proxy(req)
            assert resp == s.up.answer(s.direct, req)
            client.handle_response(
                error_code=int(resp.error_code),
                session_id=int(resp.session_id),
                throttle_time_ms=0,
                partitions=keys_of(resp, client_version),
            )
            for t in resp.responses:
                name = t.topic if not on_ids else s.up.state.topics_by_id[t.topic_id].name
                for pd in t.partitions:
                    if pd.records:
                        last = list(records.iter_batches(pd.records))[-1]
                        positions[(name, int(pd.partition_index))] = last.next_offset
                    elif int(pd.error_code) == 1:
                        positions[(name, int(pd.partition_index))] = 0


def test_unknown_topic_id_is_answered_as_the_broker_would() -> None:
    # A topic id nobody knows: the upstream broker answers UNKNOWN_TOPIC_ID, as directly.
    s = Setup(17, seed=5)
    client = FetchSessionClient()
    ghost = uuid.uuid4()
    want = {(ghost, 0): PartitionPlan(0, 100)}
    req = session_request(13, client.build(want, uses_topic_ids=True))
    resp, _ = s.through_proxy(req)
    assert resp == s.up.answer(s.direct, req)
    assert int(resp.responses[0].partitions[0].error_code) == 100
