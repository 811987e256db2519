"""A large fetch does not hold the event loop: it is served in slices, queued fetches wait undecoded.

Issue 19 part 2.  The harness is test_fetchpath's (the real Relay, the dev broker's
dispatcher upstream); ``Conn.with_edge`` acts as the trio edge, whose wake loop
runs the next slice in a later turn (``Conn.pump``), so other connections are
served between two slices of one fetch.
"""

from __future__ import annotations

from typing import Any

import pytest
from support.fetch_world import ALL, Conn, World, delivered

from proxy import fetchpath
from proxy.config import FetchPathConfig
from proxy.protocol import codec
from proxy.protocol.errors import ProtocolError
from proxy.protocol.framing import payload_bytes
from proxy.sessions.as_broker import DEFAULT_MAX_FETCH_PARTITIONS, FetchTooLarge


def big_world(n: int) -> tuple[World, list[tuple[str, int, int]]]:
    w = World()
    w.state.create_topic("big", n)
    for p in range(0, n, 97):
        w.append("big", p, 2)
    return w, [("big", p, 0) for p in range(n)]


def test_a_large_fetch_is_served_in_slices_and_others_are_served_between_them() -> None:
    n = fetchpath.SLICE_PARTITIONS * 3
    w, parts = big_world(n)
    big, small = Conn(w).with_edge(), Conn(w).with_edge()
    big.relay.client_frame(big.fetch_frame(1, parts))
    # The big fetch ran one slice (its decode) and asked the edge for another turn:
    # nothing went upstream yet, and another client is served meanwhile.
    assert big.wakes == 1 and not big.relay.take_upstream()
    assert delivered(small.fetch(1, [("big", 0, 0)])) == {("big", 0): [(0, 2)]}
    [out] = big.pump()
    assert big.handler.slices >= 7  # decode | open | shape | begin ; decode | complete | ...
    sliced = codec.decode_response(1, 12, out)[1]
    # The same answer as served in one go (a connection with no edge runs every slice now).
    whole = Conn(w).fetch(1, parts)
    assert delivered(sliced) == delivered(whole)
    assert sum(len(b) for b in delivered(sliced).values()) == len(range(0, n, 97))


