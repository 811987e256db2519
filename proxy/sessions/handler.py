"""The relay's FetchHandler for upstream fetch sessions, sans-I/O.

Plugs :class:`SessionFetchServer` (downstream session broker) and
:class:`FetchTranslator` (upstream session client) into the relay's Fetch
plug-in point (:mod:`proxy.relay.pipeline`): one handler per client connection,
which has one upstream connection and therefore one upstream session.

- Every consumer Fetch (sessionless or with a session) is served through the
  upstream session; followers' fetches pass through untouched.
- Fetches are served one at a time, in arrival order (a session's epochs are a
  sequence); pipelined fetches wait in a queue bounded by the relay's
  ``max_in_flight``.  The relay returns responses in client order anyway.
- The upstream Fetch version is the highest the upstream advertised in the
  ApiVersions response this handler observed (capped by the proxy), else the
  client's own version.
- Topic ids are learnt from every Metadata response the relay forwards; when a
  names client needs ids the handler asks upstream Metadata (v10+) itself, at
  most one request in flight and each name at most once per
  ``metadata_retry_fetches`` fetches.
- Responses to the client carry NodeEndpoints rewritten to the proxy's
  addresses, like every other response.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from typing import Any, Protocol

from ..protocol import codec, walk
from ..protocol.apis import API_VERSIONS, FETCH, METADATA
from ..protocol.errors import DecodeError
from ..protocol.framing import Payload
from ..protocol.messages import request_module
from ..relay.pipeline import ClientRequest, PassThroughFetch, Upstream
from .broker import FetchSessionCache
from .downstream import SessionFetchServer
from .resets import RESET_REASONS, ResetReason, Side
from .topic_ids import TopicIdMap
from .translate import ClientReply, FetchTranslator, UpstreamFetch, _replica_id


class SessionMetrics(Protocol):
    """The part of ``proxy.observe.metrics.Metrics`` this handler reports to."""

    def fetch_session_saved(self, *, request_bytes: int = 0, response_bytes: int = 0) -> None: ...

    def fetch_session_reset(self, side: Side, reason: ResetReason | str) -> None: ...


MIN_METADATA_WITH_IDS = 10
MAX_METADATA_VERSION = 12
PROXY_CLIENT_ID = "kafka-fetch-proxy"


class SessionFetchHandler:
    """FetchHandler: every consumer fetch of one client connection through one upstream session."""

    def __init__(
        self,
        sessions: FetchSessionCache,
        topic_ids: TopicIdMap,
        *,
        max_resends: int = 2,
        sessionless_backoff: int = 8,
        metadata_retry_fetches: int = 100,
        max_asked_names: int = 10_000,
        metrics: SessionMetrics | None = None,
    ) -> None:
        self.sessions = sessions
        self.topic_ids = topic_ids
        self.max_resends = max_resends
        self.sessionless_backoff = sessionless_backoff
        self.metadata_retry_fetches = metadata_retry_fetches
        self.max_asked_names = max_asked_names
        self.upstream_fetch_max: int | None = None
        self.upstream_metadata_max: int | None = None
        self.server: SessionFetchServer | None = None
        self._queue: deque[tuple[ClientRequest, Any]] = deque()
        self._busy = False
        self._starting = False
        self._fetches = 0
        self._asked: dict[str, int] = {}
        self._metadata_in_flight = False
        self._passthrough = PassThroughFetch()
        self.metrics = metrics
        self.upstream_fetch_bytes = 0
        """Fetch request and response bytes exchanged with the upstream broker (frames)."""
        self.client_fetch_bytes = 0
        """Fetch request and response bytes exchanged with the client (frames)."""
        self._round = [0, 0]  # upstream request / response bytes of the fetch being served
        self._client_sessionless = True

    # -- FetchHandler -------------------------------------------------------------------

    def observe(self, api_key: int, api_version: int, frame: bytes) -> None:
        if api_key == API_VERSIONS:
            self._learn_versions(api_version, frame)
        elif api_key == METADATA and api_version >= MIN_METADATA_WITH_IDS:
            try:
                _, response = codec.decode_response(api_key, api_version, frame)
            except DecodeError:
                return  # not ours to judge: the client gets the frame as it came
            self.topic_ids.learn_metadata(response)

    def handle_fetch(self, request: ClientRequest, upstream: Upstream) -> None:
        decoded = codec.decode_request_body(request.header, request.frame)
        if int(request.header.api_version) < 4 or _replica_id(decoded) >= 0:
            self._passthrough.handle_fetch(request, upstream)
            return
        self._queue.append((request, decoded))
        if not self._busy:
            self._next(upstream)

    # -- serving ------------------------------------------------------------------------

    def _server(self, client_version: int) -> SessionFetchServer:
        if self.server is None:
            translator = FetchTranslator(
                self.topic_ids,
                upstream_max_version=self.upstream_fetch_max or client_version,
                max_resends=self.max_resends,
                sessionless_backoff=self.sessionless_backoff,
            )
            self.server = SessionFetchServer(self.sessions, translator)
        return self.server

    def _next(self, upstream: Upstream) -> None:
        """Start queued fetches until one waits for upstream (a loop: no recursion per fetch)."""
        if self._starting:
            return  # an outer _next is already draining the queue
        self._starting = True
        try:
            while self._queue and not self._busy:
                request, decoded = self._queue[0]
                server = self._server(int(request.header.api_version))
                if not self._admit(request, decoded):
                    return  # waits (e.g. for memory budget); resume() starts it
                self._queue.popleft()
                self._fetches += 1
                self._busy = True
                self._round = [0, 0]
                self._client_sessionless = int(getattr(decoded, "session_epoch", -1)) == -1
                self._step(request, upstream, self._begin(server, request, decoded))
        finally:
            self._starting = False

    # -- hooks for a composed handler (proxy.fetchpath) ---------------------------------

    def _admit(self, request: ClientRequest, decoded: Any) -> bool:
        """May the fetch at the head of the queue start now? (False: it waits.)"""
        return True

    def _begin(
        self, server: SessionFetchServer, request: ClientRequest, decoded: Any
    ) -> UpstreamFetch | ClientReply:
        return server.begin(decoded)

    def _answered(self, request: ClientRequest, response: Any, frame: Payload) -> None:
        """A consumer fetch was answered with *response* (already queued as *frame*)."""

    def _step(
        self, request: ClientRequest, upstream: Upstream, step: UpstreamFetch | ClientReply
    ) -> None:
        if isinstance(step, ClientReply):
            self._reply(request, upstream, step.response)
            return
        self._maybe_ask_metadata(step.missing_topic_ids, upstream)
        version = int(step.request.__version__)
        server = self.server
        assert server is not None

        def on_response(frame: bytes) -> None:
            self._round[1] += len(frame)
            _, response = codec.decode_response(FETCH, version, frame)
            response = _records_as_views(response, version, frame)
            invalid_before = server.translator.stats.invalid_responses
            next_step = server.complete(response)
            if self.metrics is not None:
                reason = RESET_REASONS.get(int(getattr(response, "error_code", 0)))
                if reason is None and server.translator.stats.invalid_responses > invalid_before:
                    reason = ResetReason.OTHER
                if reason is not None:
                    self.metrics.fetch_session_reset(Side.UPSTREAM, reason)
            self._step(request, upstream, next_step)

        frame = codec.encode_request(step.request, 0, PROXY_CLIENT_ID)
        self._round[0] += len(frame)
        upstream.send(
            frame,
            api_key=FETCH,
            api_version=version,
            on_response=on_response,
        )

    def _reply(self, request: ClientRequest, upstream: Upstream, response: Any) -> None:
        h = request.header
        # Encoded as a gather list: the records stay views into the upstream frame
        # until they are written, never copied into a second response-sized buffer.
        frame = codec.encode_response_gathered(upstream.rewrite_decoded(response), h.correlation_id)
        request.reply(frame)
        self._answered(request, response, frame)
        up_request, up_response = self._round
        self.upstream_fetch_bytes += up_request + up_response
        self.client_fetch_bytes += len(request.frame) + len(frame)
        if self.metrics is not None and self._client_sessionless:
            # What the client's full fetch would have cost upstream, minus what it did.
            self.metrics.fetch_session_saved(
                request_bytes=max(0, len(request.frame) - up_request),
                response_bytes=max(0, len(frame) - up_response),
            )
        self._busy = False
        self._next(upstream)

    # -- topic ids and versions ---------------------------------------------------------

    def _maybe_ask_metadata(self, names: tuple[str, ...], upstream: Upstream) -> None:
        if not names or self._metadata_in_flight:
            return
        due = [
            n
            for n in names
            if self._fetches - self._asked.get(n, -self.metadata_retry_fetches)
            >= self.metadata_retry_fetches
        ]
        if not due:
            return
        version = min(self.upstream_metadata_max or MAX_METADATA_VERSION, MAX_METADATA_VERSION)
        if version < MIN_METADATA_WITH_IDS:
            return  # this upstream cannot tell us topic ids
        for n in due:
            self._asked.pop(n, None)
            self._asked[n] = self._fetches
        while len(self._asked) > self.max_asked_names:
            del self._asked[next(iter(self._asked))]
        mod = request_module(METADATA, version)
        request = mod.MetadataRequest(
            topics=tuple(mod.MetadataRequestTopic(topic_id=None, name=n) for n in due),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )
        self._metadata_in_flight = True

        def on_response(frame: bytes) -> None:
            self._metadata_in_flight = False
            try:
                _, response = codec.decode_response(METADATA, version, frame)
            except DecodeError:
                return
            self.topic_ids.learn_metadata(response)

        upstream.send(
            codec.encode_request(request, 0, PROXY_CLIENT_ID),
            api_key=METADATA,
            api_version=version,
            on_response=on_response,
        )

    def _learn_versions(self, api_version: int, frame: bytes) -> None:
        try:
            _, response = codec.decode_response(API_VERSIONS, api_version, frame)
        except DecodeError:
            return
        if int(getattr(response, "error_code", 0)) != 0:
            return
        for entry in response.api_keys:
            if int(entry.api_key) == FETCH:
                self.upstream_fetch_max = int(entry.max_version)
            elif int(entry.api_key) == METADATA:
                self.upstream_metadata_max = int(entry.max_version)


def _is_partition_data(cls: type) -> bool:
    return cls.__name__ == "PartitionData"


def _records_as_views(response: Any, version: int, frame: bytes) -> Any:
    """*response* with each partition's records a view of *frame* instead of kio's copy.

    kio copies every records field out of the frame, and the frame stays alive
    until the response is answered anyway: pointing into it frees the copies
    at once (a Fetch response's data is then held once, not twice).  The
    shaping layer copies what it keeps (``Run.split_view``), so no view
    outlives the exchange.  Anything unexpected keeps kio's copies.
    """
    schema = codec.response_schema(FETCH, version)
    hv = codec.response_header_version(FETCH, version)
    if schema is None or hv is None:
        return response
    try:
        spans = walk.field_spans(
            schema, frame, codec.response_body_offset(frame, hv), _is_partition_data, "records"
        )
    except DecodeError:
        return response
    if len(spans) != sum(len(t.partitions) for t in response.responses):
        return response
    view = memoryview(frame)
    ends = iter(end for _, end in spans)
    topics = []
    for topic in response.responses:
        parts = []
        for pd in topic.partitions:
            end = next(ends)
            records = pd.records
            if records:
                pd = dataclasses.replace(pd, records=view[end - len(records) : end])
            parts.append(pd)
        topics.append(dataclasses.replace(topic, partitions=tuple(parts)))
    return dataclasses.replace(response, responses=tuple(topics))
