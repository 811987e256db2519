"""The proxy process: a bootstrap listener, one listener per upstream broker, discovery, readiness.

    async with trio.open_nursery() as nursery:
        proxy = await nursery.start(Proxy(settings).serve)
        proxy.bootstrap        # HostPort the clients use as bootstrap.servers

Broker listeners sit on ``broker_port_base + node_id`` (or the explicit
``broker_ports`` map; base 0 picks free ports).  At start the proxy asks the
upstream cluster for its brokers (retrying with backoff while none answers) and
binds a listener for each; brokers that first appear later in a response a
client receives get theirs on the fly, bound synchronously before that
response is sent (see ``proxy.relay.addresses``).  Brokers that do not answer
are probed again with backoff and shown in ``readiness()``.
"""

from __future__ import annotations

import errno
import itertools
import logging
import math
import random
import socket
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, NoReturn

import structlog
import trio
from kio.schema.api_versions.v0.request import ApiVersionsRequest
from kio.schema.api_versions.v0.response import ApiVersionsResponse

from ..config import ENV_PREFIX, FetchPathConfig, HostPort, Settings
from ..fetchpath import FetchPath
from ..observe.apply import drain as drain_effects
from ..observe.apply import watch_fetch_path
from ..protocol import codec
from ..protocol.apis import API_VERSIONS, METADATA
from ..protocol.errors import ProtocolError
from ..protocol.framing import Buffer, FrameDecoder, encode_frame
from ..protocol.messages import make, request_module
from ..relay import rewrite
from ..relay.addresses import AddressBook
from ..relay.apiversions import kio_range
from ..relay.connection_slots import ConnectionSlots
from ..relay.relay import FetchHandler, Relay
from ..relay.request_memory import RequestMemory
from ..sessions.as_broker import limit_session_partitions
from .connection import RECEIVE_BYTES, Connection, ImmediateWrites
from .idle import IdleTimer
from .replicas import ReplicaLinks, TaskHost
from .silent import SilentSockets
from .sockets import LeanSocketStream, lean
from .upstream import LazyUpstream, client_ssl_context, open_upstream, server_ssl_context

log = structlog.get_logger("proxy.server")

_ACCEPT_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""accept() failures that say the process or system is out of resources, not that the
listener is broken (trio's ``serve_listeners`` retries these too)."""
_ACCEPT_IGNORED_ERRNOS = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EPERM, errno.EINTR})
"""accept() failures that concern one connection only (it was reset while queued, or a
firewall refused it), as trio's ``SocketListener`` ignores them: go on accepting."""
_ACCEPT_RETRY_SECONDS = 0.1
ACCEPT_PER_TURN = 16
"""Connections accepted per scheduler turn: a burst of connects (a leak, a scanner) is
taken in steps others get to run between (60-80 µs of the loop's CPU each, 300-400 µs
when it displaces a silent connection, whose close writes a warning line)."""
FIRST_REQUEST_SPREAD = 0.1
"""A connection's first-request deadline is ``first_request_timeout_seconds`` times 1 to
1 + this after its accept (at random)."""

_CONNECT_ERRORS = (
    OSError,
    ssl.SSLError,
    trio.TooSlowError,
    trio.BrokenResourceError,
    trio.ClosedResourceError,
    ProtocolError,
)


def _setting_hint(key: str) -> str:
    """How a user sets *key*: its flag, its environment variable and the config-file key."""
    return f"--{key.replace('_', '-')} / {ENV_PREFIX}{key.upper()} / {key} in the config file"


def _bind_problem(error: OSError) -> str:
    if isinstance(error, socket.gaierror):
        return f"cannot resolve the host ({error.strerror})"
    if error.errno == errno.EADDRINUSE:
        return "the port is already in use by another process"
    if error.errno == errno.EACCES:
        return "permission denied (ports below 1024 need root or CAP_NET_BIND_SERVICE)"
    if error.errno == errno.EADDRNOTAVAIL:
        return "the host is not an address of this machine"
    return error.strerror or str(error)


class ListenError(OSError):
    """A listener could not bind its address.

    Its message names the address, the setting that chose it (``listen``,
    ``metrics_listen``, ``broker_port_base`` or ``broker_ports`` with the node id),
    the problem and what to do; ``kafka-fetch-proxy run`` prints it and exits 2.
    """

    def __init__(
        self, setting: str, address: HostPort, error: OSError, *, node_id: int | None = None
    ) -> None:
        super().__init__(error.errno, _bind_problem(error))
        self.setting = setting
        self.address = address
        self.node_id = node_id
        self.problem = _bind_problem(error)
        port = address.port
        if setting == "broker_ports":
            what = f"broker node {node_id}'s listener (setting broker_ports: {node_id} = {port})"
            self.hint = (
                f"give node {node_id} a free port in broker_ports ({_setting_hint('broker_ports')})"
            )
        elif setting == "broker_port_base":
            what = (
                f"broker node {node_id}'s listener"
                f" (setting broker_port_base: {port - (node_id or 0)} + node id {node_id})"
            )
            self.hint = (
                f"choose a broker_port_base whose port + node id is free for every broker"
                f" ({_setting_hint('broker_port_base')}; 0 picks free ports), or give node"
                f" {node_id} its own port with broker_ports = {{ {node_id} = PORT }}"
            )
        else:
            kind = "bootstrap" if setting == "listen" else "metrics"
            what = f"the {kind} listener (setting {setting})"
            self.hint = f"choose another HOST:PORT with {_setting_hint(setting)}"
        if error.errno == errno.EADDRINUSE and port:
            self.hint = (
                f"stop the process holding port {port} (`ss -ltnp 'sport = :{port}'` shows it),"
                f" or {self.hint}"
            )
        self.what = what

    def __str__(self) -> str:
        return f"cannot listen on {self.address} for {self.what}: {self.problem}; {self.hint}"

    def log_fields(self) -> dict[str, Any]:
        """The fields of its log lines (``listen_failed``, ``startup_failed``)."""
        return {
            "address": str(self.address),
            "setting": self.setting,
            "node_id": self.node_id,
            "error": self.problem,
            "hint": self.hint,
        }


