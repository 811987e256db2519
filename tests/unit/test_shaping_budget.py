from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.dev_upstream import PARTITIONS, Upstream, client_fetch
from support.fetch_model import batch

from proxy.config import FetchPathConfig
from proxy.fetchpath import FetchPath
from proxy.protocol import codec
from proxy.protocol.framing import payload_bytes
from proxy.relay.relay import Relay
from proxy.shaping.budget import FetchAdmission, MemoryBudget, Reservation, response_bound
from proxy.shaping.buffer import ReuseBuffer
from proxy.shaping.trim import parse_records


def test_a_reservation_resizes_and_is_released_once() -> None:
    b = MemoryBudget(1000, floor=100)
    g1 = b.try_reserve(700)
    g2 = b.try_reserve(300)
    assert g1 is not None and g2 is not None and b.headroom == 0
    assert b.try_reserve(50) is None
    g1.resize(150)  # the response was smaller than asked
    assert b.headroom == 550
    g2.release()
    g2.release()  # idempotent
    assert b.used == 150 and b.peak == 1000


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
    r = b.try_reserve(100)
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
        if op == "fetch":  # a response of n bytes: its grant grows by n if they fit
            r = b.reservation()
            if r.try_grow(n):
                held.append([r, r.nbytes, False])
            else:
                assert b.headroom < n and r.nbytes == 0
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


def test_response_bound_is_each_partition_s_max_bytes_plus_the_one_batch_exemption() -> None:
    assert response_bound([], 1000) == 0  # no partitions: no records
    assert response_bound([1000], 1000) == 1000
    assert response_bound([100, 300], 1000) == 400 + 900  # the first batch may be 1000
    assert response_bound([5000, 3000], 1000) == 8000
    assert response_bound([5000, 3000], 1000, partition_cap=2000) == 4000
    assert response_bound([-1, 10], 5) == 10 + 5  # a negative max_bytes returns nothing


@settings(max_examples=500, deadline=None)
@given(
    sizes=st.lists(st.integers(-(2**31), 2**31 - 1), max_size=12),
    floor=st.integers(0, 2**31 - 1),
    cap=st.none() | st.integers(0, 2**31 - 1),
)
def test_response_bound_is_the_sum_of_clamped_sizes_and_the_exemption(
    sizes: list[int], floor: int, cap: int | None
) -> None:
    """The bound, computed with the built-ins over the whole list, is the plain per-partition
    sum: each size capped and not below 0, plus what the floor exceeds the least by."""
    clamped = [max(0, n if cap is None else min(n, cap)) for n in sizes]
    expected = sum(clamped) + max(0, floor - min(clamped)) if clamped else 0
    assert response_bound(sizes, floor, cap) == expected
    assert response_bound(iter(sizes), floor, cap) == expected  # any iterable, read once


@settings(max_examples=300, deadline=None)
@given(
    floor=st.integers(1, 3000),
    partitions=st.lists(
        st.tuples(st.integers(0, 4000), st.integers(0, 8000), st.integers(1, 3000)), max_size=8
    ),
    max_bytes=st.integers(0, 30000),
    cap=st.none() | st.integers(0, 4000),
)
def test_a_kip74_broker_never_returns_more_than_the_response_bound(
    floor: int, partitions: list[tuple[int, int, int]], max_bytes: int, cap: int | None
) -> None:
    """Kafka's ReplicaManager.readFromLog, in bytes: each partition (max_bytes, bytes in
    its log, size of its first batch <= message.max.bytes) returns up to min(its max_bytes,
    what is left of the response's), except that until one has returned data the first
    whole batch is returned even when larger (KIP-74)."""
    limit, min_one, total = max_bytes, True, 0
    for pmb, available, first in partitions:
        pmb = pmb if cap is None else min(pmb, cap)
        first = min(first, floor, available) if available else 0
        adjusted = min(pmb, limit)
        got = min(available, adjusted)
        if min_one and first > adjusted:
            got = first
        if got:
            min_one = False
        limit = max(0, limit - got)
        total += got
    assert total <= response_bound([p for p, _, _ in partitions], floor, cap)
    assert total <= max(max_bytes, floor)  # the bound the grant already had


