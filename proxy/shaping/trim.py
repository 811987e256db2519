"""Trimming a Fetch response to whole batches within the limits.

What a partition offers is a :class:`Run`: the whole RecordBatch v2 batches
upstream returned (optionally after batches kept from an earlier response in
the reuse buffer), byte-identical, plus the aborted transactions that apply
from its first offset on.  A partial trailing batch (the broker cuts the last
batch at max_bytes, KIP-74) is dropped here and never forwarded; the client
refetches from the offset after the last whole batch.

Allocation mirrors ``ReplicaManager.readFromLog``: partitions are visited in
serve order (see :mod:`.rotation`), each takes whole batches while its byte
and record budget and the response's remaining budget allow, and stops at the
first batch that does not fit (batches are never skipped: the delivered data
is a prefix).  Progress (KIP-74): the first batch of the first partition that
has one is delivered even when it alone exceeds a limit; after it, the
remaining response budget is max(0, limit - its size), as in Kafka.

Aborted transactions (read_committed).  The Java consumer keeps one queue of
(producer id, first offset) per partition response; before each batch it moves
every entry whose first offset is <= the batch's last offset into its set of
aborted producers, skips transactional batches of those producers and removes a
producer when it meets that producer's control batch.  The broker therefore
lists the transactions whose range overlaps the fetched range: the abort
marker is at or after the fetch offset and the first offset is before the end
of the data (``collectAbortedTxns``).  We keep that rule per part delivered:

- an entry whose first offset is at or after the end of the delivered data is
  left out (the broker would not list it);
- an entry whose transaction a delivered control batch of the same producer
  closed is not carried into the remainder's list, because the client starts
  a new queue with the next response and would otherwise treat a later, fresh
  transaction of that producer as aborted.

Responses that had a list keep a list (possibly empty); null stays null.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kio.schema.errors import ErrorCode

from ..protocol import records
from ..protocol.codec import drain
from ..protocol.error_codes import NONE
from ..protocol.messages import kio_class_with, make, module_of, replaced
from ..protocol.partition_key import PartitionKey, topic_key
from ..protocol.records import CONTROL_MASK, LOG_OVERHEAD, BatchHeader
from .limits import ResponseLimits

Aborted = tuple[tuple[int, int], ...]
"""(producer id, first offset) pairs, in upstream order."""

Records = bytes | bytearray | memoryview
"""A run's bytes: owned ``bytes`` (or a ``bytearray`` of a ``CopyPool``), or a view into
upstream's records field while one response is being trimmed (see :meth:`Run.split_view`)."""

Copy = Callable[..., "bytes | bytearray"]
"""Makes one owned buffer of its arguments' bytes, one after the other (``CopyPool.copy``);
None where one is asked for: plain ``bytes``."""


def _owned(data: Records, copy: Copy | None = None) -> bytes | bytearray:
    """*data* as bytes that pin nothing else (a view is copied, by *copy* if given, unless it
    is all its object)."""
    if isinstance(data, (bytes, bytearray)):
        return data
    base = data.obj
    if isinstance(base, bytes) and data.nbytes == len(base):
        return base
    return bytes(data) if copy is None else copy(data)


