"""Topic name <-> topic id map, learnt from the Metadata responses the proxy relays.

Fetch v13+ addresses topics by id, older versions by name.  When a client on
names talks through an upstream session on ids (or the reverse) the proxy needs
this map.  The relay feeds it every Metadata response it sees (``learn_metadata``);
when a name has no id yet, ``missing_ids`` tells the relay which topics to ask
the upstream broker about.

Bounded: at most ``max_topics`` entries; the least recently learnt go first.

:class:`TopicIdRequests` decides when a connection asks upstream Metadata
(v10+) for the ids of names a client fetches: at most one request in flight
and each name at most once per ``retry_fetches`` fetches (a topic that does
not exist never gets an id).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any

from ..protocol import codec
from ..protocol.apis import METADATA
from ..protocol.errors import DecodeError
from ..protocol.messages import request_module

ZERO_UUID = uuid.UUID(int=0)
MIN_METADATA_WITH_IDS = 10
MAX_METADATA_VERSION = 12


class TopicIdMap:
    def __init__(self, *, max_topics: int = 100_000) -> None:
        if max_topics <= 0:
            raise ValueError("max_topics must be positive")
        self._max = max_topics
        self._by_name: dict[str, uuid.UUID] = {}
        self._by_id: dict[uuid.UUID, str] = {}
        self.changes = 0
        """Counts the changes to what is known (a reader that yields between two lookups
        sees whether the map changed meanwhile)."""

    def __len__(self) -> int:
        return len(self._by_name)

    def learn(self, name: str, topic_id: uuid.UUID | None) -> None:
        """Record that *name* currently has *topic_id* (a zero or null id is ignored)."""
        if topic_id is None or topic_id == ZERO_UUID or not name:
            return
        if self._by_name.get(name) != topic_id or self._by_id.get(topic_id) != name:
            self.changes += 1
        old_id = self._by_name.pop(name, None)
        if old_id is not None:
            self._by_id.pop(old_id, None)
        old_name = self._by_id.pop(topic_id, None)
        if old_name is not None:
            self._by_name.pop(old_name, None)
        self._by_name[name] = topic_id
        self._by_id[topic_id] = name
        while len(self._by_name) > self._max:
            evicted_name = next(iter(self._by_name))
            self._by_id.pop(self._by_name.pop(evicted_name), None)
            self.changes += 1

    def learn_metadata(self, response: Any) -> None:
        """Learn from a decoded Metadata response (v10+ carries topic ids).

        A response with a top-level error (v13+, e.g. KIP-1102's
        REBOOTSTRAP_REQUIRED) says nothing about topics: nothing is learnt.
        """
        if int(getattr(response, "error_code", 0)) != 0:
            return
        for topic in getattr(response, "topics", ()):
            if getattr(topic, "error_code", 0) != 0:
                continue
            name = getattr(topic, "name", None)
            topic_id = getattr(topic, "topic_id", None)
            if isinstance(name, str) and isinstance(topic_id, uuid.UUID):
                self.learn(name, topic_id)

    def forget_name(self, name: str) -> None:
        """Drop what we know about *name* (e.g. the broker says its id is unknown)."""
        topic_id = self._by_name.pop(name, None)
        if topic_id is not None:
            self._by_id.pop(topic_id, None)
            self.changes += 1

    def id_for(self, name: str) -> uuid.UUID | None:
        return self._by_name.get(name)

    def name_for(self, topic_id: uuid.UUID) -> str | None:
        return self._by_id.get(topic_id)

    def names_by_id(self) -> Mapping[uuid.UUID, str]:
        """A read-only live view of id -> name."""
        return MappingProxyType(self._by_id)

    def missing_ids(self, names: Iterable[str]) -> list[str]:
        """Names (deduplicated, in order) for which no id is known."""
        out: dict[str, None] = {}
        for name in names:
            if name not in self._by_name:
                out[name] = None
        return list(out)


def learn_from_frame(topic_ids: TopicIdMap, api_version: int, frame: bytes) -> None:
    """Learn from a Metadata response frame (v10+; one that does not decode teaches nothing)."""
    if api_version < MIN_METADATA_WITH_IDS:
        return
    try:
        _, response = codec.decode_response(METADATA, api_version, frame)
    except DecodeError:
        return  # not ours to judge: the client gets the frame as it came
    topic_ids.learn_metadata(response)


class TopicIdRequests:
    """The Metadata requests one connection sends upstream to learn topic ids."""

    def __init__(
        self, topic_ids: TopicIdMap, *, retry_fetches: int = 100, max_names: int = 10_000
    ) -> None:
        self.topic_ids = topic_ids
        self.retry_fetches = retry_fetches
        self.max_names = max_names
        self.in_flight = False
        self._asked: dict[str, int] = {}

    def request(
        self, names: tuple[str, ...], *, fetch_number: int, upstream_max_version: int | None
    ) -> Any | None:
        """A MetadataRequest for the *names* that are due, or None (nothing to ask now)."""
        if not names or self.in_flight:
            return None
        due = [
            n
            for n in names
            if fetch_number - self._asked.get(n, -self.retry_fetches) >= self.retry_fetches
        ]
        if not due:
            return None
        version = min(upstream_max_version or MAX_METADATA_VERSION, MAX_METADATA_VERSION)
        if version < MIN_METADATA_WITH_IDS:
            return None  # this upstream cannot tell us topic ids
        for n in due:
            self._asked.pop(n, None)
            self._asked[n] = fetch_number
        while len(self._asked) > self.max_names:
            del self._asked[next(iter(self._asked))]
        mod = request_module(METADATA, version)
        self.in_flight = True
        return mod.MetadataRequest(
            topics=tuple(mod.MetadataRequestTopic(topic_id=None, name=n) for n in due),
            allow_auto_topic_creation=False,
            include_topic_authorized_operations=False,
        )

    def answered(self, api_version: int, frame: bytes) -> None:
        """The response to the last ``request`` arrived."""
        self.in_flight = False
        learn_from_frame(self.topic_ids, api_version, frame)
