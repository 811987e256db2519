"""``bench.held_micro`` runs and reads every record once (tiny sizes; no timing judged)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture
def held_micro(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    return bench_module("held_micro")


def test_a_small_read_is_answered_mostly_from_held_data_and_is_the_same_each_time(
    held_micro: ModuleType,
) -> None:
    first = held_micro.run_once(partitions=6, batches=4, records=5, max_records=7)
    again = held_micro.run_once(partitions=6, batches=4, records=5, max_records=7)
    # 120 records at most 7 a response (whole batches of 5: one a response)
    assert first["fetches"] >= 24
    assert first["upstream_rounds"] < first["fetches"] // 2  # most answered from held data
    assert first["digest"] == again["digest"]