@dataclass(frozen=True, slots=True)
class Run:
    """Contiguous whole batches of one partition, exactly as upstream sent them."""

    data: Records
    headers: tuple[BatchHeader, ...]
    """Headers of the batches in *data*; ``position`` is relative to *data*."""
    aborted: Aborted | None = None
    """Aborted transactions that apply from the first batch on; None: not read_committed."""
    _records: int = field(default=-1, init=False, repr=False, compare=False)
    """``records`` once counted (-1: not yet): a run held in the reuse buffer is offered,
    and counted, by every fetch until it is served."""

    @property
    def size(self) -> int:
        return len(self.data)

    @property
    def records(self) -> int:
        counted = self._records
        if counted < 0:
            counted = sum(h.counted_records for h in self.headers)
            object.__setattr__(self, "_records", counted)
        return counted

    @property
    def first_offset(self) -> int | None:
        return self.headers[0].base_offset if self.headers else None

    @property
    def next_offset(self) -> int | None:
        return self.headers[-1].next_offset if self.headers else None

    def head(self, count: int) -> Run:
        """The first *count* batches, with the run's aborted list: what the reuse buffer
        keeps of a run that does not fit.  A cut head is owned; the tail it leaves is
        neither copied nor given new headers."""
        if count >= len(self.headers):
            return self  # the whole run as it is (a run-ahead round's stays a view)
        if count <= 0:
            return Run(b"", (), self.aborted)
        return Run(
            _owned(self.data[: self.headers[count].position]), self.headers[:count], self.aborted
        )

    def split_view(self, count: int, copy: Copy | None = None) -> tuple[Run, Run]:
        """The first *count* batches and the rest, each with its aborted list, for a
        response being trimmed: the head, which goes out in the response and is then
        dropped, is a view (no copy); the tail, which may be kept in the reuse buffer, is
        owned (by *copy* if given), so it never pins the delivered part."""
        if count <= 0:
            return _empty_run(self.aborted), self._owning(copy)
        if count >= len(self.headers):
            return self, Run(b"", (), _aborted_after(self.aborted, self.headers))
        cut = self.headers[count].position
        view = memoryview(self.data)
        head_headers = self.headers[:count]
        tail_headers = tuple(replaced(h, position=h.position - cut) for h in self.headers[count:])
        return (
            Run(view[:cut], head_headers, self.aborted),
            Run(_owned(view[cut:], copy), tail_headers, _aborted_after(self.aborted, head_headers)),
        )

    def _owning(self, copy: Copy | None = None) -> Run:
        data = _owned(self.data, copy)
        return self if data is self.data else Run(data, self.headers, self.aborted)


@dataclass(frozen=True, slots=True)
class Prefix:
    """Batches held for a partition (reuse buffer), to go out ahead of upstream's data.

    The partition metadata is what upstream last reported; it fills in the
    partition when an incremental upstream response leaves the partition out.
    """

    run: Run
    high_watermark: int
    last_stable_offset: int = -1
    log_start_offset: int = -1


def is_legacy(data: Records | None) -> bool:
    """True when *data* starts with a message set older than RecordBatch v2 (magic 0/1)."""
    return data is not None and len(data) > 16 and data[16] in (0, 1)


def parse_records(data: Records | None, aborted: Aborted | None = None) -> tuple[Run, int]:
    """The whole batches of a partition's records field, and the partial bytes dropped.

    Raises :class:`~proxy.protocol.records.InvalidRecordBatch` (a
    ProtocolError) for data that is not RecordBatch v2.
    """
    if not data:
        return _empty_run(aborted), 0
    headers = tuple(records.iter_batches(data))
    end = headers[-1].end if headers else 0
    # Upstream's object when it is all whole batches, else a view without the
    # partial trailing batch: no copy either way (what is kept gets copied by
    # Run.split_view).
    whole: Records = memoryview(data)[:end] if end != len(data) else data
    return Run(whole, headers, aborted), len(data) - end


def concat(prefix: Run, tail: Run, copy: Copy | None = None) -> Run:
    """*prefix* followed by the part of *tail* that starts at or after prefix's end (one
    owned buffer, by *copy* if given).

    Batches of *tail* that end before *prefix* ends are skipped (already held);
    if a batch of *tail* straddles prefix's end, the two do not line up (the
    log changed under us) and *tail* is ignored: only the prefix is offered,
    which loses nothing, since the client refetches after it.
    """
    end = prefix.next_offset
    if end is None:
        return Run(tail.data, tail.headers, _merge_aborted(prefix.aborted, tail.aborted))
    keep = [h for h in tail.headers if h.last_offset >= end]
    if keep and keep[0].base_offset < end:
        return prefix
    if not keep:
        return prefix
    start = keep[0].position
    shifted = tuple(replaced(h, position=h.position - start + prefix.size) for h in keep)
    rest = memoryview(tail.data)[start:]
    return Run(
        b"".join((prefix.data, rest)) if copy is None else copy(prefix.data, rest),
        prefix.headers + shifted,
        _merge_aborted(prefix.aborted, tail.aborted),
    )


def _merge_aborted(a: Aborted | None, b: Aborted | None) -> Aborted | None:
    if a is None:
        return b
    if b is None:
        return a
    seen = set(a)
    return a + tuple(e for e in b if e not in seen)


def _aborted_after(aborted: Aborted | None, delivered: Sequence[BatchHeader]) -> Aborted | None:
    """Entries still open after *delivered*: drop those a delivered control batch closed."""
    if not aborted:
        return aborted
    closers = [(h.producer_id, h.base_offset) for h in delivered if h.is_control]
    if not closers:
        return aborted
    return tuple(
        (pid, first)
        for pid, first in aborted
        if not any(cpid == pid and off >= first for cpid, off in closers)
    )


