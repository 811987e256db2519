"""An in-process proxy on loopback, spoken to in raw Kafka frames.

    proxy = await nursery.start(Proxy(settings(cluster.bootstrap)).serve)
    stream = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap.port)
    reply = await request(stream, FrameDecoder(1 << 20), API_VERSIONS)

:data:`API_VERSIONS` and :data:`METADATA` are request frames to send;
:func:`settings` is the proxy's validated config for one upstream, listening on
port 0 (broker listeners too) and retrying a missing upstream quickly;
:func:`request` sends one frame and waits for the next whole frame back;
:func:`free_port` is a loopback port nothing listens on (yet).
"""

from __future__ import annotations

import socket
from typing import Any

import trio
from kio.schema.api_versions.v3.request import ApiVersionsRequest
from kio.schema.metadata.v12.request import MetadataRequest

from proxy import config
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder, encode_frame

API_VERSIONS = codec.encode_request(
    ApiVersionsRequest(client_software_name="t", client_software_version="1"), 7, "t"
)
"""An ApiVersions v3 request frame (correlation id 7, client id ``t``)."""
METADATA = codec.encode_request(
    MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    ),
    8,
    "t",
)
"""A Metadata v12 request frame for every topic (correlation id 8, client id ``t``)."""


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


async def request(stream: trio.abc.Stream, decoder: FrameDecoder, frame: bytes) -> bytes:
    await stream.send_all(encode_frame(frame))
    while (got := decoder.next_frame()) is None:
        data = await stream.receive_some(65536)
        assert data, "proxy closed the connection"
        decoder.feed(data)
    return got
