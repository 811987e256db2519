"""What the Fetch path holds for a client, and in whose name it speaks upstream.

Issue 19: every request the proxy sends on a client's connection carries that
client's own client id; a connection's downstream fetch sessions, translator and
buffers end with it, at once (no wait for the cyclic GC); the cached session
partitions of the whole process are bounded; session ids are unpredictable.
The harness is test_fetchpath's: the real Relay, the dev broker's dispatcher upstream.
"""

from __future__ import annotations

import pytest
from test_fetchpath import ALL, Conn, World

from proxy.protocol import codec


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
