"""The C allocator's policy for response-sized buffers (process start, glibc only).

glibc serves an allocation of ``M_MMAP_THRESHOLD`` bytes or more with its own
``mmap`` and gives it back to the system on ``free``.  The threshold starts at
128 KiB but is *dynamic*: each time such a block is freed, it rises to that
block's size (up to 32 MiB).  After the first multi-MiB Fetch response is
freed, later ones come from the heap instead, where freed responses leave
holes the next differently sized one does not fit, so the process's RSS
drifts above the data it holds, past the memory budget.  Setting the
threshold explicitly (``mallopt(M_MMAP_THRESHOLD, ...)``) turns the dynamic
adjustment off: every large buffer is mapped while it lives and unmapped when
freed, so RSS follows the budget's accounting.  Small objects are unaffected.

``MALLOC_MMAP_THRESHOLD_`` in the environment (glibc's own tunable) wins: the
proxy leaves the policy alone when it is set.  Elsewhere (musl, macOS) this is
a no-op.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
LARGE_BUFFER_BYTES = 128 * 1024
"""glibc's initial threshold, kept fixed: response data is mapped, everything else is not."""


def fix_mmap_threshold(threshold: int = LARGE_BUFFER_BYTES) -> str:
    """Fix glibc's mmap threshold at *threshold*; returns what was done (for the start-up log).

    ``"fixed"``, ``"environment"`` (``MALLOC_MMAP_THRESHOLD_`` is set), or
    ``"unsupported"`` (not glibc, or mallopt refused).
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return "environment"
    if not sys.platform.startswith("linux"):
        return "unsupported"
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # noqa: B018  glibc only: musl's mallopt does nothing
    except (OSError, AttributeError):
        return "unsupported"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return "fixed" if mallopt(M_MMAP_THRESHOLD, threshold) == 1 else "unsupported"
