"""Run ``kafka-fetch-proxy`` under tracemalloc and report where its peak Python memory was.

    python bench/traced_proxy.py REPORT_FILE -- run --config proxy.toml

A sampling thread watches ``tracemalloc.get_traced_memory()`` and keeps a
snapshot of the highest point seen (re-taken when the traced total grows by
another MiB); at exit the top allocation sites of that snapshot, grouped by
traceback, go to REPORT_FILE.  Python allocations only: the allocator's own
slack shows in RSS (``/proc/self/status``), not here.
"""

from __future__ import annotations

import atexit
import sys
import threading
import time
import tracemalloc
from pathlib import Path

FRAMES = 12
STEP = 1 << 20


def main() -> int:
    report = Path(sys.argv[1])
    args = sys.argv[sys.argv.index("--") + 1 :]
    from proxy.cli import build_parser
    from proxy.cli import main as proxy_main

    build_parser()  # imports every subcommand untraced: code is not response data

    tracemalloc.start(FRAMES)
    best: list[tracemalloc.Snapshot | int] = [0]

    def sample() -> None:
        while True:
            current, _ = tracemalloc.get_traced_memory()
            if current > int(best[0] if isinstance(best[0], int) else 0) + STEP:
                best[:] = [current, tracemalloc.take_snapshot()]
            time.sleep(0.02)

    def dump() -> None:
        _, peak = tracemalloc.get_traced_memory()
        lines = [f"traced peak {peak / 2**20:.1f} MiB; snapshot at {int(best[0]) / 2**20:.1f} MiB"]
        if len(best) > 1:
            snap = best[1]
            assert isinstance(snap, tracemalloc.Snapshot)
            snap = snap.filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
            for stat in snap.statistics("traceback")[:15]:
                lines.append(f"\n{stat.size / 2**20:.1f} MiB in {stat.count} blocks")
                lines += [f"    {line}" for line in stat.traceback.format()[-2 * FRAMES :]]
        report.write_text("\n".join(lines) + "\n")

    atexit.register(dump)
    threading.Thread(target=sample, daemon=True).start()
    return proxy_main(args)


if __name__ == "__main__":
    sys.exit(main())
