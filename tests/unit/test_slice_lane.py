"""Large fetches take the slice lane one at a time; other tasks run between two slices.

Issue 19 part 2: a large fetch's stages run as slices in its connection's wake loop
(``Connection._wake_loop``).  With several large fetches at once, each taking a slice
in every scheduler batch held the loop for all their slices per batch, and decoded
them all at once.  The process's slice lane lets one connection run its slices (one
per batch, a checkpoint between two) while the others wait their turn in order.
A fake fetch path stands for ``FetchPathHandler``: each resume is one slice and asks
for the next until its fetch is done.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import trio
import trio.testing

from proxy.relay.relay import PassThroughFetch, Relay
from proxy.server.connection import Connection


class SlicedFetch(PassThroughFetch):
    """A FetchHandler whose fetch takes *slices* resumes, each asking for the next."""

    def __init__(self, name: str, slices: int, log: list[str]) -> None:
        super().__init__()
        self.name, self.left, self.log = name, slices, log
        self.wake: Callable[[], None] = lambda: None

    def bind_waker(self, wake: Callable[[], None]) -> None:
        self.wake = wake

    def resume(self) -> None:
        if self.left:
            self.left -= 1
            self.log.append(self.name)
            if self.left:
                self.wake()


def connection(fetch: SlicedFetch) -> Connection:
    client, _ = trio.testing.memory_stream_pair()
    upstream, _ = trio.testing.memory_stream_pair()
    return Connection(
        client, upstream, Relay(lambda *a: None, fetch_handler=fetch), max_frame_bytes=1024
    )


def bound(conn: Connection, nursery: trio.Nursery) -> Connection:
    """*conn* with its waker bound as ``run`` binds it, its tasks started in *nursery*."""
    conn._nursery, conn._scope = nursery, trio.CancelScope()
    conn._bind_waker()
    return conn


async def test_large_fetches_take_the_lane_in_turn_and_others_run_between_slices() -> None:
    log: list[str] = []
    fetches = [SlicedFetch(name, 5, log) for name in "abc"]
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            for f in fetches:  # (each connection's wake task starts at its first wake)
                bound(connection(f), nursery)
            await trio.testing.wait_all_tasks_blocked()

            async def other_client() -> None:  # another connection's task, always ready
                while any(f.left for f in fetches):
                    log.append("-")
                    await trio.lowlevel.checkpoint()

            for f in fetches:  # three large fetches arrive at once
                f.wake()
            await other_client()
            nursery.cancel_scope.cancel()
    slices = [s for s in log if s != "-"]
    # one fetch at a time (in the order they asked for the lane: trio wakes the three
    # in any order), not a slice of each in every batch
    runs = [(name, len(list(run))) for name, run in itertools.groupby(slices)]
    assert sorted(runs) == [("a", 5), ("b", 5), ("c", 5)]
    # one slice per scheduler batch: the other client's task (once a batch, first or
    # last in it: trio orders a batch at random) ran between the first slice and the
    # last once for every slice after the first, but maybe where the lane changed hands
    first = log.index(slices[0])
    last = len(log) - 1 - log[::-1].index(slices[-1])
    assert log[first:last].count("-") >= len(slices) - 1 - 2


async def test_the_wake_task_starts_at_the_first_wake_and_never_after_the_end() -> None:
    """A connection holds no wake task until its fetch handler first wakes it (an idle
    connection never does), and a wake after the connection ended (another connection
    freeing budget) starts nothing in its closed nursery."""
    log: list[str] = []
    fetch = SlicedFetch("a", 1, log)
    conn = connection(fetch)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            bound(conn, nursery)
            await trio.testing.wait_all_tasks_blocked()
            assert nursery.child_tasks == frozenset()
            fetch.wake()
            assert len(nursery.child_tasks) == 1
            await trio.testing.wait_all_tasks_blocked()
            assert log == ["a"]
            nursery.cancel_scope.cancel()
        late = SlicedFetch("b", 1, log)
        ended = connection(late)
        async with trio.open_nursery() as closed:
            bound(ended, closed)
        ended._ended = True  # as ``run`` marks it when its nursery has closed
        late.wake()  # no RuntimeError from a closed nursery
        assert log == ["a"]
