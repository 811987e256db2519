"""The allocator policy: freed response-sized buffers go back to the system (glibc)."""

from __future__ import annotations

import os
import subprocess
import sys

PROBE = """
import sys
from proxy.server.allocator import fix_mmap_threshold

policy = fix_mmap_threshold() if sys.argv[1] == "fix" else "glibc default"

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 >> 20

first = b"x" * (8 << 20)
del first  # glibc's dynamic threshold now rises to 8 MiB
blocks = []
for _ in range(10):  # ten 4 MiB "responses", each followed by a small live object
    blocks.append(b"y" * (4 << 20))
    blocks.append(bytes(1000))
held = rss_mib()
del blocks[::2]  # the responses were written: freed
print(policy, held, rss_mib())
"""


def probe(mode: str) -> tuple[str, int, int]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, mode], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    policy, held, after = out.stdout.rsplit(maxsplit=2)
    return policy, int(held), int(after)


def test_fixed_threshold_returns_freed_responses_to_the_system() -> None:
    policy, held, after = probe("fix")
    assert policy == "fixed"
    assert held - after >= 36  # the 40 MiB of freed responses left the RSS
    # Side by side, glibc's dynamic threshold keeps them resident (why the fix exists).
    _, held_default, after_default = probe("none")
    assert held_default - after_default < 8


def test_the_environment_tunable_wins() -> None:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from proxy.server.allocator import fix_mmap_threshold as f;print(f())",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert out.stdout.strip() == "environment", out.stderr


TRIM_PROBE = """
import os
from proxy.server.allocator import heap_trimmer

def rss_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 >> 20

trim = heap_trimmer()
# 60 MiB of heap-sized buffers (below the mmap threshold), one in eight kept alive:
# the freed ones leave holes between live ones, which the top-of-heap trim cannot return.
blocks = [os.urandom(1) * (64 << 10) for _ in range(960)]
keep = blocks[::8]
del blocks
before = rss_mib()
trim()
print(before, rss_mib(), len(keep))
"""


def test_heap_trim_returns_free_pages_between_live_buffers() -> None:
    out = subprocess.run(
        [sys.executable, "-c", TRIM_PROBE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    before, after, _ = (int(x) for x in out.stdout.split())
    assert before - after >= 30  # most of the 52 MiB freed between live buffers left the RSS
