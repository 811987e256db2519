"""An in-process proxy on loopback, spoken to in raw Kafka frames.

    proxy = await nursery.start(Proxy(settings(cluster.bootstrap)).serve)
    stream = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap.port)
    reply = await request(stream, FrameDecoder(1 << 20), API_VERSIONS)

:data:`API_VERSIONS` and :data:`METADATA` are request frames to send;
:func:`settings` is the proxy's validated config for one upstream, listening on
port 0 (broker listeners too) and retrying a missing upstream quickly;
:func:`request` sends one frame and waits for the next whole frame back;
:func:`free_port` is a loopback port nothing listens on (yet), below the ports the
kernel gives outgoing connections; :func:`tcp_stream_pair` is two connected TCP
streams on loopback (socket options such as ``SO_RCVLOWAT`` are TCP's: a Unix
socket pair ignores them).
"""

from __future__ import annotations

import os
import random
import socket
from collections import deque
from pathlib import Path
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


_LOWEST_PORT = 10000
"""The lowest port :func:`free_port` hands out (below: ports services commonly own)."""
_SLICES = 8
"""The port range below the ephemeral one is cut in this many slices, one per test worker."""
_recent: deque[int] = deque(maxlen=512)
"""The ports this process handed out last: not handed out again while their user may
still be starting (a Kafka node binds its ports seconds after they are chosen)."""


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range of local ports for outgoing connections (Linux's default if unknown)."""
    try:
        low, high = (int(v) for v in EPHEMERAL_RANGE_FILE.read_text().split())
    except (OSError, ValueError):
        return 32768, 60999
    return low, high


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _worker_index() -> int:
    """This pytest-xdist worker's number (``gw3``: 3); 0 outside a parallel run."""
    name = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(name[2:]) if name.startswith("gw") and name[2:].isdigit() else 0


def free_port() -> int:
    """A loopback port nothing listens on, for a process to bind later.

    Picked below the kernel's ephemeral range: a port from ``bind(0)`` comes from that
    range, where every outgoing connection of every test running beside takes its
    local port, so one of them could take it before the process it was meant for binds
    it (a Kafka node binds seconds later, after formatting its storage and starting its
    JVM; CI once lost a rack cluster's broker that way).  The ports below the range are
    cut into one slice per test worker (``PYTEST_XDIST_WORKER``), so two workers never
    pick the same one, and this process does not hand out a port again while it is
    among its last 512.  If the range leaves too little room below it, ``bind(0)``."""
    low, _ = _ephemeral_range()
    width = (low - _LOWEST_PORT) // _SLICES
    if width < 256:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    base = _LOWEST_PORT + (_worker_index() % _SLICES) * width
    for _ in range(4 * width):
        port = base + random.randrange(width)
        if port in _recent:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use
        _recent.append(port)
        return port
    raise RuntimeError(f"no free loopback port in {base}-{base + width - 1}")


async def request(stream: trio.abc.Stream, decoder: FrameDecoder, frame: bytes) -> bytes:
    await stream.send_all(encode_frame(frame))
    while (got := decoder.next_frame()) is None:
        data = await stream.receive_some(65536)
        assert data, "proxy closed the connection"
        decoder.feed(data)
    return got


async def tcp_stream_pair() -> tuple[trio.SocketStream, trio.SocketStream]:
    """(ours, peer): the two ends of one TCP connection on loopback."""
    listener = trio.socket.socket()
    await listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    peer = trio.socket.socket()
    await peer.connect(listener.getsockname())
    ours, _ = await listener.accept()
    listener.close()
    return trio.SocketStream(ours), trio.SocketStream(peer)
