"""How long one large Fetch holds the event loop: the longest uninterrupted run of the fetch path.

    .venv/bin/python -m bench.fetch_stall                      # 1,000 / 10,000 / 100,000 partitions
    .venv/bin/python -m bench.fetch_stall --partitions 10000 --json

One sessionless Fetch v12 of N partitions (one topic, a record in every 97th
partition) goes through ``proxy.fetchpath.FetchPathHandler`` in the real
``Relay``, the dev broker's sans-I/O dispatcher answering upstream, with a
waker as the trio edge binds one.  Every call the edge would make into the
fetch path (the client frame, each ``resume()`` of the wake loop, the upstream
frame) is timed on its own: the longest is the longest time the event loop
could not serve another connection (``stall_ms``; ``stall_cpu_ms`` is the longest call's
CPU time, which other processes of a loaded machine do not inflate); ``total_ms`` is the fetch's
whole CPU time in the fetch path, ``turns`` the calls it took.  The dev
broker's own time is not counted, nor its heap: its cluster state is frozen out
of the cycle collector (``gc.freeze``) before the fetch, as in the proxy's
process it does not exist (before, every full collection during a proxy call
walked N partitions' broker state: 10,000 partitions stalled 690 ms, 156 ms
without it), and the collector runs young collections only, as in the server
(``proxy.server.cli.only_young_collections``: its full collections run on a
timer, not during a fetch).  Also reported: the growth of the Python
heap (tracemalloc peak) against the request's wire size.
"""

from __future__ import annotations

import argparse
import gc
import json
import time
import tracemalloc
from datetime import timedelta
from typing import Any

from bench.fetch_micro import record_batch
from devbroker.fetch import NodeFetcher
from devbroker.membership import GroupCoordinator
from devbroker.node import NodeDispatcher
from devbroker.outcome import Reply, Wait
from devbroker.state import ClusterState
from proxy.config import FetchPathConfig
from proxy.fetchpath import FetchPath
from proxy.protocol import codec
from proxy.protocol.messages import make, request_module
from proxy.relay.relay import Relay
from proxy.server.cli import only_young_collections
from proxy.sessions.as_broker_cache import FetchSessionCache


def _request(n: int) -> bytes:
    mod = request_module(1, 12)
    parts = tuple(
        make(mod.FetchPartition, partition=p, fetch_offset=0, partition_max_bytes=1 << 20)
        for p in range(n)
    )
    request = make(
        mod.FetchRequest,
        replica_id=-1,
        max_wait=timedelta(0),
        min_bytes=1,
        max_bytes=50 << 20,
        isolation_level=0,
        session_id=0,
        session_epoch=-1,
        topics=(make(mod.FetchTopic, topic="big", partitions=parts),),
        forgotten_topics_data=(),
    )
    return codec.encode_request(request, 1, "bench")


def measure(n: int) -> dict[str, Any]:
    """Times without tracemalloc (it slows Python code several times), then the heap."""
    timing = _run(n, trace=False)
    heap = _run(n, trace=True)
    return timing | {k: heap[k] for k in ("heap_peak_mib", "heap_per_wire_byte")}


def _run(n: int, *, trace: bool) -> dict[str, Any]:
    state = ClusterState("dev", [1])
    state.create_topic("big", n)
    for p in range(0, n, 97):
        part = state.partition("big", p)
        assert part is not None
        part.log.append(record_batch(0, 1), part.leader_epoch)
    broker = NodeDispatcher(
        1, state, GroupCoordinator(state), fetcher=NodeFetcher(1, state, FetchSessionCache())
    )
    # The dev broker's cluster state (N partitions, their logs) is not the proxy's: out of
    # the cycle collector's reach, as the proxy's start-up objects are (``gc.freeze`` in
    # proxy.server.cli), else every full collection during a proxy call walks it too.
    gc.collect()
    gc.freeze()
    # The server leaves the collector its young generations only (full collections on a
    # timer, ``only_young_collections``); a full one during a call would be the timer's.
    thresholds = gc.get_threshold()
    only_young_collections()
    path = FetchPath(FetchPathConfig())
    handler = path.handler(1)
    relay = Relay(lambda *a: None, fetch_handler=handler)
    wakes = [0]

    def wake() -> None:
        wakes[0] += 1

    handler.bind_waker(wake)
    frame = _request(n)
    turns: list[float] = []
    cpu: list[float] = []

    def timed(call: Any, *args: Any) -> None:
        t, c = time.perf_counter(), time.thread_time()
        call(*args)
        turns.append(time.perf_counter() - t)
        cpu.append(time.thread_time() - c)

    if trace:
        tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    timed(relay.client_frame, frame)
    answered: list[Any] = []
    for _ in range(1000):
        while wakes[0]:
            wakes[0] -= 1
            timed(handler.resume)
        for up in relay.take_upstream():
            outcome = broker.handle(bytes(up))
            if isinstance(outcome, Wait):
                assert outcome.pending.poll(0.0)
                response = outcome.pending.complete()
            else:
                assert isinstance(outcome, Reply)
                response = outcome.response
            timed(relay.upstream_frame, codec.encode_response(response, outcome.correlation_id))
        answered += relay.take_client()
        if answered and not wakes[0]:
            break
    peak = tracemalloc.get_traced_memory()[1] - base
    if trace:
        tracemalloc.stop()
    gc.set_threshold(*thresholds)
    gc.unfreeze()
    assert answered, "no answer"
    return {
        "partitions": n,
        "request_bytes": len(frame),
        "stall_ms": round(max(turns) * 1000, 1),
        "stall_cpu_ms": round(max(cpu) * 1000, 1),
        "total_ms": round(sum(turns) * 1000, 1),
        "turns": len(turns),
        "turn_ms": [round(t * 1000, 1) for t in turns],
        "heap_peak_mib": round(peak / 2**20, 1),
        "heap_per_wire_byte": round(peak / len(frame), 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, action="append")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    _run(10, trace=False)  # compiles the codec's readers and writers for these messages
    rows = [measure(n) for n in args.partitions or [1000, 10_000, 100_000]]
    for r in rows:
        if not args.json:
            r.pop("turn_ms")
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(
            f"{'partitions':>10} {'req MB':>7} {'stall ms':>9} {'cpu ms':>7} {'total ms':>9} {'turns':>5} "
            f"{'heap MiB':>8} {'heap/wire':>9}"
        )
        for r in rows:
            print(
                f"{r['partitions']:>10} {r['request_bytes'] / 1e6:>7.2f} {r['stall_ms']:>9} "
                f"{r['stall_cpu_ms']:>7} "
                f"{r['total_ms']:>9} {r['turns']:>5} {r['heap_peak_mib']:>8} "
                f"{r['heap_per_wire_byte']:>9}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
