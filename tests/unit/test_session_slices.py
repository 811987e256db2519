"""The upstream session's walks in ranges (issue 19: no request holds the loop).

``FetchSessionClient.build_in_ranges`` and ``FetchTranslator.begin_in_ranges`` walk a
large fetch's partitions in ranges that yield; what they decide is what ``build`` and
``begin`` decide, and shared state (the topic-id map) and the session are read or
changed at one point: a map that changes between two ranges is read again at once.
At 20,000 partitions the grouping of ``begin`` (the upstream keys and the session's
diff) was one of the longest walks left in a fetch (40-50 ms on an idle core).
"""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Any

import pytest
from kio.schema.errors import ErrorCode
from support.fetch_messages import (
    counted,
    fetch_request,
    fetch_response,
    fetch_topics,
    partition_data,
)

from proxy.protocol.messages import make, request_module, response_module
from proxy.protocol.partition_key import PartitionKey
from proxy.protocol.partition_plan import PartitionPlan
from proxy.sessions import as_client
from proxy.sessions.as_client import FetchTranslator
from proxy.sessions.as_client_session import FetchSessionClient
from proxy.sessions.client_fetch import ClientReply
from proxy.sessions.topic_ids import TopicIdMap

EVERY = 500
FetchPartition = request_module(1, 12).FetchPartition


def wanted(n: int, offset: int = 0) -> dict[PartitionKey, PartitionPlan]:
    return {("t", p): PartitionPlan(offset + p, 1 << 20) for p in range(n)}


def established(n: int) -> FetchSessionClient:
    c = FetchSessionClient()
    c.build(wanted(n), uses_topic_ids=False)
    c.handle_response(error_code=0, session_id=7, throttle_time_ms=0, partitions=list(wanted(n)))
    return c


def test_an_incremental_build_yields_every_range_and_builds_the_same() -> None:
    now = wanted(10_000, offset=3)  # every partition moved on
    del now[("t", 5)]  # one forgotten
    now[("u", 0)] = PartitionPlan(0, 1 << 20)  # one added
    whole = established(10_000).build(now, uses_topic_ids=False)
    sliced = established(10_000)
    request, yields = counted(sliced.build_in_ranges(now, EVERY, uses_topic_ids=False))
    assert request == whole and not request.is_full
    assert request.to_forget == (("t", 5),)
    # the check of the keys, the session's partitions and the new ones: 20 + 20 + 20
    assert yields >= 3 * 10_000 // EVERY - 1
    kept = [k for k in established(10_000).session_partitions if k != ("t", 5)]
    assert sliced.in_flight == request
    assert sliced.session_partitions == (*kept, ("u", 0))


def test_a_session_reset_between_ranges_is_seen() -> None:
    c = established(2_000)
    steps = c.build_in_ranges(wanted(2_000, offset=1), EVERY, uses_topic_ids=False)
    next(steps)
    c.revoke_last_response("a test")  # the session is to start again: a full request
    request, _ = counted(steps)
    assert request.is_full and len(request.to_send) == 2_000


def _client_fetch(partitions: int, *, twice: int | None = None) -> Any:
    """A fetch of partitions 0 .. *partitions* - 1 of "t" (*twice*: that one listed again
    at the end, as a broker keys fetch data by partition and answers it once)."""
    listed = [*range(partitions), *(() if twice is None else (twice,))]
    return fetch_request(
        12,
        fetch_topics(
            12,
            (
                ("t", make(FetchPartition, partition=p, fetch_offset=0, partition_max_bytes=1024))
                for p in listed
            ),
        ),
        max_wait=timedelta(milliseconds=500),
    )


