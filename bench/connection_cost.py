"""CPU of the proxy's event loop per connect and per close of a silent connection.

    .venv/bin/python -m bench.connection_cost [--connections 1000] [--rounds 5]

A proxy (default settings, an upstream nobody listens on: discovery retries in the
background and no connection here needs a broker) runs in this process; a child
process opens *connections* sockets to its bootstrap listener as fast as they
connect, sends nothing, then closes them all at once (the end of a leak).  Per
round it reports the loop thread's CPU (``time.thread_time``) from the first
connect until every socket holds a slot, and from the close until every slot is
given back, each divided by the number of sockets, and the longest scheduler batch
in each phase (the longest any other ready task waited behind the loop).
A third phase connects ``--displace`` more sockets than ``max_connections`` (each
newcomer displaces the oldest silent socket: its close is a warning line and a
metric) and reports CPU per displacement.  The client's CPU is its own process's
and not counted.  Medians over *rounds*; load from other processes disturbs the
stall figures more than the CPU ones.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import trio

from proxy import logs
from proxy.config import validate
from proxy.observe.metrics import Metrics
from proxy.server.cli import freeze_startup_heap, only_young_collections
from proxy.server.proxy import Proxy

CLIENT = r"""
import socket, sys
address = ("127.0.0.1", int(sys.argv[1]))
socks = []
for line in sys.stdin:
    n = int(line)
    if n > 0:
        for _ in range(n):
            socks.append(socket.create_connection(address))
    else:
        for s in socks:
            s.close()
        socks = []
    print("done", flush=True)
"""


PHASE_TIMEOUT = 120


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _displaced(metrics: Metrics) -> float:
    """Displaced connections whose close has run (its metric is counted in the close)."""
    sample = metrics.registry.get_sample_value(
        "kafka_fetch_proxy_client_connections_closed_total", {"cause": "displaced"}
    )
    return sample or 0.0


class Stalls(trio.abc.Instrument):
    """The longest scheduler batch (from one I/O wait's end to the next's start) since the
    last ``take()``: what any other ready task waited behind, at most."""

    def __init__(self) -> None:
        self.worst = 0.0
        self._woke = 0.0

    def after_io_wait(self, timeout: float) -> None:
        self._woke = time.perf_counter()

    def before_io_wait(self, timeout: float) -> None:
        if self._woke:
            self.worst = max(self.worst, time.perf_counter() - self._woke)

    def take(self) -> float:
        worst, self.worst = self.worst, 0.0
        return worst


async def _phase(
    client: trio.Process, count: int, done: Any, stalls: Stalls
) -> tuple[float, float, float]:
    """(CPU seconds of the loop thread, wall seconds, worst stall) until done() is true."""
    assert client.stdin is not None
    stalls.take()
    cpu = time.thread_time()
    wall = time.monotonic()
    await client.stdin.send_all(f"{count}\n".encode())
    with trio.fail_after(PHASE_TIMEOUT):
        while not done():  # noqa: ASYNC110  polled: an event would add work to what is measured
            await trio.sleep(0.02)
    return time.thread_time() - cpu, time.monotonic() - wall, stalls.take()


async def _wait_line(client: trio.Process, buffer: bytearray) -> None:
    assert client.stdout is not None
    while b"\n" not in buffer:
        buffer += await client.stdout.receive_some(100)
    del buffer[: buffer.index(b"\n") + 1]


async def measure(connections: int, rounds: int, displace: int) -> dict[str, Any]:
    logs.configure("info", open(os.devnull, "w"))  # noqa: ASYNC230  the proxy's default level
    metrics = Metrics(process_metrics=False)
    settings = validate(
        {
            "upstream": [f"127.0.0.1:{_free_port()}"],
            "listen": "127.0.0.1:0",
            "broker_port_base": 0,
            "max_connections": connections,
        }
    )
    out: dict[str, list[float]] = {
        "connect_us": [],
        "connect_stall_ms": [],
        "close_us": [],
        "close_stall_ms": [],
        "displace_us": [],
        "displace_stall_ms": [],
    }
    stalls = Stalls()
    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(Proxy(settings, metrics=metrics).serve)
        freeze_startup_heap()  # the collector's policy of kafka-fetch-proxy run
        only_young_collections()
        trio.lowlevel.add_instrument(stalls)
        client = await trio.lowlevel.open_process(
            [sys.executable, "-c", CLIENT, str(proxy.bootstrap.port)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        buffer = bytearray()
        try:
            for _ in range(rounds):
                cpu, _wall, stall = await _phase(
                    client, connections, lambda: proxy.open_connections == connections, stalls
                )
                await _wait_line(client, buffer)
                out["connect_us"].append(cpu / connections * 1e6)
                out["connect_stall_ms"].append(stall * 1e3)
                await trio.sleep(0.2)
                if displace:
                    before = _displaced(metrics)
                    cpu, _wall, stall = await _phase(
                        client,
                        displace,
                        lambda: _displaced(metrics) - before == displace,  # noqa: B023
                        stalls,
                    )
                    await _wait_line(client, buffer)
                    out["displace_us"].append(cpu / displace * 1e6)
                    out["displace_stall_ms"].append(stall * 1e3)
                    await trio.sleep(0.2)
                cpu, _wall, stall = await _phase(
                    client, 0, lambda: proxy.open_connections == 0, stalls
                )
                await _wait_line(client, buffer)
                out["close_us"].append(cpu / connections * 1e6)
                out["close_stall_ms"].append(stall * 1e3)
                await trio.sleep(0.2)
        finally:
            client.kill()
            await client.wait()
            nursery.cancel_scope.cancel()
    result: dict[str, Any] = {k: round(statistics.median(v), 1) for k, v in out.items() if v}
    result["rounds"] = {k: [round(x, 1) for x in v] for k, v in out.items() if v}
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--connections", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--displace", type=int, default=200)
    args = p.parse_args(argv)
    print(json.dumps(trio.run(measure, args.connections, args.rounds, args.displace), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
