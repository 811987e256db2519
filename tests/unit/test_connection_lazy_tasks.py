"""A connection's writer task starts when a response first waits for it, once, and never
after the connection ended (``Connection._wake_writer``).

The upstream loop writes what the client's socket takes at once itself
(``_write_client_now``), so most connections never need the writer; an idle connection
held its task, coroutine frames and cancel status for nothing (about 3 KB of the 50 KB
an idle connection cost, BENCHMARKS.md, Memory per idle connection).
"""

from __future__ import annotations

import trio
import trio.testing

from proxy.relay.relay import PassThroughFetch, Relay
from proxy.server.connection import Connection


def connection() -> Connection:
    client, _ = trio.testing.memory_stream_pair()
    upstream, _ = trio.testing.memory_stream_pair()
    relay = Relay(lambda *a: None, fetch_handler=PassThroughFetch())
    return Connection(client, upstream, relay, max_frame_bytes=1024)


async def test_the_writer_starts_at_the_first_wake_and_only_once() -> None:
    conn = connection()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            conn._nursery, conn._scope = nursery, trio.CancelScope()
            await trio.testing.wait_all_tasks_blocked()
            assert nursery.child_tasks == frozenset()
            conn._wake_writer()
            assert len(nursery.child_tasks) == 1
            await trio.testing.wait_all_tasks_blocked()  # it parks: nothing to write
            conn._wake_writer()  # wakes the parked writer, starts no second one
            assert len(nursery.child_tasks) == 1
            nursery.cancel_scope.cancel()


async def test_a_wake_after_the_end_starts_nothing() -> None:
    conn = connection()
    with trio.fail_after(10):
        async with trio.open_nursery() as closed:
            conn._nursery, conn._scope = closed, trio.CancelScope()
        conn._ended = True  # as ``run`` marks it when its nursery has closed
        conn._wake_writer()  # no RuntimeError from the closed nursery
        assert not conn._writer_started


async def test_a_start_after_the_nursery_closed_but_before_run_marked_the_end_starts_nothing() -> (
    None
):
    """``run``'s nursery closes when its last task ends; ``run`` marks the end only when it
    resumes, and other tasks run in between (the drain's ``start_task``, another
    connection's wake).  Such a start must start nothing, not raise: once a drain at
    SIGTERM raised trio's "closed to new arrivals" out of the proxy (exit status 1)."""
    conn = connection()
    with trio.fail_after(10):
        async with trio.open_nursery() as closed:
            conn._nursery, conn._scope = closed, trio.CancelScope()
        assert conn.running  # the window: closed, the end not marked yet
        assert conn.start_task(trio.sleep_forever) is False
        conn._wake_writer()
        assert not conn._writer_started
