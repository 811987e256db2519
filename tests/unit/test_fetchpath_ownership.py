"""What the Fetch path holds for a client, and in whose name it speaks upstream.

Issue 19: every request the proxy sends on a client's connection carries that
client's own client id; a connection's downstream fetch sessions, translator and
buffers end with it, at once (no wait for the cyclic GC); the cached session
partitions of the whole process are bounded; session ids are unpredictable.
The harness is test_fetchpath's: the real Relay, the dev broker's dispatcher upstream.
"""

from __future__ import annotations

import dataclasses
import gc
import random
import tracemalloc
import weakref
from typing import Any

import pytest
from support.dev_upstream import client_fetch
from support.fetch_world import ALL, Conn, World

from proxy.config import FetchPathConfig
from proxy.protocol import codec
from proxy.protocol.error_codes import FETCH_SESSION_ID_NOT_FOUND
from proxy.sessions import as_broker_cache


@pytest.mark.parametrize("client_id", ["billing-consumer-7", "", None])
def test_every_upstream_request_carries_the_clients_own_client_id(client_id: str | None) -> None:
    # A names client (v12) through an ids upstream (v17): the proxy asks Metadata for
    # the topic ids itself, then fetches; both go out as the client, not as the proxy.
    w = World()
    c = Conn(w, client_id)  # type: ignore[arg-type]
    c.handler.upstream_fetch_max, c.handler.upstream_metadata_max = 17, 12
    w.append("orders", 0, 2)
    c.fetch(2, ALL)
    c.fetch(3, ALL)
    keys = [codec.parse_request_header(f).api_key for f in c.upstream_frames]
    assert 3 in keys and keys.count(1) >= 2  # Metadata and the fetches
    assert {codec.parse_request_header(f).client_id for f in c.upstream_frames} == {client_id}


def session_fetch(
    c: Conn, cid: int, parts: list[tuple[str, int, int]], session_id: int, epoch: int
) -> Any:
    """The client's Fetch v12 in a KIP-227 session (a Java or franz-go client), answered."""

    class _Up:
        state = c.world.state

    request = dataclasses.replace(
        client_fetch(_Up(), 12, parts),  # type: ignore[arg-type]
        session_id=session_id,
        session_epoch=epoch,
    )
    [out] = c.send(codec.encode_request(request, cid, c.client_id))
    return codec.decode_response(1, 12, out)[1]


def cached(w: World) -> int:
    return sum(cache.num_partitions for cache in w.path.client_session_caches())


def test_a_clients_fetch_session_ends_with_its_connection() -> None:
    w = World()
    a = Conn(w)
    created = session_fetch(a, 1, ALL, 0, 0)
    sid = int(created.session_id)
    assert sid != 0 and cached(w) == len(ALL)
    assert int(session_fetch(a, 2, [], sid, 1).error_code) == 0  # incremental, in session
    a.handler.close()
    assert cached(w) == 0  # not 120 s later, when the cache would evict it
    # The client reconnects: Kafka's FetchSessionHandler (handleError) sends a full fetch
    # with the old id and epoch 0, which closes the old session and opens a new one.
    b = Conn(w)
    again = session_fetch(b, 3, ALL, sid, 0)
    assert int(again.error_code) == 0 and int(again.session_id) not in (0, sid)
    assert cached(w) == len(ALL)
    # An incremental fetch in the closed session is answered as a broker answers it.
    stale = session_fetch(Conn(w), 4, [], sid, 2)
    assert int(stale.error_code) == FETCH_SESSION_ID_NOT_FOUND and cached(w) == len(ALL)