def _aborted_within(aborted: Aborted | None, delivered: Sequence[BatchHeader]) -> Aborted | None:
    """Entries that overlap the delivered data (first offset before its end)."""
    if aborted is None:
        return None
    if not delivered:
        return ()
    end = delivered[-1].next_offset
    return tuple(e for e in aborted if e[1] < end)


@dataclass(frozen=True, slots=True)
class PartitionOutcome:
    """What trimming did to one partition of the response."""

    key: PartitionKey
    error_code: int
    upstream_bytes: int
    """Record bytes this partition carried from upstream (partial trailing batch included)."""
    upstream_records: int
    offered_bytes: int
    """Whole-batch bytes on offer: reused prefix plus upstream's whole batches."""
    reused_bytes: int
    """Bytes of the offer that came from the reuse buffer."""
    delivered_bytes: int
    delivered_records: int
    delivered_batches: int
    dropped_partial_bytes: int
    next_offset: int | None
    """Offset after the last delivered batch: the client's next fetch offset.  None: nothing delivered."""
    exempt: bool
    """The first delivered batch exceeded a limit and went out under the progress guarantee."""
    limited_by: frozenset[str]
    """Limits that kept whole batches back ("partition_bytes", "response_records", ...)."""
    remainder: Run
    """Whole batches offered but not delivered (for the reuse buffer)."""
    shaped: bool = True
    """False: passed through untouched (legacy message format)."""

    @property
    def had_data(self) -> bool:
        return self.offered_bytes > 0


@dataclass(frozen=True, slots=True)
class TrimResult:
    response: Any
    """The kio FetchResponse to send to the client."""
    outcomes: dict[PartitionKey, PartitionOutcome]
    serve_order: tuple[PartitionKey, ...]
    """Partitions with data, in the order they were allotted budget."""
    limited_by: frozenset[str] = field(default_factory=frozenset)
    watermarks: dict[PartitionKey, tuple[int, int, int]] = field(default_factory=dict)
    """Per partition without an error: (high watermark, last stable offset, log start
    offset) as the response gives them to the client."""

    @property
    def delivered_bytes(self) -> int:
        return sum(o.delivered_bytes for o in self.outcomes.values())

    @property
    def delivered_records(self) -> int:
        return sum(o.delivered_records for o in self.outcomes.values())

    @property
    def next_offsets(self) -> dict[PartitionKey, int]:
        """Per partition that got data, the offset the client (and upstream session) moves to."""
        return {k: o.next_offset for k, o in self.outcomes.items() if o.next_offset is not None}


def _fmin(value: int | None) -> float:
    return float("inf") if value is None else value


_REASON_BITS = ("partition_bytes", "partition_records", "response_bytes", "response_records")
_REASONS = tuple(
    frozenset(r for bit, r in enumerate(_REASON_BITS) if mask >> bit & 1) for mask in range(16)
)
"""The limits that hold a batch back, by the bit mask ``allocate`` computes (one frozenset
each, made once)."""


def allocate(
    runs: Mapping[PartitionKey, Run], order: Sequence[PartitionKey], limits: ResponseLimits
) -> dict[PartitionKey, tuple[int, bool, frozenset[str]]]:
    """How many leading batches each partition in *order* delivers.

    Returns key -> (batch count, exempt, limits that held batches back).
    """
    return drain(allocate_in_ranges(runs, order, limits, 0))


