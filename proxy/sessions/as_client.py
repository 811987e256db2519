"""The upstream half: full fetches served through one incremental session with the broker.

librdkafka, aiokafka and sarama list every partition in every Fetch and get
every partition back.  ``FetchTranslator`` (one per upstream connection) turns
each such full fetch into the next request of a KIP-227 session upstream, and
each upstream response back into the *complete* full response a sessionless
broker would have given: partitions the incremental response left out are
filled in from ``PartitionStateCache`` (see there for why that is exact).

The session mirrors the client: partitions the client stops listing are
forgotten upstream, new ones are added, and a changed fetch offset, log start
offset, partition max bytes or leader epoch is sent as an altered partition, so
the broker never returns data the client did not ask for.

Versions: the client may speak Fetch v4-v18; the upstream request uses the
highest version the upstream supports (``upstream_max_version``), except that a
client on topic names whose topics have no known id yet makes the request use
v12 (names) and reports the names in ``UpstreamFetch.missing_topic_ids`` so the
fetch path can ask upstream Metadata for them (rate-limit that: a topic that does not
exist never gets an id).

Two differences from a sessionless broker remain, both shared with Kafka's own
Java client: when the response-level max_bytes runs out, the broker fills
partitions in session order (which rotates partitions that returned data to
the end, KIP-227) instead of the client's order; and the last stable offset of
an omitted partition is the last one reported, since the broker does not
include a partition for a changed LSO alone (on a real broker the LSO moves
with a transaction marker, which also moves the high watermark).

Usage, per upstream connection and one client fetch at a time::

    step = translator.begin(client_request)      # -> UpstreamFetch
    while True:
        send step.request upstream, decode the response at step.request.__version__
        step = translator.complete(response)     # -> UpstreamFetch | ClientReply
        if isinstance(step, ClientReply):
            answer the client with step.response (already at the client's version)
            break

``complete`` asks for a resend when the session had to be reset (session
errors, responses that break the session rules); after ``max_resends`` resends
the client gets the error.  If the upstream connection fails, call ``abort``.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from types import ModuleType
from typing import Any

from kio.schema.errors import ErrorCode

from ..protocol.apis import FETCH
from ..protocol.codec import drain
from ..protocol.error_codes import (
    FETCH_SESSION_ERRORS,
    INCONSISTENT_TOPIC_ID,
    TOPIC_AUTHORIZATION_FAILED,
    UNKNOWN_SERVER_ERROR,
    UNKNOWN_TOPIC_ID,
    UNKNOWN_TOPIC_OR_PARTITION,
)
from ..protocol.messages import (
    convert,
    field_names,
    make,
    replaced,
    request_module,
    response_module,
)
from ..protocol.partition_key import PartitionKey, TopicKey, partition_name
from ..protocol.partition_plan import PartitionPlan, fetch_partition, plan_of
from ..protocol.partition_result import empty_entry, result_of
from .as_client_session import FetchSessionClient, SessionRequest, Verdict
from .client_fetch import (
    ClientReply,
    TranslationError,
    consumer_fetch,
    group_runs,
    topic_entries_in_ranges,
)
from .kip227 import (
    FIRST_TOPIC_ID_VERSION,
    LAST_TOPIC_NAME_VERSION,
    MAX_VERSION,
    MIN_CLIENT_VERSION,
    MIN_SESSION_VERSION,
)
from .partition_cache import PartitionStateCache
from .topic_ids import TopicIdMap

READ_COMMITTED = 1
_PRE_READ_ERRORS = frozenset(
    {UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID, TOPIC_AUTHORIZATION_FAILED}
)
"""Errors KafkaApis.handleFetchRequest gives before reading (its ``erroneous`` partitions)."""


def is_sessionless_fetch(request: Any) -> bool:
    """True for a Fetch (v4+) that does not use a fetch session.

    v7+ clients without sessions send session id 0 and epoch -1 (FINAL): every
    request is a full fetch, and the broker must not create a session.  Whose fetch
    it is was settled once, when the client's was decoded
    (``client_fetch.ClientFetch.validate``): the translator is given the sessionless
    full fetch ``as_broker`` built from a consumer's (replica id -1), so the replica
    id is not read again here.
    """
    version = int(request.__version__)
    if int(request.__api_key__) != FETCH or version < MIN_CLIENT_VERSION:
        return False
    if version >= MIN_SESSION_VERSION:
        return int(request.session_id) == 0 and int(request.session_epoch) == -1
    return True


@dataclass(frozen=True, slots=True)
class UpstreamFetch:
    """Send ``request`` (a kio FetchRequest) to the upstream broker."""

    request: Any
    missing_topic_ids: tuple[str, ...] = ()
    """Topic names whose ids are unknown; the relay should learn them from Metadata."""


@dataclass(slots=True)
class _ClientPartition:
    topic_name: str | None
    topic_id: uuid.UUID | None
    partition: int
    params: PartitionPlan
    key: PartitionKey | None = None
    """Upstream key; None when the topic cannot be addressed upstream."""


@dataclass(slots=True)
class _Pending:
    request: Any
    partitions: list[_ClientPartition]
    wanted: dict[PartitionKey, PartitionPlan]
    uses_topic_ids: bool
    version: int
    session_request: SessionRequest
    missing: tuple[str, ...]
    resends: int = 0
    by_key: dict[PartitionKey, _ClientPartition] = field(default_factory=dict)
    unique: bool = False
    """Every client partition is listed once and addressable upstream (``by_key`` holds
    each): answering it needs no ``_dedupe``."""
    upstream: Any = None
    """The request sent upstream for it (the last one, after a resend)."""


@dataclass(frozen=True, slots=True)
class _Quiet:
    """The last client fetch, answered from an idle session (see ``FetchTranslator.repeat``)."""

    pending: _Pending
    topic_id_changes: int


@dataclass(slots=True)
class TranslatorStats:
    """Counters for metrics and logs (the relay reads them; the core never logs)."""

    full_requests: int = 0
    incremental_requests: int = 0
    resends: int = 0
    """Upstream requests repeated within one client fetch after a session reset."""
    session_errors: int = 0
    """Top-level errors in upstream responses."""
    invalid_responses: int = 0
    """Upstream responses that broke the session rules."""
    last_problem: str | None = None


class FetchTranslator:
    """A sessionless client's full fetches, served through one upstream fetch session."""

    def __init__(
        self,
        topic_ids: TopicIdMap,
        *,
        upstream_max_version: int,
        max_resends: int = 2,
        sessionless_backoff: int = 8,
        use_sessions: bool = True,
    ) -> None:
        if upstream_max_version < MIN_CLIENT_VERSION:
            raise ValueError(f"upstream Fetch v{upstream_max_version} is too old (need v4+)")
        if max_resends < 1:
            raise ValueError("max_resends must be >= 1")
        self.topic_ids = topic_ids
        self.upstream_max_version = min(upstream_max_version, MAX_VERSION)
        self.max_resends = max_resends
        self.session = FetchSessionClient(sessionless_backoff=sessionless_backoff)
        self.cache = PartitionStateCache()
        self._pending: _Pending | None = None
        self.stats = TranslatorStats()
        self._quiet: _Quiet | None = None
        self.use_sessions = use_sessions
        """False: every upstream request is a sessionless full fetch (config ``fetch_sessions``;
        may change between fetches, e.g. on a config reload)."""

    # -- requests ------------------------------------------------------------------------

    def begin(self, request: Any) -> UpstreamFetch:
        """Start serving a client's full fetch: the first request to send upstream.

        *request* is a sessionless full fetch of a consumer's, as ``as_broker`` builds
        it from the validated ``ClientFetch`` (see :func:`is_sessionless_fetch`)."""
        step: UpstreamFetch = drain(self.begin_in_ranges(request, 0))
        return step

    def begin_in_ranges(self, request: Any, every: int) -> Generator[None, None, UpstreamFetch]:
        """``begin``, yielding after every *every* partitions (0: never) while it reads the
        client's partitions and while it builds the upstream request.  What reads shared
        state (the topic-id map) and the session's next request are decided at one point,
        with no yield between them."""
        if self._pending is not None:
            raise TranslationError("a client fetch is already being served on this session")
        if not is_sessionless_fetch(request):
            raise TranslationError("not a sessionless fetch (v4+)")
        self._quiet = None
        partitions = []
        for i, cp in enumerate(_client_partitions(request), 1):
            if every and i % every == 0:
                yield
            partitions.append(cp)
        seen = self.topic_ids.changes
        keyed = yield from self._keys_in_ranges(request, partitions, every)
        if self.topic_ids.changes != seen:  # the map changed between two ranges: again at once
            keyed = drain(self._keys_in_ranges(request, partitions, 0))
        missing, version, uses_topic_ids, wanted, by_key = keyed
        build = self.session.build_in_ranges(
            wanted,
            every,
            uses_topic_ids=uses_topic_ids,
            supports_sessions=version >= MIN_SESSION_VERSION and self.use_sessions,
        )
        session_request = yield from build
        if self._pending is not None:  # (checked again: yields came between)
            raise TranslationError("a client fetch is already being served on this session")
        self._count(session_request)
        self._pending = _Pending(
            request=request,
            partitions=partitions,
            wanted=wanted,
            uses_topic_ids=uses_topic_ids,
            version=version,
            session_request=session_request,
            missing=missing,
            by_key=by_key,
            unique=len(by_key) == len(partitions),
        )
        pending = self._pending
        upstream_request = yield from self._upstream_request_in_ranges(pending, every)
        pending.upstream = upstream_request
        return UpstreamFetch(upstream_request, missing)

    @property
    def continues_session(self) -> bool:
        """Whether the next upstream request, as far as is known before the client's
        partitions are keyed, continues an established session: an incremental fetch,
        whose partitions the broker answers in its session's order, moving each it
        answers to the end (Kafka's ``IncrementalFetchContext``), so the order they are
        listed in does not decide what is read.  (A switch between topic names and ids,
        found when they are keyed, still makes that request a full one.)"""
        return self.use_sessions and not self.session.next_metadata.is_full

    @property
    def quiet(self) -> bool:
        """The last client fetch was answered from an idle session: its upstream request sent
        and forgot no partition, the answer carried none, at once (no resend), with no
        throttle and no topic id missing.  Its answer to the client was made from this
        translator's partition states alone, which such an answer leaves as they were."""
        return self._quiet is not None

    def repeat(self) -> UpstreamFetch | None:
        """Serve the very fetch answered last (``quiet``) again, with no walk of its partitions:
        the upstream session's next request, the same at the next epoch.

        For a caller that knows the client's fetch is the last one again (the same
        bytes); it must not ``begin`` it too.  Its answer goes to ``complete_quiet``
        first: an answer with no partitions leaves this translator's partition states as
        they were, so the client's answer is the last one again; any other goes to
        ``complete``, as the answer to a ``begin`` would.  None: the session has moved
        (or the topic-id map changed), ``begin`` instead.
        """
        quiet = self._quiet
        if (
            quiet is None
            or self._pending is not None
            or not self.use_sessions
            or self.topic_ids.changes != quiet.topic_id_changes
        ):
            return None
        session_request = self.session.repeat()
        if session_request is None:
            self._quiet = None
            return None
        last = quiet.pending
        meta = session_request.metadata
        upstream = replaced(last.upstream, session_id=meta.session_id, session_epoch=meta.epoch)
        self._pending = replaced(last, session_request=session_request, upstream=upstream)
        self._count(session_request)
        return UpstreamFetch(upstream, ())

    def complete_quiet(self, response: Any) -> bool:
        """Consume *response* when it answers a ``repeat`` with nothing: no error, no
        throttle, no partition, the session continuing.  True: the client's answer is the
        last one again.  False: nothing was consumed; ``complete`` takes the response."""
        session_id = self.repeating
        if (
            session_id is None
            or int(getattr(response, "error_code", 0)) != 0
            or response.responses
            or _millis(response.throttle_time) != 0
            or int(getattr(response, "session_id", 0)) != session_id
            or getattr(response, "node_endpoints", ())
        ):
            return False
        return self.complete_unchanged()

    @property
    def repeating(self) -> int | None:
        """The session id a ``repeat`` in flight was sent with (None: no repeat in flight)."""
        pending = self._pending
        if pending is None or self._quiet is None or pending.session_request.to_send:
            return None
        return pending.session_request.metadata.session_id

    def complete_unchanged(self) -> bool:
        """``complete_quiet`` for an answer the caller knows says nothing changed (its bytes
        are those of an answer with no error, no throttle, no partition and the session
        id ``repeating`` names)."""
        session_id = self.repeating
        if session_id is None:
            return False
        outcome = self.session.handle_response(
            error_code=0, session_id=session_id, throttle_time_ms=0, partitions=()
        )
        self._pending = None
        if not outcome.ok:  # (an incremental answer with no partitions is always ok)
            self._quiet = None
            raise TranslationError(f"an idle session's answer was refused: {outcome.problem}")
        return True

    def _keys_in_ranges(
        self, request: Any, partitions: list[_ClientPartition], every: int
    ) -> Generator[
        None,
        None,
        tuple[
            tuple[str, ...],
            int,
            bool,
            dict[PartitionKey, PartitionPlan],
            dict[PartitionKey, _ClientPartition],
        ],
    ]:
        """The upstream version and each partition's upstream key, from the topic-id map
        (the caller runs it again at once if the map changed between two ranges)."""
        client_on_ids = int(request.__version__) >= FIRST_TOPIC_ID_VERSION
        missing: tuple[str, ...] = ()
        version = self.upstream_max_version
        if version >= FIRST_TOPIC_ID_VERSION and not client_on_ids:
            names = [p.topic_name for p in partitions if p.topic_name is not None]
            missing = tuple(self.topic_ids.missing_ids(names))
            if missing:
                version = LAST_TOPIC_NAME_VERSION
        uses_topic_ids = version >= FIRST_TOPIC_ID_VERSION
        wanted: dict[PartitionKey, PartitionPlan] = {}
        by_key: dict[PartitionKey, _ClientPartition] = {}
        # A client lists a topic's partitions together: its upstream name or id is found
        # once per run of them, not once per partition.
        client_topic: Any = _NO_TOPIC
        up: str | uuid.UUID | None = None
        for i, cp in enumerate(partitions, 1):
            name = cp.topic_name
            ref = cp.topic_id if name is None else name
            if ref != client_topic:
                client_topic, up = ref, self._upstream_topic(name, cp.topic_id, uses_topic_ids)
            if up is not None:
                key = cp.key = (up, cp.partition)
                wanted[key] = cp.params
                by_key[key] = cp
            else:
                cp.key = None
            if every and i % every == 0:
                yield
        return missing, version, uses_topic_ids, wanted, by_key

    def _count(self, request: SessionRequest) -> None:
        if request.is_full:
            self.stats.full_requests += 1
        else:
            self.stats.incremental_requests += 1

    def _upstream_topic(
        self, name: str | None, topic_id: uuid.UUID | None, uses_topic_ids: bool
    ) -> str | uuid.UUID | None:
        """How the upstream request names a client's topic (None: it cannot)."""
        if uses_topic_ids:
            if topic_id is None and name is not None:
                topic_id = self.topic_ids.id_for(name)
            return topic_id
        if name is None and topic_id is not None:
            name = self.topic_ids.name_for(topic_id)
        return name

    def _upstream_request(self, pending: _Pending) -> Any:
        return drain(self._upstream_request_in_ranges(pending, 0))

    def _upstream_request_in_ranges(
        self, pending: _Pending, every: int
    ) -> Generator[None, None, Any]:
        mod = request_module(FETCH, pending.version)
        sreq = pending.session_request
        client = pending.request
        topics = []
        done = 0
        for topic, items in group_runs(sreq.to_send.items(), lambda kv: kv[0][0]):
            parts = []
            for (_, partition), params in items:
                done += 1
                if every and done % every == 0:
                    yield
                parts.append(fetch_partition(mod, partition, params))
            topics.append(
                make(mod.FetchTopic, topic=topic, topic_id=topic, partitions=tuple(parts))
            )
        forgotten = [
            make(
                mod.ForgottenTopic,
                topic=topic,
                topic_id=topic,
                partitions=tuple(partition for _, partition in keys),
            )
            for topic, keys in group_runs(sreq.to_forget, lambda k: k[0])
        ]
        return consumer_fetch(
            mod,
            client,
            session_id=sreq.metadata.session_id,
            session_epoch=sreq.metadata.epoch,
            topics=tuple(topics),
            forgotten=tuple(forgotten),
        )

    def _resend(self, pending: _Pending) -> UpstreamFetch:
        pending.resends += 1
        last_try = pending.resends >= self.max_resends
        pending.session_request = self.session.build(
            pending.wanted,
            uses_topic_ids=pending.uses_topic_ids,
            # The last resend does not ask for a session, so no session error can recur.
            supports_sessions=pending.version >= MIN_SESSION_VERSION
            and self.use_sessions
            and not last_try,
        )
        self.stats.resends += 1
        self._count(pending.session_request)
        pending.upstream = self._upstream_request(pending)
        return UpstreamFetch(pending.upstream, pending.missing)

    def abort(self) -> None:
        """The upstream request failed (connection lost): drop the client fetch."""
        self._quiet = None
        if self._pending is not None:
            self._pending = None
            self.session.handle_send_error()

    # -- responses -----------------------------------------------------------------------

    def complete(self, response: Any) -> UpstreamFetch | ClientReply:
        """Consume the upstream response to the last request: resend, or answer the client."""
        step: UpstreamFetch | ClientReply = drain(self.complete_in_ranges(response, 0))
        return step

    def complete_in_ranges(
        self, response: Any, every: int
    ) -> Generator[None, None, UpstreamFetch | ClientReply]:
        """``complete``, yielding after every *every* partitions (0: never) while it records
        the answer's partitions and builds the client's response (``proxy.fetchpath``
        runs the rest in a later event-loop turn).  Between two yields only this
        translator's own state is half-updated; it serves one fetch at a time."""
        pending = self._pending
        if pending is None:
            raise TranslationError("no client fetch is being served")
        self._quiet = None
        included = yield from self._included_in_ranges(response, pending.uses_topic_ids, every)
        error_code = int(getattr(response, "error_code", 0))
        throttle_ms = _millis(response.throttle_time)
        outcome = yield from self.session.handle_response_in_ranges(
            error_code=error_code,
            session_id=int(getattr(response, "session_id", 0)),
            throttle_time_ms=throttle_ms,
            partitions=(key for key, _ in included),
            every=every,
        )
        if outcome.verdict is Verdict.ERROR:
            self.stats.session_errors += 1
            self.stats.last_problem = outcome.problem
        elif outcome.verdict is Verdict.INVALID:
            self.stats.invalid_responses += 1
            self.stats.last_problem = outcome.problem
        if outcome.verdict is Verdict.THROTTLED or (
            outcome.ok and not included and throttle_ms > 0
        ):
            # KIP-219: a throttled broker answers with no partitions, and so would a
            # sessionless one.
            self._pending = None
            return ClientReply(self._client_response(pending, {}, response, empty=True))
        if outcome.ok:
            data = dict(included)
            unusable = []
            for i, key in enumerate(pending.session_request.session_partitions, 1):
                if key not in data and self.cache.lookup(key) is None:
                    unusable.append(key)
                if every and i % every == 0:
                    yield
            if not unusable:
                reply = yield from self._finish(pending, data, response, every)
                sreq = pending.session_request
                if (
                    not data
                    and throttle_ms == 0
                    and not pending.resends
                    and not pending.missing
                    and not sreq.is_full
                    and not sreq.to_send
                    and not sreq.to_forget
                ):
                    # Kept without the client request's partitions (a decoded fetch is
                    # about 110 times its bytes): only its request-wide fields are read
                    # again; the partitions' own state is in ``partitions``.
                    kept = dataclasses.replace(
                        pending, request=dataclasses.replace(pending.request, topics=())
                    )
                    self._quiet = _Quiet(kept, self.topic_ids.changes)
                return ClientReply(reply)
            problem = (
                f"omitted {len(unusable)} partition(s) with no usable state,"
                f" e.g. {partition_name(unusable[0])}"
            )
            self.session.revoke_last_response(problem)
            self.stats.invalid_responses += 1
            self.stats.last_problem = problem
        if pending.resends < self.max_resends:
            return self._resend(pending)
        self._pending = None
        if outcome.verdict is Verdict.ERROR and error_code not in FETCH_SESSION_ERRORS:
            code = error_code
        else:
            code = UNKNOWN_SERVER_ERROR
        return ClientReply(self._error_response(pending, code, response))

    def _included_in_ranges(
        self, response: Any, uses_topic_ids: bool, every: int
    ) -> Generator[None, None, list[tuple[PartitionKey, Any]]]:
        out: list[tuple[PartitionKey, Any]] = []
        for topic in response.responses:
            ref = topic.topic_id if uses_topic_ids else topic.topic
            for pd in topic.partitions:
                out.append(((ref, int(pd.partition_index)), pd))
                if every and len(out) % every == 0:
                    yield
        return out

    def _finish(
        self, pending: _Pending, data: dict[PartitionKey, Any], response: Any, every: int
    ) -> Generator[None, None, Any]:
        self._pending = None
        for i, (key, pd) in enumerate(data.items(), 1):
            if every and i % every == 0:
                yield
            if key not in pending.by_key:
                continue
            result = result_of(pd)
            code = result.error_code
            self.cache.record(
                key,
                high_watermark=result.high_watermark,
                last_stable_offset=result.last_stable_offset,
                log_start_offset=result.log_start_offset,
                error_code=code,
            )
            name = pending.by_key[key].topic_name
            if code in (UNKNOWN_TOPIC_ID, INCONSISTENT_TOPIC_ID) and name is not None:
                if pending.by_key[key].topic_id is None:
                    # Our name -> id mapping is stale; learn it again from Metadata.
                    self.topic_ids.forget_name(name)
        self.cache.retain(pending.session_request.session_partitions)
        if every:
            yield
        return (yield from self._client_response_in_ranges(pending, data, response, every))

    # -- building the client's response --------------------------------------------------

    def _client_response(
        self,
        pending: _Pending,
        data: dict[PartitionKey, Any],
        upstream: Any,
        *,
        empty: bool = False,
    ) -> Any:
        return drain(self._client_response_in_ranges(pending, data, upstream, 0, empty=empty))

    def _client_response_in_ranges(
        self,
        pending: _Pending,
        data: dict[PartitionKey, Any],
        upstream: Any,
        every: int,
        *,
        empty: bool = False,
    ) -> Generator[None, None, Any]:
        client_version = int(pending.request.__version__)
        mod = response_module(FETCH, client_version)
        read_committed = int(getattr(pending.request, "isolation_level", 0)) == READ_COMMITTED
        client_on_ids = client_version >= FIRST_TOPIC_ID_VERSION
        answered: list[tuple[TopicKey, Any]] = []
        refused: list[tuple[TopicKey, Any]] = []
        lookup = self.cache.lookup
        answer_key = (client_version, read_committed)
        listed = pending.partitions if pending.unique else _dedupe(pending.partitions)
        for i, cp in enumerate(() if empty else listed, 1):
            if every and i % every == 0:
                yield
            if cp.key is None:
                pd = _error_partition(mod, cp.partition, _unknown_topic(cp))
            elif cp.key in data:
                pd = _convert_partition(
                    mod,
                    data[cp.key],
                    client_on_ids=client_on_ids,
                    upstream_on_ids=pending.uses_topic_ids,
                )
            else:
                state = lookup(cp.key)
                assert state is not None  # checked in complete()
                # the same entity for as long as the partition's state holds (kio's are frozen)
                pd = state.answers.get(answer_key)
                if pd is None:
                    pd = state.answers[answer_key] = empty_entry(
                        mod,
                        cp.partition,
                        state.high_watermark,
                        state.last_stable_offset,
                        state.log_start_offset,
                        read_committed=read_committed,
                    )
            # KafkaApis lists the partitions it refused before reading after the others.
            name = cp.topic_name
            if pd.error_code in _PRE_READ_ERRORS:
                refused.append((cp.topic_id if name is None else name, pd))
            else:
                answered.append((cp.topic_id if name is None else name, pd))
        answered += refused
        topics: list[Any] = []
        yield from topic_entries_in_ranges(mod, answered, topics, every)
        endpoints = ()
        if hasattr(mod, "NodeEndpoint"):
            endpoints = tuple(
                convert(ep, mod.NodeEndpoint) for ep in getattr(upstream, "node_endpoints", ())
            )
        return make(
            mod.FetchResponse,
            throttle_time=upstream.throttle_time,
            error_code=ErrorCode(0),
            session_id=0,
            responses=tuple(topics),
            node_endpoints=endpoints,
        )

    def _error_response(self, pending: _Pending, code: int, upstream: Any) -> Any:
        client_version = int(pending.request.__version__)
        mod = response_module(FETCH, client_version)
        if client_version >= MIN_SESSION_VERSION:
            # A broker's top-level error carries no partitions.
            responses: tuple[Any, ...] = ()
            top = code
        else:
            top = 0
            responses = tuple(
                make(
                    mod.FetchableTopicResponse,
                    topic=ref,
                    topic_id=ref,
                    partitions=tuple(_error_partition(mod, cp.partition, code) for cp in cps),
                )
                for ref, cps in group_runs(_dedupe(pending.partitions), _client_topic)
            )
        return make(
            mod.FetchResponse,
            throttle_time=upstream.throttle_time,
            error_code=ErrorCode(top),
            session_id=0,
            responses=responses,
        )


