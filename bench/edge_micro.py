"""CPU and scheduler turns per fetch of the trio edge, in process, over real sockets.

    .venv/bin/python -m bench.edge_micro                    # the table
    .venv/bin/python -m bench.edge_micro --connections 100 --cycles 200 --reps 5 --json

``bench.fetch_micro`` times the sans-I/O Fetch path alone; this runs the same
cases (its ``Traffic``: request and response frames encoded beforehand) through
what the server runs per client connection: a ``proxy.server.connection.
Connection`` with its relay and Fetch path handler (default memory budget), both
legs plain TCP socket pairs wrapped as the server wraps them
(``proxy.server.sockets.lean``).  Per connection a client task sends a request
and reads its answer, and a stand-in broker task answers each upstream Fetch with
the case's response (its first, full one with every partition).  Every
connection runs ``--cycles`` fetches, back to back, all at once.

The cycle collector runs as in the server (``proxy.server.cli.collector_as_served``):
without it, CPython's full collections of the whole in-process heap (clients, broker
and proxy) were about a third of the CPU of a 1-record fetch at 100 connections.

Reported per fetch, medians of ``--reps`` repetitions: the process's CPU
(``time.process_time``: the client and broker tasks are in it too, the same
work in any version of the edge, so compare two versions side by side rather
than read it as the proxy's alone) and trio task steps (``steps``: scheduler
turns of every task, counted by an instrument).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import struct
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import trio
import trio.abc
import trio.lowlevel

from bench.fetch_micro import CASES, CYCLE, Case, Traffic, _session_epoch
from proxy import logs
from proxy.config import FetchPathConfig
from proxy.fetchpath import FetchPath
from proxy.protocol.framing import FrameDecoder
from proxy.relay.relay import Relay
from proxy.server.cli import collector_as_served
from proxy.server.connection import Connection
from proxy.server.sockets import lean

_LEN = struct.Struct(">i")
EDGE_CASES = ("1p-empty", "1p-record")


class _Steps(trio.abc.Instrument):
    def __init__(self) -> None:
        self.steps = 0

    def before_task_step(self, task: trio.lowlevel.Task) -> None:
        self.steps += 1


async def _read_frame(stream: trio.SocketStream, decoder: FrameDecoder) -> bytes | None:
    while (frame := decoder.next_frame()) is None:
        data = await stream.receive_some(1 << 16)
        if not data:
            return None
        decoder.feed(data)
    return frame


class _Pair:
    """One client connection: the client's socket, the broker's, the Connection between."""

    def __init__(self, case: Case, traffic: Traffic, path: FetchPath) -> None:
        self.case = case
        self.traffic = traffic
        a, b = trio.socket.socketpair()
        c, d = trio.socket.socketpair()
        self.client = trio.SocketStream(a)
        self.broker = trio.SocketStream(d)
        handler = path.handler(1)
        relay = Relay(lambda node, host, port: None, fetch_handler=handler)
        self.conn = Connection(
            lean(trio.SocketStream(b)),
            lean(trio.SocketStream(c)),
            relay,
            max_frame_bytes=100 << 20,
        )
        self.answered = 0

    async def serve_broker(self) -> None:
        decoder = FrameDecoder(100 << 20)
        t = self.traffic
        while (frame := await _read_frame(self.broker, decoder)) is not None:
            epoch = _session_epoch(frame)
            answer = t.full_response if epoch in (0, -1) else t.responses[self.answered % CYCLE]
            self.answered += 1
            body = frame[4:8] + answer[4:]
            await self.broker.send_all(_LEN.pack(len(body)) + body)

    async def fetch(self, cycles: int, start: int) -> None:
        decoder = FrameDecoder(100 << 20)
        requests = [_LEN.pack(len(r)) + r for r in self.traffic.requests]
        for i in range(start, start + cycles):
            await self.client.send_all(requests[i % CYCLE])
            if await _read_frame(self.client, decoder) is None:
                raise RuntimeError("the proxy closed the client connection")


async def _run(case: Case, connections: int, cycles: int, reps: int) -> dict[str, Any]:
    traffic = Traffic(case)
    path = FetchPath(FetchPathConfig(limits=case.limits))
    pairs = [_Pair(case, traffic, path) for _ in range(connections)]
    steps = _Steps()
    cpu: list[float] = []
    turns: list[float] = []
    async with trio.open_nursery() as nursery:
        for p in pairs:
            nursery.start_soon(p.conn.run)
            nursery.start_soon(p.serve_broker)

        async def round_(start: int, n: int) -> None:
            async with trio.open_nursery() as inner:
                for p in pairs:
                    inner.start_soon(p.fetch, n, start)

        await round_(0, CYCLE + 2)  # the upstream session's full fetch, then steady state
        done = CYCLE + 2
        trio.lowlevel.add_instrument(steps)
        for _ in range(reps):
            gc.collect()
            steps.steps = 0
            began = time.process_time()
            await round_(done, cycles)
            elapsed = time.process_time() - began
            done += cycles
            fetches = connections * cycles
            cpu.append(elapsed / fetches * 1e6)
            turns.append(steps.steps / fetches)
        trio.lowlevel.remove_instrument(steps)
        nursery.cancel_scope.cancel()
    for p in pairs:
        await p.client.aclose()
        await p.broker.aclose()
    return {
        "case": case.name,
        "connections": connections,
        "cycles": cycles,
        "reps": reps,
        "median_us": round(statistics.median(cpu), 1),
        "min_us": round(min(cpu), 1),
        "steps": round(statistics.median(turns), 2),
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = f"{'case':<12} {'conns':>6} {'median us':>10} {'min us':>10} {'steps':>6}"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r['case']:<12} {r['connections']:>6} {r['median_us']:>10.1f}"
            f" {r['min_us']:>10.1f} {r['steps']:>6.2f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: Callable[[str], Any] = print) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", action="append", choices=EDGE_CASES)
    parser.add_argument("--connections", type=int, action="append", help="default 1 and 100")
    parser.add_argument("--cycles", type=int, default=200, help="fetches per connection per rep")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    logs.configure("warning")
    known = {c.name: c for c in CASES}
    with collector_as_served():  # the server's: no automatic full collection
        rows = [
            trio.run(_run, known[name], n, args.cycles, args.reps)
            for name in args.case or EDGE_CASES
            for n in args.connections or [1, 100]
        ]
    out(json.dumps(rows, indent=2) if args.json else table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
