"""Running ahead of the client (``run_ahead``), on the sans-I/O core.

After an answer that delivered data, the proxy fetches what the client will ask next
(``FetchShaper.ahead_request``) and keeps the answer in the reuse buffer
(``FetchShaper.hold_ahead``); the client's next fetch is then answered from it with
no upstream round (``held_answer``).  Against the model broker: every record once
and in order, watermarks that never go back, read_committed exact, and the discard
rules (an offset reset, a leader epoch change, a truncation, an error).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from support.fetch_model import (
    ModelBroker,
    batch,
    control,
    delivered,
    make_partition,
    make_request,
    make_response,
    marks,
    model_logs,
    topic_name_or_id,
    txn,
)

from proxy.protocol import records
from proxy.protocol.codec import drain
from proxy.shaping.budget import MemoryBudget
from proxy.shaping.limits import Limits
from proxy.shaping.shaper import FetchShaper

V = 12
T = topic_name_or_id(V)


@settings(max_examples=30, deadline=None)
@given(
    spec=st.lists(st.lists(st.integers(1, 6), min_size=0, max_size=12), min_size=1, max_size=5),
    later=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 6)), max_size=10),
    max_bytes=st.integers(60, 3000),
    partition_bytes=st.sampled_from([60, 250, 10**6]),
    capacity=st.sampled_from([0, 4096]),
)
def test_consumption_with_run_ahead_is_exact_and_answers_from_held_data(
    spec: list[list[int]],
    later: list[tuple[int, int]],
    max_bytes: int,
    partition_bytes: int,
    capacity: int,
) -> None:
    n = len(spec)
    logs = model_logs(spec)
    broker = ModelBroker(V, logs)
    budget = MemoryBudget(10**9)
    shaper = FetchShaper(Limits(), buffer_capacity=capacity, budget=budget)
    offsets = {i: 0 for i in range(n)}
    got: dict[int, list[bytes]] = {i: [] for i in range(n)}
    seen: dict[int, tuple[int, int, int]] = {}
    pending = list(later)
    rounds = ahead = 0
    for step in range(3000):
        if pending and step % 3 == 0:
            i, count = pending.pop(0)
            logs[i % n].append(batch(0, count), leader_epoch=0)
        request = make_request(
            V, {i: (offsets[i], partition_bytes) for i in range(n)}, max_bytes=max_bytes
        )
        prepared = shaper.prepare(request, max_bytes=max_bytes)  # as the fetch path asks
        response = shaper.held_answer(prepared)
        if response is None:
            rounds += 1
            shaped = shaper.finish(prepared, broker.fetch(prepared.upstream_request))
        else:
            shaped = _finish_held(shaper, prepared, response)
        for (_t, i), batches in delivered(shaped.response).items():
            for b in batches:
                h = records.read_batch_header(b)
                assert h.base_offset == offsets[i], "gap or duplicate"
                offsets[i] = h.next_offset
                got[i].append(b)
        for i, mark in marks(shaped.response).items():
            assert all(a >= b for a, b in zip(mark, seen.get(i, mark), strict=True)), (
                "a watermark went back"
            )
            seen[i] = mark
        planned = shaper.ahead_request(request, shaped.next_offsets, max_bytes)
        if shaped.next_offsets and planned is not None:
            ahead += 1
            fetch, where = planned
            assert fetch.max_wait.total_seconds() == 0  # no long poll ahead of the client
            shaper.hold_ahead(broker.fetch(fetch), where, None, max_bytes)
        if all(offsets[i] >= logs[i].high_watermark for i in range(n)) and not pending:
            break
    else:
        raise AssertionError("did not finish")
    for i in range(n):
        assert b"".join(got[i]) == bytes(logs[i].data)
    total = sum(len(log.data) for log in logs.values())
    # Whole batches fetched twice: only those a round brought beyond what the buffer may
    # keep (a broker's first batch goes out over max_bytes, KIP-74).
    largest = len(batch(0, 6))
    assert broker.whole_bytes_sent <= total + largest * ahead
    if min(max_bytes, partition_bytes) >= largest and total > 2 * max_bytes + largest:
        assert shaper.held_answers > 0  # answered from what ran ahead
    assert shaper.buffer.size == budget.used


def _finish_held(shaper: FetchShaper, prepared: Any, held: Any) -> Any:
    """``finish`` of an answer from held data, as the fetch path calls it."""
    return drain(shaper.finish_in_ranges(prepared, held, 0, held=True))


def _ran_ahead(epoch: int = -1) -> tuple[FetchShaper, Any]:
    """A client given batch 0-1 of partition 0; a run-ahead round then held 2-3 and 4-5."""
    shaper = FetchShaper(Limits(), buffer_capacity=0)
    request = make_request(V, {0: (0, 10_000), 1: (0, 10_000)}, max_bytes=len(batch(0, 2)))
    if epoch >= 0:
        topic = request.topics[0]
        parts = tuple(dataclasses.replace(p, current_leader_epoch=epoch) for p in topic.partitions)
        request = dataclasses.replace(
            request, topics=(dataclasses.replace(topic, partitions=parts),)
        )
    prepared = shaper.prepare(request)
    response = make_response(
        V, [make_partition(V, 0, batch(0, 2), hw=6), make_partition(V, 1, b"", hw=0)]
    )
    shaped = shaper.finish(prepared, response)
    assert shaped.next_offsets == {(T, 0): 2}
    planned = shaper.ahead_request(request, shaped.next_offsets, 10_000)
    assert planned is not None
    fetch, where = planned
    assert [(int(p.partition), int(p.fetch_offset)) for p in fetch.topics[0].partitions] == [
        (0, 2),
        (1, 0),
    ]
    held = shaper.hold_ahead(
        make_response(
            V,
            [
                make_partition(V, 0, batch(2, 2) + batch(4, 2), hw=6),
                make_partition(V, 1, b"", hw=0),
            ],
        ),
        where,
        None,
        10_000,
    )
    assert held.partitions == {(T, 0)} and shaper.buffer.size == len(batch(2, 2) + batch(4, 2))
    return shaper, request


def test_the_next_fetch_is_answered_from_what_ran_ahead() -> None:
    shaper, _ = _ran_ahead()
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000), 1: (0, 10_000)}))
    held = shaper.held_answer(prepared)
    assert held is not None and shaper.held_answers == 1
    shaped = _finish_held(shaper, prepared, held)
    assert delivered(shaped.response) == {(T, 0): [batch(2, 2), batch(4, 2)], (T, 1): []}
    assert marks(shaped.response) == {0: (6, 6, 0), 1: (0, 0, 0)}
    assert shaper.buffer.size == 0


def test_a_fetch_whose_min_bytes_held_data_does_not_cover_goes_upstream() -> None:
    shaper, _ = _ran_ahead()
    request = make_request(V, {0: (2, 10_000), 1: (0, 10_000)})
    request = dataclasses.replace(request, min_bytes=10**6)
    assert shaper.held_answer(shaper.prepare(request)) is None


def test_an_offset_reset_discards_what_ran_ahead() -> None:
    shaper, _ = _ran_ahead()
    prepared = shaper.prepare(make_request(V, {0: (0, 10_000), 1: (0, 10_000)}))
    assert shaper.held_answer(prepared) is None
    assert shaper.buffer.size == 0 and prepared.upstream_offsets == {}


def test_a_leader_epoch_change_discards_what_ran_ahead() -> None:
    shaper, request = _ran_ahead(epoch=3)
    topic = request.topics[0]
    parts = tuple(
        dataclasses.replace(p, current_leader_epoch=4, fetch_offset=2 if p.partition == 0 else 0)
        for p in topic.partitions
    )
    request = dataclasses.replace(request, topics=(dataclasses.replace(topic, partitions=parts),))
    prepared = shaper.prepare(request)
    assert shaper.held_answer(prepared) is None and shaper.buffer.size == 0


def test_a_round_that_reports_a_truncation_or_an_error_keeps_nothing() -> None:
    for pd in (
        make_partition(V, 0, b"", hw=3),  # truncated below what is held
        make_partition(V, 0, b"", hw=6, error=6),  # NOT_LEADER_OR_FOLLOWER
    ):
        shaper, _ = _ran_ahead()
        where = {(T, 0): (2, 6, -1), (T, 1): (0, 0, -1)}
        held = shaper.hold_ahead(
            make_response(V, [pd, make_partition(V, 1, b"", hw=0)]), where, None, 10_000
        )
        assert held.partitions == set() and shaper.buffer.size == 0
        prepared = shaper.prepare(make_request(V, {0: (2, 10_000), 1: (0, 10_000)}))
        assert shaper.held_answer(prepared) is None


def test_a_round_continues_what_is_held_and_drops_what_does_not_line_up() -> None:
    shaper, request = _ran_ahead()
    planned = shaper.ahead_request(request, {(T, 0): 2}, 10_000)
    assert planned is not None
    fetch, where = planned
    assert where[(T, 0)] == (2, 6, -1)  # fetched past what is held, for the client at 2
    assert int(fetch.topics[0].partitions[0].fetch_offset) == 6
    shaper.hold_ahead(
        make_response(V, [make_partition(V, 0, batch(6, 3), hw=9)]), where, None, 10_000
    )
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000), 1: (0, 10_000)}))
    held = shaper.held_answer(prepared)
    assert held is not None
    shaped = _finish_held(shaper, prepared, held)
    assert delivered(shaped.response)[(T, 0)] == [batch(2, 2), batch(4, 2), batch(6, 3)]
    assert marks(shaped.response)[0] == (9, 9, 0)


def test_read_committed_aborted_transactions_travel_with_what_ran_ahead() -> None:
    shaper = FetchShaper(Limits(), buffer_capacity=0)
    first = make_request(V, {0: (0, 10_000)}, isolation_level=1, max_bytes=len(batch(0, 2)))
    prepared = shaper.prepare(first)
    shaped = shaper.finish(
        prepared, make_response(V, [make_partition(V, 0, batch(0, 2), hw=10, aborted=[])])
    )
    planned = shaper.ahead_request(first, shaped.next_offsets, 10_000)
    assert planned is not None
    _, where = planned
    data = txn(2, 2, 7) + control(4, 7) + txn(5, 2, 8) + control(7, 8) + batch(8, 2)
    shaper.hold_ahead(
        make_response(V, [make_partition(V, 0, data, hw=10, aborted=[(7, 2)])]), where, None, 10_000
    )
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000)}, isolation_level=1))
    held = shaper.held_answer(prepared)
    assert held is not None
    shaped = _finish_held(shaper, prepared, held)
    pd = shaped.response.responses[0].partitions[0]
    assert delivered(shaped.response)[(T, 0)] == [
        txn(2, 2, 7),
        control(4, 7),
        txn(5, 2, 8),
        control(7, 8),
        batch(8, 2),
    ]
    assert [(a.producer_id, a.first_offset) for a in pd.aborted_transactions] == [(7, 2)]
    # Batches held for read_committed do not answer a read_uncommitted fetch.
    shaper.hold_ahead(
        make_response(V, [make_partition(V, 0, batch(10, 2), hw=12, aborted=[])]),
        {(T, 0): (10, 10, -1)},
        None,
        10_000,
    )
    assert shaper.held_answer(shaper.prepare(make_request(V, {0: (10, 10_000)}))) is None
