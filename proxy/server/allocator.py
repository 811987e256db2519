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

Buffers below the threshold (request frames, socket reads, kio's copies) come from
the heap, and a freed one only leaves the RSS when the free space is at the top of
the heap.  Under a steady load the heap's live objects stay the same in number
(a 5-minute load run: 258,000-265,000 objects from 1 to 5 minutes) while free pages
between them accumulate, so the RSS floor creeps up by a few MiB over minutes.
``heap_trimmer`` returns glibc's ``malloc_trim(0)``, which gives every whole free
page inside the heap back to the system; the server calls it every
``HEAP_TRIM_SECONDS`` (a millisecond or so once the first call has run).
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable
from typing import Any

M_MMAP_THRESHOLD = -3  # glibc's malloc.h
LARGE_BUFFER_BYTES = 128 * 1024
"""glibc's initial threshold, kept fixed: response data is mapped, everything else is not."""
HEAP_TRIM_SECONDS = 10.0
"""How often the server gives the heap's free pages back (``heap_trimmer``)."""


def _glibc_function(name: str) -> Any | None:
    """The C library's function *name* when the C library is glibc; None elsewhere
    (not Linux, musl, whose mallopt does nothing, or no such function)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018  glibc only
        return getattr(libc, name)
    except (OSError, AttributeError):
        return None


def fix_mmap_threshold(threshold: int = LARGE_BUFFER_BYTES) -> str:
    """Fix glibc's mmap threshold at *threshold*; returns what was done (for the start-up log).

    ``"fixed"``, ``"environment"`` (``MALLOC_MMAP_THRESHOLD_`` is set), or
    ``"unsupported"`` (not glibc, or mallopt refused).
    """
    if "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return "environment"
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return "unsupported"
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return "fixed" if mallopt(M_MMAP_THRESHOLD, threshold) == 1 else "unsupported"


def heap_trimmer() -> Callable[[], None] | None:
    """glibc's ``malloc_trim(0)`` as a function of no arguments; None elsewhere."""
    trim = _glibc_function("malloc_trim")
    if trim is None:
        return None
    trim.argtypes = (ctypes.c_size_t,)
    trim.restype = ctypes.c_int

    def run() -> None:
        trim(0)

    return run
