"""Which responses carry broker addresses, read from kio's schemas, and which the proxy may relay.

An *address entity* is a struct anywhere in a response schema (nested, in
arrays, in tagged fields) that has both a ``host`` and a ``port`` field.  The
proxy rewrites those that name a node (``node_id`` or ``broker_id``) in the
APIs and versions ``rewrite.needs_rewrite`` lists.  A version whose response
can hold an address entity the proxy does not rewrite would tell the client
where a broker or controller really is, and the client would connect past the
proxy.  So the proxy fails closed:

- ApiVersions advertises a version only when kio has its schemas and every
  address entity in its response is rewritten (``advertisable``).  A version
  or an API kio does not know may carry anything (Fetch v16, Produce v10 and
  ShareFetch each brought addresses) and is not offered.  That includes the
  versions Kafka 4.0 removed (KIP-896) and the early-access v0 of the share
  group APIs: a client that needs them could not fetch through the proxy
  anyway (Fetch before v4 is one of them);
- the relay refuses a request at a version kio knows to carry addresses the
  proxy does not rewrite, or at a version kio does not know of an API whose
  addresses the proxy rewrites (``refused``: ShareFetch v0, Fetch v19), as
  Kafka refuses a version it does not support: the connection is closed.

Today that leaves out DescribeQuorum v2+ (``nodes[].listeners`` are controller
endpoints; the proxy relays brokers only, so clients reaching controllers
through it is not supported; v0-v1 carry no endpoint) and the address-bearing
versions of the controllers' own Raft APIs (Vote, BeginQuorumEpoch,
EndQuorumEpoch, FetchSnapshot, UpdateRaftVoter), which brokers never
advertise anyway.

Not broker addresses: the ``Endpoint`` of Streams groups (KIP-1071,
StreamsGroupHeartbeat and StreamsGroupDescribe) is the ``application.server``
of a Kafka Streams instance, which applications contact directly; it passes
through unchanged.
"""

from __future__ import annotations

from dataclasses import fields
from functools import lru_cache

from kio.serial._introspect import EntityField, EntityTupleField, classify_field

from ..protocol import codec
from ..protocol.apis import STREAMS_GROUP_DESCRIBE, STREAMS_GROUP_HEARTBEAT
from . import rewrite
from .advertised import ADVERTISED

APPLICATION_ENDPOINTS = frozenset(
    {(STREAMS_GROUP_HEARTBEAT, "Endpoint"), (STREAMS_GROUP_DESCRIBE, "Endpoint")}
)
"""(api_key, entity class name): host/port entities that are not broker addresses."""

MAX_PROBE = 64
"""Versions probed per API (Kafka's highest today is in the teens)."""
_CACHED = 4096
"""Cached (api_key, version) answers: bounded, since requests name any pair."""


def _entities(cls: type, seen: dict[type, None]) -> None:
    if cls in seen:
        return
    seen[cls] = None
    for f in fields(cls):
        kind = classify_field(f)
        if isinstance(kind, (EntityField, EntityTupleField)):
            _entities(kind.type_, seen)


@lru_cache(maxsize=_CACHED)
def address_entities(api_key: int, version: int) -> tuple[type, ...]:
    """The broker-address entity classes of a response schema (empty if kio does not know it)."""
    schema = codec.response_schema(api_key, version)
    if schema is None:
        return ()
    seen: dict[type, None] = {}
    _entities(schema, seen)
    return tuple(
        cls
        for cls in seen
        if {"host", "port"} <= {f.name for f in fields(cls)}
        and (api_key, cls.__name__) not in APPLICATION_ENDPOINTS
    )


@lru_cache(maxsize=_CACHED)
def rewrites_all(api_key: int, version: int) -> bool:
    """True when every broker address the response can carry is rewritten by the proxy."""
    entities = address_entities(api_key, version)
    if not entities:
        return True
    return rewrite.needs_rewrite(api_key, version) and all(rewrite.is_endpoint(c) for c in entities)


def advertisable(api_key: int, version: int) -> bool:
    """May ApiVersions offer this version to clients?  (``derived_advertisable``, from a
    table: the ApiVersions rewrite imports no schema.)"""
    run = ADVERTISED.get(api_key)
    return run is not None and run[0] <= version <= run[1]


def derived_advertisable(api_key: int, version: int) -> bool:
    """What ``advertisable`` answers, derived from kio's schemas (importing them)."""
    return (
        codec.request_schema(api_key, version) is not None
        and codec.response_schema(api_key, version) is not None
        and rewrites_all(api_key, version)
    )


_ADVERTISED_DOC = '''"""The (api_key, versions) ApiVersions may offer: ``endpoints.advertised_source()``'s output.

Generated from kio's schemas by the derivation in ``endpoints``; checked against it
by tests/unit/test_apiversions_loop.py, whose failure message says how to regenerate
it.  A table, not the derivation at run time: the derivation imports every schema
module kio has (about a thousand, 1-2 s of CPU on a loaded machine), which the first
upstream ApiVersions answer's rewrite did on the event loop, serving no other client meanwhile.
"""
'''


def advertised_source() -> str:
    """The text of ``proxy/relay/advertised.py`` for the kio installed (imports all of it)."""
    from kio.schema.index import api_key_map, schema_name_map

    lines = [_ADVERTISED_DOC, "ADVERTISED: dict[int, tuple[int, int]] = {"]
    for api_key, name in sorted(api_key_map.items()):
        offered = [
            v
            for v in sorted(schema_name_map[name])
            if 0 <= v < MAX_PROBE and derived_advertisable(api_key, v)
        ]
        if not offered:
            continue
        if offered != list(range(offered[0], offered[-1] + 1)):
            raise AssertionError(f"{name}: versions offered with a gap: {offered}")
        lines.append(f"    {api_key}: ({offered[0]}, {offered[-1]}),  # {name}")
    lines.append("}")
    lines.append(
        '"""api_key: (lowest, highest) version offered; every version between is offered."""'
    )
    return "\n".join(lines) + "\n"


def refused(api_key: int, version: int) -> bool:
    """Must the relay refuse this request?

    True when its response would carry broker addresses the proxy does not
    rewrite, and for a version kio has no schema for of an API whose responses
    the proxy rewrites (it could not find the addresses).
    """
    if rewrite.needs_rewrite(api_key, version) and codec.response_schema(api_key, version) is None:
        return True
    return not rewrites_all(api_key, version)
