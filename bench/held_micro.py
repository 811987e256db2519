"""CPU per answer from held data, in process: a sessionless client's shaped read of many partitions.

    .venv/bin/python -m bench.held_micro                   # 1,000 partitions, 3 repetitions
    .venv/bin/python -m bench.held_micro --partitions 100 --reps 5

``bench.fetch_micro`` replays fixed frames, so its fetches are answered upstream; this
drives what a shaped read of a backlog does: a client that lists every partition in
each Fetch (v11, sessionless, as librdkafka) under ``--max-records`` (500), reading a
topic whose every partition holds ``--batches`` batches of ``--records`` records of
1 KiB.  Each upstream round brings more than one response may deliver, the rest is
held in the reuse buffer, and most fetches are answered from it: each of those takes
every partition's held batches, trims the response and puts back what it did not
serve.  The real relay and Fetch path handler, the dev broker's dispatcher upstream
(``support.fetch_world``); the client's offsets follow what it was given (every
record once and in order, checked).

Printed per repetition: client fetches, the median and mean wall time of one
(handler and dev broker together; the dev broker answers few of them), upstream
rounds, and a digest of every response frame (two versions of the proxy that
answer alike give the same digest).  Compare two versions side by side
(``PYTHONPATH`` to a worktree for the other), not against a number from another hour.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from support.batches import make_batch  # noqa: E402
from support.dev_upstream import client_fetch  # noqa: E402
from support.fetch_world import Conn, World  # noqa: E402

from proxy.config import FetchPathConfig  # noqa: E402
from proxy.protocol import codec  # noqa: E402
from proxy.protocol.records import iter_batches  # noqa: E402
from proxy.shaping.limits import Limits  # noqa: E402

TOPIC = "wide"


def run_once(partitions: int, batches: int, records: int, max_records: int) -> dict[str, Any]:
    """One read of the whole topic; its numbers."""
    world = World(FetchPathConfig(limits=Limits(max_records=max_records)))
    world.state.create_topic(TOPIC, partitions)
    for p in range(partitions):
        part = world.state.partition(TOPIC, p)
        assert part is not None
        for _ in range(batches):
            part.log.append(make_batch(0, records, b"r" * 1024), part.leader_epoch)
    conn = Conn(world).with_edge()
    offsets = {p: 0 for p in range(partitions)}
    total = partitions * batches * records

    class _Up:
        state = world.state

    digest = hashlib.sha256()
    times: list[float] = []
    got = 0
    while got < total:
        if len(times) > 10 * total:
            raise RuntimeError(f"did not finish: {got} of {total} records")
        request = client_fetch(_Up(), 11, [(TOPIC, p, o) for p, o in offsets.items()])
        frame = codec.encode_request(
            dataclasses.replace(request, max_bytes=50 << 20), len(times) + 1, "rdkafka"
        )
        began = time.perf_counter()
        [out] = conn.send(frame)
        times.append(time.perf_counter() - began)
        digest.update(out)
        _, response = codec.decode_response(1, 11, out)
        for topic in response.responses:
            for pd in topic.partitions:
                for h in iter_batches(pd.records or b""):
                    if h.base_offset != offsets[pd.partition_index]:
                        raise RuntimeError("a gap or a duplicate: the proxy is wrong")
                    offsets[pd.partition_index] = h.next_offset
                    got += h.next_offset - h.base_offset
    return {
        "fetches": len(times),
        "median_ms": statistics.median(times) * 1e3,
        "mean_ms": statistics.mean(times) * 1e3,
        "upstream_rounds": len(conn.upstream_frames),
        "digest": digest.hexdigest()[:16],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.held_micro", description=__doc__)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--batches", type=int, default=8, help="per partition")
    parser.add_argument("--records", type=int, default=20, help="per batch, of 1 KiB")
    parser.add_argument("--max-records", type=int, default=500)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args(argv)
    for rep in range(args.reps):
        row = run_once(args.partitions, args.batches, args.records, args.max_records)
        print(
            f"rep {rep + 1}: {row['fetches']} fetches, median {row['median_ms']:.2f} ms, "
            f"mean {row['mean_ms']:.2f} ms, {row['upstream_rounds']} upstream rounds, "
            f"digest {row['digest']}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