def test_a_small_fetch_takes_no_extra_loop_turn() -> None:
    w, parts = big_world(fetchpath.SLICE_PARTITIONS // 2)
    c = Conn(w).with_edge()
    c.fetch(1, parts)
    assert c.handler.slices == 0 and c.woken == 0


def test_a_connection_closed_between_slices_gives_everything_back() -> None:
    w, parts = big_world(fetchpath.SLICE_PARTITIONS * 2)
    c = Conn(w).with_edge()
    c.relay.client_frame(c.fetch_frame(1, parts))
    for _ in range(3):  # decoded (a turn of its own); opening: partitions read, then listed
        c.wakes -= 1
        c.handler.resume()
    assert c.handler.slices == 2 and c.wakes == 1
    c.handler.close()
    c.handler.resume()  # the edge's pending wake-up finds nothing to run
    assert w.path.budget.used == 0 and not c.relay.take_upstream()
    assert c.handler.slices == 2


def test_queued_fetches_are_decoded_only_when_they_start(monkeypatch: pytest.MonkeyPatch) -> None:
    decoded: list[int] = []
    decode = fetchpath.FetchPathHandler._decode

    def counting(self: fetchpath.FetchPathHandler, request: Any) -> Any:
        decoded.append(request.header.correlation_id)
        return decode(self, request)

    monkeypatch.setattr(fetchpath.FetchPathHandler, "_decode", counting)
    w, _ = big_world(8)
    c = Conn(w).with_edge()
    c.send(c.fetch_frame(1, [("big", 0, 0)]), answer=False)  # in flight upstream
    frames = [c.fetch_frame(cid, [("big", 0, cid)]) for cid in range(2, 42)]
    assert c.send(*frames, answer=False) == []
    assert decoded == [1]  # 40 pipelined fetches wait as frames, not as decoded requests
    out = c.release_held()
    assert len(out) == 41 and decoded == list(range(1, 42))


def test_a_fetch_of_more_partitions_than_max_fetch_partitions_closes_the_connection() -> None:
    assert FetchPathConfig.from_raw({}).max_fetch_partitions == DEFAULT_MAX_FETCH_PARTITIONS
    w = World(FetchPathConfig(max_fetch_partitions=6))
    c = Conn(w)
    assert len(delivered(c.fetch(1, ALL[:6]))) == 6  # at the limit: served
    with pytest.raises(FetchTooLarge, match="a Fetch of at least 7 partitions") as raised:
        c.send(c.fetch_frame(2, ALL))  # sessionless: it names every partition it reads
    # a ProtocolError: the edge closes the connection with one log line
    assert isinstance(raised.value, ProtocolError)
    assert not [f for f in c.relay.take_upstream() if codec.parse_request_header(f).api_key == 1]


def test_a_fetch_over_max_fetch_partitions_is_refused_before_it_is_decoded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[int] = []
    decode = fetchpath.FetchPathHandler._decode

    def counting(self: fetchpath.FetchPathHandler, request: Any) -> Any:
        decoded.append(request.header.correlation_id)
        return decode(self, request)

    monkeypatch.setattr(fetchpath.FetchPathHandler, "_decode", counting)
    w = World(FetchPathConfig(max_fetch_partitions=6))
    c = Conn(w).with_edge()
    with pytest.raises(FetchTooLarge, match="a Fetch of at least 7 partitions"):
        c.relay.client_frame(c.fetch_frame(1, ALL))
    # counted from its bytes: the refusal cost no decode, and nothing was queued
    assert decoded == [] and not c.handler._queue


def test_a_large_fetch_yields_within_its_stages_and_others_are_served_between_ranges() -> None:
    n = 5_000
    w, parts = big_world(n)
    big, small = Conn(w).with_edge(), Conn(w).with_edge()
    served = 0

    def turn() -> None:  # one turn of the big connection's wake loop, then another client's
        nonlocal served
        big.wakes -= 1
        big.handler.resume()
        assert delivered(small.fetch(1, [("big", 0, 0)])) == {("big", 0): [(0, 2)]}
        served += 1

    big.relay.client_frame(big.fetch_frame(1, parts))
    out: list[bytes] = []
    for _ in range(1000):
        while big.wakes:
            turn()
        frames = big.relay.take_upstream()
        for f in frames:
            big.relay.upstream_frame(big.world.answer(f))
        out += [payload_bytes(p) for p in big.relay.take_client()]
        if out and not big.wakes:
            break
    # Stage boundaries alone are 7 yields; the upstream session's begin (reading the
    # client's partitions, building the upstream request) and complete (recording the
    # answer, building the client's), the downstream session's open (reading the
    # client's partitions, listing them, the full fetch) and answer (reading the answer,
    # grouping the client's), the decodes of the request and of the upstream answer and
    # the encodes of the upstream request and of the client's response yield every
    # SLICE_PARTITIONS partitions besides.
    ranges = n // fetchpath.SLICE_PARTITIONS
    assert big.handler.slices >= 7 + 13 * ranges - 7
    # Every slice is a turn of the wake loop, none runs in the loop that read a frame;
    # +3: the last turn of the request's decode (in ranges too) and of each direction
    # ends its stages rather than yielding.
    assert served == big.handler.slices + 3
    [frame] = out
    sliced = codec.decode_response(1, 12, frame)[1]
    whole = Conn(w).fetch(1, parts)
    assert delivered(sliced) == delivered(whole)


def test_the_fetch_path_loads_every_fetch_schema_before_it_serves(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """kio imports a Fetch version's schemas on first use (30-70 ms, once): at start, not on
    the loop when a client first fetches at that version."""
    loaded: list[tuple[str, int, int]] = []

    def recording(kind: str, load: Any) -> Any:
        def recorded(api_key: int, version: int) -> Any:
            loaded.append((kind, api_key, version))
            return load(api_key, version)

        return recorded

    monkeypatch.setattr(
        codec, "load_request_schema", recording("request", codec.load_request_schema)
    )
    monkeypatch.setattr(
        codec, "load_response_schema", recording("response", codec.load_response_schema)
    )
    codec.request_schema.cache_clear()
    codec.response_schema.cache_clear()
    try:
        fetchpath.FetchPath(FetchPathConfig())
    finally:
        codec.request_schema.cache_clear()
        codec.response_schema.cache_clear()
    for kind in ("request", "response"):
        versions = {v for k, key, v in loaded if k == kind and key == 1}
        assert versions >= set(range(4, 19))
