"""The dev cluster's trio edge: one loopback listener per node, one task per connection.

    async with DevCluster(nodes=3, topics={"orders": 12}) as cluster:
        cluster.bootstrap          # "127.0.0.1:PORT" of node 0
        cluster.bootstrap_servers  # every node, comma separated

Node *i* listens on ``port + i`` (``port=0``: each node picks a free port).
Each connection is served by its own task and, like Kafka, handles one request
at a time, so responses go out in request order.  Requests that Kafka parks
(long-poll Fetch, JoinGroup, SyncGroup) wait here, woken whenever a request
changed cluster state or their deadline passes.

A Fetch is served in slices: decoded, begun, read, answered and encoded
``SLICE_PARTITIONS`` partitions at a time (the ``*_in_ranges`` walks of
``node``, ``fetch``, ``proxy.sessions.as_broker_cache`` and ``proxy.protocol.codec``),
with a checkpoint between two slices, so that one large Fetch (or many) does not
keep the loop from the other connections; the slices of all requests run in the
cluster's :class:`Lane`, one request at a time, the oldest first.  The answers
are the same bytes as when the work is done at once.

Fault hooks for tests: :meth:`DevCluster.evict_fetch_sessions`,
:meth:`DevCluster.stop_node` / :meth:`DevCluster.restart_node`,
:meth:`DevCluster.set_delay`, :meth:`DevCluster.drop_connections`.
"""

from __future__ import annotations

import heapq
import math
import time
import uuid
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TypeVar

import structlog
import trio

from proxy.protocol import codec
from proxy.protocol.apis import FETCH
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import (
    DEFAULT_MAX_FRAME_BYTES,
    Buffer,
    FrameDecoder,
    encode_frame,
    frame_chunks,
)
from proxy.sessions.as_broker_cache import Ranges

from .fetch import NodeFetcher
from .membership import GroupCoordinator
from .node import FetchWaitAdapter, NodeDispatcher
from .outcome import Close, NoReply, Pending, Wait
from .session_cache import ShardedSessionCache
from .state import ClusterState
from .transactions import CLEANUP_INTERVAL_SECONDS

log = structlog.get_logger("devbroker")

RECEIVE_BYTES = 64 * 1024
SLICE_PARTITIONS = 500
"""A Fetch is decoded, read, answered and encoded in slices of this many partitions,
with a checkpoint between two slices, so that other connections are served while a
large one is (a slice of 500 takes a few milliseconds)."""

T = TypeVar("T")