def allocate_in_ranges(
    runs: Mapping[PartitionKey, Run],
    order: Sequence[PartitionKey],
    limits: ResponseLimits,
    every: int,
) -> Generator[None, None, dict[PartitionKey, tuple[int, bool, frozenset[str]]]]:
    """``allocate``, yielding after every *every* partitions (0: never); it reads only
    its arguments."""
    remaining_bytes = _fmin(limits.response_bytes)
    remaining_records = _fmin(limits.response_records)
    part_records = _fmin(limits.partition_records)
    # a partition's bytes limit: the smaller of its client max_bytes and the configured cap
    bytes_for = limits.partition_bytes_for.get
    cap = _fmin(limits.partition_bytes)
    first = True
    out: dict[PartitionKey, tuple[int, bool, frozenset[str]]] = {}
    nothing: frozenset[str] = frozenset()
    for walked, key in enumerate(order, 1):
        if every and walked % every == 0:
            yield
        run = runs[key]
        own = bytes_for(key)
        part_bytes = cap if own is None or own > cap else own
        count = taken_bytes = taken_records = 0
        exempt = False
        held = nothing
        for h in run.headers:
            # ``h.size`` and ``h.counted_records`` spelled out: this runs for every batch of
            # every partition with data, each fetch, and the two property calls cost about
            # a quarter of an answer from held data (bench.held_micro, 1,000 partitions)
            nb = taken_bytes + LOG_OVERHEAD + h.batch_length
            nr = taken_records + (0 if h.attributes & CONTROL_MASK else h.records_count)
            mask = (
                (nb > part_bytes)
                | (nr > part_records) << 1
                | (nb > remaining_bytes) << 2
                | (nr > remaining_records) << 3
            )
            if mask:
                held = _REASONS[mask]
                if first and count == 0:
                    # KIP-74 progress: the batch goes out alone; as in Kafka's
                    # log read with minOneMessage, the partition's read ends here.
                    exempt = True
                    count, taken_bytes, taken_records = 1, nb, nr
                break
            count, taken_bytes, taken_records = count + 1, nb, nr
        if count == len(run.headers):
            held = frozenset()
        if count:
            first = False
            remaining_bytes = max(0.0, remaining_bytes - taken_bytes)
            remaining_records = max(0.0, remaining_records - taken_records)
        out[key] = (count, exempt, held)
    return out


def trim_response(
    response: Any,
    limits: ResponseLimits,
    *,
    prefixes: Mapping[PartitionKey, Prefix] | None = None,
    order: Callable[[Sequence[PartitionKey]], Sequence[PartitionKey]] | None = None,
    copy: Copy | None = None,
) -> TrimResult:
    """Trim *response* to *limits* (see ``trim_response_in_ranges``), in one go."""
    steps = trim_response_in_ranges(response, limits, prefixes=prefixes, order=order, copy=copy)
    return drain(steps)


