"""The upstream half: the client side of a KIP-227 fetch session, one per upstream connection.

Modelled on Kafka's ``FetchSessionHandler`` (Java client): it decides what each
Fetch request sent upstream must carry and which session metadata (session id,
epoch) goes with it, and it validates each response the way the Java client
does.  Sans-I/O: the caller says which partitions it wants *now*; ``build``
returns what to send; ``handle_response`` consumes what came back.

Session metadata transitions (``nextMetadata`` in Kafka):

==========================================  ===================================
event                                       next request
==========================================  ===================================
new handler                                 full, (0, 0)
full response, session id S != 0            incremental, (S, 1)
full response, session id 0 (cache full)   full; sessionless (0, -1) for
                                            ``sessionless_backoff`` requests,
                                            then (0, 0) again
incremental response, session continues     incremental, (S, epoch + 1);
                                            2**31 - 1 wraps to 1
incremental response, session id 0          full, (0, 0)
top-level FETCH_SESSION_ID_NOT_FOUND        full, (0, 0)
any other top-level error                   full, (S, 0): close and recreate
invalid full response (missing/extra)       full, (0, 0)
invalid incremental response (extra)        full, (S, 0)
throttled empty full response (KIP-219)     full, (0, 0)
network error on the request                full, (S, 0)
==========================================  ===================================

Partitions are keyed by :data:`~proxy.protocol.partition_key.PartitionKey` (the one
key of the fetch path), whose topic is a topic id (UUID) when the session uses topic
ids (Fetch v13+) and a topic name otherwise, and carry a
:class:`~proxy.protocol.partition_plan.PartitionPlan` (what the broker caches per
partition of a session, a change making the partition "altered"; the type the
broker-side cache toward clients keeps too).  A session never mixes the two: changing the addressing mode forces a full request,
because the broker refuses an incremental request whose mode differs from the
session's (FETCH_SESSION_TOPIC_ID_ERROR).

Only one request may be outstanding: a session's epochs are a sequence and the
next request depends on the previous response.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from ..protocol.codec import drain
from ..protocol.error_codes import FETCH_SESSION_ID_NOT_FOUND
from ..protocol.partition_key import PartitionKey, partition_name
from ..protocol.partition_plan import PartitionPlan
from .kip227 import (
    FINAL_EPOCH,
    INITIAL_EPOCH,
    INVALID_SESSION_ID,
    next_epoch,
)

_Diff = tuple[
    dict[PartitionKey, PartitionPlan],
    dict[PartitionKey, PartitionPlan],
    dict[PartitionKey, PartitionPlan],
    list[PartitionKey],
]
"""(kept, added, altered, removed): a request's partitions against the session's."""


@dataclass(frozen=True, slots=True)
class SessionMetadata:
    session_id: int
    epoch: int

    @property
    def is_full(self) -> bool:
        return self.epoch in (INITIAL_EPOCH, FINAL_EPOCH)


INITIAL = SessionMetadata(INVALID_SESSION_ID, INITIAL_EPOCH)
SESSIONLESS = SessionMetadata(INVALID_SESSION_ID, FINAL_EPOCH)


@dataclass(frozen=True, slots=True)
class SessionRequest:
    """What the next upstream Fetch request must carry."""

    metadata: SessionMetadata
    to_send: dict[PartitionKey, PartitionPlan]
    """Partitions listed in the request, in request order."""
    to_forget: tuple[PartitionKey, ...]
    """forgotten_topics_data (always empty in a full request)."""
    session_partitions: tuple[PartitionKey, ...]
    """Every partition of the session after this request, in session order."""
    uses_topic_ids: bool

    @property
    def is_full(self) -> bool:
        return self.metadata.is_full


class Verdict(Enum):
    OK = "ok"
    """The response is valid and describes every session partition (explicitly or implied)."""
    ERROR = "error"
    """A top-level error: the response carries no partition data."""
    INVALID = "invalid"
    """The response broke the session rules; its partition data must not be used."""
    THROTTLED = "throttled"
    """An empty full response with a throttle time (KIP-219): nothing to use."""


@dataclass(frozen=True, slots=True)
class ResponseOutcome:
    verdict: Verdict
    was_full: bool
    """Whether the request this response answers was a full request."""
    problem: str | None = None

    @property
    def ok(self) -> bool:
        return self.verdict is Verdict.OK


class SessionStateError(Exception):
    """The caller broke the one-request-at-a-time protocol of FetchSessionClient."""


class FetchSessionClient:
    """Client-side fetch session state for one upstream connection."""

    def __init__(self, *, sessionless_backoff: int = 8) -> None:
        if sessionless_backoff < 0:
            raise ValueError("sessionless_backoff must be >= 0")
        self._next = INITIAL
        self._session: dict[PartitionKey, PartitionPlan] = {}
        self._uses_topic_ids: bool | None = None
        self._in_flight: SessionRequest | None = None
        self._backoff = sessionless_backoff
        self._sessionless_left = 0
        self._repeatable: SessionRequest | None = None
        """The last request, when it sent and forgot nothing and its response continued the
        session: the next may be the same at the next epoch (``repeat``)."""

    # -- introspection -------------------------------------------------------------------

    @property
    def next_metadata(self) -> SessionMetadata:
        """The session id and epoch the next request would carry (before any backoff)."""
        return self._next

    @property
    def session_id(self) -> int:
        return self._next.session_id

    @property
    def session_partitions(self) -> tuple[PartitionKey, ...]:
        return tuple(self._session)

    @property
    def in_flight(self) -> SessionRequest | None:
        return self._in_flight

    # -- building requests ---------------------------------------------------------------

    def repeat(self) -> SessionRequest | None:
        """The next request when the partitions wanted are those of the last one, which
        sent and forgot nothing (an idle session): the same at the next epoch, with no
        walk of the session.  None when that does not hold (a request in flight, a
        ``build`` since, or the next request must be full); the caller then builds one."""
        last = self._repeatable
        if last is None or self._in_flight is not None or self._next.is_full:
            return None
        request = SessionRequest(
            metadata=self._next,
            to_send={},
            to_forget=(),
            session_partitions=last.session_partitions,
            uses_topic_ids=last.uses_topic_ids,
        )
        self._in_flight = request
        return request

    def build(
        self,
        wanted: Mapping[PartitionKey, PartitionPlan],
        *,
        uses_topic_ids: bool,
        supports_sessions: bool = True,
    ) -> SessionRequest:
        """Decide the next request from the partitions wanted now (in the caller's order).

        Partitions in the session but not in *wanted* are forgotten; partitions in
        *wanted* that are new or whose ``PartitionPlan`` changed are sent.  With
        ``supports_sessions=False`` (upstream Fetch < v7) every request is a
        sessionless full request.
        """
        steps = self.build_in_ranges(
            wanted, 0, uses_topic_ids=uses_topic_ids, supports_sessions=supports_sessions
        )
        return drain(steps)

    def build_in_ranges(
        self,
        wanted: Mapping[PartitionKey, PartitionPlan],
        every: int,
        *,
        uses_topic_ids: bool,
        supports_sessions: bool = True,
    ) -> Generator[None, None, SessionRequest]:
        """``build``, yielding after every *every* partitions (0: never) of its walks over
        *wanted* and the session; the session changes at one point, after the last."""
        if self._in_flight is not None:
            raise SessionStateError("a fetch request is already in flight in this session")
        for i, key in enumerate(wanted, 1):
            if isinstance(key[0], uuid.UUID) != uses_topic_ids:
                raise ValueError(
                    f"partition {partition_name(key)} does not match"
                    f" uses_topic_ids={uses_topic_ids}"
                )
            if every and i % every == 0:
                yield
        before = self._session
        diff = yield from self._diff_in_ranges(wanted, every)
        if self._in_flight is not None:  # (checked again: yields came between)
            raise SessionStateError("a fetch request is already in flight in this session")
        if self._session is not before:  # the session changed between two ranges: again at once
            diff = drain(self._diff_in_ranges(wanted, 0))
        # From here on, at one point: the request's kind, the session, the request.
        self._repeatable = None
        metadata = self._next
        if self._uses_topic_ids is not None and self._uses_topic_ids != uses_topic_ids:
            # The broker rejects an incremental request that switches addressing modes.
            metadata = SessionMetadata(metadata.session_id, INITIAL_EPOCH)
        if not supports_sessions:
            metadata = SessionMetadata(metadata.session_id, FINAL_EPOCH)
        elif metadata == INITIAL and self._sessionless_left > 0:
            self._sessionless_left -= 1
            metadata = SESSIONLESS
        self._uses_topic_ids = uses_topic_ids

        if metadata.is_full:
            self._session = dict(wanted)
            request = SessionRequest(
                metadata=metadata,
                to_send=dict(wanted),
                to_forget=(),
                session_partitions=tuple(self._session),
                uses_topic_ids=uses_topic_ids,
            )
        else:
            kept, added, altered, removed = diff
            # The broker appends added partitions to the end of its session map.
            self._session = kept | added
            request = SessionRequest(
                metadata=metadata,
                to_send=added | altered,
                to_forget=tuple(removed),
                session_partitions=tuple(self._session),
                uses_topic_ids=uses_topic_ids,
            )
        self._in_flight = request
        return request

    def _diff_in_ranges(
        self, wanted: Mapping[PartitionKey, PartitionPlan], every: int
    ) -> Generator[None, None, _Diff]:
        """(kept, added, altered, removed) of *wanted* against the session, which it only
        reads; yields after every *every* partitions walked (0: never)."""
        added: dict[PartitionKey, PartitionPlan] = {}
        altered: dict[PartitionKey, PartitionPlan] = {}
        removed: list[PartitionKey] = []
        kept: dict[PartitionKey, PartitionPlan] = {}
        session = self._session
        walked = 0
        for key, prev in session.items():
            nxt = wanted.get(key)
            walked += 1
            if every and walked % every == 0:
                yield
            if nxt is None:
                removed.append(key)
                continue
            kept[key] = nxt
            if nxt != prev:
                altered[key] = nxt
        for key, params in wanted.items():
            if key not in session:
                added[key] = params
            walked += 1
            if every and walked % every == 0:
                yield
        return kept, added, altered, removed

    # -- handling responses ---------------------------------------------------------------

    def handle_response(
        self,
        *,
        error_code: int,
        session_id: int,
        throttle_time_ms: int,
        partitions: Iterable[PartitionKey],
    ) -> ResponseOutcome:
        """Validate the response to the in-flight request and choose the next metadata."""
        steps = self.handle_response_in_ranges(
            error_code=error_code,
            session_id=session_id,
            throttle_time_ms=throttle_time_ms,
            partitions=partitions,
            every=0,
        )
        return drain(steps)

    def handle_response_in_ranges(
        self,
        *,
        error_code: int,
        session_id: int,
        throttle_time_ms: int,
        partitions: Iterable[PartitionKey],
        every: int,
    ) -> Generator[None, None, ResponseOutcome]:
        """``handle_response``, yielding after every *every* partitions (0: never) of its
        walks over the answer's partitions and the session, which it only reads; the
        request in flight is taken and the next metadata chosen at one point, after."""
        request = self._in_flight
        if request is None:
            raise SessionStateError("no fetch request in flight")
        keys: list[PartitionKey] = []
        extra: list[PartitionKey] = []
        omitted: list[PartitionKey] = []
        seen: set[PartitionKey] = set()
        if error_code == 0:
            session = self._session
            for key in partitions:
                keys.append(key)
                if key not in session:
                    extra.append(key)
                if every and len(keys) % every == 0:
                    yield
            seen = set(keys)
            if request.metadata.is_full:
                for i, key in enumerate(session, 1):
                    if key not in seen:
                        omitted.append(key)
                    if every and i % every == 0:
                        yield
            if self._in_flight is not request or self._session is not session:
                raise SessionStateError("the session changed while a response was read")
        request = self._take_in_flight()
        self._repeatable = None
        sent = request.metadata
        was_full = sent.is_full
        if error_code != 0:
            if error_code == FETCH_SESSION_ID_NOT_FOUND:
                self._next = INITIAL
            else:
                self._next = SessionMetadata(sent.session_id, INITIAL_EPOCH)
            return ResponseOutcome(Verdict.ERROR, was_full, f"top-level error {error_code}")

        duplicated = len(seen) != len(keys)
        if was_full:
            if not keys and throttle_time_ms > 0:
                self._next = INITIAL
                return ResponseOutcome(Verdict.THROTTLED, was_full)
            problem = _describe(omitted=omitted, extra=extra, duplicated=duplicated)
            if problem is not None:
                self._next = INITIAL
                return ResponseOutcome(Verdict.INVALID, was_full, problem)
            if session_id == INVALID_SESSION_ID:
                self._next = INITIAL
                if sent.epoch == INITIAL_EPOCH:
                    # We asked for a session and got none: the broker's cache is full
                    # (or sessions are disabled).  Stop asking for a while.
                    self._sessionless_left = self._backoff
            else:
                self._next = SessionMetadata(session_id, next_epoch(INITIAL_EPOCH))
            return ResponseOutcome(Verdict.OK, was_full)

        problem = _describe(omitted=[], extra=extra, duplicated=duplicated)
        if problem is not None:
            self._next = SessionMetadata(sent.session_id, INITIAL_EPOCH)
            return ResponseOutcome(Verdict.INVALID, was_full, problem)
        if session_id == INVALID_SESSION_ID:
            self._next = INITIAL  # the broker closed the session
        else:
            self._next = SessionMetadata(sent.session_id, next_epoch(sent.epoch))
            if not request.to_send and not request.to_forget:
                self._repeatable = request
        return ResponseOutcome(Verdict.OK, was_full)

    def revoke_last_response(self, problem: str) -> None:
        """A response accepted by ``handle_response`` turned out to be unusable.

        Close the session and start a new one on the next request, as Kafka's client
        does for an invalid incremental response.
        """
        if self._in_flight is not None:
            raise SessionStateError("a fetch request is in flight")
        self._repeatable = None
        self._next = SessionMetadata(self._next.session_id, INITIAL_EPOCH)

    def handle_send_error(self) -> None:
        """The request could not be sent or its response never came."""
        self._in_flight = None
        self._repeatable = None
        self._next = SessionMetadata(self._next.session_id, INITIAL_EPOCH)

    def _take_in_flight(self) -> SessionRequest:
        request = self._in_flight
        if request is None:
            raise SessionStateError("no fetch request in flight")
        self._in_flight = None
        return request


def _describe(
    *, omitted: list[PartitionKey], extra: list[PartitionKey], duplicated: bool
) -> str | None:
    parts = []
    if omitted:
        parts.append(f"omitted {len(omitted)} partition(s), e.g. {partition_name(omitted[0])}")
    if extra:
        parts.append(f"{len(extra)} extra partition(s), e.g. {partition_name(extra[0])}")
    if duplicated:
        parts.append("duplicate partitions")
    return "; ".join(parts) or None
