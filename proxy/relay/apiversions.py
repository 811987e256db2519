"""ApiVersions: tell clients only versions the proxy can relay safely.

The proxy answers a client's ApiVersions with the upstream broker's answer,
intersected with what the proxy can vouch for (``endpoints.advertisable``):
a version is offered only when kio has its schemas and every broker address
its response can carry is rewritten to the proxy.  This fails closed: an API
or a version kio does not know is not advertised (it might carry broker addresses, as Fetch v16,
Produce v10 and ShareFetch brought them), nor is one whose addresses the
proxy does not rewrite (DescribeQuorum v2+, the controllers' Raft APIs).  Each API keeps the highest contiguous run of
allowed versions within upstream's range; an API left with none is removed
from the list.  All other content (features, throttle time, unknown tagged
fields) is kept byte for byte.

A client that asks with an ApiVersions version newer than the proxy knows gets
what Kafka's broker answers in that case: a v0 response with
UNSUPPORTED_VERSION listing the ApiVersions range the proxy supports, so the
client retries with an older version.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cache

from kio.schema.api_versions.v0.response import ApiVersion as ApiVersionV0
from kio.schema.api_versions.v0.response import ApiVersionsResponse as ApiVersionsResponseV0
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType
from kio.static.primitive import i16

from ..protocol import codec, walk
from ..protocol.apis import API_VERSIONS
from ..protocol.errors import DecodeError
from . import endpoints

_I16 = struct.Struct(">h")
_MAX_PROBE = endpoints.MAX_PROBE


@cache
def kio_range(api_key: int) -> tuple[int, int] | None:
    """The contiguous range of versions (ending at the newest) kio has both schemas for.

    Read from kio's index of schemas, without importing them: the range of Metadata is
    asked at start-up and that of ApiVersions at a client's first ApiVersions, and
    importing every version's schema cost the loop 40-190 ms of CPU there."""
    versions = schema_name_map.get(api_key_map.get(api_key, ""), {})
    known = [
        v
        for v in range(_MAX_PROBE)
        if EntityType.request in versions.get(v, ()) and EntityType.response in versions.get(v, ())
    ]
    if not known:
        return None
    top = known[-1]
    low = top
    while low - 1 in known:
        low -= 1
    return low, top


def proxy_range(api_key: int, upstream: tuple[int, int]) -> tuple[int, int] | None:
    """What the proxy advertises for ``api_key`` when upstream supports ``upstream``.

    The highest contiguous run of ``endpoints.advertisable`` versions within
    upstream's range, or None when there is none.
    """
    low, high = upstream
    top = next(
        (
            v
            for v in range(min(high, _MAX_PROBE - 1), max(low, 0) - 1, -1)
            if endpoints.advertisable(api_key, v)
        ),
        None,
    )
    if top is None:
        return None
    bottom = top
    while bottom - 1 >= low and endpoints.advertisable(api_key, bottom - 1):
        bottom -= 1
    return bottom, top


@dataclass(slots=True)
class _Hook:
    changed: int = 0

    def wants(self, cls: type) -> bool:
        return cls.__name__ == "ApiVersion"

    def __call__(
        self, cls: type, buf: bytes, spans: dict[str, walk.Span], start: int, end: int
    ) -> bytes | None:
        api_key = walk.read_i16(buf, spans["api_key"])
        upstream = (
            walk.read_i16(buf, spans["min_version"]),
            walk.read_i16(buf, spans["max_version"]),
        )
        ours = proxy_range(api_key, upstream)
        if ours == upstream:
            return None
        self.changed += 1
        if ours is None:
            return b""
        lo0, lo1 = spans["min_version"]
        hi0, hi1 = spans["max_version"]
        return b"".join(
            (buf[start:lo0], _I16.pack(ours[0]), buf[lo1:hi0], _I16.pack(ours[1]), buf[hi1:end])
        )


def rewrite_api_versions(api_version: int, frame: bytes) -> bytes:
    """Intersect an upstream ApiVersions response frame (header v0 + body) with our ranges.

    Like Kafka's clients, falls back to reading the body as v0 when it does not
    parse at the requested version (brokers answer UNSUPPORTED_VERSION in v0).
    """
    hook = _Hook()
    offset = codec.response_body_offset(frame, 0)
    schema = codec.response_schema(API_VERSIONS, api_version)
    if schema is not None:
        try:
            return walk.rewrite(schema, frame, offset, hook)
        except DecodeError:
            if api_version == 0:
                raise
    return walk.rewrite(ApiVersionsResponseV0, frame, offset, _Hook())


def supports_request_version(api_version: int) -> bool:
    """Can the proxy read an ApiVersions response at this version?"""
    rng = kio_range(API_VERSIONS)
    return rng is not None and rng[0] <= api_version <= rng[1]


def unsupported_version_response(correlation_id: int) -> bytes:
    """Kafka's answer to an ApiVersions request at a version it does not know (header v0 + v0 body)."""
    rng = kio_range(API_VERSIONS)
    assert rng is not None
    resp = ApiVersionsResponseV0(
        error_code=ErrorCode.unsupported_version,
        api_keys=(
            ApiVersionV0(
                api_key=i16(API_VERSIONS), min_version=i16(rng[0]), max_version=i16(rng[1])
            ),
        ),
    )
    return codec.encode_response_header(correlation_id, 0) + codec.encode_body(resp)
