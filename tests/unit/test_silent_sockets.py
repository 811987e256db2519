"""A connection that has not sent a byte costs no task, and a burst of them is handled in
bounded scheduler turns (``proxy.server.silent``; bench/connection_cost.py measures it).

The proxy over loopback with an upstream nobody listens on (nothing here needs a
broker); the clients are plain blocking sockets, opened and closed without
yielding, so a whole burst is queued in the kernel before the proxy next runs.
"""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import structlog
import trio
import trio.testing
from support.loopback import free_port, request, settings
from support.trio_waits import closed_by_peer, until

from proxy.observe.metrics import Metrics
from proxy.protocol.framing import FrameDecoder
from proxy.server.proxy import ACCEPT_PER_TURN, Proxy
from proxy.server.silent import PER_TURN, SilentSockets

TIMEOUT = 20
BURST = 100
"""Under the listen backlog (128): every connect completes before the proxy accepts."""
UNSUPPORTED_API_VERSIONS = struct.pack(">hhi", 18, 99, 5) + b"\x00\x01t"


def closed(metrics: Metrics, cause: str) -> float:
    sample = metrics.registry.get_sample_value(
        "kafka_fetch_proxy_client_connections_closed_total", {"cause": cause}
    )
    return sample or 0.0


class Turns(trio.abc.Instrument):
    """The largest change of ``count()`` within one scheduler batch (between I/O waits)."""

    def __init__(self, count: Any) -> None:
        self.count = count
        self.largest = 0
        self._at = 0

    def after_io_wait(self, timeout: float) -> None:
        self._at = self.count()

    def before_io_wait(self, timeout: float) -> None:
        self.largest = max(self.largest, abs(self.count() - self._at))


def all_tasks() -> int:
    def walk(task: trio.lowlevel.Task) -> int:
        return 1 + sum(walk(t) for n in task.child_nurseries for t in n.child_tasks)

    return walk(trio.lowlevel.current_root_task())


@asynccontextmanager
async def proxy_nowhere(
    metrics: Metrics, *, use_epoll: bool = True, **extra: Any
) -> AsyncIterator[Proxy]:
    async with trio.open_nursery() as nursery:
        proxy = Proxy(settings(f"127.0.0.1:{free_port()}", **extra), metrics=metrics)
        if not use_epoll:  # the watcher of platforms without select.epoll
            proxy.silent = SilentSockets(
                proxy._silent_spoke, proxy._silent_ended, proxy._silent_expired, use_epoll=False
            )
        yield await nursery.start(proxy.serve)
        nursery.cancel_scope.cancel()


async def test_a_burst_of_silent_connections_costs_no_task_and_ends_in_bounded_turns() -> None:
    metrics = Metrics(process_metrics=False)
    with trio.fail_after(TIMEOUT):
        async with proxy_nowhere(metrics) as proxy:
            address = ("127.0.0.1", proxy.bootstrap.port)
            tasks = all_tasks()
            turns = Turns(lambda: proxy.open_connections)
            trio.lowlevel.add_instrument(turns)
            socks = [socket.create_connection(address) for _ in range(BURST)]
            await until(lambda: proxy.open_connections == BURST)
            assert turns.largest <= ACCEPT_PER_TURN  # accepted in steps
            assert all_tasks() == tasks  # before: a task each, parked until a first byte
            turns.largest = 0
            for sock in socks:  # the end of a leak: every peer closes at once
                sock.close()
            await until(lambda: proxy.open_connections == 0)
            trio.lowlevel.remove_instrument(turns)
            # before: every socket's task woke in the same batch (BURST of them)
            assert turns.largest <= PER_TURN
            assert all_tasks() == tasks
    assert closed(metrics, "peer_closed") == BURST


@pytest.mark.parametrize("use_epoll", [True, False], ids=["epoll", "a-task-each"])
async def test_a_silent_connection_ends_as_before(use_epoll: bool) -> None:
    """Closed by its peer, reset, timed out, displaced, or served from its first byte: the
    log lines and metrics a connection's task wrote before it had sent a byte."""
    metrics = Metrics(process_metrics=False)
    with trio.fail_after(TIMEOUT), structlog.testing.capture_logs() as logs:
        async with proxy_nowhere(
            metrics, use_epoll=use_epoll, max_connections=3, first_request_timeout_seconds=0.5
        ) as proxy:
            port = proxy.bootstrap.port
            goes = await trio.open_tcp_stream("127.0.0.1", port)
            await until(lambda: proxy.open_connections == 1)
            await goes.aclose()
            resets = socket.create_connection(("127.0.0.1", port))
            await until(lambda: proxy.open_connections == 1)
            resets.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            resets.close()
            await until(lambda: proxy.open_connections == 0)

            # served from its first byte (the proxy answers ApiVersions v99 itself)
            served = await trio.open_tcp_stream("127.0.0.1", port)
            silent = await trio.open_tcp_stream("127.0.0.1", port)
            await until(lambda: proxy.open_connections == 2)
            reply = await request(served, FrameDecoder(1 << 20), UNSUPPORTED_API_VERSIONS)
            assert struct.unpack(">ih", reply[:6]) == (5, 35)
            third = await trio.open_tcp_stream("127.0.0.1", port)
            await until(lambda: proxy.open_connections == 3)
            newcomer = await trio.open_tcp_stream("127.0.0.1", port)  # displaces silent
            assert await closed_by_peer(silent)
            assert await closed_by_peer(third)  # its deadline, 0.5 s after its accept
            assert await closed_by_peer(newcomer)
            await request(served, FrameDecoder(1 << 20), UNSUPPORTED_API_VERSIONS)
            await served.aclose()
            await until(lambda: proxy.open_connections == 0)
    ends: dict[str, dict[str, Any]] = {}
    for line in logs:  # each reason's first line (the served one's end comes last)
        if line["event"] == "connection_closed":
            ends.setdefault(line["reason"], line)
    assert ends["client_closed"]["log_level"] == "debug"
    assert ends["io_error"]["log_level"] == "info"
    assert "ConnectionResetError" in ends["io_error"]["error"]
    assert ends["displaced"]["log_level"] == "warning" and ends["displaced"]["limit"] == 3
    assert ends["first_request_timeout"]["timeout_seconds"] == 0.5
    for end in ends.values():  # what the connection's task bound to its lines
        assert end["conn_id"].startswith("c") and end["listener"] == "bootstrap"
        assert end["client_addr"].startswith("127.0.0.1:")
    assert [closed(metrics, c) for c in ("peer_closed", "io_error", "displaced")] == [2, 1, 1]
    assert closed(metrics, "first_request_timeout") == 2  # the third and the newcomer
    value = metrics.registry.get_sample_value
    assert value("kafka_fetch_proxy_client_connections_accepted_total") == 6
    assert value("kafka_fetch_proxy_client_connections_open") == 0


@pytest.mark.parametrize("use_epoll", [True, False], ids=["epoll", "a-task-each"])
async def test_a_cancelled_proxy_closes_the_silent_connections(use_epoll: bool) -> None:
    metrics = Metrics(process_metrics=False)
    with trio.fail_after(TIMEOUT):
        async with proxy_nowhere(metrics, use_epoll=use_epoll) as proxy:
            silent = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap.port)
            await until(lambda: proxy.open_connections == 1)
        assert await closed_by_peer(silent)  # not left open for the garbage collector
    assert closed(metrics, "shutdown") == 1
    assert proxy.open_connections == 0
