"""Bounds on the request bytes the proxy holds: one pool for the process, a cap per connection.

Kafka's broker bounds what it buffers of requests with a memory pool
(KIP-72, ``queued.max.request.bytes``): the size prefix of a request is read,
its whole size is taken from the pool, and a connection whose request does not
fit is muted (not read) until memory is given back.  The proxy does the same,
sans-I/O here, with the trio edge (``proxy.server.connection``) doing the
reading and the waiting:

- Every connection may hold ``share`` bytes (16 KiB) of requests on its own.
  Everything the proxy relays for control (ApiVersions, heartbeats, commits,
  Metadata, the fetches of a few hundred partitions) fits in it, so no client
  can stall those of another by filling the pool.
- What a connection holds beyond its share comes from the pool (``limit`` bytes
  for the process).  It is reserved from the length prefix for the whole frame
  before the frame's body is read, so a frame that was let in can always be
  completed: no two connections each hold half of what they need.
- A connection holds at most ``per_connection`` bytes of requests unless a
  single frame is larger, which is then let in only when it is all the
  connection holds.
- Connections waiting for the pool are let in in the order they asked; a
  frame is never passed by a later one, so a large frame cannot starve.  (An
  order by what each holds, the connection holding the most waiting first,
  would let a stream of newcomers pass a large frame forever; the share and the
  per-connection cap already keep one connection from taking it all.)  A frame
  larger than the room the pool can ever offer (larger than ``limit``) is let
  in when the pool is empty.  So the bytes held beyond the shares never exceed
  ``max(limit, the largest frame let in)``.
- Nobody waits forever: a connection that waits keeps only what the bytes it
  already holds need (whole frames on their way upstream or to an answer, which
  go without the pool), never memory for a frame it was not let into, so no
  two connections wait on each other; frames let in are read to their end (or
  their connection is closed by the frame timeout) and then handed upstream or
  answered.  ``tests/unit/test_request_bounds.py`` checks this over random
  interleavings.

What a connection "holds" is the edge's count: bytes of partial frames plus
whole frames not yet written upstream, plus Fetch frames not yet answered
(``Relay.held_bytes``).  Between frames a connection reads into its share (when
whole frames it holds fill the share, they are reserved first); inside a frame
that took memory from the pool it reads that frame and nothing after it.
"""

from __future__ import annotations

from collections.abc import Callable

DEFAULT_SHARE = 16 * 1024
"""Bytes of requests every connection may hold without the pool."""

WAIT_OWN = "own"
"""The connection must wait for its own requests to be handed upstream or answered."""
WAIT_POOL = "pool"
"""The connection must wait for the pool to let its frame in (its account's ``wake``)."""


class RequestMemory:
    """The process-wide pool of request bytes beyond the connections' shares."""

    def __init__(self, limit: int, *, per_connection: int, share: int = DEFAULT_SHARE) -> None:
        if limit <= 0 or per_connection <= 0 or share <= 0:
            raise ValueError("request memory limits must be positive")
        if per_connection < share:
            raise ValueError("per_connection must be at least the share")
        self.limit = limit
        self.per_connection = per_connection
        self.share = share
        self.used = 0
        """Bytes reserved from the pool (beyond the shares)."""
        self.peak_used = 0
        self.held = 0
        """Bytes the connections reported holding, shares included."""
        self.peak_held = 0
        self.accounts = 0
        self._queue: dict[RequestAccount, None] = {}
        """Accounts waiting for the pool, in the order they asked."""

    @property
    def waiting(self) -> int:
        return len(self._queue)

    def account(self) -> RequestAccount:
        """A new connection's account."""
        self.accounts += 1
        return RequestAccount(self)

    def bound(self, connections: int) -> int:
        """The most the pool lets *connections* connections hold of requests at once,
        frames larger than ``limit`` aside (each is let in only into an empty pool)."""
        return self.limit + connections * self.share

    # --- internals, for RequestAccount ------------------------------------------------------

    def _reserve(self, account: RequestAccount, nbytes: int) -> None:
        account.reserved += nbytes
        self.used += nbytes
        self.peak_used = max(self.peak_used, self.used)

    def _release(self, account: RequestAccount, nbytes: int) -> None:
        account.reserved -= nbytes
        self.used -= nbytes
        if self._queue:
            self._grant()

    def _enqueue(self, account: RequestAccount) -> None:
        self._queue.setdefault(account, None)
        self._grant(asking=account)

    def _grant(self, asking: RequestAccount | None = None) -> None:
        """Let waiting accounts in, in order, while they fit, and wake them.

        *asking* is the account whose own call this is: it learns the answer
        from its reservation, not from a wake-up.
        """
        queue = self._queue
        while queue:
            first = next(iter(queue))  # the longest waiting
            extra = first._target - first.reserved
            if extra > 0:
                if self.used + extra > self.limit and self.used > 0:
                    break  # the pool drains (every reservation ends); nobody passes it
                self._reserve(first, extra)
            del queue[first]
            if first is not asking and first.wake is not None:
                first.wake()

    def _report(self, account: RequestAccount, held: int) -> None:
        self.held += held - account.held
        account.held = held
        self.peak_held = max(self.peak_held, self.held)


