from __future__ import annotations

import pytest
from support.fetch_model import batch

from proxy.shaping.budget import MemoryBudget
from proxy.shaping.buffer import ReuseBuffer
from proxy.shaping.trim import PartitionOutcome, Run, parse_records

K = ("t", 0)


def run(base: int, *counts: int) -> bytes:
    out = b""
    for c in counts:
        out += batch(base, c)
        base += c
    return out


def held(base: int, *counts: int):  # type: ignore[no-untyped-def]
    return parse_records(run(base, *counts))[0]


def test_serves_at_matching_offset_and_moves_upstream_offset() -> None:
    buf = ReuseBuffer(10_000)
    r = held(5, 2, 3)
    assert buf.put(K, 5, r, leader_epoch=3, high_watermark=100) == r.size
    assert buf.size == r.size and K in buf and len(buf) == 1
    assert buf.upstream_offset(K, 5, 3) == 10
    prefix = buf.offer(K, 5, 3)
    assert prefix is not None and prefix.run.data == r.data and prefix.high_watermark == 100
    assert buf.size == r.size and buf.offer(K, 5, 3) == prefix  # held until settled
    buf.hand_over(K)  # served
    assert buf.size == 0 and buf.offer(K, 5, 3) is None


@pytest.mark.parametrize("offset,epoch", [(4, 3), (6, 3), (5, 4), (5, -1)])
def test_dropped_when_offset_or_epoch_do_not_match(offset: int, epoch: int) -> None:
    buf = ReuseBuffer(10_000)
    buf.put(K, 5, held(5, 2), leader_epoch=3, high_watermark=100)
    assert buf.upstream_offset(K, offset, epoch) == offset
    assert K not in buf and buf.size == 0 and buf.dropped == 1


def test_dropped_on_error_epoch_change_and_high_watermark_going_back() -> None:
    buf = ReuseBuffer(10_000)
    buf.put(K, 5, held(5, 2), leader_epoch=3, high_watermark=100)
    assert not buf.observe(K, error_code=0, high_watermark=100, leader_epoch=3)
    assert not buf.observe(K, high_watermark=150, leader_epoch=-1)  # unknown epoch: no change
    assert buf.observe(K, high_watermark=99)
    buf.put(K, 5, held(5, 2), leader_epoch=3, high_watermark=100)
    assert buf.observe(K, error_code=6)
    buf.put(K, 5, held(5, 2), leader_epoch=3, high_watermark=100)
    assert buf.observe(K, leader_epoch=4)
    assert buf.size == 0 and buf.dropped == 3
    assert not buf.observe(K, error_code=1)  # nothing held


def test_bounded_keeps_leading_whole_batches_only() -> None:
    one = len(batch(0, 1))
    buf = ReuseBuffer(2 * one + 10)
    assert buf.put(K, 0, held(0, 1, 1, 1), high_watermark=9) == 2 * one
    assert buf.put(("t", 1), 0, held(0, 1), high_watermark=9) == 0  # no room left
    p = buf.peek(K)
    assert p is not None and len(p.run.headers) == 2 and p.run.next_offset == 2
    buf.put(K, 0, held(0, 1), high_watermark=9)  # replaces
    assert buf.size == one
    assert buf.put(K, 5, held(0, 1, 1), high_watermark=9) == 0  # nothing past the offset
    assert buf.put(K, 5, parse_records(b"")[0], high_watermark=9) == 0
    with pytest.raises(ValueError):
        ReuseBuffer(-1)


def test_counts_against_the_memory_budget() -> None:
    r = held(0, 2, 2)
    budget = MemoryBudget(r.size + 5)
    buf = ReuseBuffer(10_000, budget=budget)
    assert buf.put(K, 0, r, high_watermark=9) == r.size
    assert budget.used == r.size
    other = ReuseBuffer(10_000, budget=budget)
    assert other.put(K, 0, r, high_watermark=9) == 0  # the budget has no room: not kept
    buf.drop(K)
    assert budget.used == 0
    buf.put(K, 0, r, high_watermark=9)
    buf.clear()
    assert budget.used == 0 and buf.size == 0 and list(buf.keys()) == []


class CountingBuffer(ReuseBuffer):
    """A reuse buffer that counts how often it is cleared (visited by a shed)."""

    def __init__(self, capacity: int, *, budget: MemoryBudget) -> None:
        super().__init__(capacity, budget=budget)
        self.cleared = 0

    def clear(self) -> None:
        self.cleared += 1
        super().clear()


