"""The proxy's rack in the Fetch requests it sends upstream (KIP-392), sans-I/O.

A consumer that sends its rack in Fetch v11+ (``rack_id``) is told by a leader
running ``RackAwareReplicaSelector`` to read from a replica in that rack: the
leader answers the partition with ``preferred_read_replica`` and no records,
and the client fetches it from that broker (through the proxy's listener for
it; Metadata's addresses are rewritten already).  A sidecar knows its zone (the
``rack`` setting), so a client that sends no rack gets the proxy's:

- :func:`upstream_rack`: the rack a fetch carries upstream.  The client's own
  rack is kept, unless the client's policy says ``rack_override = true``; an
  empty one becomes the proxy's.  Only for a client on Fetch v11+: an older
  client cannot receive ``preferred_read_replica`` (its response version has no
  such field), so a leader's redirect would reach it as an empty partition, for
  ever.  For those clients the proxy follows the redirect itself
  (:mod:`.read_replica`, ``proxy.server.replicas``).
- :func:`patch_request`: the same for a Fetch the relay forwards as bytes
  (``relay.PassThroughFetch``): the body is decoded and encoded again only when
  the rack changes, the client's header bytes are kept.
- :class:`RackFetch`, one per client connection: what the connection sends, and
  a watch on whether the client follows the redirects it is given.  A client
  that does not (aiokafka 0.14 follows ``preferred_read_replica`` only when it
  set ``client_rack`` itself; older kafka-python and aiokafka releases never do)
  would ask the leader again and again and get no records: after
  ``max_ignored`` consecutive fetches that ask again for a partition the
  previous response redirected, the connection stops sending the proxy's rack
  (``stopped``; the client's own rack is still passed).  The connection lives on
  the leader's data, as without a rack, and the value says why.

Every step returns values (the rack to send, the redirects seen, whether the
connection stopped) for the edge to count; nothing here logs or measures.
Bounded: the watch keeps only the partitions the latest response redirected.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..protocol import codec
from ..protocol.apis import FETCH
from ..protocol.errors import DecodeError
from ..protocol.partition_key import PartitionKey, topic_key

MIN_RACK_VERSION = 11
"""The first Fetch version with ``rack_id`` (and ``preferred_read_replica`` in the answer)."""
DEFAULT_MAX_IGNORED = 3
"""Consecutive fetches that ask again for a redirected partition before the proxy's rack
stops being sent on that connection.  More than one: a client may have built its next
fetch before it read the redirect (librdkafka moves a partition between broker threads
through a queue)."""


def upstream_rack(client_rack: str, proxy_rack: str, *, override: bool, client_version: int) -> str:
    """The ``rack_id`` a client's Fetch carries upstream.

    *proxy_rack* empty: the client's, unchanged.  A client below Fetch v11 has no
    rack and gets none (see the module docstring).  Otherwise the client's own
    rack unless it is empty or *override* (the policy's ``rack_override``).
    """
    if not proxy_rack or client_version < MIN_RACK_VERSION:
        return client_rack
    if client_rack and not override:
        return client_rack
    return proxy_rack


def requested(request: Any) -> set[PartitionKey]:
    """The partitions a (full) Fetch request asks for."""
    return {(topic_key(t), int(p.partition)) for t in request.topics for p in t.partitions}


def redirects(response: Any) -> dict[PartitionKey, int]:
    """Partitions of a Fetch response that name a preferred read replica, and which."""
    out: dict[PartitionKey, int] = {}
    for topic in getattr(response, "responses", ()):
        key = topic_key(topic)
        for pd in topic.partitions:
            replica = int(getattr(pd, "preferred_read_replica", -1))
            if replica >= 0:
                out[(key, int(pd.partition_index))] = replica
    return out


@dataclass(frozen=True, slots=True)
class RackStep:
    """What the proxy did with one fetch's rack (for metrics and the decision log)."""

    rack_id: str
    """The rack sent upstream."""
    set_by_proxy: bool
    """The proxy put its rack in (the client sent none, or its policy overrides it)."""


class RackFetch:
    """The proxy's rack on one client connection's fetches (see the module docstring)."""

    def __init__(self, rack: str, *, max_ignored: int = DEFAULT_MAX_IGNORED) -> None:
        if max_ignored < 1:
            raise ValueError("max_ignored must be >= 1")
        self.rack = rack
        self.max_ignored = max_ignored
        self.stopped = False
        """The client did not follow the redirects: the proxy's rack is no longer sent."""
        self.redirected = 0
        """Partition answers that named a preferred read replica, passed to the client."""
        self.ignored = 0
        """Fetches that asked again for a partition the previous answer redirected."""
        self._pending: dict[PartitionKey, int] = {}
        """Partitions the latest response redirected (bounded by one response)."""
        self._streak = 0

    @property
    def active(self) -> bool:
        return bool(self.rack) and not self.stopped

    def step(self, client_rack: str, *, override: bool, client_version: int) -> RackStep:
        """The rack for a fetch of this connection."""
        proxy_rack = self.rack if self.active else ""
        rack = upstream_rack(
            client_rack, proxy_rack, override=override, client_version=client_version
        )
        return RackStep(rack, rack != client_rack)

    def asked(self, partitions: Iterable[PartitionKey]) -> bool:
        """The client's next fetch asks for *partitions*; True if it just stopped.

        Call it before :meth:`step` for that fetch, with every partition the fetch
        covers (a session client's whole session).
        """
        pending, self._pending = self._pending, {}
        if self.stopped:
            return False
        if pending and any(key in pending for key in partitions):
            self.ignored += 1
            self._streak += 1
            if self._streak >= self.max_ignored:
                self.stopped = True
                return True
        else:
            self._streak = 0
        return False

    def answered(self, response: Any) -> dict[PartitionKey, int]:
        """The response the client gets: the redirects in it (partition -> replica)."""
        found = redirects(response)
        if found:
            self.redirected += len(found)
        self._pending = found
        return found

    def forget(self) -> None:
        """The exchange failed (no response reached the client): watch nothing."""
        self._pending = {}


def patch_request(
    header: codec.RequestHeader, frame: bytes, rack: RackFetch, *, override: bool = False
) -> tuple[bytes, Any] | None:
    """A consumer's Fetch frame carrying the proxy's rack, with the decoded request.

    The fetch counts for the redirect watch (:meth:`RackFetch.asked`; the partitions
    it lists).  None when nothing changes: a follower's fetch, a version without a rack, a
    client rack that is kept, a connection that stopped, or a body that does not
    decode (the broker judges it as it came).  The header bytes are the client's.
    """
    if (
        not rack.active
        or header.api_key != FETCH
        or header.api_version < MIN_RACK_VERSION
        or header.body_offset is None
    ):
        return None
    try:
        decoded = codec.decode_request_body(header, frame)
    except DecodeError:
        return None
    if _replica_id(decoded) >= 0:
        return None
    rack.asked(requested(decoded))
    step = rack.step(str(decoded.rack_id), override=override, client_version=header.api_version)
    if not step.set_by_proxy:
        return None
    patched = dataclasses.replace(decoded, rack_id=step.rack_id)
    return bytes(frame[: header.body_offset]) + codec.encode_body(patched), patched


def _replica_id(request: Any) -> int:
    state = getattr(request, "replica_state", None)
    if state is not None:
        return int(state.replica_id)
    return int(getattr(request, "replica_id", -1))
