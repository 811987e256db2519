"""``bench.attacks``: the round trips an attack is judged by when its window is shorter than
one probe interval (a fetch ``max_fetch_partitions`` refuses at once: closed-state's window
was 0.01 s, and one CI run's prober began no round trip within it)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import pytest


@pytest.fixture
def attacks(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    return bench_module("attacks")


def test_a_window_with_round_trips_is_judged_as_it_is(attacks: ModuleType) -> None:
    w = attacks.Watch(probes=[(9.99, 0.001), (10.004, 0.002), (10.3, 0.001)])
    assert attacks._judged_until(w.probes, 10.0, 10.2) == 10.2


def test_a_window_shorter_than_a_probe_interval_takes_the_first_round_trip_after_it(
    attacks: ModuleType,
) -> None:
    w = attacks.Watch(
        probes=[(9.995, 0.001), (10.012, 0.003), (10.022, 0.001)],
        healthz=[(9.9, "503"), (10.2, "200"), (10.7, "503")],
    )
    assert attacks._judged_until(w.probes, 10.0, 10.01) == 10.012
    summary = attacks.summarize(
        attacks.ATTACKS["closed-state"], w, (10.0, 10.01), 14.0, 128 << 20, {}, None
    )
    assert summary["rtt"]["answered"] == 1
    assert summary["rtt"]["p99_ms"] == 3.0
    assert summary["healthz"] == {"200": 1}  # /healthz alike: its first poll after the start


def test_a_proxy_that_answers_nothing_after_the_attack_began_still_has_no_answer(
    attacks: ModuleType,
) -> None:
    w = attacks.Watch(probes=[(9.995, 0.001)], probe_outstanding=10.005)
    assert attacks._judged_until(w.probes, 10.0, 10.01) == 10.01
    summary = attacks.summarize(
        attacks.ATTACKS["closed-state"], w, (10.0, 10.01), 14.0, 128 << 20, {}, None
    )
    assert summary["rtt"]["answered"] == 0