def test_fetch_bytes_is_capped_by_what_the_partitions_can_return_only_under_a_budget() -> None:
    admission = FetchAdmission(128 << 20)
    assert admission.fetch_bytes(50 << 20, None) == 8 << 20  # budget/16
    assert admission.fetch_bytes(50 << 20, None, most_bytes=1 << 20) == 1 << 20
    assert admission.fetch_bytes(50 << 20, 1 << 19, most_bytes=1 << 20) == 1 << 19
    assert admission.fetch_bytes(50 << 20, None, most_bytes=64 << 20) == 8 << 20
    unlimited = FetchAdmission(None)  # accounting only: the client's own max_bytes
    assert unlimited.fetch_bytes(50 << 20, None, most_bytes=1 << 20) == 50 << 20


class Client:
    """One client connection's Relay and FetchPathHandler; upstream answered on demand."""

    def __init__(self, path: FetchPath, up: Upstream) -> None:
        self.up = up
        self.handler = path.handler(1)
        self.handler.bind_waker(lambda: None)  # an edge: grants are held until written()
        self.relay = Relay(lambda node_id, host, port: None, fetch_handler=self.handler)
        self.upstream: list[bytes] = []

    def send(self, request: Any, correlation_id: int) -> None:
        self.relay.client_frame(codec.encode_request(request, correlation_id, "rdkafka"))
        self.upstream += self.relay.take_upstream()

    def answer(self) -> Any:
        """Answer the upstream fetches sent so far; the client's decoded response."""
        frames, self.upstream = self.upstream, []
        for frame in frames:
            header, request = codec.decode_request(frame)
            response = self.up.answer(self.up.fetcher, request)
            self.relay.upstream_frame(codec.encode_response(response, header.correlation_id))
        [out] = [payload_bytes(p) for p in self.relay.take_client()]
        self.handler.written()
        return codec.decode_response(1, 12, out)[1]

    def upstream_max_bytes(self) -> list[int]:
        return [int(codec.decode_request(f)[1].max_bytes) for f in self.upstream]


def test_idle_long_polls_of_one_partition_each_hold_one_partition_s_worth() -> None:
    """64 MiB budget: 50 long polls of one partition (max.partition.fetch.bytes 1 MiB,
    fetch.max.bytes 50 MiB) all wait upstream at once; each asks upstream for 1 MiB, not 4,
    and none holds budget while it waits (memory is taken when a response's size is known)."""
    up = Upstream()
    path = FetchPath(FetchPathConfig(memory_budget_bytes=64 << 20))
    budget = path.budget
    one = response_bound([1 << 20], budget.floor)
    clients = [Client(path, up) for _ in range(50)]
    for c in clients:
        c.send(client_fetch(up, 12, [("orders", 0, 0)]), 1)
    assert path.fetch_waits == 0
    assert [c.upstream_max_bytes() for c in clients] == [[one]] * 50
    assert budget.used == 0  # waiting upstream, they hold nothing
    # Fetches of every partition (7 MiB could come back) still ask for budget/16 each,
    # however many wait: no fetch waits to be sent.
    wide = [Client(path, up) for _ in range(40)]
    everything = [(t, p, 0) for t, p in PARTITIONS]
    for c in wide:
        c.send(client_fetch(up, 12, everything), 1)
    assert [c.upstream_max_bytes() for c in wide] == [[4 << 20]] * 40
    assert path.fetch_waits == 0 and budget.used == 0


def test_an_incremental_fetch_is_bounded_by_its_session_s_partitions() -> None:
    up = Upstream()
    path = FetchPath(FetchPathConfig(memory_budget_bytes=128 << 20))
    budget = path.budget
    c = Client(path, up)
    full = client_fetch(up, 12, [("orders", 0, 0), ("orders", 1, 0)])
    c.send(dataclasses.replace(full, session_epoch=0), 1)  # creates a session
    assert c.upstream_max_bytes() == [response_bound([1 << 20] * 2, budget.floor)]
    session_id = int(c.answer().session_id)
    assert session_id != 0
    # Nothing changed: the request lists no partitions, its response may carry both.
    c.send(dataclasses.replace(full, session_id=session_id, session_epoch=1, topics=()), 2)
    assert c.upstream_max_bytes()[-1] == response_bound([1 << 20] * 2, budget.floor)
    c.answer()
    assert budget.used == 0
    # A session the proxy does not know: answered with a session error, never bounded low.
    c.send(dataclasses.replace(full, session_id=session_id + 1, session_epoch=5, topics=()), 3)
    assert int(c.answer().error_code) != 0 and budget.used == 0


