"""``CopyPool``: the owned copies of held records, in buffers used again once nothing refers
to them (``proxy.protocol.framing``), and trimming with it (``proxy.shaping.trim``)."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st
from support.fetch_model import batch, delivered, make_partition, make_response, topic_name_or_id

from proxy.protocol.framing import COPY_POOL_FROM, CopyPool, copy_class
from proxy.shaping.limits import ResponseLimits
from proxy.shaping.trim import Prefix, concat, parse_records, trim_response

BIG = COPY_POOL_FROM + 1000


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=COPY_POOL_FROM, max_value=1 << 34))
def test_a_copy_s_allocation_is_at_most_an_eighth_more_than_it_holds(size: int) -> None:
    alloc = copy_class(size)
    assert size <= alloc <= size + size // 8
    assert copy_class(alloc) == alloc  # a class size is its own class
    assert copy_class(size + 1) >= alloc


def test_a_copy_is_its_parts_joined_and_small_ones_are_bytes() -> None:
    pool = CopyPool()
    small = pool.copy(b"ab", memoryview(b"cd"))
    assert type(small) is bytes and small == b"abcd" and pool.kept_bytes == 0
    parts = (b"x" * 1000, bytearray(b"y" * BIG), memoryview(b"0123456789" * 100)[3:903])
    big = pool.copy(*parts)
    assert type(big) is bytearray and bytes(big) == b"".join(parts)
    assert len(big) < big.__alloc__() <= copy_class(len(big)) + 1
    assert pool.kept_bytes == big.__alloc__()


def test_a_buffer_is_taken_again_only_once_nothing_refers_to_it() -> None:
    pool = CopyPool()
    first = pool.copy(b"a" * BIG)
    kept_view = memoryview(first)[10:20]  # an answer's head, as trimming gives it
    first_id = id(first)
    del first
    second = pool.copy(b"b" * BIG)  # the same class, but the first is referred to
    assert id(second) != first_id and pool.reused == 0
    assert bytes(kept_view) == b"a" * 10  # and its bytes are as they were copied
    del kept_view
    third = pool.copy(b"c" * (BIG - 10))  # the first is idle now: written over
    assert id(third) == first_id and pool.reused == 1
    assert bytes(third) == b"c" * (BIG - 10) and len(third) == BIG - 10
    assert bytes(second) == b"b" * BIG


def test_idle_buffers_keep_at_most_the_room_they_are_given() -> None:
    room = [1 << 30]
    pool = CopyPool(room=lambda: room[0])
    held = [pool.copy(b"z" * (1 << 20)) for _ in range(4)]
    one = held[0].__alloc__()
    assert pool.kept_bytes == 4 * one
    del held
    assert pool.idle_bytes() == 4 * one
    room[0] = 2 * one
    in_use = pool.copy(b"q" * (1 << 20))  # idle ones let go past the room, one taken again
    assert pool.reused == 1
    assert pool.idle_bytes() <= room[0] and pool.kept_bytes <= room[0] + in_use.__alloc__()
    room[0] = 0
    other = pool.copy(b"w" * (3 << 20))  # no idle buffer may stay
    assert pool.idle_bytes() == 0
    assert pool.kept_bytes == in_use.__alloc__() + other.__alloc__()


def test_at_most_per_class_buffers_of_one_size_are_kept() -> None:
    pool = CopyPool(per_class=2)
    held = [pool.copy(b"p" * BIG) for _ in range(5)]  # all in use: only two are kept
    assert pool.kept_bytes == 2 * held[0].__alloc__()
    assert len({id(b) for b in held}) == 5
    assert type(CopyPool(per_class=0).copy(b"p" * BIG)) is bytes


def test_idle_buffers_not_taken_for_a_while_are_let_go() -> None:
    pool = CopyPool()
    kept = pool.copy(b"k" * BIG)
    idle = pool.copy(b"i" * BIG)
    del idle
    assert pool.release_idle() == 0  # both were taken since the start
    assert pool.release_idle() == kept.__alloc__()  # the idle one was not since then
    assert pool.kept_bytes == kept.__alloc__()  # the one in use stays


V = 12


def _seq(base: int, count: int) -> bytes:
    """*count* batches of one record of 8 KiB each."""
    return b"".join(batch(base + i, 1, payload=8192) for i in range(count))


def test_trimming_with_a_pool_gives_what_trimming_without_one_gives() -> None:
    """Partition 0 is cut after its first batch (its tail is copied), partition 1 gets
    nothing (copied whole), partition 2 is held and extended (the joined run is copied)."""
    key = [(topic_name_or_id(V), i) for i in range(3)]
    data = [_seq(0, 50), _seq(0, 50), _seq(60, 40)]
    assert all(len(d) >= COPY_POOL_FROM for d in data)
    held_before = parse_records(_seq(0, 60))[0]
    prefixes = {key[2]: Prefix(held_before, 1000)}
    # the records as a decoded frame gives them: views into its body
    body = bytearray(b"".join(data))
    at = [0, len(data[0]), len(data[0]) + len(data[1]), len(body)]
    views = [memoryview(body)[at[i] : at[i + 1]] for i in range(3)]
    response = make_response(V, [make_partition(V, i, v) for i, v in enumerate(views)])
    limits = ResponseLimits(response_records=15)
    pool = CopyPool()
    plain = trim_response(response, limits, prefixes=prefixes)
    pooled = trim_response(response, limits, prefixes=prefixes, copy=pool.copy)
    assert delivered(pooled.response) == delivered(plain.response)
    for k in key:
        a, b = plain.outcomes[k], pooled.outcomes[k]
        assert bytes(a.remainder.data) == bytes(b.remainder.data)
        assert a.remainder.headers == b.remainder.headers
        assert dataclasses.replace(a, remainder=None) == dataclasses.replace(b, remainder=None)
    # every remainder is the pool's: a cut tail, a whole run, a joined one
    assert [type(pooled.outcomes[k].remainder.data) for k in key] == [bytearray] * 3
    assert [type(plain.outcomes[k].remainder.data) for k in key] == [bytes] * 3
    joined = concat(held_before, parse_records(data[2])[0], pool.copy)
    assert type(joined.data) is bytearray
    assert bytes(joined.data) == bytes(concat(held_before, parse_records(data[2])[0]).data)


def test_the_fetch_path_s_shapers_copy_into_its_pool_and_its_idle_buffers_go_back() -> None:
    from proxy import config
    from proxy.config import FetchPathConfig
    from proxy.fetchpath import FetchPath

    path = FetchPath(FetchPathConfig.from_raw(config.validate({"upstream": ["k:1"]}).raw))
    handler = path.handler(1)
    assert handler.shaper.copy == path.copies.copy
    held = path.copies.copy(b"h" * BIG)
    frame = path.bodies.take(BIG)
    del held, frame
    assert path.release_idle() == 0  # both taken since the start
    freed = path.release_idle()
    assert freed >= 2 * BIG and path.copies.kept_bytes == 0 and path.bodies.kept_bytes == 0
    # the pool's idle buffers get the budget's free bytes the idle frame bodies leave
    assert path.copies.room is not None
    assert path.copies.room() == path.budget.headroom
    body = path.bodies.take(BIG)
    assert path.copies.room() == path.budget.headroom  # in use: the budget counts it
    alloc = body.__alloc__()
    del body
    assert path.bodies.idle_bytes() == alloc
    assert path.copies.room() == path.budget.headroom - alloc


def test_a_copy_into_a_buffer_taken_again_makes_no_temporary() -> None:
    """The parts are written through a view: a bytearray's slice assignment from a
    memoryview first copies the source into a temporary as large as the copy, which for
    a large copy is the fresh mapping the pool is there to avoid."""
    import tracemalloc

    pool = CopyPool()
    source = memoryview(bytes(range(256)) * 4096)  # 1 MiB
    first = pool.copy(source)
    del first
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        again = pool.copy(source[:1000], source[1000:])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert pool.reused == 1 and bytes(again) == bytes(source)
    assert peak < 64 * 1024  # no temporary of the copy's size
