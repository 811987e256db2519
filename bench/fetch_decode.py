"""Decoding one large Fetch response, before and after the compiled readers, side by side.

    .venv/bin/python -m bench.fetch_decode                      # 64 partitions x 128 KiB
    .venv/bin/python -m bench.fetch_decode --partitions 1000 --records 1024

``before`` is what ``fetch_views.decode_fetch_response`` did until the readers:
the check walk (``walk.check``, learning where the records are), kio's native
decode (which copies every records field) and the replacement of those copies by
views of the frame.  ``after`` is today's ``decode_fetch_response``: one
validating pass (``proxy.protocol.readers``) with the records read as views.

Reported per decode: CPU microseconds (``time.process_time``; the median and the
lowest of ``--reps`` repetitions) and the peak of memory allocated while decoding
(``tracemalloc``, one decode, the frame itself not counted).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import tracemalloc
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode
from kio.serial import entity_reader

from proxy.protocol import codec, fetch_views, walk
from proxy.protocol.apis import FETCH
from proxy.protocol.messages import make


def response_frame(version: int, partitions: int, records: int) -> bytes:
    mod = sys.modules[codec.response_schema(FETCH, version).__module__]
    batch = b"\x5a" * records
    parts = tuple(
        make(
            mod.PartitionData,
            partition_index=i,
            error_code=ErrorCode.none,
            high_watermark=1000,
            last_stable_offset=1000,
            log_start_offset=0,
            aborted_transactions=None,
            preferred_read_replica=-1,
            records=batch,
        )
        for i in range(partitions)
    )
    topic = make(
        mod.FetchableTopicResponse, topic="bench", topic_id=uuid.UUID(int=7), partitions=parts
    )
    response = make(
        mod.FetchResponse,
        throttle_time=timedelta(0),
        error_code=ErrorCode.none,
        session_id=0,
        responses=(topic,),
    )
    return codec.encode_response(response, 1)


def before(version: int, frame: bytes) -> Any:
    """The check walk + kio + records replaced by views (the code this change removed)."""
    schema = codec.response_schema(FETCH, version)
    hv = codec.response_header_version(FETCH, version)
    assert schema is not None and hv is not None
    offset = codec.response_body_offset(frame, hv)
    spans = walk.SpanHook(lambda cls: cls.__name__ == "PartitionData", "records")
    walk.check(schema, frame, offset, spans)
    response, _ = entity_reader(schema)(frame, offset)
    return fetch_views._point_into(response, frame, spans.spans)


def after(version: int, frame: bytes) -> Any:
    return fetch_views.decode_fetch_response(version, frame)


def measure(
    decode: Callable[[int, bytes], Any], version: int, frame: bytes, reps: int
) -> dict[str, float]:
    decode(version, frame)  # compiled readers, caches
    runs = []
    number = max(1, 20_000_000 // max(len(frame), 1))
    for _ in range(reps):
        start = time.process_time()
        for _ in range(number):
            decode(version, frame)
        runs.append((time.process_time() - start) / number * 1e6)
    tracemalloc.start()
    try:
        decode(version, frame)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return {"median_us": statistics.median(runs), "min_us": min(runs), "peak_bytes": peak}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, default=64)
    parser.add_argument("--records", type=int, default=128 * 1024, help="bytes per partition")
    parser.add_argument("--version", type=int, default=12)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args(argv)
    frame = response_frame(args.version, args.partitions, args.records)
    assert codec.encode_response(before(args.version, frame), 1) == frame
    assert codec.encode_response(after(args.version, frame), 1) == frame
    print(
        f"Fetch v{args.version} response: {args.partitions} partitions x {args.records} bytes,"
        f" frame {len(frame)} bytes"
    )
    print(f"{'path':8} {'median us':>12} {'min us':>12} {'peak alloc':>14}")
    for name, decode in (("before", before), ("after", after)):
        m = measure(decode, args.version, frame, args.reps)
        print(f"{name:8} {m['median_us']:12.1f} {m['min_us']:12.1f} {m['peak_bytes']:14,d}")


if __name__ == "__main__":
    main()