def test_a_connection_cannot_use_or_close_another_connections_session() -> None:
    w = World()
    a, b = Conn(w), Conn(w)
    sid = int(session_fetch(a, 1, ALL, 0, 0).session_id)
    refused = session_fetch(b, 1, [], sid, 1)
    assert int(refused.error_code) == FETCH_SESSION_ID_NOT_FOUND
    # A full fetch naming it opens b's own session and leaves a's alone.
    own = int(session_fetch(b, 2, ALL[:2], sid, 0).session_id)
    assert own not in (0, sid) and cached(w) == len(ALL) + 2
    assert int(session_fetch(a, 2, [], sid, 1).error_code) == 0
    # A connection holds one session: opening a new one closes its previous one.
    newer = int(session_fetch(b, 3, ALL[:3], 0, 0).session_id)
    assert newer not in (0, own) and cached(w) == len(ALL) + 3


def test_the_partitions_of_all_client_sessions_are_bounded_process_wide() -> None:
    w = World(FetchPathConfig(max_cached_session_partitions=10))
    a, b = Conn(w, node_id=1), Conn(w, node_id=None)  # two listeners, one bound
    sid = int(session_fetch(a, 1, ALL, 0, 0).session_id)
    assert sid != 0 and cached(w) == 7
    # 7 + 7 > 10: no session, the full answer with session id 0, as Kafka's full cache.
    full = session_fetch(b, 1, ALL, 0, 0)
    assert int(full.error_code) == 0 and int(full.session_id) == 0
    assert len([p for t in full.responses for p in t.partitions]) == len(ALL)
    assert cached(w) == 7 and b.handler.downstream.refused_sessions == 1
    small = int(session_fetch(b, 2, ALL[:3], 0, 0).session_id)
    assert small != 0 and cached(w) == 10
    # Growing a session past the bound closes it: session id 0, every partition.
    grown = session_fetch(b, 3, ALL[3:4], small, 1)
    assert int(grown.session_id) == 0 and cached(w) == 7
    assert len([p for t in grown.responses for p in t.partitions]) == 4


def test_session_ids_come_from_the_operating_systems_csprng(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    drawn: list[int] = []

    class Recording(random.SystemRandom):
        def randrange(self, *args: Any, **kwargs: Any) -> int:
            drawn.append(value := super().randrange(*args, **kwargs))
            return value

    monkeypatch.setattr(as_broker_cache.secrets, "SystemRandom", Recording)
    w = World()
    sid = int(session_fetch(Conn(w), 1, ALL, 0, 0).session_id)
    assert drawn == [sid]


def test_a_closed_connection_frees_its_state_at_once_without_the_cyclic_gc() -> None:
    # 1,500 partitions in a client session, served through the upstream translator:
    # its partition states, the downstream session, the decoded requests.  Upstream
    # sessions off, so the dev broker holds nothing of this connection.
    w = World(FetchPathConfig(fetch_sessions=False))
    n = 1500
    w.state.create_topic("big", n)
    parts = [("big", p, 0) for p in range(n)]
    # A first connection compiles the ranged readers and writers a fetch this large
    # uses (process-wide caches, kept by design), so what the measured one leaves
    # behind is its own state only.
    warm = Conn(w).with_edge()
    warm_sid = int(session_fetch(warm, 1, parts, 0, 0).session_id)
    session_fetch(warm, 2, [], warm_sid, 1)
    warm.handler.close()
    del warm
    gc.collect()
    gc.disable()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        c = Conn(w).with_edge()
        sid = int(session_fetch(c, 1, parts, 0, 0).session_id)
        session_fetch(c, 2, [], sid, 1)
        held = tracemalloc.get_traced_memory()[0] - before
        assert c.handler.translator is not None
        translator = weakref.ref(c.handler.translator)
        c.handler.close()
        del c
        left = tracemalloc.get_traced_memory()[0] - before
        assert held > 1 << 20  # what the connection held
        assert translator() is None  # freed by reference counting alone
        # What stays is the interpreter's free lists (tuples, dicts), not the connection's.
        assert left < held // 4, (held, left)
        assert cached(w) == 0
    finally:
        tracemalloc.stop()
        gc.enable()
