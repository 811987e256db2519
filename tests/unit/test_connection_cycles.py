"""A closed client connection is freed by reference counting, not by the cycle collector.

The server runs a full collection only on a timer (issue 19: ``FULL_COLLECTION_SECONDS``,
up to ``FULL_COLLECTION_MAX_SECONDS`` while they find nothing), so whatever a closed
connection leaves in a reference cycle stays until then.  Its
``Connection`` was in two: the drain's ``quiet`` check and the lazy upstream's
``on_open`` callback were closures over it, held by objects it holds.
"""

from __future__ import annotations

import gc
import weakref

import trio
import trio.testing
from support.dev_proxy import proxy_on_dev_cluster
from support.loopback import API_VERSIONS, request
from support.trio_waits import until

from proxy.protocol.framing import FrameDecoder


def _referrers(obj: object) -> list[str]:
    """What still holds *obj* (for the failure message)."""
    return [type(r).__name__ for r in gc.get_referrers(obj)]


def test_a_closed_connection_is_freed_without_the_cycle_collector() -> None:
    async def main() -> None:
        with trio.fail_after(30):
            async with proxy_on_dev_cluster() as proxy:
                port = proxy.bootstrap.port
                gc.collect()
                gc.disable()
                try:
                    client = await trio.open_tcp_stream("127.0.0.1", port)
                    await request(client, FrameDecoder(1 << 20), API_VERSIONS)  # relayed
                    await until(lambda: len(proxy.live) == 1)
                    (live,) = proxy.live.values()
                    served = weakref.ref(live.connection)
                    del live
                    await client.aclose()
                    await until(lambda: not proxy.live)
                    await trio.testing.wait_all_tasks_blocked(0.05)
                    left = served()
                    assert left is None, _referrers(left)
                finally:
                    gc.enable()

    trio.run(main)
