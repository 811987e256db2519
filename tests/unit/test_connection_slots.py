"""At ``max_connections`` a connection that has not spoken gives its slot to a newcomer.

The bookkeeping (``proxy.relay.connection_slots``) on its own, then the whole proxy in
front of an in-process dev cluster over loopback (run-time ports): a leak of silent
sockets at the limit no longer locks a new client out (issue 19's connection-leak row),
while connections that have sent a request are never closed to make room and a newcomer
is refused, as before, when every slot is theirs.
"""

from __future__ import annotations

import structlog
import trio
from support.dev_proxy import proxy_on_dev_cluster
from support.loopback import API_VERSIONS, request, settings
from support.trio_waits import closed_by_peer, until

from proxy.observe.metrics import Metrics
from proxy.protocol.framing import FrameDecoder, encode_frame
from proxy.relay.connection_slots import ConnectionSlots
from proxy.server.proxy import Proxy

P = "kafka_fetch_proxy_"


def test_the_silent_connection_that_waited_longest_gives_way_and_one_that_spoke_never() -> None:
    slots: ConnectionSlots[str] = ConnectionSlots()
    assert slots.admit("a", 3) == (True, None)
    assert slots.admit("b", 3) == (True, None)
    slots.spoke("a")
    assert slots.admit("c", 3) == (True, None)
    assert len(slots) == 3 and slots.silent == 2
    # at the limit: b (the oldest that has not spoken) gives way, a (which spoke) does not
    assert slots.admit("d", 3) == (True, "b")
    assert len(slots) == 3 and slots.displaced == 1
    slots.leave("b")  # its end: its slot is already d's
    assert len(slots) == 3
    slots.spoke("d")
    assert slots.admit("e", 3) == (True, "c")
    slots.leave("c")
    slots.spoke("e")
    # every connection has spoken: the newcomer is refused, nobody is closed
    assert slots.admit("f", 3) == (False, None)
    assert len(slots) == 3 and slots.silent == 0 and slots.displaced == 2
    slots.leave("a")
    assert slots.admit("f", 3) == (True, None)
    for handle in "def":
        slots.leave(handle)
    assert len(slots) == 0 and slots.silent == 0


async def test_a_leak_of_silent_sockets_at_max_connections_does_not_lock_a_new_client_out() -> None:
    metrics = Metrics(process_metrics=False)
    value = metrics.registry.get_sample_value
    with trio.fail_after(20), structlog.testing.capture_logs() as logs:
        async with proxy_on_dev_cluster(max_connections=3, metrics=metrics) as proxy:
            port = proxy.bootstrap.port
            served = await trio.open_tcp_stream("127.0.0.1", port)
            await request(served, FrameDecoder(1 << 20), API_VERSIONS)
            silent = await trio.open_tcp_stream("127.0.0.1", port)  # the leak: sends nothing
            await until(lambda: proxy.open_connections == 2)
            partial = await trio.open_tcp_stream("127.0.0.1", port)
            await partial.send_all(encode_frame(API_VERSIONS)[:7])  # never the rest
            await until(lambda: proxy.slots.silent == 2)
            # the limit is reached (10 s before first_request_timeout_seconds): a newcomer
            # is served, the silent socket that waited longest is closed for it
            newcomer = await trio.open_tcp_stream("127.0.0.1", port)
            await request(newcomer, FrameDecoder(1 << 20), API_VERSIONS)
            assert await closed_by_peer(silent)
            # the next one displaces the half-sent request (no whole request is no request)
            second = await trio.open_tcp_stream("127.0.0.1", port)
            await request(second, FrameDecoder(1 << 20), API_VERSIONS)
            assert await closed_by_peer(partial)
            assert proxy.open_connections == 3 and proxy.slots.silent == 0
            # every slot is held by a connection that has spoken: refused, as before
            refused = await trio.open_tcp_stream("127.0.0.1", port)
            assert await closed_by_peer(refused)
            for stream in (served, newcomer, second):  # none of them was closed
                await request(stream, FrameDecoder(1 << 20), API_VERSIONS)
                await stream.aclose()
            await until(lambda: proxy.open_connections == 0)
    displaced = [e for e in logs if e.get("reason") == "displaced"]
    assert len(displaced) == 2
    assert all(e["event"] == "connection_closed" and e["log_level"] == "warning" for e in displaced)
    assert displaced[0]["limit"] == 3 and "--max-connections" in displaced[0]["hint"]
    assert value(f"{P}client_connections_closed_total", {"cause": "displaced"}) == 2
    assert [e["reason"] for e in logs if e["event"] == "connection_refused"] == ["max_connections"]
    assert value(f"{P}client_connections_refused_total", {"reason": "max_connections"}) == 1
    assert value(f"{P}client_connections_closed_total", {"cause": "first_request_timeout"}) == 0


async def test_sockets_accepted_together_do_not_all_time_out_in_the_same_turn() -> None:
    """A thousand silent sockets accepted in the same second used to reach their
    first-request deadline in the same scheduler turn: closing them all held every other
    client's request for about a second (bench/attacks.py idle-connections).  The deadlines
    are spread over a tenth of ``first_request_timeout_seconds``, never earlier than it."""
    proxy = Proxy(settings("127.0.0.1:1", first_request_timeout_seconds=10, max_connections=500))
    slots = [proxy._admit(None, "?") for _ in range(500)]  # let in: no I/O
    waits = [slot.first.deadline - slot.accepted for slot in slots if slot is not None]
    assert len(waits) == 500
    assert 10 <= min(waits) and max(waits) <= 11
    assert max(waits) - min(waits) > 0.5
    assert len(set(waits)) > 400
