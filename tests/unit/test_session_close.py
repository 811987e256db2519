"""A client that closes its connection ends the proxy's upstream fetch session, as Kafka's
Java consumer ends its own when it closes (a Fetch at FINAL_EPOCH naming no partition):
the broker's session cache does not keep it, one of its slots, until it is evicted."""

from __future__ import annotations

import socket
import struct
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import timedelta
from typing import Any

import trio
import trio.testing
from support.fetch_messages import fetch_body, partition_body
from support.loopback import request, settings
from support.rawclient import make_request

from devbroker.cluster import DevCluster
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.server.proxy import Proxy


def sessionless_fetch(cid: int, max_wait_ms: int = 0) -> bytes:
    """librdkafka's kind of Fetch (v12, no session) of partition 0 of topic t."""
    body = fetch_body(
        [{"topic": "t", "partitions": [partition_body(0, 0, 1 << 20)]}],
        max_wait=timedelta(milliseconds=max_wait_ms),
    )
    return codec.encode_request(make_request(1, 12, body), cid, "rdkafka")


@asynccontextmanager
async def session_through_proxy(
    fetches: int,
) -> AsyncIterator[tuple[Proxy, Any, trio.SocketStream]]:
    """The proxy over a one-node dev cluster, and a client connection that sent *fetches*
    sessionless fetches through it (so the proxy holds one session upstream): the proxy,
    the node's session cache and the client's stream."""
    with trio.fail_after(20):
        async with DevCluster(nodes=1, topics={"t": 1}) as cluster, trio.open_nursery() as nursery:
            proxy = await nursery.start(Proxy(settings(cluster.bootstrap)).serve)
            await proxy.discovered.wait()
            sessions = cluster.node(0).sessions
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(0)[1])
            decoder = FrameDecoder(1 << 20)
            for cid in range(1, fetches + 1):  # a session upstream, then its incremental fetches
                await request(stream, decoder, sessionless_fetch(cid))
            assert sessions.num_sessions == 1
            yield proxy, sessions, stream
            nursery.cancel_scope.cancel()


async def closed_by_proxy(proxy: Proxy) -> None:
    """Until the proxy's connections have ended (after the broker answered their close)."""
    with trio.move_on_after(5):
        while proxy.open_connections:
            await trio.testing.wait_all_tasks_blocked()


async def test_a_closing_client_ends_its_upstream_fetch_session() -> None:
    async with session_through_proxy(3) as (proxy, sessions, stream):
        created = sessions.sessions_created
        await stream.aclose()
        await closed_by_proxy(proxy)
        assert sessions.num_sessions == 0
        assert sessions.sessions_created == created  # closed, not replaced


async def test_a_client_closing_during_a_long_poll_ends_its_session_after_it() -> None:
    async with session_through_proxy(2) as (proxy, sessions, stream):
        await stream.send_all(encode_frame(sessionless_fetch(3, max_wait_ms=300)))
        await trio.testing.wait_all_tasks_blocked()  # the poll waits upstream
        await stream.aclose()
        await closed_by_proxy(proxy)
        assert sessions.num_sessions == 0


async def test_a_client_resetting_its_connection_ends_its_upstream_fetch_session() -> None:
    """A reset (SO_LINGER 0: an RST instead of a FIN, as from a killed client with unread
    bytes) ends the session too: the proxy reads ECONNRESET, not the end of the stream."""
    async with session_through_proxy(3) as (proxy, sessions, stream):
        stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        stream.socket.close()
        await closed_by_proxy(proxy)
        assert sessions.num_sessions == 0


async def test_a_drained_connection_ends_its_upstream_fetch_session() -> None:
    """The proxy stopping (``Proxy.drain``, on SIGTERM): each connection, once quiet, ends its
    session upstream before it closes, so a restarted sidecar leaves no session behind."""
    async with session_through_proxy(2) as (proxy, sessions, stream):
        await proxy.drain()
        assert await stream.receive_some(10) == b""  # the proxy closed it
        assert sessions.num_sessions == 0