# -- helpers ---------------------------------------------------------------------------------


_NO_TOPIC = object()
"""No client topic seen yet (``_keys_in_ranges``)."""


def _client_partitions(request: Any) -> Iterator[_ClientPartition]:
    on_ids = int(request.__version__) >= FIRST_TOPIC_ID_VERSION
    new = _ClientPartition  # (positional: once per partition of every fetch)
    for topic in request.topics:
        name = None if on_ids else str(topic.topic)
        topic_id = topic.topic_id if on_ids else None
        for p in topic.partitions:
            yield new(name, topic_id, int(p.partition), plan_of(p))


def _client_topic(cp: _ClientPartition) -> TopicKey:
    return cp.topic_id if cp.topic_name is None else cp.topic_name


def _dedupe(partitions: list[_ClientPartition]) -> Iterator[_ClientPartition]:
    """One entry per (topic, partition), at its first position (a broker keys fetch data by
    it), as the caller walks them (so a walk in ranges dedupes in ranges too)."""
    seen: set[PartitionKey] = set()
    for cp in partitions:
        name = cp.topic_name  # _client_topic, inline: once per partition of every fetch
        ident = (cp.topic_id if name is None else name, cp.partition)
        if ident not in seen:
            seen.add(ident)
            yield cp


def _unknown_topic(cp: _ClientPartition) -> int:
    return UNKNOWN_TOPIC_ID if cp.topic_name is None else UNKNOWN_TOPIC_OR_PARTITION


