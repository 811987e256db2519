"""The proxy process over loopback with an in-process dev cluster (no client libraries).

Start-up retries with backoff until the upstream answers; garbage on one
connection closes that connection only; an upstream drop closes the client.
"""

from __future__ import annotations

import socket
import struct
from typing import Any

import trio
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest

from proxy import config
from proxy.devbroker.cluster import DevCluster
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.server.proxy import Proxy


def settings(upstream: str, **extra: Any) -> config.Settings:
    return config.validate(
        {
            "upstream": [upstream],
            "listen": "127.0.0.1:0",
            "broker_port_base": 0,
            "connect_timeout_seconds": 2,
            "retry_backoff_initial_seconds": 0.02,
            "retry_backoff_max_seconds": 0.1,
            **extra,
        }
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def request(stream: trio.SocketStream, decoder: FrameDecoder, frame: bytes) -> bytes:
    await stream.send_all(encode_frame(frame))
    while (got := decoder.next_frame()) is None:
        data = await stream.receive_some(65536)
        assert data, "proxy closed the connection"
        decoder.feed(data)
    return got


API_VERSIONS = codec.encode_request(
    ApiVersionsRequest(client_software_name="t", client_software_version="1"), 7, "t"
)


async def test_unreachable_upstream_is_retried_until_it_appears() -> None:
    port = free_port()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            proxy = await nursery.start(Proxy(settings(f"127.0.0.1:{port}")).serve)
            await trio.sleep(0.3)  # several failed attempts with backoff
            ready, checks = proxy.readiness()
            assert not ready and checks["bootstrap_listener_bound"]
            assert not proxy.discovered.is_set()
            async with DevCluster(nodes=1, port=port):
                await proxy.discovered.wait()
                await proxy.wait_ready()
                ready, checks = proxy.readiness()
                assert ready and checks["broker_0_reachable"]
                nursery.cancel_scope.cancel()


async def test_metadata_through_proxy_has_proxy_addresses_and_garbage_does_not_hurt() -> None:
    with trio.fail_after(20):
        async with DevCluster(nodes=3, topics={"t": 3}) as cluster, trio.open_nursery() as nursery:
            proxy = await nursery.start(Proxy(settings(cluster.bootstrap)).serve)
            await proxy.discovered.wait()
            port = proxy.bootstrap.port
            # a garbage connection: closed by the proxy, nothing else affected
            bad = await trio.open_tcp_stream("127.0.0.1", port)
            await bad.send_all(struct.pack(">i", 2**30) + b"junk")
            assert await bad.receive_some(100) == b""
            await bad.aclose()
            # a good connection afterwards
            good = await trio.open_tcp_stream("127.0.0.1", port)
            decoder = FrameDecoder(1 << 24)
            cid, versions = codec.decode_response(18, 3, await request(good, decoder, API_VERSIONS))
            assert cid == 7 and versions.error_code == 0
            md = codec.encode_request(
                MetadataRequest(
                    topics=None,
                    allow_auto_topic_creation=False,
                    include_topic_authorized_operations=False,
                ),
                8,
                "t",
            )
            cid, body = codec.decode_response(3, 12, await request(good, decoder, md))
            assert cid == 8
            advertised = {(b.host, b.port) for b in body.brokers}
            assert advertised == {proxy.broker_address(n) for n in range(3)}
            assert not advertised & {(n.host, n.port) for n in cluster.nodes}
            # a connection to broker 1's listener
            other = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(1)[1])
            d1 = FrameDecoder(1 << 24)
            await request(other, d1, API_VERSIONS)
            # an upstream drop closes the client connection (the client reconnects)
            node0 = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(0)[1])
            d0 = FrameDecoder(1 << 24)
            await request(node0, d0, API_VERSIONS)
            await cluster.stop_node(0)
            assert await node0.receive_some(100) == b""
            await node0.aclose()
            # the bootstrap connection was relayed to node 0 as well: closed too
            assert await good.receive_some(100) == b""
            await good.aclose()
            # connections to other brokers are still served
            cid, _ = codec.decode_response(18, 3, await request(other, d1, API_VERSIONS))
            assert cid == 7
            await other.aclose()
            nursery.cancel_scope.cancel()
