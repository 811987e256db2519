"""Every client connection's idle timeout on one task (``idle_timeout_seconds``).

A task per connection that only sleeps until its timeout is a few KiB of
coroutine frames, cancel status and scheduler state for each of thousands of
idle connections.  Here each connection is an entry in one heap of deadlines,
and one task sleeps until the earliest: it asks that connection whether it has
been idle for the whole timeout (``check``, which closes it when it has) or
when to look again, and puts it back at that time.  Activity costs the
connection nothing but moving its latest-activity time, as before: a deadline
is only looked at when it comes.

An entry whose connection ended is dropped when its deadline comes, or, when
such entries make up more than half of the heap (connections that come and go
within a timeout), all at once: the heap holds at most about twice the
connections that are open.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from itertools import count

import structlog
import trio

log = structlog.get_logger("proxy.server")

Check = Callable[[float], float | None]
"""A connection's idle check at the current time: the next time to look again, or None once
the connection is closed (by the check, because it was idle long enough, or earlier)."""


class IdleWatch:
    """One connection's entry; ``cancel`` when the connection ends."""

    __slots__ = ("_timer", "check")

    def __init__(self, timer: IdleTimer, check: Check) -> None:
        self._timer = timer
        self.check: Check | None = check

    def cancel(self) -> None:
        if self.check is not None:
            self.check = None  # lets go of the connection at once; the entry goes later
            self._timer._ended(self)


class IdleTimer:
    """The heap of deadlines and the task that serves it (``run``)."""

    def __init__(self, timeout: float) -> None:
        if not timeout > 0:
            raise ValueError(f"idle timeout must be positive, got {timeout}")
        self.timeout = timeout
        """Seconds a connection may stay idle (``Connection`` reads it)."""
        self._heap: list[tuple[float, int, IdleWatch]] = []
        self._order = count()
        self._dead = 0
        """Entries in the heap whose connection ended."""
        self._earlier = trio.Event()
        """Set when a deadline earlier than the one ``run`` sleeps until was added."""
        self._checking: IdleWatch | None = None
        """The entry being checked (out of the heap meanwhile)."""

    def __len__(self) -> int:
        """Entries in the heap, ended connections' included (what a test of the bound reads)."""
        return len(self._heap)

    def watch(self, check: Check, deadline: float) -> IdleWatch:
        """Call *check* at *deadline* (and then whenever it says), until it returns None or
        the watch is cancelled."""
        entry = IdleWatch(self, check)
        heap = self._heap
        earliest = heap[0][0] if heap else math.inf
        heapq.heappush(heap, (deadline, next(self._order), entry))
        if deadline < earliest:
            self._earlier.set()
        return entry

    def _ended(self, entry: IdleWatch) -> None:
        if entry is self._checking:
            return  # out of the heap: it is not put back
        self._dead += 1
        if self._dead * 2 > len(self._heap):
            self._heap[:] = [item for item in self._heap if item[2].check is not None]
            heapq.heapify(self._heap)
            self._dead = 0

    def due(self, now: float) -> None:
        """Check every connection whose deadline has come (the task's step, plain code)."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, _, entry = heapq.heappop(heap)
            check = entry.check
            if check is None:
                self._dead -= 1
                continue
            self._checking = entry
            try:
                again = check(now)
            except Exception as exc:  # one connection's bug must not stop the others' timers
                log.exception("idle_check_failed", error=f"{type(exc).__name__}: {exc}")
                again = None
            finally:
                self._checking = None
            if again is None or entry.check is None:
                entry.check = None
            else:  # strictly later: this pass ends
                again = max(again, math.nextafter(now, math.inf))
                heapq.heappush(heap, (again, next(self._order), entry))

    async def run(self) -> None:
        """Serve the heap forever (cancel to stop)."""
        while True:
            self.due(trio.current_time())
            self._earlier = trio.Event()
            with trio.move_on_at(self._heap[0][0] if self._heap else math.inf):
                await self._earlier.wait()
