"""``bench.scenarios.wait_until_closed``: a measurement starts only once the proxy has closed
the last one's connections (fetch_cpu's back-to-back windows at 1,000 connections)."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType, SimpleNamespace

import pytest


@pytest.fixture
def scenarios(bench_module: Callable[[str], ModuleType]) -> ModuleType:
    return bench_module("scenarios")


class Clock:
    """A clock the waiter's sleeps move (no real time passes)."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps = 0

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.sleeps += 1


def probe(scenarios: ModuleType, gauge: list[float], *, proxy: bool = True) -> SimpleNamespace:
    """A probe whose scrapes read the next value of *gauge* (its last value from then on)."""
    values = iter(gauge)
    last = [gauge[-1]]

    def scrape() -> dict[str, float]:
        last[0] = next(values, last[0])
        return {scenarios.OPEN_CONNECTIONS: last[0]}

    return SimpleNamespace(arr=SimpleNamespace(proxy=object() if proxy else None), scrape=scrape)


def test_it_waits_until_the_proxy_holds_no_client_connection(scenarios: ModuleType) -> None:
    clock = Clock()
    scenarios.wait_until_closed(
        probe(scenarios, [1000.0, 413.0, 17.0, 0.0]), clock=lambda: clock.now, sleep=clock.sleep
    )
    assert clock.sleeps == 3


def test_connections_that_never_close_fail_the_measurement(scenarios: ModuleType) -> None:
    clock = Clock()
    with pytest.raises(RuntimeError, match="still held 5 client connections 1 s after"):
        scenarios.wait_until_closed(
            probe(scenarios, [5.0]), 1.0, clock=lambda: clock.now, sleep=clock.sleep
        )
    assert 1.0 <= clock.now < 1.1


def test_an_arrangement_without_the_proxy_is_not_waited_for(scenarios: ModuleType) -> None:
    clock = Clock()
    scenarios.wait_until_closed(
        probe(scenarios, [7.0], proxy=False), clock=lambda: clock.now, sleep=clock.sleep
    )
    assert clock.sleeps == 0