def describe_connect_error(exc: BaseException) -> str:
    """``Class: message`` of a failed upstream connection, with the causes trio groups."""
    cause = exc.__cause__
    if isinstance(cause, BaseExceptionGroup):
        texts = dict.fromkeys(f"{type(e).__name__}: {e}" for e in cause.exceptions)
        return "; ".join(texts)
    return f"{type(exc).__name__}: {exc}"


UPSTREAM_DOWN_HINT = (
    "no broker of the upstream setting answers: client connections are closed"
    " (clients report e.g. 'Disconnected while requesting ApiVersion') and /readyz answers 503"
    " until one does; retrying"
)
CLIENT_CLOSED_HINT = (
    "the proxy could not reach upstream (see upstream_connect_failed): the client connection"
    " was closed; clients report e.g. 'Disconnected while requesting ApiVersion' until"
    " upstream is reachable"
)
FIRST_REQUEST_TIMEOUT_HINT = (
    "no whole request within first_request_timeout_seconds of the accept (Kafka's clients"
    " send ApiVersions at once): a client or scanner holding idle connections; for slow TLS"
    " clients raise it ({flag})"
)
DISPLACED_HINT = (
    "max_connections was reached and this connection had sent no whole request (Kafka's"
    " clients send ApiVersions at once): it gave its slot to a newer connection; a client or"
    " scanner is leaking idle connections (raise max_connections ({flag}) if these are expected)"
)


@dataclass(slots=True, eq=False)
class _Slot:
    """A client connection's hold on one of ``max_connections`` (``ConnectionSlots``' handle)."""

    first: trio.CancelScope
    """Open until its first whole request: cancelled at ``first_request_timeout_seconds`` or
    when it gives its slot to a newcomer."""
    accepted: float
    conn_id: str = ""
    client_addr: str = "?"
    node_id: int | None = None
    displaced: bool = False
    sock: socket.socket | None = None
    """The socket while it has sent no byte: watched by ``Proxy.silent``, no task yet."""

    def log_fields(self) -> dict[str, Any]:
        """The fields a connection's task binds to its log lines (for lines written
        without it: a silent socket's end)."""
        return {
            "conn_id": self.conn_id,
            "client_addr": self.client_addr,
            "listener": "bootstrap" if self.node_id is None else "broker",
            "node_id": self.node_id,
        }


@dataclass(slots=True, eq=False)
class LiveConnection:
    """A client connection being served (what /debug/sessions reads)."""

    conn_id: str
    node_id: int | None
    relay: Relay
    connection: Connection


_CLOSE_CAUSES = {
    "client_closed": "peer_closed",
    "upstream_closed": "upstream_closed",
    "protocol_error": "protocol_error",
    "io_error": "io_error",
    "idle_timeout": "idle_timeout",
    "first_request_timeout": "first_request_timeout",
    "frame_timeout": "frame_timeout",
    "client_write_timeout": "client_write_timeout",
    "displaced": "displaced",
    "cancelled": "shutdown",
    "drained": "shutdown",
}