def _map_error(code: int, *, client_on_ids: bool, upstream_on_ids: bool) -> int:
    if upstream_on_ids and not client_on_ids and code in (UNKNOWN_TOPIC_ID, INCONSISTENT_TOPIC_ID):
        return UNKNOWN_TOPIC_OR_PARTITION
    if client_on_ids and not upstream_on_ids and code == UNKNOWN_TOPIC_OR_PARTITION:
        return UNKNOWN_TOPIC_ID
    return code


def _convert_partition(
    mod: ModuleType, pd: Any, *, client_on_ids: bool, upstream_on_ids: bool
) -> Any:
    code = _map_error(
        int(pd.error_code), client_on_ids=client_on_ids, upstream_on_ids=upstream_on_ids
    )
    if type(pd) is mod.PartitionData and code == pd.error_code and _converts_whole(type(pd)):
        return pd  # the client's version, nothing to map: the rebuild would equal it
    aborted = getattr(pd, "aborted_transactions", None)
    kwargs: dict[str, Any] = {
        "partition_index": pd.partition_index,
        "error_code": ErrorCode(code),
        "high_watermark": pd.high_watermark,
        "last_stable_offset": getattr(pd, "last_stable_offset", -1),
        "log_start_offset": getattr(pd, "log_start_offset", -1),
        "aborted_transactions": None
        if aborted is None
        else tuple(convert(a, mod.AbortedTransaction) for a in aborted),
        "preferred_read_replica": getattr(pd, "preferred_read_replica", -1),
        "records": pd.records,
    }
    for name, cls_name in (
        ("diverging_epoch", "EpochEndOffset"),
        ("current_leader", "LeaderIdAndEpoch"),
        ("snapshot_id", "SnapshotId"),
    ):
        value = getattr(pd, name, None)
        if value is not None and hasattr(mod, cls_name):
            kwargs[name] = convert(value, getattr(mod, cls_name))
    return make(mod.PartitionData, **kwargs)


_CONVERTED = frozenset(
    {
        "partition_index",
        "error_code",
        "high_watermark",
        "last_stable_offset",
        "log_start_offset",
        "aborted_transactions",
        "preferred_read_replica",
        "records",
        "diverging_epoch",
        "current_leader",
        "snapshot_id",
    }
)


def _converts_whole(cls: type) -> bool:
    """Does ``_convert_partition`` carry every field of *cls* (none left at a default)?"""
    return field_names(cls) <= _CONVERTED


def _error_partition(mod: ModuleType, partition: int, code: int) -> Any:
    """What a broker answers for a partition it cannot serve (FetchResponse.partitionResponse)."""
    return make(
        mod.PartitionData,
        partition_index=partition,
        error_code=ErrorCode(code),
        high_watermark=-1,
        last_stable_offset=-1,
        log_start_offset=-1,
        aborted_transactions=None,
        preferred_read_replica=-1,
        records=None,
    )


_MILLISECOND = timedelta(milliseconds=1)


def _millis(value: Any) -> int:
    if type(value) is timedelta:
        return value // _MILLISECOND
    if isinstance(value, timedelta):
        return int(value / _MILLISECOND)
    return int(value)
