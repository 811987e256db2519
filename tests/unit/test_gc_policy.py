"""The server's cycle-collector policy: young collections as CPython runs them, full
collections on a timer, not whenever long-lived objects grow by a quarter (issue 19:
building large fetch sessions started a full collection of the whole heap over and over)."""

from __future__ import annotations

import gc

import trio
import trio.testing

from proxy.server.cli import (
    FULL_COLLECTION_MAX_SECONDS,
    FULL_COLLECTION_SECONDS,
    collect_periodically,
    collector_as_served,
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


def test_full_collections_that_find_nothing_come_less_often_up_to_a_bound() -> None:
    """Each full collection stops the loop (about 0.2 s at 1,000 connections); while they
    find nothing the wait doubles up to FULL_COLLECTION_MAX_SECONDS, and one that finds
    cyclic garbage brings it back to FULL_COLLECTION_SECONDS."""
    calls: list[float] = []
    found = iter([0, 0, 0, 0, 0, 0, 3, 0])

    def collect() -> int:
        calls.append(trio.current_time())
        return next(found, 0)

    async def main() -> None:
        with trio.move_on_after(3000):
            await collect_periodically(
                collect, FULL_COLLECTION_SECONDS, FULL_COLLECTION_MAX_SECONDS
            )

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    waits = [round(b - a) for a, b in zip([0.0, *calls], calls, strict=False)]
    # 60, then doubling while nothing is found (capped at 600); the 7th finds garbage:
    # the wait after it is 60 again.
    assert waits[:9] == [60, 120, 240, 480, 600, 600, 600, 60, 120]


def test_collector_as_served_is_undone_at_exit() -> None:
    saved = gc.get_threshold()
    frozen_before = gc.get_freeze_count()
    try:
        gc.set_threshold(700, 10, 10)
        with collector_as_served():
            young, middle, full = gc.get_threshold()
            assert (young, middle) == (700, 10)
            assert full >= 2**31 - 1
            assert gc.get_freeze_count() > frozen_before
        assert gc.get_threshold() == (700, 10, 10)
        assert gc.get_freeze_count() == 0
    finally:
        gc.set_threshold(*saved)
