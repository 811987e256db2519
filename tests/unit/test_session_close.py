"""A client that closes its connection ends the proxy's upstream fetch session, as Kafka's
Java consumer ends its own when it closes (a Fetch at FINAL_EPOCH naming no partition):
the broker's session cache does not keep it, one of its slots, until it is evicted."""

from __future__ import annotations

import trio
import trio.testing
from support.loopback import request, settings
from support.rawclient import make_request

from devbroker.cluster import DevCluster
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder
from proxy.server.proxy import Proxy


def sessionless_fetch(cid: int, max_wait_ms: int = 0) -> bytes:
    """librdkafka's kind of Fetch (v12, no session) of partition 0 of topic t."""
    fetch = make_request(
        1,
        12,
        {
            "replica_id": -1,
            "max_wait": max_wait_ms,
            "min_bytes": 1,
            "max_bytes": 1 << 20,
            "isolation_level": 0,
            "session_id": 0,
            "session_epoch": -1,
            "topics": [
                {
                    "topic": "t",
                    "partitions": [
                        {
                            "partition": 0,
                            "current_leader_epoch": -1,
                            "fetch_offset": 0,
                            "last_fetched_epoch": -1,
                            "log_start_offset": -1,
                            "partition_max_bytes": 1 << 20,
                        }
                    ],
                }
            ],
            "forgotten_topics_data": [],
            "rack_id": "",
        },
    )
    return codec.encode_request(fetch, cid, "rdkafka")


async def test_a_closing_client_ends_its_upstream_fetch_session() -> None:
    with trio.fail_after(20):
        async with DevCluster(nodes=1, topics={"t": 1}) as cluster, trio.open_nursery() as nursery:
            proxy = await nursery.start(Proxy(settings(cluster.bootstrap)).serve)
            await proxy.discovered.wait()
            sessions = cluster.node(0).sessions
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(0)[1])
            decoder = FrameDecoder(1 << 20)
            for cid in (1, 2, 3):  # a session upstream, then its incremental fetches
                await request(stream, decoder, sessionless_fetch(cid))
            assert sessions.num_sessions == 1
            created = sessions.sessions_created
            await stream.aclose()
            with trio.move_on_after(5):  # the connection ends once the broker answered
                while proxy.open_connections:
                    await trio.testing.wait_all_tasks_blocked()
            assert sessions.num_sessions == 0
            assert sessions.sessions_created == created  # closed, not replaced
            nursery.cancel_scope.cancel()


async def test_a_client_closing_during_a_long_poll_ends_its_session_after_it() -> None:
    with trio.fail_after(20):
        async with DevCluster(nodes=1, topics={"t": 1}) as cluster, trio.open_nursery() as nursery:
            proxy = await nursery.start(Proxy(settings(cluster.bootstrap)).serve)
            await proxy.discovered.wait()
            sessions = cluster.node(0).sessions
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(0)[1])
            decoder = FrameDecoder(1 << 20)
            for cid in (1, 2):
                await request(stream, decoder, sessionless_fetch(cid))
            poll = sessionless_fetch(3, max_wait_ms=300)
            await stream.send_all(len(poll).to_bytes(4, "big") + poll)
            await trio.sleep(0.05)  # (the poll is waiting upstream)
            await stream.aclose()
            with trio.move_on_after(5):  # the connection ends once the broker answered
                while proxy.open_connections:
                    await trio.testing.wait_all_tasks_blocked()
            assert sessions.num_sessions == 0
            nursery.cancel_scope.cancel()


async def test_a_drained_connection_ends_its_upstream_fetch_session() -> None:
    """The proxy stopping (``Proxy.drain``, on SIGTERM): each connection, once quiet, ends its
    session upstream before it closes, so a restarted sidecar leaves no session behind."""
    with trio.fail_after(20):
        async with DevCluster(nodes=1, topics={"t": 1}) as cluster, trio.open_nursery() as nursery:
            proxy = await nursery.start(Proxy(settings(cluster.bootstrap)).serve)
            await proxy.discovered.wait()
            sessions = cluster.node(0).sessions
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(0)[1])
            decoder = FrameDecoder(1 << 20)
            for cid in (1, 2):
                await request(stream, decoder, sessionless_fetch(cid))
            assert sessions.num_sessions == 1
            await proxy.drain()
            assert await stream.receive_some(10) == b""  # the proxy closed it
            assert sessions.num_sessions == 0
            nursery.cancel_scope.cancel()
