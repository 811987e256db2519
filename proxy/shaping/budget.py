"""The proxy-wide memory budget for response data (KIP-81's buffer.memory, for the proxy).

Sans-I/O accounting: a byte counter with reservations.  It never blocks;
when a response cannot be taken, :meth:`FetchAdmission.take` returns False and
the caller waits for a release (the admission's FIFO of waiters, woken through
a listener, ``add_listener``).  Only the Fetch path uses the budget:
coordinator, group, metadata and produce traffic never asks it for anything,
so it is never blocked by it (KIP-81 exempts coordinator traffic the same way).

A fetch's life (memory taken when the response's size is known, as Kafka's
consumer bounds fetch memory (KIP-81) and its broker's ``MemoryPool`` takes a
request's size from its length prefix and mutes the channel while it cannot
(KIP-72)):

1. ``nbytes = admission.fetch_bytes(...)``: the max_bytes to send upstream
   (the client's, the policy's cap, at most 1/FETCH_SHARE of the budget and
   what its partitions can return, :func:`response_bound`).  Nothing is
   reserved: ``grant = budget.reservation()`` holds 0 bytes, so a long poll
   waiting upstream holds no budget, however large its max_bytes.
2. When the response's length prefix has been read, ``admission.take(waiter,
   grant, frame_size, held=...)`` grows the grant by the frame's size if the
   budget can take it; False: the edge stops reading that upstream connection
   and the connection waits (``wait``) until a release wakes it, then asks
   again.  Fair share: the oldest waiter (or anyone when none waits) takes
   what fits; while others wait, a connection takes only within ``share()``
   (the budget split between the waiters and one more), so no
   connection holds more than its share while others wait.  A response larger
   than the budget can ever have room for is let in when nothing else is held.
3. When the response has been decoded, ``grant.resize(actual_record_bytes)``:
   a response read together with the answer before it (the edge reads a Fetch
   response's length prefix alone, so only one read past a non-Fetch answer)
   was never asked about, so this may exceed the budget (by at most one read
   per connection); ``overshoot_bytes`` records by how much.
4. After trimming, the trimmed-away batches the reuse buffer keeps move to
   their own reservations (``split``), the rest shrinks to what waits to be
   written to the client, and ``release()`` once the response is written.
   Batches the buffer hands back for a later fetch move into that fetch's
   reservation (``absorb``).  :class:`~proxy.shaping.shaper.FetchShaper` does
   steps 3 and 4 when given the grant.

No working copy: a response frame the budget covers never exists twice.  The
broker's and the replicas' connections read a large frame in place, into one
buffer of its size taken from its length prefix (``FrameDecoder``'s
*preallocate*), and its records are decoded as views of that buffer, not copied
(:mod:`proxy.protocol.fetch_views`).  Before, a large frame was joined
from the pieces it arrived in, and 1/``FETCH_SHARE`` of the budget was kept back
for that second copy.

Admission: :class:`FetchAdmission` sizes a client fetch (``fetch_bytes``),
lets responses take memory (``take``) and keeps the FIFO of connections whose
response had to wait.  Each release of budget wakes the oldest waiters, as
many as the headroom could serve; a woken one that still finds no room goes
back to the front (``wait(..., retry=True)``).

Shedding: a cache that holds reservations (the reuse buffers) registers with
the budget while it holds bytes (``holding``/``empty``), so ``shed()`` clears
only the caches that hold something, and costs nothing when none does,
however many connections (and empty caches) there are.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import Protocol

UNLIMITED_BUDGET = 2**62
"""The budget's capacity when none is configured (accounting only)."""
BUDGET_FLOOR = 1_048_588
"""Least bytes a fetch is granted (Kafka's default message.max.bytes, so the broker's
one-batch progress exemption stays inside a grant)."""
FETCH_SHARE = 16
"""With a budget, one fetch asks upstream for at most 1/FETCH_SHARE of it (never below the
floor), so one response cannot take most of the budget."""


class Holder(Protocol):
    """A cache holding reservations that can give them all back (the reuse buffer)."""

    def clear(self) -> None: ...


