"""Shaping's prepare in ranges (issue 19: no request holds the loop).

``FetchShaper.prepare_in_ranges`` walks a fetch's partitions in ranges that yield, as
the other stages of a large fetch do (proxy/fetchpath.py); it prepares exactly what
``prepare`` does.  At 20,000 partitions the whole prepare was the longest walk left
in a fetch (40-80 ms of CPU on a loaded machine).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from support.fetch_messages import counted, fetch_request, fetch_topics
from support.fetch_model import batch, make_partition, make_request, make_response

from proxy.protocol.messages import make, request_module
from proxy.shaping.limits import Limits
from proxy.shaping.shaper import FetchShaper

EVERY = 500
FetchPartition = request_module(1, 12).FetchPartition


def fetch(partitions: int, topics: int = 2) -> Any:
    per = partitions // topics
    return fetch_request(
        12,
        fetch_topics(
            12,
            (
                (
                    f"t{t}",
                    make(
                        FetchPartition,
                        partition=p,
                        fetch_offset=p * 3,
                        partition_max_bytes=1 << 20,
                    ),
                )
                for t in range(topics)
                for p in range(per)
            ),
        ),
        max_wait=timedelta(milliseconds=500),
    )


def test_a_large_prepare_yields_every_range_and_prepares_the_same() -> None:
    request = fetch(20_000)
    whole = FetchShaper(Limits(max_partition_bytes=4096)).prepare(request)
    sliced = FetchShaper(Limits(max_partition_bytes=4096))
    prepared, yields = counted(sliced.prepare_in_ranges(request, EVERY))
    # the offsets named (the response limits read in the same walk), the clamp and the
    # rotation's walk: 40 ranges each
    assert yields >= 3 * 20_000 // EVERY
    assert prepared == whole


def test_a_rotated_request_is_rebuilt_alike_in_ranges() -> None:
    request = fetch(4_000)
    a, b = FetchShaper(Limits()), FetchShaper(Limits())
    for shaper in (a, b):
        shaper.prepare(request)
        shaper.upstream_rotation.observe([("t0", 7)])  # the next fetch starts after t0-7
    whole = a.prepare(request)
    sliced, yields = counted(b.prepare_in_ranges(request, EVERY))
    assert sliced == whole
    assert sliced.upstream_request.topics[0].partitions[0].partition == 8
    # the offsets named (the response limits read in the same walk), the clamp, and the
    # rebuild, which walks its order too
    assert yields >= 3 * 4_000 // EVERY


def test_unsliced_prepare_does_not_yield() -> None:
    _, yields = counted(FetchShaper(Limits()).prepare_in_ranges(fetch(2_000), 0))
    assert yields == 0


# -- the walks over held data, the clamp and the moved offsets (issue 19 part 2) ----------

N = 4_000
V = 12


def _twins(limits: Limits) -> tuple[FetchShaper, FetchShaper]:
    return tuple(FetchShaper(limits, buffer_capacity=1 << 30) for _ in range(2))  # type: ignore[return-value]


def _first_round(n: int) -> tuple[Any, Any]:
    """Every partition at offset 0, upstream answers three one-record batches in each."""
    request = make_request(V, {p: (0, 1 << 20) for p in range(n)})
    data = batch(0, 1) + batch(1, 1) + batch(2, 1)
    response = make_response(V, [make_partition(V, p, data, hw=3) for p in range(n)])
    return request, response


HOLDING = Limits(max_partition_records=1, max_partition_bytes=4096)
"""One record a partition: the second and third batches of every partition are held."""


def test_finish_walks_its_outcomes_in_ranges_and_finishes_the_same() -> None:
    request, response = _first_round(N)
    whole, sliced = _twins(HOLDING)
    shaped = whole.finish(whole.prepare(request), response)
    prepared = sliced.prepare(request)
    got, yields = counted(sliced.finish_in_ranges(prepared, response, EVERY))
    assert got == shaped
    assert len(sliced.buffer) == len(whole.buffer) == N  # the batches not delivered are held
    assert sliced.watermarks == whole.watermarks and sliced.waiting == whole.waiting
    # the trim's two walks and its allocation, then its outcomes (watermarks, waits,
    # served, kept), what is kept, the serve rotation's two walks, the decision's totals
    # and its per-limit totals: 9 walks.  Before, the outcomes and decision were one step
    # (36 ms at 20,000 partitions), then the allocation, the rotation and the per-limit
    # totals (each 20-100 ms at 20,000 partitions all trimmed)
    assert yields >= 9 * N // EVERY


def test_the_clamp_to_max_partition_bytes_yields_every_range() -> None:
    request, _ = _first_round(N)
    # no record limit: the cap is sent upstream (running ahead, it is trimmed instead)
    whole, sliced = _twins(Limits(max_partition_bytes=4096))
    prepared, yields = counted(sliced.prepare_in_ranges(request, EVERY))
    assert prepared == whole.prepare(request)
    assert {p.partition_max_bytes for p in prepared.upstream_request.topics[0].partitions} == {4096}
    # the offsets named (the response limits read in the same walk), the clamp and the
    # rotation's walk
    assert yields >= 3 * N // EVERY


def _holding_twins() -> tuple[FetchShaper, FetchShaper, Any]:
    """Twin shapers after the first round (every partition's second and third batches
    held), and the fetch that asks for them next (every partition at offset 1)."""
    request, response = _first_round(N)
    a, b = _twins(HOLDING)
    for shaper in (a, b):
        shaper.finish(shaper.prepare(request), response)
    return a, b, make_request(V, {p: (1, 1 << 20) for p in range(N)})


def test_taking_held_batches_and_moving_offsets_past_them_yield_every_range() -> None:
    whole, sliced, again = _holding_twins()
    expected = whole.prepare(again)
    prepared, yields = counted(sliced.prepare_in_ranges(again, EVERY))
    assert prepared == expected and len(prepared.prefixes) == N
    assert len(sliced.buffer) == len(whole.buffer) == N  # offered, held until served
    moved = prepared.upstream_request.topics[0].partitions
    assert {p.fetch_offset for p in moved} == {3} and {p.partition_max_bytes for p in moved} == {0}
    # the offsets named (the response limits read in the same walk), the buffer's take,
    # the partitions whose held batches fill them, the offsets moved past held batches
    # (_with_offsets) and the rotation's two walks (no clamp: running ahead, the
    # partition cap is trimmed)
    assert yields >= 5 * N // EVERY


def test_a_held_answer_is_built_in_ranges_and_is_the_same() -> None:
    whole, sliced, again = _holding_twins()
    expected = whole.held_answer(whole.prepare(again))
    answer, yields = counted(sliced.held_answer_in_ranges(sliced.prepare(again), EVERY))
    assert expected is not None and answer == expected
    assert sliced.held_answers == whole.held_answers == 1
    assert yields >= 2 * N // EVERY  # the allocation of held batches and the answer's walk


def test_a_fetch_answered_from_held_data_builds_no_upstream_request() -> None:
    """The fetch path prepares without the upstream request (``upstream=False``) and builds
    it only when held data does not answer: the clamp, the moved offsets and the rotation's
    walks are spared for a held answer, and a request built later is the one ``prepare``
    builds."""
    whole, lazy, again = _holding_twins()
    expected = whole.prepare(again)
    deferred, yields = counted(lazy.prepare_in_ranges(again, EVERY, upstream=False))
    assert deferred.upstream_request is None
    assert deferred.upstream_max_bytes == int(expected.upstream_request.max_bytes)
    # the offsets named (the response limits read in the same walk) and the buffer's
    # take: two walks, not five
    assert 2 * N // EVERY - 2 <= yields < 3 * N // EVERY
    held = lazy.held_answer(deferred)
    assert held is not None and held == whole.held_answer(expected)
    assert deferred.upstream_request is None
    built, yields = counted(lazy.upstream_in_ranges(deferred, EVERY))
    assert built == expected
    # the partitions whose held batches fill them, the moved offsets, the rotation's walk
    assert yields >= 3 * N // EVERY - 3
    # a finish of either gives the same (the decision's upstream max_bytes included); told
    # the answer is held (no upstream word in it), finish skips its walk for upstream's word
    shaped, yields = counted(lazy.finish_in_ranges(deferred, held, EVERY, held=True))
    assert shaped == whole.finish(expected, held)
    assert list(lazy.buffer.keys()) == list(whole.buffer.keys())
    assert lazy.watermarks == whole.watermarks
    assert lazy.waiting == whole.waiting
    _, walked = counted(FetchShaper(HOLDING).finish_in_ranges(expected, held, EVERY))
    assert yields < walked


def test_a_full_fetch_forgets_what_it_no_longer_lists() -> None:
    """The fetch path prepares with ``forget_unlisted``: a full fetch lists every partition
    the client reads, so the held batches, watermarks and waits of one it dropped go (in
    prepare's first walk, before anything is taken); without it, they stay."""
    n = 40
    request, response = _first_round(n)
    for forget in (True, False):
        shaper = FetchShaper(HOLDING, buffer_capacity=1 << 30)
        shaper.finish(shaper.prepare(request), response)
        assert len(shaper.buffer) == n and len(shaper.watermarks) == n
        half = make_request(V, {p: (1, 1 << 20) for p in range(n // 2)})
        prepared = drain_prepare(shaper, half, forget)
        assert len(prepared.prefixes) == n // 2
        kept = {k[1] for k in shaper.buffer.keys()} | {k[1] for k in shaper.watermarks}
        if forget:
            assert kept == set(range(n // 2))  # (the taken batches left the buffer)
        else:
            assert kept == set(range(n))


def drain_prepare(shaper: FetchShaper, request: Any, forget: bool) -> Any:
    prepared, _ = counted(shaper.prepare_in_ranges(request, EVERY, forget_unlisted=forget))
    return prepared


def test_a_full_fetch_of_as_many_other_partitions_forgets_the_dropped_ones() -> None:
    """A client that drops a partition and adds another lists as many as before: the
    dropped one's watermarks go all the same (nothing held: the buffer keeps nothing)."""
    n = 40
    request, response = _first_round(n)
    shaper = FetchShaper(HOLDING)
    shaper.finish(shaper.prepare(request), response)
    assert len(shaper.buffer) == 0 and {k[1] for k in shaper.watermarks} == set(range(n))
    moved = make_request(V, {p: (1, 1 << 20) for p in range(1, n + 1)})
    drain_prepare(shaper, moved, True)
    assert {k[1] for k in shaper.watermarks} == set(range(1, n))


@pytest.mark.parametrize("version", [4, 8, 11, 12, 17])
def test_prepare_reads_any_request_partition_alike(version: int) -> None:
    """prepare's walk reads kio's v9+ partitions straight (``partition_plan.FROM_V9``) and
    anything else through ``int()`` and ``getattr``: the offsets, epochs and limits it
    gives are the same."""
    from types import SimpleNamespace

    request = make_request(version, {p: (p * 3, 1000 + p) for p in range(8)})
    fields = ("partition", "fetch_offset", "partition_max_bytes", "current_leader_epoch")
    plain = SimpleNamespace(
        **{f: getattr(request, f) for f in ("max_bytes", "isolation_level") if hasattr(request, f)},
        topics=tuple(
            SimpleNamespace(
                **{f: getattr(t, f) for f in ("topic", "topic_id") if hasattr(t, f)},
                partitions=tuple(
                    SimpleNamespace(**{f: getattr(p, f) for f in fields if hasattr(p, f)})
                    for p in t.partitions
                ),
            )
            for t in request.topics
        ),
    )
    fast = FetchShaper(HOLDING).prepare(request)
    general = FetchShaper(HOLDING).prepare(plain)
    assert fast.client_offsets == general.client_offsets
    assert fast.epochs == general.epochs
    assert fast.response_limits == general.response_limits