class Proxy:
    def __init__(
        self,
        settings: Settings,
        *,
        metrics: Any | None = None,
        decision_log: Any | None = None,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.decision_log = decision_log
        """The open ``proxy.observe.decisionlog.DecisionLog`` (None: off), for fetch handlers."""
        self.live: dict[str, LiveConnection] = {}
        """Connections being served, by conn_id."""
        self.request_memory = RequestMemory(
            settings.max_buffered_request_bytes, per_connection=settings.max_queued_request_bytes
        )
        """What the client connections hold of requests (``proxy.relay.request_memory``)."""
        self.metrics_refreshers: list[Callable[[], None]] = []
        """Called before each /metrics scrape, e.g. to set session-cache gauges."""
        self.upstream_ssl = client_ssl_context(settings.upstream_tls)
        self.downstream_ssl = server_ssl_context(settings.downstream_tls)
        self.book = AddressBook(settings.advertised_host, settings.broker_port, self._bind_broker)
        self.bootstrap: HostPort | None = None
        self._bootstrap_sock: socket.socket | None = None
        self.reachable: dict[int, bool] = {}
        self.upstream_seen = False
        self.upstream_auth_only = False
        """Discovery found an upstream that answers but wants SASL before Metadata."""
        self.slots: ConnectionSlots[_Slot] = ConnectionSlots()
        """The connections counted against ``max_connections`` (``proxy.relay.connection_slots``)."""
        self.discovered = trio.Event()
        self._state_changed = trio.Event()
        self._nursery: trio.Nursery | None = None
        self.draining = False
        """True once ``drain()`` began: listeners closed, connections finishing."""
        self._drains: set[DrainableStream] = set()
        self.silent: SilentSockets[_Slot] = SilentSockets(
            self._silent_spoke, self._silent_ended, self._silent_expired
        )
        """Plain-TCP connections that have not sent a byte yet: no task each, one watcher
        for all (``proxy.server.silent``); ``drain()`` closes them."""
        self._connections: trio.Nursery | None = None
        self.idle = (
            IdleTimer(settings.idle_timeout_seconds) if settings.idle_timeout_seconds > 0 else None
        )
        """Every client connection's idle timeout, on one task (``proxy.server.idle``)."""
        self._listen_scope = trio.CancelScope()
        self._served = trio.Event()
        self._conn_ids = itertools.count(1)
        self._bootstrap_turn = 0
        self.bind_failures: dict[int, ListenError] = {}
        """Broker listeners that could not bind, by node id (retried when next announced)."""
        self.fetch_path = FetchPath(FetchPathConfig.from_raw(settings.raw))
        """The Fetch path (upstream sessions and shaping): one handler per client connection;
        each connection drains its handler's effects to the metrics and the decision log."""
        self.fetch_path.starved_detail = decision_log is not None
        if metrics is not None:
            watch_fetch_path(metrics, self.fetch_path)
            pool = self.request_memory
            self.metrics_refreshers.append(
                lambda: metrics.set_request_memory(
                    held=pool.held, reserved=pool.used, waiting=pool.waiting
                )
            )
            from ..observe.session_snapshot import SessionGauges

            gauges = SessionGauges(metrics)
            self.metrics_refreshers.append(
                lambda: gauges.refresh(
                    (live.relay.fetch_handler for live in list(self.live.values())),
                    self.fetch_path.client_session_caches(),
                )
            )

    # --- public state ----------------------------------------------------------------------

    @property
    def open_connections(self) -> int:
        """Client connections holding a slot of ``max_connections``."""
        return len(self.slots)

    def readiness(self) -> tuple[bool, dict[str, bool]]:
        """(ready, checks): ready when every listener is bound and an upstream broker answered."""
        checks = {
            "bootstrap_listener_bound": self.bootstrap is not None,
            "broker_listeners_bound": set(self.book.upstream) <= set(self.book.advertised),
            "upstream_reachable": self.upstream_seen
            and (any(self.reachable.values()) or self.upstream_auth_only),
        }
        for node_id in sorted(self.reachable):
            checks[f"broker_{node_id}_reachable"] = self.reachable[node_id]
        if self.draining:
            checks["draining"] = True
        ready = (
            checks["bootstrap_listener_bound"]
            and checks["broker_listeners_bound"]
            and checks["upstream_reachable"]
            and not self.draining
        )
        return ready, checks

    async def wait_ready(self) -> None:
        """Return once ``readiness()`` says ready."""
        while not self.readiness()[0]:
            await self._state_changed.wait()

    def broker_address(self, node_id: int) -> tuple[str, int] | None:
        return self.book.advertised.get(node_id)

    # --- serving ---------------------------------------------------------------------------

    def bind(self) -> HostPort:
        """Bind the bootstrap listener now (ListenError if the address is taken); idempotent."""
        if self._bootstrap_sock is None:
            listen = self.settings.listen
            try:
                self._bootstrap_sock = _bind_socket(listen.host, listen.port)
            except OSError as exc:
                raise ListenError("listen", listen, exc) from exc
            self.bootstrap = HostPort(listen.host, self._bootstrap_sock.getsockname()[1])
        assert self.bootstrap is not None
        return self.bootstrap

    async def serve(
        self, *, task_status: trio.TaskStatus[Proxy] = trio.TASK_STATUS_IGNORED
    ) -> None:
        self.bind()
        try:
            # The idle timer serves every connection: it stops once they have all ended.
            async with trio.open_nursery() as timers:
                if self.idle is not None:
                    timers.start_soon(self.idle.run)
                await self._serve_connections(task_status)
                timers.cancel_scope.cancel()
        finally:
            self._served.set()

    async def _serve_connections(self, task_status: trio.TaskStatus[Proxy]) -> None:
        # Client connections live in their own nursery, so that drain() can close
        # the listeners (and stop discovery and probes) while they finish.
        async with trio.open_nursery() as connections:
            self._connections = connections
            try:
                with self._listen_scope:
                    async with trio.open_nursery() as nursery:
                        self._nursery = nursery
                        await nursery.start(self.silent.run)
                        assert self._bootstrap_sock is not None
                        nursery.start_soon(self._serve_listener, self._bootstrap_sock, None)
                        log.info(
                            "listener_bound",
                            listener="bootstrap",
                            address=str(self.bootstrap),
                        )
                        nursery.start_soon(self._discover)
                        task_status.started(self)
            finally:  # stopped or cancelled: no socket is left open unwatched
                self._close_silent_sockets()
            log.info("listeners_closed", connections=len(self._drains))

    async def drain(self) -> None:
        """Stop serving: the listeners first, then each connection once it is answered.

        The listening sockets close (new connections are refused); every client
        connection stops reading requests and closes as soon as each request it had
        read is answered and the answer written (a long-poll Fetch when its wait
        ends).  Returns when ``serve()`` has returned; the caller bounds the wait
        (``shutdown_grace_seconds``) and cancels what is left.
        """
        self.draining = True
        self._listen_scope.cancel()
        for stream in list(self._drains):
            stream.drain()
        self._close_silent_sockets()
        await self._served.wait()

    def _close_silent_sockets(self) -> None:
        for sock, slot in self.silent.items():
            self.silent.remove(sock)
            self._close_silent(slot, "drained")

    def _bind_broker(self, node_id: int, port: int) -> int | None:
        if self.draining:  # no new listeners while stopping
            return None
        assert self._nursery is not None
        host = self.settings.listen.host
        try:
            sock = _bind_socket(host, port)
        except OSError as exc:
            setting = (
                "broker_ports" if node_id in self.settings.broker_ports else "broker_port_base"
            )
            failure = ListenError(setting, HostPort(host, port), exc, node_id=node_id)
            self.bind_failures[node_id] = failure
            log.error("listen_failed", listener="broker", **failure.log_fields())
            return None
        self.bind_failures.pop(node_id, None)
        bound = int(sock.getsockname()[1])
        self._nursery.start_soon(self._serve_listener, sock, node_id)
        log.info(
            "listener_bound", listener="broker", node_id=node_id, address=str(HostPort(host, bound))
        )
        return bound

    async def _serve_listener(self, sock: socket.socket, node_id: int | None) -> None:
        """Accept connections until the listener is closed (``drain()``).

        Each accepted connection is admitted or refused here, at once: a refused one costs
        no task.  An admitted plain-TCP one is handed to the silent-socket watcher
        (``self.silent``) until its first byte: a socket that never sends costs no task, and
        its end (closed by the peer, its first-request deadline, or its slot given to a
        newcomer, ``proxy.relay.connection_slots``) is handled there in bounded steps.  At
        most ``ACCEPT_PER_TURN`` connections are accepted per scheduler turn, on the raw
        socket (trio's ``serve_listeners`` would add a task step and a forced close per
        connection, its ``SocketListener`` a wrapper and a checkpoint per accept): at a
        burst of a thousand sockets (a leak, a scanner) those steps are what other clients
        wait for.
        """
        sock.setblocking(False)
        try:
            while True:
                await trio.lowlevel.wait_readable(sock)
                for _ in range(ACCEPT_PER_TURN):
                    try:
                        client, address = sock.accept()
                    except BlockingIOError:
                        break
                    except OSError as exc:
                        if exc.errno in _ACCEPT_IGNORED_ERRNOS:
                            continue
                        if exc.errno not in _ACCEPT_CAPACITY_ERRNOS:
                            raise
                        # out of file descriptors or memory: try again shortly, as trio's
                        # serve_listeners does, rather than spin or stop accepting for good
                        log.error("accept_failed", error=f"{type(exc).__name__}: {exc}")
                        await trio.sleep(_ACCEPT_RETRY_SECONDS)
                        break
                    self._accepted(client, address, node_id)
        finally:
            sock.close()  # stopped (drain): new connections are refused, not queued

    def _accepted(self, client: socket.socket, address: Any, node_id: int | None) -> None:
        client.setblocking(False)
        slot = self._admit(client, _address(address), node_id)
        if slot is None:
            return
        if self.metrics is not None:
            self.metrics.connection_accepted()
        if self.downstream_ssl is None:  # served from its first byte on
            slot.sock = client
            self.silent.add(client, slot, slot.first.deadline)
        else:  # the TLS handshake is its first request's time
            assert self._connections is not None
            self._connections.start_soon(self._handle_client, client, node_id, slot)

    def _admit(
        self, client: socket.socket | None, client_addr: str, node_id: int | None = None
    ) -> _Slot | None:
        """A slot of ``max_connections`` for the accepted *client*, or None: refused (closed).

        Until the client's first whole request (TLS handshake included) the slot can be
        lost: at ``first_request_timeout_seconds`` after the accept, or at the limit to
        a newcomer when it is the silent connection that has waited longest.  Only when
        every connection has spoken is a newcomer refused.
        """
        now = trio.current_time()
        timeout = self.settings.first_request_timeout_seconds
        # Spread over a tenth of the timeout: sockets accepted together (a thousand at
        # once) do not all time out in the same scheduler turn, which others wait behind.
        deadline = now + timeout * (1 + FIRST_REQUEST_SPREAD * random.random())
        slot = _Slot(
            trio.CancelScope(deadline=deadline if timeout else math.inf),
            now,
            client_addr=client_addr,
            node_id=node_id,
        )
        admitted, displaced = self.slots.admit(slot, self.settings.max_connections)
        if not admitted:
            log.warning(
                "connection_refused",
                reason="max_connections",
                client_addr=client_addr,
                count=self.open_connections,
                limit=self.settings.max_connections,
                hint="raise max_connections"
                f" ({_setting_hint('max_connections')}) if these clients are expected",
            )
            if self.metrics is not None:
                self.metrics.connection_refused("max_connections")
            if client is not None:
                client.close()
            return None
        slot.conn_id = f"c{next(self._conn_ids)}"
        if displaced is not None:
            displaced.displaced = True
            if displaced.sock is not None and self.silent.remove(displaced.sock):
                self._close_silent(displaced, "displaced")
            else:  # it closes in its own task, with its own log line
                displaced.first.cancel()
        return slot

    # --- connections without a byte yet (``self.silent``'s callbacks) ------------------------

    def _silent_spoke(self, slot: _Slot, sock: socket.socket) -> None:
        slot.sock = None
        assert self._connections is not None
        self._connections.start_soon(self._handle_client, sock, slot.node_id, slot)

    def _silent_ended(self, slot: _Slot, sock: socket.socket, error: OSError | None) -> None:
        self._close_silent(slot, "client_closed" if error is None else "io_error", error)

    def _silent_expired(self, slot: _Slot, sock: socket.socket) -> None:
        self._close_silent(slot, "first_request_timeout")

    def _close_silent(self, slot: _Slot, reason: str, error: OSError | None = None) -> None:
        """Close a connection that never sent a byte, with the log line and metric its
        task would have written (no task step: a thousand of them end in bounded turns)."""
        sock, slot.sock = slot.sock, None
        self.slots.leave(slot)
        if reason in ("client_closed", "drained"):
            # not a Kafka client: a TCP probe, a port scan, the end of a leak
            # (a thousand sockets at once: each line is time others wait for)
            log.debug("connection_closed", reason=reason, **slot.log_fields())
        elif reason == "io_error":
            log.info(
                "connection_closed",
                reason=reason,
                error=f"{type(error).__name__}: {error}",
                **slot.log_fields(),
            )
        else:
            self._log_first_request_end(reason, slot, **slot.log_fields())
        if self.metrics is not None:
            self.metrics.connection_closed(_CLOSE_CAUSES[reason])
        if sock is not None:
            sock.close()

    def _log_first_request_end(self, reason: str, slot: _Slot, **fields: Any) -> None:
        """The line of a connection closed before its first whole request: displaced at
        ``max_connections`` (a warning) or at ``first_request_timeout_seconds``."""
        if reason == "displaced":
            log.warning(
                "connection_closed",
                reason=reason,
                limit=self.settings.max_connections,
                waited_seconds=round(trio.current_time() - slot.accepted, 3),
                hint=DISPLACED_HINT.format(flag=_setting_hint("max_connections")),
                **fields,
            )
        else:
            log.info(
                "connection_closed",
                reason=reason,
                timeout_seconds=self.settings.first_request_timeout_seconds,
                hint=FIRST_REQUEST_TIMEOUT_HINT.format(
                    flag=_setting_hint("first_request_timeout_seconds")
                ),
                **fields,
            )

    async def _handle_client(self, sock: socket.socket, node_id: int | None, slot: _Slot) -> None:
        try:
            await self._serve_client(trio.SocketStream(trio.socket.from_stdlib_socket(sock)), slot)
        finally:
            self.slots.leave(slot)

    async def _serve_client(self, stream: trio.SocketStream, slot: _Slot) -> None:
        structlog.contextvars.clear_contextvars()
        conn_id = slot.conn_id
        node_id = slot.node_id
        structlog.contextvars.bind_contextvars(**slot.log_fields())
        reason = "cancelled"
        client: trio.abc.Stream = stream
        upstream: LazyUpstream | None = None
        fetch_handler: FetchHandler | None = None
        conn: Connection | None = None
        # The broker connection opens when the first request is relayed (LazyUpstream).
        first = slot.first
        try:
            with first:
                # plain TCP: its first byte is there (``self.silent`` watched until then)
                if self.downstream_ssl is not None:
                    client = trio.SSLStream(stream, self.downstream_ssl, server_side=True)
                    with trio.fail_after(self.settings.connect_timeout_seconds):
                        await client.do_handshake()
                limit_session_partitions(
                    self.fetch_path.sessions_for(node_id),
                    self.settings.max_fetch_session_partitions,
                )
                path_handler = self.fetch_path.handler(node_id)
                # its own connections to preferred read replicas (never the client's)
                links = ReplicaLinks(
                    self._replica_address,
                    self.upstream_ssl,
                    connect_timeout=self.settings.connect_timeout_seconds,
                    max_frame_bytes=self.settings.max_frame_bytes,
                    bodies=self.fetch_path.bodies,
                )
                links.wake = path_handler.wake
                links.reserve = path_handler.reserve_response
                path_handler.replicas = links
                fetch_handler = path_handler
                relay = Relay(
                    self.book.resolve,
                    fetch_handler=fetch_handler,
                    max_in_flight=self.settings.max_in_flight,
                )
                upstream = LazyUpstream(
                    partial(self._connect_for, node_id),
                    on_open=lambda opened: self._upstream_opened(conn, node_id, opened),
                    on_failure=first.cancel,
                )
                drainable = DrainableStream(lean(client))
                conn = Connection(
                    drainable,
                    upstream,
                    relay,
                    max_frame_bytes=self.settings.max_frame_bytes,
                    max_client_buffer_bytes=self.settings.max_client_buffer_bytes,
                    idle=self.idle,
                    client_write_timeout=self.settings.client_write_timeout_seconds,
                    max_request_frame_bytes=self.settings.max_request_frame_bytes,
                    request_frame_timeout=self.settings.request_frame_timeout_seconds,
                    request_memory=self.request_memory,
                    meter=self._meter(node_id),
                    drain_effects=partial(
                        drain_effects, path_handler, self.metrics, self.decision_log
                    ),
                    bodies=self.fetch_path.bodies,
                )
                # a link's task, and the wait for quiet once draining, run beside its loops
                links.host = drainable.host = conn
                conn.on_request = partial(_first_request_arrived, self.slots, slot, conn)
                self.live[conn_id] = LiveConnection(conn_id, node_id, relay, conn)
                drainable.quiet = _answered(relay, conn)
                drainable.before_close = conn.close_upstream_session
                self._drains.add(drainable)
                if self.draining:  # accepted just before the listeners closed
                    drainable.drain()
                try:
                    reason = await drainable.serve(conn.run)
                finally:
                    self._drains.discard(drainable)
                    # These refer to conn, which holds them: without this the closed
                    # connection would wait for a full collection (every 60 s, server.cli).
                    drainable.quiet = _always_quiet
                    drainable.before_close = None
                    drainable.host = links.host = None
                    upstream.detach()
            if first.cancelled_caught and upstream is not None and upstream.failed:
                reason = "upstream_unreachable"
                log.warning("connection_closed", reason=reason, hint=CLIENT_CLOSED_HINT)
            elif first.cancelled_caught:
                reason = "displaced" if slot.displaced else "first_request_timeout"
                self._log_first_request_end(reason, slot)
            elif reason == "drained" and conn is not None:
                log.info("connection_closed", reason=reason, client_id=conn.client_id)
        except (OSError, ssl.SSLError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            reason = "io_error"
            log.info("connection_closed", reason=reason, error=f"{type(exc).__name__}: {exc}")
        except Exception as exc:  # a bug in one connection must not stop the listener
            reason = "internal_error"
            log.exception("connection_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self.live.pop(conn_id, None)
            cause = _CLOSE_CAUSES.get(reason, "other")
            if conn is not None and conn.outcome.frame_too_large:
                cause = "frame_too_large"
            # Accounting first: the awaits below are checkpoints, and a cancelled
            # close (the proxy stopping) must not skip it.
            if self.metrics is not None:
                if upstream is not None and upstream.stream is not None:
                    self.metrics.broker_connection_closed(node_id, cause)
                self.metrics.connection_closed(cause)
            if fetch_handler is not None:
                # gives back what this connection held: its memory budget grants, its
                # partitions in flight (max_partitions_in_flight), its sessions
                fetch_handler.close()
            if upstream is not None:
                await trio.aclose_forcefully(upstream)
            if client is stream:
                stream.socket.close()  # plain TCP: nothing to flush, no task step needed
            else:
                await trio.aclose_forcefully(client)

    def _upstream_opened(
        self, conn: Connection | None, node_id: int | None, stream: trio.abc.Stream
    ) -> None:
        """The client's first relayed request opened its broker connection."""
        if conn is not None:  # the connection talks to the broker directly from now on
            conn.upstream = lean(stream)
        if self.metrics is not None:
            self.metrics.broker_connection_opened(node_id)

    def _meter(self, node_id: int | None) -> Any:
        if self.metrics is None:
            return None
        from ..observe.traffic import TrafficMeter

        return TrafficMeter(self.metrics, node=node_id)

    # --- observability ---------------------------------------------------------------------

    def debug_sessions(self) -> dict[str, Any]:
        """The JSON of /debug/sessions: the live connections' upstream fetch sessions."""
        from ..observe.session_snapshot import SessionEntry, sessions_snapshot

        entries = []
        for live in list(self.live.values()):
            session = live.relay.fetch_handler.upstream_session
            if session is not None:
                entries.append(
                    SessionEntry(live.conn_id, live.connection.client_id, live.node_id, session)
                )
        return sessions_snapshot(entries, downstream=self.fetch_path.client_session_caches())

    def refresh_metrics(self) -> None:
        """Before each scrape: run ``metrics_refreshers`` (gauges read from live state)."""
        for refresh in list(self.metrics_refreshers):
            refresh()

    def _replica_address(self, node_id: int) -> HostPort | None:
        """A broker's address, for a connection of the proxy's own to a preferred replica."""
        address = self.book.upstream.get(node_id)
        return None if address is None else HostPort(*address)

    async def _connect_for(self, node_id: int | None) -> trio.abc.Stream | None:
        """An upstream stream for a client of ``node_id``'s listener (None: the bootstrap)."""
        candidates: list[tuple[int | None, HostPort]]
        if node_id is not None and node_id in self.book.upstream:
            candidates = [(node_id, HostPort(*self.book.upstream[node_id]))]
        else:
            start = self._bootstrap_turn
            self._bootstrap_turn += 1
            ups = list(self.settings.upstream)
            ups = ups[start % len(ups) :] + ups[: start % len(ups)]
            candidates = [(None, a) for a in ups] + [
                (n, HostPort(*a)) for n, a in sorted(self.book.upstream.items())
            ]
        for candidate_node, address in candidates:
            try:
                with trio.fail_after(self.settings.connect_timeout_seconds):
                    stream = await open_upstream(address, self.upstream_ssl)
            except _CONNECT_ERRORS as exc:
                log.warning(
                    "upstream_connect_failed",
                    upstream=str(address),
                    error=describe_connect_error(exc),
                )
                if candidate_node is not None:
                    self._mark(candidate_node, False)
                if self.metrics is not None:
                    self.metrics.broker_connect_failed(candidate_node)
                continue
            if candidate_node is not None:
                self._mark(candidate_node, True)
            log.debug("upstream_connected", upstream=str(address))
            return stream
        return None

    def _readiness_changed(self) -> None:
        """Wake ``wait_ready()``: what ``readiness()`` reads has changed."""
        self._state_changed.set()
        self._state_changed = trio.Event()

    def _mark(self, node_id: int, reachable: bool) -> None:
        was = self.reachable.get(node_id)
        self.reachable[node_id] = reachable
        self._readiness_changed()
        if was is not None and was != reachable:
            log.info("broker_reachable" if reachable else "broker_unreachable", node_id=node_id)
        if self.metrics is not None:
            self.metrics.set_brokers_reachable(sum(self.reachable.values()))

    # --- discovery and probing -------------------------------------------------------------

    async def _discover(self) -> None:
        """Learn the brokers from the upstream bootstrap list, retrying with backoff.

        Raises ListenError when a broker's listener cannot bind then: the proxy
        could not serve that broker's clients (later brokers only log it).
        """
        backoff = self.settings.retry_backoff_initial_seconds
        for attempt in itertools.count(1):
            for address in self.settings.upstream:
                try:
                    with trio.fail_after(self.settings.connect_timeout_seconds):
                        brokers, racks = await self._fetch_brokers(address)
                except AuthenticationRequired:
                    log.info(
                        "upstream_requires_authentication",
                        upstream=str(address),
                        hint="the upstream answers ApiVersions but wants SASL first; the "
                        "proxy holds no credentials and learns the brokers (and binds their "
                        "listeners) from the Metadata authenticated clients fetch through it",
                    )
                    self.upstream_seen = True
                    self.upstream_auth_only = True
                    self._readiness_changed()
                    self.discovered.set()
                    return
                except Exception as exc:  # discovery must never take the proxy down
                    log.log(
                        logging.WARNING if isinstance(exc, _CONNECT_ERRORS) else logging.ERROR,
                        "upstream_unreachable",
                        upstream=str(address),
                        attempt=attempt,
                        backoff_seconds=backoff,
                        error=describe_connect_error(exc),
                        hint=UPSTREAM_DOWN_HINT,
                    )
                    continue
                self.upstream_seen = True
                for node_id, (host, port) in sorted(brokers.items()):
                    self.book.resolve(node_id, host, port)
                    self.reachable.setdefault(node_id, False)
                for node_id in sorted(brokers):
                    if node_id in self.bind_failures:
                        raise self.bind_failures[node_id]
                log.info("upstream_discovered", upstream=str(address), count=len(brokers))
                level, fields = rack_brokers(self.settings.rack, racks)
                log.log(level, "rack_brokers", **fields)
                for node_id, rack in racks.items():  # the rack metrics know the brokers at once
                    self.fetch_path.racks.learn_broker(node_id, rack)
                assert self._nursery is not None
                for node_id in sorted(brokers):
                    self._nursery.start_soon(self._probe, node_id)
                self.discovered.set()
                return
            await trio.sleep(backoff)
            backoff = min(backoff * 2, self.settings.retry_backoff_max_seconds)

    async def _probe(self, node_id: int) -> None:
        """Check a broker answers; retry with backoff until it does (for readiness and logs)."""
        backoff = self.settings.retry_backoff_initial_seconds
        for attempt in itertools.count(1):
            address = HostPort(*self.book.upstream[node_id])
            try:
                with trio.fail_after(self.settings.connect_timeout_seconds):
                    stream = await open_upstream(address, self.upstream_ssl)
                await trio.aclose_forcefully(stream)
            except Exception as exc:  # probing must never take the proxy down
                self._mark(node_id, False)
                log.warning(
                    "broker_unreachable",
                    node_id=node_id,
                    upstream=str(address),
                    attempt=attempt,
                    backoff_seconds=backoff,
                    error=describe_connect_error(exc),
                )
                await trio.sleep(backoff)
                backoff = min(backoff * 2, self.settings.retry_backoff_max_seconds)
                continue
            self._mark(node_id, True)
            return

    async def _fetch_brokers(
        self, address: HostPort
    ) -> tuple[dict[int, tuple[str, int]], dict[int, str | None]]:
        """(each broker's upstream endpoint, each broker's ``broker.rack`` or None), by node id."""
        stream = await open_upstream(address, self.upstream_ssl)
        try:
            decoder = FrameDecoder(self.settings.max_frame_bytes)
            versions_frame = await _exchange(
                stream, decoder, codec.encode_request(ApiVersionsRequest(), 0, "kafka-fetch-proxy")
            )
            _, versions = codec.decode_response(API_VERSIONS, 0, versions_frame)
            version = _metadata_version(versions)
            request = _metadata_request(version)
            try:
                frame = await _exchange(
                    stream, decoder, codec.encode_request(request, 1, "kafka-fetch-proxy")
                )
            except ProtocolError as exc:
                # It answered ApiVersions and closed on Metadata: what a SASL listener does
                # with any other request before authentication.  The proxy holds no
                # credentials; the brokers are learnt from the Metadata clients fetch.
                raise AuthenticationRequired(str(address)) from exc
            brokers = rewrite.collect_endpoints(METADATA, version, frame)
            if not brokers:
                # Metadata v13+ can answer with a top-level error instead (KIP-1102's
                # REBOOTSTRAP_REQUIRED): not a discovery; the next bootstrap address is tried.
                _, response = codec.decode_response(METADATA, version, frame)
                error = getattr(response, "error_code", None)
                raise ProtocolError(
                    f"upstream answered Metadata v{version} with no brokers"
                    + (f" (error code {int(error)})" if error else "")
                )
            try:  # Metadata v1+ carries each broker's rack; the endpoints are what matter
                _, response = codec.decode_response(METADATA, version, frame)
                racks = {int(b.node_id): b.rack for b in response.brokers}
            except ProtocolError:
                racks = dict.fromkeys(brokers)
            return brokers, racks
        finally:
            await trio.aclose_forcefully(stream)


def rack_brokers(rack: str, racks: dict[int, str | None]) -> tuple[int, dict[str, Any]]:
    """The level and fields of the ``rack_brokers`` line: which brokers share the proxy's rack.

    A warning when the proxy has a rack and no broker announces it (``broker.rack``
    unset, or named differently: racks compare exactly): fetches cannot stay in the
    rack, every byte still crosses zones.
    """
    same = sorted(n for n, r in racks.items() if rack and r == rack)
    fields: dict[str, Any] = {
        "rack": rack or None,
        "node_ids": same,
        "broker_racks": {str(n): r for n, r in sorted(racks.items())},
    }
    if rack and not same:
        fields["hint"] = (
            f"no broker announces broker.rack {rack!r} (racks compare exactly): fetches"
            " cannot be served from this rack; check the brokers' broker.rack and this"
            " proxy's rack setting"
        )
        return logging.WARNING, fields
    return logging.INFO, fields


def _metadata_version(versions: ApiVersionsResponse) -> int:
    ours = kio_range(METADATA)
    assert ours is not None
    for api in versions.api_keys:
        if api.api_key == METADATA:
            top = min(int(api.max_version), ours[1])
            if top < max(int(api.min_version), 1, ours[0]):
                break
            return top
    raise ProtocolError("upstream supports no Metadata version the proxy can use")


def _metadata_request(version: int) -> Any:
    """A Metadata request for no topics (brokers only) at ``version`` (>= 1)."""
    return make(
        request_module(METADATA, version).MetadataRequest,
        topics=(),
        allow_auto_topic_creation=False,
        include_cluster_authorized_operations=False,
        include_topic_authorized_operations=False,
    )


class AuthenticationRequired(Exception):
    """An upstream answered ApiVersions and closed the connection on Metadata (SASL)."""


async def _exchange(stream: trio.abc.Stream, decoder: FrameDecoder, request: bytes) -> bytes:
    await stream.send_all(encode_frame(request))
    while (frame := decoder.next_frame()) is None:
        data = await stream.receive_some(RECEIVE_BYTES)
        if not data:
            raise ProtocolError("upstream closed the connection during discovery")
        decoder.feed(data)
    return frame


class DrainableStream(trio.abc.Stream, ImmediateWrites):
    """A client's stream as its ``Connection`` sees it, which can wind the connection down.

    After ``drain()`` no further request is read (``receive_some`` parks instead of
    reading), and ``serve()`` ends the connection as soon as it is quiet: the
    client loop parked here, and ``quiet()`` (every request read is answered and
    the answer written).  A Kafka client loses nothing when a connection closes
    between requests: it reconnects, to whatever serves this address next.

    The task that waits for quiet runs beside the connection's loops (``host``)
    from the drain on: until then a connection holds no task for it.
    """

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.quiet: Callable[[], bool] = lambda: True
        self.before_close: Callable[[], Awaitable[None]] | None = None
        """Run once the drained connection is quiet, before it ends (the connection's
        ``close_upstream_session``: its fetch session upstream ends with it)."""
        self.host: TaskHost | None = None
        """The connection served (bound by the proxy): the wait for quiet is its task."""
        self.draining = False
        self._watching = False
        """The wait for quiet has started (``_watch``)."""
        self._serving: trio.CancelScope | None = None
        """``serve``'s scope while it runs: cancelled once the drained connection is quiet."""
        self._parked = False
        self._waiting = False
        """A plain TCP read waits for the socket (``_receive_plain``)."""
        self._reading: trio.CancelScope | None = None
        self._changed = trio.Event()

    def immediate_sender(self) -> Callable[[Buffer], int] | None:
        """The plain TCP socket's ``send_now`` (``connection.ImmediateWrites``); None while
        draining, when ``serve()`` must see every write, or for a TLS stream."""
        if self.draining or not isinstance(self.stream, LeanSocketStream):
            return None
        return self.stream.send_now

    def drain(self) -> None:
        self.draining = True
        if self._reading is not None:
            self._reading.cancel()  # a cancelled receive_some consumed nothing
        self._notify()
        self._watch()

    async def serve(self, run: Callable[[], Awaitable[str]]) -> str:
        """``run()``'s reason, or ``drained`` when draining ended it."""
        reason = "drained"
        with trio.CancelScope() as self._serving:
            reason = await run()
        self._serving = None
        return reason

    def _watch(self) -> None:
        """Start the wait for quiet, once; a drain before the connection runs starts it
        when its reader parks (``_park``)."""
        if not self._watching and self.host is not None:
            self._watching = self.host.start_task(self._close_when_quiet)

    async def _close_when_quiet(self) -> None:
        # Woken after each write while draining: by then the writer has counted it.
        while not (self.draining and (self._parked or self._waiting) and self.quiet()):
            await self._changed.wait()
        if self.before_close is not None:
            await self.before_close()
        if self._serving is not None:
            self._serving.cancel()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        stream = self.stream
        if isinstance(stream, LeanSocketStream):
            return await self._receive_plain(stream, max_bytes)
        if not self.draining:
            with trio.CancelScope() as self._reading:
                return await stream.receive_some(max_bytes)
            self._reading = None
        return await self._park()

    async def _receive_plain(self, stream: LeanSocketStream, max_bytes: int | None) -> bytes:
        """A plain TCP client's read, with no cancel scope of its own: wait until the
        socket is readable, then read unless a drain began meanwhile.

        A reader waiting here counts as parked for ``_close_when_quiet``, whose
        cancellation of the connection then ends the wait; a reader the socket woke
        but that had not run yet finds ``draining`` and parks without reading.  Either
        way nothing is consumed after the drain began, as with a cancelled read.  (A
        ``CancelScope`` costs 11.7 us to enter and leave on this machine, once per request.)
        """
        size = 64 * 1024 if max_bytes is None else max_bytes
        while not self.draining:
            self._waiting = True
            try:
                await stream.wait_readable()
            finally:
                self._waiting = False
            if self.draining:
                break
            data = stream.receive_now(size)
            if data is not None:
                return data  # (None: woken without data, spuriously: wait again)
        return await self._park()

    async def _park(self) -> NoReturn:
        self._parked = True
        self._notify()
        self._watch()
        await trio.sleep_forever()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.stream.send_all(data)
        if self.draining:
            self._notify()

    async def wait_send_all_might_not_block(self) -> None:
        await self.stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.stream.aclose()


def _first_request_arrived(
    slots: ConnectionSlots[_Slot], slot: _Slot, conn: Connection, *_request: int
) -> None:
    """The client's first whole request arrived: no deadline any more, its slot is its own
    (and no more calls)."""
    slot.first.deadline = math.inf
    slots.spoke(slot)
    conn.on_request = None


def _always_quiet() -> bool:
    return True


def _answered(relay: Relay, conn: Connection) -> Callable[[], bool]:
    """True while no request of the connection awaits its answer or its writing."""
    return lambda: relay.in_flight == 0 and conn.buffered == 0


def _bind_socket(host: str, port: int) -> socket.socket:
    """A listening, non-blocking socket (synchronous, so it exists before anyone is told)."""
    family, kind, proto, _, addr = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _address(address: Any) -> str:
    """An accepted socket's peer address (``accept()``'s second value) as host:port."""
    try:
        return str(HostPort(str(address[0]), int(address[1])))
    except (TypeError, ValueError, IndexError):
        return "?"
