"""The upstream rotation orders full fetches only; an incremental one keeps the client's order.

A sessionless client's fetch goes upstream as the proxy's session's next request.  While
that session continues, the request is incremental: the broker answers its partitions in
the session's order and moves each it answered to the end (Kafka's
``IncrementalFetchContext``, the dev broker's session cache alike), the same round robin
the proxy's ``UpstreamRotation`` makes of a full fetch.  So the proxy does not reorder
such a request (a walk and a rebuild of every partition per fetch), and the client's
answer lists its partitions in the order it asked for them, as a broker answers a
sessionless fetch.  A full fetch upstream (sessions off, or a session's first request)
still starts after the last partition that had data.
"""

from __future__ import annotations

from typing import Any

from support.fetch_world import ALL, Conn, World, delivered, upstream_fetches

from proxy.config import FetchPathConfig
from proxy.protocol import codec


def _order(response: Any) -> list[tuple[str, int]]:
    return [(t.topic, int(p.partition_index)) for t in response.responses for p in t.partitions]


def _requested(request: Any) -> list[tuple[str, int]]:
    return [(t.topic, int(p.partition)) for t in request.topics for p in t.partitions]


def _at(offsets: dict[tuple[str, int], int]) -> list[tuple[str, int, int]]:
    return [(t, p, offsets.get((t, p), 0)) for t, p, _ in ALL]


def test_a_continued_session_answers_in_the_clients_order_as_the_broker_does() -> None:
    w = World()
    c = Conn(w)
    c.fetch(1, ALL)  # the upstream session's full fetch
    w.append("orders", 2, 1)
    got = c.fetch(2, ALL)
    assert delivered(got)[("orders", 2)] == [(0, 1)]
    # The rotation now starts after orders/2 (the partition that had data): before, the
    # answers that followed came in that order.  They come in the client's, the broker's.
    w.append("events", 0, 2)
    for cid, offsets in enumerate(
        ({("orders", 2): 1}, {("orders", 2): 1, ("events", 0): 2}), start=3
    ):
        parts = _at(offsets)
        frame = c.fetch_frame(cid, parts)
        [out] = c.send(frame)
        got = codec.decode_response(1, 12, out)[1]
        direct = codec.decode_response(1, 12, w.answer(frame, w.direct))[1]
        assert _order(got) == [(t, p) for t, p, _ in ALL]
        assert got == direct
    sent = upstream_fetches(c)
    assert [int(r.session_epoch) for r in sent] == [0, 1, 2, 3]


def test_with_sessions_off_each_full_fetch_starts_after_the_last_partition_with_data() -> None:
    w = World(FetchPathConfig(fetch_sessions=False))
    c = Conn(w)
    c.fetch(1, ALL)
    w.append("orders", 2, 1)
    assert delivered(c.fetch(2, ALL))[("orders", 2)] == [(0, 1)]
    c.fetch(3, _at({("orders", 2): 1}))
    sent = upstream_fetches(c)
    assert all(int(r.session_epoch) == -1 for r in sent)  # sessionless, full
    keys = [(t, p) for t, p, _ in ALL]
    assert _requested(sent[0]) == keys
    at = keys.index(("orders", 2)) + 1
    assert _requested(sent[2]) == keys[at:] + keys[:at]
