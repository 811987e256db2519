from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.shaping.budget import MemoryBudget, Reservation


def test_fetch_grant_is_lowered_to_headroom_but_not_below_floor() -> None:
    b = MemoryBudget(1000, floor=100)
    g1 = b.acquire_fetch(700)
    assert g1 is not None and g1.nbytes == 700
    g2 = b.acquire_fetch(700)
    assert g2 is not None and g2.nbytes == 300  # lowered to what is left
    assert b.headroom == 0 and b.acquire_fetch(50) is None and b.waits == 1
    g1.resize(150)  # the response was smaller than asked
    assert b.fetch_size(700) == 550
    g2.release()
    g2.release()  # idempotent
    assert b.used == 150 and b.peak == 1000


def test_small_requests_need_only_their_own_size() -> None:
    b = MemoryBudget(1000, floor=500)
    assert b.acquire_fetch(900) is not None
    assert b.fetch_size(600) is None  # 100 left < floor
    assert b.fetch_size(80) == 80  # asks for less than the floor: fits
    assert b.fetch_size(0) == 0


def test_working_copy_is_kept_back_from_every_reservation() -> None:
    b = MemoryBudget(1000, floor=100)
    heard: list[int] = []
    b.add_listener(lambda: heard.append(b.used))
    b.set_working(300)
    assert b.used == 300 and b.headroom == 700 and b.peak == 300 and heard == []
    g = b.acquire_fetch(1000)
    assert g is not None and g.nbytes == 700  # the working copy's bytes are not granted
    assert b.try_reserve(1) is None and b.fetch_size(100) is None
    b.set_working(200)  # smaller: room appeared, waiting fetches must hear of it
    assert heard == [900] and b.fetch_size(100) == 100
    g.release()
    assert b.used == 200 and b.peak == 1000 and b.overshoot_bytes == 0
    for bad in (-1, 901):  # a floor-sized fetch must always remain possible
        with pytest.raises(ValueError):
            b.set_working(bad)


def test_listeners_hear_releases_only() -> None:
    b = MemoryBudget(100)
    calls: list[int] = []

    def hook() -> None:
        calls.append(b.used)

    b.add_listener(hook)
    r = b.try_reserve(60)
    assert r is not None and calls == []
    assert r.try_grow(30) and not r.try_grow(20)
    r.resize(10)
    r.release()
    assert calls == [10, 0]
    b.remove_listener(hook)


def test_overshoot_is_recorded_when_data_is_already_in_memory() -> None:
    b = MemoryBudget(100)
    r = b.acquire_fetch(100)
    assert r is not None
    r.resize(130)  # one batch larger than the grant (KIP-74 exemption)
    assert b.overshoot_bytes == 30 and b.peak == 130
    r.release()
    with pytest.raises(RuntimeError):
        r.resize(1)


def test_invalid_arguments() -> None:
    with pytest.raises(ValueError):
        MemoryBudget(0)
    with pytest.raises(ValueError):
        MemoryBudget(10, floor=11)
    b = MemoryBudget(10)
    with pytest.raises(ValueError):
        b.try_reserve(-1)
    with pytest.raises(ValueError):
        b.fetch_size(-1)
    r = Reservation(b, 0)
    with pytest.raises(ValueError):
        r.resize(-1)


@settings(max_examples=200, deadline=None)
@given(
    capacity=st.integers(1, 5000),
    floor=st.integers(1, 5000),
    ops=st.lists(
        st.tuples(st.sampled_from(["fetch", "settle", "release", "buffer"]), st.integers(0, 6000)),
        max_size=60,
    ),
)
def test_budget_never_exceeded_when_responses_stay_within_their_grant(
    capacity: int, floor: int, ops: list[tuple[str, int]]
) -> None:
    b = MemoryBudget(capacity, floor=min(floor, capacity))
    held: list[list[object]] = []  # [reservation, its grant, settled]
    for op, n in ops:
        if op == "fetch":
            r = b.acquire_fetch(n)
            if r is None:
                assert b.headroom < min(n, b.floor)
            else:
                assert min(n, b.floor) <= r.nbytes <= n
                held.append([r, r.nbytes, False])
        elif op == "buffer":
            r = b.try_reserve(n)
            if r is not None:
                held.append([r, r.nbytes, True])
        elif held:
            entry = held[n % len(held)]
            r, grant, settled = entry
            assert isinstance(r, Reservation) and isinstance(grant, int)
            if op == "settle" and not settled and not r.released:
                r.resize(n % (grant + 1))  # a response never carries more than its grant
                entry[2] = True
            else:
                r.release()
        assert 0 <= b.used <= capacity
        assert b.used == sum(
            e[0].nbytes for e in held if isinstance(e[0], Reservation) and not e[0].released
        )
    assert b.peak <= capacity and b.overshoot_bytes == 0