def trim_response_in_ranges(
    response: Any,
    limits: ResponseLimits,
    *,
    prefixes: Mapping[PartitionKey, Prefix] | None = None,
    order: Callable[[Sequence[PartitionKey]], Sequence[PartitionKey]] | None = None,
    every: int = 0,
    copy: Copy | None = None,
) -> Generator[None, None, TrimResult]:
    """Trim *response* (a kio FetchResponse, any version) to *limits*.

    *prefixes* holds reuse-buffer runs to deliver ahead of upstream's data for
    that partition (the upstream fetch for it started where the run ends).
    *order* receives the partitions that have whole batches on offer, in
    response order, and returns the serve order (a permutation of them);
    default: response order.  Partitions with an error pass through untouched,
    and so do partitions whose data is in a legacy message format (magic 0 or
    1: no v2 headers to count by; only brokers before 4.0 can hold such data):
    their outcome says ``shaped=False``.  *copy* makes the owned copies of what the
    response does not take (the reuse buffer's; ``CopyPool.copy``; None: ``bytes``).

    A generator: it yields after every *every* partitions it walks (0: never), so
    its caller can let other work run between ranges; it touches no state but
    its own (*order* is called once, between the two walks).
    """
    prefixes = prefixes or {}
    walked = 0
    runs: dict[PartitionKey, Run] = {}
    upstream: dict[PartitionKey, tuple[int, int, int, int]] = {}
    errors: dict[PartitionKey, int] = {}
    legacy: set[PartitionKey] = set()
    outcomes: dict[PartitionKey, PartitionOutcome] = {}
    marks: dict[PartitionKey, tuple[int, int, int]] = {}
    # Per topic, the entries whose outcome waits for the plan: (position, entry, key).  A
    # partition with no records, none held and no aborted list (most of a sessionless
    # client's partitions in most responses) gets its outcome here and is not walked again.
    work: list[list[tuple[int, Any, PartitionKey]]] = []
    for topic in response.responses:
        tkey = topic_key(topic)
        todo: list[tuple[int, Any, PartitionKey]] = []
        work.append(todo)
        for position, pd in enumerate(topic.partitions):
            walked += 1
            if every and walked % every == 0:
                yield
            key = (tkey, int(pd.partition_index))
            if pd.error_code != NONE:
                errors[key] = int(pd.error_code)
                todo.append((position, pd, key))
                continue
            if not pd.records and not (txns := pd.aborted_transactions) and key not in prefixes:
                marks[key] = marks_of(pd)
                outcomes[key] = _nothing_offered(key, None if txns is None else ())  # aborted_of
                continue
            todo.append((position, pd, key))
            if is_legacy(pd.records):
                legacy.add(key)
                errors[key] = NONE
                continue
            marks[key] = marks_of(pd)
            aborted = aborted_of(pd)
            run, partial = parse_records(pd.records, aborted)
            up_bytes = len(pd.records or b"")
            up_records = run.records
            prefix = prefixes.get(key)
            reused = 0
            if prefix is not None and prefix.run.headers:
                run = concat(prefix.run, run, copy)
                reused = prefix.run.size
            runs[key] = run
            upstream[key] = (up_bytes, up_records, partial, reused)
    # An incremental upstream response leaves out partitions with nothing new;
    # buffered batches for them still go out, in a partition we fill in.
    missing = [k for k in prefixes if k not in runs and k not in errors and prefixes[k].run.headers]
    for key in missing:
        runs[key] = prefixes[key].run
        upstream[key] = (0, 0, 0, prefixes[key].run.size)
    if missing:
        lengths = [len(t.partitions) for t in response.responses]
        response = _add_partitions(response, {k: prefixes[k] for k in missing})
        for index, topic in enumerate(response.responses):
            if index == len(work):
                work.append([])
            first_added = lengths[index] if index < len(lengths) else 0
            tkey = topic_key(topic)
            for position in range(first_added, len(topic.partitions)):
                pd = topic.partitions[position]
                key = (tkey, int(pd.partition_index))
                marks[key] = marks_of(pd)
                work[index].append((position, pd, key))

    with_data = [k for k, r in runs.items() if r.headers]
    serve = list(order(with_data)) if order is not None else with_data
    if len(serve) != len(with_data) or set(serve) != set(with_data):
        raise ValueError("serve order must be a permutation of the partitions with data")
    plan = yield from allocate_in_ranges(runs, serve, limits, every)

    new_topics = []
    all_limited: set[str] = set()
    walked = 0
    for topic, todo in zip(response.responses, work, strict=True):
        new_parts: list[Any] | None = None
        for position, pd, key in todo:
            walked += 1
            if every and walked % every == 0:
                yield
            if key in errors:
                up_bytes = len(pd.records or b"")
                passed = up_bytes if key in legacy else 0
                outcomes[key] = PartitionOutcome(
                    key=key,
                    error_code=errors[key],
                    upstream_bytes=up_bytes,
                    upstream_records=0,
                    offered_bytes=passed,
                    reused_bytes=0,
                    delivered_bytes=passed,
                    delivered_records=0,
                    delivered_batches=0,
                    dropped_partial_bytes=0,
                    next_offset=None,
                    exempt=False,
                    limited_by=frozenset(),
                    remainder=Run(b"", ()),
                    shaped=key not in legacy,
                )
                continue
            run = runs[key]
            up_bytes, up_records, partial, reused = upstream[key]
            count, exempt, held = plan.get(key, (0, False, frozenset()))
            head, tail = run.split_view(count, copy)
            all_limited |= held
            outcomes[key] = PartitionOutcome(
                key=key,
                error_code=NONE,
                upstream_bytes=up_bytes,
                upstream_records=up_records,
                offered_bytes=run.size,
                reused_bytes=reused,
                delivered_bytes=head.size,
                delivered_records=head.records,
                delivered_batches=len(head.headers),
                dropped_partial_bytes=partial,
                next_offset=head.next_offset,
                exempt=exempt,
                limited_by=held,
                remainder=tail,
            )
            rebuilt = _rebuild_partition(pd, head)
            if rebuilt is not pd:
                if new_parts is None:
                    new_parts = list(topic.partitions)
                new_parts[position] = rebuilt
        if new_parts is None:
            new_topics.append(topic)  # nothing trimmed: the entry as it came
        else:
            new_topics.append(replaced(topic, partitions=tuple(new_parts)))
    if all(a is b for a, b in zip(new_topics, response.responses, strict=True)):
        new_response = response
    else:
        new_response = replaced(response, responses=tuple(new_topics))
    return TrimResult(new_response, outcomes, tuple(serve), frozenset(all_limited), marks)


