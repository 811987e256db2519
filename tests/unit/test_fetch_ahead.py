"""The fetcher that runs ahead of the client (issue 17 part 2), on the sans-I/O core.

``FetchShaper.held_answer`` answers a client fetch from held batches alone when
upstream's data could not be delivered anyway; ``prepare`` asks upstream only for
what the buffer can keep.  Against the model broker: every record once and in
order, watermarks never going back, read_committed exact, and the discard rules
(offset reset, leader epoch change, truncation, an error).
"""

from __future__ import annotations

import dataclasses

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
from proxy.protocol.apis import FETCH
from proxy.protocol.codec import drain
from proxy.protocol.messages import response_module
from proxy.protocol.partition_result import empty_entry
from proxy.shaping.budget import MemoryBudget
from proxy.shaping.limits import Limits
from proxy.shaping.shaper import FetchShaper

V = 12
T = topic_name_or_id(V)


@settings(max_examples=25, deadline=None)
@given(
    spec=st.lists(st.lists(st.integers(1, 6), min_size=0, max_size=12), min_size=1, max_size=6),
    later=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), max_size=10),
    max_records=st.integers(1, 12),
    pb=st.sampled_from([None, 60, 200]),
    capacity=st.sampled_from([150, 600, 10**6]),
)
def test_consumption_through_held_answers_is_exact_and_costs_no_extra_upstream_bytes(
    spec: list[list[int]],
    later: list[tuple[int, int]],
    max_records: int,
    pb: int | None,
    capacity: int,
) -> None:
    n = len(spec)
    logs = model_logs(spec)
    broker = ModelBroker(V, logs)
    budget = MemoryBudget(10**9)
    shaper = FetchShaper(
        Limits(max_records=max_records, max_partition_bytes=pb),
        buffer_capacity=capacity,
        budget=budget,
    )
    offsets = {i: 0 for i in range(n)}
    got: dict[int, list[bytes]] = {i: [] for i in range(n)}
    seen: dict[int, tuple[int, int, int]] = {}
    pending = list(later)
    rounds = answers = 0
    for step in range(3000):
        if pending and step % 3 == 0:
            i, count = pending.pop(0)
            logs[i % n].append(batch(0, count), leader_epoch=0)
        request = make_request(V, {i: (offsets[i], 10**6) for i in range(n)})
        prepared = shaper.prepare(request)
        response = shaper.held_answer(prepared)
        if response is None:
            rounds += 1
            response = broker.fetch(prepared.upstream_request)
        answers += 1
        shaped = shaper.finish(prepared, response)
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
        if all(offsets[i] >= logs[i].high_watermark for i in range(n)) and not pending:
            break
    else:
        raise AssertionError("did not finish")
    for i in range(n):
        assert b"".join(got[i]) == bytes(logs[i].data)
    total = sum(len(log.data) for log in logs.values())
    largest = max((len(batch(0, 6))), 1)
    # What upstream sent whole was delivered, or held and delivered later: nothing
    # fetched twice, but for the broker's one-batch progress exemption on a full buffer.
    assert broker.whole_bytes_sent <= total + largest * rounds * (capacity < 10**6)
    if capacity == 10**6:
        assert broker.whole_bytes_sent == total
    assert rounds <= answers
    assert budget.used == 0 or shaper.buffer.size == budget.used


def _three_batches(limits: Limits) -> FetchShaper:
    """A shaper that delivered batch 0-1 of partition 0 and holds 2-3 and 4-5 (hw 6)."""
    shaper = FetchShaper(limits, buffer_capacity=10_000)
    data = batch(0, 2) + batch(2, 2) + batch(4, 2)
    prepared = shaper.prepare(make_request(V, {0: (0, 10_000), 1: (0, 10_000)}))
    response = make_response(V, [make_partition(V, 0, data, hw=6), make_partition(V, 1, b"", hw=0)])
    shaped = shaper.finish(prepared, response)
    assert delivered(shaped.response)[(T, 0)] == [batch(0, 2)]
    return shaper


def test_held_data_that_fills_the_response_answers_it_without_upstream() -> None:
    shaper = _three_batches(Limits(max_records=3))
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000), 1: (0, 10_000)}))
    held = shaper.held_answer(prepared)
    assert held is not None and shaper.held_answers == 1
    shaped = shaper.finish(prepared, held)
    assert delivered(shaped.response) == {(T, 0): [batch(2, 2)], (T, 1): []}
    # Watermarks as the client was last given them, the partition without data too.
    assert marks(shaped.response) == {0: (6, 6, 0), 1: (0, 0, 0)}
    # 4-5 alone (2 records) do not fill it: upstream is asked, from past them.
    prepared = shaper.prepare(make_request(V, {0: (4, 10_000), 1: (0, 10_000)}))
    assert shaper.held_answer(prepared) is None
    assert prepared.upstream_offsets == {(T, 0): 6}