K = ("t", 0)


def one_batch(base: int, count: int) -> Any:
    """A run of one batch of *count* records at *base* (what a reuse buffer keeps)."""
    return parse_records(batch(base, count))[0]


class Sleeper:
    """A waiting connection (a fake FetchPathHandler): records when it is woken."""

    def __init__(self, log: list[Sleeper]) -> None:
        self.log = log

    def wake(self) -> None:
        self.log.append(self)


def test_a_release_wakes_only_the_waiters_it_can_start_oldest_first() -> None:
    admission = FetchAdmission(64 << 20)
    budget = admission.budget
    woken: list[Sleeper] = []
    taken = budget.try_reserve(budget.headroom)  # everything
    assert taken is not None and budget.headroom == 0
    sleepers = [Sleeper(woken) for _ in range(1000)]
    for s in sleepers:
        admission.wait(s, retry=False, nbytes=1 << 20)
    admission.wait(sleepers[0], retry=False, nbytes=1 << 20)  # once, however often asked
    assert admission.waits == 1000
    taken.resize(taken.nbytes - (1 << 19))  # half a fetch's worth: starts none, wakes none
    assert woken == []
    taken.resize(taken.nbytes - 3 * (1 << 20) + (1 << 19))  # room for three
    assert woken == sleepers[:3]
    admission.wait(sleepers[1], retry=True, nbytes=1 << 20)  # found no room: back in front
    admission.leave(sleepers[3])  # its connection closed
    woken.clear()
    taken.release()
    assert woken[:3] == [sleepers[1], sleepers[4], sleepers[5]]
    assert len(woken) == budget.headroom // (1 << 20) and admission.waiting(sleepers[999])


def test_the_oldest_waiter_is_woken_without_room_when_buffers_can_be_shed() -> None:
    admission = FetchAdmission(64 << 20)
    budget = admission.budget
    woken: list[Sleeper] = []
    r = one_batch(0, 2)
    buf = ReuseBuffer(10 << 20, budget=budget)
    buf.put(K, 0, r, high_watermark=9)
    grant = budget.try_reserve(budget.headroom)
    assert grant is not None and budget.headroom == 0
    first, second = Sleeper(woken), Sleeper(woken)
    admission.wait(first, retry=False, nbytes=1 << 20)
    admission.wait(second, retry=False, nbytes=1 << 20)
    grant.resize(grant.nbytes - 1)  # one byte free: only a shed can make room
    assert woken == [first]
    woken.clear()
    admission.wake_waiters()  # a reload: the oldest retries whatever the headroom
    assert woken == [second]


def test_a_response_takes_budget_when_its_size_is_known_within_a_fair_share() -> None:
    """KIP-72 style: a fetch's grant holds nothing until its response's size is known;
    then the response takes what fits, and while others wait no connection takes more
    than its share (the budget split between the waiters and one more)."""
    mib = 1 << 20
    admission = FetchAdmission(32 * mib)
    budget = admission.budget
    first, second, third = (Sleeper([]) for _ in range(3))
    grants = [budget.reservation() for _ in range(3)]
    assert budget.used == 0  # fetches waiting upstream hold nothing
    hog = budget.try_reserve(budget.headroom - mib)  # 1 MiB of room left
    assert hog is not None
    assert not admission.take(first, grants[0], 2 * mib, held=0)  # does not fit
    admission.wait(first, retry=False, nbytes=2 * mib)
    assert admission.share() == 16 * mib  # 32 MiB over the waiter and one more
    # Others wait: a connection under its share takes what fits ...
    assert admission.take(second, grants[1], mib // 2, held=0)
    assert grants[1].nbytes == mib // 2
    # ... one beyond it waits behind them, even though it would fit.
    assert not admission.take(third, grants[2], 1000, held=16 * mib)
    assert grants[2].nbytes == 0
    # The oldest waiter takes what fits, whatever it holds.
    hog.resize(hog.nbytes - 2 * mib)
    assert admission.take(first, grants[0], 2 * mib, held=29 * mib)
    admission.leave(first)
    assert admission.take(third, grants[2], 1000, held=16 * mib)  # nobody waits now
    # A response larger than the budget can ever hold gets in when nothing else is held.
    for r in (hog, *grants):
        r.release()
    big = budget.reservation()
    assert admission.take(first, big, 64 * mib, held=0) and budget.overshoot_bytes > 0
