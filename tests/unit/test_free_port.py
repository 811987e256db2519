"""The test harness's loopback ports: outside the kernel's ephemeral range, one slice per
worker, never the same one twice in a row (see ``support.loopback.free_port``)."""

from __future__ import annotations

import socket

import pytest
from support import loopback


def test_ports_are_below_the_ephemeral_range_bindable_and_distinct() -> None:
    low, _ = loopback._ephemeral_range()
    ports = [loopback.free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    for port in ports[:20]:
        assert loopback._LOWEST_PORT <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # nothing took it


def test_workers_pick_from_disjoint_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    low, _ = loopback._ephemeral_range()
    width = (low - loopback._LOWEST_PORT) // loopback._SLICES
    seen: dict[int, set[int]] = {}
    for worker in range(3):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", f"gw{worker}")
        seen[worker] = {loopback.free_port() for _ in range(50)}
        base = loopback._LOWEST_PORT + worker * width
        assert all(base <= p < base + width for p in seen[worker])
    assert not (seen[0] & seen[1]) and not (seen[1] & seen[2])


def test_a_narrow_range_falls_back_to_the_kernels_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loopback, "_ephemeral_range", lambda: (10100, 60999))
    port = loopback.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