def test_held_answers_reuse_an_idle_partitions_entry_until_its_watermarks_move() -> None:
    """The entry of a partition without held data is made once and given again while its
    watermarks stay (a sessionless client lists every partition in every fetch); when an
    upstream answer moves them, the next held answer carries the new ones."""
    shaper = _three_batches(Limits(max_records=1))

    def held_at(offset: int, idle_at: int = 0) -> object:
        request = make_request(V, {0: (offset, 10_000), 1: (idle_at, 10_000)})
        prepared = shaper.prepare(request)
        held = shaper.held_answer(prepared)
        assert held is not None
        shaper.finish(prepared, held)
        return held

    first, again = held_at(2), held_at(4)
    assert first.responses[0].partitions[1] is again.responses[0].partitions[1]  # type: ignore[attr-defined]
    # the process's one object for this state, which the upstream session's answers give
    # too (test_fetch_fast_paths): one encoding serves both kinds of answer
    mod = response_module(FETCH, V)
    assert again.responses[0].partitions[1] is empty_entry(mod, 1, 0, 0, 0, read_committed=False)  # type: ignore[attr-defined]
    assert marks(again) == {0: (6, 6, 0), 1: (0, 0, 0)}
    # An upstream round: partition 0 has 6-7 and 8-9 (8-9 is held); partition 1 has grown
    # to 5, where the client is (it has nothing to wait for).
    prepared = shaper.prepare(make_request(V, {0: (6, 10_000), 1: (5, 10_000)}))
    assert shaper.held_answer(prepared) is None
    data = batch(6, 2) + batch(8, 2)
    upstream = make_response(
        V, [make_partition(V, 0, data, hw=10), make_partition(V, 1, b"", hw=5)]
    )
    assert delivered(shaper.finish(prepared, upstream).response)[(T, 0)] == [batch(6, 2)]
    assert marks(held_at(8, idle_at=5))[1] == (5, 5, 0)


def test_a_held_batch_over_the_partition_cap_goes_out_alone_without_upstream() -> None:
    """Batches larger than max_partition_bytes go out one per response, as KIP-74's first
    batch (a broker's read ends there too): a held one answers alone, with no upstream
    round (before, every such response cost one, as kcat over 1,000 partitions of 128
    KB batches showed: 1,378 upstream fetches for 1,378 responses)."""
    size = len(batch(0, 2))
    shaper = _three_batches(Limits(max_partition_bytes=size - 1, max_records=100))
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000), 1: (0, 10_000)}))
    held = shaper.held_answer(prepared)
    assert held is not None and shaper.held_answers == 1
    shaped = shaper.finish(prepared, held)
    assert delivered(shaped.response) == {(T, 0): [batch(2, 2)], (T, 1): []}


def test_a_partition_full_of_held_data_is_asked_for_no_bytes() -> None:
    size = len(batch(0, 2))
    shaper = _three_batches(Limits(max_partition_bytes=size, max_records=100))
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000), 1: (0, 10_000)}))
    # Partition 1 has no held data: upstream must be asked for it.
    assert shaper.held_answer(prepared) is None
    parts = {int(p.partition): p for t in prepared.upstream_request.topics for p in t.partitions}
    assert parts[0].partition_max_bytes == 0 and parts[0].fetch_offset == 6
    # Running ahead, the partition cap is trimmed here, not sent: the client's own is asked.
    assert parts[1].partition_max_bytes == 10_000


def test_upstream_is_asked_only_for_what_the_buffer_can_keep() -> None:
    shaper = FetchShaper(Limits(max_records=5), buffer_capacity=1000)
    prepared = shaper.prepare(make_request(V, {0: (0, 10**6)}, max_bytes=10**6))
    assert prepared.upstream_request.max_bytes == 1000
    # Without a record limit nothing is trimmed below what upstream is asked: no bound.
    shaper = FetchShaper(Limits(max_partition_bytes=500), buffer_capacity=1000)
    prepared = shaper.prepare(make_request(V, {0: (0, 10**6)}, max_bytes=10**6))
    assert prepared.upstream_request.max_bytes == 10**6
    # Within this connection's share of the budget.
    shaper = FetchShaper(Limits(max_records=5), buffer_capacity=1000, share=lambda: 400)
    prepared = shaper.prepare(make_request(V, {0: (0, 10**6)}, max_bytes=10**6))
    assert prepared.upstream_request.max_bytes == 400