class RequestAccount:
    """One connection's side of the pool: how much it may read, what it gives back.

    The edge calls ``next_read`` before each read of the client, ``received``
    after it, ``settle``
    whenever what it holds went down (frames written upstream, fetches
    answered) and ``close`` at the end.  Accounts the pool lets in meanwhile
    are told through their ``wake`` (set by the edge).

    The reservation an account needs is what it holds plus the *extent* of the
    read it is allowed, minus the share: the extent is the rest of a frame
    larger than the share (reserved whole, from its length prefix) or, between
    frames, the room the share leaves for reading (at most the share).
    """

    __slots__ = ("_extent", "_target", "closed", "held", "pool", "reserved", "wake")

    def __init__(self, pool: RequestMemory) -> None:
        self.pool = pool
        self.reserved = 0
        """Bytes this connection took from the pool."""
        self.held = 0
        """What the connection last reported holding."""
        self._extent = 0
        """Bytes the read last allowed may bring (what ``settle`` keeps room for)."""
        self._target = 0
        """While waiting: the reservation asked for."""
        self.wake: Callable[[], None] | None = None
        """How the edge is told that the pool let this account in (set by the edge)."""
        self.closed = False
        """Closed: it holds nothing and asks for nothing any more."""

    @property
    def waiting(self) -> bool:
        return self in self.pool._queue

    def next_read(self, held: int, partial: int, missing: int | None) -> int | str:
        """How many bytes the connection may read now, or why it must wait.

        *held*: the bytes it holds, *partial* (those of the frame in progress)
        included; *missing*: what that frame still lacks, once its size is
        known.  Returns a byte count > 0 (what the read may bring: a larger
        read would take memory nobody reserved), ``WAIT_OWN`` or ``WAIT_POOL``.
        """
        pool = self.pool
        share = pool.share
        pool._report(self, held)
        if held < share and (missing is None or partial + missing <= share):
            # Within the share (the usual case): the read takes nothing from the pool, and
            # whatever this account had reserved goes back (the general path's result).
            self._extent = extent = share - held
            if self.reserved:
                self._release_to(0)
            return extent
        if missing is not None and partial + missing > share:
            extent = missing  # a frame beyond the share: reserved whole, read to its end only
        elif held < share:
            extent = share - held  # the share has room: no reservation
        else:
            extent = share - partial  # whole frames held beyond the share: reserve them
        self._extent = extent
        if held + extent > pool.per_connection and held > partial:
            # Beyond the cap: wait until this is all the connection holds, reserving
            # nothing for the read it was not allowed.
            pool._queue.pop(self, None)
            self._release_to(max(0, held - share))
            return WAIT_OWN
        need = self._need(held)
        if need <= self.reserved:
            self._release_to(need)
            return extent
        # Wait holding only what the bytes it holds need: a connection never keeps
        # memory for a frame while it waits for more (no two wait on each other).
        self._target = need
        self._release_to(max(0, held - share))
        if self.reserved >= need:  # let in while giving back (it was waiting already)
            return extent
        pool._enqueue(self)
        return extent if self.reserved >= need else WAIT_POOL

    def received(self, nbytes: int) -> None:
        """A read brought *nbytes* (now part of what the connection holds)."""
        self._extent = max(0, self._extent - nbytes)

    def settle(self, held: int) -> None:
        """What the connection holds went down: give back what it no longer needs."""
        pool = self.pool
        if self.closed:
            return  # a task of the ended connection, still unwinding
        pool._report(self, held)
        waiting = self.waiting
        if not self.reserved and not waiting:
            return  # it took nothing from the pool and asks for nothing: nothing to give back
        if waiting:
            self._target = self._need(held)
            self._release_to(max(0, held - pool.share))
            if self.waiting:
                pool._grant()
            return
        self._release_to(self._need(held))

    def close(self) -> None:
        """The connection ended: everything it reserved goes back."""
        pool = self.pool
        if self.closed:
            return
        self.closed = True
        self.wake = None  # no reference back to the connection's edge (a cycle otherwise)
        pool._queue.pop(self, None)
        pool._report(self, 0)
        pool.accounts -= 1
        self._extent = 0
        self._release_to(0)
        if pool._queue:
            pool._grant()

    def _need(self, held: int) -> int:
        return max(0, held + self._extent - self.pool.share)

    def _release_to(self, keep: int) -> None:
        if keep < self.reserved:
            self.pool._release(self, self.reserved - keep)
