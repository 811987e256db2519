"""Many raw Kafka connections from one asyncio loop: long-polling Fetch loops, idle sockets.

A librdkafka consumer per connection would need a thread pool per consumer; 1,000 of
them do not fit on 2 cores.  Here each connection is a coroutine that sends one
sessionless Fetch (v12, ``session_epoch=-1``, as librdkafka does) for partition 0 of
an empty topic, waits for the answer (the broker holds it for ``max_wait_ms``) and
sends the next.  The request is encoded once with the project's codec
(``proxy.protocol.codec``); only the correlation id changes.  Responses are counted,
not decoded.
"""

from __future__ import annotations

import asyncio
import struct
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO / "tests") not in sys.path:
    sys.path.insert(0, str(REPO / "tests"))

from support.rawclient import make_request  # noqa: E402

from proxy.protocol import codec  # noqa: E402

_LEN = struct.Struct(">i")
CONNECT_CONCURRENCY = 50


def fetch_frame(topic: str, max_wait_ms: int) -> bytearray:
    """A length-prefixed sessionless Fetch v12 of partition 0 from offset 0."""
    request = make_request(
        1,
        12,
        {
            "replica_id": -1,
            "max_wait": max_wait_ms,
            "min_bytes": 1,
            "max_bytes": 52428800,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": topic,
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": 0,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1048576,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )
    frame = codec.encode_request(request, 0, "bench-fetchloop")
    return bytearray(_LEN.pack(len(frame)) + frame)


def api_versions_frame() -> bytes:
    request = make_request(18, 3, {"client_software_name": "bench", "client_software_version": "1"})
    frame = codec.encode_request(request, 1, "bench-idle")
    return _LEN.pack(len(frame)) + frame


async def _read_frame(reader: asyncio.StreamReader) -> None:
    (size,) = _LEN.unpack(await reader.readexactly(4))
    await reader.readexactly(size)


async def _open(
    host: str, port: int, count: int
) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """*count* connections, each with one ApiVersions round trip as soon as it is open,
    as Kafka's clients do.  A connection left silent until the others are open (a
    thousand connects pass the listen backlog and wait for SYN retries) would meet the
    proxy's first_request_timeout_seconds (10 s), which closed some of them in the full
    run of 2026-11-26."""
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)
    hello = api_versions_frame()

    async def one() -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        async with gate:
            reader, writer = await asyncio.wait_for(asyncio.open_connection(host, port), 30)
        writer.write(hello)
        await asyncio.wait_for(_read_frame(reader), 30)
        return reader, writer

    return list(await asyncio.gather(*(one() for _ in range(count))))


async def _close(conns: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]) -> None:
    for _, writer in conns:
        writer.close()
    for _, writer in conns:
        try:
            await writer.wait_closed()
        except OSError:
            pass


@dataclass
class FetchLoopResult:
    fetches: int
    seconds: float


async def fetch_loops(
    address: str,
    topic: str,
    connections: int,
    *,
    max_wait_ms: int,
    warmup: float,
    duration: float,
    on_window_start: Callable[[], None] | None = None,
    on_window_end: Callable[[], None] | None = None,
) -> FetchLoopResult:
    """*connections* Fetch loops; counts responses between the warm-up and the end.

    ``on_window_start``/``on_window_end`` (callables) run at the window's edges, so the
    caller samples CPU and metrics at exactly those moments."""
    host, _, port = address.rpartition(":")
    conns = await _open(host, int(port), connections)
    counting = False
    stopping = False
    count = 0

    async def loop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal count
        frame = fetch_frame(topic, max_wait_ms)
        cid = 0
        while not stopping:
            cid += 1
            struct.pack_into(">i", frame, 8, cid)  # length(4) api_key(2) version(2) cid(4)
            writer.write(frame)
            await _read_frame(reader)
            if counting:
                count += 1

    tasks = [asyncio.create_task(loop(r, w)) for r, w in conns]
    try:
        await asyncio.sleep(warmup)
        for task in tasks:
            if task.done():
                task.result()  # a loop that failed: raise its error
        if on_window_start is not None:
            on_window_start()
        counting = True
        began = time.monotonic()
        await asyncio.sleep(duration)
        counting = False
        seconds = time.monotonic() - began
        if on_window_end is not None:
            on_window_end()
        for task in tasks:
            if task.done():
                task.result()
        return FetchLoopResult(count, seconds)
    finally:
        stopping = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await _close(conns)


async def idle_connections(
    address: str, connections: int, settle: float, on_open: Callable[[], None]
) -> None:
    """Open *connections*, one ApiVersions round trip each, wait *settle* s, call *on_open*."""
    host, _, port = address.rpartition(":")
    conns = await _open(host, int(port), connections)
    try:  # each said ApiVersions when it opened (_open)
        await asyncio.sleep(settle)
        on_open()
    finally:
        await _close(conns)