def test_read_committed_aborted_transactions_travel_with_held_batches() -> None:
    shaper = FetchShaper(Limits(max_records=2), buffer_capacity=10_000)
    data = txn(0, 2, 7) + control(2, 7) + txn(3, 2, 7) + control(5, 7) + batch(6, 2)
    request = make_request(V, {0: (0, 10_000)}, isolation_level=1)
    prepared = shaper.prepare(request)
    shaped = shaper.finish(
        prepared, make_response(V, [make_partition(V, 0, data, hw=8, aborted=[(7, 0), (7, 3)])])
    )
    assert delivered(shaped.response)[(T, 0)] == [txn(0, 2, 7), control(2, 7)]
    pd = shaped.response.responses[0].partitions[0]
    assert [(a.producer_id, a.first_offset) for a in pd.aborted_transactions] == [(7, 0)]
    prepared = shaper.prepare(make_request(V, {0: (3, 10_000)}, isolation_level=1))
    held = shaper.held_answer(prepared)
    assert held is not None
    shaped = shaper.finish(prepared, held)
    assert delivered(shaped.response)[(T, 0)] == [txn(3, 2, 7), control(5, 7)]
    pd = shaped.response.responses[0].partitions[0]
    assert [(a.producer_id, a.first_offset) for a in pd.aborted_transactions] == [(7, 3)]
    # A read_uncommitted fetch is not answered from batches held for read_committed.
    prepared = shaper.prepare(make_request(V, {0: (6, 10_000)}))
    assert shaper.held_answer(prepared) is None


def test_a_change_of_isolation_level_discards_held_data() -> None:
    """Batches held from a read_uncommitted answer carry no aborted transactions (a broker
    lists none then): a read_committed fetch at them must go upstream, which lists them
    (found by tests/integration/test_fetch_scripts_backends.py); and the other way."""
    shaper = FetchShaper(Limits(max_records=2), buffer_capacity=10_000)
    data = batch(0, 2) + txn(2, 2, 7) + control(4, 7) + batch(5, 2)
    prepared = shaper.prepare(make_request(V, {0: (0, 10_000)}))
    shaped = shaper.finish(prepared, make_response(V, [make_partition(V, 0, data, hw=7)]))
    assert delivered(shaped.response)[(T, 0)] == [batch(0, 2)]
    assert shaper.buffer.size > 0
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000)}, isolation_level=1))
    assert prepared.prefixes == {} and shaper.buffer.size == 0 and shaper.buffer.dropped == 1
    assert shaper.held_answer(prepared) is None
    [up] = prepared.upstream_request.topics[0].partitions
    assert up.fetch_offset == 2  # upstream is asked from the client's offset
    shaped = shaper.finish(
        prepared,
        make_response(V, [make_partition(V, 0, data[len(batch(0, 2)) :], hw=7, aborted=[(7, 2)])]),
    )
    pd = shaped.response.responses[0].partitions[0]
    assert [(a.producer_id, a.first_offset) for a in pd.aborted_transactions] == [(7, 2)]
    assert shaper.buffer.size > 0  # held for read_committed now
    prepared = shaper.prepare(make_request(V, {0: (5, 10_000)}))
    assert prepared.prefixes == {} and shaper.buffer.size == 0 and shaper.buffer.dropped == 2


def test_an_offset_reset_discards_held_data() -> None:
    shaper = _three_batches(Limits(max_records=3))
    prepared = shaper.prepare(make_request(V, {0: (0, 10_000), 1: (0, 10_000)}))
    assert shaper.held_answer(prepared) is None
    assert prepared.upstream_offsets == {} and shaper.buffer.size == 0
    assert shaper.buffer.dropped == 1


