"""The partitions of the fetches being processed, bounded for the process
(``max_partitions_in_flight``; issue 19: the memory a request costs is bounded).

A fetch being processed holds per-partition state in every stage (its decoded
request, the downstream and upstream sessions' views of it, shaping's rotation
and limits, the answer's encoded parts): about 1.4 KiB a partition, some 40 times
its wire size.  ``max_fetch_partitions`` bounds one fetch and a connection
serves one fetch at a time, but nine connections each sending a 10,000-partition
fetch at once held 90,000 partitions' state together (the RSS rose by 150-190 MiB,
and CPython keeps most of that as free pools afterwards).  Sans-I/O, as the
request memory's pool (:mod:`proxy.relay.request_memory`) and the memory budget's
admission (:mod:`proxy.shaping.budget`): the handler asks, the edge's wake loop
resumes it.

- A fetch takes its partition count (counted from its bytes,
  :mod:`proxy.protocol.fetch_count`) when it reaches the head of its
  connection's queue, before it is decoded, and gives it back once its answer
  is written to the client (or its connection closes: every path ends there or
  in an answer).
- A fetch of at most ``small`` partitions (500, what the fetch path serves
  without slicing) takes nothing and never waits: a consumer's few partitions
  always pass, as a connection's 16 KiB share of request memory does.  So the
  bound is on the large fetches' partitions; the small ones add at most
  ``small`` a connection.
- A large fetch that does not fit waits (its connection's fetches are not
  served meanwhile; other request types never wait), in a FIFO: a fetch is
  never passed by a later large one, so a large fetch cannot starve, and the
  fetches ahead of it are being processed, so each ends.  A fetch larger than
  ``limit`` is let in when no large fetch is in flight.  So the large fetches'
  partitions in flight never exceed ``max(limit, the largest fetch let in)``.
"""

from __future__ import annotations

from typing import Protocol

SMALL_FETCH_PARTITIONS = 500
"""A fetch of at most this many partitions takes nothing from the bound (the fetch path's
``SLICE_PARTITIONS``: it is served in one turn)."""


class Waiter(Protocol):
    """A connection's fetch handler: woken (sync, no I/O) when its fetch may fit."""

    def wake(self) -> None: ...


class PartitionsInFlight:
    """The process's count of the partitions of large fetches being processed."""

    def __init__(self, limit: int, *, small: int = SMALL_FETCH_PARTITIONS) -> None:
        if limit <= 0:
            raise ValueError("max_partitions_in_flight must be positive")
        self.limit = limit
        self.small = small
        self.used = 0
        """Partitions taken by the large fetches in flight."""
        self.peak_used = 0
        self.waits = 0
        """Fetches that had to wait (each counted once)."""
        self._queue: dict[Waiter, int] = {}
        """Waiting handlers and their fetches' partitions, in the order they asked."""

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def configure(self, limit: int) -> None:
        """A reload's new limit; waiters that now fit are woken."""
        self.limit = limit
        self._wake_first()

    def take(self, waiter: Waiter, partitions: int) -> int | None:
        """Take *partitions* for *waiter*'s next fetch: the count to give back once it is
        written (0 for a small fetch), or None: it waits (a later ``wake()`` says ask again;
        it keeps its place in the line)."""
        if partitions <= self.small:
            return 0
        queue = self._queue
        first = next(iter(queue)) if queue else waiter
        if first is not waiter or (self.used and self.used + partitions > self.limit):
            if waiter not in queue:
                queue[waiter] = partitions
                self.waits += 1
            return None
        queue.pop(waiter, None)
        self.used += partitions
        self.peak_used = max(self.peak_used, self.used)
        self._wake_first()  # the next in line may fit beside it
        return partitions

    def give_back(self, partitions: int) -> None:
        """A fetch's partitions were written (or dropped): wake the first waiter if it fits."""
        if partitions:
            self.used -= partitions
            self._wake_first()

    def leave(self, waiter: Waiter) -> None:
        """*waiter* asks no more (its connection closed)."""
        if self._queue.pop(waiter, None) is not None:
            self._wake_first()

    def _wake_first(self) -> None:
        queue = self._queue
        if queue:
            first, partitions = next(iter(queue.items()))
            if not self.used or self.used + partitions <= self.limit:
                first.wake()


class Keeper(Protocol):
    """A connection's fetch handler that kept a large fetch's decoded request."""

    def forget_decode(self) -> None:
        """Drop the kept decoded request (sync, no I/O); ``KeptDecodes`` has counted it out."""


class KeptDecodes:
    """The decoded requests large fetches leave for their connection's next fetch, bounded
    for the process apart from the fetches in flight (the same ``limit``).

    A sessionless consumer's next Fetch repeats most of its last one, which
    ``proxy.protocol.fetch_reuse`` decodes from the last one's parts.  A connection
    keeps the parts of its latest fetch; one of more than ``small`` partitions (whose
    decode took from :class:`PartitionsInFlight`) keeps them only within this count:
    keeping one past it makes the connections that kept the oldest forget theirs, and
    one larger than ``limit`` is not kept.  Never a wait: a forgotten decode costs its
    connection's next fetch a whole decode, as without it.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self._kept: dict[Keeper, int] = {}
        """Keepers and their decodes' partitions, the oldest first."""

    def configure(self, limit: int) -> None:
        """A reload's new limit: the oldest are forgotten until the rest fit."""
        self.limit = limit
        self._make_room(0)

    def keep(self, keeper: Keeper, partitions: int) -> bool:
        """May *keeper* keep a decode of *partitions* (in place of the one it kept)?"""
        self.drop(keeper)
        if partitions > self.limit:
            return False
        self._make_room(partitions)
        self._kept[keeper] = partitions
        self.used += partitions
        return True

    def drop(self, keeper: Keeper) -> None:
        """*keeper* forgot its decode (or its connection closed)."""
        self.used -= self._kept.pop(keeper, 0)

    def _make_room(self, partitions: int) -> None:
        kept = self._kept
        while kept and self.used + partitions > self.limit:
            oldest = next(iter(kept))
            self.used -= kept.pop(oldest)
            oldest.forget_decode()
