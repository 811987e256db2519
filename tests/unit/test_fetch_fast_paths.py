"""The Fetch path's shortcuts give what the general path gives.

Each shortcut skips rebuilding something that would come out equal: the
client's own topics as the sessionless request (downstream), the request as
its own upstream order (shaping rotation), partitions without records
(trimming), an idle partition's entry (translator), and a session's cache
pruning when the session did not change.
"""

from __future__ import annotations

import random
import sys
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from proxy.protocol.codec import request_schema, response_schema
from proxy.protocol.messages import make
from proxy.protocol.partition_plan import plan_of
from proxy.protocol.partition_result import empty_entry
from proxy.sessions import as_broker
from proxy.sessions.as_broker import DownstreamFetch, DownstreamSessions
from proxy.sessions.as_broker_cache import FetchSessionCache, TopicIdPartition
from proxy.sessions.as_client import FetchTranslator, UpstreamFetch
from proxy.sessions.client_fetch import ClientFetch, ClientReply
from proxy.sessions.partition_cache import PartitionStateCache
from proxy.sessions.topic_ids import TopicIdMap
from proxy.shaping.limits import Limits, ResponseLimits
from proxy.shaping.shaper import FetchShaper
from proxy.shaping.trim import Run, trim_response


def client(request: Any) -> ClientFetch:
    """*request* validated as the fetch path validates a client's Fetch, once, at decode."""
    validated = ClientFetch.validate(request)
    assert validated is not None  # a consumer's
    return validated


def _mod(version: int, kind: str) -> Any:
    schema = request_schema(1, version) if kind == "request" else response_schema(1, version)
    return sys.modules[schema.__module__]


Entry = tuple[str, int, int, int]
"""(topic, partition, fetch offset, current leader epoch)"""


def fetch(version: int, topics: list[tuple[str, list[Entry]]], *, epoch: int = -1) -> Any:
    mod = _mod(version, "request")
    return make(
        mod.FetchRequest,
        replica_id=-1,
        max_wait=timedelta(milliseconds=100),
        min_bytes=1,
        max_bytes=1 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=epoch,
        topics=tuple(
            make(
                mod.FetchTopic,
                topic=name,
                partitions=tuple(
                    make(
                        mod.FetchPartition,
                        partition=p,
                        fetch_offset=offset,
                        partition_max_bytes=1000,
                        current_leader_epoch=leader_epoch,
                    )
                    for _, p, offset, leader_epoch in entries
                ),
            )
            for name, entries in topics
        ),
        forgotten_topics_data=(),
    )


def opened(request: Any) -> DownstreamFetch:
    sessions = DownstreamSessions(FetchSessionCache(rng=random.Random(1)), TopicIdMap())
    result = sessions.open(client(request))
    assert isinstance(result, DownstreamFetch)
    return result


def rebuilt(request: Any, result: DownstreamFetch) -> Any:
    """What the sessionless request was before the shortcut: every topic built anew."""
    mod = _mod(int(request.__version__), "request")
    # the partitions a full fetch covers: each once, the last plan given, at the first place
    fetch_data = {}
    for t in request.topics:
        for p in t.partitions:
            fetch_data[TopicIdPartition(None, t.topic, int(p.partition))] = plan_of(p)
    effective = list(fetch_data.items())
    topics = as_broker._rebuilt_topics(mod, effective, on_ids=False)
    return as_broker.make(
        mod.FetchRequest,
        replica_id=-1,
        max_wait=request.max_wait,
        min_bytes=request.min_bytes,
        max_bytes=request.max_bytes,
        isolation_level=request.isolation_level,
        session_id=0,
        session_epoch=-1,
        topics=topics,
        forgotten_topics_data=(),
        rack_id=getattr(request, "rack_id", ""),
    )