def test_a_leader_epoch_change_discards_held_data() -> None:
    shaper = _three_batches(Limits(max_records=3))
    request = make_request(V, {0: (2, 10_000), 1: (0, 10_000)})
    topic = request.topics[0]
    parts = tuple(
        dataclasses.replace(p, current_leader_epoch=4) if p.partition == 0 else p
        for p in topic.partitions
    )
    request = dataclasses.replace(request, topics=(dataclasses.replace(topic, partitions=parts),))
    prepared = shaper.prepare(request)
    assert shaper.held_answer(prepared) is None and shaper.buffer.size == 0
    assert prepared.upstream_offsets == {}
    # Upstream naming a new leader epoch discards it too.
    shaper = _three_batches(Limits(max_records=3, max_partition_records=2))
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000), 1: (0, 10_000)}))
    assert shaper.held_answer(prepared) is None  # partition 1 may have data
    response = make_response(
        V,
        [
            make_partition(V, 0, b"", hw=6, leader_epoch=3),
            make_partition(V, 1, b"", hw=0, leader_epoch=3),
        ],
    )
    prepared = dataclasses.replace(prepared, epochs={(T, 0): 2, (T, 1): 2})
    shaped = shaper.finish(prepared, response)
    assert delivered(shaped.response)[(T, 0)] == [] and shaper.buffer.size == 0


def test_a_truncation_or_an_error_discards_held_data_and_stops_held_answers() -> None:
    for pd in (
        make_partition(V, 0, b"", hw=3),  # the log was truncated below what is held
        make_partition(V, 0, b"", hw=6, error=6),  # NOT_LEADER_OR_FOLLOWER
    ):
        shaper = _three_batches(Limits(max_records=3, max_partition_records=2))
        prepared = shaper.prepare(make_request(V, {0: (2, 10_000), 1: (0, 10_000)}))
        assert shaper.held_answer(prepared) is None
        shaped = shaper.finish(prepared, make_response(V, [pd, make_partition(V, 1, b"", hw=0)]))
        assert delivered(shaped.response).get((T, 0), []) == []
        assert shaper.buffer.size == 0
        prepared = shaper.prepare(make_request(V, {0: (2, 10_000), 1: (0, 10_000)}))
        assert shaper.held_answer(prepared) is None and prepared.upstream_offsets == {}


def test_a_partition_waiting_with_data_upstream_stops_held_answers() -> None:
    """Fairness: partition 1 has data upstream (its high watermark is past the client's
    offset) and nothing held; held answers may keep it waiting as many responses as the
    fetch has partitions (here 2: the serve rotation's own bound), then its fetch goes
    upstream although held data would fill the response."""
    shaper = FetchShaper(Limits(max_records=3), buffer_capacity=10_000)
    data = batch(0, 2) + batch(2, 2) + batch(4, 2) + batch(6, 2)
    prepared = shaper.prepare(make_request(V, {0: (0, 10_000), 1: (0, 10_000)}))
    response = make_response(V, [make_partition(V, 0, data, hw=8), make_partition(V, 1, b"", hw=9)])
    shaper.finish(prepared, response)
    assert shaper.waiting == {(T, 1): 1}
    # 2-3 fills the response (4-5 is kept back by max_records): answered from held data.
    prepared = shaper.prepare(make_request(V, {0: (2, 10_000), 1: (0, 10_000)}))
    held = shaper.held_answer(prepared)
    assert held is not None
    shaper.finish(prepared, held)
    assert shaper.waiting == {(T, 1): 2}
    # 4-5 would fill it too, but partition 1 has waited 2 responses: the fetch goes up.
    prepared = shaper.prepare(make_request(V, {0: (4, 10_000), 1: (0, 10_000)}))
    assert shaper.held_answer(prepared) is None
    # Served, it waits no more.
    shaper.finish(prepared, make_response(V, [make_partition(V, 1, batch(0, 1), hw=9)]))
    assert shaper.waiting == {}


