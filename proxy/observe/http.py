"""The proxy's HTTP endpoint: ``/metrics``, ``/healthz``, ``/readyz``, ``/debug/sessions``.

Two halves, after h11's split:

- :class:`ObserveApp` maps a request (method, target, Accept header) to an
  :class:`HttpResponse`; plain code, no I/O.
- :func:`serve_http` is the trio edge: listeners, one task per connection, HTTP/1.1
  parsed by h11 with keep-alive (Prometheus reuses its scrape connection).

It runs in the proxy's own trio nursery, not a side thread: scrapes are rare and
cheap, and sharing the loop means ``/readyz`` and ``/debug/sessions`` read the
relay's state without locks.

Bounds: a request head above :data:`MAX_REQUEST_HEAD_BYTES` or a body above
:data:`MAX_REQUEST_BODY_BYTES` is refused (431/413); a new connection's first request
must arrive whole within ``request_timeout`` seconds of the accept, and a kept-alive
connection's next one must start within ``idle_timeout`` and then arrive whole within
``request_timeout`` (a request trickled byte by byte, slowloris, is cut there); a peer
must take its response within :data:`SEND_TIMEOUT_SECONDS`.  Malformed requests get
400 and close their connection, nothing else.

Probes are answered however many sockets are open: at most ``max_connections``
connections are held, and a new one always gets in.  At the limit, admitting it
closes the connection that has waited longest for a request (an idle keep-alive,
a request arriving too slowly), else the one that has waited longest on its send
(:class:`Held`).  A connection can only be pushed out by ``max_connections`` newer
ones, so sockets a peer leaves open (a leak, or on purpose) cost the endpoint
nothing but their own turn, where they used to take every slot and leave
``/healthz`` answering 503.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import h11
import structlog
import trio
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, generate_latest

from .exposition import TextEncoder

MAX_REQUEST_HEAD_BYTES = 8 * 1024
MAX_REQUEST_BODY_BYTES = 4 * 1024
SEND_TIMEOUT_SECONDS = 10.0
MAX_CONNECTIONS = 64
"""Connections held at once (a new one closes the longest-waiting one beyond it)."""
REQUEST_TIMEOUT_SECONDS = 5.0
"""A request (head and body) must arrive whole this soon (see the module docstring)."""
IDLE_TIMEOUT_SECONDS = 60.0
"""A kept-alive connection may wait this long for its next request to start."""
_RECEIVE_CHUNK = 4096

METRICS_PATH = "/metrics"
HEALTHZ_PATH = "/healthz"
READYZ_PATH = "/readyz"
DEBUG_SESSIONS_PATH = "/debug/sessions"
PATHS = (METRICS_PATH, HEALTHZ_PATH, READYZ_PATH, DEBUG_SESSIONS_PATH)

_log = structlog.get_logger("proxy.observe.http")


@dataclass(frozen=True, slots=True)
class Readiness:
    """Whether the proxy can serve clients, with the checks that decided it.

    The relay reports ``ready`` as: every listener bound and at least one upstream
    broker reachable.  ``checks`` names each condition (shown in /readyz's body).
    """

    ready: bool
    checks: Mapping[str, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, **checks: bool) -> Readiness:
        """Ready when every named check holds."""
        return cls(all(checks.values()), dict(checks))


@dataclass(frozen=True, slots=True)
class HttpResponse:
    status: int
    content_type: str
    body: bytes
    headers: tuple[tuple[str, str], ...] = ()


def _json(status: int, obj: Any) -> HttpResponse:
    body = json.dumps(obj, sort_keys=True, default=str).encode() + b"\n"
    return HttpResponse(status, "application/json", body)


def _text(status: int, text: str) -> HttpResponse:
    return HttpResponse(status, "text/plain; charset=utf-8", text.encode() + b"\n")


class ObserveApp:
    """Routes requests to the registry and the relay's callbacks.

    ``readiness`` is called on every /readyz.  ``debug_sessions`` returns a
    JSON-serialisable snapshot of fetch sessions (sessions, partition counts,
    epochs); when it is None (the default, as the config's
    ``debug_sessions = false``) /debug/sessions is 404 like any unknown path.
    ``refresh`` runs before each /metrics render, to set gauges that are cheaper
    to read at scrape time than to keep current (e.g. session cache sizes); if
    it fails, the metrics are served as they are and the failure is logged.
    """

    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: Callable[[], Readiness],
        *,
        debug_sessions: Callable[[], Any] | None = None,
        refresh: Callable[[], None] | None = None,
    ) -> None:
        self.registry = registry
        self.readiness = readiness
        self.debug_sessions = debug_sessions
        self.refresh = refresh
        self._text = TextEncoder()
        """The plain text format, each series' line prefix kept between scrapes."""

    def handle(self, method: str, target: str, accept: str = "") -> HttpResponse:
        path = target.split("?", 1)[0]
        routes: dict[str, Callable[[str], HttpResponse]] = {
            METRICS_PATH: self._metrics,
            HEALTHZ_PATH: lambda _accept: _text(200, "ok"),
            READYZ_PATH: lambda _accept: self._readyz(),
        }
        if self.debug_sessions is not None:
            routes[DEBUG_SESSIONS_PATH] = lambda _accept: self._sessions()
        route = routes.get(path)
        if route is None:
            return _text(404, "not found")
        if method not in ("GET", "HEAD"):
            return HttpResponse(405, "text/plain; charset=utf-8", b"", (("allow", "GET, HEAD"),))
        try:
            return route(accept)
        except Exception as exc:
            _log.error("http_handler_failed", path=path, error=repr(exc))
            return _text(500, "internal error")

    def _metrics(self, accept: str) -> HttpResponse:
        if self.refresh is not None:
            try:
                self.refresh()
            except Exception as exc:
                _log.error("metrics_refresh_failed", error=repr(exc))
        encoder, content_type = choose_encoder(accept)
        if encoder is generate_latest:  # the plain text format: the cached renderer's
            encoder = self._text
        return HttpResponse(200, content_type, encoder(self.registry))

    def _readyz(self) -> HttpResponse:
        state = self.readiness()
        return _json(
            200 if state.ready else 503,
            {"ready": state.ready, "checks": dict(state.checks)},
        )

    def _sessions(self) -> HttpResponse:
        assert self.debug_sessions is not None
        return _json(200, self.debug_sessions())


class _Closed(Exception):
    """The connection is finished (peer gone, timeout, or we decided to close)."""


class Held:
    """The connections the endpoint holds; a new one always gets in (module docstring).

    Each connection is known by its cancel scope (cancelling it closes the
    connection) and is either *waiting* for a request or *busy* answering one;
    each group is ordered by when it entered that state.
    """

    def __init__(self, limit: int) -> None:
        if limit < 1:
            raise ValueError("limit must be >= 1")
        self.limit = limit
        self._waiting: dict[trio.CancelScope, None] = {}
        self._busy: dict[trio.CancelScope, None] = {}
        self.evicted = 0
        """Connections closed to make room for newer ones."""

    def __len__(self) -> int:
        return len(self._waiting) + len(self._busy)

    def admit(self, scope: trio.CancelScope) -> None:
        """A new connection, waiting for its first request; makes room if at the limit."""
        if len(self) >= self.limit:
            group = self._waiting or self._busy
            victim = next(iter(group))
            del group[victim]
            victim.cancel()
            self.evicted += 1
            _log.debug("http_connection_evicted", held=len(self), limit=self.limit)
        self._waiting[scope] = None

    def waiting(self, scope: trio.CancelScope) -> None:
        """It waits for its next request (the newest of the waiting ones)."""
        self._busy.pop(scope, None)
        self._waiting[scope] = None

    def busy(self, scope: trio.CancelScope) -> None:
        """It has a whole request and is answering it."""
        self._waiting.pop(scope, None)
        self._busy[scope] = None

    def leave(self, scope: trio.CancelScope) -> None:
        self._waiting.pop(scope, None)
        self._busy.pop(scope, None)


async def serve_http(
    app: ObserveApp,
    host: str,
    port: int,
    *,
    max_connections: int = MAX_CONNECTIONS,
    request_timeout: float = REQUEST_TIMEOUT_SECONDS,
    idle_timeout: float = IDLE_TIMEOUT_SECONDS,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``app`` on ``host:port`` until cancelled; reports the bound port via ``task_status``.

    With ``port=0`` the OS picks the port; if ``host`` resolves to several
    addresses each listener may get its own, and the first one's is reported.
    """
    listeners = await trio.open_tcp_listeners(port, host=host)
    await serve_http_listeners(
        app,
        listeners,
        max_connections=max_connections,
        request_timeout=request_timeout,
        idle_timeout=idle_timeout,
        task_status=task_status,
    )


async def serve_http_listeners(
    app: ObserveApp,
    listeners: list[trio.SocketListener],
    *,
    max_connections: int = MAX_CONNECTIONS,
    request_timeout: float = REQUEST_TIMEOUT_SECONDS,
    idle_timeout: float = IDLE_TIMEOUT_SECONDS,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """:func:`serve_http` on listeners already bound (so a bind error comes before serving)."""
    held = Held(max_connections)

    async def handler(stream: trio.SocketStream) -> None:
        await _serve_connection(app, stream, held, request_timeout, idle_timeout)

    host, bound = listeners[0].socket.getsockname()[:2]
    _log.info("http_listening", address=_host_port(str(host), int(bound)))
    task_status.started(bound)
    await trio.serve_listeners(handler, listeners)


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _serve_connection(
    app: ObserveApp,
    stream: trio.abc.Stream,
    held: Held,
    request_timeout: float,
    idle_timeout: float,
) -> None:
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_REQUEST_HEAD_BYTES)
    scope = trio.CancelScope()
    held.admit(scope)
    try:
        with scope:
            # the first request: whole within request_timeout of the accept
            wait = request_timeout
            while True:
                await _serve_one(app, stream, conn, held, scope, wait, request_timeout)
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
                held.waiting(scope)
                wait = idle_timeout
    except _Closed:
        pass
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        held.leave(scope)
        await trio.aclose_forcefully(stream)


async def _serve_one(
    app: ObserveApp,
    stream: trio.abc.Stream,
    conn: h11.Connection,
    held: Held,
    connection: trio.CancelScope,
    wait: float,
    request_timeout: float,
) -> None:
    # The request's first bytes may take ``wait``; from them on, the whole request
    # (head and body) has request_timeout to complete.
    scope = trio.CancelScope(deadline=trio.current_time() + wait)
    request: h11.Request | None = None
    try:
        with scope:
            event = await _next_event(stream, conn, scope, request_timeout)
            if not isinstance(event, h11.Request):
                raise _Closed
            request = event
            body = 0
            while True:
                event = await _next_event(stream, conn, scope, request_timeout)
                if isinstance(event, h11.Data):
                    body += len(event.data)
                    if body > MAX_REQUEST_BODY_BYTES:
                        await _send(stream, conn, _text(413, "request body too large"), close=True)
                        raise _Closed
                elif isinstance(event, h11.EndOfMessage):
                    break
                else:
                    raise _Closed
    except h11.RemoteProtocolError as exc:
        status = exc.error_status_hint
        _log.info("http_bad_request", status=status, error=str(exc))
        if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            await _send(stream, conn, _text(status, "bad request"), close=True)
        raise _Closed from None
    if scope.cancelled_caught or request is None:
        if conn.our_state is h11.SEND_RESPONSE:
            await _send(stream, conn, _text(408, "request timeout"), close=True)
        raise _Closed
    held.busy(connection)
    method = request.method.decode("ascii", "replace")
    target = request.target.decode("ascii", "replace")
    accept = ", ".join(v.decode("latin-1") for k, v in request.headers if k == b"accept")
    response = app.handle(method, target, accept)
    await _send(stream, conn, response, head=method == "HEAD")


async def _next_event(
    stream: trio.abc.Stream, conn: h11.Connection, scope: trio.CancelScope, request_timeout: float
) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        data = await stream.receive_some(_RECEIVE_CHUNK)
        scope.deadline = min(scope.deadline, trio.current_time() + request_timeout)
        conn.receive_data(bytes(data))


async def _send(
    stream: trio.abc.Stream,
    conn: h11.Connection,
    response: HttpResponse,
    *,
    head: bool = False,
    close: bool = False,
) -> None:
    headers = [
        ("content-type", response.content_type),
        ("content-length", str(len(response.body))),
        ("cache-control", "no-store"),
        *response.headers,
    ]
    if close:
        headers.append(("connection", "close"))
    reason = HTTPStatus(response.status).phrase.encode()
    out = conn.send(h11.Response(status_code=response.status, headers=headers, reason=reason))
    assert out is not None
    if response.body and not head:
        data = conn.send(h11.Data(data=response.body))
        assert data is not None
        out += data
    end = conn.send(h11.EndOfMessage())
    assert end is not None
    out += end
    # a peer that does not read its response must not hold a connection slot forever
    with trio.move_on_after(SEND_TIMEOUT_SECONDS):
        await stream.send_all(out)
        return
    raise _Closed
