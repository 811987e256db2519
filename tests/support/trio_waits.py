"""Waiting in trio tests without sleeping: for a condition, or for the peer to close.

    with trio.fail_after(20):
        await until(lambda: proxy.open_connections == 0)
        assert await closed_by_peer(stream)

Neither bounds its wait: the caller's ``trio.fail_after`` does.
"""

from __future__ import annotations

from collections.abc import Callable

import trio
import trio.testing


async def until(check: Callable[[], object]) -> None:
    """Return once ``check()`` holds, looking again whenever every task is blocked."""
    while not check():
        await trio.testing.wait_all_tasks_blocked(0.01)


async def closed_by_peer(stream: trio.abc.Stream) -> bool:
    """Read until the peer closes (EOF or reset); True when it did."""
    try:
        while await stream.receive_some(65536):
            pass
    except trio.BrokenResourceError:  # a reset is a close too
        pass
    return True