def test_begin_reads_the_topic_ids_again_when_they_change_between_ranges() -> None:
    ids = TopicIdMap()
    old, new = uuid.UUID(int=1), uuid.UUID(int=2)
    ids.learn("t", old)
    translator = FetchTranslator(ids, upstream_max_version=17)
    steps = translator.begin_in_ranges(_client_fetch(5_000), EVERY)
    for _ in range(5_000 // EVERY + 2):  # into the keys' walk
        next(steps)
    ids.learn("t", new)  # a Metadata answer on another connection, between two ranges
    begun, yields = counted(steps)
    assert yields > 5_000 // EVERY  # (it was cut into ranges)
    topics = {t.topic_id for t in begun.request.topics}
    assert topics == {new}, "one request names one id for a topic, the current one"


def test_an_answer_is_read_in_ranges_with_the_same_outcome() -> None:
    def answer(client: FetchSessionClient, every: int) -> tuple[Any, int]:
        client.build(wanted(10_000, offset=1), uses_topic_ids=False)
        return counted(
            client.handle_response_in_ranges(
                error_code=0,
                session_id=7,
                throttle_time_ms=0,
                partitions=[("t", p) for p in range(0, 10_000, 2)],
                every=every,
            )
        )

    whole_client, sliced_client = established(10_000), established(10_000)
    whole, _ = answer(whole_client, 0)
    sliced, yields = answer(sliced_client, EVERY)
    assert sliced == whole and sliced.ok
    assert yields >= 5_000 // EVERY
    assert sliced_client.next_metadata == whole_client.next_metadata
    assert sliced_client.in_flight is None


def _upstream_answer(request: Any, error_every: int = 0) -> Any:
    """Upstream's full answer to *request*: every partition, no records (an unknown topic
    or partition every *error_every* partitions, which Kafka lists last)."""
    parts = [(t.topic, p.partition) for t in request.topics for p in t.partitions]
    return fetch_response(
        int(request.__version__),
        (
            make(
                response_module(1, int(request.__version__)).FetchableTopicResponse,
                topic=ref,
                partitions=tuple(
                    partition_data(
                        int(request.__version__),
                        int(index),
                        error_code=ErrorCode.unknown_topic_or_partition
                        if error_every and int(index) % error_every == 0
                        else ErrorCode.none,
                    )
                    for _, index in parts
                ),
            )
            for ref in dict.fromkeys(ref for ref, _ in parts)
        ),
    )


def test_the_clients_response_is_built_and_grouped_in_ranges_alike() -> None:
    n = 4_000
    answers = []
    for every in (0, EVERY):
        translator = FetchTranslator(TopicIdMap(), upstream_max_version=12)
        begun = translator.begin(_client_fetch(n))
        step, yields = counted(
            translator.complete_in_ranges(_upstream_answer(begun.request, 7), every)
        )
        answers.append((step.response, yields))
    (whole, _), (sliced, yields) = answers
    assert sliced == whole
    partitions = [p.partition_index for t in sliced.responses for p in t.partitions]
    assert len(partitions) == n and partitions[-1] % 7 == 0  # refused ones last
    # six walks as before, and the grouping of the client's partitions into topics
    # (before: one step with the sort, 18 ms at 20,000 partitions)
    assert yields >= 7 * n // EVERY


def test_the_client_partitions_are_deduplicated_range_by_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Before, the client's partitions were deduplicated in one walk ahead of the ranges
    that answer them (18 ms at 20,000 partitions, the longest step of bench/fetch_stall).
    (A fetch that lists each partition once is answered with no such walk: below.)"""
    n = 4_000
    translator = FetchTranslator(TopicIdMap(), upstream_max_version=12)
    begun = translator.begin(_client_fetch(n, twice=7))
    calls = [0]
    dedupe = as_client._dedupe

    def counting(partitions: Any) -> Any:
        for cp in dedupe(partitions):
            calls[0] += 1  # one partition deduplicated
            yield cp

    monkeypatch.setattr(as_client, "_dedupe", counting)
    steps = translator.complete_in_ranges(_upstream_answer(begun.request), EVERY)
    per_range = []
    while True:
        before = calls[0]
        try:
            next(steps)
        except StopIteration:
            break
        finally:
            per_range.append(calls[0] - before)
    assert sum(per_range) == n  # each partition deduplicated once, as it is answered
    assert max(per_range) <= EVERY


def test_a_fetch_listing_each_partition_once_is_answered_without_deduplicating(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    translator = FetchTranslator(TopicIdMap(), upstream_max_version=12)
    begun = translator.begin(_client_fetch(1_000))

    def refused(partitions: Any) -> Any:
        raise AssertionError("deduplicated a fetch that lists each partition once")

    monkeypatch.setattr(as_client, "_dedupe", refused)
    reply = translator.complete(_upstream_answer(begun.request))
    assert isinstance(reply, ClientReply)
    listed = [int(p.partition_index) for t in reply.response.responses for p in t.partitions]
    assert listed == list(range(1_000))
