"""One dev-cluster node's request dispatcher: a frame in, an outcome out.

Sans-I/O: no trio here.  The trio edge (``cluster.py``) reads frames, calls
:meth:`NodeDispatcher.handle` and acts on the outcome:

- :class:`Reply`: encode and send the response;
- :class:`NoReply`: send nothing (Produce with acks=0);
- :class:`Close`: close the connection (what Kafka does for unknown API keys,
  versions it does not accept, undecodable requests, and acks=0 produce errors);
- :class:`Wait`: a request that completes later (long-poll Fetch, JoinGroup,
  SyncGroup).  The edge calls ``pending.poll(now)`` whenever cluster state
  changed (see :attr:`NodeDispatcher.changed`) or at ``pending.wake_at()``,
  and sends ``pending.complete()`` once poll returns True.

:meth:`NodeDispatcher.handle_in_ranges` is ``handle`` cut into ranges (a Fetch is
decoded and begun a slice of partitions at a time), and a Fetch's pending
(:class:`FetchWaitAdapter`) has ``poll_in_ranges`` and ``complete_in_ranges``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from proxy.protocol import codec
from proxy.protocol.apis import API_VERSIONS, FETCH
from proxy.protocol.codec import drain
from proxy.protocol.errors import ProtocolError
from proxy.sessions.as_broker_cache import Ranges

from . import admin, produce
from .membership import GroupCoordinator, GroupWait
from .outcome import Close, NoReply, Outcome, Reply, Wait
from .state import ClusterState
from .versions import (
    SUPPORTED,
    api_versions_response,
    is_supported,
)


@dataclass(frozen=True, slots=True)
class Request:
    """What a handler gets: the decoded request and its context."""

    header: codec.RequestHeader
    body: Any
    now: float

    @property
    def version(self) -> int:
        return self.header.api_version


class FetchWaitAdapter:
    """Wraps the fetch module's PendingFetch into :class:`Pending` (adds the max_wait deadline)."""

    def __init__(self, pending: Any, now: float) -> None:
        self._pending = pending
        self._deadline = now + max(0, int(pending.max_wait_ms)) / 1000.0

    def poll(self, now: float) -> bool:
        return bool(self._pending.poll()) or now >= self._deadline

    def wake_at(self) -> float | None:
        return self._deadline

    def complete(self) -> Any:
        return self._pending.complete()

    def poll_in_ranges(self, now: float, every: int) -> Ranges[bool]:
        """``poll``, yielding after every *every* partitions (``as_broker_cache.Ranges``)."""
        ready = yield from self._pending.poll_in_ranges(every)
        return bool(ready) or now >= self._deadline

    def complete_in_ranges(self, every: int) -> Ranges[Any]:
        return (yield from self._pending.complete_in_ranges(every))


class NodeDispatcher:
    """Answers the requests sent to one node of the dev cluster."""

    def __init__(
        self,
        node_id: int,
        state: ClusterState,
        coordinator: GroupCoordinator,
        fetcher: Any | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.node_id = node_id
        self.state = state
        self.coordinator = coordinator
        self.fetcher = fetcher
        self.clock = clock
        self.wall_clock = wall_clock
        """Seconds since the epoch (record timestamp checks, marker timestamps)."""
        self.changed = False
        """Set when a handled request changed shared state (the edge wakes waiters, then clears it)."""

    def handle(self, frame: bytes) -> Outcome:
        return drain(self.handle_in_ranges(frame, 0))

    def handle_in_ranges(self, frame: bytes, every: int) -> Ranges[Outcome]:
        """``handle``, yielding after every *every* partitions a Fetch names while it is
        decoded and begun (other requests are handled in one range)."""
        try:
            header = codec.parse_request_header(frame)
        except ProtocolError as exc:
            return Close(f"malformed request header: {exc}")
        key, version = header.api_key, header.api_version
        if key == API_VERSIONS and not is_supported(key, version):
            # Unsupported ApiVersions versions are answered (v0), never parsed.
            return Reply(api_versions_response(version, None), header.correlation_id)
        if not is_supported(key, version):
            if key in SUPPORTED:
                return Close(
                    f"api key {key} version {version} is not supported", "unsupported_request"
                )
            return Close(f"unknown or unsupported api key {key}", "unsupported_request")
        try:
            # Bytes after the body are ignored, as Kafka's request parsing ignores them.
            if key == FETCH and every:
                body = yield from codec.decode_request_body_in_ranges(
                    header, frame, path=codec.FETCH_REQUEST_PARTITIONS, every=every
                )
            else:
                body = codec.decode_request_body(header, frame)
        except ProtocolError as exc:
            return Close(f"cannot decode api key {key} v{version}: {exc}")
        req = Request(header, body, self.clock())
        if key == FETCH:
            if self.fetcher is None:
                return Close("fetch is not available on this node")
            pending = yield from self.fetcher.begin_in_ranges(req.body, req.version, every)
            return Wait(FetchWaitAdapter(pending, req.now), header.correlation_id)
        return self._dispatch(req)

    def _dispatch(self, req: Request) -> Outcome:
        key = req.header.api_key
        cid = req.header.correlation_id
        if key == API_VERSIONS:
            return Reply(api_versions_response(req.version, req.body), cid)
        if key in admin.HANDLERS:
            return Reply(admin.HANDLERS[key](self, req), cid)
        if key in produce.HANDLERS:
            result = produce.HANDLERS[key](self, req)
            self.changed = True  # appended records wake long polls, acks=0 included
            if isinstance(result, Close | NoReply):
                return result
            return Reply(result, cid)
        handler = self.coordinator.handlers().get(key)
        if handler is not None:
            self.changed = True
            out = handler(self.node_id, req)
            if isinstance(out, GroupWait):
                return Wait(out, cid)
            return Reply(out, cid)
        return Close(f"api key {key} has no handler")  # pragma: no cover - SUPPORTED lists handlers
