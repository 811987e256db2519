"""How shaping names a partition across Fetch versions.

Fetch v4..v12 name topics (``topic``); v13 and later use topic ids
(``topic_id``).  A partition key is ``(topic name or topic id, partition index)``;
within one connection the client uses one of the two consistently.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

TopicKey = str | uuid.UUID | None
PartitionKey = tuple[TopicKey, int]

_FIELD_OF: dict[type, str] = {}
"""The identifying field of each dataclass seen (bounded: kio defines a few topic classes).

Looked up per class, not with ``hasattr`` per topic: on v4..v12 classes (slotted,
no ``topic_id``) ``hasattr`` raises and catches an AttributeError every time."""


def _field_of(topic: Any) -> str:
    cls = type(topic)
    name = _FIELD_OF.get(cls)
    if name is not None:
        return name
    if not dataclasses.is_dataclass(cls):  # a stand-in (tests): its attributes are its own
        return "topic_id" if hasattr(topic, "topic_id") else "topic"
    names = {f.name for f in dataclasses.fields(cls)}
    name = _FIELD_OF[cls] = "topic_id" if "topic_id" in names else "topic"
    return name


def topic_key(topic: Any) -> TopicKey:
    """The key of a request FetchTopic / ForgottenTopic or a response FetchableTopicResponse."""
    return getattr(topic, _field_of(topic))  # type: ignore[no-any-return]
