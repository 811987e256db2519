"""Per-connection fetch shaping: the one object the fetch path calls per Fetch.

    shaper = FetchShaper(limits, buffer_capacity=..., budget=budget)
    prepared = shaper.prepare(client_request, grant=grant, max_bytes=max_bytes)
    ... send prepared.upstream_request upstream (or apply prepared.upstream_offsets
        and prepared.upstream_request.max_bytes to the upstream session) ...
    shaped = shaper.finish(prepared, upstream_response)
    ... send shaped.response to the client; tell the upstream session
        shaped.next_offsets; log shaped.decision ...

``prepare`` clamps the request to the limits (and *max_bytes*, what the fetch may ask),
rotates the partition order of full fetches round-robin (KIP-74), and takes
matching batches out of the reuse buffer, moving those partitions' upstream
fetch offsets past them.  ``finish`` applies upstream's word to the buffer
(errors, leader epochs, high watermarks, a preferred read replica), trims the response in serve-rotation
order, keeps what was trimmed away in the buffer and builds the decision.

Running ahead (issue 17, after Kafka's consumer: ``Fetcher``/``FetchBuffer``
keep completed fetches per partition, ``fetchablePartitions`` asks a broker
only for partitions with nothing buffered, ``max.poll.records`` is served from
the buffer):

- ``held_answer(prepared)``: when the held batches alone fill the client's
  response (a response limit keeps a held batch back, or every partition it
  asks is filled to its partition limit), the response is made of them and of
  the watermarks the client was last given, and goes to ``finish`` as
  upstream's answer would: no upstream round.  Not while a partition the
  client knows has data upstream (none held) has waited as many responses as
  the fetch has partitions (``waiting``; the serve rotation's own bound): that
  fetch goes up.
- Under a record limit, upstream is asked for at most what the buffer can keep
  (its capacity and the connection's share of the budget, less what the fetch
  holds), so a round serves several responses and nothing fetched is thrown
  away; a partition whose held batches fill its partition limit asks 0 bytes.
  The partition byte cap is then applied by trimming, not sent upstream: each
  partition asks at least the buffer's capacity (the client's own partition
  max_bytes if larger, 0 left at 0), so the broker cuts a batch only at the
  response's end, not at every partition's cap (a partial trailing batch is
  dropped and fetched again: with 1 MB batches and a client's 1 MiB, nearly
  one a partition).  What the client gets of a partition is still trimmed to
  its own partition max_bytes.
- Watermarks never go back: held entries take upstream's newer watermarks, and
  an answer from held data carries the latest the client was given
  (``watermarks``).  A partition whose last answer was an error has none, so
  its fetches go upstream.

Upstream fetch offsets are decided afresh by every ``prepare``: the end of the
held batches when they match the client's offset, else the client's offset.
The session layer applies them each time, so a discarded buffer entry needs
no separate rewind.

Limits can be replaced at any time (config reload); the next ``prepare`` uses
the new ones.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from kio.schema.errors import ErrorCode
from kio.static.primitive import i32Timedelta

from ..protocol.apis import FETCH
from ..protocol.codec import drain
from ..protocol.messages import make, replaced, response_module
from ..protocol.partition_key import PartitionKey, topic_key
from ..protocol.partition_plan import FROM_V9, plain_from_v9
from ..protocol.partition_result import empty_entry
from .budget import MemoryBudget, Reservation
from .buffer import NO_EPOCH, ReuseBuffer
from .decision import ShapingDecision
from .limits import (
    Limits,
    ResponseLimits,
    clamp_request_in_ranges,
    response_limits_of,
    upstream_max_bytes,
)
from .rotation import DEFAULT_MAX_PARTITIONS, ServeRotation, UpstreamRotation
from .trim import (
    Copy,
    PartitionOutcome,
    Prefix,
    Run,
    TrimResult,
    aborted_of,
    allocate_in_ranges,
    concat,
    is_legacy,
    marks_of,
    parse_records,
    trim_held_in_ranges,
    trim_response_in_ranges,
)

RESPONSE_LIMITS = frozenset({"response_bytes", "response_records"})
"""Limits of a whole response (``allocate``'s names): held data that reaches one fills it."""
READ_COMMITTED = 1


def is_full_fetch(request: Any) -> bool:
    """True for sessionless fetches and for the full fetch that opens a session (KIP-227)."""
    epoch = getattr(request, "session_epoch", -1)
    return bool(epoch <= 0)


@dataclass(frozen=True, slots=True)
class UpstreamPlan:
    """What ``prepare`` decided for the upstream request, which ``upstream`` builds only
    when the fetch goes upstream (an answer from held data needs none)."""

    max_bytes_cap: int | None
    partition_cap: bool
    """False: running ahead, the partition cap is left to trimming (see ``prepare``)."""
    upstream_epochs: Mapping[PartitionKey, int]
    """Per partition moved past held batches, the leader epoch of the last one."""


@dataclass(frozen=True, slots=True)
class PreparedFetch:
    client_request: Any
    upstream_request: Any
    """The request to send upstream: clamped, rotated, offsets moved past held batches.
    None until built (``FetchShaper.upstream_in_ranges``) when ``prepare`` was asked not to."""
    limits: Limits
    response_limits: ResponseLimits
    prefixes: Mapping[PartitionKey, Prefix]
    """Batches offered from the reuse buffer, to go out ahead of upstream's data; held there
    until ``finish`` settles them (``ReuseBuffer.offer``)."""
    client_offsets: Mapping[PartitionKey, int]
    """Where the client fetches each partition (request, plus session offsets given)."""
    upstream_offsets: Mapping[PartitionKey, int]
    """Partitions whose upstream fetch offset differs from the client's (past held batches)."""
    epochs: Mapping[PartitionKey, int]
    grant: Reservation | None = None
    """The memory budget's reservation for this fetch (see :meth:`FetchShaper.prepare`)."""
    plan: UpstreamPlan | None = None
    upstream_max_bytes: int = 0
    """The upstream request's max_bytes (built or not)."""


@dataclass(frozen=True, slots=True)
class ShapedResponse:
    response: Any
    """The kio FetchResponse for the client."""
    next_offsets: Mapping[PartitionKey, int]
    """Per partition that got data, the offset after the last delivered batch: the
    client's next fetch offset, which the upstream session must learn."""
    decision: ShapingDecision
    result: TrimResult
    served_after: Mapping[PartitionKey, int]
    """Per partition served, the consecutive responses it had waited with data
    before this one (0: not starved); for a starvation histogram."""


@dataclass(frozen=True, slots=True)
class _HeldMade:
    """What ``held_answer`` learnt while making its answer, so that ``finish`` trims only
    the partitions with held data: every other one has nothing on offer, and its entry
    carries the watermarks the client was given (the general trim would find just that,
    a partition at a time, over every partition a sessionless client lists)."""

    response: Any
    held_at: tuple[tuple[int, tuple[int, ...]], ...]
    """(topic index, positions in it of the partitions with held data), in response order."""
    waits: tuple[PartitionKey, ...]
    """The other partitions whose high watermark is past the client's offset."""
    settled: tuple[PartitionKey, ...]
    """The other partitions that were waiting and no longer are."""
    partitions: int
    """How many partitions the response lists."""
    keys: tuple[PartitionKey, ...]
    """The partitions with held data, in response order (as *held_at* places them)."""
    serve: tuple[PartitionKey, ...]
    """The serve order the answer was allocated in, and *plan* that allocation."""
    plan: Mapping[PartitionKey, tuple[int, bool, frozenset[str]]]
    in_order: bool
    """*keys* are in the order *serve* was made from (the held batches' order), so the
    rotation, which keeps the order of ties, gives *serve* for them again."""


@dataclass(frozen=True, slots=True)
class AheadHeld:
    """What ``FetchShaper.hold_ahead`` made of a run-ahead round's answer."""

    partitions: frozenset[PartitionKey]
    """The partitions it put in the reuse buffer."""
    upstream_records: int
    """Records of the whole batches upstream sent."""
    upstream_bytes: int
    """Record bytes upstream sent (a partial last batch included)."""
    held_bytes: int
    """Record bytes the buffer holds for the client from it (with what it held before)."""


class FetchShaper:
    def __init__(
        self,
        limits: Limits,
        *,
        buffer_capacity: int = 0,
        budget: MemoryBudget | None = None,
        max_partitions: int = DEFAULT_MAX_PARTITIONS,
        share: Callable[[], int] | None = None,
        copy: Copy | None = None,
    ) -> None:
        self.limits = limits
        self.copy = copy
        """Makes the owned copies of records it holds (``CopyPool.copy``; None: ``bytes``)."""
        self.buffer = ReuseBuffer(buffer_capacity, budget=budget)
        self.upstream_rotation: UpstreamRotation[PartitionKey] = UpstreamRotation(max_partitions)
        self.serve_rotation: ServeRotation[PartitionKey] = ServeRotation(max_partitions)
        self.share = share
        """What this connection may hold of the memory budget now (``FetchAdmission.share``);
        bounds how far ahead upstream is asked.  None: the buffer's capacity alone."""
        self.watermarks: dict[PartitionKey, tuple[int, int, int]] = {}
        """Per partition, (high watermark, last stable offset, log start offset) as the last
        response gave them to the client: what an answer from held data carries."""
        self.held_entries: dict[
            PartitionKey, tuple[tuple[int, int, int], tuple[Any, ...], Any]
        ] = {}
        """Per partition, the last partition entry an answer from held data made (frozen),
        with what it was made from (watermarks, isolation, version): most of a
        sessionless client's partitions are idle, their entries the same each time.
        Its keys are the watermarks' and leave with them."""
        self.held_answers = 0
        """Client fetches answered from held data alone (no upstream round)."""
        self.waiting: dict[PartitionKey, int] = {}
        """Per partition whose data the client knows of (high watermark past its offset) and
        did not get: the consecutive responses it has waited (see ``held_answer``)."""
        self.upstream_whole_bytes = 0
        """Record bytes of whole batches upstream sent (partial trailing batches not counted)."""
        self.delivered_bytes = 0
        """Record bytes delivered to the client."""
        self.ahead_keys: set[PartitionKey] = set()
        """The partitions the last run-ahead round put in the buffer (``hold_ahead``)."""
        self._held_made: _HeldMade | None = None
        """The last answer ``held_answer`` made, until ``finish`` is given it."""
        self.read_committed: bool | None = None
        """The isolation level of the fetches the held batches were read for (None: no
        fetch yet): a fetch of the other level drops them (``_isolation``)."""

    def prepare(
        self,
        request: Any,
        *,
        max_bytes_cap: int | None = None,
        max_bytes: int | None = None,
        grant: Reservation | None = None,
        session_offsets: Mapping[PartitionKey, tuple[int, int]] | None = None,
        session_partition_max_bytes: Mapping[PartitionKey, int] | None = None,
    ) -> PreparedFetch:
        """Shape the client's *request* for upstream.

        *grant*: the memory budget's reservation for this fetch
        (``MemoryBudget.reservation``, of nothing until the response's size is known); its
        size caps the upstream max_bytes
        unless *max_bytes_cap* is given; :meth:`finish` resizes it to upstream's data in
        memory, moves into it the held batches the response serves (or changes), and
        resizes it to the bytes delivered.  The caller releases it once the response
        is written.  *max_bytes*: the most the response may carry, held batches
        included (the upstream max_bytes is what is left after them); given, it
        caps instead of the grant's size (a grant that holds nothing until the
        response's size is known).  *session_offsets*: for an
        incremental fetch, (fetch offset, current leader epoch) of the session
        partitions the request does not repeat, so held batches for them are
        used too (their new upstream offsets come back in ``upstream_offsets``).
        """
        steps = self.prepare_in_ranges(
            request,
            0,
            max_bytes_cap=max_bytes_cap,
            max_bytes=max_bytes,
            grant=grant,
            session_offsets=session_offsets,
            session_partition_max_bytes=session_partition_max_bytes,
        )
        return drain(steps)

    def prepare_in_ranges(
        self,
        request: Any,
        every: int,
        *,
        max_bytes_cap: int | None = None,
        max_bytes: int | None = None,
        grant: Reservation | None = None,
        session_offsets: Mapping[PartitionKey, tuple[int, int]] | None = None,
        session_partition_max_bytes: Mapping[PartitionKey, int] | None = None,
        upstream: bool = True,
        forget_unlisted: bool = False,
    ) -> Generator[None, None, PreparedFetch]:
        """``prepare``, yielding after every *every* partitions (0: never) of its walks: the
        offsets the request names, the held batches offered from the reuse buffer (left
        held there: ``finish`` settles them), the response limits, the ``max_partition_bytes``
        clamp, the offsets moved past held batches and the upstream rotation's rebuild.
        Between two ranges only this connection's own fetch changes its buffer, except
        ``FetchPath.shed_buffers`` (another connection short of budget), which empties
        it: the rest of the walk then offers nothing, as a prepare after the shed would.
        The rotation is read and changed at one point.

        *upstream* False: the upstream request is not built (``upstream_request`` None)
        until ``upstream_in_ranges`` is called, so a fetch answered from held data
        (``held_answer``) spares the walks that build it.  *forget_unlisted*: a full fetch
        lists every partition the client reads, so what this connection holds for a
        partition it does not list (held batches, watermarks, waits, rotations) is
        forgotten, before anything is offered."""
        self._isolation(request)
        limits = self.limits
        client_offsets: dict[PartitionKey, int] = {}
        epochs: dict[PartitionKey, int] = {}
        for key, (offset, epoch) in (session_offsets or {}).items():
            client_offsets[key] = offset
            epochs[key] = epoch
        # the client's partition max_bytes (the response limits'), in the same walk
        partition_max: dict[PartitionKey, int] = dict(session_partition_max_bytes or {})
        walked = 0
        for topic in request.topics:
            tkey = topic_key(topic)
            for p in topic.partitions:
                if type(p) in FROM_V9 or plain_from_v9(type(p)):
                    # kio's v9+ classes (librdkafka's v11, Java's v17-18): ints, read straight
                    key = (tkey, p.partition)
                    client_offsets[key] = p.fetch_offset
                    epochs[key] = p.current_leader_epoch
                    partition_max[key] = p.partition_max_bytes
                else:
                    key = (tkey, int(p.partition))
                    client_offsets[key] = int(p.fetch_offset)
                    epochs[key] = int(getattr(p, "current_leader_epoch", NO_EPOCH))
                    partition_max[key] = int(p.partition_max_bytes)
                walked += 1
                if every and walked % every == 0:
                    yield
        if forget_unlisted and is_full_fetch(request):
            self._forget_unlisted(client_offsets)
        prefixes: dict[PartitionKey, Prefix] = {}
        upstream_offsets: dict[PartitionKey, int] = {}
        upstream_epochs: dict[PartitionKey, int] = {}
        buffer = self.buffer
        # the partitions with held batches, in the request's order (ties in the serve
        # rotation keep it); one pass in a comprehension, the offers after it
        held_keys = [k for k in client_offsets if k in buffer] if len(buffer) else []
        for walked, key in enumerate(held_keys, 1):
            if every and walked % every == 0:
                yield
            prefix = buffer.offer(key, client_offsets[key], epochs[key])
            if prefix is not None and prefix.run.next_offset is not None:
                prefixes[key] = prefix
                upstream_offsets[key] = prefix.run.next_offset
                upstream_epochs[key] = prefix.run.headers[-1].partition_leader_epoch
        held = sum(p.run.size for p in prefixes.values())
        if max_bytes_cap is None and max_bytes is not None:
            max_bytes_cap = max(0, max_bytes - held)
        elif max_bytes_cap is None and grant is not None:
            max_bytes_cap = max(0, grant.nbytes - held)
        rlimits = response_limits_of(limits, request, partition_max)
        ahead = self._ahead(rlimits)
        if ahead is not None:
            max_bytes_cap = ahead if max_bytes_cap is None else min(max_bytes_cap, ahead)
        plan = UpstreamPlan(max_bytes_cap, ahead is None, upstream_epochs)
        prepared = PreparedFetch(
            client_request=request,
            upstream_request=None,
            limits=limits,
            response_limits=rlimits,
            prefixes=prefixes,
            client_offsets=client_offsets,
            upstream_offsets=upstream_offsets,
            epochs=epochs,
            grant=grant,
            plan=plan,
            upstream_max_bytes=upstream_max_bytes(request, limits, max_bytes_cap),
        )
        if not upstream:
            return prepared
        return (yield from self.upstream_in_ranges(prepared, every))

    def upstream_in_ranges(
        self, prepared: PreparedFetch, every: int, *, rotate: bool = True
    ) -> Generator[None, None, PreparedFetch]:
        """*prepared* with its upstream request built (as ``prepare`` builds it unless told
        not to): clamped, offsets moved past held batches, in the upstream rotation's order
        for a full fetch; yields after every *every* partitions (0: never) of its walks.
        The rotation is read and changed at one point.

        *rotate* False: the request keeps the client's order, for a caller whose upstream
        session orders the partitions itself (an incremental fetch: the broker answers
        them in its session's order and moves each it answers to the end, the same round
        robin); the rotation still learns from every response (``observe``)."""
        plan = prepared.plan
        if prepared.upstream_request is not None or plan is None:
            return prepared
        request = prepared.client_request
        # Running ahead, the partition caps (the policy's and the client's) are applied by
        # trimming (``rlimits``) and upstream is asked at least the buffer's capacity per
        # partition (constant, so the upstream session does not resend the partitions):
        # a broker cuts a read at what it is asked, mid-batch, and a partial batch per
        # partition per round would be fetched twice.  The response's max_bytes, what
        # the buffer can take, is the one cut.
        upstream = yield from clamp_request_in_ranges(
            request,
            prepared.limits,
            every,
            max_bytes_cap=plan.max_bytes_cap,
            partition_cap=plan.partition_cap,
            partition_floor=self.buffer.capacity,
        )
        if prepared.upstream_offsets:
            full = yield from _partitions_full_in_ranges(
                prepared.prefixes, prepared.response_limits, every
            )
            upstream = yield from _with_offsets_in_ranges(
                upstream, prepared.upstream_offsets, plan.upstream_epochs, full, every
            )
        if rotate and is_full_fetch(request):
            upstream = yield from self._rotate_in_ranges(upstream, every)
        return replaced(prepared, upstream_request=upstream, plan=None)

    def _isolation(self, request: Any) -> None:
        """Held batches serve only fetches of the isolation level they were read for: read
        for read_uncommitted they carry no aborted transactions (a broker lists none then)
        and may run past the last stable offset, so a read_committed consumer given them
        would deliver aborted or undecided records; read for read_committed they stop at
        the last stable offset.  A client that changes its level on a connection (no
        library does; a raw client may) has everything held dropped, as at a seek."""
        read_committed = int(getattr(request, "isolation_level", 0)) == READ_COMMITTED
        if read_committed is not self.read_committed:
            if self.read_committed is not None:
                for key in self.buffer.keys():  # (a copy of its keys)
                    self.buffer.drop(key)
            self.read_committed = read_committed

    def _forget_unlisted(self, listed: Mapping[PartitionKey, int]) -> None:
        buffer, marks = self.buffer, self.watermarks
        names = listed.keys()
        if marks.keys() <= names and buffer.held_within(names):
            return  # (every fetch of a client that reads the same partitions)
        gone = [k for k in buffer.keys() if k not in listed]
        gone += [k for k in marks.keys() - listed.keys() if k not in buffer]
        if gone:
            self.forget(gone)

    def _ahead(self, limits: ResponseLimits) -> int | None:
        """The most record bytes to ask upstream for, so that all of it is delivered or held.

        Only a record limit trims a response below what upstream was asked (byte
        limits travel upstream as max_bytes and partition_max_bytes, except the
        partition cap while running ahead: see ``prepare_in_ranges``), so only then
        is this bound needed: what a response does not deliver goes to the buffer,
        which takes up to its capacity (and this connection's share of the budget)
        less what it holds, the batches the fetch is offered among them (they stay
        held until ``finish``).  Asked that much, one round serves
        several client responses and upstream bytes stay those delivered.  None:
        no bound (no record limit, or a buffer of capacity 0 keeps nothing).
        """
        capacity = self.buffer.capacity
        if capacity <= 0 or (limits.response_records is None and limits.partition_records is None):
            return None
        if self.share is not None:
            capacity = min(capacity, self.share())
        return max(0, capacity - self.buffer.size)

    def held_answer(self, prepared: PreparedFetch) -> Any | None:
        """``held_answer_in_ranges`` at once."""
        return drain(self.held_answer_in_ranges(prepared, 0))

    def held_answer_in_ranges(
        self, prepared: PreparedFetch, every: int
    ) -> Generator[None, None, Any | None]:
        """The full response to *prepared*'s client request made of held data alone, or None.

        Held data answers a fetch when upstream's could not be delivered anyway: the
        held batches fill the response to a response limit (its records or bytes:
        the client's max_bytes, ``max_records``, ``max_response_bytes``), or one goes
        out alone over the limits (KIP-74's first batch), or every partition the
        fetch asks has held batches reaching its partition limit.
        (Kafka's consumer serves ``max.poll.records`` from its buffer the same way.)
        Every partition carries the watermarks the client was last given (the held
        batches are put in by ``finish``), so none goes back; a partition whose
        watermarks are unknown, or whose last answer was an error, sends the fetch
        upstream.  The caller passes it to ``finish`` as upstream's answer.
        Held data from a run-ahead round (``hold_ahead``) answers the fetch whatever it
        fills, once what is held covers the client's min_bytes (``_ahead_enough``): a
        broker answers as soon as min_bytes is there, so this is an answer a broker
        could give.

        Yields after every *every* partitions (0: never) of its walk over the request,
        which reads this connection's watermarks (only its own fetches change them).
        """
        prefixes = prepared.prefixes
        if not prefixes:
            return None
        request = prepared.client_request
        read_committed = int(getattr(request, "isolation_level", 0)) == READ_COMMITTED
        # (all read for this fetch's isolation level: ``prepare`` dropped the others)
        runs: dict[PartitionKey, Run] = {key: prefix.run for key, prefix in prefixes.items()}
        # Fairness: a partition with data upstream but none held is not made to wait
        # behind held answers for more responses than the fetch has partitions (the
        # serve rotation's own bound); its fetch goes up.
        bound = max(1, len(prepared.client_offsets))
        if any(n >= bound and k not in prefixes for k, n in self.waiting.items()):
            return None
        serve = tuple(self.serve_rotation.order(list(runs)))
        plan = yield from allocate_in_ranges(runs, serve, prepared.response_limits, every)
        # A batch kept back by the response's limits alone: nothing more fits.  (One
        # kept back by its partition's limits too says nothing of other partitions.)
        # Or a held batch over the limits that goes out alone (KIP-74's progress rule):
        # a broker's read of its first partition would end there too, and a batch over
        # the partition cap can go out in no other way, so an upstream round per such
        # batch (all of them, with batches larger than max_partition_bytes) is spared.
        filled = any(
            exempt or (held and held <= RESPONSE_LIMITS) for _, exempt, held in plan.values()
        )
        if not (filled or self._ahead_enough(prepared)) and (
            len(runs) < len(prepared.client_offsets) or not all(h for _, _, h in plan.values())
        ):
            return None
        mod = response_module(FETCH, int(request.__version__))
        context = (read_committed, mod)
        marks_get = self.watermarks.get
        prefixes_get = prefixes.get
        entries = self.held_entries
        entries_get = entries.get
        waiting = self.waiting
        topics = []
        held_at: list[tuple[int, tuple[int, ...]]] = []
        held_keys: list[PartitionKey] = []
        waits: list[PartitionKey] = []
        settled: list[PartitionKey] = []
        walked = 0
        for index, topic in enumerate(request.topics):
            tkey = topic_key(topic)
            parts: list[Any] = []
            positions: list[int] = []
            for p in topic.partitions:
                walked += 1
                if every and walked % every == 0:
                    yield
                key = (tkey, p.partition)
                mark = marks_get(key)
                if mark is None:
                    return None
                held = prefixes_get(key)
                if held is not None:
                    positions.append(len(parts))
                    held_keys.append((tkey, int(p.partition)))
                    mark = (
                        max(mark[0], held.high_watermark),
                        max(mark[1], held.last_stable_offset),
                        max(mark[2], held.log_start_offset),
                    )
                elif mark[0] > p.fetch_offset:
                    waits.append(key)
                elif key in waiting:
                    settled.append(key)
                made = entries_get(key)
                if made is not None and made[0] == mark and made[1] == context:
                    parts.append(made[2])
                    continue
                entry = empty_entry(mod, int(p.partition), *mark, read_committed=read_committed)
                entries[key] = (mark, context, entry)
                parts.append(entry)
            topics.append(
                make(mod.FetchableTopicResponse, topic=tkey, topic_id=tkey, partitions=tuple(parts))
            )
            if positions:
                held_at.append((index, tuple(positions)))
        self.held_answers += 1
        response = make(
            mod.FetchResponse,
            throttle_time=i32Timedelta.parse(timedelta(0)),
            error_code=ErrorCode.none,
            session_id=0,
            responses=tuple(topics),
            node_endpoints=(),
        )
        # (held batches of a partition the request does not list, as an incremental fetch's
        # session partitions, are added by the general trim)
        placed = sum(len(positions) for _, positions in held_at) == len(prefixes)
        keys = tuple(held_keys)
        self._held_made = (
            _HeldMade(
                response,
                tuple(held_at),
                tuple(waits),
                tuple(settled),
                walked,
                keys,
                serve,
                plan,
                keys == tuple(runs),
            )
            if placed
            else None
        )
        return response

    def finish(self, prepared: PreparedFetch, response: Any) -> ShapedResponse:
        """Trim upstream's *response* for the client and keep what was trimmed away."""
        steps = self.finish_in_ranges(prepared, response, 0)
        return drain(steps)

    def finish_in_ranges(
        self, prepared: PreparedFetch, response: Any, every: int, *, held: bool = False
    ) -> Generator[None, None, ShapedResponse]:
        """``finish``, yielding after every *every* partitions (0: never) of its walks: over
        upstream's response (the bytes in memory, upstream's word on held batches), the
        trim (``trim_response_in_ranges``) and its outcomes (watermarks, waits, what was
        served and what is kept).  Between two ranges only this connection's own fetch
        changes the watermarks, waits and rotations; the reuse buffer may be emptied by
        ``FetchPath.shed_buffers`` (another connection short of budget), after which the
        rest of upstream's word finds nothing to apply to, as it would at once.  The
        grant is resized and the rotations observe at one point each.

        *held*: *response* is ``held_answer``'s, not upstream's.  It carries no word of
        upstream to apply (its entries have the watermarks the client was given, raised
        to the held batches', no error, epoch or replica) and no records of its own, so
        its walk over the partitions for them is skipped."""
        made, self._held_made = self._held_made, None
        if not held or made is None or made.response is not response:
            made = None
        grant = prepared.grant
        prefixes = dict(prepared.prefixes)
        discarded: set[PartitionKey] = set()
        in_memory = 0  # (offered batches are counted by the buffer's reservations)
        # Upstream's word matters only to held batches: none held, nothing to apply it to.
        observe = bool(prefixes or len(self.buffer)) and not held
        walked = 0
        for topic in response.responses if (grant is not None and not held) or observe else ():
            tkey = topic_key(topic)
            for pd in topic.partitions:
                walked += 1
                if every and walked % every == 0:
                    yield
                in_memory += len(pd.records or b"")
                if not observe:
                    continue
                key = (tkey, int(pd.partition_index))
                prefix = prefixes.get(key)
                if prefix is None and key not in self.buffer:
                    continue
                epoch, _ = _observe(self.buffer, key, pd)
                if prefix is not None and (
                    pd.error_code != 0
                    or pd.high_watermark < prefix.high_watermark
                    or (epoch not in (None, NO_EPOCH) and epoch != prepared.epochs.get(key, epoch))
                    # KIP-392: the leader sends the client to a preferred read replica; the
                    # answer goes out as the leader gave it (no records), as from a broker
                    or getattr(pd, "preferred_read_replica", -1) >= 0
                ):
                    del prefixes[key]
                    discarded.add(key)
        if grant is not None:
            grant.resize(in_memory)
        if discarded:
            response = _withhold(response, discarded)
        if made is None:
            result = yield from trim_response_in_ranges(
                response,
                prepared.response_limits,
                prefixes=prefixes,
                order=self.serve_rotation.order,
                every=every,
                copy=self.copy,
            )
        else:
            # an answer from held data: only its partitions with held data are trimmed, in
            # the allocation that made it.  The general trim orders them as the response
            # lists them; held_answer ordered them as they are held, almost always the same
            # order (the rotation has not moved since: only this fetch's finish moves it).
            runs = {key: prefixes[key].run for key in made.keys}
            serve, plan = made.serve, made.plan
            if not made.in_order:
                serve = tuple(self.serve_rotation.order(list(made.keys)))
                if serve != made.serve:
                    plan = yield from allocate_in_ranges(
                        runs, serve, prepared.response_limits, every
                    )
            result = yield from trim_held_in_ranges(
                response,
                made.held_at,
                made.keys,
                runs,
                serve,
                plan,
                every=every,
                copy=self.copy,
                unserved=self.buffer.unserved,
            )
        marks = self.watermarks
        waiting = self.waiting
        if made is not None:
            # the partitions with nothing on offer, as the loop below would find them (their
            # watermarks are the ones the client was given: ``marks`` has them already)
            for key in made.waits:
                waiting[key] = waiting.get(key, 0) + 1
            for key in made.settled:
                waiting.pop(key, None)
        client_offsets = prepared.client_offsets
        result_marks = result.watermarks
        served: list[PartitionKey] = []
        kept: list[tuple[PartitionKey, PartitionOutcome]] = []
        next_offsets: dict[PartitionKey, int] = {}
        delivered = whole = 0
        for walked, (key, outcome) in enumerate(result.outcomes.items(), 1):
            if every and walked % every == 0:
                yield
            mark = result_marks.get(key)
            if mark is not None:
                marks[key] = mark
                if outcome.delivered_batches:
                    waiting.pop(key, None)
                elif mark[0] > client_offsets.get(key, mark[0]):
                    waiting[key] = waiting.get(key, 0) + 1
                elif key in waiting:
                    del waiting[key]
            elif outcome.error_code != 0 or not outcome.shaped:
                marks.pop(key, None)
                self.held_entries.pop(key, None)
            if not outcome.offered_bytes and not outcome.upstream_bytes:
                continue  # nothing on offer: nothing served, kept, delivered or fetched
            if outcome.delivered_batches:
                served.append(key)
            if outcome.next_offset is not None:
                next_offsets[key] = outcome.next_offset
            if outcome.remainder.headers:
                kept.append((key, outcome))
            delivered += outcome.delivered_bytes
            whole += outcome.upstream_bytes - outcome.dropped_partial_bytes
        waited = yield from self.serve_rotation.observe_in_ranges(result.serve_order, served, every)
        self.upstream_rotation.observe(served)
        # The offered batches settle: those a response served none of stay held as they
        # are (most of them, in a wide fetch answered from held data); the accounting of
        # the others moves into the grant, where what is kept of them is split off again
        # by ``put`` (they are in memory until delivered, as upstream's data).
        buffered = 0
        buffer = self.buffer
        offered = prepared.prefixes
        kept_keys = {key for key, _ in kept}
        for walked, key in enumerate(offered, 1):
            if every and walked % every == 0:
                yield
            if key not in kept_keys:
                buffer.hand_over(key, grant)
        for walked, (key, outcome) in enumerate(kept, 1):
            if every and walked % every == 0:
                yield
            if key in offered:
                if buffer.keep_unserved(key, outcome, result_marks[key]):
                    buffered += outcome.remainder.size
                    continue
                buffer.hand_over(key, grant)
            offset = outcome.next_offset
            if offset is None:
                offset = client_offsets.get(key)
            if offset is None:
                continue
            # the watermarks the response gives (a partition with held batches has no error)
            hw, lso, lso_start = result_marks[key]
            buffered += self.buffer.put(
                key,
                offset,
                outcome.remainder,
                leader_epoch=prepared.epochs.get(key, NO_EPOCH),
                high_watermark=hw,
                last_stable_offset=lso,
                log_start_offset=lso_start,
                source=grant,
            )
        self.upstream_whole_bytes += whole
        self.delivered_bytes += delivered
        if grant is not None:
            grant.resize(delivered)
        decision = yield from ShapingDecision.from_trim_in_ranges(
            result,
            every,
            api_version=int(type(response).__version__),
            requested_max_bytes=int(prepared.client_request.max_bytes),
            upstream_max_bytes=prepared.upstream_max_bytes,
            limits=prepared.limits,
            buffered_bytes=buffered,
            max_starvation=self.serve_rotation.max_starvation,
            partitions=None if made is None else made.partitions,
        )
        return ShapedResponse(result.response, next_offsets, decision, result, waited)

    def ahead_request(
        self, request: Any, next_offsets: Mapping[PartitionKey, int], max_bytes: int
    ) -> tuple[Any, dict[PartitionKey, tuple[int, int, int]]] | None:
        """The upstream round that runs ahead of the client after it was answered: its
        full *request* (client form) at the offsets it fetches next (*next_offsets* for
        the partitions it got data for, else the request's own), moved past what the
        reuse buffer already holds for them; at most *max_bytes*, no long poll.

        *max_bytes* (the fetch's share of the memory budget) bounds what the buffer
        holds with the round, in place of its capacity (which bounds what trimming
        keeps): a round the size of the client's last response.

        Returns the request and, per partition, (the client's next offset, where the
        round fetches it, the client's leader epoch) for ``hold_ahead``; None when the
        buffer already holds that much."""
        room = max_bytes - self.buffer.size
        if room <= 0:
            return None
        where: dict[PartitionKey, tuple[int, int, int]] = {}
        topics = []
        for topic in request.topics:
            tkey = topic_key(topic)
            parts = []
            for p in topic.partitions:
                key = (tkey, int(p.partition))
                epoch = int(getattr(p, "current_leader_epoch", NO_EPOCH))
                client = next_offsets.get(key, int(p.fetch_offset))
                start = self.buffer.upstream_offset(key, client, epoch)
                where[key] = (client, start, epoch)
                parts.append(p if start == p.fetch_offset else replaced(p, fetch_offset=start))
            topics.append(replaced(topic, partitions=tuple(parts)))
        ahead = replaced(
            request,
            topics=tuple(topics),
            max_bytes=room,
            max_wait=timedelta(0),
        )
        return ahead, where

    def hold_ahead(
        self,
        response: Any,
        where: Mapping[PartitionKey, tuple[int, int, int]],
        grant: Reservation | None,
        capacity: int,
    ) -> AheadHeld:
        """Keep the run-ahead round's *response* (full, upstream's answer to
        ``ahead_request``) in the reuse buffer, behind what it held for each partition,
        for the client's next fetch at the offset it will ask; upstream's word on each
        partition applies to what is held first (an error, a truncation or a new leader
        epoch drops it).  The kept bytes move from *grant* (the buffer may hold up to
        *capacity* with them).  Returns what upstream sent and what was kept."""
        held: set[PartitionKey] = set()
        buffer = self.buffer
        records = record_bytes = held_bytes = 0
        for topic in response.responses:
            tkey = topic_key(topic)
            for pd in topic.partitions:
                key = (tkey, int(pd.partition_index))
                at = where.get(key)
                if at is None:
                    continue
                client, start, epoch = at
                _, marks = _observe(buffer, key, pd)
                if (
                    pd.error_code != 0
                    or not pd.records
                    or getattr(pd, "preferred_read_replica", -1) >= 0
                    or is_legacy(pd.records)
                ):
                    continue
                run, _ = parse_records(pd.records, aborted_of(pd))
                records += run.records
                record_bytes += len(pd.records)
                self.upstream_whole_bytes += run.size
                if not run.headers:
                    continue
                before = buffer.peek(key)
                if start != client:
                    if before is None or before.run.next_offset != start:
                        continue  # what it was behind is gone: the client fetches it itself
                    run = concat(before.run, run, self.copy)
                elif run.headers[0].base_offset > client:
                    continue  # (not where the client reads from)
                kept = buffer.put(
                    key,
                    client,
                    run,
                    leader_epoch=epoch,
                    high_watermark=marks[0],
                    last_stable_offset=marks[1],
                    log_start_offset=marks[2],
                    source=grant,
                    capacity=max(capacity, self.buffer.capacity),
                )
                if kept:
                    held.add(key)
                    held_bytes += kept
        self.ahead_keys = held
        return AheadHeld(frozenset(held), records, record_bytes, held_bytes)

    def _ahead_enough(self, prepared: PreparedFetch) -> bool:
        """Held data from a run-ahead round answers *prepared* alone: some of what it takes
        came from one, and all it takes covers the client's min_bytes."""
        prefixes = prepared.prefixes
        if not self.ahead_keys or self.ahead_keys.isdisjoint(prefixes):
            return False
        min_bytes = int(getattr(prepared.client_request, "min_bytes", 1))
        return sum(p.run.size for p in prefixes.values()) >= max(1, min_bytes)

    def close(self) -> None:
        """Release the buffer's memory and the rotations' state (the connection is gone)."""
        self.buffer.clear()
        self.upstream_rotation.clear()
        self.serve_rotation.clear()
        self.watermarks.clear()
        self.held_entries.clear()
        self.waiting.clear()
        self.ahead_keys = set()
        self._held_made = None

    def forget(self, keys: list[PartitionKey]) -> None:
        """The client dropped *keys* from its session (forgotten topics)."""
        for key in keys:
            self.buffer.drop(key, counted=False)
            self.watermarks.pop(key, None)
            self.held_entries.pop(key, None)
            self.waiting.pop(key, None)
        self.serve_rotation.forget(keys)
        self.upstream_rotation.forget(keys)

    def _rotate(self, request: Any) -> Any:
        """``_rotate_in_ranges`` at once."""
        steps = self._rotate_in_ranges(request, 0)
        return drain(steps)

    def _rotate_in_ranges(self, request: Any, every: int) -> Generator[None, None, Any]:
        """The upstream request in the rotation's order (the rotation learns its keys at
        one point); yields after every *every* partitions of its two walks."""
        keys: list[PartitionKey] = []
        entries: list[tuple[Any, Any]] = []
        # Already in the form a rebuild gives: one entry per run of a topic, none empty.
        canonical = True
        previous: Any = _NO_TOPIC
        for topic in request.topics:
            tkey = topic_key(topic)
            canonical = canonical and tkey != previous and len(topic.partitions) > 0
            previous = tkey
            for p in topic.partitions:
                keys.append((tkey, int(p.partition)))
                entries.append((topic, p))
                if every and len(keys) % every == 0:
                    yield
        if len(keys) < 2:
            return request
        order = self.upstream_rotation.order(keys)
        if canonical and order == keys and len(set(keys)) == len(keys):
            return request  # the rebuild would be equal to it
        by_key = dict(zip(keys, entries, strict=True))
        # consecutive partitions of one topic share a topic entry (one replace per run)
        runs: list[tuple[Any, Any, list[Any]]] = []  # (topic key, first topic entry, partitions)
        for walked, key in enumerate(order, 1):
            topic, p = by_key[key]
            if runs and runs[-1][0] == key[0]:
                runs[-1][2].append(p)
            else:
                runs.append((key[0], topic, [p]))
            if every and walked % every == 0:
                yield
        topics = [replaced(topic, partitions=tuple(parts)) for _, topic, parts in runs]
        return replaced(request, topics=tuple(topics))


_NO_TOPIC = object()


def _observe(
    buffer: ReuseBuffer, key: PartitionKey, pd: Any
) -> tuple[int | None, tuple[int, int, int]]:
    """Upstream's word on partition *key* (its response entry *pd*: error, watermarks,
    leader epoch) applied to what *buffer* holds for it; returns that leader epoch (None:
    the entry gives none) and the watermarks."""
    leader = getattr(pd, "current_leader", None)
    epoch = None if leader is None else int(leader.leader_epoch)
    marks = marks_of(pd)
    buffer.observe(
        key,
        error_code=int(pd.error_code),
        high_watermark=marks[0],
        leader_epoch=epoch,
        last_stable_offset=marks[1],
        log_start_offset=marks[2],
    )
    return epoch, marks


def _withhold(response: Any, keys: set[PartitionKey]) -> Any:
    """*response* without the data fetched past discarded held batches.

    Upstream read those partitions from the end of the held batches, not from
    the client's offset; with the held batches gone (the log was truncated,
    the leader changed, the partition failed), that data would leave a gap.
    An OFFSET_OUT_OF_RANGE there concerns the offset we asked, not the
    client's, so it becomes an empty partition too.  Other errors go to the
    client.  Either way the client fetches again from its own offset, and the
    next :meth:`FetchShaper.prepare` asks upstream from there.
    """
    topics = []
    for topic in response.responses:
        tkey = topic_key(topic)
        parts = []
        for pd in topic.partitions:
            if (tkey, int(pd.partition_index)) in keys:
                if pd.error_code == ErrorCode.offset_out_of_range:
                    pd = replaced(pd, error_code=ErrorCode.none, records=b"")
                elif pd.records:
                    pd = replaced(pd, records=b"")
            parts.append(pd)
        topics.append(replaced(topic, partitions=tuple(parts)))
    return replaced(response, responses=tuple(topics))


def _partitions_full_in_ranges(
    prefixes: Mapping[PartitionKey, Prefix], limits: ResponseLimits, every: int
) -> Generator[None, None, frozenset[PartitionKey]]:
    """Partitions whose held batches already reach their partition limit (bytes or
    records): the next response cannot take more of them, so upstream is not asked.
    Yields after every *every* partitions (0: never)."""
    full = []
    for walked, (key, prefix) in enumerate(prefixes.items(), 1):
        if every and walked % every == 0:
            yield
        cap = limits.bytes_for(key)
        records = limits.partition_records
        run = prefix.run
        if (cap is not None and run.size >= cap) or (
            records is not None and run.records >= records
        ):
            full.append(key)
    return frozenset(full)


def _with_offsets_in_ranges(
    request: Any,
    offsets: Mapping[PartitionKey, int],
    epochs: Mapping[PartitionKey, int],
    full: frozenset[PartitionKey],
    every: int,
) -> Generator[None, None, Any]:
    """*request* fetching the given partitions from *offsets*.

    A partition that names its last fetched epoch (KIP-595; consumers send -1)
    gets the epoch of the last held batch, which now precedes its offset.  A
    partition in *full* asks 0 bytes: held batches fill its next response (the
    broker still answers its watermarks; as the first partition with data, one
    batch, which ``finish`` holds after the others).  It stays in the request,
    so the upstream session keeps it (Kafka's consumer forgets a partition it
    has data buffered for, then adds it again: more session churn).  Yields after
    every *every* partitions (0: never).
    """
    topics = []
    walked = 0
    for topic in request.topics:
        tkey = topic_key(topic)
        parts = []
        for p in topic.partitions:
            walked += 1
            if every and walked % every == 0:
                yield
            key = (tkey, int(p.partition))
            if key in offsets:
                changes: dict[str, int] = {"fetch_offset": offsets[key]}
                if getattr(p, "last_fetched_epoch", -1) != -1:
                    changes["last_fetched_epoch"] = epochs[key]
                if key in full:
                    changes["partition_max_bytes"] = 0
                p = replaced(p, **changes)
            parts.append(p)
        topics.append(replaced(topic, partitions=tuple(parts)))
    return replaced(request, topics=tuple(topics))
