"""The server's cycle-collector policy: young collections as CPython runs them, full
collections on a timer, not whenever long-lived objects grow by a quarter (issue 19:
building large fetch sessions started a full collection of the whole heap over and over)."""

from __future__ import annotations

import gc

import trio
import trio.testing

from proxy.server.cli import (
    FULL_COLLECTION_SECONDS,
    collect_periodically,
    only_young_collections,
)


def test_no_automatic_full_collection_young_ones_unchanged() -> None:
    saved = gc.get_threshold()
    try:
        gc.set_threshold(700, 10, 10)
        only_young_collections()
        young, middle, full = gc.get_threshold()
        assert (young, middle) == (700, 10)
        assert full >= 2**31 - 1  # a full collection after that many middle ones: never
    finally:
        gc.set_threshold(*saved)


def test_a_full_collection_runs_every_period() -> None:
    calls: list[float] = []

    async def main() -> None:
        with trio.move_on_after(3.5 * FULL_COLLECTION_SECONDS):
            await collect_periodically(
                lambda: calls.append(trio.current_time()), FULL_COLLECTION_SECONDS
            )

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert [round(t / FULL_COLLECTION_SECONDS) for t in calls] == [1, 2, 3]