class DevNode:
    """One node: its listener, its connections, its fetch sessions."""

    def __init__(
        self,
        cluster: DevCluster,
        node_id: int,
        host: str,
        port: int,
        session_cache_slots: int,
    ) -> None:
        self.cluster = cluster
        self.node_id = node_id
        self.host = host
        self.port = port
        self.sessions = ShardedSessionCache(session_cache_slots, clock=cluster.clock)
        self.dispatcher = NodeDispatcher(
            node_id,
            cluster.state,
            cluster.coordinator,
            NodeFetcher(node_id, cluster.state, self.sessions),
            clock=cluster.clock,
        )
        self.delay = 0.0
        self.running = False
        self._scope: trio.CancelScope | None = None
        self._stopped = trio.Event()
        self._connections: set[trio.CancelScope] = set()

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(self.port, host=self.host)
        listener = listeners[0]
        for extra in listeners[1:]:
            await extra.aclose()
        self.port = int(listener.socket.getsockname()[1])
        state = self.cluster.state
        state.addresses[self.node_id] = (self.host, self.port)
        state.stopped_nodes.discard(self.node_id)
        self._stopped = trio.Event()
        self.running = True
        try:
            with trio.CancelScope() as scope:
                self._scope = scope
                async with trio.open_nursery() as nursery:
                    task_status.started(self.port)
                    async with listener:
                        while True:
                            stream = await listener.accept()
                            nursery.start_soon(self._connection, stream)
        finally:
            self.running = False
            self._scope = None
            self._stopped.set()

    async def stop(self) -> None:
        """Close the listener and every connection; the node stays down until restarted.

        Like a broker process that stops, the node forgets its fetch sessions
        (Kafka keeps them in memory only); logs and committed offsets stay.
        """
        self.cluster.state.stopped_nodes.add(self.node_id)
        if self._scope is not None:
            self._scope.cancel()
            await self._stopped.wait()
        self.sessions.clear()
        self.cluster.notify()

    def drop_connections(self) -> None:
        for scope in list(self._connections):
            scope.cancel()

    async def _connection(self, stream: trio.SocketStream) -> None:
        structlog.contextvars.bind_contextvars(
            node_id=self.node_id, client_addr=_peer(stream), listener="broker"
        )
        decoder = FrameDecoder(self.cluster.max_frame_bytes)
        try:
            with trio.CancelScope() as scope:
                self._connections.add(scope)
                try:
                    await self._serve_connection(stream, decoder)
                finally:
                    self._connections.discard(scope)
        finally:
            await trio.aclose_forcefully(stream)

    async def _serve_connection(self, stream: trio.SocketStream, decoder: FrameDecoder) -> None:
        dispatcher = self.dispatcher
        cluster = self.cluster
        while True:
            try:
                frame = decoder.next_frame()
                if frame is None:
                    data = await stream.receive_some(RECEIVE_BYTES)
                    if not data:
                        decoder.close()
                        return
                    decoder.feed(data)
                    continue
            except ProtocolError as exc:
                log.warning("connection_closed", reason="protocol_error", error=str(exc))
                return
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return
            arrived = trio.current_time()
            try:
                outcome = await cluster.lane.run(
                    dispatcher.handle_in_ranges(frame, SLICE_PARTITIONS), arrived
                )
            except Exception as exc:  # a dev-cluster bug: drop this connection, keep serving
                log.error("request_failed", reason="internal_error", error=repr(exc))
                return
            if dispatcher.changed:
                dispatcher.changed = False
                cluster.notify()
            if isinstance(outcome, Close):
                log.warning("connection_closed", reason=outcome.kind, error=outcome.reason)
                return
            if isinstance(outcome, NoReply):
                continue
            try:
                if isinstance(outcome, Wait):
                    response = await self._wait(outcome.pending, arrived)
                    cluster.notify()
                    correlation_id = outcome.correlation_id
                else:
                    response, correlation_id = outcome.response, outcome.correlation_id
                chunks = await _encode_in_slices(response, correlation_id, cluster.lane, arrived)
            except Exception as exc:  # a dev-cluster bug: drop this connection, keep serving
                log.error("request_failed", reason="internal_error", error=repr(exc))
                return
            if self.delay > 0:
                await trio.sleep(self.delay)
            try:
                for chunk in chunks:
                    await stream.send_all(chunk)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return

    async def _wait(self, pending: Pending, arrived: float) -> Any:
        clock = self.cluster.clock
        while True:
            event = self.cluster.changed_event
            now = clock()
            if isinstance(pending, FetchWaitAdapter):
                lane = self.cluster.lane
                if await lane.run(pending.poll_in_ranges(now, SLICE_PARTITIONS), arrived):
                    return await lane.run(pending.complete_in_ranges(SLICE_PARTITIONS), arrived)
            elif pending.poll(now):
                return pending.complete()
            wake = pending.wake_at()
            # (clock() again: a Fetch's poll may have waited for the lane)
            timeout = math.inf if wake is None else max(0.0, wake - clock())
            with trio.move_on_after(timeout):
                await event.wait()


class Lane:
    """Where requests run slice after slice: one at a time, the oldest first.

    A request whose work is more than one range (:meth:`run`) runs it here, a
    checkpoint between two ranges, so that the other tasks' turns wait for one slice,
    not for one slice of every large request at once.  When the lane frees, the
    request that arrived first goes next, so concurrent large fetches are answered
    in about their order of arrival, not all at the end (each has several phases:
    decoded and begun, read, answered, encoded).
    """

    def __init__(self) -> None:
        self._busy = False
        self._waiting: list[tuple[float, int, trio.Event]] = []
        self._seq = 0

    async def run(self, ranges: Ranges[T], arrived: float) -> T:
        """*ranges* to its value; its first range at once, the others in the lane."""
        try:
            next(ranges)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        await self._acquire(arrived)
        try:
            while True:
                try:
                    next(ranges)
                except StopIteration as done:
                    return done.value  # type: ignore[no-any-return]
                await trio.lowlevel.checkpoint()
        finally:
            self._release()

    async def _acquire(self, arrived: float) -> None:
        if not self._busy:
            self._busy = True
            await trio.lowlevel.cancel_shielded_checkpoint()
            return
        self._seq += 1
        entry = (arrived, self._seq, trio.Event())
        heapq.heappush(self._waiting, entry)
        try:
            await entry[2].wait()
        except BaseException:
            if entry[2].is_set():  # handed the lane as it was cancelled: pass it on
                self._release()
            else:
                self._waiting.remove(entry)
                heapq.heapify(self._waiting)
            raise

    def _release(self) -> None:
        if self._waiting:
            heapq.heappop(self._waiting)[2].set()  # the lane stays busy: it is theirs
        else:
            self._busy = False


async def _encode_in_slices(
    response: Any, correlation_id: int, lane: Lane, arrived: float
) -> list[Buffer]:
    """The response's frame as buffers to send in order (a large Fetch response is
    encoded in slices, and its records are sent from where they are, not copied)."""
    if int(response.__api_key__) != FETCH:
        return [encode_frame(codec.encode_response(response, correlation_id))]
    gathered = await lane.run(
        codec.encode_response_gathered_in_ranges(
            response, correlation_id, path=codec.FETCH_RESPONSE_PARTITIONS, every=SLICE_PARTITIONS
        ),
        arrived,
    )
    return frame_chunks([gathered])


