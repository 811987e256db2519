"""The proxy's Fetch path: upstream fetch sessions and fetch shaping together.

Sans-I/O.  ``FetchPath`` is the process-wide part (configuration, the memory
budget, the topic-id map, one downstream session cache per listener, metrics
and the decision log); ``FetchPathHandler`` is the relay's per-connection
FetchHandler it hands out.  A consumer fetch goes

    client request
      -> downstream session broker (SessionFetchServer): the partitions it covers,
         as one sessionless full fetch
      -> shaping (FetchShaper.prepare): budget grant, caps clamped, held batches
         taken from the reuse buffer, round-robin order
      -> upstream session client (FetchTranslator) -> upstream
    upstream response
      -> FetchTranslator: the complete full response
      -> shaping (FetchShaper.finish): trimmed to the limits in serve-rotation
         order, trimmed-away batches kept for the next fetch
      -> SessionFetchServer: all of it (sessionless client) or the incremental
         part (session client) -> client

so shaping always works on full fetches, whatever the client speaks, and the
upstream session learns each partition's next offset from the shaped request
of the next fetch (the client's offset, or past the batches the buffer holds).

Memory budget: a fetch starts only once ``MemoryBudget.acquire_fetch`` grants
it; otherwise the handler keeps it queued and joins the path's FIFO of waiting
connections.  Each release of budget wakes the oldest waiters (as many as the
headroom could serve) through the waker the trio edge bound (``bind_waker``),
which calls ``resume()`` from the connection's own task; a woken fetch that
still finds no room goes back to the front.  The grant is released when the
edge says the response was written (``written()``).  When a fetch has to wait,
every connection's reuse buffer is dropped (it is a cache, and the budget must
never be held by data nobody is fetching while fetches wait).  Only consumer
Fetch requests ever wait: other APIs never reach this module.

Reload: ``FetchPath.reload(config)``; live connections pick the new limits
and policies at their next fetch.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Protocol

from .protocol.framing import Payload
from .relay.pipeline import ClientRequest, Upstream
from .sessions.broker import FetchSessionCache
from .sessions.downstream import SessionFetchServer
from .sessions.handler import SessionFetchHandler
from .sessions.resets import Side
from .sessions.topic_ids import TopicIdMap
from .sessions.translate import ClientReply, UpstreamFetch
from .shaping.budget import MemoryBudget, Reservation
from .shaping.decision import ShapingDecision
from .shaping.keys import topic_key
from .shaping.limits import LIMIT_NAMES, InvalidLimits, Limits, limit_kind
from .shaping.policy import DEFAULT_POLICY, Policy, select
from .shaping.shaper import FetchShaper, PreparedFetch, ShapedResponse

UNLIMITED_BUDGET = 2**62
"""The budget's capacity when none is configured (accounting only)."""
BUDGET_FLOOR = 1_048_588
"""Least bytes a fetch is granted (Kafka's default message.max.bytes, so the broker's
one-batch progress exemption stays inside a grant)."""
DEFAULT_REUSE_BUFFER_BYTES = 4 * 1024 * 1024
FETCH_SHARE = 16
"""With a budget, one fetch is granted at most 1/FETCH_SHARE of it (never below the floor),
so a few long polls waiting upstream cannot hold the whole budget while other fetches wait."""
MAX_POLICY_CACHE = 1024


