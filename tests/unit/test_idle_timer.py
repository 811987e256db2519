"""One idle timer for every connection (``proxy.server.idle``): each connection is a heap
entry looked at when its deadline comes, not a task of its own (a few KiB each of
thousands of idle connections, BENCHMARKS.md, Memory per idle connection)."""

from __future__ import annotations

import gc
import math
import weakref

import pytest
import trio
import trio.testing

from proxy.relay.relay import PassThroughFetch, Relay
from proxy.server.connection import Connection
from proxy.server.idle import IdleTimer


class Watched:
    """A connection as the timer sees it: its check, what it was asked and what it says."""

    def __init__(self, again: list[float | None]) -> None:
        self.again = again
        self.asked: list[float] = []

    def check(self, now: float) -> float | None:
        self.asked.append(now)
        return self.again.pop(0)


def test_a_connection_is_looked_at_when_its_deadline_comes_and_again_when_it_says() -> None:
    timer = IdleTimer(600)
    first = Watched([900.0, None])
    second = Watched([None])
    timer.watch(first.check, 600.0)
    timer.watch(second.check, 700.0)
    timer.due(599.0)
    assert first.asked == [] and second.asked == []
    timer.due(650.0)
    assert first.asked == [650.0] and second.asked == []
    timer.due(899.0)
    assert first.asked == [650.0] and second.asked == [899.0]
    timer.due(900.0)
    assert first.asked == [650.0, 900.0]
    assert len(timer) == 0  # both said None: closed


def test_a_check_that_says_now_again_is_looked_at_in_a_later_pass_not_in_a_loop() -> None:
    timer = IdleTimer(1)
    stubborn = Watched([5.0, 5.0, None])
    timer.watch(stubborn.check, 5.0)
    timer.due(5.0)
    assert stubborn.asked == [5.0]
    timer.due(math.nextafter(5.0, math.inf))
    assert len(stubborn.asked) == 2


def test_an_ended_connection_is_let_go_at_once_and_the_heap_stays_bounded() -> None:
    timer = IdleTimer(600)
    live = [timer.watch(Watched([None]).check, 600.0 + n) for n in range(10)]

    class Conn:
        def check(self, now: float) -> float | None:
            return None

    conn = Conn()
    gone = weakref.ref(conn)
    timer.watch(conn.check, 601.0).cancel()
    del conn
    gc.collect()
    assert gone() is None  # the entry stays until its deadline; the connection does not
    for n in range(10_000):  # connections that come and go within a timeout
        timer.watch(Watched([None]).check, 700.0 + n).cancel()
        assert len(timer) <= 2 * len(live) + 2
    timer.due(599.0)
    assert len(timer) <= 2 * len(live) + 2


def test_a_check_that_raises_is_dropped_and_the_others_are_still_looked_at() -> None:
    timer = IdleTimer(600)

    def broken(now: float) -> float | None:
        raise RuntimeError("boom")

    after = Watched([None])
    timer.watch(broken, 600.0)
    timer.watch(after.check, 600.0)
    timer.due(600.0)
    assert after.asked == [600.0]
    assert len(timer) == 0


async def test_an_earlier_deadline_wakes_the_timer_sleeping_until_a_later_one(
    autojump_clock: trio.testing.MockClock,
) -> None:
    timer = IdleTimer(600)
    late, early = Watched([None]), Watched([None])
    with trio.fail_after(10_000):  # virtual seconds
        async with trio.open_nursery() as nursery:
            nursery.start_soon(timer.run)
            start = trio.current_time()
            timer.watch(late.check, start + 600)
            await trio.testing.wait_all_tasks_blocked()
            timer.watch(early.check, start + 10)
            await trio.sleep(11)
            assert early.asked and not late.asked
            await trio.sleep(600)
            assert late.asked
            nursery.cancel_scope.cancel()
    assert early.asked[0] - start == pytest.approx(10)
    assert late.asked[0] - start == pytest.approx(600)


async def test_an_idle_connection_runs_no_task_for_its_timeout() -> None:
    client, _client_peer = trio.testing.memory_stream_pair()
    upstream, _upstream_peer = trio.testing.memory_stream_pair()
    timer = IdleTimer(600)
    conn = Connection(
        client,
        upstream,
        Relay(lambda *a: None, fetch_handler=PassThroughFetch()),
        max_frame_bytes=1024,
        idle=timer,
    )
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(conn.run)
            await trio.testing.wait_all_tasks_blocked()
            assert conn._nursery is not None
            # its two loops, nothing else: the timer is an entry in the process's heap
            assert len(conn._nursery.child_tasks) == 2
            assert len(timer) == 1
            nursery.cancel_scope.cancel()
    assert len(timer) == 0  # its entry went when it ended (the only one: more than half)