def _peer(stream: trio.SocketStream) -> str:
    try:
        host, port = stream.socket.getpeername()[:2]
    except OSError:
        return "?"
    return f"{host}:{port}"


class DevCluster:
    """A multi-node Kafka-protocol cluster in this process (trio)."""

    def __init__(
        self,
        nodes: int = 3,
        topics: Mapping[str, int] | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        cluster_id: str | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        session_cache_slots: int = 1000,
        initial_rebalance_delay_ms: int = 0,
        clock: Callable[[], float] = time.monotonic,
        txn_cleanup_interval: float = CLEANUP_INTERVAL_SECONDS,
    ) -> None:
        if nodes <= 0:
            raise ValueError("nodes must be positive")
        if port < 0 or (port and port + nodes - 1 > 65535):
            raise ValueError("port out of range")
        self.clock = clock
        self.max_frame_bytes = max_frame_bytes
        self.state = ClusterState(cluster_id or _cluster_id(), list(range(nodes)))
        for name, partitions in (topics or {}).items():
            self.state.create_topic(name, partitions)
        self.coordinator = GroupCoordinator(
            self.state, initial_rebalance_delay_ms=initial_rebalance_delay_ms
        )
        self.txn_cleanup_interval = txn_cleanup_interval
        self.nodes = [
            DevNode(self, i, host, port + i if port else 0, session_cache_slots)
            for i in range(nodes)
        ]
        self.changed_event = trio.Event()
        self.lane = Lane()
        self._nursery: trio.Nursery | None = None
        self._nursery_cm: Any = None

    # -- lifecycle -------------------------------------------------------------

    async def __aenter__(self) -> DevCluster:
        self._nursery_cm = trio.open_nursery()
        self._nursery = await self._nursery_cm.__aenter__()
        try:
            for node in self.nodes:
                await self._nursery.start(node.serve)
            self._nursery.start_soon(self._abort_timed_out_transactions)
        except BaseException as exc:
            self._nursery.cancel_scope.cancel()
            await self._nursery_cm.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._nursery is not None
        self._nursery.cancel_scope.cancel()
        result: bool | None = await self._nursery_cm.__aexit__(exc_type, exc, tb)
        self._nursery = None
        return result

    async def _abort_timed_out_transactions(self) -> None:
        """Kafka's periodic abortTimedOutTransactions."""
        while True:
            await trio.sleep(self.txn_cleanup_interval)
            if self.coordinator.transactions.tick(self.clock()):
                self.notify()

    async def serve_forever(self) -> None:
        await trio.sleep_forever()

    # -- addresses ----------------------------------------------------------------

    @property
    def bootstrap(self) -> str:
        return self.nodes[0].address

    @property
    def bootstrap_servers(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def node(self, node_id: int) -> DevNode:
        return self.nodes[node_id]

    def notify(self) -> None:
        """Wake every parked request so that it re-examines cluster state."""
        self.changed_event.set()
        self.changed_event = trio.Event()

    # -- admin ----------------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, topic_id: uuid.UUID | None = None) -> None:
        self.state.create_topic(name, partitions, topic_id)
        self.notify()

    def leader_of(self, topic: str, partition: int) -> int:
        p = self.state.partition(topic, partition)
        if p is None:
            raise KeyError(f"{topic}-{partition}")
        return p.leader

    # -- fault hooks ---------------------------------------------------------------

    def evict_fetch_sessions(self) -> None:
        """Drop every fetch session on every node (clients then get FETCH_SESSION_ID_NOT_FOUND)."""
        for node in self.nodes:
            node.sessions.clear()

    async def stop_node(self, node_id: int) -> None:
        await self.nodes[node_id].stop()

    async def restart_node(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.running:
            raise RuntimeError(f"node {node_id} is running")
        assert self._nursery is not None
        await self._nursery.start(node.serve)
        self.coordinator.transactions.retry_markers()  # markers that waited for this leader
        self.notify()

    def set_delay(self, node_id: int, seconds: float) -> None:
        """Delay every response of *node_id* by *seconds* (0 to stop delaying)."""
        self.nodes[node_id].delay = max(0.0, seconds)

    def drop_connections(self, node_id: int | None = None) -> None:
        """Close the client connections of one node (or all nodes); listeners stay up."""
        for node in self.nodes if node_id is None else [self.nodes[node_id]]:
            node.drop_connections()


def _cluster_id() -> str:
    # Kafka cluster ids are 16 random bytes, url-safe base64 without padding (22 chars).
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
