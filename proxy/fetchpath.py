"""The proxy's Fetch path, sans-I/O: one handler per client connection, its stages in order.

``FetchPath`` is the process-wide part (configuration, memory-budget admission,
the topic-id map, one downstream session cache per listener); ``FetchPathHandler``
is the relay's per-connection FetchHandler it hands out.  Neither counts nor logs:
what a handler did (a wait for budget or for partitions in flight, bytes a session
saved, an upstream session reset, partitions sent back to their leader, one report
per shaped response) is appended to its ``effects`` as values (:mod:`proxy.effects`),
which the edge drains after every input and feeds to the metrics and the decision
log (``proxy.observe.apply``); the gauges read ``budget`` and ``in_flight`` at scrape
time.  A consumer fetch (v4+, not a follower's) goes through
``FetchPathHandler`` top-down, each stage taking values and returning values:

    client request
      decode                    codec.decode_request_body, then ClientFetch.validate:
                                the one check of whose fetch it is (its replica id; a
                                follower's passes through); the stages get the value
      admission                 FetchPath.select (policy), FetchAdmission.fetch_bytes
                                (the max_bytes it may ask; nothing reserved)
      downstream session        DownstreamSessions.open: the partitions this fetch
                                covers, as one sessionless full fetch (or a session
                                error, answered at once)
      shaping                   FetchShaper.prepare: held batches offered from the
                                reuse buffer, the response's limits; when they fill
                                the response (FetchShaper.held_answer, not for a
                                fetch naming a rack) the client is answered from them
                                with no upstream round (straight to shaping's finish);
                                else FetchShaper.upstream_in_ranges builds the
                                upstream request (caps clamped, offsets past held
                                batches, round-robin order)
      replica split             read_replica.split, only when the proxy follows
                                preferred_read_replica for this client (Fetch
                                v10-, or a client that ignores redirects):
                                redirected partitions go to the replica (the
                                edge's ReplicaUpstream), the rest to the leader
      upstream session          FetchTranslator.begin: the next request of the
                                connection's KIP-227 session upstream
      encode                    codec.encode_request -> upstream
    upstream response
      decode                    decode_fetch_response (records stay views of the frame)
      upstream session          FetchTranslator.complete: the complete full response
                                (or a resend after a session reset)
      replica merge             read_replica.merge: the leader's and the replica's
                                answers as one, in the client's order (when split)
      shaping                   FetchShaper.finish: trimmed to the limits in
                                serve-rotation order, trimmed-away batches kept
      downstream session        DownstreamSessions.answer: all of it (sessionless
                                client) or the incremental part (session client)
      encode                    codec.encode_response_gathered -> client

Admission comes before the downstream session and never waits (memory is
taken later, from the response's size).  Shaping sits between the two
sessions, so it always works on full fetches whatever the client speaks, and
the upstream session learns each partition's next offset from the shaped
request of the next fetch (the client's offset, or past the batches the buffer
holds).
A fetch that needs no reshaping (Fetch v0-v3, a follower's fetch) takes one
step: the relay's ``PassThroughFetch``.

The same fetch again (``_repeat_of``): a sessionless consumer with nothing new
to read sends the same Fetch round after round (every partition at the same
offsets; librdkafka only moves its first partition to the end).  When the last
one was answered from an idle upstream session (the translator's ``quiet``: its
request sent and forgot no partition, the answer named none, nothing held,
trimmed or redirected), a fetch with the same body, or the same partitions in
another order (``fetch_count.order_free``), skips every stage that walks its
partitions: it goes upstream as the idle session's next epoch
(``FetchTranslator.repeat``), and an answer naming no partition is replied with
the last answer's bytes (``complete_quiet``, ``_answer_repeat``).  Any other
answer runs the skipped stages then (``_stages_of_repeat``: the downstream
context and shaping's prepare) and goes the usual way.  One remembered fetch per
connection, its body and answer at most ``DECODE_MEMO_MAX_BYTES`` each.
A session client with nothing new to read (Java's consumer) sends an incremental
fetch that names no partition, at each next epoch: when the last one was answered
with no partition from an idle upstream session, the next (the same body but its
session epoch, which must be the one the session waits for: ``_session_repeat``)
is repeated the same way, and its session takes it before the answer goes
(``DownstreamSessions.next_idle_epoch``: its epoch moves on, as ``open`` would move
it); a session evicted meanwhile gets the session error ``open`` answers.

Fetches of one connection are served one at a time, in arrival order (a
session's epochs are a sequence); pipelined fetches wait in a queue bounded by
the relay's ``max_in_flight``, as frames: a fetch is decoded when it reaches
the head of the queue, so a connection holds at most one decoded request (a
decoded Fetch is about 110 times its wire size in kio objects).

Slices: one event loop serves every connection, so a fetch's stages must not
hold it long.  A fetch covering more than ``SLICE_PARTITIONS`` partitions (or
whose request frame is larger than ``SLICE_BYTES``, for its decode; its answer
is deferred by the partitions it covers, not by its bytes: records are views,
so a few partitions' megabytes decode at once) is served one
stage per loop turn: decode | open + admission | shaping | upstream session |
encode on the way up, decode | upstream session | shaping | downstream session
| encode on the way down.  Each stage is a generator step (``_start`` and
``_received`` yield between stages); after a step the handler calls the edge's
waker, whose task calls ``resume()`` at its next turn, so other connections'
requests are served between two slices.  Every slice runs from the edge's wake
loop, none in the loop that read a frame: a large request is decoded in turns
of its own, a large upstream answer waits for a turn (``_run(defer=True)``), so
the edge can order them (its slice lane lets one connection's slices run at a
time, ``proxy.server.connection``).  The walks over a fetch's partitions are
also cut into ranges, yielding every ``SLICE_PARTITIONS`` partitions: the
decodes of the request and of the upstream answer (``_decoding``,
``fetch_views.decode_fetch_response_in_ranges``), the downstream session's open
and answer (``DownstreamSessions.open_in_ranges``,
``answer_in_ranges``), the upstream session's begin (``begin_in_ranges``:
reading the client's partitions, building the upstream request) and complete
(``complete_in_ranges``), shaping's prepare, held answer and finish
(``FetchShaper.prepare_in_ranges``: the offsets named, the held batches offered,
the response limits, the ``max_partition_bytes`` clamp, the offsets moved past
held batches, the upstream rotation's rebuild; ``held_answer_in_ranges``;
``finish_in_ranges``: upstream's word on held batches, the trim walks, the
outcomes and the decision's totals), the partitions a full fetch no longer
asks (forgotten in prepare's first walk), and the encodes of the upstream request and of the client's
response (``codec.encode_request_in_ranges``,
``encode_response_gathered_in_ranges``).  Between two ranges only this
connection's own state is half-updated (its translator, its session, its
shaper's watermarks, waits, rotation and reuse buffer; its next fetch waits as
a frame; another connection short of budget may only empty the reuse buffer,
``shed_buffers``, which the rest of a walk then finds empty); what is shared (the
topic-id map read, the session cache, the upstream session's next request, the
memory-budget grant's size) is read or updated at one point, before
the first range or after the last.  A connection closed between slices drops
the rest (``close``).  A small fetch takes no extra turn.  Still uncut, and
growing with the partitions (``bench/fetch_stall.py``, 20,000 partitions, an
idle core): the upstream session's grouping of the request; the upstream rotation's
order and observe (a sort of a full fetch's partitions, 10-30 ms at 20,000); the cycle
collector's full collections run on a timer only (``server.cli``); the typed fetch model of issue 17 shrinks every stage.
kio's Fetch schemas (every version) are imported when the ``FetchPath`` is made, at
start (``messages.load_fetch_schemas``: about 0.3 s of CPU, 1.6 MiB), not on the loop
at a client's first Fetch of a version (30-70 ms, once).

A Fetch naming more than ``max_fetch_partitions`` closes the connection
(``FetchTooLarge``) when it arrives: its partitions are counted from its bytes
(:mod:`.protocol.fetch_count`, a walk of the topic and partition counts that
stops once past the limit, so a refusal walks at most ``max_fetch_partitions``
partitions or topic entries, however large the frame), so
the refusal costs no decode and the frame is never queued.

Partitions in flight (:mod:`proxy.shaping.in_flight`, ``max_partitions_in_flight``):
a fetch of more than 500 partitions takes its count (the same walk) from the
process's bound when it reaches the head of its connection's queue, before it is
decoded, and gives it back once its answer is written (``written``) or its
connection closes (``close``); a follower's, passed through after its decode,
gives it back then.  One that does not fit waits in the bound's FIFO (its
connection's fetches wait behind it; its waker resumes it); small fetches never
wait.  A connection keeps its latest fetch's decode for the next one
(``_decode_in_ranges``: a sessionless consumer's next Fetch repeats most of it); one
that took from the bound keeps it within the process's ``KeptDecodes``, the same
count apart, which makes the oldest kept be forgotten first.

Memory budget (:mod:`proxy.shaping.budget`, KIP-81 / KIP-72): a fetch starts
at once with a grant of nothing and asks upstream for at most
``FetchAdmission.fetch_bytes`` (its partitions' bound, 1/16 of the budget), so
a long poll waiting upstream holds no budget.  When the edge has read the length
prefix of its Fetch response, it asks ``reserve_response(size)`` before reading
the body: the grant grows by the frame's size if the budget can take it
(``FetchAdmission.take``: what fits, and while others wait, no more than the
connection's fair share), else the connection joins the admission's FIFO of
waiters and the edge stops reading that upstream connection (back-pressure; what
the broker sends meanwhile waits in its socket).  A release of budget wakes
waiters through the waker the trio edge bound (``bind_waker``); its task asks
again.  A response read together with the answer before it (the edge reads a
Fetch response's length prefix alone, so this is at most one read past a
non-Fetch answer) is in memory before it can be asked about: the grant is then
sized after the fact (the shaper resizes it to the records in memory), so that
much (one read, 64 KiB) can exceed the budget per connection.  The grant is
released when the edge says the response was written (``written()``).  Before a response is made to wait, every
connection's reuse buffer is dropped (it is a cache, and the budget must never
be held by data nobody is fetching while responses wait).  Other traffic never
asks the budget; answers leave a connection in request order, so a request a
client pipelines behind a fetch whose response waits is answered after it
(another connection's never waits).

Topic ids are learnt from every Metadata response the relay forwards
(``observe``); when a names client needs ids the handler asks upstream Metadata
itself (:class:`~proxy.sessions.topic_ids.TopicIdRequests`).  The upstream Fetch
version is the highest the upstream advertised in the ApiVersions response the
handler observed (capped by the proxy), else the client's own version.

Client id: every request the handler sends upstream (the reshaped Fetch, its
resends, the topic-id Metadata) carries the client id of the client's Fetch it
serves, byte for byte what the client put in its header (null stays null), so
the broker's client-id quotas, request logs and KIP-714 metrics see the client.
The handler sends nothing before the client's first Fetch, so there is always
one; the proxy's own connections (broker discovery, ``proxy.server``) are not a
client's and say ``kafka-fetch-proxy``.

Running ahead (``run_ahead``, on by default): after an answer that delivered at
least ``RUN_AHEAD_MIN_BYTES`` with no fetch of the client's queued, to a client that
reads on (its fetch asked where its last answer with data left it, ``_reads_on``: one
that seeks between fetches would only wait for a round it cannot use), ``_run_ahead``
sends upstream, through the same upstream session, what the client will ask next
(``FetchShaper.ahead_request``: its full fetch at the offsets that answer ended at,
moved past what the buffer holds, max_wait 0, at most the fetch's budget share),
when no fetch waits for budget and the round leaves it at most a quarter used
(``FetchAdmission.room_ahead``: speculative, it takes only spare memory).
The answer goes to the reuse buffer (``FetchShaper.hold_ahead``, upstream's word on
each partition applied first), not to the client; the client's next fetch, queued
behind the round if it came meanwhile, is answered from it (``held_answer``: what
ran ahead answers once it covers the fetch's min_bytes).  Its memory is the round's
grant while it is read (``reserve_response``, as any fetch), then the buffer's.  Not
under record limits (they run ahead by trimming), for a fetch naming a rack, or one
following a preferred replica, or a large one.  The edge sees a ``RanAhead`` effect.

Long polls: every fetch the handler sends upstream long-polls at most
``max_upstream_wait_ms`` (default 500, the Java consumer's fetch.max.wait.ms):
min(client's max_wait, it).  A broker may answer early anyway, so the client
only gets an empty answer sooner and polls again.  Pass-through fetches (v0-v3,
followers') keep their own max_wait: they are relayed as they came.

Reload: ``FetchPath.reload(config)``; live connections pick the new limits
and policies at their next fetch.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
import weakref
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from functools import partial
from typing import Any

from .config import FetchPathConfig
from .effects import (
    BudgetWait,
    Effects,
    FetchRepeated,
    InFlightWait,
    RanAhead,
    ReplicaFallback,
    SessionReset,
    SessionSaved,
    ShapedReport,
    UpstreamData,
)
from .protocol import codec, fetch_count, fetch_reuse, writers
from .protocol.apis import API_VERSIONS, FETCH, METADATA, SASL_AUTHENTICATE, SASL_HANDSHAKE
from .protocol.errors import DecodeError
from .protocol.fetch_views import decode_fetch_response, decode_fetch_response_in_ranges
from .protocol.framing import BodyPool, CopyPool, Frame, Gathered
from .protocol.messages import (
    load_fetch_schemas,
    make,
    replaced,
    request_module,
    response_module,
)
from .protocol.partition_key import PartitionKey, TopicKey
from .relay import rack_fetch, read_replica
from .relay.racks import FallbackReason, RackMap, account
from .relay.relay import ClientRequest, FrameCallback, PassThroughFetch, Upstream
from .sessions.as_broker import (
    DownstreamFetch,
    DownstreamSessions,
    FetchTooLarge,
    SessionPartitionBound,
)
from .sessions.as_broker_cache import FetchSessionCache, IncrementalFetchContext
from .sessions.as_client import FetchTranslator, UpstreamFetch
from .sessions.as_client_session import FetchSessionClient
from .sessions.client_fetch import ClientFetch, ClientReply, TranslationError
from .sessions.kip227 import FINAL_EPOCH, FIRST_TOPIC_ID_VERSION, INVALID_SESSION_ID
from .sessions.resets import RESET_REASONS, ResetReason, Side
from .sessions.topic_ids import TopicIdMap, TopicIdRequests
from .shaping.budget import FetchAdmission, MemoryBudget, Reservation, response_bound
from .shaping.decision import ShapingDecision
from .shaping.in_flight import KeptDecodes, PartitionsInFlight
from .shaping.limits import Limits
from .shaping.policy import rack_override, select
from .shaping.shaper import FetchShaper, PreparedFetch, ShapedResponse

MAX_POLICY_CACHE = 1024
MIN_SESSION_FETCH_VERSION = 4
"""Older Fetch versions (and followers' fetches) pass through untouched."""
DECODE_MEMO_MAX_BYTES = 1 << 20
"""The largest request body a connection keeps to skip decoding it again (``_decode``)."""
REUSE_MIN_BYTES = 1024
"""A request body below this (about 30 partitions) is decoded by kio's reader, which is
faster than the walk for reuse (:mod:`.protocol.fetch_reuse`) at a few partitions."""
REUSE_MAX_BACKOFF = 16
"""At most this many requests are decoded whole between two walks that found most
partition entries changed."""
SLICE_BYTES = 16 * 1024
"""A Fetch request frame larger than this (about 500 partitions) is decoded in a slice of
its own (see "Slices" in the module docstring)."""
SLICE_PARTITIONS = 500
"""A fetch covering more partitions than this is served in slices, one stage per slice."""
RUN_AHEAD_MIN_BYTES = 64 * 1024
"""An answer that delivered less does not start a run-ahead round (``_run_ahead``): a
consumer that keeps up gets little per fetch, and its next one long-polls anyway."""

Slices = Generator[None, None, None]
"""One fetch's stages; each ``yield`` ends a slice (the rest runs in a later loop turn)."""


def _reads_on(
    asked: Mapping[PartitionKey, int], ended_at: Mapping[PartitionKey, int] | None
) -> bool:
    """Whether a client reads on: its fetch *asked*, for some partition, the offset where
    its last answer with data left it (*ended_at*; None: it had none).  A client that
    seeks between fetches would find a run-ahead round's data at the wrong offsets and
    wait for the round anyway (the upstream connection answers in order), so it is not
    run ahead for until it reads on again."""
    if ended_at is None:
        return True
    return any(asked.get(key) == offset for key, offset in ended_at.items())


def listener_name(node_id: int | None) -> str:
    """The listener name policies match: ``bootstrap`` or ``broker-<node id>``."""
    return "bootstrap" if node_id is None else f"broker-{node_id}"


class FetchPath:
    """Process-wide state of the Fetch path; ``handler(node_id)`` per client connection."""

    def __init__(
        self,
        config: FetchPathConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        shaping: bool = True,
    ) -> None:
        self.shaping = shaping
        """False: fetches skip the shaping stage (to test the session stages on their own)."""
        self.admission = FetchAdmission(config.memory_budget_bytes)
        self.budget: MemoryBudget = self.admission.budget
        self.topic_ids = TopicIdMap()
        self.racks = RackMap(config.rack or None)
        """Which broker is in which rack and which leads what, learnt from Metadata."""
        self.clock = clock
        self.starved_detail = False
        """Reports name every starved partition (``ShapedReport.starved_partitions``, a copy
        of the rotation's per response): only a decision log reads them, so the edge sets
        this when one is open."""
        self._client_sessions: dict[int | None, FetchSessionCache] = {}
        self.session_bound = SessionPartitionBound(config.max_cached_session_partitions)
        """Partitions every listener's client sessions may hold together."""
        self.in_flight = PartitionsInFlight(config.max_partitions_in_flight)
        """Partitions of the large fetches being processed (``max_partitions_in_flight``)."""
        self.kept_decodes = KeptDecodes(config.max_partitions_in_flight)
        """Partitions of the large fetches' decodes kept for their connections' next."""
        self.bodies = BodyPool(room=lambda: self.budget.headroom)
        """Large upstream frame bodies, used again once nothing refers to them; idle ones
        keep at most the memory budget's free bytes (the edge's readers take from it)."""
        self.copies = CopyPool(room=lambda: self.budget.headroom - self.bodies.idle_bytes())
        """Large copies of records held for later answers (the reuse buffers'), in buffers
        used again once nothing refers to them; idle ones keep at most what the budget's
        free bytes leave beside the idle frame bodies (those in use are counted by it)."""
        self.handlers: weakref.WeakSet[FetchPathHandler] = weakref.WeakSet()
        self._policy_cache: dict[tuple[str | None, str], tuple[str, Limits]] = {}
        self.config = config
        self.generation = 0
        # kio's Fetch schemas now, not on the loop at a client's first Fetch of a version
        load_fetch_schemas()

    @property
    def fetch_waits(self) -> int:
        """Fetches that had to wait for budget (each counted once)."""
        return self.admission.waits

    def release_idle(self) -> int:
        """Let go of the idle frame bodies and record copies taken by nothing since the last
        call (``BodyPool.release_idle``); the bytes let go."""
        return self.bodies.release_idle() + self.copies.release_idle()

    def sessions_for(self, node_id: int | None) -> FetchSessionCache:
        """The downstream session cache of one listener (Kafka has one per broker)."""
        cache = self._client_sessions.get(node_id)
        if cache is None:
            cache = self._client_sessions[node_id] = FetchSessionCache()
            self.session_bound.caches.append(cache)
        return cache

    def client_session_caches(self) -> list[FetchSessionCache]:
        """Every downstream session cache (for gauges and tests)."""
        return list(self._client_sessions.values())

    def handler(self, node_id: int | None = None) -> FetchPathHandler:
        h = FetchPathHandler(self, node_id)
        self.handlers.add(h)
        return h

    def reload(self, config: FetchPathConfig) -> None:
        """Apply a new configuration; live connections use it from their next fetch."""
        self.admission.configure(config.memory_budget_bytes)
        self.config = config
        self.in_flight.configure(config.max_partitions_in_flight)
        self.kept_decodes.configure(config.max_partitions_in_flight)
        self.generation += 1
        self._policy_cache.clear()
        for h in list(self.handlers):
            h.shaper.buffer.capacity = config.reuse_buffer_bytes
            h.downstream.max_fetch_partitions = config.max_fetch_partitions
            h.set_rack(config.rack)
        self.racks.rack = config.rack or None
        self.admission.wake_waiters()  # room may have appeared: let waiting fetches try again

    def shed_buffers(self) -> bool:
        """Drop every connection's reuse buffer; True if that freed any budget.

        Only the buffers that hold bytes are visited (the budget keeps track of
        them), so a failed admission costs the same with 10 or 10,000 connections.
        """
        return self.budget.shed()

    def select(self, client_id: str | None, listener: str) -> tuple[str, Limits]:
        """The policy name and limits for a client of *listener* (cached)."""
        key = (client_id, listener)
        hit = self._policy_cache.get(key)
        if hit is None:
            hit = select(self.config.policies, client_id, listener, self.config.limits)
            if len(self._policy_cache) >= MAX_POLICY_CACHE:
                self._policy_cache.clear()
            self._policy_cache[key] = hit
        return hit


@dataclass(frozen=True, slots=True)
class _Decoded:
    """A connection's latest decoded Fetch request (``FetchPathHandler._decode_in_ranges``)."""

    version: int
    body: bytes
    decoded: Any
    parts: fetch_reuse.Parts | None
    """Its partition entries and topics for the next request (None: kio decoded it)."""


@dataclass(frozen=True, slots=True)
class _Repeat:
    """A sessionless client's last fetch, answered from an idle upstream session, and its
    answer: the same bytes again get the same answer when upstream again says nothing
    changed (see ``FetchPathHandler._repeat_of``)."""

    version: int
    client_id: str | None
    body: bytes
    """The request's body (after its header), as the client sent it."""
    order_free: fetch_count.OrderFree | None
    """The body without its partitions' order (``fetch_count.order_free``)."""
    policy: str
    limits: Limits
    answer: bytes
    """The response frame the client got (its correlation id is replaced)."""
    report: ShapedReport
    config: Any
    large: bool
    upstream_frame: bytes | None
    """The request the idle upstream session was sent (a repeat changes its epoch alone)."""
    upstream_session_id: int
    upstream_epoch_at: int = -1
    """Where ``upstream_frame`` has its session epoch (``fetch_count.frame_epoch_at``)."""
    upstream_version: int = -1
    """``upstream_frame``'s Fetch version."""
    session_id: int | None = None
    """A session client's fetch: its session (None: a sessionless client's)."""
    epoch_at: int = -1
    """A session client's fetch: where its body has the session epoch, which a repeat
    changes (``body`` has zeros there)."""

    def epoch_in(self, frame: bytes, offset: int) -> int:
        """The session epoch of a session client's fetch *frame* (its body at *offset*)."""
        start = offset + self.epoch_at
        return int.from_bytes(frame[start : start + 4], "big", signed=True)


@dataclass(slots=True)
class _Exchange:
    """One client fetch being served: the values its stages handed on."""

    request: ClientRequest
    opened: DownstreamFetch | None
    """None while a repeated fetch (``repeat``) has not needed its stages."""
    grant: Reservation
    prepared: PreparedFetch | None
    """None when the path does not shape (``FetchPath(shaping=False)``)."""
    policy: str
    started: float
    sessionless: bool
    """The client uses no fetch session (epoch -1; Fetch v4-v6 have none)."""
    upstream_request_bytes: int = 0
    upstream_response_bytes: int = 0
    response_reserved: int = 0
    """Budget the edge took for upstream responses to this fetch (``reserve_response``)."""
    large: bool = False
    """It covers more than ``SLICE_PARTITIONS`` partitions: served in slices."""
    rack: rack_fetch.RackStep | None = None
    """The rack sent upstream and whether the proxy set it (None: no ``rack`` setting)."""
    redirects: Mapping[PartitionKey, int] | None = None
    """Partitions the answer sends to a preferred read replica (KIP-392), and which."""
    follow: bool = False
    """The proxy follows the leader's redirects for this client (``read_replica``)."""
    plan: read_replica.FetchSplit | None = None
    """The fetch split between the leader and preferred replicas (when following)."""
    leader_redirects: Mapping[PartitionKey, int] | None = None
    """Redirects of the leader's answer as upstream sent them (a v10 client's version
    has no field for them)."""
    leader_answer: Any = None
    leader_done: bool = False
    replica_answers: dict[int, Any] = dataclasses.field(default_factory=dict)
    served_by: Mapping[PartitionKey, int] | None = None
    """Partitions a preferred replica served, and which (for the rack metrics)."""
    limits: Limits | None = None
    repeat: _Repeat | None = None
    """The fetch is the last one again, sent upstream without its stages (``_repeat_of``)."""
    upstream_frame: bytes | None = None
    """The last request sent upstream for it, encoded."""
    ahead: Mapping[PartitionKey, tuple[int, int, int]] | None = None
    """A run-ahead round (``_run_ahead``), not a client's fetch: per partition, the
    client's next offset, where the round fetches it, its leader epoch."""
    ahead_bytes: int = 0
    """A run-ahead round's bound on what the reuse buffer holds with it."""


class FetchPathHandler:
    """The relay's FetchHandler for one client connection (see the module docstring)."""

    __slots__ = (
        "__dict__",  # created only if a test wraps one of its methods on the instance
        "__weakref__",
        "_authenticated_counted",
        "_busy",
        "_claim",
        "_decode_turn",
        "_encoded",
        "_exchange",
        "_fetches",
        "_last_decoded",
        "_old_version_counted",
        "_partitions_waiting",
        "_passthrough",
        "_queue",
        "_repeat",
        "_reuse_backoff",
        "_reuse_wait",
        "_slices",
        "_starting",
        "_unchanged",
        "_unwritten",
        "_unwritten_partitions",
        "_upstream",
        "_waiting_for",
        "_waker",
        "ahead_rounds",
        "authenticated",
        "budget_waits",
        "client_fetch_bytes",
        "closed",
        "downstream",
        "effects",
        "listener",
        "max_resends",
        "node_id",
        "path",
        "rack",
        "read_replicas",
        "repeats",
        "replicas",
        "session_cache",
        "sessionless_backoff",
        "shaper",
        "slices",
        "topic_id_requests",
        "translator",
        "upstream_fetch_bytes",
        "upstream_fetch_max",
        "upstream_metadata_max",
        "watermarks",
    )

    def __init__(
        self,
        path: FetchPath,
        node_id: int | None,
        *,
        max_resends: int = 2,
        sessionless_backoff: int = 8,
    ) -> None:
        self.path = path
        self.node_id = node_id
        self.listener = listener_name(node_id)
        self.effects = Effects()
        """What this connection's fetches did, for the edge to drain after each input
        (``proxy.effects``; the edge feeds them to the metrics and the decision log)."""
        config = path.config
        self.session_cache = path.sessions_for(node_id)
        """The downstream session cache of this connection's listener."""
        self.downstream = DownstreamSessions(
            self.session_cache,
            path.topic_ids,
            bound=path.session_bound,
            max_fetch_partitions=config.max_fetch_partitions,
        )
        self.shaper = FetchShaper(
            config.limits,
            buffer_capacity=config.reuse_buffer_bytes,
            budget=path.budget,
            share=path.admission.share,
            copy=path.copies.copy,
        )
        self.translator: FetchTranslator | None = None
        """The upstream session's translator (created at the first consumer fetch)."""
        self.max_resends = max_resends
        self.sessionless_backoff = sessionless_backoff
        self.topic_id_requests = TopicIdRequests(path.topic_ids)
        self.upstream_fetch_max: int | None = None
        self.upstream_metadata_max: int | None = None
        self.upstream_fetch_bytes = 0
        """Fetch request and response bytes exchanged with the upstream broker (frames)."""
        self.client_fetch_bytes = 0
        """Fetch request and response bytes exchanged with the client (frames)."""
        self.budget_waits = 0
        self.closed = False
        self.rack = rack_fetch.RackFetch(config.rack) if config.rack else None
        """The proxy's rack on this connection's fetches (None: no ``rack`` setting)."""
        self._encoded = writers.Written()
        """The encodings of the partition entries this connection's responses gave, by
        entry (``writers.Written``): an unchanged partition's entry is the same
        object from one response to the next."""
        self._old_version_counted = False
        """A fetch too old for a rack (v10-) was counted as a fallback (once per connection)."""
        self._passthrough = PassThroughFetch(self.rack)
        self.replicas: read_replica.ReplicaUpstream | None = None
        """The edge's connections to preferred read replicas (None: follow no redirect)."""
        self.read_replicas = read_replica.ReadReplicas()
        self.watermarks = read_replica.Watermarks()
        self.authenticated = False
        """The client authenticates end to end (SASL through the proxy)."""
        self._authenticated_counted = False
        self._upstream: Upstream | None = None
        self._queue: list[tuple[ClientRequest, ClientFetch | None, int]] = []
        """Fetches waiting their turn; each is decoded and validated when it reaches the
        head (None until then), so queued fetches hold their frames, not their decoded
        form; and the partitions it names (counted from its bytes, 0 when they could not
        be)."""
        self._claim: int | None = None
        """Partitions the fetch at the head of the queue (or being served) took from the
        process's ``PartitionsInFlight`` (None: it has taken nothing yet)."""
        self._unwritten_partitions = 0
        """Partitions of answered fetches whose responses are not written yet."""
        self._partitions_waiting = False
        """The fetch at the head waits for ``max_partitions_in_flight`` (counted once)."""
        self._slices: Slices | None = None
        """The fetch whose stages are being run one slice per loop turn (see ``_run``)."""
        self.slices = 0
        """Loop turns this connection's large fetches yielded between their stages."""
        self._exchange: _Exchange | None = None
        self._busy = False
        self._starting = False
        self._fetches = 0
        self._waiting_for: ClientRequest | None = None
        self._unwritten: list[Reservation] = []
        self._waker: Callable[[], None] | None = None
        self._last_decoded: _Decoded | None = None
        """The latest request (see ``_decode_in_ranges``)."""
        self._reuse_wait = 0
        """Requests to decode with kio's reader before walking for reuse again."""
        self._reuse_backoff = 0
        self._decode_turn: ClientRequest | None = None
        """The large request whose decode was put off to the next turn (see ``_serve``)."""
        self._repeat: _Repeat | None = None
        """The last fetch and its answer, when it came from an idle session (``_repeat_of``)."""
        self.repeats = 0
        """Fetches answered as the last one again, with no stage but the upstream round."""
        self.ahead_rounds = 0
        """Upstream rounds run ahead of the client (``_run_ahead``)."""
        self._ended_at: Mapping[PartitionKey, int] | None = None
        """Where the last answer that delivered data left the client (its ``next_offsets``):
        whether the client reads on from there decides running ahead (``_reads_on``)."""
        self._unchanged: tuple[tuple[int, int], bytes] | None = None
        """((version, session id), bytes) of the upstream answer that says nothing changed
        (``_unchanged_answer``)."""

    @property
    def upstream_session(self) -> FetchSessionClient | None:
        """The KIP-227 session this connection holds upstream (None before its first fetch)."""
        return None if self.translator is None else self.translator.session

    # -- the relay's FetchHandler -------------------------------------------------------

    def observe(self, api_key: int, api_version: int, frame: bytes) -> None:
        if api_key == API_VERSIONS:
            self._learn_versions(api_version, frame)
        elif api_key == METADATA:
            try:  # one decode: topic ids (v10+), brokers' racks (v1+), partition leaders
                _, response = codec.decode_response(METADATA, api_version, frame)
            except DecodeError:
                return  # not ours to judge: the client gets the frame as it came
            self.path.topic_ids.learn_metadata(response)
            self.path.racks.learn_metadata(response)
        elif api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            self.authenticated = True  # never follow a redirect with another identity

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None:
        if self.closed:
            return
        self._upstream = upstream
        if int(request.header.api_version) < MIN_SESSION_FETCH_VERSION:
            self._passthrough.handle_fetch(request, upstream)
            return
        named = self._refuse_too_large(request)
        self._queue.append((request, None, named))  # decoded when it starts (_serve)
        self._serve(upstream)

    def _refuse_too_large(self, request: ClientRequest) -> int:
        """Close the connection (``FetchTooLarge``) when the Fetch names more partitions than
        ``max_fetch_partitions``, counted from its bytes (:mod:`.protocol.fetch_count`), before
        it is queued or decoded: the refusal costs a walk of its structure up to the limit,
        not the decode (tens of microseconds a partition on the event loop).  A frame the count cannot follow
        goes on to the decode, which refuses it.  (``DownstreamSessions.open`` checks the
        decoded request too.)  Returns the count (0 when it could not be counted)."""
        h = request.header
        if h.body_offset is None:
            return 0
        limit = self.downstream.max_fetch_partitions
        named = fetch_count.fetch_partitions(
            int(h.api_version), request.frame, h.body_offset, above=limit
        )
        if named is not None and named > limit:
            raise FetchTooLarge(  # the count stops past the limit: a lower bound
                f"a Fetch of at least {named} partitions is more than"
                f" max_fetch_partitions ({limit})"
            )
        return named or 0

    def _decode(self, request: ClientRequest) -> Any:
        """The request body, decoded (``_decode_in_ranges`` at once)."""
        return codec.drain(self._decode_in_ranges(request, 0))

    def _decode_in_ranges(self, request: ClientRequest, every: int) -> Generator[None, None, Any]:
        """The request body, decoded, yielding every *every* partitions of it (0: never).

        A sessionless consumer names every partition in every Fetch, and from one to
        the next only the offsets it was given change; with nothing new to read it
        sends the very same body.  The latest request's decoded value (kio's are
        immutable) answers the same body at the same version, and its parts
        (:mod:`.protocol.fetch_reuse`) give a new body every partition entry and topic
        it repeats, so that only what changed is decoded.  One entry per connection,
        and only for bodies up to ``DECODE_MEMO_MAX_BYTES``.
        """
        h = request.header
        offset = h.body_offset
        if offset is None:
            return codec.decode_request_body(h, request.frame)  # (which refuses it)
        if len(request.frame) - offset > DECODE_MEMO_MAX_BYTES:
            return (
                yield from codec.decode_request_body_in_ranges(
                    h, request.frame, path=codec.FETCH_REQUEST_PARTITIONS, every=every
                )
            )
        version = int(h.api_version)
        body = bytes(request.frame[offset:])  # the very slice when the frame is bytes
        last = self._last_decoded
        if last is not None and last.version == version and last.body == body:
            return last.decoded
        got = None
        if self._reuse_wait:
            self._reuse_wait -= 1
        elif len(body) >= REUSE_MIN_BYTES:
            prior = None if last is None else last.parts
            got = yield from fetch_reuse.decode_reusing(
                version, request.frame, offset, prior, every
            )
            if got is not None and prior is not None:  # (else nothing to judge it by yet)
                if got[1].fresh * 2 > got[1].named:
                    # Most entries changed (a consumer given data in most partitions): the
                    # walk cost more than kio's reader; it is tried again after 1, 2, 4,
                    # ... 16 fetches decoded by kio, so such a consumer pays for it rarely.
                    self._reuse_backoff = min(2 * self._reuse_backoff or 1, REUSE_MAX_BACKOFF)
                    self._reuse_wait = self._reuse_backoff
                else:
                    self._reuse_backoff = 0
        if got is None:  # small, changed, or bytes the walk does not follow: kio's reader
            decoded = yield from codec.decode_request_body_in_ranges(
                h, request.frame, path=codec.FETCH_REQUEST_PARTITIONS, every=every
            )
            parts = None
        else:
            decoded, parts = got
        if self.closed:
            return decoded  # (closed between two slices of the decode: keeps nothing)
        # A fetch that took partitions from ``max_partitions_in_flight`` (``_claim``) keeps
        # its decode within the process's count of kept ones, which may make it forget it.
        kept = self.path.kept_decodes
        if self._claim:
            keep = kept.keep(self, self._claim)
        else:
            kept.drop(self)  # (the large one it may have kept is replaced)
            keep = True
        self._last_decoded = _Decoded(version, body, decoded, parts) if keep else None
        return decoded

    def forget_decode(self) -> None:
        """The process's count of kept decodes has no room for this connection's
        (``KeptDecodes``): its next fetch is decoded whole."""
        self._last_decoded = None

    def _decoding(self, request: ClientRequest, upstream: Upstream) -> Slices:
        """The head of the queue, a large request, decoded in slices; it starts next turn."""
        decoded = yield from self._decode_in_ranges(request, SLICE_PARTITIONS)
        if self.closed:
            return
        self._busy = False
        client = ClientFetch.validate(decoded)  # the one validation (its replica id)
        if client is None:  # a follower's: not ours to reshape
            self._queue.pop(0)
            self._give_back_claim()
            self._passthrough.handle_fetch(request, upstream)
        else:
            self._queue[0] = (request, client, self._queue[0][2])
        if self._waker is not None:
            self._waker()

    # -- the trio edge's part of relay.FetchHandler (proxy.server.connection) ----------

    def bind_waker(self, wake: Callable[[], None]) -> None:
        """*wake()* (sync, no I/O) asks the edge to call ``resume()`` from the connection's task."""
        self._waker = wake

    def resume(self) -> None:
        """Run the next slice of a large fetch, or start queued fetches that were waiting
        (for their turn, or for the memory budget); run the answers of preferred replicas
        that arrived (``read_replica``)."""
        if self.closed or self._upstream is None:
            return
        if self.replicas is not None:
            self.replicas.deliver()
        if self._slices is not None:
            self._step()
        else:
            self._serve(self._upstream)

    def written(self) -> None:
        """The responses answered so far have been written to the client: free their memory
        and their partitions (``max_partitions_in_flight``)."""
        pending, self._unwritten = self._unwritten, []
        for grant in pending:
            grant.release()
        partitions, self._unwritten_partitions = self._unwritten_partitions, 0
        if partitions:
            self.path.in_flight.give_back(partitions)

    def close_session(self, client_id: str | None, answered: Callable[[], None]) -> bool:
        """The client closed its connection: end the upstream fetch session, as Kafka's Java
        consumer does when it closes (``AbstractFetch.prepareCloseFetchSessionRequests``):
        a Fetch of the session at FINAL_EPOCH naming no partition, which makes the broker
        remove it from its cache at once rather than keep it, one of its
        ``max.incremental.fetch.session.cache.slots``, until it is evicted.  A broker
        answers a fetch of no partition at once.  False: no session upstream (or no
        upstream), nothing sent."""
        translator = self.translator
        upstream = self._upstream
        if self.closed or translator is None or upstream is None:
            return False
        session_id = translator.session.session_id
        version = translator.upstream_max_version
        if session_id == INVALID_SESSION_ID or version < MIN_SESSION_FETCH_VERSION:
            return False
        request = make(
            request_module(FETCH, version).FetchRequest,
            replica_id=-1,
            max_wait=timedelta(0),
            min_bytes=1,
            max_bytes=1,
            isolation_level=0,
            session_id=session_id,
            session_epoch=FINAL_EPOCH,
            topics=(),
            forgotten_topics_data=(),
        )
        upstream.send(
            codec.encode_request(request, 0, client_id),
            api_key=FETCH,
            api_version=version,
            on_response=lambda _frame: answered(),
        )
        return True

    def _give_back_claim(self) -> None:
        """The fetch that held ``_claim`` is dropped unanswered (a follower's, passed through)."""
        claim, self._claim = self._claim, None
        if claim:
            self.path.in_flight.give_back(claim)

    def close(self) -> None:
        """The connection ended: give back every byte this connection holds, now.

        The memory budget's grants, the reuse buffer, queued fetches, the client's
        fetch session (it leaves its listener's cache: Kafka's clients start a new
        session on a new connection), the upstream session's translator and its
        partition states.  The links back to the edge (the relay's upstream port,
        the waker, the preferred replicas' links) are cut, so nothing here waits for
        the cyclic GC: the relay holds this handler and the port holds the relay; the
        replicas' links hold this handler's ``wake`` and ``reserve_response``.
        """
        self.closed = True
        self.path.admission.leave(self)
        in_flight = self.path.in_flight
        in_flight.leave(self)
        exchange, self._exchange = self._exchange, None
        for grant in (*self._unwritten, exchange.grant if exchange else None):
            if grant is not None:
                grant.release()
        self._unwritten = []
        partitions = (self._claim or 0) + self._unwritten_partitions
        self._claim, self._unwritten_partitions = None, 0
        in_flight.give_back(partitions)
        self.shaper.close()
        self._queue.clear()
        self._slices = None
        self._last_decoded = None
        self.path.kept_decodes.drop(self)
        self._repeat = None
        self._waiting_for = None
        self.downstream.close()
        self.translator = None
        self._encoded = writers.Written()
        self._upstream = None
        self._waker = None
        self.replicas = None  # the edge's links hold this handler's wake and reserve

    def wake(self) -> None:
        """Budget may be free: retry the waiting fetch (via the edge's task when bound)."""
        if self._waker is not None:
            self._waker()
        else:
            self.resume()

    # -- the request, top-down ----------------------------------------------------------

    def _serve(self, upstream: Upstream) -> None:
        """Start queued fetches until one waits (a loop: no recursion per fetch)."""
        if self._starting or self._busy:
            return  # an outer _serve is draining the queue, or a fetch is being served
        self._starting = True
        try:
            while self._queue and not self._busy:
                request, client, named = self._queue[0]
                if self._claim is None:  # before its decode: max_partitions_in_flight
                    self._claim = self.path.in_flight.take(self, named)
                    if self._claim is None:
                        if not self._partitions_waiting:  # count each fetch once
                            self._partitions_waiting = True
                            self.effects.add(InFlightWait())
                        return  # woken (``wake``) when it may fit
                    self._partitions_waiting = False
                if client is None and self._repeat is not None:
                    if self._start_repeat(request, upstream):
                        continue  # (busy now: the loop ends)
                if client is None:  # not decoded yet
                    waker = self._waker
                    large = len(request.frame) > SLICE_BYTES and waker is not None
                    if waker is not None and large and self._decode_turn is not request:
                        self._decode_turn = request  # decoded in turns of its own, from
                        waker()  # the edge's wake loop (its lane), not on arrival
                        return
                    if large:  # decoded SLICE_PARTITIONS partitions a turn, then started
                        self._busy = True
                        self._run(self._decoding(request, upstream))
                        return
                    # the one validation (its replica id); the stages get the validated value
                    client = ClientFetch.validate(self._decode(request))
                    if client is None:  # a follower's: not ours to reshape
                        self._queue.pop(0)
                        self._give_back_claim()
                        self._passthrough.handle_fetch(request, upstream)
                        continue
                    self._queue[0] = (request, client, named)
                    if len(request.frame) > SLICE_BYTES and self._waker is not None:
                        self._waker()  # decoding was this turn's slice: the rest next turn
                        return
                policy, limits = self.path.select(request.header.client_id, self.listener)
                max_bytes = self._max_bytes(client, limits)
                self._queue.pop(0)
                self._fetches += 1
                self._busy = True
                self._repeat = None  # (set again when this one is answered from an idle session)
                grant = self.path.budget.reservation()  # nothing until a response arrives
                self._run(self._start(request, client, policy, limits, grant, upstream, max_bytes))
        finally:
            self._starting = False

    # -- the last fetch again ----------------------------------------------------------

    def _repeat_of(self, request: ClientRequest) -> _Repeat | None:
        """The remembered fetch (``_repeat``) when *request* is it again: the same body, version
        and client id, under the same settings, with nothing held for the client.

        A sessionless consumer with nothing new to read sends the very same Fetch
        again and again (every partition, the same offsets), and the proxy's upstream
        session answers each with nothing.  The answer the client got last time is
        then what it gets again, and every stage that walks its partitions (decode,
        the downstream context, shaping, the translator, the encode) would only
        remake it: compared as bytes, such a fetch goes upstream as the next epoch of
        the idle session, and an empty answer is replied with the last answer's bytes
        (``_answer_repeat``).  Any other answer runs the skipped stages then
        (``_stages_of_repeat``).
        """
        memo = self._repeat
        h = request.header
        offset = h.body_offset
        if (
            memo is None
            or offset is None
            or int(h.api_version) != memo.version
            or h.client_id != memo.client_id
            or self.path.config is not memo.config
            or self.rack is not None
            or len(self.shaper.buffer)
            or self.shaper.waiting
        ):
            return None
        translator = self.translator
        if translator is None or translator.use_sessions != memo.config.fetch_sessions:
            return None
        if self.path.select(h.client_id, self.listener) != (memo.policy, memo.limits):
            return None
        frame = request.frame
        if memo.session_id is not None:
            return memo if self._session_repeat(memo, frame, offset) else None
        if len(frame) - offset == len(memo.body):
            with memoryview(frame) as view:
                if view[offset:] == memo.body:
                    return memo
        # The same partitions in another order (librdkafka's rotation) are the same fetch.
        if memo.order_free is None or fetch_count.order_free(memo.version, frame, offset) != (
            memo.order_free
        ):
            return None
        return memo

    def _session_repeat(self, memo: _Repeat, frame: bytes, offset: int) -> bool:
        """Whether *frame* (its body at *offset*) is a session client's remembered fetch
        again: the same bytes but the session epoch, which is the one the session waits
        for.  A session client with nothing new to read sends an incremental fetch that
        names no partition, at the next epoch, round after round."""
        at = memo.epoch_at
        body = memo.body
        if len(frame) - offset != len(body):
            return False
        start = offset + at
        if frame[offset:start] != body[:at] or frame[start + 4 :] != body[at + 4 :]:
            return False
        assert memo.session_id is not None
        return self.downstream.expects(memo.session_id, memo.epoch_in(frame, offset))

    def _start_repeat(self, request: ClientRequest, upstream: Upstream) -> bool:
        """Serve the fetch at the head of the queue as the remembered one, when it is
        (``_repeat_of``) and the upstream session is still idle; False: it is not."""
        repeat = self._repeat_of(request)
        translator = self.translator
        step = None if repeat is None or translator is None else translator.repeat()
        if step is None or repeat is None:
            self._repeat = None
            return False
        self._queue.pop(0)
        self._fetches += 1
        self._busy = True
        self.shaper.limits = repeat.limits
        grant = self.path.budget.reservation()  # nothing until a response arrives
        self._exchange = _Exchange(
            request,
            None,
            grant,
            None,
            repeat.policy,
            self.path.clock(),
            repeat.session_id is None,
            large=repeat.large,
            limits=repeat.limits,
            repeat=repeat,
        )
        if not self._send_repeat(step, repeat, upstream):
            self._run(self._send_in_ranges(step, upstream))
        return True

    def _send_repeat(self, step: UpstreamFetch, repeat: _Repeat, upstream: Upstream) -> bool:
        """``_send_in_ranges`` for a repeat that continues the idle session: its last
        request's bytes, the 4 of the epoch new, sent at once (no stages to slice), and its
        answer checked for "nothing changed" as it arrives (``_repeat_answered``).  False:
        not that case (another session, a topic id to ask for); nothing was sent."""
        exchange = self._exchange
        request = step.request
        frame = repeat.upstream_frame
        at = repeat.upstream_epoch_at
        if (
            exchange is None
            or frame is None
            or at < 0
            or step.missing_topic_ids
            or int(request.session_id) != repeat.upstream_session_id
        ):
            return False
        frame = fetch_count.with_epoch_at(frame, at, int(request.session_epoch))
        exchange.upstream_request_bytes += len(frame)
        exchange.upstream_frame = frame
        version = repeat.upstream_version
        upstream.send(
            frame,
            api_key=FETCH,
            api_version=version,
            on_response=FrameCallback(partial(self._repeat_answered, version, upstream)),
        )
        return True

    def _repeat_answered(self, version: int, upstream: Upstream, frame: Frame) -> None:
        """The answer to ``_send_repeat``'s request: when it says nothing changed, the client
        gets its last answer again (``_answer_repeat``) with no stage run; any other goes
        through the stages (``_received``)."""
        exchange = self._exchange
        translator = self.translator
        if exchange is None or translator is None:
            return  # the connection closed meanwhile
        if exchange.repeat is not None and self._says_unchanged(translator, version, frame):
            exchange.upstream_response_bytes += len(frame)
            self._answer_repeat(exchange, exchange.repeat, upstream)
            return
        self._run(self._received(version, frame, upstream), defer=exchange.large)

    def _says_unchanged(self, translator: FetchTranslator, version: int, frame: Frame) -> bool:
        """Whether *frame* answers the repeat in flight with "nothing changed" (read from its
        bytes), which the translator then takes (``complete_unchanged``)."""
        session_id = translator.repeating
        if session_id is None:
            return False
        unchanged = self._unchanged_answer(version, session_id)
        return (
            len(frame) == 4 + len(unchanged)
            and frame[4:] == unchanged
            and translator.complete_unchanged()
        )

    def _unchanged_answer(self, version: int, session_id: int) -> bytes:
        """The bytes after the correlation id of a Fetch response of *version* that says
        nothing changed in session *session_id* (kio's encoding, kept for the last pair)."""
        key = (version, session_id)
        kept = self._unchanged
        if kept is None or kept[0] != key:
            mod = response_module(FETCH, version)
            empty = make(
                mod.FetchResponse,
                throttle_time=timedelta(0),
                error_code=0,
                session_id=session_id,
                responses=(),
            )
            kept = self._unchanged = (key, codec.encode_response(empty, 0)[4:])
        return kept[1]

    def _answer_repeat(self, exchange: _Exchange, repeat: _Repeat, upstream: Upstream) -> None:
        """Upstream said nothing changed: the client gets the last answer again (a session
        client's session takes the fetch first: its epoch moves on, as ``open`` would)."""
        request = exchange.request
        if repeat.session_id is not None and not self._next_idle_epoch(exchange, repeat, upstream):
            return
        self.repeats += 1
        self.effects.add(FetchRepeated())
        self._exchange = None
        self._hold_until_written(exchange.grant)
        self.effects.add(
            replaced(
                repeat.report,
                correlation_id=request.header.correlation_id,
                latency_ms=(self.path.clock() - exchange.started) * 1000.0,
                upstream_fetch_bytes=exchange.upstream_request_bytes
                + exchange.upstream_response_bytes,
            )
        )
        self._reply(
            request,
            None,
            upstream,
            sessionless=exchange.sessionless,
            exchange=exchange,
            encoded=repeat.answer,
        )

    def _next_idle_epoch(self, exchange: _Exchange, repeat: _Repeat, upstream: Upstream) -> bool:
        """A repeated session client's fetch taken by its session (``next_idle_epoch``);
        False when the session went meanwhile (evicted to make room for another
        connection's): the client then gets what ``open`` answers, the session error."""
        request = exchange.request
        offset = request.header.body_offset
        assert repeat.session_id is not None and offset is not None
        epoch = repeat.epoch_in(request.frame, offset)
        if self.downstream.next_idle_epoch(repeat.session_id, epoch, repeat.version):
            return True
        client = ClientFetch.validate(self._decode(request))
        opened = None if client is None else self.downstream.open(client)
        if not isinstance(opened, ClientReply):  # (only an error can have changed it)
            raise TranslationError("a repeated session fetch found its session changed")
        self._exchange = None
        self._hold_until_written(exchange.grant)
        self._reply(request, opened.response, upstream, sessionless=False)
        return False

    def _stages_of_repeat(
        self, exchange: _Exchange, repeat: _Repeat, upstream: Upstream
    ) -> Generator[None, None, bool]:
        """The stages a repeated fetch skipped on its way up (the downstream context and
        shaping's prepare), run when its answer is not empty; False: it ended here."""
        every = SLICE_PARTITIONS if exchange.large else 0
        # Decoded now, not kept from the fetch it repeats: a decoded fetch is about 110
        # times its bytes, and a large one's partitions were given back to
        # ``max_partitions_in_flight`` when it was answered.
        decoded = yield from self._decode_in_ranges(exchange.request, every)
        client = ClientFetch.validate(decoded)
        if self.closed:
            return False
        if client is None:  # (the same bytes as a consumer's fetch: a consumer's)
            raise TranslationError("a repeated fetch is a follower's")
        opened = yield from self.downstream.open_in_ranges(client, every)
        if self.closed:
            return False
        if isinstance(opened, ClientReply):  # (not for a sessionless fetch, which opens none)
            if self.translator is not None:
                self.translator.abort()
            self._exchange = None
            self._hold_until_written(exchange.grant)
            self._reply(
                exchange.request, opened.response, upstream, sessionless=exchange.sessionless
            )
            return False
        exchange.opened = opened
        fetch = _cap_wait(opened.request, self.path.config.max_upstream_wait_ms)
        max_bytes = self._max_bytes(client, repeat.limits)
        exchange.prepared = yield from _shape_in_ranges(
            self.shaper, fetch, exchange.grant, max_bytes, every
        )
        return not self.closed

    def _remember(
        self, exchange: _Exchange, frame: Gathered | bytes, report: ShapedReport, response: Any
    ) -> None:
        """Keep this answer for the same fetch again (``_repeat_of``) when it came from an
        idle upstream session (the translator's ``quiet``), with nothing held, trimmed or
        redirected, for a sessionless client, or for a session client's incremental fetch
        answered with no partition (*response*, the client's answer); the body and the
        answer at most ``DECODE_MEMO_MAX_BYTES`` each."""
        translator = self.translator
        prepared = exchange.prepared
        request = exchange.request
        offset = request.header.body_offset
        version = int(request.header.api_version)
        session_id, epoch_at = None, -1
        if not exchange.sessionless:
            opened = exchange.opened
            at = fetch_count.session_epoch_at(version)
            if (
                opened is None
                or not isinstance(opened.context, IncrementalFetchContext)
                or response is None
                or response.responses
                or at is None
            ):
                return
            session_id, epoch_at = opened.context.session.id, at
        if (
            translator is None
            or not translator.quiet
            or exchange.follow
            or exchange.rack is not None
            or exchange.redirects
            or exchange.limits is None
            or prepared is None
            or prepared.prefixes
            or not exchange.upstream_response_bytes
            or len(self.shaper.buffer)
            or self.shaper.waiting
            or offset is None
            or len(frame) > DECODE_MEMO_MAX_BYTES
            or len(request.frame) - offset > DECODE_MEMO_MAX_BYTES
        ):
            return
        h = request.header
        upstream_frame = exchange.upstream_frame
        upstream_version = epoch_in_frame = -1
        if upstream_frame is not None:
            upstream_version, epoch_in_frame = fetch_count.frame_epoch_at(upstream_frame)
        body = bytes(request.frame[offset:])
        order_free = None
        if session_id is None:
            order_free = fetch_count.order_free(version, request.frame, offset)
        else:  # its epoch is the one field a repeat changes: compared apart
            body = body[:epoch_at] + bytes(4) + body[epoch_at + 4 :]
        self._repeat = _Repeat(
            version=version,
            client_id=h.client_id,
            body=body,
            order_free=order_free,
            policy=exchange.policy,
            limits=exchange.limits,
            answer=frame if isinstance(frame, bytes) else frame.join(),
            report=report,
            config=self.path.config,
            large=exchange.large,
            upstream_frame=upstream_frame,
            upstream_session_id=translator.session.session_id,
            upstream_epoch_at=epoch_in_frame,
            upstream_version=upstream_version,
            session_id=session_id,
            epoch_at=epoch_at,
        )

    def _run(self, work: Slices, *, defer: bool = False) -> None:
        """Run a fetch's stages: at once, or one slice per loop turn when they yield.

        Without an edge to come back through (no waker), every slice runs now.
        *defer*: even the first slice waits for the edge's next turn (a large upstream
        frame is not decoded in the upstream loop's turn that read it).
        """
        if self._waker is None:
            for _ in work:
                pass
            return
        self._slices = work
        if defer:
            self._waker()
        else:
            self._step()

    def _step(self) -> None:
        """One slice of the fetch being sliced; the edge's next turn runs the next."""
        work = self._slices
        assert work is not None and self._waker is not None
        try:
            next(work)
        except StopIteration:
            if self._slices is work:  # (a next fetch may have started in its last slice)
                self._slices = None
            return
        self.slices += 1
        self._waker()

    def _max_bytes(self, client: ClientFetch, limits: Limits) -> int:
        """The most record bytes the fetch may ask upstream for (``FetchAdmission.fetch_bytes``).

        Nothing is reserved for it: memory is taken when the response's size is
        known (``reserve_response``), so a long poll waiting upstream holds none.
        """
        # The most the response can carry: each partition the fetch covers (an
        # incremental fetch also covers its session's), at most its max_bytes.
        decoded = client.request
        extra: list[int] = []
        known = client.session_epoch <= 0  # a full fetch lists them all
        if not known:
            session = self.downstream.session
            if session is not None and session.id == client.session_id:
                # else the session error is answered without upstream
                extra = [cp.max_bytes for cp in session.partitions.values()]
                known = True
        return self._max_bytes_of(decoded, limits, extra=extra, known=known)

    def _max_bytes_of(
        self, request: Any, limits: Limits, *, extra: list[int] | None = None, known: bool = True
    ) -> int:
        """``_max_bytes`` of *request* (a full fetch, every partition it covers listed, unless
        *extra* gives the max_bytes of the session partitions it does not repeat; *known*
        False: what its response can carry is not known)."""
        sizes = [int(p.partition_max_bytes) for t in request.topics for p in t.partitions]
        most = response_bound(
            sizes + (extra or []), self.path.budget.floor, limits.max_partition_bytes
        )
        return self.path.admission.fetch_bytes(
            int(request.max_bytes), limits.max_response_bytes, most_bytes=most if known else None
        )

    def reserve_response(self, nbytes: int) -> bool:
        """The edge knows the size of the Fetch response it is about to read (its length
        prefix): take *nbytes* of memory budget for it before reading its body.

        False: the budget cannot take it now (or others wait and this connection holds
        its fair share): the edge stops reading this upstream connection until ``wake``
        says budget was released, then asks again (KIP-72's muted channel).  Every
        connection's reuse buffer is dropped before a response is made to wait.
        """
        exchange = self._exchange
        if exchange is None or self.closed:
            return True  # no fetch of ours awaits it (a pass-through fetch: no budget)
        admission = self.path.admission
        held = exchange.grant.nbytes + sum(g.nbytes for g in self._unwritten)
        taken = admission.take(self, exchange.grant, nbytes, held=held)
        if not taken and self.path.shed_buffers():
            taken = admission.take(self, exchange.grant, nbytes, held=held)
        if taken:
            admission.leave(self)
            self._waiting_for = None
            exchange.response_reserved += nbytes
            return True
        retry = self._waiting_for is exchange.request
        if not retry:  # count each response once, not each retry
            self._waiting_for = exchange.request
            self.budget_waits += 1
            self.effects.add(BudgetWait())
        admission.wait(self, retry=retry, nbytes=nbytes)
        return False

    def _start(
        self,
        request: ClientRequest,
        client: ClientFetch,
        policy: str,
        limits: Limits,
        grant: Reservation,
        upstream: Upstream,
        max_bytes: int,
    ) -> Slices:
        """The request's stages; a large fetch yields between them (see ``_run``)."""
        started = self.path.clock()
        sessionless = client.sessionless
        translator = self._translator(client.version)
        opened = yield from self.downstream.open_in_ranges(client, SLICE_PARTITIONS)
        if isinstance(opened, ClientReply):  # a session error, answered as a broker does
            self._hold_until_written(grant)
            self._reply(request, opened.response, upstream, sessionless=sessionless)
            return
        large = opened.covered > SLICE_PARTITIONS
        self._exchange = exchange = _Exchange(
            request,
            opened,
            grant,
            None,
            policy,
            started,
            sessionless,
            large=large,
            limits=limits,
        )
        if large:
            yield
            if self.closed:
                return
        fetch, prepared = opened.request, None
        translator.use_sessions = self.path.config.fetch_sessions
        fetch = _cap_wait(fetch, self.path.config.max_upstream_wait_ms)
        step = None
        if self.rack is not None and self.rack.rack:
            fetch, step = self._with_rack(request, fetch, self.rack)
        follows = self._follows(int(request.header.api_version))
        if self.path.shaping:
            self.shaper.limits = limits
            every = SLICE_PARTITIONS if large else 0
            # (the upstream request is built below, if the fetch goes up)
            prepared = yield from _shape_in_ranges(
                self.shaper, fetch, grant, max_bytes, every, upstream=False
            )
            # A fetch naming a rack may be sent to a preferred read replica (KIP-392): the
            # leader's answer must reach the client as the leader gives it, so it goes up.
            redirectable = follows or bool(getattr(fetch, "rack_id", "") or "")
            held = None
            if not redirectable:
                held = yield from self.shaper.held_answer_in_ranges(prepared, every)
            if held is not None:
                # Held data fills the response: answered with no upstream round (the
                # upstream session learns the offsets from the next fetch it is given).
                exchange.prepared, exchange.rack = prepared, step
                yield from self._complete(exchange, held, upstream, held=True)
                return
            if large:
                yield
                if self.closed:
                    return
            # The upstream rotation orders a full fetch; an incremental one is in the
            # broker's session order whatever its own (a replica's link may be new: the
            # fetch it gets stays rotated).
            rotate = follows or not translator.continues_session
            prepared = yield from _upstream_in_ranges(self.shaper, prepared, every, rotate=rotate)
            fetch = prepared.upstream_request
        exchange.prepared, exchange.rack = prepared, step
        if follows:
            exchange.follow = True
            self.read_replicas.retain(read_replica.requested_keys(opened.request))
            self.watermarks.retain(read_replica.requested_keys(opened.request))
            plan = exchange.plan = self._split(fetch)
            if plan.replicas:
                self._send_replicas(exchange, plan)
                if plan.leader is None:
                    return  # every partition goes to a replica
                fetch = plan.leader
        begun = yield from translator.begin_in_ranges(fetch, SLICE_PARTITIONS if large else 0)
        if large:
            yield
            if self.closed:
                return
        yield from self._send_in_ranges(begun, upstream)

    def _send(self, step: UpstreamFetch, upstream: Upstream) -> None:
        """``_send_in_ranges`` at once."""
        for _ in self._send_in_ranges(step, upstream):
            pass

    def _send_in_ranges(self, step: UpstreamFetch, upstream: Upstream) -> Slices:
        """Encode the upstream session's next request and send it, as the client that asked.

        A large fetch's request is encoded ``SLICE_PARTITIONS`` partitions a slice.

        Everything the proxy sends on a client's connection carries that client's
        own client id (the header of the fetch being served), so the broker's quotas,
        request logs and client metrics see the client, not the proxy.
        """
        exchange = self._exchange
        assert exchange is not None
        client_id = exchange.request.header.client_id
        self._ask_topic_ids(step.missing_topic_ids, upstream, client_id)
        version = int(step.request.__version__)
        upstream_request = step.request
        if (
            exchange.follow
            and self.rack is not None
            and version >= rack_fetch.MIN_RACK_VERSION
            and not upstream_request.rack_id
        ):  # the leader is asked with the proxy's rack: the proxy follows its redirect
            upstream_request = dataclasses.replace(upstream_request, rack_id=self.rack.rack)
        # (A repeat's next epoch goes out as bytes from ``_send_repeat``; whatever comes here,
        # a resend after a session error at the same session id included, is encoded.)
        frame = yield from codec.encode_request_in_ranges(
            upstream_request,
            0,
            client_id,
            path=codec.FETCH_REQUEST_PARTITIONS,
            every=SLICE_PARTITIONS if exchange.large else 0,
        )
        if self.closed:
            return
        exchange.upstream_request_bytes += len(frame)
        exchange.upstream_frame = frame

        large = exchange.large

        def on_response(frame: Frame) -> None:
            self._run(self._received(version, frame, upstream), defer=large)

        # The answer as read (a large one in place: its records are views of that buffer).
        upstream.send(
            frame, api_key=FETCH, api_version=version, on_response=FrameCallback(on_response)
        )

    # -- the response, bottom-up --------------------------------------------------------

    def _received(self, version: int, frame: Frame, upstream: Upstream) -> Slices:
        """The response's stages; a large fetch yields between them (see ``_run``)."""
        exchange = self._exchange
        translator = self.translator
        if exchange is None or translator is None:
            return  # the connection closed meanwhile
        exchange.upstream_response_bytes += len(frame)
        if exchange.repeat is not None and self._says_unchanged(translator, version, frame):
            self._answer_repeat(exchange, exchange.repeat, upstream)
            return
        response = yield from decode_fetch_response_in_ranges(
            version, frame, SLICE_PARTITIONS if exchange.large else 0
        )
        if exchange.repeat is not None:
            if translator.complete_quiet(response):
                self._answer_repeat(exchange, exchange.repeat, upstream)
                return
            # Something changed upstream: the stages the repeat skipped run now, and the
            # answer goes the usual way (the translator takes it as a ``begin``'s).
            started = yield from self._stages_of_repeat(exchange, exchange.repeat, upstream)
            if not started:
                return
        if exchange.follow:
            exchange.leader_redirects = self._client_keys(
                rack_fetch.redirects(response), int(exchange.request.header.api_version)
            )
        if exchange.large:
            yield
            if self.closed:
                return
        invalid_before = translator.stats.invalid_responses
        step = yield from translator.complete_in_ranges(
            response, SLICE_PARTITIONS if exchange.large else 0
        )
        self._count_reset(response, translator.stats.invalid_responses > invalid_before)
        if isinstance(step, UpstreamFetch):
            # a resend after an upstream session reset: the answer dropped gives its memory back
            exchange.grant.resize(max(0, exchange.grant.nbytes - exchange.response_reserved))
            exchange.response_reserved = 0
            yield from self._send_in_ranges(step, upstream)
            return
        if exchange.ahead is not None:
            self._hold_ahead(exchange, step.response, upstream)
            return
        if exchange.follow:
            exchange.leader_answer, exchange.leader_done = step.response, True
            self._merge_when_answered(exchange)
            return
        yield from self._complete(exchange, step.response, upstream)

    def _complete(
        self, exchange: _Exchange, full: Any, upstream: Upstream, *, held: bool = False
    ) -> Slices:
        """The full answer to the exchange's fetch (from upstream, or *held*: made of held
        data by ``FetchShaper.held_answer``): shape it and answer."""
        shaped: ShapedResponse | None = None
        if exchange.prepared is not None and int(getattr(full, "error_code", 0)) == 0:
            if exchange.large:
                yield
                if self.closed:
                    return
            shaped = yield from self.shaper.finish_in_ranges(
                exchange.prepared, full, SLICE_PARTITIONS if exchange.large else 0, held=held
            )
            full = shaped.response
        if self.rack is not None and exchange.rack is not None:
            # a redirect the proxy followed itself is counted too (``exchange.redirects``)
            exchange.redirects = self.rack.answered(full) or exchange.redirects
        if exchange.large:
            yield
            if self.closed:
                return
        assert exchange.opened is not None  # (a repeat's stages ran before: _stages_of_repeat)
        reply = yield from self.downstream.answer_in_ranges(
            exchange.opened, full, SLICE_PARTITIONS if exchange.large else 0
        )
        if exchange.large:
            yield
            if self.closed:
                return
        # Encoded as a gather list (see ``_reply``), SLICE_PARTITIONS partitions a slice.
        encoded = yield from codec.encode_response_gathered_in_ranges(
            upstream.rewrite_decoded(reply),
            exchange.request.header.correlation_id,
            path=codec.FETCH_RESPONSE_PARTITIONS,
            every=SLICE_PARTITIONS if exchange.large else 0,
            remember=self._encoded,
        )
        if self.closed:
            return
        self._exchange = None  # (until now close() gives its grant back)
        self._hold_until_written(exchange.grant)
        self._reply(
            exchange.request,
            reply,
            upstream,
            sessionless=exchange.sessionless,
            exchange=exchange,
            shaped=shaped,
            encoded=encoded,
        )

    def _reply(
        self,
        request: ClientRequest,
        response: Any,
        upstream: Upstream,
        *,
        sessionless: bool,
        exchange: _Exchange | None = None,
        shaped: ShapedResponse | None = None,
        encoded: Gathered | bytes | None = None,
    ) -> None:
        """Encode *response* for the client (unless *encoded* already is), answer, account,
        and start the next fetch."""
        h = request.header
        # Encoded as a gather list: the records stay views into the upstream frame
        # until they are written, never copied into a second response-sized buffer.
        frame = encoded
        if frame is None:
            frame = codec.encode_response_gathered(
                upstream.rewrite_decoded(response), h.correlation_id
            )
        request.reply(frame)
        # Its partitions go back once the answer is written (``written``), as its grant.
        claim, self._claim = self._claim or 0, None
        if self._waker is None:
            self.path.in_flight.give_back(claim)  # no edge to tell us when it is written
        else:
            self._unwritten_partitions += claim
        up_request = up_response = 0
        if exchange is not None:
            up_request = exchange.upstream_request_bytes
            up_response = exchange.upstream_response_bytes
            if shaped is not None:
                report = self._report(exchange, shaped, len(frame))
                self.effects.add(report)
                self._remember(exchange, frame, report, response)
        self.upstream_fetch_bytes += up_request + up_response
        self.client_fetch_bytes += len(request.frame) + len(frame)
        if sessionless:
            # What the client's full fetch would have cost upstream, minus what it did.
            self.effects.add(
                SessionSaved(
                    request_bytes=max(0, len(request.frame) - up_request),
                    response_bytes=max(0, len(frame) - up_response),
                )
            )
        self._busy = False
        ended_at = self._ended_at
        if shaped is not None and shaped.next_offsets:
            self._ended_at = shaped.next_offsets
        self._serve(upstream)
        if not self._busy and exchange is not None and shaped is not None:
            self._run_ahead(exchange, shaped, upstream, ended_at)

    # -- running ahead of the client ----------------------------------------------------

    def _run_ahead(
        self,
        exchange: _Exchange,
        shaped: ShapedResponse,
        upstream: Upstream,
        ended_at: Mapping[PartitionKey, int] | None,
    ) -> None:
        """After an answer that delivered at least ``RUN_AHEAD_MIN_BYTES``, with no fetch of
        the client's waiting: fetch what it will ask next (``FetchShaper.ahead_request``)
        into the reuse buffer, as the Java consumer fetches ahead of ``poll``; the client's
        next fetch is then answered from it with no upstream round
        (``FetchShaper._ahead_enough``).  Not for a fetch that follows redirects or names
        a rack, nor a large one, nor one under record limits (those run ahead by
        trimming: ``FetchShaper._ahead``), nor for a client that seeks (``_reads_on``:
        *ended_at* is where the answer with data before this one left it)."""
        config = self.path.config
        opened = exchange.opened
        if (
            not config.run_ahead
            or self.closed
            or opened is None
            or exchange.follow
            or exchange.rack is not None
            or exchange.large
            or exchange.prepared is None
            or shaped.decision.delivered_bytes < RUN_AHEAD_MIN_BYTES
            or exchange.limits is None
            or exchange.limits.max_records is not None
            or exchange.limits.max_partition_records is not None
            or bool(getattr(opened.request, "rack_id", None))
            or not _reads_on(exchange.prepared.client_offsets, ended_at)
        ):
            return
        max_bytes = self._max_bytes_of(opened.request, exchange.limits)
        if not self.path.admission.room_ahead(max_bytes):
            return  # the budget is for what clients ask: only spare room runs ahead
        planned = self.shaper.ahead_request(opened.request, shaped.next_offsets, max_bytes)
        if planned is None:
            return
        fetch, where = planned
        translator = self._translator(int(exchange.request.header.api_version))
        grant = self.path.budget.reservation()
        self._exchange = _Exchange(
            exchange.request,
            opened,
            grant,
            None,
            exchange.policy,
            self.path.clock(),
            exchange.sessionless,
            limits=exchange.limits,
            ahead=where,
            ahead_bytes=max_bytes,
        )
        self._busy = True
        self._repeat = None
        self.ahead_rounds += 1

        def steps() -> Slices:
            begun = yield from translator.begin_in_ranges(fetch, 0)
            yield from self._send_in_ranges(begun, upstream)

        self._run(steps())

    def _hold_ahead(self, exchange: _Exchange, full: Any, upstream: Upstream) -> None:
        """The run-ahead round's answer goes to the reuse buffer; the client's fetches go on."""
        assert exchange.ahead is not None
        self._exchange = None
        kept = self.shaper.hold_ahead(full, exchange.ahead, exchange.grant, exchange.ahead_bytes)
        exchange.grant.release()  # what the buffer did not keep
        self.upstream_fetch_bytes += (
            exchange.upstream_request_bytes + exchange.upstream_response_bytes
        )
        self.effects.add(
            RanAhead(self.node_id, kept.upstream_records, kept.upstream_bytes, kept.held_bytes)
        )
        self._busy = False
        self._serve(upstream)

    # -- helpers ------------------------------------------------------------------------

    def _hold_until_written(self, grant: Reservation) -> None:
        """Keep a fetch's grant until the edge has written its response (``written``)."""
        if self._waker is None:
            grant.release()  # no edge to tell us when it is written
        else:
            self._unwritten.append(grant)

    def set_rack(self, rack: str) -> None:
        """A reload set the ``rack`` setting to *rack*: this connection's next fetches use it
        (empty: none; a connection whose client ignored redirects stays without)."""
        if self.rack is not None:
            self.rack.rack = rack
        elif rack:
            self.rack = self._passthrough.rack = rack_fetch.RackFetch(rack)

    def _with_rack(
        self, request: ClientRequest, fetch: Any, rack: rack_fetch.RackFetch
    ) -> tuple[Any, rack_fetch.RackStep]:
        """*fetch* (the full fetch this exchange covers) with the rack to send upstream."""
        if rack.asked(rack_fetch.requested(fetch)):
            self.effects.add(ReplicaFallback(FallbackReason.CLIENT_IGNORES_REDIRECT))
        h = request.header
        if (
            int(h.api_version) < rack_fetch.MIN_RACK_VERSION
            and not self._old_version_counted
            and not self._follows(int(h.api_version))
        ):
            self._old_version_counted = True
            self.effects.add(ReplicaFallback(FallbackReason.OLD_FETCH_VERSION))
        own = str(getattr(fetch, "rack_id", "") or "")
        override = bool(own) and rack_override(
            self.path.config.policies, h.client_id, self.listener
        )
        step = rack.step(own, override=override, client_version=int(h.api_version))
        if step.set_by_proxy:
            fetch = dataclasses.replace(fetch, rack_id=step.rack_id)
        return fetch, step

    # -- following preferred read replicas (proxy.relay.read_replica) ------------------

    def _follows(self, client_version: int) -> bool:
        """Whether the proxy follows redirects for this fetch: it has a rack and replica
        connections, and the client cannot (v10-) or does not (it ignored redirects)."""
        rack = self.rack
        if rack is None or not rack.rack or self.replicas is None:
            return False
        if client_version >= rack_fetch.MIN_RACK_VERSION and not rack.stopped:
            return False
        if self.authenticated:
            if not self._authenticated_counted:
                self.effects.add(ReplicaFallback(FallbackReason.CLIENT_AUTHENTICATED))
            self._authenticated_counted = True
            return False
        return True

    def _split(self, fetch: Any) -> read_replica.FetchSplit:
        replicas = self.replicas
        assert replicas is not None
        routes, dropped = self.read_replicas.routes(
            read_replica.requested_keys(fetch),
            self.path.clock(),
            available=replicas.available,
            in_sync=self.path.racks.in_sync,
        )
        self._fell_back(reason for _, reason in dropped)
        return read_replica.split(fetch, routes)

    def _send_replicas(self, exchange: _Exchange, plan: read_replica.FetchSplit) -> None:
        replicas = self.replicas
        assert replicas is not None and self.rack is not None
        client_id = exchange.request.header.client_id
        client_version = int(exchange.request.header.api_version)
        for node, part in plan.replicas.items():
            request = read_replica.replica_request(part, self.rack.rack)
            version = int(request.__version__)
            frame = codec.encode_request(request, 0, client_id)
            exchange.upstream_request_bytes += len(frame)

            def answered(frame: Frame, node: int = node, version: int = version) -> None:
                answer = None
                try:
                    answer = read_replica.as_version(
                        decode_fetch_response(version, frame), client_version
                    )
                except DecodeError:
                    pass
                exchange.upstream_response_bytes += len(frame)
                exchange.replica_answers[node] = answer
                self._merge_when_answered(exchange)

            def failed(node: int = node) -> None:
                exchange.replica_answers[node] = None
                self._merge_when_answered(exchange)

            replicas.send(node, frame, api_version=version, on_response=answered, on_failure=failed)

    def _merge_when_answered(self, exchange: _Exchange) -> None:
        """Once every part of a followed fetch is answered: merge them and answer the client."""
        plan = exchange.plan
        upstream = self._upstream
        if self._exchange is not exchange or plan is None or upstream is None:
            return  # the connection closed meanwhile
        if plan.leader is not None and not exchange.leader_done:
            return
        if any(node not in exchange.replica_answers for node in plan.replicas):
            return
        merged = read_replica.merge(
            plan,
            exchange.leader_answer,
            exchange.replica_answers,
            watermarks=self.watermarks,
            read_replicas=self.read_replicas,
            now=self.path.clock(),
            leader_redirects=exchange.leader_redirects,
        )
        self._fell_back(fallback.reason for fallback in merged.fallbacks)
        exchange.served_by = {key: node for key, node, _ in merged.served if node is not None}
        if merged.redirects:
            exchange.redirects = merged.redirects
        self._run(self._complete(exchange, merged.response, upstream))

    def _client_keys(
        self, found: Mapping[PartitionKey, int], client_version: int
    ) -> dict[PartitionKey, int]:
        """Redirects keyed as the upstream answer named topics, keyed as the client does."""
        out: dict[PartitionKey, int] = {}
        ids = self.path.topic_ids
        for (topic, partition), node in found.items():
            key: TopicKey = topic
            if client_version >= FIRST_TOPIC_ID_VERSION and isinstance(topic, str):
                key = ids.id_for(topic)
            elif client_version < FIRST_TOPIC_ID_VERSION and isinstance(topic, uuid.UUID):
                key = ids.name_for(topic)
            if key is not None:
                out[(key, partition)] = node
        return out

    def _translator(self, client_version: int) -> FetchTranslator:
        if self.translator is None:
            self.translator = FetchTranslator(
                self.path.topic_ids,
                upstream_max_version=self.upstream_fetch_max or client_version,
                max_resends=self.max_resends,
                sessionless_backoff=self.sessionless_backoff,
            )
        return self.translator

    def _fell_back(self, reasons: Iterable[FallbackReason]) -> None:
        """Partitions sent back to their leader: one effect per reason, with its count."""
        counts: dict[FallbackReason, int] = {}
        for reason in reasons:
            counts[reason] = counts.get(reason, 0) + 1
        for reason, count in counts.items():
            self.effects.add(ReplicaFallback(reason, count))

    def _count_reset(self, response: Any, invalid: bool) -> None:
        reason = RESET_REASONS.get(int(getattr(response, "error_code", 0)))
        if reason is None and invalid:
            reason = ResetReason.OTHER
        if reason is not None:
            self.effects.add(SessionReset(Side.UPSTREAM, reason))

    def _ask_topic_ids(
        self, names: tuple[str, ...], upstream: Upstream, client_id: str | None
    ) -> None:
        request = self.topic_id_requests.request(
            names, fetch_number=self._fetches, upstream_max_version=self.upstream_metadata_max
        )
        if request is None:
            return
        version = int(request.__version__)
        upstream.send(
            codec.encode_request(request, 0, client_id),
            api_key=METADATA,
            api_version=version,
            on_response=lambda frame: self.topic_id_requests.answered(version, frame),
        )

    def _learn_versions(self, api_version: int, frame: bytes) -> None:
        try:
            _, response = codec.decode_response(API_VERSIONS, api_version, frame)
        except DecodeError:
            return
        if int(response.error_code) != 0:
            return
        for entry in response.api_keys:
            if int(entry.api_key) == FETCH:
                self.upstream_fetch_max = int(entry.max_version)
            elif int(entry.api_key) == METADATA:
                self.upstream_metadata_max = int(entry.max_version)

    def _report(
        self, exchange: _Exchange, shaped: ShapedResponse, reply_bytes: int
    ) -> ShapedReport:
        """One shaped response, as the value the edge feeds to the metrics and the decision log."""
        request = exchange.request
        h = request.header
        d = shaped.decision
        # where the bytes came from: this connection's broker served every partition
        served_by = exchange.served_by or {}
        usage = account(
            self.path.racks,
            (
                (key, served_by.get(key, self.node_id), o.upstream_bytes)
                for key, o in shaped.result.outcomes.items()
                if o.upstream_bytes or key in served_by
            ),
        )
        # record batches from the broker vs to the client (batch headers, never payloads)
        if served_by:  # a preferred replica served some partitions
            by_node: dict[int | None, list[int]] = {}
            for key, o in shaped.result.outcomes.items():
                n = by_node.setdefault(served_by.get(key, self.node_id), [0, 0])
                n[0] += o.upstream_records
                n[1] += o.upstream_bytes
            upstream = tuple(UpstreamData(node, r, b) for node, (r, b) in by_node.items())
        else:
            upstream = (UpstreamData(self.node_id, d.upstream_records, d.upstream_bytes),)
        prepared = exchange.prepared
        return ShapedReport(
            decision=d,
            client_id=h.client_id,
            node_id=self.node_id,
            policy=exchange.policy,
            correlation_id=h.correlation_id,
            latency_ms=(self.path.clock() - exchange.started) * 1000.0,
            upstream=upstream,
            rack_usage=usage,
            redirected_to=tuple(exchange.redirects.values()) if exchange.redirects else (),
            reuse_hits=tuple(p.run.size for p in prepared.prefixes.values())
            if prepared is not None
            else (),
            starvation_rounds=tuple(r for r in shaped.served_after.values() if r),
            starved_partitions={k: v for k, v in self.shaper.serve_rotation.starved().items() if v}
            if d.partitions_starved and self.path.starved_detail
            else None,
            upstream_fetch_bytes=exchange.upstream_request_bytes + exchange.upstream_response_bytes,
            sessionless_fetch_bytes=_sessionless_estimate(request, d, reply_bytes)
            if exchange.sessionless
            else None,
            topic_ids=self.path.topic_ids,  # names for Fetch v13+ topic ids
            cross_zone_price_per_gb=self.path.config.cross_zone_price_per_gb,
        )


def _cap_wait(fetch: Any, max_wait_ms: int) -> Any:
    """*fetch* long-polling upstream at most *max_wait_ms* (``max_upstream_wait_ms``).

    A broker may answer a fetch before its max_wait (that is all a cap does to
    the client: an empty answer sooner, and one more round of its long poll), so
    a poll the proxy sends ends within the Java consumer's fetch.max.wait.ms by
    default, however long the client asked for.
    """
    cap = timedelta(milliseconds=max_wait_ms)
    if fetch.max_wait <= cap:
        return fetch
    return dataclasses.replace(fetch, max_wait=cap)


def _shape_in_ranges(
    shaper: FetchShaper,
    request: Any,
    grant: Reservation,
    max_bytes: int,
    every: int,
    *,
    upstream: bool = True,
) -> Generator[None, None, PreparedFetch]:
    """Shaping's way up: the sessionless full fetch -> the one to serve upstream (its
    prepare yields after every *every* partitions of its walks, 0: never).  *upstream*
    False: the upstream request is left to ``_upstream_in_ranges`` (not needed for an
    answer from held data)."""
    # The client no longer fetches what its full fetch does not list (forget_unlisted).
    prepared = yield from shaper.prepare_in_ranges(
        request, every, grant=grant, max_bytes=max_bytes, upstream=upstream, forget_unlisted=True
    )
    return _no_long_poll(prepared) if upstream else prepared


def _upstream_in_ranges(
    shaper: FetchShaper, prepared: PreparedFetch, every: int, *, rotate: bool
) -> Generator[None, None, PreparedFetch]:
    """*prepared*'s upstream request, built (``FetchShaper.upstream_in_ranges``)."""
    prepared = yield from shaper.upstream_in_ranges(prepared, every, rotate=rotate)
    return _no_long_poll(prepared)


def _no_long_poll(prepared: PreparedFetch) -> PreparedFetch:
    upstream = prepared.upstream_request
    if prepared.prefixes and upstream.max_wait != timedelta(0):
        # The client gets data at once from the buffer: no long poll upstream.
        upstream = dataclasses.replace(upstream, max_wait=timedelta(0))
        prepared = dataclasses.replace(prepared, upstream_request=upstream)
    return prepared


def _sessionless_estimate(request: ClientRequest, d: ShapingDecision, reply_bytes: int) -> int:
    """What this exchange would cost upstream without a session (decision-log field).

    A sessionless client's request lists every partition, as a full upstream
    request would; the full response is the reply with the record bytes that
    came from upstream in place of those delivered (the limits trimmed them).
    """
    full_response = reply_bytes - d.delivered_bytes + d.upstream_bytes
    return len(request.frame) + max(0, full_response)