def trim_held_in_ranges(
    response: Any,
    held_at: Sequence[tuple[int, tuple[int, ...]]],
    keys: Sequence[PartitionKey],
    runs: Mapping[PartitionKey, Run],
    serve: Sequence[PartitionKey],
    plan: Mapping[PartitionKey, tuple[int, bool, frozenset[str]]],
    *,
    every: int = 0,
    copy: Copy | None = None,
    unserved: Callable[[PartitionKey], PartitionOutcome | None] | None = None,
) -> Generator[None, None, TrimResult]:
    """``trim_response_in_ranges`` for an answer made of held data alone (``FetchShaper.
    held_answer``'s *response*), with what that answer already knows.

    *held_at* gives, per topic index, the positions of the partitions with held data,
    *keys* those partitions in the same order and *runs* their held runs (every one with
    batches); their entries carry no records of their own and no error, and every other
    entry has nothing on offer.  *serve* is the serve order of *keys* and *plan* its
    allocation (``allocate``'s), both as the general trim would make them.  So only the
    held partitions are walked, once, and only a served one is cut.  The result is the
    general trim's, for the whole *response*: outcomes and watermarks of the held
    partitions, in response order.

    *unserved(key)*: an outcome given before for a partition none of whose held run
    was served (its buffer entry's, ``ReuseBuffer.unserved``); it is given again when it
    is for the very same run and limits, rather than made anew.  Yields after every
    *every* partitions (0: never).
    """
    outcomes: dict[PartitionKey, PartitionOutcome] = {}
    marks: dict[PartitionKey, tuple[int, int, int]] = {}
    limited: set[frozenset[str]] = set()
    topics = response.responses
    new_topics: list[Any] | None = None
    nothing: tuple[int, bool, frozenset[str]] = (0, False, frozenset())
    given = unserved if unserved is not None else _no_outcome
    walked = 0
    for index, positions in held_at:
        topic = topics[index]
        parts = topic.partitions
        new_parts: list[Any] | None = None
        for at in positions:
            key = keys[walked]
            walked += 1
            if every and walked % every == 0:
                yield
            pd = parts[at]
            run = runs[key]
            marks[key] = marks_of(pd)
            count, exempt, held = plan.get(key, nothing)
            limited.add(held)
            outcome = given(key) if count == 0 else None
            if (
                outcome is not None
                and outcome.remainder is run
                and outcome.limited_by == held
                and not outcome.upstream_bytes  # (one kept from an upstream answer's trim)
            ):
                head = _empty_run(run.aborted)  # (what split_view(0) gives)
            else:
                head, tail = run.split_view(count, copy)
                outcome = PartitionOutcome(
                    key=key,
                    error_code=NONE,
                    upstream_bytes=0,
                    upstream_records=0,
                    offered_bytes=run.size,
                    reused_bytes=run.size,
                    delivered_bytes=head.size,
                    delivered_records=head.records,
                    delivered_batches=len(head.headers),
                    dropped_partial_bytes=0,
                    next_offset=head.next_offset,
                    exempt=exempt,
                    limited_by=held,
                    remainder=tail,
                )
            outcomes[key] = outcome
            rebuilt = _rebuild_partition(pd, head)
            if rebuilt is not pd:
                if new_parts is None:
                    new_parts = list(parts)
                new_parts[at] = rebuilt
        if new_parts is not None:
            if new_topics is None:
                new_topics = list(topics)
            new_topics[index] = replaced(topic, partitions=tuple(new_parts))
    new_response = (
        response if new_topics is None else replaced(response, responses=tuple(new_topics))
    )
    return TrimResult(new_response, outcomes, tuple(serve), frozenset().union(*limited), marks)


def _no_outcome(key: PartitionKey) -> None:
    return None


_NO_RUN: dict[Aborted | None, Run] = {None: Run(b"", (), None), (): Run(b"", (), ())}
"""The remainder of a partition without records (runs are frozen: one serves them all)."""


def _empty_run(aborted: Aborted | None) -> Run:
    """A run of no batches with *aborted* (a shared one when that is None or empty)."""
    return _NO_RUN.get(aborted) or Run(b"", (), aborted)


_EMPTY_OUTCOMES: dict[tuple[PartitionKey, Aborted | None], PartitionOutcome] = {}
"""The outcome of each partition seen without records (and without aborted transactions):
frozen, so one serves every response.  A sessionless client lists all its partitions in
every fetch and most come back empty, and building this 15-field outcome anew cost 2.3 us
a partition (7 % of the proxy's CPU shaping a 100-partition read).  Bounded: emptied when
it reaches _EMPTY_OUTCOMES_MAX keys (from then on a miss costs what every call did)."""