@settings(max_examples=40, deadline=None)
@given(
    spec=st.lists(st.lists(st.integers(1, 6), min_size=0, max_size=8), min_size=1, max_size=6),
    later=st.lists(st.tuples(st.integers(0, 5), st.integers(1, 6)), max_size=10),
    seeks=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 5), st.booleans()), max_size=4),
    max_records=st.integers(1, 12),
    pb=st.sampled_from([None, 60, 200]),
    read_committed=st.booleans(),
)
def test_a_held_answer_trimmed_by_its_held_partitions_alone_is_the_general_trims(
    spec: list[list[int]],
    later: list[tuple[int, int]],
    seeks: list[tuple[int, int, bool]],
    max_records: int,
    pb: int | None,
    read_committed: bool,
) -> None:
    """``finish`` of ``held_answer``'s own response trims only the partitions with held
    data; given an equal response that is not the one it made, it trims every partition.
    In lockstep over the same traffic (the client seeking to the start or the end now and
    then), the two answer alike and keep the same state; and so does a third whose held
    partitions are ordered again (as when the response lists them in another order than
    they are held: ``_HeldMade.in_order``)."""
    n = len(spec)
    logs = model_logs(spec)
    broker = ModelBroker(V, logs)
    limits = Limits(max_records=max_records, max_partition_bytes=pb)
    fast, general, reordered = (FetchShaper(limits, buffer_capacity=600) for _ in range(3))
    offsets = {i: 0 for i in range(n)}
    pending, seek_at = list(later), {step: (i, end) for step, i, end in seeks}
    held_answers = 0
    for step in range(400):
        if pending and step % 3 == 0:
            i, count = pending.pop(0)
            logs[i % n].append(batch(0, count), leader_epoch=0)
        if step in seek_at:
            i, end = seek_at[step]
            offsets[i % n] = logs[i % n].high_watermark if end else 0
        request = make_request(V, {i: (offsets[i], 10**6) for i in range(n)})
        if read_committed:
            request = dataclasses.replace(request, isolation_level=1)
        answers = []
        for shaper, copy in ((fast, False), (general, True), (reordered, False)):
            prepared = shaper.prepare(request)
            response = shaper.held_answer(prepared)
            held = response is not None
            if response is None:
                response = broker.fetch(prepared.upstream_request)
            elif copy:
                response = dataclasses.replace(response)
            elif shaper is reordered:
                made = shaper._held_made
                assert made is not None
                shaper._held_made = dataclasses.replace(made, in_order=False)
            answers.append((held, drain(shaper.finish_in_ranges(prepared, response, 0, held=held))))
        (held, a), (held_too, b), (held_again, c) = answers
        assert held == held_too == held_again
        held_answers += held
        assert a.response == b.response == c.response
        assert a.decision == b.decision == c.decision and a.next_offsets == b.next_offsets
        assert a.result.serve_order == b.result.serve_order == c.result.serve_order
        assert a.served_after == b.served_after == c.served_after
        assert fast.waiting == general.waiting == reordered.waiting
        assert fast.watermarks == general.watermarks == reordered.watermarks
        assert fast.buffer.size == general.buffer.size == reordered.buffer.size
        for (_t, i), batches in delivered(a.response).items():
            for b_ in batches:
                offsets[i] = records.read_batch_header(b_).next_offset
        if all(offsets[i] >= logs[i].high_watermark for i in range(n)) and not pending:
            break
    assert held_answers == fast.held_answers


def test_running_ahead_each_partition_asks_at_least_the_buffers_capacity() -> None:
    """Under a record limit the partition caps are trimmed, not sent upstream: every
    partition asks at least what the reuse buffer can take (a partition the client asks
    0 bytes of stays at 0), so a broker cuts a batch at the end of the round and not at
    each partition's max_bytes, where the partial batch would be fetched again.  The
    client still gets no more of a partition than its own partition max_bytes."""
    capacity = 10_000
    shaper = FetchShaper(Limits(max_records=50, max_partition_bytes=100), buffer_capacity=capacity)
    prepared = shaper.prepare(make_request(V, {0: (0, 500), 1: (0, 0), 2: (0, 50_000)}))
    asked = {
        int(p.partition): int(p.partition_max_bytes)
        for p in prepared.upstream_request.topics[0].partitions
    }
    assert asked == {0: capacity, 1: 0, 2: 50_000}
    assert prepared.upstream_request.max_bytes <= capacity
    # Upstream sends two 71-byte batches of partitions 0 and 2 (a 100-byte cap would have
    # cut the second): each gets one, under the policy's cap; the second is held.
    two = batch(0, 1) + batch(1, 1)
    response = make_response(
        V, [make_partition(V, i, two if i != 1 else b"", hw=2) for i in range(3)]
    )
    shaped = shaper.finish(prepared, response)
    assert delivered(shaped.response) == {(T, 0): [batch(0, 1)], (T, 1): [], (T, 2): [batch(0, 1)]}
    assert shaper.buffer.size == 2 * len(batch(1, 1))
    # With byte limits alone the caps go upstream as they are.
    plain = FetchShaper(Limits(max_partition_bytes=100), buffer_capacity=capacity)
    prepared = plain.prepare(make_request(V, {0: (0, 500), 1: (0, 0)}))
    assert {int(p.partition_max_bytes) for p in prepared.upstream_request.topics[0].partitions} == {
        100,
        0,
    }
