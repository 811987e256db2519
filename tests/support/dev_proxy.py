"""The proxy in front of an in-process dev cluster, served in the test's own trio run.

    with trio.fail_after(20):
        async with proxy_on_dev_cluster(max_connections=3, metrics=metrics) as proxy:
            stream = await trio.open_tcp_stream("127.0.0.1", proxy.bootstrap.port)

When the block starts the proxy (:func:`.loopback.settings` for a dev cluster of
*nodes* and *topics*, plus *extra*) serves and has discovered the cluster; when it
ends both are stopped.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import trio

from devbroker.cluster import DevCluster
from proxy.server.proxy import Proxy

from .loopback import settings


@asynccontextmanager
async def proxy_on_dev_cluster(
    *,
    nodes: int = 1,
    topics: Mapping[str, int] | None = None,
    metrics: Any | None = None,
    **extra: Any,
) -> AsyncIterator[Proxy]:
    async with DevCluster(nodes=nodes, topics=topics) as cluster, trio.open_nursery() as nursery:
        proxy = await nursery.start(
            Proxy(settings(cluster.bootstrap, **extra), metrics=metrics).serve
        )
        await proxy.discovered.wait()
        yield proxy
        nursery.cancel_scope.cancel()
