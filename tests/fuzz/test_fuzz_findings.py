"""What the fuzzers found, one test per finding, each asserting the correct behaviour.

These fail until the code they name is fixed (see RELIABILITY.md, "Fuzzing").
"""

from __future__ import annotations

import random
import struct

import pytest
from fuzz import seeds, targets
from kio.serial import entity_reader

from proxy.protocol import codec
from proxy.protocol.errors import DecodeError, ProtocolError


def test_oversized_array_count_is_refused_without_allocating() -> None:
    """A 44-byte Fetch v12 request announcing 2**32-2 topics: kio 0.6.5 reserves 34 GB and the
    failed allocation aborts the whole proxy process (SIGABRT).  The codec must refuse it."""
    probe = targets.probe_oversized_fetch()
    assert probe.returncode == 0, f"the decoder killed its process: {probe.stderr[:200]}"
    assert probe.stdout.startswith("refused:")


def _fetch_v4(topics_count: int) -> bytes:
    body = struct.pack(">iiiibi", -1, 500, 1, 1 << 20, 0, topics_count)
    return struct.pack(">hhih", 1, 4, 9, 4) + b"fuzz" + body


def test_null_topics_array_in_a_client_fetch_is_a_protocol_error() -> None:
    """kio decodes a count of -1 as None even where the schema has no nullable array; the
    session path then iterates None (TypeError in proxy/sessions/as_broker.py)."""
    frame = _fetch_v4(-1)
    with pytest.raises(ProtocolError):
        targets.relay(b"\0" + targets.event(targets.CLIENT, frame))


def test_null_partitions_in_an_upstream_fetch_response_is_a_protocol_error() -> None:
    """Same root cause upstream: a Fetch response whose partitions array is null reaches
    proxy/protocol/fetch_views.py (records_as_views) and proxy/sessions/as_client.py as None."""
    req, _ = seeds.fetch_exchange(4, random.Random(0))
    # FetchResponse v4: throttle, responses[1] = {topic "t", partitions: null}
    response = struct.pack(">iii", 0, 0, 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", -1)
    with pytest.raises(ProtocolError):
        targets.relay(
            b"\0" + targets.event(targets.CLIENT, req) + targets.event(targets.UPSTREAM, response)
        )


def test_the_null_array_decodes_as_none() -> None:
    """The kio fact behind the two tests above (documents kio 0.6.5): kio itself decodes the
    null array as None, so the codec's check (``walk.check``) is what refuses it."""
    frame = _fetch_v4(-1)
    header = codec.parse_request_header(frame)
    assert header.body_offset is not None
    schema = codec.request_schema(header.api_key, header.api_version)
    body, _ = entity_reader(schema)(frame, header.body_offset)
    assert body.topics is None
    with pytest.raises(DecodeError, match=r"FetchRequest\.topics: null array"):
        codec.decode_request(frame)