class Reservation:
    """Bytes held against a :class:`MemoryBudget`; resize or release exactly once."""

    __slots__ = ("_budget", "_nbytes")

    def __init__(self, budget: MemoryBudget, nbytes: int) -> None:
        self._budget = budget
        self._nbytes = nbytes

    @property
    def nbytes(self) -> int:
        return self._nbytes

    @property
    def released(self) -> bool:
        return self._nbytes < 0

    def resize(self, nbytes: int) -> None:
        """Hold *nbytes* instead (data already in memory: may exceed the budget)."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if self.released:
            raise RuntimeError("reservation already released")
        old = self._nbytes
        self._nbytes = nbytes
        self._budget._adjust(nbytes - old)

    def try_grow(self, nbytes: int) -> bool:
        """Hold *nbytes* more if the budget has room; False (unchanged) otherwise."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if self.released:
            raise RuntimeError("reservation already released")
        if not self._budget.fits(nbytes):
            return False
        self._nbytes += nbytes
        self._budget._adjust(nbytes)
        return True

    def split(self, nbytes: int) -> Reservation:
        """Move *nbytes* of this reservation into a new one (the budget's total is unchanged)."""
        if self.released:
            raise RuntimeError("reservation already released")
        if not 0 <= nbytes <= self._nbytes:
            raise ValueError("can only split off between 0 and the reservation's size")
        self._nbytes -= nbytes
        return Reservation(self._budget, nbytes)

    def absorb(self, other: Reservation) -> None:
        """Take over *other*'s bytes (the budget's total is unchanged); *other* ends released."""
        if self.released:
            raise RuntimeError("reservation already released")
        if other._budget is not self._budget:
            raise ValueError("reservations belong to different budgets")
        if other.released:
            return
        self._nbytes += other._nbytes
        other._nbytes = -1

    def release(self) -> None:
        """Give everything back (idempotent)."""
        if self.released:
            return
        old = self._nbytes
        self._nbytes = -1
        self._budget._adjust(-old)

    def __repr__(self) -> str:
        return f"Reservation({self._nbytes})"


class MemoryBudget:
    """A byte budget shared by every connection of the proxy."""

    def __init__(self, capacity: int, *, floor: int = 1) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        if not 1 <= floor <= capacity:
            raise ValueError("floor must be between 1 and capacity")
        self.capacity = capacity
        self.floor = floor
        self._used = 0
        self.peak = 0
        self.overshoot_bytes = 0
        """Largest amount by which data already in memory pushed use past capacity."""
        self._listeners: list[Callable[[], None]] = []
        self._holders: dict[Holder, None] = {}
        """Caches that hold bytes now, in the order they started to (a dict: ordered)."""

    @property
    def used(self) -> int:
        """Bytes reserved."""
        return self._used

    @property
    def headroom(self) -> int:
        return max(0, self.capacity - self.used)

    def fits(self, nbytes: int) -> bool:
        return self.used + nbytes <= self.capacity

    def reservation(self) -> Reservation:
        """A reservation of nothing yet (a fetch's, before its response's size is known)."""
        return Reservation(self, 0)

    def try_reserve(self, nbytes: int) -> Reservation | None:
        """Reserve exactly *nbytes* if it fits, else None (the reuse buffer uses this)."""
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        if not self.fits(nbytes):
            return None
        reservation = Reservation(self, nbytes)
        self._adjust(nbytes)
        return reservation

    def holding(self, holder: Holder) -> None:
        """*holder* now holds bytes: ``shed()`` clears it (idempotent)."""
        self._holders[holder] = None

    def empty(self, holder: Holder) -> None:
        """*holder* holds nothing any more (idempotent)."""
        self._holders.pop(holder, None)

    @property
    def holders(self) -> int:
        """How many caches hold bytes now (what ``shed()`` would visit)."""
        return len(self._holders)

    def shed(self) -> bool:
        """Clear every cache that holds bytes; True if that freed any.

        Visits only the caches that hold something: O(1) when none does.
        """
        if not self._holders:
            return False
        before = self.used
        for holder in list(self._holders):
            holder.clear()
            self._holders.pop(holder, None)  # a holder that forgot to say it is empty
        return self.used < before

    def add_listener(self, callback: Callable[[], None]) -> None:
        """Call *callback* (no arguments, must not raise) whenever bytes are released."""
        self._listeners.append(callback)

    def remove_listener(self, callback: Callable[[], None]) -> None:
        self._listeners.remove(callback)

    def _adjust(self, delta: int) -> None:
        self._used = used = self._used + delta
        if used > self.peak:
            self.peak = used
        if used > self.capacity:
            self.overshoot_bytes = max(self.overshoot_bytes, used - self.capacity)
        if delta < 0:
            self._notify()

    def _notify(self) -> None:
        for callback in list(self._listeners):
            callback()