_EMPTY_OUTCOMES_MAX = 4096


def _nothing_offered(key: PartitionKey, aborted: Aborted | None) -> PartitionOutcome:
    """The outcome of a partition without records (what the general path gives it, cheaply)."""
    plain = aborted in _NO_RUN
    if plain:
        cached = _EMPTY_OUTCOMES.get((key, aborted))
        if cached is not None:
            return cached
    outcome = PartitionOutcome(
        key=key,
        error_code=NONE,
        upstream_bytes=0,
        upstream_records=0,
        offered_bytes=0,
        reused_bytes=0,
        delivered_bytes=0,
        delivered_records=0,
        delivered_batches=0,
        dropped_partial_bytes=0,
        next_offset=None,
        exempt=False,
        limited_by=frozenset(),
        remainder=_empty_run(aborted),
    )
    if plain:
        if len(_EMPTY_OUTCOMES) >= _EMPTY_OUTCOMES_MAX:
            _EMPTY_OUTCOMES.clear()
        _EMPTY_OUTCOMES[key, aborted] = outcome
    return outcome


def _add_partitions(response: Any, extra: Mapping[PartitionKey, Prefix]) -> Any:
    """*response* with an empty, error-free partition entry for each key of *extra*."""
    module = module_of(response)
    topics = list(response.responses)
    index = {topic_key(t): i for i, t in enumerate(topics)}
    for (tkey, partition), prefix in extra.items():
        pd = make(
            module.PartitionData,
            partition_index=partition,
            error_code=ErrorCode.none,
            high_watermark=prefix.high_watermark,
            last_stable_offset=prefix.last_stable_offset,
            log_start_offset=prefix.log_start_offset,
            aborted_transactions=None if prefix.run.aborted is None else (),
            records=b"",
        )
        if tkey in index:
            t = topics[index[tkey]]
            topics[index[tkey]] = replaced(t, partitions=(*t.partitions, pd))
        else:
            topics.append(
                make(module.FetchableTopicResponse, topic=tkey, topic_id=tkey, partitions=(pd,))
            )
            index[tkey] = len(topics) - 1
    return replaced(response, responses=tuple(topics))


def marks_of(pd: Any) -> tuple[int, int, int]:
    """The high watermark, last stable offset and log start offset a partition entry gives."""
    if type(pd) in _CARRIES_MARKS:  # v5+ (kio's ints): read straight, once per partition
        return (pd.high_watermark, pd.last_stable_offset, pd.log_start_offset)
    marks = (
        int(pd.high_watermark),
        int(getattr(pd, "last_stable_offset", -1)),
        int(getattr(pd, "log_start_offset", -1)),
    )
    kind = type(pd)
    if kind not in _MARKS_SEEN:
        _MARKS_SEEN.add(kind)  # kio's classes are a bounded set; others are never fast
        if kio_class_with(kind, ("high_watermark", "last_stable_offset", "log_start_offset")):
            _CARRIES_MARKS.add(kind)  # their fields are always ints
    return marks


_CARRIES_MARKS: set[type] = set()
"""kio response ``PartitionData`` classes that carry all three marks (v5+)."""
_MARKS_SEEN: set[type] = set()


def aborted_of(pd: Any) -> Aborted | None:
    """A partition entry's aborted transactions as (producer id, first offset) pairs."""
    txns = pd.aborted_transactions
    if not txns:
        return None if txns is None else ()
    return tuple((int(t.producer_id), int(t.first_offset)) for t in txns)


def _rebuild_partition(pd: Any, head: Run) -> Any:
    """*pd* carrying *head* as its records, with the aborted list for that range."""
    if not head.data and not pd.records and head.aborted is None:
        if pd.aborted_transactions is None:
            return pd  # nothing for it and nothing to say of aborts (most unserved partitions)
    changes: dict[str, Any] = {}
    if head.data is not pd.records and head.data != (pd.records or b""):
        changes["records"] = head.data if (head.data or pd.records is not None) else None
    aborted = _aborted_within(head.aborted, head.headers)
    if aborted != aborted_of(pd):
        cls = module_of(pd).AbortedTransaction
        changes["aborted_transactions"] = (
            None
            if aborted is None
            else tuple(cls(producer_id=p, first_offset=f) for p, f in aborted)
        )
    return replaced(pd, **changes) if changes else pd