_entries = st.lists(
    st.tuples(
        st.sampled_from(["a", "b"]),
        st.integers(0, 2),
        st.integers(0, 5),
        st.sampled_from([-1, -3, 0, 4]),
    ),
    max_size=8,
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(entries=_entries, version=st.sampled_from([4, 7, 12]), session=st.booleans())
def test_the_sessionless_request_is_what_the_rebuild_gives(
    entries: list[Entry], version: int, session: bool
) -> None:
    """Duplicates, repeated topic entries and negative epochs included (the rebuild's cases)."""
    topics: list[tuple[str, list[Entry]]] = [(e[0], [e]) for e in entries]
    request = fetch(version, topics, epoch=0 if session and version >= 7 else -1)
    result = opened(request)
    assert result.request == rebuilt(request, result)


def test_a_plain_full_fetch_keeps_its_topics() -> None:
    request = fetch(12, [("a", [("a", 0, 5, -1), ("a", 1, 7, 2)]), ("b", [("b", 0, 1, -1)])])
    assert opened(request).request.topics is request.topics


@pytest.mark.parametrize(
    "topics",
    [
        [("a", [("a", 0, 5, -1)]), ("a", [("a", 1, 5, -1)])],  # one topic, two entries in a row
        [("a", [("a", 0, 5, -1), ("a", 0, 6, -1)])],  # a partition twice
        [("a", [("a", 0, 5, -7)])],  # an epoch the rebuild writes as -1
        [("a", []), ("b", [("b", 0, 5, -1)])],  # a topic without partitions
    ],
)
def test_other_full_fetches_are_rebuilt(topics: list[tuple[str, list[Entry]]]) -> None:
    request = fetch(12, topics)
    result = opened(request)
    assert result.request.topics is not request.topics
    assert result.request == rebuilt(request, result)


def test_rotation_in_request_order_keeps_the_request() -> None:
    shaper = FetchShaper(Limits())
    request = fetch(12, [("a", [("a", 0, 0, -1), ("a", 1, 0, -1)]), ("b", [("b", 0, 0, -1)])])
    assert shaper._rotate(request) is request


def test_rotation_merges_consecutive_entries_of_a_topic_as_before() -> None:
    shaper = FetchShaper(Limits())
    request = fetch(12, [("a", [("a", 0, 0, -1)]), ("a", [("a", 1, 0, -1)])])
    rotated = shaper._rotate(request)
    assert [(t.topic, [int(p.partition) for p in t.partitions]) for t in rotated.topics] == [
        ("a", [0, 1])
    ]


def test_rotation_moves_served_partitions_to_the_end() -> None:
    shaper = FetchShaper(Limits())
    request = fetch(12, [("a", [("a", 0, 0, -1), ("a", 1, 0, -1)]), ("b", [("b", 0, 0, -1)])])
    shaper._rotate(request)
    shaper.upstream_rotation.observe([("a", 0)])
    rotated = shaper._rotate(request)
    assert [(t.topic, [int(p.partition) for p in t.partitions]) for t in rotated.topics] == [
        ("a", [1]),
        ("b", [0]),
        ("a", [0]),
    ]


def _response(partitions: list[Any]) -> Any:
    mod = _mod(12, "response")
    return make(
        mod.FetchResponse,
        throttle_time=timedelta(0),
        error_code=ErrorCode(0),
        session_id=0,
        responses=(make(mod.FetchableTopicResponse, topic="a", partitions=tuple(partitions)),),
    )


def _partition(index: int, records: Any, aborted: Any) -> Any:
    mod = _mod(12, "response")
    return make(
        mod.PartitionData,
        partition_index=index,
        error_code=ErrorCode(0),
        high_watermark=3,
        last_stable_offset=3,
        log_start_offset=0,
        aborted_transactions=aborted,
        preferred_read_replica=-1,
        records=records,
    )


@pytest.mark.parametrize("records", [b"", None, memoryview(b"")])
@pytest.mark.parametrize("aborted", [None, ()])
def test_a_partition_without_records_passes_untouched(records: Any, aborted: Any) -> None:
    pd = _partition(0, records, aborted)
    result = trim_response(_response([pd]), ResponseLimits(response_records=1))
    assert result.response.responses[0].partitions[0] is pd
    outcome = result.outcomes[("a", 0)]
    assert (outcome.offered_bytes, outcome.delivered_batches, outcome.next_offset) == (0, 0, None)
    assert outcome.remainder == Run(b"", (), aborted)
    assert outcome.limited_by == frozenset() and outcome.shaped


def test_an_empty_partition_with_an_aborted_list_loses_it_as_before() -> None:
    """The broker lists aborted transactions with records only; without any there is no range."""
    mod = _mod(12, "response")
    pd = _partition(0, b"", (mod.AbortedTransaction(producer_id=1, first_offset=0),))
    result = trim_response(_response([pd]), ResponseLimits())
    assert result.response.responses[0].partitions[0].aborted_transactions == ()


def test_retain_prunes_keys_recorded_outside_the_last_session() -> None:
    cache = PartitionStateCache()
    a, b = ("t", 0), ("t", 1)
    state = {"high_watermark": 1, "last_stable_offset": 1, "log_start_offset": 0, "error_code": 0}
    cache.record(a, **state)
    cache.retain((a,))
    cache.retain((a,))
    assert a in cache
    cache.record(b, **state)
    cache.retain((a,))
    assert b not in cache and a in cache
    cache.retain((b,))
    assert len(cache) == 0


def _translator_round(
    translator: FetchTranslator, request: Any, partitions: list[Any], session_id: int
) -> Any:
    step = translator.begin(request)
    assert isinstance(step, UpstreamFetch)
    mod = _mod(12, "response")
    response = make(
        mod.FetchResponse,
        throttle_time=timedelta(0),
        error_code=ErrorCode(0),
        session_id=session_id,
        responses=(make(mod.FetchableTopicResponse, topic="a", partitions=tuple(partitions)),)
        if partitions
        else (),
    )
    reply = translator.complete(response)
    assert isinstance(reply, ClientReply)
    return reply.response


def test_an_idle_partition_is_answered_with_the_same_entity_until_it_changes() -> None:
    translator = FetchTranslator(TopicIdMap(), upstream_max_version=12)
    request = fetch(12, [("a", [("a", 0, 0, -1), ("a", 1, 0, -1)])])
    first = _translator_round(
        translator, request, [_partition(0, b"", None), _partition(1, b"", None)], 5
    )
    second = _translator_round(translator, request, [], 5)
    third = _translator_round(translator, request, [], 5)
    assert second == first
    assert third.responses[0].partitions[0] is second.responses[0].partitions[0]
    # the process's one object for this state: a held answer gives the very same one
    # (test_fetch_ahead), so one encoding serves both kinds of answer
    assert third.responses[0].partitions[0] is empty_entry(
        _mod(12, "response"), 0, 3, 3, 0, read_committed=False
    )
    moved = make(
        _mod(12, "response").PartitionData,
        partition_index=0,
        error_code=ErrorCode(0),
        high_watermark=9,
        last_stable_offset=9,
        log_start_offset=0,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=b"",
    )
    _translator_round(translator, request, [moved], 5)
    fifth = _translator_round(translator, request, [], 5)
    assert int(fifth.responses[0].partitions[0].high_watermark) == 9
    assert fifth.responses[0].partitions[1] is third.responses[0].partitions[1]


@settings(
    max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)
@given(st.lists(st.integers(0, 3), min_size=1, max_size=6))
def test_cached_entities_equal_fresh_ones(hws: list[int]) -> None:
    """However the state moves, the answer for an idle partition is the one built from it."""
    translator = FetchTranslator(TopicIdMap(), upstream_max_version=12)
    request = fetch(12, [("a", [("a", 0, 0, -1)])])
    _translator_round(translator, request, [_partition(0, b"", None)], 5)
    for hw in hws:
        included = make(
            _mod(12, "response").PartitionData,
            partition_index=0,
            error_code=ErrorCode(0),
            high_watermark=hw,
            last_stable_offset=hw,
            log_start_offset=0,
            aborted_transactions=None,
            preferred_read_replica=-1,
            records=b"",
        )
        _translator_round(translator, request, [included], 5)
        idle = _translator_round(translator, request, [], 5)
        assert idle.responses[0].partitions[0] == included


def _client_request(frame: bytes) -> Any:
    from proxy.protocol.codec import parse_request_header
    from proxy.relay.relay import ClientRequest

    return ClientRequest(parse_request_header(frame), frame, _flush=lambda: None, _slot=None)


def test_a_repeated_request_body_is_decoded_once() -> None:
    from proxy.config import FetchPathConfig
    from proxy.fetchpath import FetchPath
    from proxy.protocol.codec import encode_request

    handler = FetchPath(FetchPathConfig()).handler(1)
    idle = fetch(12, [("a", [("a", 0, 5, -1), ("a", 1, 7, -1)])])
    moved = fetch(12, [("a", [("a", 0, 6, -1), ("a", 1, 7, -1)])])
    first = handler._decode(_client_request(encode_request(idle, 1, "c")))
    again = handler._decode(_client_request(encode_request(idle, 2, "other")))
    assert again is first and first == idle
    other = handler._decode(_client_request(encode_request(moved, 3, "c")))
    assert other == moved
    assert handler._decode(_client_request(encode_request(idle, 4, "c"))) == idle
    older = fetch(11, [("a", [("a", 0, 5, -1), ("a", 1, 7, -1)])])
    decoded_older = handler._decode(_client_request(encode_request(older, 5, "c")))
    assert int(decoded_older.__version__) == 11 and decoded_older == older


@pytest.mark.parametrize("version", [4, 7, 12, 13, 16, 18])
def test_a_partition_at_the_clients_version_is_passed_on_as_converting_would_build_it(
    version: int,
) -> None:
    from proxy.protocol.messages import convert
    from proxy.sessions.as_client import _convert_partition

    mod = _mod(version, "response")
    extra: dict[str, Any] = {}
    if hasattr(mod, "LeaderIdAndEpoch"):
        extra["current_leader"] = mod.LeaderIdAndEpoch(leader_id=2, leader_epoch=5)
    pd = make(
        mod.PartitionData,
        partition_index=1,
        error_code=ErrorCode(0),
        high_watermark=4,
        last_stable_offset=4,
        log_start_offset=0,
        aborted_transactions=(mod.AbortedTransaction(producer_id=3, first_offset=1),),
        preferred_read_replica=-1,
        records=b"\x01\x02",
        **extra,
    )
    on_ids = version >= 13
    out = _convert_partition(mod, pd, client_on_ids=on_ids, upstream_on_ids=on_ids)
    assert out is pd and out == convert(pd, mod.PartitionData)
    names_client = _convert_partition(
        _mod(12, "response"),
        make(
            _mod(13, "response").PartitionData,
            partition_index=1,
            error_code=ErrorCode(100),
            high_watermark=-1,
            last_stable_offset=-1,
            log_start_offset=-1,
            aborted_transactions=None,
            preferred_read_replica=-1,
            records=None,
        ),
        client_on_ids=False,
        upstream_on_ids=True,
    )  # UNKNOWN_TOPIC_ID becomes UNKNOWN_TOPIC_OR_PARTITION for a names client
    assert (
        int(names_client.error_code) == 3
        and type(names_client) is _mod(12, "response").PartitionData
    )