def max_fetch_bytes(budget: MemoryBudget) -> int:
    """The most one fetch is granted under a configured budget."""
    return max(budget.floor, budget.capacity // FETCH_SHARE)


def _configure_budget(budget: MemoryBudget, capacity: int | None) -> None:
    budget.capacity = capacity or UNLIMITED_BUDGET
    budget.floor = min(BUDGET_FLOOR, budget.capacity)
    # The working copy of one response (MemoryBudget's docstring) is at most one
    # fetch's grant; it is kept back only when there is a budget to keep it from.
    working = 0 if capacity is None else max_fetch_bytes(budget)
    budget.set_working(min(working, budget.capacity - budget.floor))


class InvalidFetchConfig(ValueError):
    """A fetch-path setting is invalid; the message names the key, the value and what is allowed."""


@dataclass(frozen=True, slots=True)
class FetchPathConfig:
    limits: Limits = dataclasses.field(default_factory=Limits)
    policies: tuple[Policy, ...] = ()
    fetch_sessions: bool = True
    memory_budget_bytes: int | None = None
    reuse_buffer_bytes: int = DEFAULT_REUSE_BUFFER_BYTES

    @classmethod
    def from_raw(cls, raw: Mapping[str, Any]) -> FetchPathConfig:
        """From the validated settings' ``raw`` mapping (schema-checked already)."""
        try:
            limits = Limits(**{k: raw[k] for k in LIMIT_NAMES if k in raw})
        except InvalidLimits as exc:
            raise InvalidFetchConfig(f"key {exc}") from exc
        policies: list[Policy] = []
        seen: set[str] = set()
        for n, entry in enumerate(raw.get("policies") or ()):
            if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
                raise InvalidFetchConfig(
                    f"key 'policies[{n}]': value {entry!r} is not allowed;"
                    " expected a table with a string 'name'"
                )
            name = entry["name"]
            if name in seen or name == DEFAULT_POLICY:
                raise InvalidFetchConfig(
                    f"key 'policies[{n}].name': value {name!r} is not allowed;"
                    f" expected a name unique among the policies and not {DEFAULT_POLICY!r}"
                )
            seen.add(name)
            body = {k: v for k, v in entry.items() if k != "name"}
            try:
                policies.append(Policy.from_mapping(name, body))
            except InvalidLimits as exc:
                raise InvalidFetchConfig(f"key 'policies[{n}]': {exc}") from exc
        budget = raw.get("memory_budget_bytes")
        return cls(
            limits=limits,
            policies=tuple(policies),
            fetch_sessions=bool(raw.get("fetch_sessions", True)),
            memory_budget_bytes=None if budget is None else int(budget),
            reuse_buffer_bytes=int(raw.get("reuse_buffer_bytes", DEFAULT_REUSE_BUFFER_BYTES)),
        )


class FetchMetrics(Protocol):
    """The part of ``proxy.observe.metrics.Metrics`` the fetch path reports to."""

    def fetch_session_saved(self, *, request_bytes: int = 0, response_bytes: int = 0) -> None: ...
    def fetch_session_reset(self, side: Side, reason: Any) -> None: ...
    def shaped_response(self, policy: str) -> None: ...
    def trimmed(self, limit: Any, *, records: int, record_bytes: int, policy: str) -> None: ...
    def buffered_reuse_hit(self, record_bytes: int) -> None: ...
    def set_memory_budget(self, *, used: int, limit: int | None = None) -> None: ...
    def memory_budget_wait(self) -> None: ...
    def starvation(self, rounds: int) -> None: ...
    def upstream_fetch_data(self, node: int | None, records: int, record_bytes: int) -> None: ...
    def delivered_fetch_data(
        self, records: int, record_bytes: int, *, client_id: str | None = None
    ) -> None: ...


class DecisionSink(Protocol):
    """``proxy.observe.decisionlog.DecisionLog`` as the fetch path uses it."""

    def log(
        self,
        decision: Any,
        *,
        client_id: str | None,
        node_id: int,
        policy: str,
        correlation_id: int,
        latency_ms: float,
        starved_partitions: Mapping[tuple[Any, int], int] | None = None,
        upstream_fetch_bytes: int = 0,
        sessionless_fetch_bytes: int | None = None,
        topic_ids: Any = None,
    ) -> Any: ...


def listener_name(node_id: int | None) -> str:
    """The listener name policies match: ``bootstrap`` or ``broker-<node id>``."""
    return "bootstrap" if node_id is None else f"broker-{node_id}"


class FetchPath:
    """Process-wide state of the Fetch path; ``handler(node_id)`` per client connection."""

    def __init__(
        self,
        config: FetchPathConfig,
        *,
        metrics: FetchMetrics | None = None,
        decision_log: DecisionSink | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.budget = MemoryBudget(UNLIMITED_BUDGET)
        _configure_budget(self.budget, config.memory_budget_bytes)
        self.topic_ids = TopicIdMap()
        self.metrics = metrics
        self.decision_log = decision_log
        self.clock = clock
        self._client_sessions: dict[int | None, FetchSessionCache] = {}
        self.handlers: weakref.WeakSet[FetchPathHandler] = weakref.WeakSet()
        self._policy_cache: dict[tuple[str | None, str], tuple[str, Limits]] = {}
        self.config = config
        self.generation = 0
        self.fetch_waits = 0
        """Fetches that had to wait for budget (each counted once)."""
        self._waiters: deque[FetchPathHandler] = deque()
        self.budget.add_listener(self._released)
        if metrics is not None:
            metrics.set_memory_budget(used=0, limit=config.memory_budget_bytes)

    def sessions_for(self, node_id: int | None) -> FetchSessionCache:
        """The downstream session cache of one listener (Kafka has one per broker)."""
        cache = self._client_sessions.get(node_id)
        if cache is None:
            cache = self._client_sessions[node_id] = FetchSessionCache()
        return cache

    def client_session_caches(self) -> list[FetchSessionCache]:
        """Every downstream session cache (for gauges and tests)."""
        return list(self._client_sessions.values())

    def handler(self, node_id: int | None = None) -> FetchPathHandler:
        h = FetchPathHandler(self, node_id)
        self.handlers.add(h)
        return h

    def factory(self, node_id: int | None = None) -> Callable[[], FetchPathHandler]:
        return lambda: self.handler(node_id)

    def reload(self, config: FetchPathConfig) -> None:
        """Apply a new configuration; live connections use it from their next fetch."""
        _configure_budget(self.budget, config.memory_budget_bytes)
        self.config = config
        self.generation += 1
        self._policy_cache.clear()
        for h in list(self.handlers):
            h.apply_config(config)
        if self.metrics is not None:
            self.metrics.set_memory_budget(used=self.budget.used, limit=config.memory_budget_bytes)
        self._released()  # room may have appeared: let waiting fetches try again

    # -- the memory budget's waiters ----------------------------------------------------

    def wait_for_budget(self, handler: FetchPathHandler, *, front: bool) -> None:
        if handler.waiting:
            return
        handler.waiting = True
        if front:
            self._waiters.appendleft(handler)
        else:
            self._waiters.append(handler)

    def stop_waiting(self, handler: FetchPathHandler) -> None:
        if handler.waiting:
            handler.waiting = False
            with contextlib.suppress(ValueError):
                self._waiters.remove(handler)

    def _released(self) -> None:
        budget = self.budget
        wake = max(1, budget.headroom // budget.floor)
        while self._waiters and wake > 0:
            handler = self._waiters.popleft()
            handler.waiting = False
            if not handler.closed:
                handler.wake()
                wake -= 1

    def shed_buffers(self) -> bool:
        """Drop every connection's reuse buffer; True if that freed any budget."""
        before = self.budget.used
        for h in list(self.handlers):
            if len(h.shaper.buffer):
                h.shaper.buffer.clear()
        return self.budget.used < before

    def select(self, client_id: str | None, listener: str) -> tuple[str, Limits]:
        key = (client_id, listener)
        hit = self._policy_cache.get(key)
        if hit is None:
            hit = select(self.config.policies, client_id, listener, self.config.limits)
            if len(self._policy_cache) >= MAX_POLICY_CACHE:
                self._policy_cache.clear()
            self._policy_cache[key] = hit
        return hit

    def refresh_gauges(self) -> None:
        """The memory-budget gauge (session gauges are set at scrape time, proxy.observe.sessions)."""
        if self.metrics is not None:
            self.metrics.set_memory_budget(used=self.budget.used)


class _Stage:
    """Shaping for one client fetch (a ``FetchStage`` of ``SessionFetchServer``)."""

    __slots__ = ("grant", "policy", "prepared", "shaped", "shaper", "started")

    def __init__(self, shaper: FetchShaper, grant: Reservation, policy: str, started: float):
        self.shaper = shaper
        self.grant = grant
        self.policy = policy
        self.started = started
        self.prepared: PreparedFetch | None = None
        self.shaped: ShapedResponse | None = None

    def prepare(self, request: Any) -> Any:
        shaper = self.shaper
        if len(shaper.buffer):
            # The client no longer fetches these (a full fetch lists every partition).
            asked = {(topic_key(t), int(p.partition)) for t in request.topics for p in t.partitions}
            gone = [k for k in shaper.buffer.keys() if k not in asked]
            if gone:
                shaper.forget(gone)
        self.prepared = p = shaper.prepare(request, grant=self.grant)
        upstream = p.upstream_request
        if p.prefixes and upstream.max_wait != timedelta(0):
            # The client gets data at once from the buffer: no long poll upstream.
            upstream = dataclasses.replace(upstream, max_wait=timedelta(0))
        return upstream

    def finish(self, response: Any) -> Any:
        assert self.prepared is not None
        self.shaped = self.shaper.finish(self.prepared, response)
        return self.shaped.response


class FetchPathHandler(SessionFetchHandler):
    """The relay's FetchHandler for one client connection (see the module docstring)."""

    def __init__(self, path: FetchPath, node_id: int | None) -> None:
        super().__init__(path.sessions_for(node_id), path.topic_ids, metrics=path.metrics)
        self.path = path
        self.node_id = node_id
        self.listener = listener_name(node_id)
        config = path.config
        self.shaper = FetchShaper(
            config.limits, buffer_capacity=config.reuse_buffer_bytes, budget=path.budget
        )
        self._upstream: Upstream | None = None
        self._grant: Reservation | None = None
        self._stage: _Stage | None = None
        self._unwritten: list[Reservation] = []
        self._waker: Callable[[], None] | None = None
        self.waiting = False
        """In the path's queue of fetches waiting for budget."""
        self._waiting_for: ClientRequest | None = None
        self.closed = False
        self.budget_waits = 0

    # -- the trio edge's hooks ----------------------------------------------------------

    def bind_waker(self, wake: Callable[[], None]) -> None:
        """*wake()* (sync, no I/O) asks the edge to call ``resume()`` from the connection's task."""
        self._waker = wake

    def resume(self) -> None:
        """Start queued fetches that were waiting (for the memory budget)."""
        if not self.closed and self._upstream is not None and not self._busy:
            self._next(self._upstream)

    def written(self) -> None:
        """The responses answered so far have been written to the client: free their memory."""
        pending, self._unwritten = self._unwritten, []
        for grant in pending:
            grant.release()
        if pending:
            self.path.refresh_gauges()

    def close(self) -> None:
        """The connection ended: give back every byte this connection holds."""
        self.closed = True
        self.path.stop_waiting(self)
        for grant in (self._grant, self._stage.grant if self._stage else None, *self._unwritten):
            if grant is not None:
                grant.release()
        self._grant = self._stage = None
        self._unwritten = []
        self.shaper.close()
        self._queue.clear()

    def apply_config(self, config: FetchPathConfig) -> None:
        self.shaper.buffer.capacity = config.reuse_buffer_bytes

    # -- FetchHandler -------------------------------------------------------------------

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None:
        if self.closed:
            return
        self._upstream = upstream
        super().handle_fetch(request, upstream)

    # -- SessionFetchHandler hooks ------------------------------------------------------

    def _admit(self, request: ClientRequest, decoded: Any) -> bool:
        if self._grant is not None:
            return True
        _, limits = self.path.select(request.header.client_id, self.listener)
        requested = int(decoded.max_bytes)
        if limits.max_response_bytes is not None:
            requested = min(requested, limits.max_response_bytes)
        budget = self.path.budget
        if self.path.config.memory_budget_bytes is not None:
            requested = min(requested, max_fetch_bytes(budget))
        grant = budget.acquire_fetch(max(requested, 0))
        if grant is None and self.path.shed_buffers():
            grant = budget.acquire_fetch(max(requested, 0))
        if grant is None:
            retry = self._waiting_for is request
            if not retry:  # count each fetch once, not each retry
                self._waiting_for = request
                self.budget_waits += 1
                self.path.fetch_waits += 1
                if self.path.metrics is not None:
                    self.path.metrics.memory_budget_wait()
            self.path.wait_for_budget(self, front=retry)
            return False
        self.path.stop_waiting(self)
        self._waiting_for = None
        self._grant = grant
        return True

    def _begin(
        self, server: SessionFetchServer, request: ClientRequest, decoded: Any
    ) -> UpstreamFetch | ClientReply:
        grant = self._grant
        assert grant is not None
        self._grant = None
        config = self.path.config
        policy, limits = self.path.select(request.header.client_id, self.listener)
        self.shaper.limits = limits
        server.translator.use_sessions = config.fetch_sessions
        self._stage = _Stage(self.shaper, grant, policy, self.path.clock())
        return server.begin(decoded, self._stage)

    def _answered(self, request: ClientRequest, response: Any, frame: Payload) -> None:
        stage, self._stage = self._stage, None
        if stage is None:
            return
        if self._waker is None:
            stage.grant.release()  # no edge to tell us when it is written
        else:
            self._unwritten.append(stage.grant)
        if stage.shaped is not None:
            self._report(request, stage, stage.shaped, len(frame))
        self.path.refresh_gauges()

    # -- internals ----------------------------------------------------------------------

    def wake(self) -> None:
        """Budget may be free: retry the waiting fetch (via the edge's task when bound)."""
        if self._waker is not None:
            self._waker()
        else:
            self.resume()

    def _report(
        self, request: ClientRequest, stage: _Stage, shaped: ShapedResponse, reply_bytes: int
    ) -> None:
        d = shaped.decision
        m = self.path.metrics
        if m is not None:
            # record batches from the broker vs to the client (batch headers, never payloads)
            m.upstream_fetch_data(self.node_id, d.upstream_records, d.upstream_bytes)
            m.delivered_fetch_data(
                d.delivered_records, d.delivered_bytes, client_id=request.header.client_id
            )
            if d.limited_by or d.partitions_trimmed or d.reused_bytes:
                m.shaped_response(stage.policy)
            for limit, records, nbytes in d.trimmed_by_limit:
                m.trimmed(
                    limit_kind(limit), records=records, record_bytes=nbytes, policy=stage.policy
                )
            if stage.prepared is not None:
                for prefix in stage.prepared.prefixes.values():
                    m.buffered_reuse_hit(prefix.run.size)
            for rounds in shaped.served_after.values():
                if rounds:
                    m.starvation(rounds)
        log = self.path.decision_log
        if log is not None:
            h = request.header
            log.log(
                d,
                client_id=h.client_id,
                node_id=-1 if self.node_id is None else self.node_id,
                policy=stage.policy,
                correlation_id=h.correlation_id,
                latency_ms=(self.path.clock() - stage.started) * 1000.0,
                starved_partitions={
                    k: v for k, v in self.shaper.serve_rotation.starved().items() if v
                }
                if d.partitions_starved
                else None,
                upstream_fetch_bytes=sum(self._round),
                sessionless_fetch_bytes=self._sessionless_estimate(request, d, reply_bytes),
                topic_ids=self.path.topic_ids,  # names for Fetch v13+ topic ids
            )

    def _sessionless_estimate(
        self, request: ClientRequest, d: ShapingDecision, reply_bytes: int
    ) -> int | None:
        """What this exchange would cost upstream without a session (decision-log field).

        A sessionless client's request lists every partition, as a full upstream
        request would; the full response is the reply with the record bytes that
        came from upstream in place of those delivered (the limits trimmed them).
        A session client's frames are incremental themselves: no estimate (None).
        """
        if not self._client_sessionless:
            return None
        full_response = reply_bytes - d.delivered_bytes + d.upstream_bytes
        return len(request.frame) + max(0, full_response)
