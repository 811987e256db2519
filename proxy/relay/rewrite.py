"""Address rewriting: every broker address a client sees points at the proxy.

Responses that carry broker endpoints (host, port) are rewritten so the client
connects back through the proxy; node ids stay the real ones, so leader ids in
partition metadata and Fetch/Produce ``CurrentLeader`` fields keep matching the
brokers the client knows.  The APIs and versions concerned:

==================  ==========  =======================================================
API (key)           versions    entity rewritten
==================  ==========  =======================================================
Produce (0)         v10+        NodeEndpoints (tagged field 0 of the response)
Fetch (1)           v16+        NodeEndpoints (tagged field 0 of the response)
Metadata (3)        all         brokers[]
FindCoordinator     v0-v3       the response itself (node_id, host, port)
(10)                v4+         coordinators[]
DescribeCluster     all         brokers[] (broker_id, host, port)
(60)
ShareFetch (78),    all         NodeEndpoints (KIP-932; kio knows v1+, the first
ShareAcknowledge                stable version; a v0 request is refused)
(79)
==================  ==========  =======================================================

Produce v13 and Fetch v13+ name topics by id; their NodeEndpoints are the same.
Which other responses carry addresses, and why the proxy never advertises
them, is ``endpoints.py``.

An entry with a negative node id (e.g. FindCoordinator's "no coordinator"
answer, node -1 with an empty host) is left alone.  Everything else in the
response, unknown tagged fields included, is preserved byte for byte (see
``protocol/walk.py``); when no endpoint is present the very same bytes object is returned.

One rule (:func:`advertised`), two carriers: relayed responses are rewritten in
their bytes (``rewrite_response``); a Fetch response the proxy encodes itself
is rewritten as a decoded value before encoding (``rewrite_node_endpoints``),
since its encoded form is a gather list whose records are views of the
upstream frame, which a byte rewrite would have to copy.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import fields, replace
from functools import cache
from typing import Any

from kio.static.primitive import i32

from ..protocol import codec, walk
from ..protocol.apis import (
    DESCRIBE_CLUSTER,
    FETCH,
    FIND_COORDINATOR,
    METADATA,
    PRODUCE,
    SHARE_ACKNOWLEDGE,
    SHARE_FETCH,
)
from ..protocol.errors import DecodeError
from ..protocol.varint import read_uvarint

_MIN_VERSION = {
    PRODUCE: 10,
    FETCH: 16,
    METADATA: 0,
    FIND_COORDINATOR: 0,
    DESCRIBE_CLUSTER: 0,
    SHARE_FETCH: 0,
    SHARE_ACKNOWLEDGE: 0,
}
REWRITTEN_APIS = frozenset(_MIN_VERSION)
"""APIs whose responses may carry broker addresses (at some versions)."""

_I32 = struct.Struct(">i")

Resolver = Callable[[int, str, int], tuple[str, int] | None]
"""(node_id, upstream host, upstream port) -> (advertised host, advertised port), or None to keep."""


def needs_rewrite(api_key: int, api_version: int) -> bool:
    minimum = _MIN_VERSION.get(api_key)
    return minimum is not None and api_version >= minimum


def advertised(resolve: Resolver, node_id: int, host: str, port: int) -> tuple[str, int] | None:
    """The address a client is told for a broker endpoint, or None to keep it as it is."""
    if node_id < 0:
        return None
    address = resolve(node_id, host, port)
    return None if address is None or address == (host, port) else address


@cache
def is_endpoint(cls: type) -> bool:
    """Is *cls* an entity the proxy rewrites (a host and port that name a node)?  Asked once
    per kio class (bounded: the classes kio defines), not once per entity walked."""
    names = {f.name for f in fields(cls)}
    return {"host", "port"} <= names and bool(names & {"node_id", "broker_id"})


class _EndpointHook:
    __slots__ = ("resolve",)

    def __init__(self, resolve: Resolver) -> None:
        self.resolve = resolve

    def wants(self, cls: type) -> bool:
        return is_endpoint(cls)

    def __call__(
        self, cls: type, buf: bytes, spans: dict[str, walk.Span], start: int, end: int
    ) -> bytes | None:
        flexible = bool(cls.__flexible__)  # type: ignore[attr-defined]
        node_id = walk.read_i32(buf, spans.get("node_id") or spans["broker_id"])
        if node_id < 0:
            return None
        host = walk.decode_string(buf, spans["host"], flexible) or ""
        port = walk.read_i32(buf, spans["port"])
        address = advertised(self.resolve, node_id, host, port)
        if address is None:
            return None
        new_host, new_port = address
        h0, h1 = spans["host"]
        p0, p1 = spans["port"]
        if not h1 <= p0:  # every Kafka schema lists host before port
            raise DecodeError(f"{cls.__name__}: port precedes host")
        return b"".join(
            (
                buf[start:h0],
                walk.encode_string(new_host, flexible),
                buf[h1:p0],
                _I32.pack(new_port),
                buf[p1:end],
            )
        )


def rewrite_response(api_key: int, api_version: int, frame: bytes, resolve: Resolver) -> bytes:
    """Rewrite the broker endpoints in a response frame (header + body).

    Returns ``frame`` itself when the API/version carries no endpoints or none
    changed.  Raises DecodeError (a ProtocolError) on a malformed response.
    """
    if not needs_rewrite(api_key, api_version):
        return frame
    schema = codec.response_schema(api_key, api_version)
    hv = codec.response_header_version(api_key, api_version)
    if schema is None or hv is None:
        raise DecodeError(f"cannot rewrite api_key={api_key} v{api_version}: unknown schema")
    offset = codec.response_body_offset(frame, hv)
    if (
        api_key == PRODUCE
        and api_version <= PRODUCE_SKIPPED_MAX
        and _no_node_endpoints(frame, offset, api_version)
    ):
        return frame  # (every Produce answer that names no new leader: nothing to walk)
    return walk.rewrite(schema, frame, offset, _EndpointHook(resolve))


PRODUCE_SKIPPED_MAX = 13
"""The newest ProduceResponse version ``_no_node_endpoints`` knows the layout of (a newer
one is walked whole)."""
_PARTITION_FIXED = 4 + 2 + 8 + 8 + 8
"""A PartitionProduceResponse's index, error_code, base_offset, log_append_time_ms and
log_start_offset (v5+)."""


def _no_node_endpoints(frame: bytes, offset: int, version: int) -> bool:
    """Whether a flexible ProduceResponse (v10-v13) body at *offset* ends with an empty
    top-level tagged-field section, so that it has no NodeEndpoints (KIP-951) to rewrite:
    a skip over its layout with no entity built (a one-partition answer: about 3 us
    against the generic walk's 7, by timeit; a producer at linger 0 gets one per record).  False
    whenever it cannot tell (tagged fields present, or bytes it does not expect): the
    walk then judges, and reports a malformed response."""
    try:
        pos = offset
        topics, pos = read_uvarint(frame, pos)
        for _ in range(topics - 1):
            if version >= 13:
                pos += 16  # topic_id
            else:
                n, pos = read_uvarint(frame, pos)  # name (never null)
                if n == 0:
                    return False
                pos += n - 1
            partitions, pos = read_uvarint(frame, pos)
            for _ in range(partitions - 1):
                pos += _PARTITION_FIXED
                errors, pos = read_uvarint(frame, pos)
                for _ in range(errors - 1):
                    pos += 4  # batch_index
                    n, pos = read_uvarint(frame, pos)  # batch_index_error_message
                    pos = codec.skip_tagged_fields(frame, pos + max(n - 1, 0))
                n, pos = read_uvarint(frame, pos)  # error_message
                # then the partition's tagged fields (current_leader, tag 0)
                pos = codec.skip_tagged_fields(frame, pos + max(n - 1, 0))
            pos = codec.skip_tagged_fields(frame, pos)
        pos += 4  # throttle_time_ms
        tags, pos = read_uvarint(frame, pos)
    except DecodeError:
        return False
    return tags == 0 and pos == len(frame)


def rewrite_node_endpoints(response: Any, resolve: Resolver) -> Any:
    """A decoded response with its NodeEndpoints (Fetch v16+, Produce v10+) resolved.

    For responses the proxy encodes itself (a reshaped Fetch): the same rule as
    ``rewrite_response`` (negative node ids and unresolved nodes kept), applied
    to the object before encoding.  Returns *response* itself when nothing changed.
    """
    endpoints = getattr(response, "node_endpoints", None)
    if not endpoints:
        return response
    out = []
    changed = False
    for endpoint in endpoints:
        address = advertised(resolve, int(endpoint.node_id), endpoint.host, int(endpoint.port))
        if address is not None:
            endpoint = replace(endpoint, host=address[0], port=i32(address[1]))
            changed = True
        out.append(endpoint)
    return replace(response, node_endpoints=tuple(out)) if changed else response


def collect_endpoints(api_key: int, api_version: int, frame: bytes) -> dict[int, tuple[str, int]]:
    """The (upstream) endpoints a response announces, by node id; nothing is changed."""
    found: dict[int, tuple[str, int]] = {}

    def record(node_id: int, host: str, port: int) -> tuple[str, int] | None:
        found[node_id] = (host, port)
        return None

    rewrite_response(api_key, api_version, frame, record)
    return found
