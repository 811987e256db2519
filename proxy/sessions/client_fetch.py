"""The client's Fetch and the answer built for it, shared by both halves of ``sessions``.

The client's Fetch is decoded once by the fetch path and validated once, here
(:meth:`ClientFetch.validate`: a Fetch v4+, a consumer's; the only place its replica
id is read); what both halves are given is the validated :class:`ClientFetch`, or a
full fetch built from it, never the raw request to judge again.

Downstream (:mod:`proxy.sessions.as_broker`, the proxy as the broker toward its
clients) and upstream (:mod:`proxy.sessions.as_client`, full fetches served through
the proxy's session with its broker) both build a consumer's FetchRequest carrying
the client's request-wide settings (:func:`consumer_fetch`), group partitions into
topic entries the way a broker does (:func:`group_runs`), answer the client with a
:class:`ClientReply`, and refuse a fetch they cannot serve with
:class:`TranslationError`.  They live here so that neither half imports the other.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from ..protocol.apis import FETCH
from ..protocol.messages import make
from .kip227 import FINAL_EPOCH, INVALID_SESSION_ID, MIN_CLIENT_VERSION, replica_id


@dataclass(frozen=True, slots=True)
class ClientFetch:
    """A consumer's Fetch (v4+, replica id -1) as the client sent it, validated once."""

    request: Any
    """The kio FetchRequest, as decoded."""
    version: int
    session_id: int
    """0 on Fetch v4-v6, which have no sessions."""
    session_epoch: int
    """-1 (FINAL_EPOCH, sessionless) on Fetch v4-v6."""

    @property
    def sessionless(self) -> bool:
        """The client uses no fetch session (epoch -1; Fetch v4-v6 have none)."""
        return self.session_epoch == FINAL_EPOCH

    @classmethod
    def validate(cls, request: Any) -> ClientFetch | None:
        """*request* (a decoded Fetch) as a :class:`ClientFetch`; None for a follower's
        (replica id >= 0), which the proxy passes through as it came.  Anything but a
        Fetch v4+ is refused (:class:`TranslationError`)."""
        version = int(request.__version__)
        if int(request.__api_key__) != FETCH or version < MIN_CLIENT_VERSION:
            raise TranslationError("not a Fetch v4+ request")
        if replica_id(request) >= 0:
            return None
        return cls(
            request,
            version,
            int(getattr(request, "session_id", INVALID_SESSION_ID)),
            int(getattr(request, "session_epoch", FINAL_EPOCH)),
        )


@dataclass(frozen=True, slots=True)
class ClientReply:
    """Answer the client with ``response`` (a kio FetchResponse at the client's version)."""

    response: Any


class TranslationError(Exception):
    """A half of ``sessions`` was used out of order, or given a fetch it cannot serve."""


def consumer_fetch(
    mod: ModuleType,
    client: Any,
    *,
    session_id: int,
    session_epoch: int,
    topics: Any,
    forgotten: Any,
) -> Any:
    """A consumer's FetchRequest of module *mod* with *client*'s request-wide settings
    (wait, sizes, isolation, rack, cluster; Kafka's defaults where its version has none)
    and the given session and partitions."""
    return make(
        mod.FetchRequest,
        replica_id=-1,
        max_wait=client.max_wait,
        min_bytes=client.min_bytes,
        max_bytes=getattr(client, "max_bytes", 2**31 - 1),
        isolation_level=getattr(client, "isolation_level", 0),
        session_id=session_id,
        session_epoch=session_epoch,
        topics=topics,
        forgotten_topics_data=forgotten,
        rack_id=getattr(client, "rack_id", ""),
        cluster_id=getattr(client, "cluster_id", None),
    )


def group_runs(items: Any, key: Any) -> Iterator[tuple[Any, list[Any]]]:
    """Consecutive runs of *items* with equal ``key(item)`` (how a broker groups topics)."""
    run: list[Any] = []
    current: Any = None
    for item in items:
        k = key(item)
        if run and k != current:
            yield current, run
            run = []
        current = k
        run.append(item)
    if run:
        yield current, run


def topic_entries_in_ranges(
    mod: Any, answered: Iterable[tuple[Any, Any]], topics: list[Any], every: int = 0
) -> Iterator[None]:
    """The response's topic entries, one per run of a topic as a broker groups them
    (:func:`group_runs`), appended to *topics* from ``(topic ref, partition data)`` pairs
    in the answer's order; yields every *every* pairs (0: never)."""
    run: list[Any] = []
    current: Any = None
    for i, (ref, pd) in enumerate(answered, 1):
        if every and i % every == 0:
            yield
        if run and ref != current:
            topics.append(topic_response(mod, current, run))
            run = []
        current = ref
        run.append(pd)
    if run:
        topics.append(topic_response(mod, current, run))


def topic_response(mod: Any, ref: Any, partitions: list[Any]) -> Any:
    """A ``FetchableTopicResponse`` of *ref* (a name, or a topic id from v13 on)."""
    return make(mod.FetchableTopicResponse, topic=ref, topic_id=ref, partitions=tuple(partitions))