def test_shedding_visits_only_the_buffers_that_hold_bytes() -> None:
    r = held(0, 2, 2)
    budget = MemoryBudget(100 * r.size)
    buffers = [CountingBuffer(10_000, budget=budget) for _ in range(1000)]
    assert budget.holders == 0 and not budget.shed()  # nothing held: nothing visited
    assert sum(b.cleared for b in buffers) == 0
    for b in (buffers[3], buffers[500], buffers[999]):
        b.put(K, 0, r, high_watermark=9)
        b.put(("t", 1), 0, r, high_watermark=9)  # a second entry: still one holder
    buffers[500].drop(K)
    buffers[500].drop(("t", 1))  # emptied by a drop: no longer a holder
    assert budget.holders == 2 and budget.used == 4 * r.size
    assert budget.shed()
    assert [i for i, b in enumerate(buffers) if b.cleared] == [3, 999]
    assert budget.used == 0 and budget.holders == 0
    assert not budget.shed()  # nothing left: nothing visited again
    assert sum(b.cleared for b in buffers) == 2


def test_a_buffer_is_a_holder_exactly_while_it_holds_bytes() -> None:
    r = held(0, 2)
    budget = MemoryBudget(10 * r.size)
    buf = ReuseBuffer(10_000, budget=budget)
    buf.put(K, 0, r, high_watermark=9)
    assert budget.holders == 1
    assert buf.offer(K, 0) is not None
    buf.hand_over(K)  # served: empty again
    assert budget.holders == 0
    buf.put(K, 0, r, high_watermark=9)
    assert buf.upstream_offset(K, 7) == 7  # the client seeked: dropped
    assert budget.holders == 0
    buf.put(K, 0, r, high_watermark=9)
    assert buf.observe(K, error_code=6)
    assert budget.holders == 0
    full = MemoryBudget(r.size - 1)
    unkept = ReuseBuffer(10_000, budget=full)
    assert unkept.put(K, 0, r, high_watermark=9) == 0  # no room: not kept, not a holder
    assert full.holders == 0
    unbudgeted = ReuseBuffer(10_000)
    assert unbudgeted.put(K, 0, r, high_watermark=9) == r.size


def test_head_is_split_view_s_head_and_owns_a_cut() -> None:
    """The buffer keeps ``Run.head(count)``: ``split_view(count)[0]`` without making the
    tail, and owned where it is cut."""
    data = run(0, 1, 2, 3)
    for source in (data, memoryview(data + b"\x00" * 7)[: len(data)]):
        whole = parse_records(source)[0]
        for count in range(-1, len(whole.headers) + 2):
            head, expected = whole.head(count), whole.split_view(count)[0]
            assert bytes(head.data) == bytes(expected.data)
            assert head.headers == expected.headers and head.aborted == expected.aborted
            if 0 < count < len(whole.headers):
                assert type(head.data) is bytes  # a cut head pins nothing
            if count >= len(whole.headers):
                assert head is whole  # kept as it is, as split_view keeps it


def test_an_offered_run_a_response_did_not_serve_stays_held_with_the_newer_marks() -> None:
    r = held(0, 2)
    budget = MemoryBudget(10 * r.size)
    buf = ReuseBuffer(10_000, budget=budget)
    buf.put(K, 0, r, high_watermark=9, last_stable_offset=9, log_start_offset=0)
    prefix = buf.offer(K, 0)
    assert prefix is not None and budget.used == r.size
    assert not buf.keep_unserved(K, _unserved(held(0, 2)), (9, 9, 0))  # not the run it holds
    assert buf.unserved(K) is None
    outcome = _unserved(prefix.run)
    assert buf.keep_unserved(K, outcome, (12, 10, 1))
    assert buf.unserved(K) is outcome  # given again while the entry holds that run
    kept = buf.offer(K, 0)
    assert kept is not None and kept.run is prefix.run and budget.used == r.size
    assert (kept.high_watermark, kept.last_stable_offset, kept.log_start_offset) == (12, 10, 1)
    grant = budget.reservation()
    buf.hand_over(K, grant)  # served: its bytes now the fetch's
    assert len(buf) == 0 and grant.nbytes == r.size and budget.used == r.size
    assert buf.unserved(K) is None  # (gone with the entry: it pins nothing)
    assert not buf.keep_unserved(K, outcome, (12, 10, 1))
    buf.put(K, 0, prefix.run, high_watermark=12)
    assert buf.unserved(K) is None  # a new entry: nothing given yet


def _unserved(run: Run) -> PartitionOutcome:
    return PartitionOutcome(
        key=K,
        error_code=0,
        upstream_bytes=0,
        upstream_records=0,
        offered_bytes=run.size,
        reused_bytes=run.size,
        delivered_bytes=0,
        delivered_records=0,
        delivered_batches=0,
        dropped_partial_bytes=0,
        next_offset=None,
        exempt=False,
        limited_by=frozenset({"response_records"}),
        remainder=run,
    )