def max_fetch_bytes(budget: MemoryBudget) -> int:
    """The most one fetch is granted under a configured budget."""
    return max(budget.floor, budget.capacity // FETCH_SHARE)


def response_bound(
    partition_max_bytes: Iterable[int], floor: int, partition_cap: int | None = None
) -> int:
    """The most record bytes a Fetch (v3+) response for partitions asking these max_bytes carries.

    Each partition returns at most its max_bytes (capped by *partition_cap*, the
    policy's ``max_partition_bytes``), except that the first partition with data
    returns at least one whole batch (KIP-74's progress exemption), which *floor*
    (the broker's message.max.bytes) covers: the sum plus what that batch may
    exceed the smallest partition's max_bytes by.  No partitions: no records.
    With any partition the bound is at least *floor*, so a grant it caps still
    covers the exemption as the floor does.
    """
    sizes = list(partition_max_bytes)
    if not sizes:
        return 0
    # (map over the builtins: every partition of every fetch, no bytecode per partition)
    if partition_cap is not None and max(sizes) > partition_cap:
        sizes = list(map(min, sizes, repeat(partition_cap)))
    least = min(sizes)
    if least < 0:
        sizes = list(map(max, sizes, repeat(0)))
        least = 0
    return sum(sizes) + max(0, floor - least)


class Waiter(Protocol):
    """A connection whose fetch waits for budget; ``wake()`` (sync, no I/O) lets it retry."""

    def wake(self) -> None: ...


class FetchAdmission:
    """Admits client fetches to a :class:`MemoryBudget`, first come first served."""

    def __init__(self, capacity: int | None = None) -> None:
        self.budget = MemoryBudget(UNLIMITED_BUDGET)
        self.limited = False
        """A budget is configured (else the budget only accounts)."""
        self.waits = 0
        """Fetches that had to wait for budget (each counted once)."""
        self._waiters: OrderedDict[Waiter, int] = OrderedDict()
        """Waiting connections, oldest first, with the bytes their fetch asks for (O(1)
        membership, removal and return to the front, whatever the number of waiters)."""
        self.configure(capacity)
        self.budget.add_listener(self._released)

    def configure(self, capacity: int | None) -> None:
        """Set the budget's capacity (None: unlimited) and its floor."""
        budget = self.budget
        self.limited = capacity is not None
        budget.capacity = capacity or UNLIMITED_BUDGET
        budget.floor = min(BUDGET_FLOOR, budget.capacity)

    def fetch_bytes(
        self,
        max_bytes: int,
        max_response_bytes: int | None,
        *,
        most_bytes: int | None = None,
    ) -> int:
        """What a fetch asking for *max_bytes* under a policy cap asks the budget for.

        *most_bytes*: the most its response can carry whatever max_bytes says
        (:func:`response_bound` of its partitions; None: unknown).  With a budget
        the fetch asks no more: a long poll of one partition asks upstream for what
        one partition can return (1 MiB by default), not budget/16, and holds
        nothing until its response's size is known (``take``).
        """
        requested = max_bytes
        if max_response_bytes is not None:
            requested = min(requested, max_response_bytes)
        if self.limited:
            requested = min(requested, max_fetch_bytes(self.budget))
            if most_bytes is not None:
                requested = min(requested, most_bytes)
        return max(requested, 0)

    def share(self) -> int:
        """What one connection may hold while others wait: the budget split between the
        waiters and one more, never below the floor."""
        budget = self.budget
        return max(budget.floor, budget.capacity // (len(self._waiters) + 1))

    def room_ahead(self, nbytes: int) -> bool:
        """Whether a fetch nobody asked for yet (a run-ahead round of at most *nbytes*) may
        start: no fetch waits for budget, and the budget would stay at most a quarter
        used.  What runs ahead is speculative, so it takes only memory no client's fetch
        needs now or soon (under load the proxy serves what clients ask, as without it).
        A quarter, not more: what a round holds can be in memory twice for a while (the
        round's frame, kept by the part an answer delivers until it is written, and the
        copy of the part kept), and only once in the budget.  With rounds up to half the
        budget, 50 consumers under 64 MiB grew the RSS by more than the README's budget
        + 32 MiB in 3 of 13 runs (up to budget + 121 MiB); with a quarter, by budget +
        1..6.5 MiB in 10 of 10, as without rounds."""
        budget = self.budget
        if self._waiters:
            return False
        return not self.limited or budget.used + nbytes <= budget.capacity // 4

    def take(self, waiter: Waiter, grant: Reservation, nbytes: int, *, held: int) -> bool:
        """Grow *grant* by *nbytes* (a response whose size is known) if the budget lets
        *waiter*, which holds *held* bytes already, take them now; False: it must wait.

        The oldest waiter, or anyone when none waits, takes what fits; when others wait,
        a connection not first in line takes only within its ``share()`` (a fair share:
        no connection holds more than that while others wait).  A response larger than
        the room the budget can ever have is let in when nothing else is reserved (data
        larger than the pool, as Kafka's MemoryPool lets one in when it is empty).
        """
        budget = self.budget
        waiters = self._waiters
        first = not waiters or next(iter(waiters)) is waiter
        if not first and held + nbytes > self.share():
            return False
        if budget.fits(nbytes) or budget.used == 0:
            grant.resize(grant.nbytes + nbytes)
            return True
        return False

    def wait(self, waiter: Waiter, *, retry: bool, nbytes: int | None = None) -> None:
        """Queue *waiter* to be woken when budget is released (once, however often asked).

        *retry*: a woken fetch that still found no room: it goes back to the front,
        and is not counted again in ``waits``.  *nbytes*: what its fetch asks the
        budget for (``fetch_bytes``; None: the floor), so that a release wakes only
        the fetches the headroom can start.
        """
        if waiter in self._waiters:
            return
        if not retry:
            self.waits += 1
        self._waiters[waiter] = self.budget.floor if nbytes is None else nbytes
        if retry:
            self._waiters.move_to_end(waiter, last=False)

    def leave(self, waiter: Waiter) -> None:
        """*waiter* no longer waits (it was admitted, or its connection closed)."""
        self._waiters.pop(waiter, None)

    def waiting(self, waiter: Waiter) -> bool:
        return waiter in self._waiters

    def wake_waiters(self) -> None:
        """Room may have appeared (e.g. a reload): let waiting fetches try again."""
        self._released(force=True)

    def _released(self, *, force: bool = False) -> None:
        """Wake the oldest waiters, as many as the headroom can start (a waiter asking
        *nbytes* can start once the headroom holds min(nbytes, floor)).

        The oldest is woken even without room when reuse buffers hold bytes (its retry
        sheds them) or when *force*d; none is woken for a release too small to start it,
        so a release costs as many wakes as fetches it can start, not one per waiter.
        """
        budget = self.budget
        headroom = budget.headroom
        first = True
        while self._waiters:
            waiter, nbytes = next(iter(self._waiters.items()))
            if headroom < min(nbytes, budget.floor) and not (first and (force or budget.holders)):
                return
            del self._waiters[waiter]
            headroom -= min(nbytes, headroom)
            first = False
            waiter.wake()
