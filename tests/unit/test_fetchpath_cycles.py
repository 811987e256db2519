"""A closed connection that fetched through the fetch path is freed by reference counting.

The server runs a full collection of the cycle collector only on a timer (issue 19:
``FULL_COLLECTION_SECONDS``, up to ``FULL_COLLECTION_MAX_SECONDS`` while they find
nothing), so whatever a closed connection leaves in a reference cycle stays until then.  ``test_connection_cycles`` checks a connection that
only relayed; here the connection fetched with a fetch session, through shaping that
trimmed its responses and held the rest (its reuse buffer, its rotations, its
upstream session and translator, its downstream session), then closed.  Its handler
was in two cycles: with the preferred replicas' links (which hold its ``wake`` and
``reserve_response``) and with its relay (whose upstream port held the relay's send).
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import trio
import trio.testing
from support.fetch_messages import fetch_request, fetch_topics
from support.fetch_model import batch
from support.loopback import request, settings
from support.trio_waits import until

from devbroker.cluster import DevCluster
from proxy.protocol import codec
from proxy.protocol.framing import FrameDecoder
from proxy.protocol.messages import make, request_module
from proxy.server.proxy import Proxy


def _referrers(obj: object) -> list[str]:
    """What still holds *obj* (for the failure message)."""
    return [type(r).__name__ for r in gc.get_referrers(obj)]


def test_a_closed_connection_that_fetched_is_freed_without_the_cycle_collector() -> None:
    async def main() -> None:
        with trio.fail_after(30):
            async with (
                DevCluster(nodes=1, topics={"t": 3}) as cluster,
                trio.open_nursery() as nursery,
            ):
                for p in range(3):
                    part = cluster.state.partition("t", p)
                    assert part is not None
                    for offset in range(3):
                        part.log.append(batch(offset, 1), part.leader_epoch)
                proxy = await nursery.start(
                    Proxy(settings(cluster.bootstrap, max_partition_records=1)).serve
                )
                await proxy.discovered.wait()
                assert proxy.fetch_path is not None
                gc.collect()
                gc.disable()
                try:
                    await _fetch_and_close(proxy)
                finally:
                    gc.enable()
                nursery.cancel_scope.cancel()

    trio.run(main)


async def _fetch_and_close(proxy: Any) -> None:
    client = await trio.open_tcp_stream("127.0.0.1", proxy.broker_address(0)[1])
    decoder = FrameDecoder(1 << 20)

    async def fetch(frame: bytes) -> Any:
        return codec.decode_response(1, 12, await request(client, decoder, frame))[1]

    mod = request_module(1, 12)
    parts = [
        ("t", make(mod.FetchPartition, partition=p, fetch_offset=0, partition_max_bytes=1 << 16))
        for p in range(3)
    ]
    frame = codec.encode_request(
        fetch_request(12, fetch_topics(12, parts), session_epoch=0), 1, "c"
    )
    opened = await fetch(frame)  # a session opens
    assert opened.error_code == 0 and opened.session_id != 0
    assert all(len(p.records or b"") > 0 for t in opened.responses for p in t.partitions)
    await until(lambda: len(proxy.live) == 1)
    (live,) = proxy.live.values()
    (handler,) = proxy.fetch_path.handlers
    assert len(handler.shaper.buffer) == 3  # two batches of each partition held
    served = weakref.ref(live.connection)
    relay = weakref.ref(live.relay)
    fetched = weakref.ref(handler)
    shaper = weakref.ref(handler.shaper)
    translator = weakref.ref(handler.translator)
    del live, handler
    await client.aclose()
    await until(lambda: not proxy.live)
    await trio.testing.wait_all_tasks_blocked(0.05)
    for name, ref in (
        ("Connection", served),
        ("Relay", relay),
        ("FetchPathHandler", fetched),
        ("FetchShaper", shaper),
        ("FetchTranslator", translator),
    ):
        left = ref()
        assert left is None, (name, _referrers(left))
